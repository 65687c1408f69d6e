/* sched: the engine's scheduler. It owns the waiting queue and the running
 * set and turns them, once per step, into a plain step_plan: which requests
 * get a row, each row's token range and kind. It never names the model or
 * a forward: the engine hands the plan's rows to its executor, then
 * sched_commit applies what came back (sampling, events, KV bookkeeping,
 * finishing). What a request may reuse at admission (sessions, the prefix
 * cache, disk restores, snapshots) comes in through hooks (engine/reuse.c);
 * with no hooks a request reuses nothing, which is how tests/test_sched.c
 * drives it over a standalone KV pool.
 *
 * Design notes
 * - A step (sched_plan). (1) Requests whose abort flag is set leave,
 *   releasing their blocks (a restoring one once its job is done). (2) Every
 *   decoding request gets one row of one token; if its next position needs
 *   a block and none is free, the newest running request is preempted
 *   (blocks freed, back to the head of `waiting`, its tokens so far
 *   recomputed later). (3) Prefilling requests, oldest first, take pieces
 *   of their planned chunk from what is left of the token budget. (4)
 *   Waiting requests are admitted, head first, while a row, the budget and
 *   blocks for their whole prefill allow (first come, first served: the
 *   head is never skipped).
 * - Prefill plan. A request plans its next chunk [pos, plan_end) once and
 *   keeps it until reached: the budget may cut it into several pieces, and
 *   other requests joining never move it. Only the piece that reaches the
 *   end of the prefill asks for logits, and only for its last position.
 * - Prompt logprobs. A request that wants them asks for the logits of every
 *   position of each piece, into the one buffer kept for them (one such
 *   row per step, at most plp_rows tokens).
 * - Decodes never wait for a prefill: decode rows are placed first, so a
 *   joining prefill can delay a step by at most one budget's worth of work.
 * - Speculation (spec_k > 0). Once every decode row has its token, each
 *   may carry up to r->spec_k proposals from what is left of the budget
 *   (and of spec_budget), never past max_tokens or the context, and only
 *   where blocks for them are free (speculation never preempts). Rejected
 *   proposals' KV is cut at commit, before the prefix cache sees the
 *   blocks. Prefill pieces take what the proposals leave.
 * Invariants (tests/test_sched.c checks them after every step)
 *   1. A running request holds KV blocks for every token it has in KV and,
 *      while prefilling, for its whole prefill (reserved at admission).
 *   2. A waiting request holds no blocks; a finished one is not in any queue.
 *   3. A plan has at most max_seqs rows and max_batch_tokens tokens, decode
 *      rows first, one row per request.
 * Only the engine thread calls these. */
#ifndef LOOM_SCHED_H
#define LOOM_SCHED_H

#include <stdio.h>

#include "engine/request.h"
#include "model/forward.h"

typedef enum sched_kind {
    SCHED_DECODE, /* one generated token; logits of it */
    SCHED_DRAIN,  /* a prefill piece short of the prefill's end: KV only */
    SCHED_FINAL,  /* the piece that ends the prefill: logits of its last position */
} sched_kind;

typedef struct sched_row {
    loom_request *r; /* borrowed */
    int start, n;    /* r->tokens [start, start + n) */
    sched_kind kind;
    int all;         /* logits of every position (prompt logprobs due) */
    int plan_end;    /* a prefill's planned chunk end (0 for a decode) */
    int draft;       /* a decode row's proposals after its first token: n = 1 + draft.
                        Planned as the most it may carry; the drafter fills
                        r->tokens [start + 1, start + n) and may lower both */
} sched_row;

typedef struct step_plan {
    sched_row *rows; /* [n_rows] borrowed from the scheduler until the next plan */
    int n_rows, tokens;
    double t0;       /* when planning began (traced requests only; else 0) */
} step_plan;

/* A step's shared work, as its spans name it. */
typedef struct step_work {
    uint64_t id;
    int rows, tokens;
    double t0, t1, t2; /* planning, forward start, forward end */
} step_work;

/* What the scheduler asks of the reuse layer; any may be NULL. */
typedef struct sched_hooks {
    void *ctx;
    /* Admission: maps what r may reuse into r->seq, and may leave a
     * restore job (not yet submitted) in r->restore. Returns the tokens
     * reused. */
    int (*admit)(void *ctx, loom_request *r);
    /* r holds its blocks; its r->restore job may start. */
    void (*restore_start)(void *ctx, loom_request *r);
    /* Frees reclaimable blocks until `blocks` can be handed out. */
    void (*make_room)(void *ctx, int blocks);
    /* A prefill row of r was committed: saves state at a boundary. Returns
     * whether it did. */
    int (*checkpoint)(void *ctx, loom_request *r);
    /* r finished well: keeps its blocks (parked). Returns 0 when it did
     * not take them (they are then released). */
    int (*park)(void *ctx, loom_request *r);
    /* A verification kept tokens [start, start + n) of r's row, whose KV
     * is cut back there; r's recurrent state, which took the whole row,
     * goes back to consuming exactly them. Returns 0 on failure. */
    int (*rewind)(void *ctx, loom_request *r, int start, int n);
    /* r leaves the engine: what the drafter kept for it goes. */
    void (*done)(void *ctx, loom_request *r);
    /* r has images and prompt rows from r->seq.n_tokens on are due: builds
     * r->prompt (the vision tower over the images not wholly in KV). */
    loom_status (*prepare)(void *ctx, loom_request *r);
} sched_hooks;

