/* engine: continuous batching. One thread owns the model, the KV pool and
 * every request's engine-side state, and runs one batched forward per step.
 *
 * Design notes
 * - Queues. Submitted requests land in `inbox` (guarded by mu); the engine
 *   thread moves them to the scheduler's `waiting` (FIFO). Admitted
 *   requests live in its `running` set, in admission order.
 * - A step is three parts, none of which knows the others' insides:
 *   loom_sched_plan (engine/sched.c) turns the queues, admission,
 *   preemption and the token budget into a plain step_plan; the executor
 *   (e->exec) runs the plan's rows in one forward; loom_sched_commit
 *   (engine/commit.c) applies the results: sampling, events, KV
 *   bookkeeping, finishing. What admission may reuse (sessions, the prefix
 *   cache, disk restores, snapshots) and what a finished request leaves
 *   behind come in through the scheduler's hooks (engine/reuse.c).
 * Invariants
 *   1. A running request holds KV blocks for every token it has in KV and,
 *      while prefilling, for its whole prefill (reserved at admission).
 *   2. A waiting request holds no blocks; a finished one is not in any queue.
 *   3. When no request is running, every block of the pool is free or
 *      reclaimable (cached or parked).
 * Only the engine thread touches running/waiting and the pool. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/engine_int.h"
#include "engine/kvconfig.h"
#include "model/forward.h"
#include "vision/vision.h"

#define ENGINE_MAX_CTX 32768
/* Bound of the all-positions logits buffer of prompt-logprob rows. */
#define PLP_BYTES ((size_t)64 << 20)

loom_engine_params loom_engine_default_params(void) {
    return (loom_engine_params){.max_batch_tokens = 2048, .max_seqs = 64, .block_size = 16,
                                .prefix_cache = 1};
}

loom_request_params loom_request_default_params(void) {
    return (loom_request_params){.max_tokens = 256, .sampling = loom_sampling_default(),
                                 .logprobs = -1, .prompt_logprobs = -1, .normalize = 1};
}

/* ---- one step ----------------------------------------------------------- */

/* Marks row i (whose logits are wanted when `wants`) for a pick by the
 * forward when its request needs nothing but the token (loom_exec_pick_for;
 * never with log-probabilities). A device forward then returns the token
 * instead of a vocabulary-sized logits row. */
static void mark_pick(loom_engine *e, loom_request *r, int i, int wants) {
    e->picks[i] = -2;
    e->samp[i] = (loom_sample_pick){0};
    if (wants && r->logprobs < 0 && !r->grammar && loom_exec_pick_for(e->exec, &r->sampler, &e->samp[i]))
        e->picks[i] = -1;
}

/* A verification row of a greedy request that needs nothing but its
 * tokens (as mark_pick's rows) takes each position's greedy id from a
 * device forward instead of its logits: no vocabulary-sized copy back per
 * position. The commit verifies by the ids (verify_row). */
static void mark_ids(loom_engine *e, const step_plan *plan) {
    size_t at = 0;
    for (int i = 0; i < plan->n_rows; i++) {
        loom_request *r = plan->rows[i].r;
        const loom_sampling *p = &r->sampler.p;
        loom_sample_pick samp;
        if (plan->rows[i].draft <= 0 || r->logprobs >= 0 || r->grammar ||
            (p->temperature > 0 && p->top_k != 1) || !loom_exec_pick_for(e->exec, &r->sampler, &samp))
            continue;
        e->rows[i].ids = e->vids + at;
        e->vids[at] = -1; /* stays -1 where the forward wrote logits instead */
        at += (size_t)e->rows[i].n;
    }
}

/* Speculation's part of a step before the target's forward: the
 * drafter's proposals, and the recurrent state of each row that carries
 * some, kept so that the commit can rewind it (rewind_state). Traced
 * requests get a decode.draft span. */
