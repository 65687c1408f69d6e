/* ops_q_fast_ref: plain-C reference of the reduced-precision matmuls over
 * MLX affine-quantized weights (--fast): the rounding of the activations
 * and the arithmetic the SIMD versions must reproduce. NULL entries: no
 * fast variant.
 *
 * For 4- and 8-bit weights whose group is 64 << s columns, each token's
 * activations are rounded per block of 64 columns to int8: x ~ sx * qx with
 * sx = max|x| / 127 and qx = round-to-nearest-even(x * (127 / max|x|)), as
 * llama.cpp does with its Q8 activations. Then, per block j of group g,
 *     y += (sw_g * sx_j) * sum(q * qx) + bw_g * sx_j * sum(qx)
 * where sum(q * qx) and sum(qx) are exact integer sums (VPDPBUSD).
 * Other widths and groups, and rows longer than 32768 columns, use the
 * exact matmul. */
#include <math.h>

#include "base/base.h"
#include "ops/ops.h"

#define XBLK 64

int loom_q_fast_ok(const loom_qmat *w) {
    int m = w->group / XBLK;
    return (w->bits == 4 || w->bits == 8) && w->group % XBLK == 0 && (m & (m - 1)) == 0 &&
           w->n % w->group == 0 && w->n <= 32768;
}

/* q[0..64) and *sx: one block of activations rounded to int8. */
static int quant_block(const float *x, signed char *q, float *sx) {
    float amax = 0;
    for (int k = 0; k < XBLK; k++) amax = fmaxf(amax, fabsf(x[k]));
    float inv = amax > 0 ? 127.0f / amax : 0.0f;
    *sx = amax / 127.0f;
    int s = 0;
    for (int k = 0; k < XBLK; k++) {
        q[k] = (signed char)nearbyintf(x[k] * inv);
        s += q[k];
    }
    return s;
}

static void matmul_q(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                     int r0, int r1) {
    if (!loom_q_fast_ok(w)) {
        loom_kernels_ref.matmul_q(y, ldy, x, ldx, w, T, r0, r1);
        return;
    }
    int n = w->n, ng = n / w->group, per = w->group / XBLK, nb = n / XBLK;
    size_t words = (size_t)n * (size_t)w->bits / 32;
    signed char q[XBLK];
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * ldx;
        for (int r = r0; r < r1; r++) y[(size_t)t * ldy + r] = 0;
        for (int j = 0; j < nb; j++) {
            float sx;
            int isum = quant_block(xt + (size_t)j * XBLK, q, &sx);
            int g = j / per;
            for (int r = r0; r < r1; r++) {
                const uint32_t *row = w->w + (size_t)r * words;
                size_t si = (size_t)r * ng + g;
                float sw = w->f16 ? loom_f16_to_f32(w->scales[si]) : loom_bf16_to_f32(w->scales[si]);
                float bw = w->f16 ? loom_f16_to_f32(w->biases[si]) : loom_bf16_to_f32(w->biases[si]);
                int acc = 0;
                for (int k = 0; k < XBLK; k++) {
                    int kk = j * XBLK + k;
                    unsigned wq = w->bits == 8 ? (row[kk / 4] >> (kk % 4 * 8)) & 255u
                                               : (row[kk / 8] >> (kk % 8 * 4)) & 15u;
                    acc += (int)wq * q[k];
                }
                y[(size_t)t * ldy + r] += (float)acc * (sw * sx) + bw * (sx * (float)isum);
            }
        }
    }
}

const loom_kernels loom_kernels_ref_q_fast = {.name = "ref-q-fast", .matmul_q = matmul_q};
