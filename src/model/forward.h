/* forward: one batched forward pass over rows from many sequences.
 *
 * A row appends n tokens to one sequence at positions [seq->n_tokens,
 * seq->n_tokens + n); the caller has reserved KV blocks for them. Rows are
 * independent (each attends only to its own sequence), so any mix of
 * prefill chunks and decode tokens can share one forward. Logits are
 * computed only where a row asks for them (model/fwd_row.h: what a row
 * carries). */
#ifndef LOOM_FORWARD_H
#define LOOM_FORWARD_H

#include "model/fwd_row.h"
#include "model/kv_layout.h"
#include "model/model.h"

/* Activations for up to step_tokens tokens per forward (all rows together;
 * not a request's max_tokens, the tokens it may generate) over sequences of
 * up to max_ctx positions. Owned by one engine thread. */
typedef struct loom_fwd_state loom_fwd_state;

loom_status loom_fwd_state_create(const loom_model *m, int step_tokens, int max_ctx,
                                  loom_fwd_state **out);
void loom_fwd_state_free(loom_fwd_state *s);
/* A drafter's companion rows (model/dflash.h): until set again, every
 * forward on s writes the hidden state after each layer layers[k] (the
 * residual stream, before any final norm) of its t-th token (rows in
 * order) to out [t, k * hidden, (k + 1) * hidden). n 0: none. */
void loom_fwd_set_taps(loom_fwd_state *s, const int *layers, int n, float *out);

/* The checks every backend makes before a pass: each row has tokens in
 * the vocabulary, a sequence no longer than max_ctx with its KV blocks
 * reserved, a logits buffer if it wants logits, and its own sequence; at
 * most step_tokens tokens in all (stored in *total). */
loom_status loom_fwd_check_rows(const loom_model *m, const loom_fwd_row *rows, int n_rows,
                                int block_size, int max_ctx, int step_tokens, int *total);

/* Runs the model. Checks token ids, sizes and recurrent states first; on an
 * error nothing is written to any sequence. The KV layout's rows must be at
 * least loom_model_kv_dim(m) wide. */
loom_status loom_forward(loom_model *m, loom_fwd_state *s, loom_kv_layout *kv,
                         loom_fwd_row *rows, int n_rows);

#endif
