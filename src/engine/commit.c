/* commit: what a step's forward results do to its requests (the second
 * half of engine/sched.h): KV bookkeeping, prompt logprobs, sampling,
 * token events, finishing, and the step's trace spans.
 *
 * The spans of a traced request, with the seed's names, and where each is
 * recorded:
 *   cache.lookup_restore   admission (sched.c): session resume, prefix-cache
 *                          lookup, disk-restore planning, snapshot resume
 *                          (cachedTokens)
 *   prefill.batch_setup    admission (sched.c): reserving the prefill's KV
 *                          blocks
 *   prefill.total          from the end of the lookup to the first token
 *                          (promptTokens, cachedTokens; complete_row)
 *   prefill.row_sync       planning and assembling the step's rows before
 *                          the forward (trace_step)
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
 *   prefill.project, prefill.companion: the projected-context drafter's
 *                          projection of the target's hidden states and the
 *                          forward that exports them (engine.c), recorded
 *                          right after the forward, as the seed does.
 *   decode.step            a decode row's share of the forward (trace_step)
 *   cache.disk_restore     the restore thread's reads (reuse.c)
 * The four the seed tags (cache.lookup_restore, prefill.batch_setup,
 * prefill.chunk, prefill.total) carry mechanism "continuous", the seed's
 * name for the batched engine, loom's only one. Shared work carries the step's workId, batchSize
 * (rows), batchTokens and the row's tokensPerRow on every traced request
 * that took part; such spans are not additive across requests. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "engine/restore.h"
#include "engine/sched.h"

#define MECHANISM "continuous"
#define WORK_ATTRS(w, n)                                                        \
    {"workId", (int64_t)(w)->id}, {"batchSize", (w)->rows}, {"batchTokens", (w)->tokens}, \
        {"tokensPerRow", (n)}

/* The step's shared spans on every traced request in it. */
static void trace_step(const step_plan *p, const step_work *w, double t3) {
    for (int i = 0; i < p->n_rows; i++) {
        loom_request *r = p->rows[i].r;
        if (!r->trace) continue;
        int n = p->rows[i].n, start = p->rows[i].start;
        if (p->rows[i].kind == SCHED_DECODE) {
            loom_rq_span(r, "decode.step", NULL, w->t1, w->t2, RQ_ATTRS(WORK_ATTRS(w, n), {"startToken", start}));
            continue;
        }
        loom_rq_span(r, "prefill.row_sync", NULL, w->t0, w->t1,
                     RQ_ATTRS({"workId", (int64_t)w->id}, {"batchSize", w->rows}));
        loom_rq_span(r, "prefill.forward", NULL, w->t1, w->t2, RQ_ATTRS(WORK_ATTRS(w, n)));
        loom_rq_span(r, "prefill.kv_maintenance", NULL, w->t2, t3, RQ_ATTRS(WORK_ATTRS(w, n)));
    }
}

static void trace_chunk(loom_request *r, const step_work *w, int n, double t1) {
    loom_rq_span(r, "prefill.chunk", MECHANISM, w->t1, t1,
                 RQ_ATTRS({"startToken", r->seq.n_tokens - n}, WORK_ATTRS(w, n)));
}

void loom_sched_finish(loom_sched *s, loom_request *r, loom_finish why, loom_status st,
                       const char *msg) {
    loom_restore_job_free(r->restore); /* only ever a finished job */
    r->restore = NULL;
    if (s->hooks.done) s->hooks.done(s->hooks.ctx, r);
    int keep = s->hooks.park && r->save_key && r->seq.n_tokens > 0 &&
               (why == LOOM_FINISH_STOP || why == LOOM_FINISH_LENGTH) && s->hooks.park(s->hooks.ctx, r);
    if (!keep) loom_kv_seq_release(s->kv, &r->seq);
    r->state = RQ_DONE;
    if (msg) snprintf(r->error, sizeof r->error, "%s", msg);
    loom_event ev = {.finish = why, .status = st, .n_prompt = r->n_prompt,
                     .n_generated = r->n_generated, .n_cached = r->n_cached};
    loom_rq_push(r, &ev);
    s->n_traced -= r->trace;
    if (s->trace && r->trace) {
        loom_rq_write_trace(r, s->trace);
        fflush(s->trace);
    }
    loom_rq_release(r);
}