static void draft(loom_engine *e, step_plan *plan) {
    int any = 0;
    for (int i = 0; i < plan->n_rows && !any; i++) any = plan->rows[i].draft > 0;
    if (!any) return;
    double t0 = loom_sched_now(&e->s);
    if (loom_spec_draft(e->spec, plan) != LOOM_OK) /* the rows decode plainly */
        loom_log(LOOM_LOG_WARN, "speculative drafting failed: %s", loom_last_error());
    double t1 = loom_sched_now(&e->s);
    size_t bytes = loom_seq_state_bytes(e->m);
    for (int i = 0; i < plan->n_rows; i++) {
        loom_request *r = plan->rows[i].r;
        if (plan->rows[i].draft > 0 && r->trace)
            loom_rq_span(r, "decode.draft", loom_spec_name(e->spec), t0, t1,
                         RQ_ATTRS({"batchSize", plan->n_rows}, {"drafted", plan->rows[i].draft}));
        if (plan->rows[i].draft <= 0 || !r->rstate) continue;
        if (!r->spec_state && !(r->spec_state = malloc(bytes))) {
            plan->tokens -= plan->rows[i].draft; /* no room to rewind it: no proposals */
            plan->rows[i].n -= plan->rows[i].draft;
            plan->rows[i].draft = 0;
            continue;
        }
        loom_seq_state_save(r->rstate, r->spec_state);
    }
}

/* The scheduler's rewind hook: r's recurrent state goes back to before
 * the round and takes tokens [start, start + n) again (a forward of that
 * row alone, each token as it would be decoded), its KV, already cut to
 * start + n, rewritten with the same rows. */
static int rewind_state(void *ctx, loom_request *r, int start, int n) {
    loom_engine *e = ctx;
    loom_seq_state_load(r->rstate, r->spec_state, start);
    r->seq.n_tokens = start; /* its blocks stay reserved for start + n */
    loom_fwd_row row = {.tokens = r->tokens + start, .n = n, .seq = &r->seq,
                        .logits = LOOM_LOGITS_NONE, .state = r->rstate, .decode = 1};
    if (loom_exec_forward(e->exec, e->kv, &row, 1) == LOOM_OK) return 1;
    loom_log(LOOM_LOG_ERROR, "speculative rewind: %s", loom_last_error());
    return 0;
}

static void spec_done(void *ctx, loom_request *r) {
    loom_engine *e = ctx;
    loom_spec_done(e->spec, r);
}

/* A drafter reading the target's hidden states: the forward exported
 * them (traced: prefill.companion, over the forward) and they become
 * context rows (prefill.project), before the commit cuts the KV. */
static void after_forward(loom_engine *e, const step_plan *plan, const step_work *w) {
    double t0 = loom_sched_now(&e->s);
    loom_spec_after_forward(e->spec, plan, e->rows);
    double t1 = loom_sched_now(&e->s);
    for (int i = 0; i < plan->n_rows; i++) {
        loom_request *r = plan->rows[i].r;
        if (!r->trace) continue;
        const char *mech = loom_spec_name(e->spec);
        loom_rq_span(r, "prefill.companion", mech, w->t1, w->t2, RQ_ATTRS({"rows", e->rows[i].n}));
        loom_rq_span(r, "prefill.project", mech, t0, t1, RQ_ATTRS({"rows", e->rows[i].n}));
    }
}

/* The gate's measure of a step (engine/gate.h): whether it is
 * decode-only, and whether it was planned with proposals (the drafter's
 * cost counts even where it then proposed nothing). */
static void gate_kind(const step_plan *plan, int *decode, int *spec) {
    *decode = 1;
    *spec = 0;
    for (int i = 0; i < plan->n_rows; i++) {
        *decode &= plan->rows[i].kind == SCHED_DECODE;
        *spec |= plan->rows[i].draft > 0;
    }
}

