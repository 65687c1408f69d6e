/* test_sched: the scheduler and the commit with no model behind them. A
 * fake executor writes each row's token ids into the KV rows of a
 * standalone pool and derives each next token from what it reads back
 * there, so a request's output is right only when its blocks hold every
 * token it has in KV, in order: whatever the batching, chunking,
 * preemption or restores did. The invariants of engine/sched.h are
 * checked after every step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/restore.h"
#include "engine/sched.h"
#include "vision/vision.h"
#include "model/kv_layout.h"
#include "test.h"

#define V 32     /* vocabulary */
#define BS 4     /* tokens per block */
#define KVD 4    /* KV row width */
#define MAXR 16  /* requests a case tracks */

/* The token after tokens[0, n): a hash of all of them. */
static int32_t next_token(const int32_t *t, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)t[i]) * 1099511628211ull;
    return (int32_t)((h >> 17) % V);
}

static void fake_logits(int32_t want, float *out) {
    for (int v = 0; v < V; v++) out[v] = v == want ? 4.0f : -(float)((v * 7 + want) % 5);
}

/* The fake executor as a device one: a verification row with ids gets
 * next_token there and logits that pick another token. */
static int fake_ids;

/* The fake executor: writes each row's tokens at their positions, then
 * gives logits that pick next_token of the whole sequence as read back
 * from the pool. */
static void fake_forward(loom_kv_pool *kv, const loom_fwd_row *rows, int n_rows) {
    int32_t seen[512];
    float x[KVD] = {0}, tmp[KVD];
    for (int i = 0; i < n_rows; i++) {
        loom_kv_seq *seq = rows[i].seq;
        int start = seq->n_tokens, end = start + rows[i].n;
        CHECKF(end <= seq->n_blocks * BS && end <= 512, "row %d: tokens to %d, blocks for %d", i, end,
               seq->n_blocks * BS);
        if (end > seq->n_blocks * BS || end > 512) continue;
        for (int p = start; p < end; p++) {
            x[0] = (float)rows[i].tokens[p - start];
            loom_kv_layer_store(&kv->lay, 0, loom_kv_k_row(&kv->lay, seq, 0, p), x, KVD);
        }
        seq->n_tokens = end;
        for (int p = 0; p < end; p++)
            seen[p] = (int32_t)loom_kv_layer_load(&kv->lay, 0, loom_kv_k_row(&kv->lay, seq, 0, p), 0, KVD, tmp)[0];
        if (rows[i].logits == LOOM_LOGITS_ALL)
            for (int k = 0; k < rows[i].n; k++) {
                int32_t want = next_token(seen, start + k + 1);
                if (fake_ids && rows[i].ids) rows[i].ids[k] = want;
                fake_logits(fake_ids && rows[i].ids ? (want + 1) % V : want, rows[i].out + (size_t)k * V);
            }
        else if (rows[i].logits == LOOM_LOGITS_LAST)
            fake_logits(next_token(seen, end), rows[i].out);
    }
}

typedef struct harness {
    loom_kv_pool *kv;
    loom_sched s;
    loom_fwd_row rows[64];
    float logits[256 * V], plp[64 * V];
    int total;             /* the pool's blocks */
    int steps, preempted;  /* requests seen going back to waiting */
    loom_request *req[MAXR];
    int n_req;
    int plan_end[MAXR];    /* the chunk end each request's prefill rows keep */
    int pos[MAXR];         /* where its last prefill row ended */
    int restore_next;      /* the next admission plans a (fake) restore */
    int draft_good;        /* the fake drafter's proposals: this many right, then wrong */
    int draft_short;       /* it finds nothing to propose (prompt lookup without a match) */
    int draft_cap;         /* > 0: it stops after this many (its own doubt) */
    int drafted;           /* proposals it made */
    int mark_ids;          /* verification rows ask for ids (as the engine's mark_ids) */
    int32_t ids[256];
} harness;

static void h_init(harness *h, int n_blocks, int budget, int max_seqs, int chunk) {
    memset(h, 0, sizeof *h);
    CHECK(loom_kv_pool_create(1, KVD, BS, n_blocks, LOOM_KV_F32, &h->kv) == LOOM_OK);
    h->total = n_blocks;
    h->s = (loom_sched){.kv = h->kv, .max_batch_tokens = budget, .max_seqs = max_seqs, .chunk = chunk,
                        .plp_rows = 3, .vocab = V, .n_ctx = 512};
    CHECK(loom_sched_init(&h->s) == LOOM_OK);
}

