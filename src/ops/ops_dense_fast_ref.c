/* ops_dense_fast_ref: plain-C reference of the reduced-precision matmuls
 * over f32/f16/bf16 weights (--fast): the rounding of the activations and
 * the arithmetic the SIMD versions must reproduce. NULL entries: no fast
 * variant.
 *
 * bf16 weights: each activation is rounded to bf16 (nearest even; f32
 * subnormals count as zero, as VCVTNE2PS2BF16 and VDPBF16PS treat them),
 * then multiplied by the weight in f32, which is exact (8-bit by 8-bit
 * significands), and summed in f32. Only the order of the sums may differ
 * in the SIMD version. */
#include <float.h>
#include <math.h>

#include "base/base.h"
#include "ops/ops.h"

/* x as the bf16 value the fast kernels multiply by. */
static float round_bf16(float x) {
    if (fabsf(x) < FLT_MIN) return 0.0f * x; /* keeps the sign, and NaN stays NaN */
    return loom_bf16_to_f32(loom_f32_to_bf16(x));
}

static void matmul_bf16(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n,
                        int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            float s = 0;
            for (int k = 0; k < n; k++)
                s += round_bf16(x[(size_t)t * ldx + k]) * loom_bf16_to_f32(w[(size_t)r * n + k]);
            y[(size_t)t * ldy + r] = s;
        }
}

const loom_kernels loom_kernels_ref_dense_fast = {
    .name = "ref-dense-fast",
    .matmul_bf16 = matmul_bf16,
};
