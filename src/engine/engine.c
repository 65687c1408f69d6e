/* engine: continuous batching. One thread owns the model, the KV pool and
 * every request's engine-side state, and runs one batched forward per step.
 *
 * Design notes
 * - Queues. Submitted requests land in `inbox` (guarded by mu); the engine
 *   thread moves them to `waiting` (FIFO). Admitted requests live in
 *   `running`, in admission order.
 * - A step. (1) Requests whose abort flag is set leave, releasing their
 *   blocks. (2) Every decoding request gets one row of one token; if its
 *   next position needs a block and none is free, the newest running
 *   request is preempted (blocks freed, back to the head of `waiting`, its
 *   tokens so far recomputed later). (3) Prefilling requests, oldest first,
 *   take pieces of their planned chunk from what is left of the token
 *   budget. (4) Waiting requests are admitted, head first, while a row, the
 *   budget and blocks for their whole prefill allow (first come, first
 *   served: the head is never skipped). (5) One forward. (6) Rows with
 *   logits sample, emit a token event and either continue or finish.
 * - Prefill plan. A request plans its next chunk [pos, plan_end) once and
 *   keeps it until reached: the budget may cut it into several pieces, and
 *   other requests joining never move it. Only the piece that reaches the
 *   end of the prefill asks for logits, and only for its last position.
 * - Prompt logprobs. A request that wants them asks for the logits of every
 *   position of each piece, into the one buffer kept for them (one such
 *   row per step, at most plp_rows tokens), and reuses nothing at
 *   admission (prefix cache, sessions), so every position is computed.
 * - Decodes never wait for a prefill: decode rows are placed first, so a
 *   joining prefill can delay a step by at most one budget's worth of work.
 * - Disk restores never hold up a step. At admission the blocks past the
 *   memory hit that the disk tier's index holds are planned (no I/O); the
 *   request takes all its blocks, enters RQ_RESTORING and waits in the
 *   running set without rows while the restore thread reads the files into
 *   its blocks. When the job is done, the step's start puts the blocks in
 *   the cache and the request prefills the rest (cut short at the first
 *   file that failed). A restoring request is never preempted, and a
 *   cancelled one waits for its job before releasing its blocks.
 *   Recurrent-state snapshots on disk (linear-attention models) go the
 *   same way: the job also reads the highest snapshot above the best one
 *   in memory that lies within the blocks it restored.
 * - Sessions. A request with a save id parks its whole sequence (and
 *   recurrent state) in the session store when it finishes; a request
 *   naming it resumes at admission: dense models from the longest common
 *   prefix of the two token lists (short of the prompt's last token),
 *   models with recurrent state only at exactly the session's end (else
 *   the prefix cache and snapshots take over). The blocks are mapped, the
 *   partial last one copied, so only the new tokens are forwarded. Parked
 *   blocks are reclaimable: wherever blocks are needed, sessions are
 *   evicted (least recently used first) before anything is preempted.
 * Invariants
 *   1. A running request holds KV blocks for every token it has in KV and,
 *      while prefilling, for its whole prefill (reserved at admission).
 *   2. A waiting request holds no blocks; a finished one is not in any queue.
 *   3. When no request is running, every block of the pool is free or
 *      reclaimable (cached or parked).
 * Only the engine thread touches running/waiting and the pool. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/exec.h"
#include "engine/kvconfig.h"
#include "engine/kvdisk.h"
#include "engine/request.h"
#include "engine/restore.h"
#include "engine/session.h"
#include "engine/snapshot.h"
#include "model/forward.h"

#define ENGINE_MAX_CTX 32768
#define CHUNK_DEFAULT 2048
/* Attention score workspace bound for the linear-attention chunk policy. */
#define CHUNK_WORKSPACE_BYTES (1ull << 30)
/* Bound of the all-positions logits buffer of prompt-logprob rows. */
#define PLP_BYTES ((size_t)64 << 20)

struct loom_engine {
    loom_model *m;                 /* borrowed */
    loom_engine_params p;
    int n_ctx, max_seqs;
    int32_t eos[LOOM_MAX_EOS];
    int n_eos;
    loom_kv_pool *kv;              /* owned */
    loom_exec *exec;               /* owned: CPU or device forwards */
    float *logits;                 /* owned (max_seqs, vocab) */
    float *plp_logits;             /* owned (plp_rows, vocab): a prompt-logprob row's
                                      logits; made at the first such submit (under mu) */
    int plp_rows;
    loom_fwd_row *rows;            /* owned [max_seqs] */
    int32_t *picks;                /* owned [max_seqs]: -1 asks the forward for the
                                      token (a device forward answers it), -2 =
                                      sample from the logits */
    loom_sample_pick *samp;        /* owned [max_seqs]: how a -1 row is sampled
                                      (temperature 0: greedy) */
    loom_request **row_req;        /* owned [max_seqs] request of each row */
    int *row_kind;                 /* owned [max_seqs] 0 decode, 1 prefill */
    loom_request **running;        /* owned [max_seqs] */
    int n_running;
    loom_request **waiting;        /* owned ring [wait_cap] */
    int wait_head, wait_len, wait_cap;
    FILE *trace;                   /* owned, may be NULL */
    int n_traced;                  /* traced requests waiting or running: the
                                      clock is read for spans only then */
    int cache;                     /* prefix cache in use */
    loom_kvdisk *disk;             /* owned disk tier, or NULL */
    loom_snapshots *snaps;         /* owned saved states (linear-attention models) */
    loom_sessions *sessions;       /* owned parked sequences, or NULL (no prefix cache) */
    loom_restorer *restorer;       /* owned disk reader thread, with disk */
    int n_restoring;               /* running requests in RQ_RESTORING */
    atomic_int restores_ready;     /* finished jobs not yet taken up */
    int has_state;                 /* the model keeps recurrent state per sequence */
    int window;                    /* every layer slides over this many tokens; 0 = no */
    char ns_base[256];             /* namespace text: model and KV layout */
    uint64_t next_order, next_work;

    pthread_t thread;
    pthread_mutex_t mu;            /* guards inbox, stop, stats */
    pthread_cond_t cv;
    loom_request **inbox;          /* owned [inbox_cap] */
    int n_inbox, inbox_cap;
    int stop;
    uint64_t next_id;
    loom_engine_stats stats;       /* guarded by mu: published counters */
    loom_engine_stats counters;    /* engine thread: steps, tokens, preemptions */
};

loom_engine_params loom_engine_default_params(void) {
    return (loom_engine_params){.max_batch_tokens = 2048, .max_seqs = 64, .block_size = 16,
                                .prefix_cache = 1};
}

loom_request_params loom_request_default_params(void) {
    return (loom_request_params){.max_tokens = 256, .sampling = loom_sampling_default(),
                                 .logprobs = -1, .prompt_logprobs = -1};
}

/* ---- chunk policy ------------------------------------------------------ */

static int has_linear_attention(const loom_model *m) { return loom_seq_state_bytes(m) > 0; }

/* An explicit chunk is exact. Otherwise 2048, halved (down to 8) for
 * linear-attention models while the attention score workspace of the prompt
 * would exceed its budget. Changes work size only, never admission. */