/* Plans and runs one step. Returns 0 when there was nothing to do. */
static int step(loom_engine *e) {
    if (e->s.n_restoring) loom_reuse_take_restores(e);
    int n_run = e->s.n_running, decode = 0, spec = 0;
    double t0 = e->spec ? loom_now() : 0;
    uint64_t before = e->s.counters.decode_tokens;
    e->s.spec_pause = e->spec && !loom_gate_choose(&e->gate, n_run);
    const step_plan *plan = loom_sched_plan(&e->s);
    if (plan->n_rows == 0) return 0;
    gate_kind(plan, &decode, &spec);
    e->s.counters.spec_gated += (uint64_t)e->s.spec_pause;
    double c0 = decode ? loom_thread_cpu() : 0;
    if (e->spec) draft(e, &e->s.plan);
    double c1 = decode ? loom_thread_cpu() : 0;
    loom_sched_fwd_rows(&e->s, plan, e->rows, e->logits, e->plp_logits);
    /* embedding rows want every position's hidden state and no logits,
     * each in its own part of e->hidden (a plan holds max_batch_tokens) */
    size_t at = 0;
    for (int i = 0; i < plan->n_rows; i++) {
        if (!plan->rows[i].r->pooling) continue;
        e->rows[i].logits = LOOM_LOGITS_NONE;
        e->rows[i].out = NULL;
        e->rows[i].hidden = e->hidden + at * (size_t)e->m->cfg.hidden_size;
        at += (size_t)e->rows[i].n;
    }
    if (e->spec) loom_spec_taps(e->spec, e->exec, 1);
    for (int i = 0; i < plan->n_rows; i++)
        mark_pick(e, plan->rows[i].r, i, plan->rows[i].kind != SCHED_DRAIN && !plan->rows[i].all &&
                                              !plan->rows[i].r->pooling &&
                                              plan->rows[i].draft == 0);
    if (e->vids) mark_ids(e, plan);

    step_work w = {.id = ++e->s.next_work, .rows = plan->n_rows, .t0 = plan->t0};
    if (e->s.n_traced) w.tokens = plan->tokens;
    w.t1 = loom_sched_now(&e->s);
    loom_status st = loom_exec_forward_picks(e->exec, e->kv, e->rows, plan->n_rows, e->picks, e->samp);
    w.t2 = loom_sched_now(&e->s);
    double c2 = decode ? loom_thread_cpu() : 0;
    if (e->spec && st == LOOM_OK && loom_spec_reads_target(e->spec)) after_forward(e, plan, &w);
    if (e->spec) loom_spec_taps(e->spec, e->exec, 0);
    e->s.counters.steps++;
    if (st != LOOM_OK) {
        /* A failed forward fails its rows; the engine keeps serving. */
        char msg[256];
        snprintf(msg, sizeof msg, "forward failed: %s", loom_last_error());
        loom_log(LOOM_LOG_ERROR, "%s", msg);
        loom_sched_fail(&e->s, plan, st, msg);
        return 1;
    }
    loom_sched_commit(&e->s, plan, e->rows, e->picks, &w);
    if (decode) {
        double c3 = loom_thread_cpu();
        e->cpu_steps[spec]++;
        if (spec) e->cpu_draft += c1 - c0;
        e->cpu_fwd[spec] += c2 - c1;
        e->cpu_commit[spec] += c3 - c2;
    }
    if (decode && e->spec)
        loom_gate_record(&e->gate, n_run, spec, (int)(e->s.counters.decode_tokens - before), loom_now() - t0);
    return 1;
}

/* Publishes the engine thread's counters (under mu). */
static void publish_stats(loom_engine *e) {
    const loom_sched *s = &e->s;
    e->stats.steps = s->counters.steps;
    e->stats.prefill_tokens = s->counters.prefill_tokens;
    e->stats.decode_tokens = s->counters.decode_tokens;
    e->stats.preemptions = s->counters.preemptions;
    e->stats.waiting = s->wait_len + e->n_inbox;
    e->stats.running = s->n_running;
    e->stats.kv_blocks_free = loom_kv_available(e->kv) + e->kv->n_reclaim;
    e->stats.sessions = e->sessions ? loom_sessions_count(e->sessions) : 0;
    e->stats.session_hits = s->counters.session_hits;
    e->stats.session_misses = s->counters.session_misses;
    e->stats.session_hit_tokens = s->counters.session_hit_tokens;
    /* the store counts its own: it also evicts when full (loom_sessions_put) */
    e->stats.session_evictions = e->sessions ? loom_sessions_evictions(e->sessions) : 0;
    e->stats.vision_encodes = s->counters.vision_encodes;
    e->stats.kv_blocks_cached = e->kv->n_cached;
    e->stats.spec_drafted = s->counters.spec_drafted;
    e->stats.spec_accepted = s->counters.spec_accepted;
    e->stats.spec_rounds = s->counters.spec_rounds;
    e->stats.spec_gated = s->counters.spec_gated;
    e->stats.plain_steps = e->cpu_steps[0];
    e->stats.spec_steps = e->cpu_steps[1];
    e->stats.plain_fwd_cpu_s = e->cpu_fwd[0];
    e->stats.plain_commit_cpu_s = e->cpu_commit[0];
    e->stats.spec_draft_cpu_s = e->cpu_draft;
    e->stats.spec_fwd_cpu_s = e->cpu_fwd[1];
    e->stats.spec_commit_cpu_s = e->cpu_commit[1];
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
}

