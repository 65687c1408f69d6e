/* ops_dense_avx512: matmuls over f32/f16/bf16 weights with AVX-512.
 * Compiled with the AVX-512 flags (Makefile); only reached after
 * loom_kernels_get() checked the CPU. */
#include "ops/ops.h"

const loom_kernels loom_kernels_avx512_dense = {.name = "avx512-dense"};
const loom_kernels loom_kernels_avx512_dense_fast = {.name = "avx512-dense-fast"};
