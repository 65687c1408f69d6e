/* dflash: the projected-context drafter (a DFlashDraftModel checkpoint,
 * docs/dflash.md). It reads the target's hidden states at a few tap
 * layers, projects each position's (fc, then a norm) into K/V context rows
 * of every drafter layer, and drafts a whole block in one forward: the
 * last accepted token and block-1 mask tokens, embedded with the target's
 * embeddings, attend to all context rows and to the whole block (no causal
 * mask), and the target's lm_head turns rows 1.. into block-1 proposals.
 * All math is f32 on the CPU; the target lends its embeddings, head,
 * kernels and thread pool. Its proposals are only ever verified, so its
 * arithmetic is free to be approximate: loom_dflash_prepare can give it
 * 8-bit copies of its matrices and of the head under the --fast kernels. */
#ifndef LOOM_DFLASH_H
#define LOOM_DFLASH_H

#include "model/model.h"

#define LOOM_DFLASH_MAX_TAPS 16

typedef struct loom_dflash_layer {
    loom_weight q, k, v, o;         /* f32, owned by the drafter's arena */
    loom_mlp mlp;
    const float *in_norm, *post_norm, *q_norm, *k_norm;
} loom_dflash_layer;

typedef struct loom_dflash {
    int n_taps, taps[LOOM_DFLASH_MAX_TAPS]; /* target layers, in fc's input order */
    int block, mask_id;
    int hidden, n_layers, n_heads, n_kv, head_dim, inter, vocab, target_hidden;
    float eps;
    double theta;
    loom_weight fc;                 /* (hidden, n_taps * target_hidden) */
    const float *hidden_norm, *norm;
    loom_dflash_layer *layers;      /* owned [n_layers] */
    float *arena;                   /* owned: every f32 tensor */
    /* Set by loom_dflash_prepare (NULL / zero before: the target's table
     * and head): the table the matmuls run on, and the head they use. */
    const loom_kernels *k;
    loom_weight head;
} loom_dflash;

/* Reads dir/config.json and dir/model.safetensors. */
loom_status loom_dflash_load(const char *dir, loom_dflash **out);
void loom_dflash_free(loom_dflash *d);
/* Whether dir's config.json names DFlashDraftModel. */
int loom_dflash_is(const char *dir);
/* Whether d fits target t: hidden size, vocabulary, tap layers. */
loom_status loom_dflash_check(const loom_dflash *d, const loom_model *t);

/* Binds d to target t's head and picks its arithmetic: with fast, 8-bit
 * copies (group 64, scales from the f32 range) of every matrix and of a
 * dense head, run by loom_kernels_get_fast()'s integer kernels, where that
 * table has them (AVX-512 VNNI); else the target's table over the
 * checkpoint's values. Call with no forward of d running. */
loom_status loom_dflash_prepare(loom_dflash *d, const loom_model *t, int fast);
/* Whether d runs 8-bit copies (after loom_dflash_prepare). */
int loom_dflash_is_q8(const loom_dflash *d);

/* Floats one context row takes: K and V of every layer. */
static inline size_t loom_dflash_row_floats(const loom_dflash *d) {
    return (size_t)d->n_layers * 2 * (size_t)(d->n_kv * d->head_dim);
}
/* Context rows out [n, row_floats] of positions pos.. from the tap states
 * taps [n, n_taps * target_hidden]: per layer K (k_norm, rope) then V.
 * scratch holds n * (hidden + n_kv*head_dim) floats. */
void loom_dflash_project(const loom_dflash *d, loom_model *t, const float *taps, int pos, int n,
                         float *out, float *scratch);
/* One request's block: the last accepted token `last` at position pos,
 * then masks, over n_ctx context rows ctx [n_ctx, row_floats] (each roped
 * at its own position when projected; all before pos). Logits of rows
 * 1..n_out (n_out <= block - 1) are wanted. */
typedef struct loom_dflash_req {
    const float *ctx;
    int n_ctx, pos, n_out;
    int32_t last;
} loom_dflash_req;
/* Floats of scratch a forward of n_req blocks over at most n_ctx context
 * rows each needs. */
size_t loom_dflash_scratch(const loom_dflash *d, int n_ctx, int n_req);
/* The blocks of n_req requests in one forward (their rows stacked through
 * every matmul; attention stays within a request): logits [n_out, vocab]
 * of each request in turn into logits. A request's logits do not depend
 * on the others' (each output of the kernels' matmuls is one row's). */
void loom_dflash_blocks(const loom_dflash *d, loom_model *t, const loom_dflash_req *rq, int n_req,
                        float *logits, float *scratch);
/* One request, all block - 1 rows: logits [block-1, vocab]. scratch holds
 * loom_dflash_scratch(d, n_ctx, 1) floats. */
void loom_dflash_block(const loom_dflash *d, loom_model *t, const float *ctx, int n_ctx, int pos,
                       int32_t last, float *logits, float *scratch);

#endif