static void h_free(harness *h) {
    CHECKF(h->s.n_running == 0 && h->s.wait_len == 0, "%d running, %d waiting at the end",
           h->s.n_running, h->s.wait_len);
    CHECKF(loom_kv_available(h->kv) == h->total, "%d of %d blocks free at the end",
           loom_kv_available(h->kv), h->total);
    for (int i = 0; i < h->n_req; i++) loom_request_free(h->req[i]);
    loom_sched_release(&h->s);
    loom_kv_pool_free(h->kv);
}

/* A request as loom_engine_submit makes one: greedy, prompt of n tokens
 * drawn from seed, queued at once. */
static loom_request *h_submit(harness *h, int n, int max_tokens, unsigned long long seed) {
    loom_request *r = calloc(1, sizeof *r);
    r->id = (uint64_t)h->n_req + 1;
    r->n_prompt = r->n_tokens = n;
    r->max_tokens = max_tokens;
    r->logprobs = r->prompt_logprobs = -1;
    r->plp_next = n;
    r->cap = n + max_tokens;
    r->tokens = malloc(sizeof *r->tokens * (size_t)r->cap);
    r->stop_ids = malloc(sizeof *r->stop_ids);
    for (int i = 0; i < n; i++) r->tokens[i] = (int32_t)(test_rand_u32(&seed) % V);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 2);
    atomic_init(&r->abort, 0);
    loom_sampling sp = loom_sampling_default();
    CHECK(loom_sampler_init(&r->sampler, &sp, V) == LOOM_OK);
    r->spec_k = h->s.spec_k;
    CHECK(loom_sched_enqueue(&h->s, r) == LOOM_OK);
    h->req[h->n_req++] = r;
    return r;
}

static int h_index(const harness *h, const loom_request *r) {
    for (int i = 0; i < h->n_req; i++)
        if (h->req[i] == r) return i;
    return -1;
}

static int held_blocks(const loom_kv_seq *seq) {
    int n = 0;
    for (int i = 0; i < seq->n_blocks; i++) n += seq->blocks[i] >= 0;
    return n;
}

/* The plan's invariants, before the forward. */
static void check_plan(harness *h, const step_plan *p) {
    const loom_sched *s = &h->s;
    CHECKF(p->n_rows <= s->max_seqs, "%d rows, max_seqs %d", p->n_rows, s->max_seqs);
    CHECKF(p->tokens <= s->max_batch_tokens, "%d tokens, budget %d", p->tokens, s->max_batch_tokens);
    CHECKF(s->n_running <= s->max_seqs, "%d running, max_seqs %d", s->n_running, s->max_seqs);
    int sum = 0, prefill_seen = 0, all = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const sched_row *w = &p->rows[i];
        sum += w->n;
        all += w->all;
        CHECKF(w->n > 0 && w->start == w->r->seq.n_tokens, "row %d: %d tokens from %d (KV at %d)", i,
               w->n, w->start, w->r->seq.n_tokens);
        for (int k = 0; k < i; k++) CHECKF(p->rows[k].r != w->r, "rows %d and %d: one request", k, i);
        if (w->kind == SCHED_DECODE) {
            CHECKF(!prefill_seen, "decode row %d after a prefill row", i);
            CHECK_EQ_INT(w->n, 1 + w->draft);
            CHECKF(w->draft >= 0 && w->draft <= s->spec_k, "row %d: %d proposals, spec_k %d", i, w->draft,
                   s->spec_k);
            /* its picks stop at max_tokens and the context's end */
            CHECKF(w->r->n_generated + w->n <= w->r->max_tokens && w->start + w->n <= s->n_ctx,
                   "row %d: %d tokens after %d generated of %d", i, w->n, w->r->n_generated, w->r->max_tokens);
            continue;
        }
        CHECK_EQ_INT(w->draft, 0);
        prefill_seen = 1;
        CHECKF(w->start + w->n <= w->plan_end, "row %d ends at %d, past its plan %d", i, w->start + w->n,
               w->plan_end);
        CHECK_EQ_INT(w->kind == SCHED_FINAL, w->start + w->n == w->r->prefill_len);
        int k = h_index(h, w->r);
        /* a planned end stays until reached, whoever joined meanwhile (a
         * recompute after preemption starts over) */
        if (k >= 0 && w->start == h->pos[k] && h->plan_end[k] > w->start)
            CHECKF(w->plan_end == h->plan_end[k], "request %d: chunk end moved from %d to %d", k,
                   h->plan_end[k], w->plan_end);
        if (k >= 0) {
            h->plan_end[k] = w->plan_end;
            h->pos[k] = w->start + w->n;
        }
    }
    CHECK_EQ_INT(sum, p->tokens);
    CHECKF(all <= 1, "%d all-positions rows in one step", all);
    /* every decoding request has its row this step */
    for (int i = 0; i < s->n_running; i++) {
        if (s->running[i]->state != RQ_DECODE) continue;
        int found = 0;
        for (int k = 0; k < p->n_rows; k++) found |= p->rows[k].r == s->running[i] && p->rows[k].kind == SCHED_DECODE;
        CHECKF(found, "decoding request %llu has no row", (unsigned long long)s->running[i]->id);
    }
}

