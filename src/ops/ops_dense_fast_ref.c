/* ops_dense_fast_ref: plain-C reference of the reduced-precision matmuls
 * over f32/f16/bf16 weights (--fast): the rounding of the activations and
 * the arithmetic the SIMD versions must reproduce. NULL entries: no fast
 * variant. */
#include "ops/ops.h"

const loom_kernels loom_kernels_ref_dense_fast = {.name = "ref-dense-fast"};