typedef struct loom_sched {
    loom_kv_pool *kv;              /* borrowed */
    int max_batch_tokens, max_seqs;
    int chunk;                     /* explicit prefill chunk of every request; 0 = the policy */
    int chunk_heads;               /* > 0: linear attention with this many heads (chunk policy) */
    int plp_rows;                  /* most tokens of one all-positions logits row */
    int vocab, n_ctx;
    int hidden;                    /* the model's hidden size (prepared rows' stride) */
    int32_t eos[LOOM_MAX_EOS];
    int n_eos;
    int cache;                     /* commit full blocks to the prefix cache */
    int window;                    /* every layer slides over this many tokens; 0 = no */
    sched_hooks hooks;
    int spec_k;                    /* > 0: speculative decoding, proposals per row at most */
    int spec_budget;               /* proposals in one step at most (the logits buffer's) */
    int spec_pause;                /* this step carries no proposals (engine/gate.h) */
    const char *spec_mechanism;    /* static: the drafter's name in spans */
    FILE *trace;                   /* borrowed, may be NULL: finished traces go there */

    loom_request **running;        /* owned [max_seqs], in admission order */
    int n_running;
    loom_request **waiting;        /* owned ring [wait_cap] */
    int wait_head, wait_len, wait_cap;
    int n_restoring;               /* running requests in RQ_RESTORING */
    int n_traced;                  /* traced requests waiting or running: the
                                      clock is read for spans only then */
    uint64_t next_order, next_work;
    sched_row *rows;               /* owned [max_seqs]: the plan's rows */
    step_plan plan;
    loom_engine_stats counters;    /* steps, tokens, preemptions, sessions */
} loom_sched;

/* Allocates the queues of s, whose parameters are set. */
loom_status loom_sched_init(loom_sched *s);
void loom_sched_release(loom_sched *s);

static inline int loom_sched_blocks(const loom_kv_pool *kv, int tokens) {
    return (tokens + kv->lay.block_size - 1) / kv->lay.block_size;
}
/* The clock for spans: 0 while nobody is traced. */
double loom_sched_now(const loom_sched *s);

/* Queues r at the tail of waiting (the scheduler takes the engine's
 * reference). */
loom_status loom_sched_enqueue(loom_sched *s, loom_request *r);
/* Takes the head of waiting off the queue (call only if wait_len > 0). */
loom_request *loom_sched_pop(loom_sched *s);
/* Reserves blocks for n_tokens of seq, making room first. */
loom_status loom_sched_reserve(loom_sched *s, loom_kv_seq *seq, int n_tokens);
/* Running request i goes back to the head of waiting, holding no blocks. */
void loom_sched_requeue(loom_sched *s, int i);
/* Running request i, in RQ_RESTORING, has its restored tokens in
 * r->seq (hit of them reused): it prefills the rest, or waits again when
 * its prefill's blocks cannot be had. */
void loom_sched_restored(loom_sched *s, int i, int hit);

/* Plans one step: reaps cancelled requests, places decode rows (preempting
 * the newest when blocks run out), prefill pieces and admissions. */
const step_plan *loom_sched_plan(loom_sched *s);
/* The executor's rows for plan: decode and final rows write their logits
 * to logits, one row after the other (a verification row one per token:
 * [n_rows + spec_budget, vocab] in all), an all-positions row to plp. */
void loom_sched_fwd_rows(const loom_sched *s, const step_plan *plan, loom_fwd_row *rows,
                         float *logits, float *plp);
/* Applies a successful forward of plan's rows (picks[i] >= 0: the token
 * the forward chose for row i; else sampled from its logits). A row with
 * proposals keeps the longest run the target's own picks agree with
 * (loom_sampler_verify) and the target's token after it. */
void loom_sched_commit(loom_sched *s, const step_plan *plan, const loom_fwd_row *rows,
                       const int32_t *picks, const step_work *w);
/* A failed forward: every request in plan finishes with an error. */
void loom_sched_fail(loom_sched *s, const step_plan *plan, loom_status st, const char *msg);
/* Sends r's final event and drops the engine's reference; r is in no queue. */
void loom_sched_finish(loom_sched *s, loom_request *r, loom_finish why, loom_status st,
                       const char *msg);
/* Frees r's prepared prompt (its prompt rows are done, or it was preempted). */
void loom_sched_drop_prompt(loom_request *r);
/* Removes r from the running set (if there). */
void loom_sched_remove(loom_sched *s, loom_request *r);

#endif
