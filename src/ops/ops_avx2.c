/* ops_avx2: AVX2/FMA/F16C kernels. Compiled with -mavx2 -mfma -mf16c and
 * only reached after loom_kernels_get() checked the CPU. Until a kernel has
 * a SIMD version, its entry points at the reference. */
#include "ops/ops.h"

const loom_kernels loom_kernels_avx2 = {
    .name = "avx2",
};
