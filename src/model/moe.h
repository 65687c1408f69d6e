/* moe: the sparse MoE feed-forward and its routing scratch. Not part of
 * the model API. */
#ifndef LOOM_MOE_H
#define LOOM_MOE_H

#include "model/fwd_buf.h"
#include "model/model.h"

/* Routing scratch for up to step_tokens tokens; only MoE models have one.
 * Owned by the forward state. */
typedef struct loom_moe_state loom_moe_state;

/* The state and its buffers, recorded in b (the forward state's, which
 * frees them); NULL, with b->failed set, when out of memory. */
loom_moe_state *loom_moe_state_create(const loom_model *m, int step_tokens, loom_fwd_bufs *b);

/* Routed experts plus the gated shared expert, in place on xb (T, hidden).
 * hb and hb2 are the MLP scratch, (T, max_inter) each. */
void loom_moe_ffn(loom_model *m, loom_moe_state *s, const loom_moe *p, float *xb, int T,
                  float *hb, float *hb2);

/* Gemma 4's MoE block beside the dense MLP: xb (T, hidden) +=
 * post2(moe(router: x, experts: pre2(x))). */
void loom_moe_beside(loom_model *m, loom_moe_state *s, const loom_layer *L, const float *x,
                     float *xb, int T, float *hb, float *hb2);

#endif