/* The queues' and the pool's invariants, between steps. */
static void check_state(harness *h) {
    const loom_sched *s = &h->s;
    int held = 0;
    for (int i = 0; i < s->n_running; i++) {
        const loom_request *r = s->running[i];
        held += held_blocks(&r->seq);
        int need = r->state == RQ_DECODE ? r->seq.n_tokens : r->prefill_len;
        CHECKF(r->seq.n_blocks * BS >= need, "request %llu (state %d) holds blocks for %d tokens, needs %d",
               (unsigned long long)r->id, (int)r->state, r->seq.n_blocks * BS, need);
        /* a decoding request's KV holds every token but the last, no rejected proposal */
        if (r->state == RQ_DECODE)
            CHECKF(r->seq.n_tokens == r->n_tokens - 1 && r->seq.n_blocks == (r->seq.n_tokens + BS - 1) / BS,
                   "request %llu: KV of %d tokens in %d blocks, %d tokens", (unsigned long long)r->id,
                   r->seq.n_tokens, r->seq.n_blocks, r->n_tokens);
        CHECK(r->state != RQ_WAITING && r->state != RQ_DONE);
    }
    for (int i = 0; i < s->wait_len; i++) {
        const loom_request *r = s->waiting[(s->wait_head + i) % s->wait_cap];
        CHECKF(r->seq.n_blocks == 0, "waiting request %llu holds %d blocks", (unsigned long long)r->id,
               r->seq.n_blocks);
        CHECK(r->state == RQ_WAITING);
    }
    CHECKF(held + loom_kv_available(h->kv) == h->total, "%d blocks held + %d free != %d", held,
           loom_kv_available(h->kv), h->total);
}

/* A step's plan, checked. */
static const step_plan *h_plan(harness *h) {
    uint64_t pre = h->s.counters.preemptions;
    const step_plan *p = loom_sched_plan(&h->s);
    h->preempted += (int)(h->s.counters.preemptions - pre);
    check_plan(h, p);
    return p;
}

/* The fake drafter: a row's proposals continue its tokens as next_token
 * would, the first draft_good of them right and the rest off by one. */
static void fake_draft(harness *h, const step_plan *cp) {
    step_plan *p = (step_plan *)cp; /* the drafter may lower a row's proposals */
    for (int i = 0; i < p->n_rows; i++) {
        sched_row *w = &p->rows[i];
        int got = h->draft_short ? 0 : h->draft_cap > 0 && h->draft_cap < w->draft ? h->draft_cap : w->draft;
        p->tokens -= w->draft - got;
        w->n -= w->draft - got;
        w->draft = got;
        for (int k = 0; k < w->draft; k++) {
            int32_t *t = w->r->tokens, want = next_token(t, w->start + 1 + k);
            t[w->start + 1 + k] = k < h->draft_good ? want : (want + 1) % V;
        }
        h->drafted += w->draft;
    }
}

/* The rest of the step: the rows, the fake forward, the commit. */
static void h_run(harness *h, const step_plan *p) {
    if (p->n_rows) {
        fake_draft(h, p);
        loom_sched_fwd_rows(&h->s, p, h->rows, h->logits, h->plp);
        for (int i = 0, at = 0; i < p->n_rows && h->mark_ids; i++) {
            if (p->rows[i].draft <= 0) continue;
            h->rows[i].ids = h->ids + at;
            h->ids[at] = -1;
            at += h->rows[i].n;
        }
        fake_forward(h->kv, h->rows, p->n_rows);
        step_work w = {.id = ++h->steps, .rows = p->n_rows, .tokens = p->tokens};
        loom_sched_commit(&h->s, p, h->rows, NULL, &w);
    }
    check_state(h);
}

/* One step. Returns the plan's rows. */
static int h_step(harness *h) {
    const step_plan *p = h_plan(h);
    int n = p->n_rows;
    h_run(h, p);
    return n;
}

static void h_drain(harness *h) {
    for (int i = 0; i < 1000 && (h->s.n_running || h->s.wait_len); i++)
        if (!h_step(h) && h->s.n_running == h->s.n_restoring) break;
}

/* The request's events: generated tokens into out (returns how many),
 * prompt logprob events into *n_plp, its finish into *why. */
