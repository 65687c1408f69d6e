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
 * sequence to 0 and refilling it needs no reset call).
 *
 * Prepared input (vision-language prompts): a row may carry, beside its
 * token ids, the layer-0 input rows themselves (text embeddings with image
 * features spliced in at the placeholder tokens), the tokens' own M-RoPE
 * positions (t, h, w), and deepstack features added to the hidden state
 * after each of the first n_deep layers. A row without pos3 turns its rope
 * by KV position + pos_delta: a prompt that owned its position grid leaves
 * only that delta to its decode rows. Rows that set none of these are plain
 * text rows and compute exactly what they did before. The arrays are laid
 * out per prompt with stride pos_ld (>= n), so a chunk of a prompt points
 * into the whole prompt's arrays at its offset pos_off. Bidirectional spans
 * (Gemma 3's images): the tokens of a run of equal groups[i] >= 0 attend
 * to each other both ways, every other token causally; a span lies whole
 * inside one row (a chunk that starts or ends inside one is refused). */
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

/* Device residency. A backend that runs the linear layers on a device (the
 * CUDA forward) binds a state to a slot of its own and keeps the live copy
 * there; the host arrays are then brought up to date only when something
 * on the host reads them (save, copy, a CPU forward), through pull. States
 * are engine-thread objects, so none of this locks. */
typedef struct loom_seq_state_dev loom_seq_state_dev;
struct loom_seq_state_dev {
    /* copies slot's device state into the host arrays conv [conv_n] and
     * rec [rec_n] (the layout of loom_seq_state_save: every linear layer's
     * conv state, then every layer's delta-rule state) */
    loom_status (*pull)(loom_seq_state_dev *d, int slot, float *conv, size_t conv_n, float *rec,
                        size_t rec_n);
    /* the state is freed: slot may serve another */
    void (*release)(loom_seq_state_dev *d, int slot);
};

/* st's slot under d, or -1 when st is not bound to d. */
int loom_seq_state_dev_slot(const loom_seq_state *st, const loom_seq_state_dev *d);
/* Binds st to slot of d (d NULL: unbinds, the host arrays made current
 * first). The device copy counts as stale until the backend says otherwise. */
void loom_seq_state_dev_bind(loom_seq_state *st, loom_seq_state_dev *d, int slot);
/* The host arrays when they are newer than the device copy (the backend
 * uploads them and calls loom_seq_state_dev_synced), else NULL. */
const float *loom_seq_state_dev_stale(const loom_seq_state *st, size_t *conv_n,
                                      const float **rec, size_t *rec_n);
void loom_seq_state_dev_synced(loom_seq_state *st);
/* The backend zeroed the device copy (the sequence restarts at 0). */
void loom_seq_state_dev_zeroed(loom_seq_state *st);
/* A device forward advanced the device copy: the host arrays are stale. */
void loom_seq_state_dev_advanced(loom_seq_state *st);

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
    /* Prepared input (above); all NULL / 0 for a text row. */
    const float *embeds;     /* (n, hidden) borrowed: layer-0 input in place of the embeddings */
    const int32_t *pos3;     /* (3, pos_ld) borrowed: rope positions (t, h, w) of the n tokens */
    const float *deepstack;  /* (n_deep, pos_ld, hidden) borrowed: zero rows at text tokens */
    int n_deep;              /* added after layers 0 .. n_deep - 1 */
    const int32_t *groups;   /* (pos_ld) borrowed: span id of each token, -1 outside spans */
    int pos_ld;              /* stride of pos3's streams and deepstack's planes */
    int pos_off;             /* the row's first token's index in those arrays */
    int pos_delta;           /* without pos3: rope position = KV position + pos_delta */
    /* Embeddings: when non-NULL, [n, hidden] receives every position's
     * hidden state after the final norm (what the head reads), besides
     * whatever logits asks for (the CPU and CUDA forwards both do). */
    float *hidden;
    /* Verification on a backend that picks (the device): when non-NULL,
     * [n] receives each position's greedy id (first on ties) in place of
     * its logits in out (a row with logits ALL); the CPU forward leaves it
     * alone, so the caller sets ids[0] = -1 to tell. */
    int32_t *ids;
} loom_fwd_row;

/* A whole prepared prompt of n tokens as its owner keeps it (stride n);
 * a row over tokens [off, off + k) points at each array's offset. */
typedef struct loom_fwd_input {
    const float *embeds;     /* (n, hidden) or NULL */
    const int32_t *pos3;     /* (3, n) or NULL */
    const float *deepstack;  /* (n_deep, n, hidden) or NULL */
    int n_deep;
    const int32_t *groups;   /* (n) or NULL */
    int pos_delta;           /* what decode rows after the prompt carry */
} loom_fwd_input;

/* Row r's prepared fields for tokens [off, off + r->n) of a prompt of n
 * tokens (in NULL: a text row, pos_delta 0). */
static inline void loom_fwd_row_input(loom_fwd_row *r, const loom_fwd_input *in, int hidden,
                                      int off, int n) {
    if (!in) return;
    r->embeds = in->embeds ? in->embeds + (size_t)off * hidden : NULL;
    r->pos3 = in->pos3 ? in->pos3 + off : NULL;
    r->deepstack = in->deepstack ? in->deepstack + (size_t)off * hidden : NULL;
    r->n_deep = in->deepstack ? in->n_deep : 0;
    r->groups = in->groups ? in->groups + off : NULL;
    r->pos_ld = n;
    r->pos_off = off;
    r->pos_delta = in->pos_delta;
}

/* The logits rows a row writes to out: n (ALL), 1 (LAST) or 0. */
static inline int loom_fwd_row_logits(const loom_fwd_row *r) {
    return r->logits == LOOM_LOGITS_ALL ? r->n : r->logits ? 1 : 0;
}

#endif