static int chunk_for(const loom_engine *e, const loom_request *r) {
    if (r->chunk > 0) return r->chunk;
    if (e->p.prefill_chunk > 0) return e->p.prefill_chunk;
    int chunk = CHUNK_DEFAULT;
    if (!has_linear_attention(e->m)) return chunk;
    while (chunk > 8 && (uint64_t)e->m->cfg.n_heads * (uint64_t)chunk *
                                (uint64_t)r->prefill_len * sizeof(float) >
                            CHUNK_WORKSPACE_BYTES)
        chunk /= 2;
    return chunk;
}

/* ---- request lifecycle (engine thread) --------------------------------- */

/* Evicts parked sessions until need blocks can be handed out (or none is
 * left to evict). */
static void make_room(loom_engine *e, int need) {
    while (e->sessions && loom_kv_available(e->kv) < need)
        if (!loom_sessions_evict_one(e->sessions)) break;
}

static loom_status reserve(loom_engine *e, loom_kv_seq *seq, int n_tokens) {
    make_room(e, (n_tokens + e->kv->lay.block_size - 1) / e->kv->lay.block_size - seq->n_blocks);
    return loom_kv_seq_reserve(e->kv, seq, n_tokens);
}

/* Parks a finished request's sequence under its save keys: the blocks
 * holding its tokens, and its recurrent state. */
static void park(loom_engine *e, loom_request *r) {
    loom_kv_seq *seq = &r->seq;
    int keep = (seq->n_tokens + e->kv->lay.block_size - 1) / e->kv->lay.block_size;
    if (seq->n_blocks > keep) loom_kv_seq_truncate(e->kv, seq, keep * e->kv->lay.block_size);
    loom_session *x = loom_sessions_put(e->sessions, r->save_key, r->save_alias, r->ns, seq, r->tokens);
    if (x && x->state) loom_seq_state_save(r->rstate, x->state);
    /* parked blocks count against the cache's cap like unreferenced cached ones */
    while (e->kv->n_lru + e->kv->n_reclaim > e->kv->cache_cap)
        if (!loom_sessions_evict_one(e->sessions)) break;
}

static void finish(loom_engine *e, loom_request *r, loom_finish why, loom_status st,
                   const char *msg) {
    loom_restore_job_free(r->restore); /* only ever a finished job */
    r->restore = NULL;
    if (e->sessions && r->save_key && r->seq.n_tokens > 0 &&
        (why == LOOM_FINISH_STOP || why == LOOM_FINISH_LENGTH))
        park(e, r);
    else
        loom_kv_seq_release(e->kv, &r->seq);
    r->state = RQ_DONE;
    if (msg) snprintf(r->error, sizeof r->error, "%s", msg);
    loom_event ev = {.finish = why, .status = st, .n_prompt = r->n_prompt,
                     .n_generated = r->n_generated, .n_cached = r->n_cached};
    loom_rq_push(r, &ev);
    e->n_traced -= r->trace;
    if (e->trace && r->trace) {
        loom_rq_write_trace(r, e->trace);
        fflush(e->trace);
    }
    loom_rq_release(r);
}

static void remove_running(loom_engine *e, int i) {
    memmove(&e->running[i], &e->running[i + 1], sizeof *e->running * (size_t)(e->n_running - i - 1));
    e->n_running--;
}

static void waiting_push_front(loom_engine *e, loom_request *r) {
    e->wait_head = (e->wait_head + e->wait_cap - 1) % e->wait_cap;
    e->waiting[e->wait_head] = r;
    e->wait_len++;
}

static loom_status waiting_reserve(loom_engine *e, int extra) {
    if (e->wait_len + extra <= e->wait_cap) return LOOM_OK;
    int cap = LOOM_MAX(e->wait_cap * 2, e->wait_len + extra + 16);
    loom_request **nw = malloc(sizeof *nw * (size_t)cap);
    if (!nw) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < e->wait_len; i++) nw[i] = e->waiting[(e->wait_head + i) % e->wait_cap];
    free(e->waiting);
    e->waiting = nw;
    e->wait_cap = cap;
    e->wait_head = 0;
    return LOOM_OK;
}

/* Frees the request's blocks and queues it to recompute everything it has
 * so far (prompt and generated tokens) when blocks allow. */
static void preempt(loom_engine *e, int i) {
    loom_request *r = e->running[i];
    remove_running(e, i);
    loom_kv_seq_release(e->kv, &r->seq);
    r->state = RQ_WAITING;
    r->plan_end = 0;
    waiting_push_front(e, r); /* capacity: running requests were counted */
    e->counters.preemptions++;
    loom_log(LOOM_LOG_INFO, "request %llu preempted (no free KV blocks)",
             (unsigned long long)r->id);
}

static int newest_running(const loom_engine *e) {
    int best = -1;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->state != RQ_RESTORING && (best < 0 || e->running[i]->order > e->running[best]->order)) best = i;
    return best;
}

/* ---- tracing ----------------------------------------------------------- */

/* The spans of a traced request, with the seed's names, and where each is
 * recorded (step() unless said):
 *   cache.lookup_restore   admission: session resume, prefix-cache lookup,
 *                          disk-restore planning, snapshot resume (cachedTokens)
 *   prefill.batch_setup    admission: reserving the prefill's KV blocks
 *   prefill.total          from the end of the lookup to the first token
 *                          (promptTokens, cachedTokens; complete_row)
 *   prefill.row_sync       assembling the step's rows before the forward
 *                          (trace_step)
 *   prefill.chunk          this step's piece of the prefill, from the forward
 *                          to its completion (startToken; complete_row for the
 *                          final piece)
 *   prefill.forward        the step's batched forward (trace_step)
 *   prefill.kv_maintenance prefix-cache insertion and sliding-window block
 *                          release after the forward (trace_step)
 *   prefill.checkpoint     a recurrent-state snapshot at a boundary (with
 *                          the row's index in the batch)
 *   prefill.evaluate       picking the first token from the final piece's
 *                          logits (complete_row)
 *   prefill.complete       emitting it; the request decodes on or ends
 *                          (complete_row)
 *   prefill.project, prefill.companion: a speculative drafter's projection
 *                          of the target's hidden states and its companion
 *                          prefill. loom has no drafter yet; when it has,
 *                          they are recorded in step() right after the
 *                          forward, as the seed does.
 *   decode.step            a decode row's share of the forward (trace_step)
 *   cache.disk_restore     the restore thread's reads (finish_restores)
 * The four the seed tags (cache.lookup_restore, prefill.batch_setup,
 * prefill.chunk, prefill.total) carry mechanism "continuous", the seed's
 * name for the batched engine, loom's only one. Shared work carries the step's workId, batchSize
 * (rows), batchTokens and the row's tokensPerRow on every traced request
 * that took part; such spans are not additive across requests. */
#define MECHANISM "continuous"
#define WORK_ATTRS(w, n)                                                        \
    {"workId", (int64_t)(w)->id}, {"batchSize", (w)->rows}, {"batchTokens", (w)->tokens}, \
        {"tokensPerRow", (n)}

typedef struct step_work {
    uint64_t id;
    int rows, tokens;
    double t_forward;              /* the forward's start: prefill.chunk's */
} step_work;

static double trace_now(const loom_engine *e) { return e->n_traced ? loom_now() : 0; }

