/* context: what the CLI takes from a context beyond the public API
 * (loom_context_* in loom.h). */
#ifndef LOOM_CONTEXT_H
#define LOOM_CONTEXT_H

#include "loom.h"
#include "model/fwd_row.h"

struct loom_sampler;

/* loom_context_eval of n tokens, then the next token into *id: picked by
 * sampler s (NULL: greedy) from the last logits, or, where the forward may
 * pick it itself (loom_exec_pick_for: on a device the vocabulary-sized
 * logits then stay there), by the forward. logits: [vocab] scratch. The
 * token is not added to s's penalty window (loom_sampler_accept). */
loom_status loom_context_eval_next(loom_context *c, const int32_t *tokens, int n,
                                   struct loom_sampler *s, float *logits, int32_t *id);

/* loom_context_eval of a prepared prompt (model/fwd_row.h): its ids and
 * their embeddings, positions and deepstack features, from the context's
 * current length on. Every later eval (decode) turns its rope by the
 * prompt's pos_delta, until the context is truncated to 0. */
loom_status loom_context_eval_input(loom_context *c, const int32_t *tokens, int n,
                                    const loom_fwd_input *in, int all_logits, float *logits);
/* The next eval of any kind (loom_context_eval_next too) takes its tokens
 * as the prepared prompt in, as loom_context_eval_input does; in is
 * borrowed until that eval returns. */
void loom_context_prepare(loom_context *c, const loom_fwd_input *in);

#endif
