/* forward: one batched forward pass over rows from many sequences.
 *
 * A row appends n tokens to one sequence at positions [seq->n_tokens,
 * seq->n_tokens + n); the caller has reserved KV blocks for them. Rows are
 * independent (each attends only to its own sequence), so any mix of
 * prefill chunks and decode tokens can share one forward. Logits are
 * computed only where a row asks for them. */
#ifndef LOOM_FORWARD_H
#define LOOM_FORWARD_H

#include <stdint.h>

#include "engine/kv.h"
#include "model/model.h"

enum { LOOM_LOGITS_NONE = 0, LOOM_LOGITS_LAST = 1, LOOM_LOGITS_ALL = 2 };

typedef struct loom_fwd_row {
    const int32_t *tokens;   /* [n] borrowed */
    int n;
    loom_kv_seq *seq;        /* borrowed; n_tokens advances by n on success */
    int logits;              /* LOOM_LOGITS_* */
    float *out;              /* [1 or n, vocab] when logits != NONE */
} loom_fwd_row;

/* Activations for up to max_tokens tokens per forward over sequences of up
 * to max_ctx positions. Owned by one engine thread. */
typedef struct loom_fwd_state loom_fwd_state;

loom_status loom_fwd_state_create(const loom_model *m, int max_tokens, int max_ctx,
                                  loom_fwd_state **out);
void loom_fwd_state_free(loom_fwd_state *s);
int loom_fwd_state_max_tokens(const loom_fwd_state *s);

/* Runs the model. Checks token ids and sizes first; on an error nothing is
 * written to any sequence. */
loom_status loom_forward(loom_model *m, loom_fwd_state *s, loom_kv_pool *kv,
                         loom_fwd_row *rows, int n_rows);

#endif
