/* ops_ref: plain-C reference kernels. They define what every optimized
 * kernel must compute; keep them simple and obviously right. */
#include <math.h>

#include "base/base.h"
#include "ops/ops.h"

/* The dense matmuls sum in double: one f32 chain over a long row drifts
 * further from the float64 reference than the SIMD kernels' many short
 * lanes do, and the reference must be the nearest of them. */
static void matmul_f32(float *y, int ldy, const float *x, int ldx,
                       const float *w, int n, int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += (double)x[(size_t)t * ldx + k] * w[(size_t)r * n + k];
            y[(size_t)t * ldy + r] = (float)s;
        }
}

static void matmul_f16(float *y, int ldy, const float *x, int ldx,
                       const uint16_t *w, int n, int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            double s = 0;
            for (int k = 0; k < n; k++)
                s += (double)x[(size_t)t * ldx + k] * loom_f16_to_f32(w[(size_t)r * n + k]);
            y[(size_t)t * ldy + r] = (float)s;
        }
}

static void matmul_bf16(float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int n, int T, int r0, int r1) {
    for (int t = 0; t < T; t++)
        for (int r = r0; r < r1; r++) {
            double s = 0;
            for (int k = 0; k < n; k++)
                s += (double)x[(size_t)t * ldx + k] * loom_bf16_to_f32(w[(size_t)r * n + k]);
            y[(size_t)t * ldy + r] = (float)s;
        }
}

/* Field k of a packed row, reading the little-endian bit stream. */
static unsigned q_field(const uint32_t *row, int k, int bits) {
    size_t bit = (size_t)k * (size_t)bits;
    size_t wi = bit / 32;
    unsigned sh = (unsigned)(bit % 32);
    uint64_t v = row[wi] >> sh;
    if (sh + (unsigned)bits > 32) v |= (uint64_t)row[wi + 1] << (32 - sh);
    return (unsigned)(v & ((1u << bits) - 1));
}

/* Dequantizes group g of a packed row into buf (group floats). */
static void q_group(float *buf, const uint32_t *row, const loom_qmat *w, float sc, float bi, int g) {
    int k0 = g * w->group;
    if (32 % w->bits == 0) {
        int per = 32 / w->bits;
        unsigned mask = (1u << w->bits) - 1;
        for (int k = 0; k < w->group; k++) {
            uint32_t word = row[(k0 + k) / per];
            buf[k] = sc * (float)((word >> (((k0 + k) % per) * w->bits)) & mask) + bi;
        }
    } else {
        for (int k = 0; k < w->group; k++) buf[k] = sc * (float)q_field(row, k0 + k, w->bits) + bi;
    }
}

static void matmul_q(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                     int r0, int r1) {
    int n = w->n, ng = n / w->group;
    size_t words = (size_t)n * (size_t)w->bits / 32;
    float buf[LOOM_QGROUP_MAX];
    for (int r = r0; r < r1; r++) {
        const uint32_t *row = w->w + (size_t)r * words;
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] = 0;
        for (int g = 0; g < ng; g++) {
            size_t si = (size_t)r * ng + g;
            float sc = w->f16 ? loom_f16_to_f32(w->scales[si]) : loom_bf16_to_f32(w->scales[si]);
            float bi = w->f16 ? loom_f16_to_f32(w->biases[si]) : loom_bf16_to_f32(w->biases[si]);
            q_group(buf, row, w, sc, bi, g);
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * ldx + (size_t)g * w->group;
                float s = 0;
                for (int k = 0; k < w->group; k++) s += buf[k] * xt[k];
                y[(size_t)t * ldy + r] += s;
            }
        }
    }
}

/* Each weight dequantized to f32 (code times its block's scale, one
 * rounding), then matmul_f32's double sum. */
static void matmul_f8(float *y, int ldy, const float *x, int ldx, const loom_f8mat *w, int T,
                      int r0, int r1) {
    int n = w->n, sc = loom_f8_scale_cols(w);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = w->w + (size_t)r * n;
        const float *s = w->scales + (size_t)(r / w->br) * sc;
        for (int t = 0; t < T; t++) {
            double acc = 0;
            for (int k = 0; k < n; k++)
                acc += (double)x[(size_t)t * ldx + k] * (loom_e4m3_to_f32(row[k]) * s[k / w->bc]);
            y[(size_t)t * ldy + r] = (float)acc;
        }
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

static void attn_pv(float *out, int ldo, const float *p, int ldp, const int *keys, int slots,
                    const float *v, int ldv, int n_keys, int hd) {
    (void)n_keys;
    for (int s = 0; s < slots; s++)
        for (int i = keys[2 * s]; i < keys[2 * s + 1]; i++)
            axpy(out + (size_t)s * ldo, p[(size_t)s * ldp + i], v + (size_t)i * ldv, hd);
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

static void gelu_tanh_mul(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) {
        float x = g[i];
        float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        g[i] = 0.5f * x * (1.0f + tanhf(in)) * u[i];
    }
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
    .matmul_q = matmul_q,
    .matmul_f8 = matmul_f8,
    .dot = dot,
    .axpy = axpy,
    .attn_pv = attn_pv,
    .rmsnorm = rmsnorm,
    .softmax = softmax,
    .silu_mul = silu_mul,
    .gelu_tanh_mul = gelu_tanh_mul,
    .f16_to_f32 = f16_to_f32,
    .bf16_to_f32 = bf16_to_f32,
};

/* First index of the largest value (a NaN never wins; a NaN at 0 stays).
 * Blocks of 256 are scanned for their max with branch-free lanes the
 * compiler vectorises, and searched only when that max beats the best so
 * far: one pass over a vocabulary's logits at vector speed. */
int loom_argmax(const float *x, int n) {
    enum { BLK = 256, LANES = 16 };
    int best = 0;
    float bv = x[0];
    int i = 0;
    for (; i + BLK <= n; i += BLK) {
        float m[LANES];
        for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
        for (int j = 0; j < BLK; j += LANES)
            for (int l = 0; l < LANES; l++) m[l] = x[i + j + l] > m[l] ? x[i + j + l] : m[l];
        float bm = m[0];
        for (int l = 1; l < LANES; l++) bm = m[l] > bm ? m[l] : bm;
        if (bm > bv)
            for (int j = i; j < i + BLK; j++)
                if (x[j] == bm) {
                    best = j, bv = bm;
                    break;
                }
    }
    for (; i < n; i++)
        if (x[i] > bv) best = i, bv = x[i];
    return best;
}
