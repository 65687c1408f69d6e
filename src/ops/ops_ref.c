/* ops_ref: plain-C reference kernels. They define what every optimized
 * kernel must compute; keep them simple and obviously right. */
#include <math.h>

#include "base/base.h"
#include "ops/ops.h"

static void matmul_f32(float *y, int ldy, const float *x, int ldx,
                       const float *w, int n, int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            float s = 0;
            for (int k = 0; k < n; k++) s += x[(size_t)t * ldx + k] * w[(size_t)r * n + k];
            y[(size_t)t * ldy + r] = s;
        }
}

static void matmul_f16(float *y, int ldy, const float *x, int ldx,
                       const uint16_t *w, int n, int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            float s = 0;
            for (int k = 0; k < n; k++)
                s += x[(size_t)t * ldx + k] * loom_f16_to_f32(w[(size_t)r * n + k]);
            y[(size_t)t * ldy + r] = s;
        }
}

static void matmul_bf16(float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int n, int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            float s = 0;
            for (int k = 0; k < n; k++)
                s += x[(size_t)t * ldx + k] * loom_bf16_to_f32(w[(size_t)r * n + k]);
            y[(size_t)t * ldy + r] = s;
        }
}

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

static void softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

static void silu_mul(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void f16_to_f32(float *y, const uint16_t *x, int n) {
    for (int i = 0; i < n; i++) y[i] = loom_f16_to_f32(x[i]);
}

static void bf16_to_f32(float *y, const uint16_t *x, int n) {
    for (int i = 0; i < n; i++) y[i] = loom_bf16_to_f32(x[i]);
}

const loom_kernels loom_kernels_ref = {
    .name = "ref",
    .matmul_f32 = matmul_f32,
    .matmul_f16 = matmul_f16,
    .matmul_bf16 = matmul_bf16,
    .dot = dot,
    .axpy = axpy,
    .rmsnorm = rmsnorm,
    .softmax = softmax,
    .silu_mul = silu_mul,
    .f16_to_f32 = f16_to_f32,
    .bf16_to_f32 = bf16_to_f32,
};

int loom_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}
