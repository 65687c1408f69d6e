/* ple: Gemma 4's per-layer inputs, a small embedding per token and layer
 * mixed into the residual after each layer, with the buffers that hold
 * them for one forward. */
#include "model/ple.h"

#include <math.h>
#include <stdlib.h>

#include "base/base.h"
#include "model/fwd_buf.h"
#include "model/matmul.h"

struct loom_ple_state {
    float *in;         /* (step_tokens, n_layers * ple_dim) every layer's input */
    float *tmp;        /* (step_tokens, ple_dim) */
    float *row;        /* (n_layers * ple_dim) one token's per-layer embedding */
};

loom_ple_state *loom_ple_state_create(const loom_model *m, int step_tokens, loom_fwd_bufs *b) {
    const loom_config *c = &m->cfg;
    loom_ple_state *s = loom_fwd_buf(b, sizeof *s);
    if (!s) return NULL;
    size_t T = (size_t)step_tokens, P = (size_t)c->per_layer_input_dim;
    LOOM_FWD_BUF(b, s->in, T * P * (size_t)c->n_layers);
    LOOM_FWD_BUF(b, s->tmp, T * P);
    LOOM_FWD_BUF(b, s->row, P * (size_t)c->n_layers);
    return s;
}

/* ple (T, n_layers, P) = (norm(proj(x) / sqrt(hidden)) + embed_pl(id)) / sqrt(2),
 * from the scaled token embeddings x. */
void loom_ple_inputs(loom_model *m, loom_ple_state *s, const float *x, const loom_fwd_row *rows,
                     int n_rows, int T) {
    const loom_config *c = &m->cfg;
    int P = c->per_layer_input_dim, LP = c->n_layers * P;
    loom_fwd_matmul(m, s->in, x, &m->ple_model_proj, T);
    float pscale = (float)(1.0 / sqrt((double)c->hidden_size));
    for (int r = 0, t = 0; r < n_rows; r++)
        for (int i = 0; i < rows[r].n; i++, t++) {
            float *p = s->in + (size_t)t * LP;
            for (int j = 0; j < LP; j++) p[j] *= pscale;
            for (int l = 0; l < c->n_layers; l++)
                m->k->rmsnorm(p + (size_t)l * P, p + (size_t)l * P, m->ple_proj_norm, P,
                              (float)c->rms_eps);
            loom_fwd_weight_row(m, &m->ple_embed, s->row, rows[r].tokens[i]);
            for (int j = 0; j < LP; j++)
                p[j] = (p[j] + s->row[j] * m->ple_embed_scale) * (float)M_SQRT1_2;
        }
}

/* x += norm(proj(act(gate(x)) * ple_l)) */
void loom_ple_block(loom_model *m, loom_ple_state *s, const loom_layer *L, int l, float *x,
                    float *xb, int T) {
    const loom_config *c = &m->cfg;
    int P = c->per_layer_input_dim, LP = c->n_layers * P, H = c->hidden_size;
    loom_fwd_matmul(m, s->tmp, x, &L->ple_gate, T);
    for (int t = 0; t < T; t++)
        loom_fwd_act_mul(m, s->tmp + (size_t)t * P, s->in + (size_t)t * LP + (size_t)l * P, P);
    loom_fwd_matmul(m, xb, s->tmp, &L->ple_proj, T);
    loom_fwd_norm_rows(m, xb, xb, L->ple_norm, T, H);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += xb[i];
}
