/* moe: routed experts and the shared expert (Qwen3-MoE, Qwen3-Next,
 * Gemma 4's block beside the dense MLP), with the routing scratch they
 * own; the experts run on the caller's MLP scratch. */
#include "model/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/fwd_buf.h"
#include "model/matmul.h"

struct loom_moe_state {
    float *router;     /* (step_tokens, n_experts) */
    int *sel;          /* (step_tokens, n_used) chosen experts */
    float *sel_w;      /* (step_tokens, n_used) their weights */
    int *gather;       /* [step_tokens] tokens routed to one expert */
    float *xg, *yg;    /* (step_tokens, hidden) gathered inputs / outputs */
    float *in;         /* (step_tokens, hidden) expert input (gemma4 block) */
    float *rin;        /* (step_tokens, hidden) router input (gemma4) */
    float *sum;        /* (step_tokens, hidden) the experts' weighted sum */
};

loom_moe_state *loom_moe_state_create(const loom_model *m, int step_tokens, loom_fwd_bufs *b) {
    const loom_config *c = &m->cfg;
    loom_moe_state *s = loom_fwd_buf(b, sizeof *s);
    if (!s) return NULL;
    size_t T = (size_t)step_tokens, H = (size_t)c->hidden_size;
    size_t E = (size_t)LOOM_MAX(c->n_experts, 1), K = (size_t)LOOM_MAX(c->n_experts_used, 1);
    LOOM_FWD_BUF(b, s->router, T * E);
    LOOM_FWD_BUF(b, s->sel, T * K);
    LOOM_FWD_BUF(b, s->sel_w, T * K);
    LOOM_FWD_BUF(b, s->gather, T);
    LOOM_FWD_BUF(b, s->xg, T * H);
    LOOM_FWD_BUF(b, s->yg, T * H);
    LOOM_FWD_BUF(b, s->in, T * H);
    LOOM_FWD_BUF(b, s->rin, T * H);
    LOOM_FWD_BUF(b, s->sum, T * H);
    return s;
}

/* Routed experts (softmax, top-k, optional renormalisation and per-expert
 * scales) plus the gated shared expert: out (T, hidden) from router input
 * rin and expert input xin. Only the chosen experts run, each on its
 * tokens. */
static void moe(loom_model *m, loom_moe_state *s, const loom_moe *p, const float *rin,
                const float *xin, float *out, int T, float *hb, float *hb2) {
    const loom_config *c = &m->cfg;
    int H = c->hidden_size, E = c->n_experts, K = c->n_experts_used;
    if (p->in_scale) {  /* gemma4: route on rmsnorm(x) * scale / sqrt(hidden) */
        for (int t = 0; t < T; t++) {
            float *r = s->rin + (size_t)t * H;
            memcpy(r, rin + (size_t)t * H, sizeof(float) * (size_t)H);
            loom_fwd_rms_plain(r, H, (float)c->rms_eps);
            for (int i = 0; i < H; i++) r[i] *= p->in_scale[i];
        }
        rin = s->rin;
    }
    loom_fwd_matmul(m, s->router, rin, &p->router, T);
    for (int t = 0; t < T; t++) {
        float *r = s->router + (size_t)t * E;
        m->k->softmax(r, E);
        int *sel = s->sel + (size_t)t * K;
        float *w = s->sel_w + (size_t)t * K, sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= sel[j] == e;
                if (!taken && (best < 0 || r[e] > r[best])) best = e;
            }
            sel[k] = best;
            w[k] = r[best];
            sum += r[best];
        }
        for (int k = 0; k < K; k++) {
            if (p->renorm) w[k] /= sum;
            if (p->expert_scale) w[k] *= p->expert_scale[sel[k]];
        }
    }
    memset(out, 0, sizeof(float) * (size_t)T * H);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (s->sel[(size_t)t * K + k] == e) {
                    s->gather[n] = t * K + k;
                    memcpy(s->xg + (size_t)n * H, xin + (size_t)t * H, sizeof(float) * (size_t)H);
                    n++;
                }
        if (!n) continue;
        loom_fwd_mlp(m, &p->experts[e], s->yg, s->xg, n, hb, hb2);
        for (int i = 0; i < n; i++) {
            int t = s->gather[i] / K;
            m->k->axpy(out + (size_t)t * H, s->sel_w[s->gather[i]], s->yg + (size_t)i * H, H);
        }
    }
    if (p->shared.gate.rows) {
        loom_fwd_mlp(m, &p->shared, s->yg, xin, T, hb, hb2);
        loom_fwd_matmul(m, s->router, xin, &p->shared_gate, T);  /* routing is done */
        for (int t = 0; t < T; t++) {
            float g = 1.0f / (1.0f + expf(-s->router[t]));
            m->k->axpy(out + (size_t)t * H, g, s->yg + (size_t)t * H, H);
        }
    }
}

void loom_moe_ffn(loom_model *m, loom_moe_state *s, const loom_moe *p, float *xb, int T,
                  float *hb, float *hb2) {
    moe(m, s, p, xb, xb, s->sum, T, hb, hb2);
    memcpy(xb, s->sum, sizeof(float) * (size_t)T * m->cfg.hidden_size);
}

void loom_moe_beside(loom_model *m, loom_moe_state *s, const loom_layer *L, const float *x,
                     float *xb, int T, float *hb, float *hb2) {
    int H = m->cfg.hidden_size;
    loom_fwd_norm_rows(m, s->in, x, L->pre_moe_norm, T, H);
    moe(m, s, &L->moe, x, s->in, s->sum, T, hb, hb2);
    loom_fwd_norm_rows(m, s->sum, s->sum, L->post_moe_norm, T, H);
    for (size_t i = 0; i < (size_t)T * H; i++) xb[i] += s->sum[i];
}