void loom_sched_fail(loom_sched *s, const step_plan *plan, loom_status st, const char *msg) {
    for (int i = 0; i < plan->n_rows; i++) {
        loom_request *r = plan->rows[i].r;
        loom_sched_remove(s, r);
        loom_sched_finish(s, r, LOOM_FINISH_ERROR, st, msg);
    }
}

/* Prompt logprobs from a row's logits at every position: those at
 * position p give the log-probability of the prompt token at p + 1. Emits
 * the ones due, in order (a recompute after preemption emits none twice). */
static void emit_prompt_logprobs(const loom_sched *s, loom_request *r, const loom_fwd_row *row) {
    int first = (int)(row->tokens - r->tokens);
    for (int k = 0; k < row->n; k++) {
        int p = first + k + 1;
        if (p < r->plp_next || p >= r->n_prompt) continue;
        loom_sample_result res;
        loom_sampler_logprobs(&r->sampler, row->out + (size_t)k * s->vocab, r->tokens[p], r->prompt_logprobs, &res);
        loom_event ev = {.finish = LOOM_FINISH_NONE, .token = res.id, .logprob = res.logprob,
                         .n_top = res.n_top, .prompt = 1};
        memcpy(ev.top_ids, res.top_ids, sizeof ev.top_ids);
        memcpy(ev.top_logprobs, res.top_logprobs, sizeof ev.top_logprobs);
        loom_rq_push(r, &ev);
        r->plp_next = p + 1;
    }
}

/* An embedding row: pools its hidden states into r's vector, and on the
 * prefill's last piece finishes r with it. Returns whether r finished. A
 * request recomputed after preemption starts again at position 0 (mean
 * and first pooling reuse no cache). */
static int pool_row(loom_sched *s, loom_request *r, const loom_fwd_row *row) {
    int d = r->dim, first = r->seq.n_tokens - row->n;
    if (r->pooling == LOOM_POOLING_MEAN) {
        if (first == 0) memset(r->pool_sum, 0, sizeof *r->pool_sum * (size_t)d);
        for (int k = 0; k < row->n; k++)
            for (int j = 0; j < d; j++) r->pool_sum[j] += row->hidden[(size_t)k * d + j];
    } else if (r->pooling == LOOM_POOLING_CLS && first == 0) {
        memcpy(r->embed, row->hidden, sizeof *r->embed * (size_t)d);
    }
    if (r->seq.n_tokens < r->prefill_len) return 0;
    if (r->pooling == LOOM_POOLING_LAST)
        memcpy(r->embed, row->hidden + (size_t)(row->n - 1) * d, sizeof *r->embed * (size_t)d);
    if (r->pooling == LOOM_POOLING_MEAN)
        for (int j = 0; j < d; j++) r->embed[j] = (float)(r->pool_sum[j] / r->n_prompt);
    double ss = 0;
    for (int j = 0; j < d && r->normalize; j++) ss += (double)r->embed[j] * r->embed[j];
    for (int j = 0; j < d && ss > 0; j++) r->embed[j] = (float)(r->embed[j] / sqrt(ss));
    loom_sched_finish(s, r, LOOM_FINISH_STOP, LOOM_OK, NULL);
    return 1;
}

/* Whether token id ends r (a stop id or, unless ignored, an EOS). */
static int is_stop(const loom_sched *s, const loom_request *r, int32_t id) {
    int stop = 0;
    for (int i = 0; i < r->n_stop && !stop; i++) stop = r->stop_ids[i] == id;
    for (int i = 0; i < s->n_eos && !stop && !r->ignore_eos; i++) stop = s->eos[i] == id;
    return stop;
}

static int emit_token(loom_sched *s, const step_plan *p, int row, const loom_sample_result *res,
                      const step_work *w, double te, double tc);

/* Masks logits [vocab] to the tokens the request's grammar allows next:
 * text tokens that keep the output a prefix of its language, and the end
 * (EOS, stop ids) only when the output is a whole sentence. Returns the
 * number of tokens left. */
