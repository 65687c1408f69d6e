/* sched: queues, admission, preemption and the token budget, planned into
 * one step_plan per step (design notes in engine/sched.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/restore.h"
#include "engine/sched.h"
#include "vision/vision.h"

#define CHUNK_DEFAULT 2048
/* Attention score workspace bound for the linear-attention chunk policy. */
#define CHUNK_WORKSPACE_BYTES (1ull << 30)
/* The seed's name for the batched engine, loom's only one (engine/commit.c). */
#define MECHANISM "continuous"

static loom_status waiting_reserve(loom_sched *s, int extra) {
    if (s->wait_len + extra <= s->wait_cap) return LOOM_OK;
    int cap = LOOM_MAX(s->wait_cap * 2, s->wait_len + extra + 16);
    loom_request **nw = malloc(sizeof *nw * (size_t)cap);
    if (!nw) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->wait_len; i++) nw[i] = s->waiting[(s->wait_head + i) % s->wait_cap];
    free(s->waiting);
    s->waiting = nw;
    s->wait_cap = cap;
    s->wait_head = 0;
    return LOOM_OK;
}

loom_status loom_sched_init(loom_sched *s) {
    s->running = calloc((size_t)s->max_seqs, sizeof *s->running);
    s->rows = calloc((size_t)s->max_seqs, sizeof *s->rows);
    if (!s->running || !s->rows) return loom_err(LOOM_ERR_NOMEM, "scheduler: out of memory");
    s->plan.rows = s->rows;
    return waiting_reserve(s, 16);
}

void loom_sched_release(loom_sched *s) {
    free(s->running);
    free(s->waiting);
    free(s->rows);
    s->running = s->waiting = NULL;
    s->rows = NULL;
}

double loom_sched_now(const loom_sched *s) { return s->n_traced ? loom_now() : 0; }

loom_status loom_sched_enqueue(loom_sched *s, loom_request *r) {
    loom_status st = waiting_reserve(s, 1);
    if (st) return st;
    s->waiting[(s->wait_head + s->wait_len++) % s->wait_cap] = r;
    s->n_traced += r->trace;
    return LOOM_OK;
}

loom_request *loom_sched_pop(loom_sched *s) {
    loom_request *r = s->waiting[s->wait_head];
    s->wait_head = (s->wait_head + 1) % s->wait_cap;
    s->wait_len--;
    return r;
}

static void waiting_push_front(loom_sched *s, loom_request *r) {
    s->wait_head = (s->wait_head + s->wait_cap - 1) % s->wait_cap;
    s->waiting[s->wait_head] = r;
    s->wait_len++;
}

static void make_room(loom_sched *s, int blocks) {
    if (s->hooks.make_room) s->hooks.make_room(s->hooks.ctx, blocks);
}

loom_status loom_sched_reserve(loom_sched *s, loom_kv_seq *seq, int n_tokens) {
    make_room(s, loom_sched_blocks(s->kv, n_tokens) - seq->n_blocks);
    return loom_kv_seq_reserve(s->kv, seq, n_tokens);
}

static void remove_running(loom_sched *s, int i) {
    memmove(&s->running[i], &s->running[i + 1], sizeof *s->running * (size_t)(s->n_running - i - 1));
    s->n_running--;
}

void loom_sched_remove(loom_sched *s, loom_request *r) {
    for (int j = 0; j < s->n_running; j++)
        if (s->running[j] == r) {
            remove_running(s, j);
            return;
        }
}

void loom_sched_requeue(loom_sched *s, int i) {
    loom_request *r = s->running[i];
    remove_running(s, i);
    loom_kv_seq_release(s->kv, &r->seq); /* a prepared prompt stays: the tower ran once */
    r->state = RQ_WAITING;
    r->plan_end = 0;
    waiting_push_front(s, r); /* capacity: running requests were counted */
}

void loom_sched_restored(loom_sched *s, int i, int hit) {
    loom_request *r = s->running[i];
    s->n_restoring--;
    r->plan_end = 0;
    /* a snapshot resume cut blocks the prefill needs: take them again */
    if (loom_sched_reserve(s, &r->seq, r->prefill_len) != LOOM_OK) {
        loom_sched_requeue(s, i);
        return;
    }
    if (r->n_generated == 0) r->n_cached = hit;
    r->state = RQ_PREFILL;
}

/* Frees the request's blocks and queues it to recompute everything it has
 * so far (prompt and generated tokens) when blocks allow. */
