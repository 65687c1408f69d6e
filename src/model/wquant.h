/* wquant: 8- and 4-bit copies of dense matrices made in memory (MLX's
 * affine layout, as `loom convert` writes it), for models quantized at
 * load and for a drafter's approximate arithmetic. Not part of the model
 * API. */
#ifndef LOOM_WQUANT_H
#define LOOM_WQUANT_H

#include <stddef.h>

#include "model/model.h"

#define LOOM_WQ_GROUP 64

/* Bytes of a bits-wide copy of w (F32, F16 or BF16, cols a multiple of
 * the group), in the kernels' 16-row layout when il16 and the shape fits
 * it; 0 when w cannot have one. */
size_t loom_wq_bytes(const loom_weight *w, int bits, int il16);
/* Writes that copy into dst (loom_wq_bytes bytes, 64-byte aligned) and
 * describes it in *out: each row as loom_quant_row quantizes it with its
 * scales and biases in w's half type (F16 for F16, else BF16) and the
 * levels from the stored scale and bias, as `loom convert --bits` does.
 * m converts the rows to f32. */
loom_status loom_wq_copy(const loom_model *m, const loom_weight *w, int bits, int il16, void *dst,
                         loom_weight *out);

#endif
