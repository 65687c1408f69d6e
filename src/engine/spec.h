/* spec: the drafters of speculative decoding. Each step the scheduler
 * plans how many proposals a decode row may carry (sched.h: speculation);
 * a drafter fills them in, for all of the step's rows at once, before the
 * target's forward; the commit verifies them (commit.c: verify_row) and
 * cuts what was not kept. A drafter is one small table of functions
 * behind loom_spec, so another (e.g. one reading the target's hidden
 * states) is one more table:
 *   ngram  prompt lookup: what followed the latest earlier occurrence of
 *          the last 3, 2 or 1 tokens of the prompt and output; no model.
 *   model  a draft model's greedy tokens: its own KV pool and forward, one
 *          batched forward per proposal over every drafting row, after a
 *          catch-up of the tokens the draft has not seen yet (the prompt,
 *          and what the target kept last round).
 *   dflash  a projected-context drafter (model/dflash.h): every target
 *          forward exports the hidden states of its tap layers for all
 *          rows (loom_spec_taps), which become the request's context
 *          rows (loom_spec_after_forward); a round drafts the blocks of
 *          all drafting rows (up to 16) in one drafter forward over them,
 *          the head only over the proposals each row may carry. A row's context rows are cut
 *          back to the row's first position before new ones go on, so
 *          rows of rejected proposals never stay; a row whose earlier
 *          positions had no target forward (a prefix-cache hit) starts its
 *          context after them.
 * The draft's KV of a request (r->draft_seq) holds tokens that agree with
 * r->tokens up to min(its length, the target's KV length): a round cuts
 * it back there lazily, at the next draft. A draft with linear-attention
 * layers keeps a snapshot of its state at the end of each catch-up and
 * goes back to it instead (feeding the kept tokens again). Only the
 * engine thread calls these. */
#ifndef LOOM_SPEC_H
#define LOOM_SPEC_H

#include "engine/exec.h"
#include "engine/sched.h"

typedef struct loom_spec loom_spec;

/* The drafter for p->speculative (NGRAM or DRAFT) over a target with
 * vocab ids, for up to max_seqs rows of contexts of n_ctx tokens and
 * step_tokens tokens per draft forward. */
loom_status loom_spec_create(const loom_engine_params *p, loom_model *target, int vocab, int max_seqs,
                             int n_ctx, int step_tokens, loom_spec **out);
void loom_spec_free(loom_spec *sp);
/* Its name, as spans carry it (static). */
const char *loom_spec_name(const loom_spec *sp);
/* Fills the proposals of plan's rows that have draft > 0 into r->tokens
 * [start + 1, start + 1 + draft), lowering draft, n and plan->tokens where
 * fewer come. On an error no row keeps a proposal. */
loom_status loom_spec_draft(loom_spec *sp, step_plan *plan);
/* Around the target's forward of a step (on 1 before it, 0 after it):
 * the forward on x exports the hidden states the drafter reads. A no-op
 * for drafters that read none. */
void loom_spec_taps(loom_spec *sp, loom_exec *x, int on);
/* After that forward succeeded, before taps go off: turns them into
 * context rows of plan's rows (rows as loom_sched_fwd_rows made them). */
void loom_spec_after_forward(loom_spec *sp, const step_plan *plan, const loom_fwd_row *rows);
/* Proposals one block of the drafter gives (dflash: block_size - 1), or
 * 0 for drafters without a block. */
int loom_spec_block(const loom_spec *sp);
/* Whether the drafter has an after-forward part (spans). */
int loom_spec_reads_target(const loom_spec *sp);
/* r leaves the engine: its draft KV goes. */
void loom_spec_done(loom_spec *sp, loom_request *r);

/* Prompt lookup over t[0, len): copies to out up to k tokens that followed
 * the latest earlier occurrence of t's last n tokens, for n = 3, 2, 1 (the
 * first that occurs). Returns how many (0: none occurs). */
int loom_spec_ngram(const int32_t *t, int len, int k, int32_t *out);

#endif
