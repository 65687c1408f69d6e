/* ops: the CPU kernels the model code calls, behind one table.
 *
 * Every kernel exists as a plain-C reference (ops_ref.c) that defines the
 * semantics; SIMD versions (ops_avx2.c) must agree with it on random data
 * and odd sizes (tests/test_ops.c). loom_kernels_get() returns the best
 * table for this CPU; LOOM_KERNELS=ref forces the reference. */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

#include <stdint.h>

#include "load/safetensors.h"

/* An MLX affine-quantized matrix: row r, element k is
 * scale[r][k / group] * q + bias[r][k / group], where q is the unsigned
 * bits-wide field at bit offset k * bits of the row's little-endian bit
 * stream (so for bits 2, 4 and 8 element k of a word sits at bits
 * (k % per_word) * bits). Everything is borrowed from the mapping. */
#define LOOM_QGROUP_MAX 1024

typedef struct loom_qmat {
    const uint32_t *w;         /* (rows, n * bits / 32) packed */
    const uint16_t *scales;    /* (rows, n / group) bf16, or f16 when f16 */
    const uint16_t *biases;    /* (rows, n / group) same dtype as scales */
    int n;                     /* columns (input features) */
    int bits;                  /* 2, 3, 4, 5, 6 or 8 */
    int group;                 /* columns per scale/bias, at most LOOM_QGROUP_MAX */
    int f16;
    int il16;                  /* rows interleaved by 16 (loom_q_interleave) */
} loom_qmat;

/* The 16-row interleaved layout, for 4- and 8-bit matrices whose rows
 * are a multiple of 16 and group 64 << s (s <= 4) columns, n <= 8192:
 * per block of 16 rows and per group, the 16 rows' scales and their 16
 * biases, then for each 64 columns a run of 64-byte vectors whose dword i
 * holds row i's next 4 (8-bit) or 8 (4-bit: low nibbles 4 columns, high
 * nibbles the 4 after) columns: one stream, read in order (scales and
 * biases are NULL). One vector feeds one VPDPBUSD with a column group
 * broadcast, 16 rows to 16 lanes, with no reduction across lanes.
 * Only kernel tables with q_il16 set read it. */
#define LOOM_Q_IL_MAXN 8192  /* longest row (columns) the layout takes */
/* Whether w fits that layout and is not in it already. */
int loom_q_il16_ok(const loom_qmat *w, int rows);
/* dst: w's values in that layout, in one buffer (*mem, loom_free it). */
loom_status loom_q_interleave(const loom_qmat *w, int rows, loom_qmat *dst, void **mem);
/* The same into out, which holds loom_q_il16_bytes(w, rows) bytes. */
size_t loom_q_il16_bytes(const loom_qmat *w, int rows);
loom_status loom_q_interleave_into(const loom_qmat *w, int rows, loom_qmat *dst, void *out);

/* An FP8 matrix (Hugging Face "fp8" checkpoints): row r, element k is
 * e4m3(w[r][k]) * scales[r / br][k / bc], scales (ceil(rows / br),
 * ceil(n / bc)) row-major; blocks at the right and bottom edges may be
 * partial. 128 x 128 blocks are the DeepSeek/Qwen layout, br 1 and bc n
 * per-channel, br rows and bc n per-tensor. */
typedef struct loom_f8mat {
    const uint8_t *w;          /* (rows, n) e4m3fn codes; borrowed */
    const float *scales;       /* as above, f32; borrowed (the model owns the f32 copy) */
    int n;                     /* columns (input features) */
    int br, bc;                /* rows and columns per scale, >= 1 */
} loom_f8mat;

/* Scales per row of blocks. */
static inline int loom_f8_scale_cols(const loom_f8mat *w) { return (w->n + w->bc - 1) / w->bc; }

