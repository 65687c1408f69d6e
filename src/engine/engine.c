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

#define ENGINE_MAX_CTX 32768
/* Bound of the all-positions logits buffer of prompt-logprob rows. */
#define PLP_BYTES ((size_t)64 << 20)

loom_engine_params loom_engine_default_params(void) {
    return (loom_engine_params){.max_batch_tokens = 2048, .max_seqs = 64, .block_size = 16,
                                .prefix_cache = 1};
}

loom_request_params loom_request_default_params(void) {
    return (loom_request_params){.max_tokens = 256, .sampling = loom_sampling_default(),
                                 .logprobs = -1, .prompt_logprobs = -1};
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

/* Plans and runs one step. Returns 0 when there was nothing to do. */
static int step(loom_engine *e) {
    if (e->s.n_restoring) loom_reuse_take_restores(e);
    const step_plan *plan = loom_sched_plan(&e->s);
    if (plan->n_rows == 0) return 0;
    loom_sched_fwd_rows(&e->s, plan, e->rows, e->logits, e->plp_logits);
    for (int i = 0; i < plan->n_rows; i++)
        mark_pick(e, plan->rows[i].r, i, plan->rows[i].kind != SCHED_DRAIN && !plan->rows[i].all);

    step_work w = {.id = ++e->s.next_work, .rows = plan->n_rows, .t0 = plan->t0};
    if (e->s.n_traced) w.tokens = plan->tokens;
    w.t1 = loom_sched_now(&e->s);
    loom_status st = loom_exec_forward_picks(e->exec, e->kv, e->rows, plan->n_rows, e->picks, e->samp);
    w.t2 = loom_sched_now(&e->s);
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
    if (!s) {
        e->logits = loom_alloc(sizeof(float) * (size_t)e->max_seqs * (size_t)c->vocab_size);
        e->rows = calloc((size_t)e->max_seqs, sizeof *e->rows);
        e->picks = calloc((size_t)e->max_seqs, sizeof *e->picks);
        e->samp = calloc((size_t)e->max_seqs, sizeof *e->samp);
        if (!e->logits || !e->rows || !e->picks || !e->samp)
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
        q->hooks = loom_reuse_hooks(e);
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
    loom_sched_release(&e->s);
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
    if (p->grammar && (!loom_grammar_vocab(p->grammar) || loom_gvocab_size(loom_grammar_vocab(p->grammar)) < V))
        return loom_err(LOOM_ERR_INVALID_ARG, "request: the grammar was compiled without this model's vocabulary "
                        "(%d tokens)", V);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V)
            return loom_err(LOOM_ERR_RANGE,
                            "token id %d at index %d is out of range (vocabulary has %d tokens: 0..%d)",
                            p->prompt[i], i, V, V - 1);
    if (p->n_prompt >= e->n_ctx)
        return loom_err(LOOM_ERR_RANGE,
                        "the prompt has %d tokens; the context holds %d (prompt plus at least one "
                        "generated token)", p->n_prompt, e->n_ctx);
    if (loom_sched_blocks(e->kv, p->n_prompt + 1) > e->kv->lay.n_blocks)
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
    if (p->grammar) {
        r->grammar = loom_grammar_retain(p->grammar);
        loom_gmatcher_init(&r->gm, r->grammar);
        r->gmask = malloc(sizeof *r->gmask * (size_t)((loom_gvocab_size(loom_grammar_vocab(p->grammar)) + 31) / 32));
    }
    loom_status s = !r->tokens || !r->stop_ids || (p->grammar && !r->gmask) ? loom_err(LOOM_ERR_NOMEM, "out of memory")
                                                                            : LOOM_OK;
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