/* Moves the inbox to the tail of waiting (under mu). Returns 0 when out
 * of memory (the inbox stays for the next try). */
static int take_inbox(loom_engine *e) {
    int i = 0;
    while (i < e->n_inbox && loom_sched_enqueue(&e->s, e->inbox[i]) == LOOM_OK) i++;
    if (i == 0) return e->n_inbox == 0; /* the inbox may be NULL */
    memmove(e->inbox, e->inbox + i, sizeof *e->inbox * (size_t)(e->n_inbox - i));
    e->n_inbox -= i;
    return e->n_inbox == 0;
}

static void *engine_main(void *arg) {
    loom_engine *e = arg;
    loom_sched *s = &e->s;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        /* asleep when there is nothing to do but wait for disk restores */
        while (!e->stop && e->n_inbox == 0 && s->wait_len == 0 &&
               (s->n_running == 0 ||
                (s->n_running == s->n_restoring && atomic_load(&e->restores_ready) == 0)))
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        take_inbox(e);
        pthread_mutex_unlock(&e->mu);

        int did = step(e);

        pthread_mutex_lock(&e->mu);
        publish_stats(e);
        pthread_mutex_unlock(&e->mu);
        if (!did && s->n_running == 0 && s->wait_len > 0) {
            /* The head cannot be admitted into an empty pool: it never will. */
            loom_sched_finish(s, loom_sched_pop(s), LOOM_FINISH_ERROR, LOOM_ERR_NO_KV,
                              "request does not fit the KV pool");
        } else if (!did && s->wait_len > 0) {
            usleep(100); /* wait for running requests to free blocks */
        }
    }
    /* Shutdown: everything still queued or running is cancelled, once no
     * restore writes into a running request's blocks. */
    if (e->restorer) loom_restorer_drain(e->restorer);
    pthread_mutex_lock(&e->mu);
    take_inbox(e);
    pthread_mutex_unlock(&e->mu);
    while (s->n_running > 0) {
        loom_request *r = s->running[--s->n_running];
        loom_sched_finish(s, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "engine stopped");
    }
    while (s->wait_len > 0)
        loom_sched_finish(s, loom_sched_pop(s), LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "engine stopped");
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
    e->s.n_eos = loom_model_eos_ids(m, e->s.eos, LOOM_MAX_EOS);
    if (e->s.n_eos > LOOM_MAX_EOS) e->s.n_eos = LOOM_MAX_EOS;
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
        size_t full = block * (size_t)((e->n_ctx + p.block_size - 1) / p.block_size) * (size_t)e->max_seqs;
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
        s = loom_restorer_create(e->disk, e->kv, loom_reuse_restore_done, e, &e->restorer);
        loom_kv_tier_no_fetch(e->kv); /* restores go through the restore thread */
    }
    if (e->disk && e->snaps) loom_snapshots_set_spill(e->snaps, loom_reuse_spill_state, e);
    e->p.prefix_cache_dir = NULL;
    char layout[64] = "";
    if (e->kv) loom_kv_layout_name(e->kv, layout, sizeof layout);
    snprintf(e->ns_base, sizeof e->ns_base, "loom1|%s|L%d|H%d|V%d|kv=%s|bs=%d|", c->arch, c->n_layers,
             c->hidden_size, c->vocab_size, layout, p.block_size);
    if (!s) s = loom_exec_create(m, e->kv, p.max_batch_tokens, e->n_ctx, &e->exec);
    int spec_k = 0, spec_budget = 0;
    if (!s && p.speculative) {
        /* the drafters run on the CPU, beside a target on either backend;
         * the device verifies a row's tokens as one-token sequences, which
         * a recurrent (linear-attention) layer cannot take */
        if (loom_exec_on_device(e->exec) && m->n_linear > 0)
            s = loom_err(LOOM_ERR_UNSUPPORTED, "speculative decoding with a linear-attention model "
                         "runs on the CPU only; the model is on cuda:%d", m->device);
        if (!s) s = loom_spec_create(&p, m, c->vocab_size, e->max_seqs, e->n_ctx, p.max_batch_tokens, &e->spec);
        e->gate.off = p.spec_always != 0;
        /* a block drafter's default is its whole block */
        int k_dflt = e->spec && loom_spec_block(e->spec) ? loom_spec_block(e->spec) : 8;
        spec_k = LOOM_MIN(p.draft_tokens > 0 ? p.draft_tokens : k_dflt, 64);
        spec_budget = LOOM_MIN(e->max_seqs * spec_k, p.max_batch_tokens);
    }
    if (!s && p.model_dir && (s = loom_vision_load(m, p.model_dir, &e->vision)) == LOOM_ERR_UNSUPPORTED) {
        /* a tower loom does not have yet: the model serves text alone */
        loom_log(LOOM_LOG_WARN, "%s; requests with images are refused", loom_last_error());
        s = LOOM_OK;
    }
    e->p.model_dir = NULL;
    if (!s) {
        e->logits = loom_alloc(sizeof(float) * (size_t)(e->max_seqs + spec_budget) * (size_t)c->vocab_size);
        e->rows = calloc((size_t)e->max_seqs, sizeof *e->rows);
        e->picks = calloc((size_t)e->max_seqs, sizeof *e->picks);
        e->samp = calloc((size_t)e->max_seqs, sizeof *e->samp);
        if (e->spec && loom_exec_on_device(e->exec))
            e->vids = calloc((size_t)(e->max_seqs + spec_budget), sizeof *e->vids);
        if (!e->logits || !e->rows || !e->picks || !e->samp || (e->spec && loom_exec_on_device(e->exec) && !e->vids))
            s = loom_err(LOOM_ERR_NOMEM, "engine: out of memory");
    }
    if (!s) {
        loom_sched *q = &e->s;
        q->kv = e->kv;
        q->max_batch_tokens = p.max_batch_tokens;
        q->max_seqs = e->max_seqs;
        q->chunk = p.prefill_chunk;
        q->chunk_heads = e->has_state ? c->n_heads : 0;
        q->plp_rows = e->plp_rows;
        q->vocab = c->vocab_size;
        q->n_ctx = e->n_ctx;
        q->cache = e->cache;
        q->window = e->window;
        q->hidden = c->hidden_size;
        q->hooks = loom_reuse_hooks(e);
        if (e->spec) {
            q->spec_k = spec_k;
            q->spec_budget = spec_budget;
            q->spec_mechanism = loom_spec_name(e->spec);
            q->hooks.rewind = rewind_state;
            q->hooks.done = spec_done;
        }
        s = loom_sched_init(q);
    }
    if (!s && p.trace_file) {
        e->trace = fopen(p.trace_file, "a");
        if (!e->trace) s = loom_err(LOOM_ERR_IO, "trace file %s: cannot open", p.trace_file);
        e->s.trace = e->trace;
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
    if (e->spec)
        loom_log(LOOM_LOG_INFO, "engine: speculative decoding (%s), up to %d proposals a row, %d a step",
                 loom_spec_name(e->spec), e->s.spec_k, e->s.spec_budget);
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
    loom_spec_free(e->spec);
    loom_vision_free(e->vision);
    loom_free(e->logits);
    loom_free(e->plp_logits);
    loom_free(e->hidden);
    free(e->rows);
    free(e->picks);
    free(e->samp);
    free(e->vids);
    loom_sched_release(&e->s);
    free(e->inbox);
    free(e);
}

