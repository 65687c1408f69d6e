/* ops_q_avx512: matmuls over MLX affine-quantized weights with AVX-512.
 * Compiled with the AVX-512 flags (Makefile); only reached after
 * loom_kernels_get() checked the CPU. */
#include "ops/ops.h"

const loom_kernels loom_kernels_avx512_q = {.name = "avx512-q"};
const loom_kernels loom_kernels_avx512_q_fast = {.name = "avx512-q-fast"};
