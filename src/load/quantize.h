/* quantize: MLX affine quantization of float checkpoints, and a streaming
 * safetensors writer.
 *
 * The packed format is the one model.c binds: for a weight [rows, cols],
 * "<module>.weight" is U32 [rows, cols * bits / 32] (element k of a word at
 * bits k*bits, little-endian), "<module>.scales" and "<module>.biases" are
 * BF16 (or F16) [rows, cols / group], and w ~= q * scale + bias per group.
 *
 * The streaming writer takes the whole tensor list first (names, dtypes,
 * shapes), writes the header, then accepts each tensor's bytes in plan order
 * as they are produced, so a conversion holds one tensor's output at most.
 * The file appears under its final name only on loom_st_stream_finish. */
#ifndef LOOM_QUANTIZE_H
#define LOOM_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "load/safetensors.h"
#include "loom.h"

/* How the levels are computed once a group's scale and bias are known. */
typedef enum loom_quant_pack {
    LOOM_QPACK_STORED = 0,  /* with scale and bias as stored (rounded to the
                               half dtype): what the MLX checkpoints in
                               tests/fixtures hold */
    LOOM_QPACK_F32,         /* with the unrounded f32 scale and bias, as MLX's
                               quantize kernels (CPU, Metal, CUDA) compute them */
} loom_quant_pack;

/* Quantizes one row of n floats (n % group == 0) MLX's way, group by group:
 * the scale spans [min, max] over 2^bits - 1 steps, the edge farther from
 * zero is snapped to an integer level (so it is exact and zero stays on a
 * level); scale and bias are stored rounded to out_dtype (BF16 or F16) and
 * the levels computed as pack says. Writes n * bits / 32 words to packed
 * and n / group values each to scales and biases. bits is 2, 4 or 8.
 * Returns 0, or -1 (nothing useful written) when the row holds a NaN or
 * infinity. */
int loom_quant_row(const float *w, int n, int bits, int group, loom_dtype out_dtype,
                   loom_quant_pack pack, uint32_t *packed, uint16_t *scales,
                   uint16_t *biases);

/* Inverse of loom_quant_row: n floats into out. */
void loom_quant_dequant_row(const uint32_t *packed, const uint16_t *scales,
                            const uint16_t *biases, int n, int bits, int group,
                            loom_dtype scale_dtype, float *out);

/* ---- streaming safetensors writer ------------------------------------- */

typedef struct loom_st_stream loom_st_stream;

/* Plans path with the n tensors of plan (data pointers are ignored), writes
 * the header (with __metadata__ {"format": format} when format is non-NULL)
 * to a temporary file beside path. */
loom_status loom_st_stream_open(const char *path, const loom_st_write_entry *plan, int n,
                                const char *format, loom_st_stream **out);
/* Appends nbytes of the current tensor's data; a tensor may arrive in any
 * number of pieces. Call only in plan order; a piece that runs past the
 * tensor's planned size is LOOM_ERR_INVALID_ARG. */
loom_status loom_st_stream_write(loom_st_stream *w, const void *data, size_t nbytes);
/* Checks every planned byte arrived, closes and renames into place, frees
 * w (whatever the result). */
loom_status loom_st_stream_finish(loom_st_stream *w);
/* Drops the temporary file and frees w (accepts NULL). */
void loom_st_stream_abort(loom_st_stream *w);

/* ---- checkpoint conversion -------------------------------------------- */

typedef struct loom_convert_params {
    int bits;             /* 2, 4 or 8 */
    int group;            /* 32, 64 or 128 */
    int force;            /* write into a non-empty destination */
    loom_quant_pack pack; /* LOOM_QPACK_STORED (default) or LOOM_QPACK_F32 */
} loom_convert_params;

typedef struct loom_convert_stats {
    int n_quantized;      /* weights packed */
    int n_copied;         /* tensors copied (floats as the output dtype) */
    uint64_t bytes_in, bytes_out;   /* tensor data read and written */
} loom_convert_stats;

/* Converts the float (F32/F16/BF16) Hugging Face checkpoint in src into an
 * MLX affine-quantized one in dst, as `mlx_lm.convert -q` lays it out:
 * every 2-D ".weight" that is not a norm and whose last dim divides into
 * groups is packed; other float tensors are written as the output dtype
 * (F16 for an F16 checkpoint, else BF16), other tensors copied;
 * config.json gains "quantization" and "quantization_config"
 * {group_size, bits}; tokenizer files and generation_config.json are
 * copied. dst is created if missing; a non-empty dst is refused unless
 * p->force. An already-quantized source is LOOM_ERR_UNSUPPORTED. stats may
 * be NULL. */
loom_status loom_convert_model(const char *src, const char *dst, const loom_convert_params *p,
                               loom_convert_stats *stats);

#endif