/* ---- images ------------------------------------------------------------- */

/* A request's images against its prompt: a vision tower, grids it takes,
 * placeholders matching them (the error names both counts); *delta is
 * the rope delta decode rows carry. */
static loom_status check_images(loom_engine *e, const loom_request_params *p, int *delta) {
    if (!e->vision)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: the model (%s) has no vision tower "
                        "(or the engine has no model_dir to load it from), so it takes no images",
                        e->m->cfg.arch);
    const loom_vision_info *vi = loom_vision_get_info(e->vision);
    int (*grids)[3] = malloc(sizeof *grids * (size_t)LOOM_MAX(p->n_images, 1));
    int32_t *pos3 = p->n_images ? malloc(sizeof *pos3 * 3 * (size_t)p->n_prompt) : NULL;
    loom_status s = grids && (pos3 || !p->n_images) ? LOOM_OK
                                                    : loom_err(LOOM_ERR_NOMEM, "out of memory");
    int have = 0, need = 0;
    for (int k = 0; !s && k < p->n_images; k++) {
        memcpy(grids[k], p->images[k].grid, sizeof grids[k]);
        int cnt = loom_vision_tokens(vi, grids[k]);
        if (!cnt || !p->images[k].pixels)
            s = loom_err(LOOM_ERR_INVALID_ARG, "request: image %d: grid %dx%dx%d is not a grid of "
                         "%dx%d merge blocks (or has no pixels)", k + 1, grids[k][0], grids[k][1],
                         grids[k][2], vi->merge, vi->merge);
        need += cnt;
    }
    for (int i = 0; !s && i < p->n_prompt; i++) have += p->prompt[i] == vi->image_token;
    if (!s && have != need)
        s = loom_err(LOOM_ERR_INVALID_ARG, "the prompt has %d image placeholder tokens (id %d), "
                     "but its %d image(s) need %d", have, vi->image_token, p->n_images, need);
    *delta = 0;
    if (!s && vi->mrope && p->n_images)
        s = loom_vision_positions(vi, p->prompt, p->n_prompt, (const int(*)[3])grids, p->n_images,
                                  pos3, delta);
    free(grids);
    free(pos3);
    return s;
}