static void preempt(loom_sched *s, int i) {
    loom_request *r = s->running[i];
    loom_sched_requeue(s, i);
    s->counters.preemptions++;
    loom_log(LOOM_LOG_INFO, "request %llu preempted (no free KV blocks)", (unsigned long long)r->id);
}

static int newest_running(const loom_sched *s) {
    int best = -1;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->state != RQ_RESTORING &&
            (best < 0 || s->running[i]->order > s->running[best]->order))
            best = i;
    return best;
}

static void reap_cancelled(loom_sched *s) {
    for (int i = 0; i < s->n_running;) {
        loom_request *r = s->running[i];
        /* a restoring request's blocks are being written: it waits for its job */
        if (atomic_load(&r->abort) && r->state != RQ_RESTORING) {
            remove_running(s, i);
            loom_sched_finish(s, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        } else if (r->prep_status) { /* its prompt could not be prepared */
            remove_running(s, i);
            loom_sched_finish(s, r, LOOM_FINISH_ERROR, r->prep_status, r->prep_msg);
        } else {
            i++;
        }
    }
    int n = s->wait_len, k = 0;
    for (int i = 0; i < n; i++) {
        loom_request *r = s->waiting[(s->wait_head + i) % s->wait_cap];
        if (atomic_load(&r->abort)) loom_sched_finish(s, r, LOOM_FINISH_CANCELLED, LOOM_ERR_ABORTED, "cancelled");
        else s->waiting[(s->wait_head + k++) % s->wait_cap] = r;
    }
    s->wait_len = k;
}

/* ---- chunk policy ------------------------------------------------------ */

/* An explicit chunk is exact. Otherwise 2048, halved (down to 8) for
 * linear-attention models while the attention score workspace of the prompt
 * would exceed its budget. Changes work size only, never admission. */
static int chunk_for(const loom_sched *s, const loom_request *r) {
    if (r->chunk > 0) return r->chunk;
    if (s->chunk > 0) return s->chunk;
    int chunk = CHUNK_DEFAULT;
    while (s->chunk_heads > 0 && chunk > 8 &&
           (uint64_t)s->chunk_heads * (uint64_t)chunk * (uint64_t)r->prefill_len * sizeof(float) >
               CHUNK_WORKSPACE_BYTES)
        chunk /= 2;
    return chunk;
}

/* ---- planning ---------------------------------------------------------- */

static void add_row(step_plan *p, loom_request *r, int n, sched_kind kind, int all) {
    p->rows[p->n_rows++] = (sched_row){.r = r, .start = r->seq.n_tokens, .n = n, .kind = kind,
                                       .all = all, .plan_end = kind == SCHED_DECODE ? 0 : r->plan_end};
    p->tokens += n;
}

/* Bidirectional spans (a run of equal groups >= 0, as Gemma 3's images):
 * a row never starts or ends inside one. The start of the span holding
 * position pos, or pos when no span holds pos with a token before it. */
static int span_start(const int32_t *g, int n, int pos) {
    if (!g || pos <= 0 || pos >= n || g[pos] < 0 || g[pos - 1] != g[pos]) return pos;
    while (pos > 0 && g[pos - 1] == g[pos]) pos--;
    return pos;
}

static int span_end(const int32_t *g, int n, int pos) {
    while (g && pos < n && pos > 0 && g[pos] >= 0 && g[pos - 1] == g[pos]) pos++;
    return pos;
}

/* A prefix hit that ends inside a span goes back to the span's start
 * (the blocks the truncation released are taken again: the prefill holds
 * blocks for all of its tokens). */
static loom_status hit_span_start(loom_sched *s, loom_request *r) {
    int from = span_start(r->prompt->in.groups, r->n_prompt, r->seq.n_tokens);
    if (from == r->seq.n_tokens) return LOOM_OK;
    loom_kv_seq_truncate(s->kv, &r->seq, from);
    if (r->n_generated == 0) r->n_cached = from;
    r->plan_end = 0;
    return loom_sched_reserve(s, &r->seq, r->prefill_len);
}

/* A prepared prompt's spans: each must fit one step's budget, and a
 * prefix hit that ends inside one goes back to its start (its KV before
 * the span is kept, the span computed whole). */
static loom_status check_spans(loom_sched *s, loom_request *r) {
    const int32_t *g = r->prompt->in.groups;
    int n = r->n_prompt;
    for (int i = 0, st = 0; g && i <= n; i++) {
        if (i < n && i > 0 && g[i] >= 0 && g[i] == g[i - 1]) continue;
        if (i - st > s->max_batch_tokens)
            return loom_err(LOOM_ERR_RANGE, "the prompt's image span of %d tokens (from %d) does "
                            "not fit one step of %d tokens (max_batch_tokens)", i - st, st,
                            s->max_batch_tokens);
        st = i;
    }
    return hit_span_start(s, r);
}

/* A request with images: its prompt rows carry prepared input, built
 * (the vision tower run) when the first of them is due, here, on the
 * engine thread: only then is it known what the prefix cache holds, and
 * the tower shares the model's thread pool with the forward. A failure
 * finishes the request at the next step. Returns 0 when r gets no row. */
static int prepare_prompt(loom_sched *s, loom_request *r) {
    if (!r->n_images || r->prep_status || r->seq.n_tokens >= r->n_prompt) return 1;
    loom_status st;
    if (r->prompt) { /* a recompute after preemption may have hit inside a span */
        st = hit_span_start(s, r);
    } else {
        st = s->hooks.prepare ? s->hooks.prepare(s->hooks.ctx, r)
                              : loom_err(LOOM_ERR_UNSUPPORTED, "no vision tower");
        if (st == LOOM_OK) st = check_spans(s, r);
    }
    if (st == LOOM_OK) return 1;
    r->prep_status = st;
    snprintf(r->prep_msg, sizeof r->prep_msg, "%s", loom_last_error());
    return 0;
}

void loom_sched_drop_prompt(loom_request *r) {
    if (!r->prompt) return;
    loom_vision_prompt_free(r->prompt);
    free(r->prompt);
    r->prompt = NULL;
}

static void add_prefill_row(loom_sched *s, step_plan *p, loom_request *r, int *budget) {
    if (!prepare_prompt(s, r)) return;
    if (r->plan_end == 0) {
        int pos = r->seq.n_tokens, end = LOOM_MIN(pos + chunk_for(s, r), r->prefill_len);
        /* a chunk ends exactly where a state snapshot is due */
        for (int k = 0; k < 2; k++)
            if (r->snap[k] > pos && r->snap[k] < end) end = r->snap[k];
        /* prompt rows carry prepared input, rows past it (a recompute's
         * generated tokens) the rope delta alone: no row holds both */
        if (r->n_images && pos < r->n_prompt) end = LOOM_MIN(end, r->n_prompt);
        if (r->prompt && pos < r->n_prompt) { /* nor cuts a bidirectional span */
            const int32_t *g = r->prompt->in.groups;
            int st = span_start(g, r->n_prompt, end);
            end = st > pos ? st : span_end(g, r->n_prompt, end);
        }
        r->plan_end = end;
    }
    int count = LOOM_MIN(r->plan_end - r->seq.n_tokens, *budget);
    if (r->prompt && r->seq.n_tokens < r->n_prompt) /* a span waits for a budget it fits */
        count = span_start(r->prompt->in.groups, r->n_prompt, r->seq.n_tokens + count) -
                r->seq.n_tokens;
    int all = r->plp_next < r->n_prompt; /* prompt logprobs due: every position's logits */
    if (all) {
        for (int k = 0; k < p->n_rows; k++)
            if (p->rows[k].all) return; /* the buffer is taken this step */
        count = LOOM_MIN(count, s->plp_rows);
    }
    if (count <= 0) return;
    int final = r->seq.n_tokens + count == r->prefill_len;
    add_row(p, r, count, final ? SCHED_FINAL : SCHED_DRAIN, all);
    *budget -= count;
}

/* Proposals for the decode rows (sched.h: speculation), from what the
 * decode rows left of the budget, on blocks that are free now. */
static void add_proposals(loom_sched *s, step_plan *p, int *budget) {
    int left = s->spec_budget, bs = s->kv->lay.block_size;
    for (int i = 0; i < p->n_rows && *budget > 0 && left > 0; i++) {
        sched_row *w = &p->rows[i];
        loom_request *r = w->r;
        int k = LOOM_MIN(LOOM_MIN(r->spec_k, *budget), left);
        /* the row's picks stop at max_tokens and at the context's end */
        k = LOOM_MIN(k, LOOM_MIN(r->max_tokens - r->n_generated, s->n_ctx - r->n_tokens) - 1);
        k = LOOM_MIN(k, (r->seq.n_blocks + loom_kv_available(s->kv)) * bs - w->start - 1);
        if (k <= 0 || loom_kv_seq_reserve(s->kv, &r->seq, w->start + 1 + k) != LOOM_OK) continue;
        w->draft = k;
        w->n += k;
        p->tokens += k;
        *budget -= k;
        left -= k;
    }
}

/* Admits the head of waiting if a row, the budget and blocks for its whole
 * prefill allow. Returns 0 when it stays queued. */
static int admit_head(loom_sched *s, step_plan *p, int *budget) {
    loom_request *r = s->waiting[s->wait_head];
    r->prefill_len = r->n_tokens;
    double tl = loom_sched_now(s);
    int hit = s->hooks.admit ? s->hooks.admit(s->hooks.ctx, r) : 0;
    double ts = loom_sched_now(s);
    int need = loom_sched_blocks(s->kv, r->prefill_len + 1) - r->seq.n_blocks;
    make_room(s, need);
    if (need > loom_kv_available(s->kv) || loom_kv_seq_reserve(s->kv, &r->seq, r->prefill_len) != LOOM_OK) {
        loom_kv_seq_release(s->kv, &r->seq);
        loom_restore_job_free(r->restore);
        r->restore = NULL;
        return 0;
    }
    if (r->n_generated == 0) r->n_cached = hit; /* recomputes keep the first figure */
    loom_sched_pop(s);
    r->state = RQ_PREFILL;
    r->order = ++s->next_order;
    r->t_admit = ts; /* prefill.total starts after the lookup, as the seed's */
    loom_rq_span(r, "cache.lookup_restore", MECHANISM, tl, ts, RQ_ATTRS({"cachedTokens", hit}));
    loom_rq_span(r, "prefill.batch_setup", MECHANISM, ts, loom_sched_now(s), NULL, 0);
    s->running[s->n_running++] = r;
    if (r->restore) { /* its blocks come from disk first; others go on meanwhile */
        r->state = RQ_RESTORING;
        s->n_restoring++;
        if (s->hooks.restore_start) s->hooks.restore_start(s->hooks.ctx, r);
        return 1;
    }
    add_prefill_row(s, p, r, budget);
    return 1;
}

const step_plan *loom_sched_plan(loom_sched *s) {
    step_plan *p = &s->plan;
    reap_cancelled(s);
    p->n_rows = p->tokens = 0;
    p->t0 = loom_sched_now(s);
    int budget = s->max_batch_tokens;
    /* decode rows first; make room by preempting the newest if needed */
    for (int i = 0; i < s->n_running;) {
        loom_request *r = s->running[i];
        if (r->state != RQ_DECODE) {
            i++;
            continue;
        }
        if (loom_sched_reserve(s, &r->seq, r->seq.n_tokens + 1) != LOOM_OK) {
            int v = newest_running(s);
            preempt(s, v);
            if (v < i) i--;
            continue; /* retry r (or the request now at i) */
        }
        add_row(p, r, 1, SCHED_DECODE, 0);
        budget--;
        i++;
    }
    if (s->spec_k > 0 && !s->spec_pause) add_proposals(s, p, &budget);
    loom_err_clear();
    /* prefills in progress, oldest first */
    for (int i = 0; i < s->n_running && budget > 0; i++)
        if (s->running[i]->state == RQ_PREFILL) add_prefill_row(s, p, s->running[i], &budget);
    /* admissions */
    while (s->wait_len > 0 && budget > 0 && s->n_running < s->max_seqs)
        if (!admit_head(s, p, &budget)) break;
    return p;
}

void loom_sched_fwd_rows(const loom_sched *s, const step_plan *plan, loom_fwd_row *rows,
                         float *logits, float *plp) {
    size_t off = 0; /* logits rows handed out */
    for (int i = 0; i < plan->n_rows; i++) {
        const sched_row *w = &plan->rows[i];
        int last = w->kind != SCHED_DRAIN, all = w->all || w->draft > 0;
        rows[i] = (loom_fwd_row){
            .tokens = w->r->tokens + w->start,
            .n = w->n,
            .seq = &w->r->seq,
            .logits = all ? LOOM_LOGITS_ALL : last ? LOOM_LOGITS_LAST : LOOM_LOGITS_NONE,
            .out = w->all ? plp : last ? logits + off * (size_t)s->vocab : NULL,
            .state = w->r->rstate,
            .decode = w->kind == SCHED_DECODE,
        };
        if (last && !w->all) off += w->kind == SCHED_DECODE ? (size_t)w->n : 1;
        /* images: prompt rows from the prepared prompt, later ones turn
         * their rope by its delta */
        if (w->r->prompt && w->start < w->r->n_prompt)
            loom_fwd_row_input(&rows[i], &w->r->prompt->in, s->hidden, w->start, w->r->n_prompt);
        else rows[i].pos_delta = w->r->pos_delta;
    }
}