static int events(loom_request *r, int32_t *out, int *n_plp, loom_finish *why) {
    loom_event ev;
    int n = 0;
    *why = LOOM_FINISH_NONE;
    if (n_plp) *n_plp = 0;
    while (loom_request_next(r, &ev, 0) == LOOM_OK) {
        if (ev.finish != LOOM_FINISH_NONE) {
            *why = ev.finish;
            break;
        }
        if (ev.prompt) {
            if (n_plp) ++*n_plp;
        } else {
            out[n++] = ev.token;
        }
    }
    return n;
}

/* The request ran to its length and generated what it would alone. */
static void check_solo(loom_request *r) {
    int32_t got[256], want[512];
    loom_finish why;
    int n = events(r, got, NULL, &why);
    CHECKF(why == LOOM_FINISH_LENGTH, "request %llu finished with %d", (unsigned long long)r->id, (int)why);
    CHECK_EQ_INT(n, r->max_tokens);
    memcpy(want, r->tokens, sizeof *want * (size_t)r->n_prompt);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        want[r->n_prompt + i] = next_token(want, r->n_prompt + i);
        bad += got[i] != want[r->n_prompt + i];
    }
    CHECKF(!bad, "request %llu: %d of %d tokens differ from its solo run", (unsigned long long)r->id, bad, n);
}

/* A request joining mid-prefill never moves another's planned chunk end
 * (check_plan), and all come out as they would alone. */
static void late_join(void) {
    harness h;
    h_init(&h, 64, 6, 8, 16);
    loom_request *a = h_submit(&h, 40, 3, 1);
    h_step(&h);
    CHECK_EQ_INT(a->plan_end, 16);
    CHECK_EQ_INT(a->seq.n_tokens, 6);
    loom_request *b = h_submit(&h, 20, 3, 2);
    h_step(&h); /* a takes the whole budget: b waits */
    CHECK_EQ_INT(b->state, RQ_WAITING);
    h_step(&h); /* a's chunk ends at 16 still; b takes the rest of the budget */
    CHECK_EQ_INT(a->seq.n_tokens, 16);
    CHECK_EQ_INT(b->seq.n_tokens, 2);
    CHECK_EQ_INT(b->plan_end, 16);
    loom_request *c = h_submit(&h, 9, 3, 3);
    h_drain(&h);
    check_solo(a);
    check_solo(b);
    check_solo(c);
    h_free(&h);
}

/* A small budget splits each planned chunk into pieces; only the piece
 * ending the prefill asks for logits, and the result is the unsplit one. */
static void budget_split(void) {
    harness h;
    h_init(&h, 64, 5, 8, 12);
    loom_request *a = h_submit(&h, 30, 2, 4);
    static const int starts[] = {0, 5, 10, 12, 17, 22, 24, 29}, ns[] = {5, 5, 2, 5, 5, 2, 5, 1},
                     ends[] = {12, 12, 12, 24, 24, 24, 30, 30};
    for (int k = 0; k < 8; k++) {
        const step_plan *p = h_plan(&h);
        CHECK_EQ_INT(p->n_rows, 1);
        if (p->n_rows != 1) break;
        CHECK_EQ_INT(p->rows[0].start, starts[k]);
        CHECK_EQ_INT(p->rows[0].n, ns[k]);
        CHECK_EQ_INT(p->rows[0].plan_end, ends[k]);
        CHECK_EQ_INT(p->rows[0].kind, k == 7 ? SCHED_FINAL : SCHED_DRAIN);
        h_run(&h, p);
        CHECK_EQ_INT(h.rows[0].logits, k == 7 ? LOOM_LOGITS_LAST : LOOM_LOGITS_NONE);
    }
    CHECK_EQ_INT(a->state, RQ_DECODE);
    /* the same prompt in one piece: the same tokens */
    loom_request *b = h_submit(&h, 30, 2, 4);
    b->chunk = 64;
    h.s.max_batch_tokens = 64;
    h_drain(&h);
    check_solo(a);
    check_solo(b);
    h_free(&h);
}

/* Decode rows come first and every decoding request has one each step,
 * however long the prompts that join. */
static void decode_first(void) {
    harness h;
    h_init(&h, 128, 8, 8, 8);
    loom_request *a = h_submit(&h, 5, 12, 5), *b = h_submit(&h, 3, 12, 6);
    for (int i = 0; i < 10 && (a->state != RQ_DECODE || b->state != RQ_DECODE); i++) h_step(&h);
    loom_request *c = h_submit(&h, 60, 2, 7), *d = h_submit(&h, 30, 2, 8);
    for (int i = 0; i < 4; i++) {
        const step_plan *p = h_plan(&h);
        CHECK(p->n_rows >= 3 && p->rows[0].kind == SCHED_DECODE && p->rows[1].kind == SCHED_DECODE);
        CHECK_EQ_INT(p->tokens, 8); /* the prefills take the rest of the budget */
        h_run(&h, p);
    }
    h_drain(&h);
    check_solo(a);
    check_solo(b);
    check_solo(c);
    check_solo(d);
    h_free(&h);
}