/* Copies the images' pixels into r, and makes its keys array. */
static loom_status copy_images(loom_engine *e, const loom_request_params *p, loom_request *r) {
    const loom_vision_info *vi = loom_vision_get_info(e->vision);
    r->images = calloc((size_t)p->n_images, sizeof *r->images);
    r->keys = malloc(sizeof *r->keys * (size_t)r->cap);
    if (!r->images || !r->keys) {
        if (!r->keys) r->keys = r->tokens;
        return loom_err(LOOM_ERR_NOMEM, "out of memory for the request's images");
    }
    r->n_images = p->n_images;
    for (int k = 0; k < p->n_images; k++) {
        const loom_request_image *im = &p->images[k];
        size_t n = (size_t)im->grid[0] * im->grid[1] * im->grid[2] * vi->patch_dim;
        float *px = malloc(sizeof *px * n);
        if (!px) {
            r->n_images = k;
            return loom_err(LOOM_ERR_NOMEM, "out of memory for image %d (%zu values)", k + 1, n);
        }
        memcpy(px, im->pixels, sizeof *px * n);
        r->images[k] = *im;
        r->images[k].pixels = px;
    }
    return LOOM_OK;
}

/* The prompt's keys: its tokens, each image's placeholders holding 31
 * bits of the image's hash and grid (alternating halves), negative so no
 * token id equals one. The prefix cache chains its block hashes over
 * these, so the same image and text hit and another image misses. */
