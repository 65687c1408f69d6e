/* linear_attn: the Gated DeltaNet token mixer (Qwen3.5, Qwen3-Next) with
 * its scratch, and the recurrent state per sequence (fwd_row.h) it reads
 * and advances. Not part of the model API. */
#ifndef LOOM_LINEAR_ATTN_H
#define LOOM_LINEAR_ATTN_H

#include "model/fwd_buf.h"
#include "model/fwd_row.h"

/* Scratch of the linear-attention layers for up to step_tokens tokens;
 * only models with such layers have one. Owned by the forward state. */
typedef struct loom_lin_state loom_lin_state;

/* The state and its buffers, recorded in b (the forward state's, which
 * frees them); NULL, with b->failed set, when out of memory. */
loom_lin_state *loom_lin_state_create(const loom_model *m, int step_tokens, loom_fwd_bufs *b);

/* The token mixer of linear layer L over the rows' T tokens: reads xb
 * (T, hidden), the normed input, and writes its output there. */
void loom_lin_forward(loom_model *m, loom_lin_state *ls, const loom_fwd_row *rows, int n_rows,
                      const loom_layer *L, float *xb, int T);

/* Checks each row's recurrent state against its sequence (and zeroes the
 * state of rows starting at position 0). */
loom_status loom_fwd_check_states(const loom_model *m, loom_fwd_row *rows, int n_rows);
/* Advances the states' token counts after a successful forward. */
void loom_fwd_commit_states(loom_fwd_row *rows, int n_rows);

#endif