/* The step's shared spans on every traced request in it. */
static void trace_step(loom_engine *e, int n_rows, const step_work *w, double t0, double t1,
                       double t2, double t3) {
    for (int i = 0; i < n_rows; i++) {
        loom_request *r = e->row_req[i];
        if (!r->trace) continue;
        int n = e->rows[i].n, start = r->seq.n_tokens - n;
        if (!e->row_kind[i]) {
            loom_rq_span(r, "decode.step", NULL, t1, t2, RQ_ATTRS(WORK_ATTRS(w, n), {"startToken", start}));
            continue;
        }
        loom_rq_span(r, "prefill.row_sync", NULL, t0, t1,
                     RQ_ATTRS({"workId", (int64_t)w->id}, {"batchSize", w->rows}));
        loom_rq_span(r, "prefill.forward", NULL, t1, t2, RQ_ATTRS(WORK_ATTRS(w, n)));
        loom_rq_span(r, "prefill.kv_maintenance", NULL, t2, t3, RQ_ATTRS(WORK_ATTRS(w, n)));
    }
}

static void trace_chunk(loom_request *r, const step_work *w, int n, double t1) {
    loom_rq_span(r, "prefill.chunk", MECHANISM, w->t_forward, t1,
                 RQ_ATTRS({"startToken", r->seq.n_tokens - n}, WORK_ATTRS(w, n)));
}

/* ---- one step ----------------------------------------------------------- */