/* When a decode needs a block and none is free, the newest request goes
 * back to waiting with nothing held, and recomputes to the same tokens. */
static void preemption(void) {
    harness h;
    h_init(&h, 12, 64, 8, 0);
    loom_request *a = h_submit(&h, 12, 20, 9), *b = h_submit(&h, 8, 20, 10);
    int saw = 0;
    for (int i = 0; i < 200 && (h.s.n_running || h.s.wait_len); i++) {
        int before = h.preempted;
        h_step(&h);
        /* only b, the newer, is ever preempted (it may be readmitted at once) */
        CHECK(a->state == RQ_DECODE || a->state == RQ_DONE);
        if (h.preempted > before && !saw) {
            saw = 1;
            CHECK(b->order > a->order && b->state != RQ_DECODE);
            CHECK(b->n_generated > 0);
        }
    }
    CHECK(saw);
    CHECK(h.s.counters.preemptions >= 1);
    check_solo(a);
    check_solo(b);
    h_free(&h);
}

/* max_seqs bounds the running set and the rows; the rest wait their turn. */
static void max_seqs(void) {
    harness h;
    h_init(&h, 128, 64, 2, 0);
    loom_request *r[5];
    for (int i = 0; i < 5; i++) r[i] = h_submit(&h, 6 + 3 * i, 4, 20 + (unsigned)i);
    h_step(&h);
    CHECK_EQ_INT(h.s.n_running, 2);
    CHECK_EQ_INT(h.s.wait_len, 3);
    h_drain(&h);
    for (int i = 0; i < 5; i++) check_solo(r[i]);
    h_free(&h);
}

/* Prompt logprobs: one all-positions row per step, at most plp_rows
 * tokens; every prompt position but the first gets its event once. */
static void prompt_logprobs(void) {
    harness h;
    h_init(&h, 64, 16, 8, 0);
    loom_request *a = h_submit(&h, 10, 2, 30), *b = h_submit(&h, 7, 2, 31);
    a->prompt_logprobs = b->prompt_logprobs = 0;
    a->plp_next = b->plp_next = 1;
    h_drain(&h);
    int32_t got[8];
    loom_finish why;
    int n_plp;
    for (int k = 0; k < 2; k++) {
        loom_request *r = k ? b : a;
        CHECK_EQ_INT(events(r, got, &n_plp, &why), 2);
        CHECK_EQ_INT(n_plp, r->n_prompt - 1);
        CHECK_EQ_INT(why, LOOM_FINISH_LENGTH);
    }
    h_free(&h);
}

/* ---- cancellation, and restores -------------------------------------- */

/* The admit hook: the next admission plans a restore of its first block. */
static int fake_admit(void *ctx, loom_request *r) {
    harness *h = ctx;
    if (h->restore_next) {
        h->restore_next = 0;
        r->restore = loom_restore_job_new(1, 0, 0);
        CHECK(r->restore != NULL);
    }
    return 0;
}

/* The restore thread's work, done at once: writes the first block's
 * tokens, then the scheduler takes the request up. */
static void fake_restore_done(harness *h, loom_request *r, int ok) {
    int i = 0;
    while (i < h->s.n_running && h->s.running[i] != r) i++;
    CHECK(i < h->s.n_running && r->state == RQ_RESTORING);
    if (i == h->s.n_running) return;
    float x[KVD] = {0};
    for (int p = 0; ok && p < BS; p++) {
        x[0] = (float)r->tokens[p];
        loom_kv_layer_store(&h->kv->lay, 0, loom_kv_k_row(&h->kv->lay, &r->seq, 0, p), x, KVD);
    }
    r->seq.n_tokens = ok ? BS : 0;
    loom_restore_job_free(r->restore);
    r->restore = NULL;
    loom_sched_restored(&h->s, i, r->seq.n_tokens);
}

static void check_cancelled(loom_request *r) {
    int32_t got[256];
    loom_finish why;
    events(r, got, NULL, &why);
    CHECKF(why == LOOM_FINISH_CANCELLED, "request %llu finished with %d, not cancelled",
           (unsigned long long)r->id, (int)why);
}

