/* forward: one batched forward pass over rows from many sequences.
 *
 * A row appends n tokens to one sequence at positions [seq->n_tokens,
 * seq->n_tokens + n); the caller has reserved KV blocks for them. Rows are
 * independent (each attends only to its own sequence), so any mix of
 * prefill chunks and decode tokens can share one forward. Logits are
 * computed only where a row asks for them.
 *
 * Models with linear-attention layers (Qwen3.5, Qwen3-Next) also carry a
 * recurrent state per sequence: a loom_seq_state holding, per linear layer,
 * the last kernel-1 conv inputs and the delta-rule state of every value
 * head. The row points at its sequence's state. The state cannot be
 * rewound: it must have consumed exactly seq->n_tokens tokens, except that a
 * sequence at position 0 always starts from a zero state (so truncating a
 * sequence to 0 and refilling it needs no reset call). */
#ifndef LOOM_FORWARD_H
#define LOOM_FORWARD_H

#include <stdint.h>

#include "model/kv_layout.h"
#include "model/model.h"

enum { LOOM_LOGITS_NONE = 0, LOOM_LOGITS_LAST = 1, LOOM_LOGITS_ALL = 2 };

/* Recurrent state of one sequence (linear-attention layers only). */
typedef struct loom_seq_state loom_seq_state;

/* Creates a zero state for one sequence of model m. For a model without
 * linear-attention layers *out is NULL and the call succeeds: rows of such
 * models may leave state NULL. */
loom_status loom_seq_state_create(const loom_model *m, loom_seq_state **out);
void loom_seq_state_free(loom_seq_state *st);
/* Zeroes the state (the sequence restarts at position 0). */
void loom_seq_state_reset(loom_seq_state *st);
/* Tokens the state has consumed. */
int loom_seq_state_tokens(const loom_seq_state *st);
/* Bytes one state takes for model m (0 without linear-attention layers). */
size_t loom_seq_state_bytes(const loom_model *m);
/* Snapshots (prefix cache, disk tier): copies the state to buf, which
 * holds loom_seq_state_bytes(m) bytes, or restores it from such a copy;
 * the state then counts n_tokens consumed. dst and src of a copy come from
 * the same model. */
void loom_seq_state_save(const loom_seq_state *st, void *buf);
void loom_seq_state_load(loom_seq_state *st, const void *buf, int n_tokens);
void loom_seq_state_copy(loom_seq_state *dst, const loom_seq_state *src);

typedef struct loom_fwd_row {
    const int32_t *tokens;   /* [n] borrowed */
    int n;
    loom_kv_seq *seq;        /* borrowed; n_tokens advances by n on success */
    int logits;              /* LOOM_LOGITS_* */
    float *out;              /* [1 or n, vocab] when logits != NONE */
    loom_seq_state *state;   /* borrowed; required iff the model has linear layers */
    /* One sampled token (a decode step; n must be 1): on the CPU its
     * attention over a long span may go by chunks of keys. Prompt rows
     * never do, so a prompt token's attention is the same however the
     * prompt is chunked or how much of it a prefix cache supplied. */
    int decode;
} loom_fwd_row;

/* The logits rows a row writes to out: n (ALL), 1 (LAST) or 0. */
static inline int loom_fwd_row_logits(const loom_fwd_row *r) {
    return r->logits == LOOM_LOGITS_ALL ? r->n : r->logits ? 1 : 0;
}

/* Activations for up to step_tokens tokens per forward (all rows together;
 * not a request's max_tokens, the tokens it may generate) over sequences of
 * up to max_ctx positions. Owned by one engine thread. */
typedef struct loom_fwd_state loom_fwd_state;

loom_status loom_fwd_state_create(const loom_model *m, int step_tokens, int max_ctx,
                                  loom_fwd_state **out);
void loom_fwd_state_free(loom_fwd_state *s);

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
