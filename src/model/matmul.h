/* matmul: a weight times a batch of rows over the kernel table and the
 * thread pool, and the row helpers that the dense path and the feature
 * blocks (moe, ple, linear_attn) share. They sit below all of them, so
 * calls run one way: forward -> features -> matmul. Not part of the
 * model API. */
#ifndef LOOM_MATMUL_H
#define LOOM_MATMUL_H

#include <math.h>

#include "model/model.h"

/* y (T, w->rows) = x (T, w->cols) @ w^T, split over output rows. */
void loom_fwd_matmul(loom_model *m, float *y, const float *x, const loom_weight *w, int T);
/* The same for n_w <= 4 weights of equal width over one x, in one dispatch. */
void loom_fwd_matmul_n(loom_model *m, int n_w, float *const *y, const float *x,
                       const loom_weight *const *w, int T);
/* The same over kernel table k instead of the model's (m lends its pool). */
void loom_fwd_matmul_k(loom_model *m, const loom_kernels *k, int n_w, float *const *y,
                       const float *x, const loom_weight *const *w, int T);

/* Row id of an embedding table as f32 (any weight format) into dst. */
void loom_fwd_weight_row(const loom_model *m, const loom_weight *e, float *dst, int id);

/* out (T, hidden) = down(act(gate(in)) * up(in)); out may alias in. hb and
 * hb2 are scratch of (T, p->gate.rows) floats each. */
void loom_fwd_mlp(loom_model *m, const loom_mlp *p, float *out, const float *in, int T,
                  float *hb, float *hb2);

/* y (T, n) = rmsnorm(x) * w, row by row; y may alias x. */
static inline void loom_fwd_norm_rows(const loom_model *m, float *y, const float *x,
                                      const float *w, int T, int n) {
    float eps = (float)m->cfg.rms_eps;
    for (int t = 0; t < T; t++) m->k->rmsnorm(y + (size_t)t * n, x + (size_t)t * n, w, n, eps);
}

/* g = act(g) * u over n values, with the model's activation. */
static inline void loom_fwd_act_mul(const loom_model *m, float *g, const float *u, int n) {
    if (m->act == LOOM_ACT_GELU_TANH) m->k->gelu_tanh_mul(g, u, n);
    else m->k->silu_mul(g, u, n);
}

/* Unweighted RMSNorm in place (gemma4 values and router input). */
static inline void loom_fwd_rms_plain(float *x, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

#endif
