/* ops_q_fast_ref: plain-C reference of the reduced-precision matmuls over
 * MLX affine-quantized weights (--fast): the rounding of the activations
 * and the arithmetic the SIMD versions must reproduce. NULL entries: no
 * fast variant. */
#include "ops/ops.h"

const loom_kernels loom_kernels_ref_q_fast = {.name = "ref-q-fast"};