static void restores(void) {
    harness h;
    h_init(&h, 64, 64, 8, 0);
    h.s.hooks = (sched_hooks){.ctx = &h, .admit = fake_admit};
    h.restore_next = 1;
    loom_request *a = h_submit(&h, 13, 3, 40), *b = h_submit(&h, 9, 3, 41);
    h_step(&h); /* a waits for its restore; b goes on */
    CHECK_EQ_INT(a->state, RQ_RESTORING);
    CHECK_EQ_INT(h.s.n_restoring, 1);
    CHECK(held_blocks(&a->seq) == 4);
    h_step(&h);
    fake_restore_done(&h, a, 1);
    CHECK_EQ_INT(a->state, RQ_PREFILL);
    CHECK_EQ_INT(a->n_cached, BS);
    h_drain(&h);
    check_solo(a);
    check_solo(b);
    h_free(&h);
}

/* A request cancelled while waiting, mid-prefill, mid-decode or while
 * restoring leaves at the next step boundary with every block released
 * (h_free: the pool's free count is its total), and nobody else's output
 * changes. */
static void cancellation(void) {
    harness h;
    h_init(&h, 64, 6, 8, 6);
    h.s.hooks = (sched_hooks){.ctx = &h, .admit = fake_admit};
    loom_request *keep = h_submit(&h, 11, 6, 50);
    loom_request *dec = h_submit(&h, 3, 30, 51);
    h_step(&h);
    h_step(&h);
    loom_request *pre = h_submit(&h, 30, 3, 52);
    for (int i = 0; i < 20 && (dec->state != RQ_DECODE || pre->state != RQ_PREFILL || pre->seq.n_tokens == 0); i++)
        h_step(&h);
    CHECK(dec->state == RQ_DECODE && pre->state == RQ_PREFILL && pre->seq.n_tokens > 0);
    loom_request *wait = h_submit(&h, 5, 3, 53);
    atomic_store(&wait->abort, 1);
    atomic_store(&pre->abort, 1);
    atomic_store(&dec->abort, 1);
    h_step(&h);
    CHECK(wait->state == RQ_DONE && pre->state == RQ_DONE && dec->state == RQ_DONE);
    h.restore_next = 1;
    loom_request *rst = h_submit(&h, 10, 3, 54);
    for (int i = 0; i < 20 && rst->state == RQ_WAITING; i++) h_step(&h);
    CHECK_EQ_INT(rst->state, RQ_RESTORING);
    atomic_store(&rst->abort, 1);
    h_step(&h); /* its blocks are being written: it waits for its job */
    CHECK_EQ_INT(rst->state, RQ_RESTORING);
    CHECK(held_blocks(&rst->seq) > 0);
    fake_restore_done(&h, rst, 0);
    h_drain(&h);
    check_cancelled(wait);
    check_cancelled(pre);
    check_cancelled(dec);
    check_cancelled(rst);
    check_solo(keep);
    h_free(&h);
}

/* Verification by a device forward's greedy ids (loom_fwd_row's ids):
 * the commit takes them over the logits (which pick other tokens here);
 * where the forward leaves them unset (-1: the CPU), the logits. */
static void speculation_ids(void) {
    for (int dev = 0; dev < 2; dev++) {
        harness h;
        h_init(&h, 64, 16, 8, 0);
        h.s.spec_k = 4;
        h.s.spec_budget = 32;
        h.draft_good = 2;
        h.mark_ids = 1;
        fake_ids = dev;
        loom_request *a = h_submit(&h, 5, 20, 70), *b = h_submit(&h, 7, 20, 71);
        h_drain(&h);
        check_solo(a);
        check_solo(b);
        CHECKF(h.s.counters.spec_accepted > 0 && h.s.counters.spec_accepted < h.s.counters.spec_drafted,
               "%llu of %llu accepted", (unsigned long long)h.s.counters.spec_accepted,
               (unsigned long long)h.s.counters.spec_drafted);
        fake_ids = 0;
        h_free(&h);
    }
}

/* Speculation: proposals come out of the budget the decode rows leave,
 * never past max_tokens or the free blocks (no preemption for them); kept
 * runs and rejections both give the solo output; rejected KV goes back. */