static void image_keys(loom_engine *e, loom_request *r) {
    const loom_vision_info *vi = loom_vision_get_info(e->vision);
    memcpy(r->keys, r->tokens, sizeof *r->keys * (size_t)r->n_prompt);
    int at = 0;
    for (int k = 0; k < r->n_images; k++) {
        const loom_request_image *im = &r->images[k];
        uint64_t h = im->hash;
        for (int d = 0; d < 3; d++) h = (h ^ (uint64_t)im->grid[d]) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        while (at < r->n_prompt && r->tokens[at] != vi->image_token) at++;
        int cnt = loom_vision_tokens(vi, im->grid);
        for (int j = 0; j < cnt && at < r->n_prompt; j++, at++)
            r->keys[at] = -1 - (int32_t)((uint32_t)(j & 1 ? h >> 32 : h) & 0x7fffffffu);
    }
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
    if (p->pooling < LOOM_POOLING_NONE || p->pooling > LOOM_POOLING_CLS)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: pooling must be 0..%d, found %d",
                        LOOM_POOLING_CLS, (int)p->pooling);
    if (p->pooling && p->prompt_logprobs >= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "request: an embedding request has no prompt logprobs");
    int embed = p->pooling != LOOM_POOLING_NONE;
    if (p->grammar && (!loom_grammar_vocab(p->grammar) || loom_gvocab_size(loom_grammar_vocab(p->grammar)) < V))
        return loom_err(LOOM_ERR_INVALID_ARG, "request: the grammar was compiled without this model's vocabulary "
                        "(%d tokens)", V);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V)
            return loom_err(LOOM_ERR_RANGE,
                            "token id %d at index %d is out of range (vocabulary has %d tokens: 0..%d)",
                            p->prompt[i], i, V, V - 1);
    if (p->n_images < 0 || (p->n_images && !p->images))
        return loom_err(LOOM_ERR_INVALID_ARG, "request: bad images (n_images %d)", p->n_images);
    int delta = 0;
    /* with a tower, a text prompt's placeholders are an error too */
    loom_status vs = p->n_images || e->vision ? check_images(e, p, &delta) : LOOM_OK;
    if (vs) return vs;
    if (embed && p->n_prompt > e->n_ctx)
        return loom_err(LOOM_ERR_RANGE, "the input has %d tokens; the context holds %d",
                        p->n_prompt, e->n_ctx);
    if (!embed && p->n_prompt >= e->n_ctx)
        return loom_err(LOOM_ERR_RANGE,
                        "the prompt has %d tokens; the context holds %d (prompt plus at least one "
                        "generated token)", p->n_prompt, e->n_ctx);
    if (loom_sched_blocks(e->kv, p->n_prompt + 1) > e->kv->lay.n_blocks)
        return loom_err(LOOM_ERR_RANGE, "the prompt has %d tokens; the KV pool holds %d",
                        p->n_prompt, e->kv->lay.n_blocks * e->kv->lay.block_size - 1);
    loom_request *r = calloc(1, sizeof *r);
    if (!r) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    int gen = p->max_tokens ? p->max_tokens : e->n_ctx - p->n_prompt;
    gen = embed ? 0 : LOOM_MIN(gen, e->n_ctx - p->n_prompt);
    r->n_prompt = p->n_prompt;
    r->max_tokens = gen;
    r->logprobs = p->logprobs;
    r->prompt_logprobs = p->prompt_logprobs;
    r->plp_next = p->prompt_logprobs >= 0 ? 1 : p->n_prompt; /* the first token has none */
    r->chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 0;
    r->trace = p->trace;
    r->ignore_eos = p->ignore_eos;
    r->pooling = p->pooling;
    r->normalize = p->normalize;
    int H = e->m->cfg.hidden_size;
    if (embed) {
        r->dim = H;
        r->pool_sum = calloc((size_t)H, sizeof *r->pool_sum);
        r->embed = calloc((size_t)H, sizeof *r->embed);
    }
    r->cap = p->n_prompt + gen;
    r->tokens = malloc(sizeof *r->tokens * (size_t)r->cap);
    r->keys = r->tokens;
    r->pos_delta = delta;
    r->n_stop = p->n_stop_ids;
    r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)(p->n_stop_ids + 1));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    atomic_init(&r->abort, 0);
    if (p->grammar) {
        r->grammar = loom_grammar_retain(p->grammar);
        loom_gmatcher_init(&r->gm, r->grammar);
        r->gmask = malloc(sizeof *r->gmask * (size_t)((loom_gvocab_size(loom_grammar_vocab(p->grammar)) + 31) / 32));
    }
    loom_status s = !r->tokens || !r->stop_ids || (embed && (!r->pool_sum || !r->embed)) ||
                            (p->grammar && !r->gmask)
                        ? loom_err(LOOM_ERR_NOMEM, "out of memory")
                        : LOOM_OK;
    if (!s && p->n_images) s = copy_images(e, p, r);
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
    if (r->keys != r->tokens) image_keys(e, r);
    if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, sizeof *r->stop_ids * (size_t)p->n_stop_ids);
    r->n_tokens = p->n_prompt;
    for (int i = 0; i < p->n_prompt; i++) loom_sampler_accept(&r->sampler, p->prompt[i], 0);
    /* XTC's cut is a draw of its own, which verification cannot replay, and
     * verification does not apply a grammar's mask: such rows decode plainly */
    int no_spec = p->sampling.xtc_probability > 0 || p->grammar;
    r->spec_k = no_spec ? 0 : e->s.spec_k;
    if (no_spec) r->spec_idle = INT32_MIN; /* never probes again */
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
    if (embed && !e->hidden &&
        !(e->hidden = loom_alloc(sizeof(float) * (size_t)e->p.max_batch_tokens * (size_t)H))) {
        pthread_mutex_unlock(&e->mu);
        loom_rq_release(r);
        return loom_err(LOOM_ERR_NOMEM, "out of memory for embedding hidden states");
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