typedef struct loom_kernels {
    const char *name;
    /* y[t*ldy + r] = sum_k x[t*ldx + k] * w[r*n + k] for t in [0, T),
     * r in [r0, r1). w rows are f32 / f16 / bf16 (by entry). This is where
     * most of the time goes. */
    void (*matmul_f32)(float *y, int ldy, const float *x, int ldx,
                       const float *w, int n, int T, int r0, int r1);
    void (*matmul_f16)(float *y, int ldy, const float *x, int ldx,
                       const uint16_t *w, int n, int T, int r0, int r1);
    void (*matmul_bf16)(float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int n, int T, int r0, int r1);
    /* The same over an affine-quantized matrix, dequantizing one group at a
     * time; the full matrix is never expanded. */
    void (*matmul_q)(float *y, int ldy, const float *x, int ldx,
                     const loom_qmat *w, int T, int r0, int r1);
    /* The same over an FP8 matrix: the f32 matmul over the dequantized
     * weights (each e4m3 value times its block's scale, rounded to f32). */
    void (*matmul_f8)(float *y, int ldy, const float *x, int ldx,
                      const loom_f8mat *w, int T, int r0, int r1);
    float (*dot)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int n);
    /* Attention's weighted sum of values for several queries (slots) over
     * one run of keys: for slot s and each key i in [keys[2s], keys[2s+1])
     * (within [0, n_keys)), in increasing order,
     *   out[s*ldo + d] += p[s*ldp + i] * v[i*ldv + d],  d < hd,
     * one add per key as a run of axpy calls would do it (accumulating from
     * out's value, never a separate partial sum), so a slot's result does not
     * depend on the other slots nor on how its keys are split over calls.
     * p is read only inside a slot's range. */
    void (*attn_pv)(float *out, int ldo, const float *p, int ldp, const int *keys, int slots,
                    const float *v, int ldv, int n_keys, int hd);
    /* y = x / sqrt(mean(x^2) + eps) * w  (y may alias x) */
    void (*rmsnorm)(float *y, const float *x, const float *w, int n, float eps);
    /* x = softmax(x) in place */
    void (*softmax)(float *x, int n);
    /* g = silu(g) * u */
    void (*silu_mul)(float *g, const float *u, int n);
    /* g = gelu_tanh(g) * u  (the tanh approximation: gelu_pytorch_tanh) */
    void (*gelu_tanh_mul)(float *g, const float *u, int n);
    /* Row conversions to f32. */
    void (*f16_to_f32)(float *y, const uint16_t *x, int n);
    void (*bf16_to_f32)(float *y, const uint16_t *x, int n);
    /* matmul_q also takes loom_q_interleave'd matrices. */
    int q_il16;
    /* Its 8-bit matmul over a prompt's many tokens outruns the exact one
     * (VNNI): what the drafters' 8-bit copies need to pay. */
    int q8_prompt_fast;
    /* Optional, for those matrices: x rounded once into buf (q_prep_bytes
     * of it) serves every row slice of every matrix with w's columns and
     * group; matmul_q_prep gives matmul_q's bits from it. */
    size_t (*q_prep_bytes)(const loom_qmat *w, int T);
    void (*q_prep)(void *buf, const float *x, int ldx, const loom_qmat *w, int T);
    void (*matmul_q_prep)(float *y, int ldy, const void *buf, const loom_qmat *w, int T, int r0,
                          int r1);
    /* The same for bf16 matrices of n columns (bf16_prep_bytes 0: no
     * buffer helps at that T); matmul_bf16_prep gives matmul_bf16's bits. */
    size_t (*bf16_prep_bytes)(int n, int T);
    void (*bf16_prep)(void *buf, const float *x, int ldx, int n, int T);
    void (*matmul_bf16_prep)(float *y, int ldy, const void *buf, const uint16_t *w, int n, int T,
                             int r0, int r1);
} loom_kernels;

extern const loom_kernels loom_kernels_ref;
#if defined(__x86_64__)
extern const loom_kernels loom_kernels_avx2;
/* AVX-512 entries (F/BW/DQ/VL/VNNI/BF16), NULL where the AVX2 one is used.
 * The _q tables hold the quantized-weight matmuls, the _dense ones the
 * f32/f16/bf16 ones; each file owns one pair. */
extern const loom_kernels loom_kernels_avx512_q, loom_kernels_avx512_dense;
/* Reduced-precision variants: the same entries, but activations are
 * rounded to the weights' fast format first (8-bit for quantized weights,
 * bf16 for bf16 weights), as llama.cpp does. Each has a plain-C
 * reference of the same rounding (loom_kernels_ref_*_fast below). */
extern const loom_kernels loom_kernels_avx512_q_fast, loom_kernels_avx512_dense_fast;
/* The 4-/8-bit --fast matmul with AVX2 alone (VPMADDUBSW for VPDPBUSD). */
extern const loom_kernels loom_kernels_avx2_q_fast;
#endif
/* Plain-C references of the rounded variants (ops_q_fast_ref.c,
 * ops_dense_fast_ref.c): what the _fast SIMD entries must agree with. */
extern const loom_kernels loom_kernels_ref_q_fast, loom_kernels_ref_dense_fast;
/* Whether the --fast rounding applies to w (4- or 8-bit, groups of 64 << s
 * columns, at most 32768 columns); other matrices take the exact matmul. */
int loom_q_fast_ok(const loom_qmat *w);

/* Whether this CPU runs the AVX-512 tables (F, BW, DQ, VL, VNNI, BF16). */
int loom_cpu_has_avx512(void);
/* base with every non-NULL entry of t put over it. */
loom_kernels loom_kernels_over(loom_kernels base, const loom_kernels *t);

#if defined(__x86_64__)
/* Multiply-adds a second of VDPBF16PS over those of f32 FMAs on this core
 * (a few ms of probing; call only where loom_cpu_has_avx512()). */
double loom_avx512_bf16_gain(void);
#endif
/* Whether --fast takes the bf16 entries: LOOM_FAST_BF16 (env, may be NULL)
 * "1" or "0" decides; otherwise gain (loom_avx512_bf16_gain) must reach
 * LOOM_FAST_BF16_MIN_GAIN, a margin over the activations' rounding. */
#define LOOM_FAST_BF16_MIN_GAIN 1.25
int loom_fast_bf16_pick(double gain, const char *env);

/* Best table for this CPU (cached after the first call). Entries of a SIMD
 * table that are NULL fall back to the next best table's. */
const loom_kernels *loom_kernels_get(void);
/* The same with the reduced-precision variants where this CPU has them
 * (the bf16 ones only where loom_fast_bf16_pick says they pay); every
 * other entry is loom_kernels_get()'s. */
const loom_kernels *loom_kernels_get_fast(void);

/* Index of the largest element (first on ties). */
int loom_argmax(const float *x, int n);

#endif