static void speculation(void) {
    harness h;
    h_init(&h, 64, 8, 8, 0);
    h.s.spec_k = 4;
    h.s.spec_budget = 32;
    h.draft_good = 8;
    loom_request *a = h_submit(&h, 5, 20, 60), *b = h_submit(&h, 7, 20, 61);
    for (int i = 0; i < 10 && (a->state != RQ_DECODE || b->state != RQ_DECODE); i++) h_step(&h);
    int ga = a->n_generated, gb = b->n_generated;
    const step_plan *p = h_plan(&h);
    /* two decode rows, then 6 of the 8 tokens for proposals: 4 and 2 */
    CHECK_EQ_INT(p->n_rows, 2);
    CHECK_EQ_INT(p->tokens, 8);
    CHECK(p->rows[0].draft == 4 && p->rows[1].draft == 2);
    h_run(&h, p);
    CHECK_EQ_INT(a->n_generated - ga, 5); /* 4 kept and the target's next */
    CHECK_EQ_INT(b->n_generated - gb, 3);
    /* a step the gate pauses (engine/gate.h) carries no proposals, and
     * the rows keep their draft lengths for the next */
    h.s.spec_pause = 1;
    p = h_plan(&h);
    CHECK(p->n_rows == 2 && p->tokens == 2 && p->rows[0].draft == 0 && p->rows[1].draft == 0);
    h_run(&h, p);
    h.s.spec_pause = 0;
    CHECK(a->spec_k == 4 && b->spec_k == 4);
    /* a prefill joining gets what the proposals leave */
    loom_request *c = h_submit(&h, 9, 3, 62);
    p = h_plan(&h);
    CHECK_EQ_INT(p->tokens, 8);
    CHECK(p->n_rows == 2 || (p->n_rows == 3 && p->rows[2].r == c));
    h_run(&h, p);
    h_drain(&h);
    check_solo(a);
    check_solo(b);
    check_solo(c);
    CHECK(h.s.counters.spec_accepted == h.s.counters.spec_drafted && h.drafted > 0);
    /* every proposal but the first wrong: one kept each round, the rest cut;
     * the draft length follows what was kept */
    h.draft_good = 1;
    h.s.max_batch_tokens = 64;
    loom_request *d = h_submit(&h, 6, 30, 63);
    for (int i = 0; i < 10 && d->state != RQ_DECODE; i++) h_step(&h);
    uint64_t acc0 = h.s.counters.spec_accepted, dr0 = h.s.counters.spec_drafted;
    p = h_plan(&h);
    CHECK_EQ_INT(p->rows[0].draft, 4);
    h_run(&h, p);
    CHECK_EQ_INT(d->spec_k, 2); /* one more than held */
    CHECK_EQ_INT(h.s.counters.spec_accepted - acc0, 1);
    CHECK_EQ_INT(h.s.counters.spec_drafted - dr0, 4);
    /* none right: one proposal a round, and after three such rounds the
     * row falls back to plain decoding */
    h.draft_good = 0;
    h_step(&h);
    CHECK_EQ_INT(d->spec_k, 1);
    h_step(&h);
    CHECK_EQ_INT(d->spec_k, 1);
    h_step(&h);
    CHECK_EQ_INT(d->spec_k, 0);
    p = h_plan(&h);
    CHECK_EQ_INT(p->rows[0].draft, 0);
    h_run(&h, p);
    h_drain(&h);
    check_solo(d);
    /* a drafter making fewer proposals than planned: the blocks reserved
     * for the rest go back (check_state) */
    h.draft_short = 1;
    h.draft_good = 8;
    loom_request *x = h_submit(&h, 3, 40, 67);
    h_drain(&h);
    check_solo(x);
    h.draft_short = 0;
    /* max_tokens bounds a row's picks (check_plan) */
    h.draft_good = 8;
    loom_request *e = h_submit(&h, 4, 3, 64);
    h_drain(&h);
    check_solo(e);
    h_free(&h);
    /* a pool with no block to spare once both have all their tokens:
     * proposals shrink to what fits, nobody is preempted for them */
    h_init(&h, 8, 64, 8, 0);
    h.s.spec_k = 8;
    h.s.spec_budget = 64;
    h.draft_good = 8;
    loom_request *f = h_submit(&h, 3, 12, 65), *g = h_submit(&h, 3, 12, 66);
    h_drain(&h);
    CHECK_EQ_INT(h.preempted, 0);
    CHECK(h.s.counters.spec_drafted > 0);
    check_solo(f);
    check_solo(g);
    h_free(&h);
}

/* Cancelled between the plan and the commit of a round: it finishes
 * cancelled there and every block comes back. */
static void speculation_cancel(void) {
    harness h;
    h_init(&h, 64, 16, 8, 0);
    h.s.spec_k = 4;
    h.s.spec_budget = 16;
    h.draft_good = 8;
    loom_request *a = h_submit(&h, 5, 20, 70), *b = h_submit(&h, 6, 20, 71);
    for (int i = 0; i < 10 && (a->state != RQ_DECODE || b->state != RQ_DECODE); i++) h_step(&h);
    const step_plan *p = h_plan(&h);
    CHECK(p->rows[0].draft > 0 && p->rows[1].draft > 0);
    atomic_store(&a->abort, 1);
    h_run(&h, p);
    CHECK_EQ_INT(a->state, RQ_DONE);
    h_drain(&h);
    check_cancelled(a);
    check_solo(b);
    h_free(&h);
}