static void reap_cancelled(loom_engine *e) {
    for (int i = 0; i < e->n_running;) {
        loom_request *r = e->running[i];
        /* a restoring request's blocks are being written: it waits for its job */
        if (atomic_load(&r->abort) && r->state != RQ_RESTORING) {
            remove_running(e, i);
            finish(e, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        } else {
            i++;
        }
    }
    int n = e->wait_len, k = 0;
    for (int i = 0; i < n; i++) {
        loom_request *r = e->waiting[(e->wait_head + i) % e->wait_cap];
        if (atomic_load(&r->abort)) finish(e, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        else e->waiting[(e->wait_head + k++) % e->wait_cap] = r;
    }
    e->wait_len = k;
}

static int blocks_for(const loom_engine *e, int tokens) {
    return (tokens + e->kv->lay.block_size - 1) / e->kv->lay.block_size;
}

/* Marks row i (whose logits are wanted when `wants`) for a pick by the
 * forward when its request needs nothing but the token (loom_exec_pick_for;
 * never with log-probabilities). A device forward then returns the token
 * instead of a vocabulary-sized logits row. */
static void mark_pick(loom_engine *e, loom_request *r, int i, int wants) {
    e->picks[i] = -2;
    e->samp[i] = (loom_sample_pick){0};
    if (wants && r->logprobs < 0 && loom_exec_pick_for(e->exec, &r->sampler, &e->samp[i]))
        e->picks[i] = -1;
}

static void add_prefill_row(loom_engine *e, loom_request *r, int *n_rows, int *budget) {
    if (r->plan_end == 0) {
        int pos = r->seq.n_tokens, end = LOOM_MIN(pos + chunk_for(e, r), r->prefill_len);
        /* a chunk ends exactly where a state snapshot is due */
        for (int k = 0; k < 2; k++)
            if (r->snap[k] > pos && r->snap[k] < end) end = r->snap[k];
        r->plan_end = end;
    }
    int count = LOOM_MIN(r->plan_end - r->seq.n_tokens, *budget);
    int all = r->plp_next < r->n_prompt; /* prompt logprobs due: every position's logits */
    if (all) {
        for (int k = 0; k < *n_rows; k++)
            if (e->rows[k].out == e->plp_logits) return; /* the buffer is taken this step */
        count = LOOM_MIN(count, e->plp_rows);
    }
    if (count <= 0) return;
    int final = r->seq.n_tokens + count == r->prefill_len;
    int i = (*n_rows)++;
    e->rows[i] = (loom_fwd_row){
        .tokens = r->tokens + r->seq.n_tokens,
        .n = count,
        .seq = &r->seq,
        .logits = all ? LOOM_LOGITS_ALL : final ? LOOM_LOGITS_LAST : LOOM_LOGITS_NONE,
        .out = all ? e->plp_logits : final ? e->logits + (size_t)i * e->m->cfg.vocab_size : NULL,
        .state = r->rstate,
    };
    e->row_req[i] = r;
    e->row_kind[i] = 1;
    mark_pick(e, r, i, final && !all);
    *budget -= count;
}

static void spill_state(void *ctx, uint64_t hash, int n_tokens, const void *state) {
    loom_engine *e = ctx;
    loom_kvdisk_put_state(e->disk, hash, n_tokens, state, loom_seq_state_bytes(e->m));
}

/* Linear-attention models: the KV hit is usable only up to the longest
 * boundary with a saved state. Cuts the sequence back to it and restores
 * the state there (or to nothing). Returns the tokens resumed. */
static int resume_from_snapshot(loom_engine *e, loom_request *r, const loom_restore_job *j) {
    loom_kv_seq *seq = &r->seq;
    int bs = e->kv->lay.block_size;
    for (int i = seq->n_blocks - 1; i >= 0; i--) {
        uint64_t h = seq->blocks[i] >= 0 ? e->kv->hash[seq->blocks[i]] : 0;
        int n = 0;
        const void *st = h ? loom_snapshots_find(e->snaps, h, &n) : NULL;
        if (!st && j && j->state_found >= 0 && j->state_block[j->state_found] == i) {
            /* a snapshot of an earlier run, read by the restore thread */
            h = j->state_hash[j->state_found];
            n = j->state_tokens;
            void *buf = loom_snapshots_put(e->snaps, h, n);
            if (buf) memcpy(buf, j->state, j->state_bytes);
            st = j->state;
        }
        if (!st || n != (i + 1) * bs) continue;
        loom_kv_seq_truncate(e->kv, seq, n);
        seq->n_hashed = i + 1;
        seq->chain = h;
        loom_seq_state_load(r->rstate, st, n);
        return n;
    }
    loom_kv_seq_truncate(e->kv, seq, 0);
    return 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* Continues the session the request names, if its prompt extends the
 * session's tokens. Returns the tokens resumed, or -1 (nothing mapped). */
static int resume_session(loom_engine *e, loom_request *r) {
    loom_session *x = loom_sessions_find(e->sessions, r->resume_key, r->ns);
    int bs = e->kv->lay.block_size, use = 0;
    if (x) {
        int common = common_prefix(x->tokens, x->seq.n_tokens, r->tokens, r->prefill_len);
        if (e->has_state) /* recurrent state exists only at the session's end */
            use = common == x->seq.n_tokens && common < r->prefill_len ? common : 0;
        else /* KV is exact up to any position; one token is left to compute */
            use = LOOM_MIN(common, r->prefill_len - 1);
        /* on a device the partial last block cannot be copied (its rows
         * live in device memory): resume whole blocks only */
        if (loom_exec_on_device(e->exec)) use = use / bs * bs;
        /* sliding windows: the blocks the next positions see must be there */
        for (int i = e->window ? LOOM_MAX(use - e->window + 1, 0) / bs : 0;
             use > 0 && i < (use + bs - 1) / bs; i++)
            if (x->seq.blocks[i] < 0) use = 0;
    }
    if (use > 0) {
        x->pinned = 1;
        make_room(e, 1); /* for the copy of the partial last block */
        x->pinned = 0;
        if (loom_kv_seq_share(e->kv, &r->seq, &x->seq, use) != LOOM_OK) {
            loom_kv_seq_release(e->kv, &r->seq);
            loom_err_clear();
            use = 0;
        }
    }
    if (use <= 0) {
        e->counters.session_misses++;
        return -1;
    }
    if (x->state) loom_seq_state_load(r->rstate, x->state, use);
    e->counters.session_hits++;
    e->counters.session_hit_tokens += (uint64_t)use;
    return use;
}

/* The worker finished a job: wake the engine thread. */
static void restore_done(void *ctx) {
    loom_engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    atomic_fetch_add(&e->restores_ready, 1);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* What the disk tier can add to a memory hit, from its index (no I/O):
 * the blocks after the hit, in chain order, and for models with recurrent
 * state the snapshots at boundaries above the highest one in memory.
 * NULL when there is nothing. */
static loom_restore_job *plan_restore(loom_engine *e, loom_request *r) {
    int bs = e->kv->lay.block_size, first = r->seq.n_blocks, max = (r->prefill_len - 1) / bs, n = 0;
    uint64_t chain = r->seq.chain;
    while (first + n < max) {
        uint64_t h = loom_kv_chain_hash(chain, r->tokens + (size_t)(first + n) * bs, bs);
        if (!loom_kvdisk_has(e->disk, h)) break;
        chain = h;
        n++;
    }
    uint64_t *bh = malloc(sizeof *bh * (size_t)(first + n + 1)); /* each block's chain hash */
    if (!bh) return NULL;
    chain = r->seq.chain;
    for (int i = 0; i < first + n; i++)
        bh[i] = i < first ? e->kv->hash[r->seq.blocks[i]]
                          : (chain = loom_kv_chain_hash(chain, r->tokens + (size_t)i * bs, bs));
    int n_states = 0, *at = NULL;
    if (e->snaps && first + n > 0 && (at = malloc(sizeof *at * (size_t)(first + n)))) {
        for (int i = first + n - 1; i >= 0; i--) {
            int bn = 0;
            if (bh[i] && loom_snapshots_find(e->snaps, bh[i], &bn) && bn == (i + 1) * bs) break;
            if (bh[i] && loom_kvdisk_has_state(e->disk, bh[i])) at[n_states++] = i;
        }
    }
    loom_restore_job *j = n || n_states ? loom_restore_job_new(n, n_states, loom_seq_state_bytes(e->m)) : NULL;
    if (j) {
        j->first = first;
        for (int i = 0; i < n; i++) {
            j->parent[i] = first + i ? bh[first + i - 1] : r->seq.chain;
            j->hash[i] = bh[first + i];
        }
        for (int c = 0; c < n_states; c++) {
            j->state_block[c] = at[c];
            j->state_hash[c] = bh[at[c]];
        }
        j->tokens = r->tokens + (size_t)first * bs;
    }
    free(at);
    free(bh);
    return j;
}

/* Takes up finished restores: accounts the reads, caches the blocks read
 * and moves the requests on to prefill the rest. */
static void finish_restores(loom_engine *e) {
    int bs = e->kv->lay.block_size;
    for (int i = 0; i < e->n_running && atomic_load(&e->restores_ready) > 0; i++) {
        loom_request *r = e->running[i];
        loom_restore_job *j = r->restore;
        if (r->state != RQ_RESTORING || !atomic_load(&j->done)) continue;
        atomic_fetch_sub(&e->restores_ready, 1);
        e->n_restoring--;
        for (int k = 0; k < j->n_ok; k++) loom_kvdisk_account(e->disk, j->hash[k], LOOM_KVDISK_OK, NULL, j->bytes[k]);
        if (j->n_ok < j->n) loom_kvdisk_account(e->disk, j->hash[j->n_ok], j->result, j->why, j->bytes[j->n_ok]);
        for (int c = 0; c < j->n_states; c++)
            if (j->state_result[c] >= 0)
                loom_kvdisk_account_state(e->disk, j->state_hash[c], j->state_result[c], j->state_why[c],
                                          j->state_bytes);
        loom_kv_count_restored(e->kv, j->n_ok);
        int first = j->first;
        r->seq.n_tokens = (first + j->n_ok) * bs;
        loom_kv_cache_commit(e->kv, &r->seq, r->tokens, r->ns);
        int hit = r->seq.n_tokens;
        if (e->snaps) hit = resume_from_snapshot(e, r, j);
        loom_rq_span(r, "cache.disk_restore", NULL, j->t_submit, trace_now(e),
                     RQ_ATTRS({"startToken", first * bs}, {"cachedTokens", j->n_ok * bs}));
        loom_restore_job_free(j);
        r->restore = NULL;
        r->plan_end = 0;
        /* a snapshot resume cut blocks the prefill needs: take them again */
        if (reserve(e, &r->seq, r->prefill_len) != LOOM_OK) {
            remove_running(e, i--);
            loom_kv_seq_release(e->kv, &r->seq);
            r->state = RQ_WAITING;
            waiting_push_front(e, r);
            continue;
        }
        if (r->n_generated == 0) r->n_cached = hit;
        r->state = RQ_PREFILL;
    }
}

/* Saves the state of a stateful request that just reached a boundary.
 * Returns whether it did. */
static int maybe_snapshot(loom_engine *e, loom_request *r) {
    int n = r->seq.n_tokens, bs = e->kv->lay.block_size;
    if (n % bs || (n != r->snap[0] && n != r->snap[1]) || r->seq.n_hashed != n / bs) return 0;
    void *buf = loom_snapshots_put(e->snaps, r->seq.chain, n);
    if (buf) loom_seq_state_save(r->rstate, buf);
    return buf != NULL;
}

/* Prompt logprobs from a row's logits at every position: those at
 * position p give the log-probability of the prompt token at p + 1. Emits
 * the ones due, in order (a recompute after preemption emits none twice). */
static void emit_prompt_logprobs(loom_engine *e, loom_request *r, const loom_fwd_row *row) {
    int V = e->m->cfg.vocab_size, first = (int)(row->tokens - r->tokens);
    for (int k = 0; k < row->n; k++) {
        int p = first + k + 1;
        if (p < r->plp_next || p >= r->n_prompt) continue;
        loom_sample_result res;
        loom_sampler_logprobs(&r->sampler, row->out + (size_t)k * V, r->tokens[p], r->prompt_logprobs, &res);
        loom_event ev = {.finish = LOOM_FINISH_NONE, .token = res.id, .logprob = res.logprob,
                         .n_top = res.n_top, .prompt = 1};
        memcpy(ev.top_ids, res.top_ids, sizeof ev.top_ids);
        memcpy(ev.top_logprobs, res.top_logprobs, sizeof ev.top_logprobs);
        loom_rq_push(r, &ev);
        r->plp_next = p + 1;
    }
}

/* Samples from row `row`'s logits (or takes pick >= 0, the forward's greedy
 * token); emits the token or finishes the request. A traced prefill's last
 * spans are recorded before finish() writes them out. */
static void complete_row(loom_engine *e, loom_request *r, float *logits, int32_t pick,
                         int *still_running, const step_work *w, int row) {
    if (atomic_load(&r->abort)) {
        *still_running = 0;
        finish(e, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        return;
    }
    int traced = r->trace && e->row_kind[row];
    double te = traced ? loom_now() : 0;
    loom_sample_result res;
    if (pick >= 0) res = (loom_sample_result){.id = pick};
    else loom_sampler_pick(&r->sampler, logits, r->logprobs, &res);
    double tc = traced ? loom_now() : 0;
    loom_sampler_accept(&r->sampler, res.id, 1);
    r->tokens[r->n_tokens++] = res.id;
    r->n_generated++;
    e->counters.decode_tokens++;
    loom_event ev = {.finish = LOOM_FINISH_NONE, .token = res.id, .logprob = res.logprob,
                     .n_top = res.n_top};
    memcpy(ev.top_ids, res.top_ids, sizeof ev.top_ids);
    memcpy(ev.top_logprobs, res.top_logprobs, sizeof ev.top_logprobs);
    loom_rq_push(r, &ev);
    int stop = 0;
    for (int i = 0; i < r->n_stop && !stop; i++) stop = r->stop_ids[i] == res.id;
    for (int i = 0; i < e->n_eos && !stop && !r->ignore_eos; i++) stop = e->eos[i] == res.id;
    if (traced) {
        int n = e->rows[row].n;
        double t = loom_now();
        loom_rq_span(r, "prefill.evaluate", NULL, te, tc, RQ_ATTRS(WORK_ATTRS(w, n), {"row", row}));
        loom_rq_span(r, "prefill.complete", NULL, tc, t, RQ_ATTRS(WORK_ATTRS(w, n), {"row", row}));
        trace_chunk(r, w, n, t);
        loom_rq_span(r, "prefill.total", MECHANISM, r->t_admit, t,
                     RQ_ATTRS({"promptTokens", r->n_prompt}, {"cachedTokens", r->n_cached}));
    }
    *still_running = 0;
    if (stop) finish(e, r, LOOM_FINISH_STOP, LOOM_OK, NULL);
    else if (r->n_generated >= r->max_tokens || r->n_tokens >= e->n_ctx)
        finish(e, r, LOOM_FINISH_LENGTH, LOOM_OK, NULL);
    else *still_running = 1;
}

/* Plans and runs one step. Returns 0 when there was nothing to do. */
static int step(loom_engine *e) {
    if (e->n_restoring) finish_restores(e);
    reap_cancelled(e);
    int n_rows = 0, budget = e->p.max_batch_tokens;
    double t0 = trace_now(e);

    /* decode rows first; make room by preempting the newest if needed */
    for (int i = 0; i < e->n_running;) {
        loom_request *r = e->running[i];
        if (r->state != RQ_DECODE) { i++; continue; }
        if (reserve(e, &r->seq, r->seq.n_tokens + 1) != LOOM_OK) {
            int v = newest_running(e);
            preempt(e, v);
            if (v < i) i--;
            continue; /* retry r (or the request now at i) */
        }
        int k = n_rows++;
        e->rows[k] = (loom_fwd_row){.tokens = r->tokens + r->seq.n_tokens, .n = 1, .seq = &r->seq,
                                    .logits = LOOM_LOGITS_LAST,
                                    .out = e->logits + (size_t)k * e->m->cfg.vocab_size,
                                    .state = r->rstate, .decode = 1};
        e->row_req[k] = r;
        e->row_kind[k] = 0;
        mark_pick(e, r, k, 1);
        budget--;
        i++;
    }
    loom_err_clear();
    /* prefills in progress, oldest first */
    for (int i = 0; i < e->n_running && budget > 0; i++)
        if (e->running[i]->state == RQ_PREFILL) add_prefill_row(e, e->running[i], &n_rows, &budget);
    /* admissions */
    while (e->wait_len > 0 && budget > 0 && e->n_running < e->max_seqs) {
        loom_request *r = e->waiting[e->wait_head];
        r->prefill_len = r->n_tokens;
        double tl = trace_now(e);
        /* prompt logprobs need every prompt position computed: no reuse */
        int fresh = r->plp_next < r->n_prompt;
        int hit = fresh ? 0 : e->sessions && r->resume_key ? resume_session(e, r) : -1;
        loom_restore_job *job = NULL;
        if (hit < 0) {
            hit = e->cache ? loom_kv_cache_lookup(e->kv, &r->seq, r->tokens, r->prefill_len, r->ns) : 0;
            if (e->restorer) job = plan_restore(e, r);
            if (e->snaps && !job) hit = resume_from_snapshot(e, r, NULL); /* after a restore, else */
        }
        double ts = trace_now(e);
        make_room(e, blocks_for(e, r->prefill_len + 1) - r->seq.n_blocks);
        if (blocks_for(e, r->prefill_len + 1) - r->seq.n_blocks > loom_kv_available(e->kv) ||
            loom_kv_seq_reserve(e->kv, &r->seq, r->prefill_len) != LOOM_OK) {
            loom_kv_seq_release(e->kv, &r->seq);
            loom_restore_job_free(job);
            break;
        }
        if (r->n_generated == 0) r->n_cached = hit; /* recomputes keep the first figure */
        e->wait_head = (e->wait_head + 1) % e->wait_cap;
        e->wait_len--;
        r->state = RQ_PREFILL;
        r->order = ++e->next_order;
        r->t_admit = ts; /* prefill.total starts after the lookup, as the seed's */
        loom_rq_span(r, "cache.lookup_restore", MECHANISM, tl, ts, RQ_ATTRS({"cachedTokens", hit}));
        loom_rq_span(r, "prefill.batch_setup", MECHANISM, ts, trace_now(e), NULL, 0);
        e->running[e->n_running++] = r;
        if (job) { /* its blocks come from disk first; others go on meanwhile */
            for (int k = 0; k < job->n; k++) job->block[k] = r->seq.blocks[job->first + k];
            job->t_submit = trace_now(e);
            r->restore = job;
            r->state = RQ_RESTORING;
            e->n_restoring++;
            loom_restorer_submit(e->restorer, job);
            continue;
        }
        add_prefill_row(e, r, &n_rows, &budget);
    }
    if (n_rows == 0) return 0;

    step_work w = {.id = ++e->next_work, .rows = n_rows};
    for (int i = 0; i < n_rows && e->n_traced; i++) w.tokens += e->rows[i].n;
    double t1 = w.t_forward = trace_now(e);
    loom_status st = loom_exec_forward_picks(e->exec, e->kv, e->rows, n_rows, e->picks, e->samp);
    double t2 = trace_now(e);
    e->counters.steps++;
    if (st != LOOM_OK) {
        /* A failed forward fails its rows; the engine keeps serving. */
        char msg[256];
        snprintf(msg, sizeof msg, "forward failed: %s", loom_last_error());
        loom_log(LOOM_LOG_ERROR, "%s", msg);
        for (int i = 0; i < n_rows; i++) {
            loom_request *r = e->row_req[i];
            for (int j = 0; j < e->n_running; j++)
                if (e->running[j] == r) { remove_running(e, j); break; }
            finish(e, r, LOOM_FINISH_ERROR, st, msg);
        }
        return 1;
    }
    for (int i = 0; i < n_rows; i++) {
        loom_request *r = e->row_req[i];
        if (e->cache) loom_kv_cache_commit(e->kv, &r->seq, r->tokens, r->ns);
        /* The next position attends to [n - window + 1, n]: older blocks go. */
        if (e->window) loom_kv_seq_drop_before(e->kv, &r->seq, r->seq.n_tokens - e->window + 1);
    }
    if (e->n_traced) trace_step(e, n_rows, &w, t0, t1, t2, trace_now(e));
    /* after the commits: a snapshot is keyed by the chain of the blocks cached */
    for (int i = 0; i < n_rows && e->snaps; i++) {
        loom_request *r = e->row_req[i];
        if (!e->row_kind[i]) continue;
        double tc = r->trace ? loom_now() : 0;
        if (maybe_snapshot(e, r) && r->trace)
            loom_rq_span(r, "prefill.checkpoint", NULL, tc, loom_now(),
                         RQ_ATTRS(WORK_ATTRS(&w, e->rows[i].n), {"row", i}));
    }
    for (int i = 0; i < n_rows; i++) {
        loom_request *r = e->row_req[i];
        if (e->row_kind[i]) {
            e->counters.prefill_tokens += (uint64_t)e->rows[i].n;
            if (r->seq.n_tokens == r->plan_end) r->plan_end = 0;
        }
        if (e->rows[i].logits == LOOM_LOGITS_ALL) {
            emit_prompt_logprobs(e, r, &e->rows[i]);
            if (r->seq.n_tokens < r->prefill_len) {
                if (e->row_kind[i] && r->trace) trace_chunk(r, &w, e->rows[i].n, loom_now());
                continue;
            }
        }
        if (e->rows[i].logits == LOOM_LOGITS_NONE) {
            if (e->row_kind[i] && r->trace) trace_chunk(r, &w, e->rows[i].n, loom_now());
            continue;
        }
        int keep;
        /* the last position's logits pick the next token */
        float *last = e->rows[i].out + (size_t)(loom_fwd_row_logits(&e->rows[i]) - 1) * e->m->cfg.vocab_size;
        complete_row(e, r, last, e->picks[i], &keep, &w, i);
        if (keep) {
            r->state = RQ_DECODE;
        } else {
            for (int j = 0; j < e->n_running; j++)
                if (e->running[j] == r) { remove_running(e, j); break; }
        }
    }
    return 1;
}

static void *engine_main(void *arg) {
    loom_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        /* asleep when there is nothing to do but wait for disk restores */
        while (!e->stop && e->n_inbox == 0 && e->wait_len == 0 &&
               (e->n_running == 0 ||
                (e->n_running == e->n_restoring && atomic_load(&e->restores_ready) == 0)))
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        if (e->n_inbox > 0 && waiting_reserve(e, e->n_inbox) == LOOM_OK) {
            for (int i = 0; i < e->n_inbox; i++) {
                e->waiting[(e->wait_head + e->wait_len) % e->wait_cap] = e->inbox[i];
                e->wait_len++;
                e->n_traced += e->inbox[i]->trace;
            }
            e->n_inbox = 0;
        }
        pthread_mutex_unlock(&e->mu);

        int did = step(e);

        pthread_mutex_lock(&e->mu);
        e->stats.steps = e->counters.steps;
        e->stats.prefill_tokens = e->counters.prefill_tokens;
        e->stats.decode_tokens = e->counters.decode_tokens;
        e->stats.preemptions = e->counters.preemptions;
        e->stats.waiting = e->wait_len + e->n_inbox;
        e->stats.running = e->n_running;
        e->stats.kv_blocks_free = loom_kv_available(e->kv) + e->kv->n_reclaim;
        e->stats.sessions = e->sessions ? loom_sessions_count(e->sessions) : 0;
        e->stats.session_hits = e->counters.session_hits;
        e->stats.session_misses = e->counters.session_misses;
        e->stats.session_hit_tokens = e->counters.session_hit_tokens;
        /* the store counts its own: it also evicts when full (loom_sessions_put) */
        e->stats.session_evictions = e->sessions ? loom_sessions_evictions(e->sessions) : 0;
        e->stats.kv_blocks_cached = e->kv->n_cached;
        loom_kv_counts kc = loom_kv_counters(e->kv);
        e->stats.kv_blocks_lru = kc.blocks_lru;
        e->stats.kv_blocks_parked = kc.blocks_parked;
        e->stats.kv_blocks_unused = kc.blocks_free;
        e->stats.kv_blocks_running = kc.blocks_running;
        e->stats.kv_blocks_touched = kc.blocks_touched;
        e->stats.cache_hit_tokens = kc.hits * (uint64_t)e->kv->lay.block_size;
        e->stats.cache_miss_tokens = kc.misses * (uint64_t)e->kv->lay.block_size;
        e->stats.cache_evicted_blocks = kc.evictions;
        e->stats.disk_hit_tokens = kc.tier_hits * (uint64_t)e->kv->lay.block_size;
        if (e->disk) {
            loom_kvdisk_stats ds;
            loom_kvdisk_get_stats(e->disk, &ds);
            e->stats.disk_reads = ds.reads;
            e->stats.disk_writes = ds.writes;
            e->stats.disk_bad_files = ds.bad_files;
            e->stats.disk_bytes = ds.bytes;
        }
        pthread_mutex_unlock(&e->mu);
        if (!did && e->n_running == 0 && e->wait_len > 0) {
            /* The head cannot be admitted into an empty pool: it never will. */
            loom_request *r = e->waiting[e->wait_head];
            e->wait_head = (e->wait_head + 1) % e->wait_cap;
            e->wait_len--;
            finish(e, r, LOOM_FINISH_ERROR, LOOM_ERR_NO_KV, "request does not fit the KV pool");
        } else if (!did && e->wait_len > 0) {
            usleep(100); /* wait for running requests to free blocks */
        }
    }
    /* Shutdown: everything still queued or running is cancelled, once no
     * restore writes into a running request's blocks. */
    if (e->restorer) loom_restorer_drain(e->restorer);
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_inbox; i++) {
        e->waiting[(e->wait_head + e->wait_len++) % e->wait_cap] = e->inbox[i];
        e->n_traced += e->inbox[i]->trace;
    }
    e->n_inbox = 0;
    pthread_mutex_unlock(&e->mu);
    while (e->n_running > 0) {
        loom_request *r = e->running[--e->n_running];
        finish(e, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "engine stopped");
    }
    while (e->wait_len > 0) {
        loom_request *r = e->waiting[e->wait_head];
        e->wait_head = (e->wait_head + 1) % e->wait_cap;
        e->wait_len--;
        finish(e, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "engine stopped");
    }
    return NULL;
}

/* ---- public API --------------------------------------------------------- */

static size_t ram_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : (size_t)8 << 30;
}

loom_status loom_engine_create(loom_model *m, const loom_engine_params *params,
                               loom_engine **out) {
    *out = NULL;
    loom_engine_params p = params ? *params : loom_engine_default_params();
    if (p.max_batch_tokens <= 0 || p.max_seqs <= 0 || p.block_size <= 0 || p.n_ctx < 0 ||
        p.prefill_chunk < 0 || p.max_queue < 0)
        return loom_err(LOOM_ERR_INVALID_ARG,
                        "engine: max_batch_tokens, max_seqs and block_size must be positive, "
                        "n_ctx, prefill_chunk and max_queue >= 0");
    loom_engine *e = calloc(1, sizeof *e);
    if (!e) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    atomic_init(&e->restores_ready, 0);
    e->m = m;
    e->p = p;
    e->p.trace_file = NULL;
    const loom_config *c = &m->cfg;
    e->n_ctx = p.n_ctx ? p.n_ctx : LOOM_MIN(c->max_positions > 0 ? c->max_positions : ENGINE_MAX_CTX,
                                            ENGINE_MAX_CTX);
    e->max_seqs = LOOM_MIN(p.max_seqs, p.max_batch_tokens);
    e->plp_rows = (int)LOOM_MAX(1, LOOM_MIN(PLP_BYTES / (sizeof(float) * (size_t)c->vocab_size),
                                            (size_t)p.max_batch_tokens));
    e->n_eos = loom_model_eos_ids(m, e->eos, LOOM_MAX_EOS);
    if (e->n_eos > LOOM_MAX_EOS) e->n_eos = LOOM_MAX_EOS;
    loom_kv_spec *spec = calloc((size_t)c->n_layers, sizeof *spec);
    if (!spec) {
        free(e);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    for (int l = 0; l < c->n_layers; l++) spec[l].type = p.kv_type;
    loom_status s = p.kv_config ? loom_kv_config_load(p.kv_config, c->n_layers, loom_model_kv_dim(m),
                                                      p.kv_type, spec)
                                : LOOM_OK;
    size_t block = s ? 0 : loom_kv_spec_block_bytes(spec, c->n_layers, loom_model_kv_dim(m), p.block_size);
    if (!block) {
        free(spec);
        free(e);
        return s ? s : loom_err(LOOM_ERR_INVALID_ARG, "engine: kv_type %d cannot store rows of %d values",
                                (int)p.kv_type, loom_model_kv_dim(m));
    }
    size_t want = p.kv_memory;
    if (!want) {
        size_t full = block * (size_t)blocks_for(&(loom_engine){.kv = &(loom_kv_pool){
                                                     .lay.block_size = p.block_size}},
                                                 e->n_ctx) *
                      (size_t)e->max_seqs;
        want = LOOM_MIN(ram_bytes() / 4, full);
    }
    int n_blocks = (int)LOOM_MIN(want / block, (size_t)1 << 30);
    if (n_blocks < 1)
        s = loom_err(LOOM_ERR_INVALID_ARG, "engine: kv_memory %zu bytes is less than one block (%zu bytes)",
                     want, block);
    if (!s) s = loom_kv_pool_create_spec(c->n_layers, loom_model_kv_dim(m), p.block_size, n_blocks, spec, &e->kv);
    free(spec);
    e->p.kv_config = NULL;
    e->has_state = loom_seq_state_bytes(m) > 0;
    e->window = INT32_MAX;
    for (int l = 0; l < c->n_layers; l++)
        e->window = m->layers[l].attn.window > 0 ? LOOM_MIN(e->window, m->layers[l].attn.window) : 0;
    if (e->window == INT32_MAX || e->has_state) e->window = 0;
    e->cache = p.prefix_cache;
    if (!s && e->cache && e->has_state)
        s = loom_snapshots_create(loom_seq_state_bytes(m), p.snapshot_bytes ? p.snapshot_bytes : (size_t)1 << 30,
                                  &e->snaps);
    if (!s && e->cache)
        s = loom_sessions_create(e->kv, 4096, loom_seq_state_bytes(m),
                                 p.snapshot_bytes ? p.snapshot_bytes : (size_t)1 << 30, &e->sessions);
    if (!s && e->cache)
        /* a cap under one block is one block, not (as 0 would be) the whole pool */
        s = loom_kv_cache_enable(e->kv, p.prefix_cache_bytes ? (int)LOOM_MAX(LOOM_MIN(p.prefix_cache_bytes / block, (size_t)n_blocks), 1) : 0);
    if (p.prefix_cache_dir && m->device >= 0) /* the disk tier copies host KV rows */
        loom_log(LOOM_LOG_WARN, "the prefix cache disk tier is not available on a device yet");
    if (!s && e->cache && p.prefix_cache_dir && m->device < 0 &&
        loom_kvdisk_open(p.prefix_cache_dir, p.prefix_cache_disk_bytes, e->kv, &e->disk) != LOOM_OK) {
        loom_log(LOOM_LOG_WARN, "%s; the prefix cache stays in memory", loom_last_error());
        e->disk = NULL;
    }
    if (!s && e->disk && p.prefix_cache_disk_zstd)
        s = loom_kvdisk_set_zstd(e->disk, p.prefix_cache_disk_zstd);
    if (!s && e->disk) {
        s = loom_restorer_create(e->disk, e->kv, restore_done, e, &e->restorer);
        loom_kv_tier_no_fetch(e->kv); /* restores go through the restore thread */
    }
    if (e->disk && e->snaps) loom_snapshots_set_spill(e->snaps, spill_state, e);
    e->p.prefix_cache_dir = NULL;
    char layout[64] = "";
    if (e->kv) loom_kv_layout_name(e->kv, layout, sizeof layout);
    snprintf(e->ns_base, sizeof e->ns_base, "loom1|%s|L%d|H%d|V%d|kv=%s|bs=%d|", c->arch, c->n_layers,
             c->hidden_size, c->vocab_size, layout, p.block_size);
    if (!s) s = loom_exec_create(m, e->kv, p.max_batch_tokens, e->n_ctx, &e->exec);
    if (!s) {
        e->logits = loom_alloc(sizeof(float) * (size_t)e->max_seqs * (size_t)c->vocab_size);
        e->rows = calloc((size_t)e->max_seqs, sizeof *e->rows);
        e->picks = calloc((size_t)e->max_seqs, sizeof *e->picks);
        e->samp = calloc((size_t)e->max_seqs, sizeof *e->samp);
        e->row_req = calloc((size_t)e->max_seqs, sizeof *e->row_req);
        e->row_kind = calloc((size_t)e->max_seqs, sizeof *e->row_kind);
        e->running = calloc((size_t)e->max_seqs, sizeof *e->running);
        if (!e->logits || !e->rows || !e->picks || !e->samp || !e->row_req || !e->row_kind ||
            !e->running)
            s = loom_err(LOOM_ERR_NOMEM, "engine: out of memory");
    }
    if (!s) s = waiting_reserve(e, 16);
    if (!s && p.trace_file) {
        e->trace = fopen(p.trace_file, "a");
        if (!e->trace) s = loom_err(LOOM_ERR_IO, "trace file %s: cannot open", p.trace_file);
    }
    if (s) {
        loom_engine_free(e);
        return s;
    }
    e->stats.kv_blocks_total = n_blocks;
    e->stats.kv_blocks_free = n_blocks;
    e->stats.kv_blocks_unused = n_blocks;
    e->stats.kv_cache_cap_blocks = e->cache ? e->kv->cache_cap : 0;
    e->stats.kv_block_size = p.block_size;
    e->stats.kv_block_bytes = block;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        e->thread = 0;
        loom_engine_free(e);
        return loom_err(LOOM_ERR_NOMEM, "engine: cannot start the engine thread");
    }
    loom_log(LOOM_LOG_INFO, "engine: %d KV blocks of %d tokens (%.1f MiB), context %d, batch %d tokens / %d seqs",
             n_blocks, p.block_size, (double)block * n_blocks / (1 << 20), e->n_ctx,
             p.max_batch_tokens, e->max_seqs);
    *out = e;
    return LOOM_OK;
}

void loom_engine_free(loom_engine *e) {
    if (!e) return;
    if (e->thread) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
    }
    if (e->trace) fclose(e->trace);
    loom_restorer_free(e->restorer);
    e->restorer = NULL;
    loom_sessions_free(e->sessions); /* parked blocks go back to the pool (and cache) */
    e->sessions = NULL;
    if (e->disk) {
        /* what is still cached in memory goes to disk for the next start */
        loom_kv_cache_spill_all(e->kv);
        if (e->snaps) loom_snapshots_spill_all(e->snaps);
        loom_kvdisk_close(e->disk, e->kv);
    }
    loom_kv_pool_free(e->kv);
    loom_snapshots_free(e->snaps);
    loom_exec_free(e->exec);
    loom_free(e->logits);
    loom_free(e->plp_logits);
    free(e->rows);
    free(e->picks);
    free(e->samp);
    free(e->row_req);
    free(e->row_kind);
    free(e->running);
    free(e->waiting);
    free(e->inbox);
    free(e);
}

loom_status loom_engine_submit(loom_engine *e, const loom_request_params *p, loom_request **out) {
    *out = NULL;
    int V = e->m->cfg.vocab_size;
    if (!p || p->n_prompt <= 0 || !p->prompt)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: the prompt is empty (expected at least one token)");
    if (p->max_tokens < 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: max_tokens must be >= 0, found %d", p->max_tokens);
    if (p->logprobs < -1 || p->logprobs > LOOM_MAX_TOP_LOGPROBS)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: logprobs must be -1..%d, found %d",
                        LOOM_MAX_TOP_LOGPROBS, p->logprobs);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > LOOM_MAX_TOP_LOGPROBS)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: prompt_logprobs must be -1..%d, found %d",
                        LOOM_MAX_TOP_LOGPROBS, p->prompt_logprobs);
    if (p->n_stop_ids < 0 || (p->n_stop_ids && !p->stop_ids))
        return loom_err(LOOM_ERR_INVALID_ARG, "request: bad stop ids");
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V)
            return loom_err(LOOM_ERR_RANGE,
                            "token id %d at index %d is out of range (vocabulary has %d tokens: 0..%d)",
                            p->prompt[i], i, V, V - 1);
    if (p->n_prompt >= e->n_ctx)
        return loom_err(LOOM_ERR_RANGE,
                        "the prompt has %d tokens; the context holds %d (prompt plus at least one "
                        "generated token)", p->n_prompt, e->n_ctx);
    if (blocks_for(e, p->n_prompt + 1) > e->kv->lay.n_blocks)
        return loom_err(LOOM_ERR_RANGE, "the prompt has %d tokens; the KV pool holds %d",
                        p->n_prompt, e->kv->lay.n_blocks * e->kv->lay.block_size - 1);
    loom_request *r = calloc(1, sizeof *r);
    if (!r) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    int gen = p->max_tokens ? p->max_tokens : e->n_ctx - p->n_prompt;
    gen = LOOM_MIN(gen, e->n_ctx - p->n_prompt);
    r->n_prompt = p->n_prompt;
    r->max_tokens = gen;
    r->logprobs = p->logprobs;
    r->prompt_logprobs = p->prompt_logprobs;
    r->plp_next = p->prompt_logprobs >= 0 ? 1 : p->n_prompt; /* the first token has none */
    r->chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 0;
    r->trace = p->trace;
    r->ignore_eos = p->ignore_eos;
    r->cap = p->n_prompt + gen;
    r->tokens = malloc(sizeof *r->tokens * (size_t)r->cap);
    r->n_stop = p->n_stop_ids;
    r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)(p->n_stop_ids + 1));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    atomic_init(&r->abort, 0);
    loom_status s = !r->tokens || !r->stop_ids ? loom_err(LOOM_ERR_NOMEM, "out of memory") : LOOM_OK;
    if (!s) s = loom_sampler_init(&r->sampler, &p->sampling, V);
    if (!s && e->has_state) s = loom_seq_state_create(e->m, &r->rstate);
    if (!s) {
        char ns[512];
        /* "s=" marks a session, so an empty id shares nothing with none */
        const char *sid = p->cache_session_id;
        int w = snprintf(ns, sizeof ns, "%s%s%s", e->ns_base, sid ? "s=" : "", sid ? sid : "");
        r->ns = loom_kv_namespace(ns, (size_t)LOOM_MIN(w, (int)sizeof ns - 1));
        if (p->save_id) r->save_key = loom_sessions_key("response", p->save_id);
        if (p->save_id && sid) r->save_alias = loom_sessions_key("session", sid);
        if (p->resume_id) r->resume_key = loom_sessions_key("response", p->resume_id);
        else if (sid) r->resume_key = loom_sessions_key("session", sid);
    }
    if (s) {
        loom_rq_release(r);
        return s;
    }
    memcpy(r->tokens, p->prompt, sizeof *r->tokens * (size_t)p->n_prompt);
    if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, sizeof *r->stop_ids * (size_t)p->n_stop_ids);
    r->n_tokens = p->n_prompt;
    for (int i = 0; i < p->n_prompt; i++) loom_sampler_accept(&r->sampler, p->prompt[i], 0);
    /* State snapshots (linear-attention models): at the caller's boundary
     * and at the prompt's last full block, both rounded down to blocks,
     * when at least 256 tokens in and short of the prompt's end. */
    int bs = e->kv->lay.block_size;
    int at[2] = {LOOM_MIN(p->snapshot_at, p->n_prompt - 1) / bs * bs, (p->n_prompt - 1) / bs * bs};
    for (int k = 0; k < 2; k++) r->snap[k] = e->snaps && at[k] >= 256 ? at[k] : 0;
    if (r->trace) r->t_submit = loom_now(); /* the origin of its spans */

    pthread_mutex_lock(&e->mu);
    if (e->p.max_queue > 0 && e->stats.waiting >= e->p.max_queue) {
        pthread_mutex_unlock(&e->mu);
        loom_rq_release(r);
        return loom_err(LOOM_ERR_BUSY, "the queue is full (%d waiting requests)", e->p.max_queue);
    }
    if (p->prompt_logprobs >= 0 && !e->plp_logits &&
        !(e->plp_logits = loom_alloc(sizeof(float) * (size_t)e->plp_rows * (size_t)V))) {
        pthread_mutex_unlock(&e->mu);
        loom_rq_release(r);
        return loom_err(LOOM_ERR_NOMEM, "out of memory for prompt logprobs");
    }
    if (e->n_inbox == e->inbox_cap) {
        int cap = e->inbox_cap ? e->inbox_cap * 2 : 16;
        loom_request **ni = realloc(e->inbox, sizeof *ni * (size_t)cap);
        if (!ni) {
            pthread_mutex_unlock(&e->mu);
            loom_rq_release(r);
            return loom_err(LOOM_ERR_NOMEM, "out of memory");
        }
        e->inbox = ni;
        e->inbox_cap = cap;
    }
    r->id = ++e->next_id;
    atomic_store(&r->refs, 2); /* the caller's handle and the engine's */
    e->inbox[e->n_inbox++] = r;
    e->stats.waiting++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return LOOM_OK;
}

void loom_engine_get_stats(loom_engine *e, loom_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    pthread_mutex_unlock(&e->mu);
}
