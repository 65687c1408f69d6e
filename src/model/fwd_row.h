/* fwd_row: what one row of a batched forward carries (forward.h), apart
 * from the forward so that the blocks it calls (linear_attn, ple) can
 * read rows without including it.
 *
 * Models with linear-attention layers (Qwen3.5, Qwen3-Next) also carry a
 * recurrent state per sequence: a loom_seq_state holding, per linear layer,
 * the last kernel-1 conv inputs and the delta-rule state of every value
 * head. The row points at its sequence's state. The state cannot be
 * rewound: it must have consumed exactly seq->n_tokens tokens, except that a
 * sequence at position 0 always starts from a zero state (so truncating a
 * sequence to 0 and refilling it needs no reset call). */
#ifndef LOOM_FWD_ROW_H
#define LOOM_FWD_ROW_H

#include <stddef.h>
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
    /* Sampled tokens (a decode step: one token, or the last one and a
     * draft's proposals to verify). On the CPU a lone decode token's
     * attention over a long span may go by chunks of keys; prompt rows
     * never do, so a prompt token's attention is the same however the
     * prompt is chunked or how much of it a prefix cache supplied. A
     * linear-attention layer steps each token of a decode row through the
     * recurrence, the state rounded to its stored floats between tokens,
     * as decoding them one by one would. */
    int decode;
} loom_fwd_row;

/* The logits rows a row writes to out: n (ALL), 1 (LAST) or 0. */
static inline int loom_fwd_row_logits(const loom_fwd_row *r) {
    return r->logits == LOOM_LOGITS_ALL ? r->n : r->logits ? 1 : 0;
}

#endif