static int grammar_mask(const loom_sched *s, loom_request *r, float *logits) {
    int done = loom_gmatcher_done(&r->gm) && !r->ignore_eos;
    float keep_eos[8], keep_stop[16];
    int n_eos = LOOM_MIN(s->n_eos, 8), n_stop = LOOM_MIN(r->n_stop, 16);
    for (int i = 0; i < n_eos; i++) keep_eos[i] = logits[s->eos[i]];
    for (int i = 0; i < n_stop; i++) keep_stop[i] = logits[r->stop_ids[i]];
    int n = loom_gmatcher_mask_logits(&r->gm, r->gmask, logits, s->vocab);
    if (done) {
        for (int i = 0; i < n_eos; i++) logits[s->eos[i]] = keep_eos[i], n++;
        for (int i = 0; i < n_stop; i++) logits[r->stop_ids[i]] = keep_stop[i], n++;
    }
    return n;
}

/* Samples from row `row`'s logits (or takes pick >= 0, the forward's
 * token); emits the token or finishes the request. Returns whether it
 * keeps running. */
static int complete_row(loom_sched *s, const step_plan *p, int row, float *logits,
                        int32_t pick, const step_work *w) {
    loom_request *r = p->rows[row].r;
    if (atomic_load(&r->abort)) {
        loom_sched_finish(s, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        return 0;
    }
    int traced = r->trace && p->rows[row].kind != SCHED_DECODE;
    double te = traced ? loom_now() : 0;
    loom_sample_result res;
    if (r->grammar && !grammar_mask(s, r, logits)) {
        /* nothing can follow (the output ends here or cannot go on) */
        loom_sched_finish(s, r, LOOM_FINISH_STOP, LOOM_OK, NULL);
        return 0;
    }
    if (pick >= 0) res = (loom_sample_result){.id = pick};
    else loom_sampler_pick(&r->sampler, logits, r->logprobs, &res);
    double tc = traced ? loom_now() : 0;
    loom_sampler_accept(&r->sampler, res.id, 1);
    return emit_token(s, p, row, &res, w, te, tc);
}

/* Emits r's next token res (already in its sampler's window) or finishes
 * the request. Returns whether it keeps running. A traced prefill's last
 * spans are recorded before loom_sched_finish writes them out. */
static int emit_token(loom_sched *s, const step_plan *p, int row, const loom_sample_result *res,
                      const step_work *w, double te, double tc) {
    loom_request *r = p->rows[row].r;
    int traced = r->trace && p->rows[row].kind != SCHED_DECODE;
    loom_rq_keys(r)[r->n_tokens] = res->id; /* the same array without images */
    r->tokens[r->n_tokens++] = res->id;
    r->n_generated++;
    s->counters.decode_tokens++;
    loom_event ev = {.finish = LOOM_FINISH_NONE, .token = res->id, .logprob = res->logprob,
                     .n_top = res->n_top};
    memcpy(ev.top_ids, res->top_ids, sizeof ev.top_ids);
    memcpy(ev.top_logprobs, res->top_logprobs, sizeof ev.top_logprobs);
    loom_rq_push(r, &ev);
    int stop = is_stop(s, r, res->id);
    /* the grammar moves on text tokens; once whole with nothing more to
     * come, the output ends here rather than one step later at an EOS */
    if (r->grammar && !stop && !loom_gmatcher_accept_token(&r->gm, res->id) && loom_gmatcher_done(&r->gm) &&
        !loom_gmatcher_can_continue(&r->gm))
        stop = 1;
    if (traced) {
        int n = p->rows[row].n;
        double t = loom_now();
        loom_rq_span(r, "prefill.evaluate", NULL, te, tc, RQ_ATTRS(WORK_ATTRS(w, n), {"row", row}));
        loom_rq_span(r, "prefill.complete", NULL, tc, t, RQ_ATTRS(WORK_ATTRS(w, n), {"row", row}));
        trace_chunk(r, w, n, t);
        loom_rq_span(r, "prefill.total", MECHANISM, r->t_admit, t,
                     RQ_ATTRS({"promptTokens", r->n_prompt}, {"cachedTokens", r->n_cached}));
    }
    if (stop) loom_sched_finish(s, r, LOOM_FINISH_STOP, LOOM_OK, NULL);
    else if (r->n_generated >= r->max_tokens || r->n_tokens >= s->n_ctx)
        loom_sched_finish(s, r, LOOM_FINISH_LENGTH, LOOM_OK, NULL);
    else return 1;
    return 0;
}

/* The next round's proposals at most (r->spec_k) after k of them met
 * `kept` (sched.h: speculation): twice as many as made after a full
 * run, and never fewer than before (a drafter that stopped on its own
 * doubt made fewer than it could); after a partial run, half as many
 * but at least one more than held; after a miss, half as many;
 * SPEC_MISSES misses in a row take the row to plain decoding, which
 * tries one proposal again after SPEC_PROBE plain steps. Halving rather
 * than dropping to what was held keeps one unlucky round from costing a
 * block drafter, whose forward costs the same for one proposal as for
 * its whole block, several rounds of short blocks. r->spec_idle counts
 * the misses while speculating (negative) and the plain steps after. */
#define SPEC_MISSES 3
#define SPEC_PROBE 16
static void spec_adapt(const loom_sched *s, loom_request *r, int k, int kept) {
    if (k == 0) {
        if (r->spec_k == 0 && ++r->spec_idle >= SPEC_PROBE) {
            r->spec_k = 1;
            r->spec_idle = 0;
        }
        return;
    }
    if (kept == 0) {
        r->spec_k = --r->spec_idle <= -SPEC_MISSES ? 0 : LOOM_MAX(1, r->spec_k / 2);
        if (r->spec_k == 0) r->spec_idle = 0;
        return;
    }
    r->spec_idle = 0;
    int next = kept == k ? LOOM_MAX(r->spec_k, 2 * k) : LOOM_MAX(kept + 1, r->spec_k / 2);
    r->spec_k = LOOM_MIN(s->spec_k, next);
}

/* The KV bookkeeping after row i's forward: full blocks to the prefix
 * cache, blocks out of the window released. */
static void kv_commit(loom_sched *s, loom_request *r) {
    if (s->cache) loom_kv_cache_commit(s->kv, &r->seq, loom_rq_keys(r), r->ns);
    /* The next position attends to [n - window + 1, n]: older blocks go. */
    if (s->window) loom_kv_seq_drop_before(s->kv, &r->seq, r->seq.n_tokens - s->window + 1);
}

#define SPEC_MAX 64 /* proposals one row may carry (engine params clamp to it) */

/* Row i carried the last token and k proposals, with the logits of every
 * position: each proposal in turn is verified against the target's own
 * pick there (loom_sampler_verify); the first that fails is replaced by
 * that pick, a full run gets the target's next token too, and a stop id,
 * EOS, max_tokens or the context's end inside the run ends it at that
 * token. The KV of what was not kept is cut (and the recurrent state
 * rewound) before the prefix cache sees the blocks; then the kept tokens
 * are emitted. Returns whether r keeps running. */
static int verify_row(loom_sched *s, const step_plan *p, int i, const loom_fwd_row *row,
                      const step_work *w) {
    loom_request *r = p->rows[i].r;
    int start = p->rows[i].start, k = p->rows[i].draft, m = 0, kept = 0;
    if (atomic_load(&r->abort)) {
        loom_sched_finish(s, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        return 0;
    }
    double tv = loom_sched_now(s);
    loom_sample_result res[SPEC_MAX + 1];
    /* a device forward's greedy ids, where the row asked for them */
    const int32_t *ids = row->ids && row->ids[0] >= 0 ? row->ids : NULL;
    for (int done = 0; !done && m <= k;) {
        int32_t d = m < k ? r->tokens[start + 1 + m] : -1;
        int ok;
        if (ids) {
            res[m] = (loom_sample_result){.id = ids[m]};
            ok = d >= 0 && ids[m] == d;
        } else {
            ok = loom_sampler_verify(&r->sampler, row->out + (size_t)m * s->vocab, d, r->logprobs, &res[m]);
        }
        loom_sampler_accept(&r->sampler, res[m].id, 1);
        kept += ok;
        r->tokens[start + 1 + m] = loom_rq_keys(r)[start + 1 + m] = res[m].id;
        m++;
        done = !ok || is_stop(s, r, res[m - 1].id) || r->n_generated + m >= r->max_tokens ||
               r->n_tokens + m >= s->n_ctx;
    }
    /* KV holds the row's first token and the m - 1 picks before the last */
    loom_kv_seq_truncate(s->kv, &r->seq, start + m);
    s->counters.spec_drafted += (uint64_t)k;
    s->counters.spec_accepted += (uint64_t)kept;
    s->counters.spec_rounds++;
    spec_adapt(s, r, k, kept);
    if (m < k + 1 && r->rstate && (!s->hooks.rewind || !s->hooks.rewind(s->hooks.ctx, r, start, m))) {
        loom_sched_finish(s, r, LOOM_FINISH_ERROR, LOOM_ERR_INTERNAL,
                          "speculative decoding: the recurrent state could not be rewound");
        return 0;
    }
    kv_commit(s, r);
    if (r->trace)
        loom_rq_span(r, "decode.verify", s->spec_mechanism, tv, loom_now(),
                     RQ_ATTRS({"workId", (int64_t)w->id}, {"startToken", start}, {"drafted", k},
                              {"accepted", kept}, {"emitted", m}));
    for (int j = 0; j < m; j++)
        if (!emit_token(s, p, i, &res[j], w, 0, 0)) return 0;
    return 1;
}

void loom_sched_commit(loom_sched *s, const step_plan *p, const loom_fwd_row *rows,
                       const int32_t *picks, const step_work *w) {
    for (int i = 0; i < p->n_rows; i++) {
        loom_request *r = p->rows[i].r;
        if (p->rows[i].draft > 0) continue; /* verify_row cuts the KV first */
        /* blocks reserved for proposals the drafter did not make go back */
        if (p->rows[i].kind == SCHED_DECODE && r->seq.n_blocks > loom_sched_blocks(s->kv, r->seq.n_tokens))
            loom_kv_seq_truncate(s->kv, &r->seq, r->seq.n_tokens);
        kv_commit(s, r);
        if (r->seq.n_tokens >= r->n_prompt) loom_sched_drop_prompt(r);
    }
    if (s->n_traced) trace_step(p, w, loom_sched_now(s));
    /* after the commits: a snapshot is keyed by the chain of the blocks cached */
    for (int i = 0; i < p->n_rows && s->hooks.checkpoint; i++) {
        loom_request *r = p->rows[i].r;
        if (p->rows[i].kind == SCHED_DECODE) continue;
        double tc = r->trace ? loom_now() : 0;
        if (s->hooks.checkpoint(s->hooks.ctx, r) && r->trace)
            loom_rq_span(r, "prefill.checkpoint", NULL, tc, loom_now(),
                         RQ_ATTRS(WORK_ATTRS(w, p->rows[i].n), {"row", i}));
    }
    for (int i = 0; i < p->n_rows; i++) {
        loom_request *r = p->rows[i].r;
        int prefill = p->rows[i].kind != SCHED_DECODE;
        if (prefill) {
            s->counters.prefill_tokens += (uint64_t)rows[i].n;
            if (r->seq.n_tokens == r->plan_end) r->plan_end = 0;
        }
        if (r->pooling) {
            if (prefill && r->trace) trace_chunk(r, w, rows[i].n, loom_now());
            if (pool_row(s, r, &rows[i])) loom_sched_remove(s, r);
            continue;
        }
        if (p->rows[i].draft > 0) {
            if (verify_row(s, p, i, &rows[i], w)) r->state = RQ_DECODE;
            else loom_sched_remove(s, r);
            continue;
        }
        if (rows[i].logits == LOOM_LOGITS_ALL) {
            emit_prompt_logprobs(s, r, &rows[i]);
            if (r->seq.n_tokens < r->prefill_len) {
                if (prefill && r->trace) trace_chunk(r, w, rows[i].n, loom_now());
                continue;
            }
        }
        if (rows[i].logits == LOOM_LOGITS_NONE) {
            if (prefill && r->trace) trace_chunk(r, w, rows[i].n, loom_now());
            continue;
        }
        if (p->rows[i].kind == SCHED_DECODE && s->spec_k > 0 && p->rows[i].draft == 0)
            spec_adapt(s, r, 0, 0);
        /* the last position's logits pick the next token */
        float *last = rows[i].out + (size_t)(loom_fwd_row_logits(&rows[i]) - 1) * s->vocab;
        if (complete_row(s, p, i, last, picks ? picks[i] : -1, w)) r->state = RQ_DECODE;
        else loom_sched_remove(s, r);
    }
}