/* A prepared prompt with a bidirectional span (tokens [6, 18), as Gemma
 * 3's image tokens): no row starts or ends inside it, however the chunk
 * and the budget fall, and the output is the solo one. */
static void spans(void) {
    static const int budgets[] = {13, 16, 64}, chunks[] = {8, 3, 64};
    for (int c = 0; c < 3; c++) {
        harness h;
        h_init(&h, 64, budgets[c], 8, chunks[c]);
        loom_request *b = h_submit(&h, 9, 6, 21); /* decoding while a prefills */
        h_step(&h);
        loom_request *a = h_submit(&h, 30, 3, 20);
        int32_t *g = malloc(sizeof *g * 30);
        for (int i = 0; i < 30; i++) g[i] = i >= 6 && i < 18 ? 0 : -1;
        a->n_images = 1;
        a->prompt = calloc(1, sizeof *a->prompt);
        a->prompt->n = 30;
        a->prompt->in.groups = g;
        for (int k = 0; k < 100 && (h.s.n_running || h.s.wait_len); k++) {
            const step_plan *p = h_plan(&h);
            for (int i = 0; i < p->n_rows; i++) {
                if (p->rows[i].r != a || p->rows[i].kind == SCHED_DECODE) continue;
                int st = p->rows[i].start, en = st + p->rows[i].n;
                CHECKF(!(st > 6 && st < 18) && !(en > 6 && en < 18), "budget %d chunk %d: a row "
                       "[%d, %d) cuts the span [6, 18)", budgets[c], chunks[c], st, en);
            }
            h_run(&h, p);
        }
        CHECK(a->prompt == NULL); /* dropped once the prompt's rows were done */
        a->n_images = 0;
        check_solo(a);
        check_solo(b);
        free(g);
        h_free(&h);
    }
}

/* A hit (here a restore of the first block, tokens [0, 4)) that ends
 * inside a span ([2, 10)) goes back to the span's start, its blocks
 * reserved again. */
static void span_hit(void) {
    harness h;
    h_init(&h, 64, 64, 8, 0);
    h.s.hooks = (sched_hooks){.ctx = &h, .admit = fake_admit};
    h.restore_next = 1;
    loom_request *a = h_submit(&h, 13, 3, 60);
    int32_t g[13];
    for (int i = 0; i < 13; i++) g[i] = i >= 2 && i < 10 ? 0 : -1;
    a->n_images = 1;
    a->prompt = calloc(1, sizeof *a->prompt);
    a->prompt->n = 13;
    a->prompt->in.groups = g;
    h_step(&h);
    CHECK_EQ_INT(a->state, RQ_RESTORING);
    fake_restore_done(&h, a, 1);
    const step_plan *p = h_plan(&h);
    CHECK(p->n_rows == 1 && p->rows[0].start == 2 && p->rows[0].n == 11);
    CHECK_EQ_INT(a->n_cached, 2);
    h_run(&h, p);
    h_drain(&h);
    a->n_images = 0;
    check_solo(a);
    h_free(&h);
}

/* A row's proposal cap follows its acceptance: a full run of fewer than
 * the cap (the drafter stopped on its own) keeps the cap, a miss halves
 * it, a partial run halves it but keeps one more than held. */
static void spec_lengths(void) {
    harness h;
    h_init(&h, 64, 64, 8, 0);
    h.s.spec_k = 8;
    h.s.spec_budget = 64;
    h.draft_good = 8;
    loom_request *a = h_submit(&h, 5, 60, 70);
    for (int i = 0; i < 10 && a->state != RQ_DECODE; i++) h_step(&h);
    CHECK_EQ_INT(a->spec_k, 8);
    h.draft_cap = 2;
    h_step(&h);
    CHECK_EQ_INT(a->spec_k, 8);
    h.draft_cap = 0;
    h.draft_good = 0;
    h_step(&h);
    CHECK_EQ_INT(a->spec_k, 4);
    h.draft_good = 1;
    h_step(&h);
    CHECK_EQ_INT(a->spec_k, 2);
    h.draft_good = 8;
    h_drain(&h);
    check_solo(a);
    h_free(&h);
}

int main(void) {
    speculation();
    speculation_ids();
    spec_lengths();
    speculation_cancel();
    spans();
    span_hit();
    late_join();
    budget_split();
    decode_first();
    preemption();
    max_seqs();
    prompt_logprobs();
    restores();
    cancellation();
    return test_report("test_sched");
}
