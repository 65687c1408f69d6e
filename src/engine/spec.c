/* spec: prompt lookup and draft-model drafters (design notes in
 * engine/spec.h). */
#include "engine/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/exec.h"
#include "model/dflash.h"
#include "ops/ops.h"

#define DRAFT_BLOCK 16
/* A proposal after a row's first needs at least this draft probability:
 * below it, acceptance is too unlikely to pay for its draft and
 * verification tokens (on pycoder-16m with pycoder-draft-3m, 0.3 keeps
 * nearly every run that would be accepted). */
#define DRAFT_MIN_PROB 0.3f
/* Blocks one projected-context drafter forward stacks at most: their
 * rows share every matmul's pass over the weights. */
#define DFL_BATCH 16
/* Decode positions whose tap states a request keeps unprojected at most
 * (dfl_stash): 4.5 KiB each on pycoder-16m. */
#define DFL_RAW_MAX 256
/* The draft pool's bound; its pages are taken only as blocks are first used. */
#define DRAFT_POOL_BYTES ((size_t)1 << 30)

typedef struct spec_ops {
    const char *name;
    loom_status (*draft)(loom_spec *sp, step_plan *plan);
    void (*done)(loom_spec *sp, loom_request *r);
    void (*taps)(loom_spec *sp, loom_exec *x, int on);                               /* or NULL */
    void (*after)(loom_spec *sp, const step_plan *plan, const loom_fwd_row *rows);    /* or NULL */
} spec_ops;

struct loom_spec {
    const spec_ops *ops;       /* static */
    loom_model *m;             /* borrowed draft model (model drafter only) */
    loom_kv_pool *kv;          /* owned: the draft's KV */
    loom_exec *exec;           /* owned: the draft's forwards */
    float *logits;             /* owned (max_seqs, vocab) */
    loom_fwd_row *rows;        /* owned [max_seqs] */
    int max_seqs, step_tokens, vocab;
    float min_prob;            /* a proposal after the first needs this draft probability */
    size_t state_bytes;        /* a draft's recurrent state (linear-attention layers), or 0 */
    /* dflash */
    const loom_dflash *dfl;    /* borrowed from the drafter model */
    loom_model *target;        /* borrowed: lends embeddings, lm_head, kernels */
    float *taps;               /* owned [step_tokens, n_taps * hidden] */
    float *scratch;            /* owned */
    loom_dflash_req *dfl_reqs; /* owned [dfl_batch]: one forward's blocks */
    int *dfl_rows;             /* owned [dfl_batch]: their plan rows */
    int dfl_batch;             /* blocks one drafter forward takes at most */
    int tapped;                /* the forward since the last taps on wrote sp->taps */
};

/* ---- prompt lookup ------------------------------------------------------- */

int loom_spec_ngram(const int32_t *t, int len, int k, int32_t *out) {
    for (int n = 3; n >= 1; n--) {
        if (len <= n) continue;
        const int32_t *pat = t + len - n;
        for (int i = len - n - 1; i >= 0; i--) {
            if (memcmp(t + i, pat, sizeof *t * (size_t)n) != 0) continue;
            int cnt = LOOM_MIN(k, len - (i + n));
            memcpy(out, t + i + n, sizeof *t * (size_t)cnt);
            return cnt;
        }
    }
    return 0;
}

/* Lowers row w's proposals to got. */
static void trim(step_plan *plan, sched_row *w, int got) {
    plan->tokens -= w->draft - got;
    w->n -= w->draft - got;
    w->draft = got;
}

static loom_status ngram_draft(loom_spec *sp, step_plan *plan) {
    (void)sp;
    for (int i = 0; i < plan->n_rows; i++) {
        sched_row *w = &plan->rows[i];
        if (w->draft <= 0) continue;
        loom_request *r = w->r;
        trim(plan, w, loom_spec_ngram(r->tokens, w->start + 1, w->draft, r->tokens + w->start + 1));
    }
    return LOOM_OK;
}

static void ngram_done(loom_spec *sp, loom_request *r) {
    (void)sp;
    (void)r;
}

static const spec_ops ngram_ops = {"ngram", ngram_draft, ngram_done, NULL, NULL};

/* ---- draft model ----------------------------------------------------------- */

/* Cuts r's draft back to its first `keep` tokens (those the target kept).
 * A recurrent state cannot be rewound: it goes back to its snapshot from
 * the end of the last catch-up (never past keep), the tokens after it to
 * be fed again. Returns 0 when there is no room for the state. */
static int model_cut(loom_spec *sp, loom_request *r, int keep) {
    loom_kv_seq *d = &r->draft_seq;
    if (!sp->state_bytes) {
        if (d->n_tokens > keep) loom_kv_seq_truncate(sp->kv, d, keep);
        return 1;
    }
    if (!r->draft_state && (loom_seq_state_create(sp->m, &r->draft_state) != LOOM_OK ||
                            !(r->draft_snap = malloc(sp->state_bytes))))
        return 0;
    if (d->n_tokens > keep) {
        loom_kv_seq_truncate(sp->kv, d, r->draft_snap_at);
        loom_seq_state_load(r->draft_state, r->draft_snap, r->draft_snap_at);
    }
    return 1;
}

/* Catches every drafting row's draft KV up to its row's first token (the
 * last one kept), in forwards of at most step_tokens tokens; the piece
 * that reaches it asks for its logits. Rows whose blocks cannot be had
 * draft nothing. */
static loom_status model_catch_up(loom_spec *sp, step_plan *plan) {
    for (int i = 0; i < plan->n_rows; i++) {
        sched_row *w = &plan->rows[i];
        if (w->draft <= 0) continue;
        loom_kv_seq *d = &w->r->draft_seq;
        /* what the last round wrote past the target's kept tokens goes */
        if (!model_cut(sp, w->r, w->start)) {
            trim(plan, w, 0);
            continue;
        }
        /* it will hold the first token and all but the last proposal */
        if (loom_kv_seq_reserve(sp->kv, d, w->start + w->draft) != LOOM_OK) {
            loom_kv_seq_release(sp->kv, d);
            trim(plan, w, 0);
        }
    }
    loom_err_clear();
    for (;;) {
        int n = 0, budget = sp->step_tokens;
        for (int i = 0; i < plan->n_rows && budget > 0; i++) {
            sched_row *w = &plan->rows[i];
            loom_kv_seq *d = &w->r->draft_seq;
            int end = w->start + 1;
            if (w->draft <= 0 || d->n_tokens >= end) continue;
            int cnt = LOOM_MIN(end - d->n_tokens, budget);
            int last = d->n_tokens + cnt == end;
            sp->rows[n++] = (loom_fwd_row){
                .tokens = w->r->tokens + d->n_tokens, .n = cnt, .seq = d,
                .logits = last ? LOOM_LOGITS_LAST : LOOM_LOGITS_NONE,
                .out = last ? sp->logits + (size_t)i * sp->vocab : NULL,
                .state = w->r->draft_state,
                .decode = cnt == 1,
            };
            budget -= cnt;
        }
        if (n == 0) break;
        loom_status st = loom_exec_forward(sp->exec, sp->kv, sp->rows, n);
        if (st) return st;
    }
    /* the state the next round starts from when this one's proposals fail */
    for (int i = 0; i < plan->n_rows && sp->state_bytes; i++) {
        loom_request *r = plan->rows[i].r;
        if (plan->rows[i].draft <= 0) continue;
        loom_seq_state_save(r->draft_state, r->draft_snap);
        r->draft_snap_at = r->draft_seq.n_tokens;
    }
    return LOOM_OK;
}

/* The probability of the argmax id under logits l [n], near enough: ids
 * more than 16 below it (e^-16 each) are left out, which spares most of
 * the exponentials. */
static float top_prob(const float *l, int32_t id, int n) {
    float top = l[id], sum = 0;
    for (int v = 0; v < n; v++)
        if (l[v] > top - 16) sum += expf(l[v] - top);
    return 1 / sum;
}

static loom_status model_draft(loom_spec *sp, step_plan *plan) {
    loom_status st = model_catch_up(sp, plan);
    /* proposal t of every row still drafting: the draft's greedy pick after
     * the tokens before it; the next forward feeds it */
    for (int t = 0; !st; t++) {
        int n = 0;
        for (int i = 0; i < plan->n_rows; i++) {
            sched_row *w = &plan->rows[i];
            if (w->draft <= t) continue;
            int32_t *at = w->r->tokens + w->start + 1 + t;
            const float *l = sp->logits + (size_t)i * sp->vocab;
            *at = loom_argmax(l, sp->vocab);
            /* past the first, a proposal the draft itself doubts is not
             * worth its verification: the row's run ends before it */
            if (t > 0 && top_prob(l, *at, sp->vocab) < sp->min_prob) {
                trim(plan, w, t);
                continue;
            }
            if (w->draft == t + 1) continue;
            sp->rows[n++] = (loom_fwd_row){
                .tokens = at, .n = 1, .seq = &w->r->draft_seq, .logits = LOOM_LOGITS_LAST,
                .out = sp->logits + (size_t)i * sp->vocab, .state = w->r->draft_state, .decode = 1,
            };
        }
        if (n == 0) break;
        st = loom_exec_forward(sp->exec, sp->kv, sp->rows, n);
    }
    return st;
}

static void model_done(loom_spec *sp, loom_request *r) {
    loom_kv_seq_release(sp->kv, &r->draft_seq);
    loom_seq_state_free(r->draft_state);
    free(r->draft_snap);
    r->draft_state = NULL;
    r->draft_snap = NULL;
}

static const spec_ops model_ops = {"draft-model", model_draft, model_done, NULL, NULL};

/* ---- projected-context drafter ----------------------------------------------- */

static void dfl_taps(loom_spec *sp, loom_exec *x, int on) {
    sp->tapped = on && loom_exec_set_taps(x, sp->dfl->taps, sp->dfl->n_taps, sp->taps);
    if (!on) loom_exec_set_taps(x, NULL, 0, NULL);
}

/* Makes room for r's context rows up to position end. Returns 0 when
 * there is none: the context then ends (a gap at the next forward starts
 * it over). */
static int dfl_room(loom_spec *sp, loom_request *r, int end) {
    size_t row = loom_dflash_row_floats(sp->dfl);
    int need = end - r->dfl_lo;
    if (need <= r->dfl_cap) return 1;
    int cap = LOOM_MAX(need, 2 * r->dfl_cap);
    float *nc = realloc(r->dfl_ctx, sizeof(float) * row * (size_t)cap);
    if (!nc) {
        r->dfl_n = r->dfl_lo = r->dfl_raw_n = 0;
        return 0;
    }
    r->dfl_ctx = nc;
    r->dfl_cap = cap;
    return 1;
}

/* Projects tap states taps (n positions from pos on) onto r's context
 * rows, in pieces that fit the scratch (a long prefill row). They go on
 * only right after the rows there are (pos == r->dfl_n; not so after a
 * failed allocation ended the context). */
static void dfl_project(loom_spec *sp, loom_request *r, const float *taps, int pos, int n) {
    const loom_dflash *d = sp->dfl;
    size_t w = (size_t)d->n_taps * (size_t)d->target_hidden, row = loom_dflash_row_floats(d);
    if (n <= 0 || pos != r->dfl_n || !dfl_room(sp, r, pos + n)) return;
    for (int a = 0; a < n; a += sp->step_tokens) {
        int cnt = LOOM_MIN(n - a, sp->step_tokens);
        loom_dflash_project(d, sp->target, taps + (size_t)a * w, pos + a, cnt,
                            r->dfl_ctx + (size_t)(pos + a - r->dfl_lo) * row, sp->scratch);
    }
    r->dfl_n = pos + n;
    r->dfl_raw_n = LOOM_MAX(r->dfl_raw_n, r->dfl_n); /* stashed states follow the projected ones */
}

/* Projects r's stashed tap states (dfl_raw) up to position end. */
static void dfl_flush(loom_spec *sp, loom_request *r, int end) {
    end = LOOM_MIN(end, r->dfl_raw_n);
    if (end > r->dfl_n) dfl_project(sp, r, r->dfl_raw, r->dfl_n, end - r->dfl_n);
    r->dfl_raw_n = r->dfl_n; /* what lay past end was not kept */
}

/* Keeps n tap states of decode positions pos.. unprojected: the next
 * draft projects those that were kept, so a rejected proposal's and a
 * row's that never drafts again cost nothing. Past DFL_RAW_MAX of them
 * the oldest go, and the context starts over after them. */
static void dfl_stash(loom_spec *sp, loom_request *r, const float *taps, int pos, int n) {
    size_t w = (size_t)sp->dfl->n_taps * (size_t)sp->dfl->target_hidden;
    if (!r->dfl_raw && !(r->dfl_raw = malloc(sizeof(float) * w * DFL_RAW_MAX))) {
        dfl_project(sp, r, taps, pos, n);
        return;
    }
    int have = pos - r->dfl_n, drop = have + n - DFL_RAW_MAX;
    if (drop > 0) {
        memmove(r->dfl_raw, r->dfl_raw + (size_t)drop * w, sizeof(float) * w * (size_t)(have - drop));
        r->dfl_lo = r->dfl_n = r->dfl_n + drop;
        have -= drop;
    }
    memcpy(r->dfl_raw + (size_t)have * w, taps, sizeof(float) * w * (size_t)n);
    r->dfl_raw_n = pos + n;
}

/* Context rows for every row of the forward: first cut back to the row's
 * first position (what a rejected proposal left goes here), then the
 * row's own: a prefill row's projected now, a decode row's stashed until
 * the next draft (dfl_stash). A row that starts past its context
 * (positions the target never ran: a prefix-cache hit) starts it over
 * there: the drafter then sees only the positions after the gap. */
static void dfl_after(loom_spec *sp, const step_plan *plan, const loom_fwd_row *rows) {
    const loom_dflash *d = sp->dfl;
    size_t w = (size_t)d->n_taps * (size_t)d->target_hidden, off = 0;
    if (!sp->tapped) return;
    sp->tapped = 0;
    for (int i = 0; i < plan->n_rows; off += (size_t)rows[i++].n) {
        loom_request *r = plan->rows[i].r;
        int pos = plan->rows[i].start, n = rows[i].n;
        if (pos < r->dfl_lo || pos > r->dfl_raw_n) r->dfl_lo = r->dfl_n = r->dfl_raw_n = pos; /* a gap */
        if (pos < r->dfl_n) r->dfl_n = pos;
        r->dfl_raw_n = LOOM_MIN(r->dfl_raw_n, pos);
        if (plan->rows[i].kind == SCHED_DECODE) {
            dfl_stash(sp, r, sp->taps + off * w, pos, n);
        } else {
            dfl_flush(sp, r, pos);
            dfl_project(sp, r, sp->taps + off * w, pos, n);
        }
    }
}

/* Turns request rq's logits l (rq->n_out rows) into row w's proposals. */
static void dfl_pick(loom_spec *sp, step_plan *plan, sched_row *w, const loom_dflash_req *rq, const float *l) {
    int got = rq->n_out;
    for (int t = 0; t < rq->n_out; t++, l += sp->vocab) {
        int32_t id = loom_argmax(l, sp->vocab);
        /* as the draft model: a proposal the drafter doubts ends the run */
        if (t > 0 && top_prob(l, id, sp->vocab) < sp->min_prob) {
            got = t;
            break;
        }
        w->r->tokens[rq->pos + 1 + t] = id;
    }
    trim(plan, w, got);
}

/* Every drafting row's block, up to dfl_batch of them in one forward, with
 * logits only for the proposals the row may carry. */
static loom_status dfl_draft(loom_spec *sp, step_plan *plan) {
    const loom_dflash *d = sp->dfl;
    for (int i = 0; i < plan->n_rows;) {
        int n = 0;
        for (; i < plan->n_rows && n < sp->dfl_batch; i++) {
            sched_row *w = &plan->rows[i];
            if (w->draft <= 0) continue;
            loom_request *r = w->r;
            int p = w->start;
            if (r->dfl_n > p) r->dfl_n = r->dfl_raw_n = LOOM_MAX(p, r->dfl_lo);
            dfl_flush(sp, r, p); /* the kept positions' states; the rejected ones' go */
            if (r->dfl_n < p) {
                trim(plan, w, 0);
                continue;
            }
            sp->dfl_rows[n] = i;
            sp->dfl_reqs[n++] = (loom_dflash_req){.ctx = r->dfl_ctx, .n_ctx = r->dfl_n - r->dfl_lo, .pos = p,
                                                  .n_out = LOOM_MIN(w->draft, d->block - 1), .last = r->tokens[p]};
        }
        if (n == 0) break;
        loom_dflash_blocks(d, sp->target, sp->dfl_reqs, n, sp->logits, sp->scratch);
        const float *l = sp->logits;
        for (int k = 0; k < n; l += (size_t)sp->dfl_reqs[k++].n_out * sp->vocab)
            dfl_pick(sp, plan, &plan->rows[sp->dfl_rows[k]], &sp->dfl_reqs[k], l);
    }
    return LOOM_OK;
}

static void dfl_done(loom_spec *sp, loom_request *r) {
    (void)sp;
    free(r->dfl_ctx);
    free(r->dfl_raw);
    r->dfl_ctx = NULL;
    r->dfl_raw = NULL;
    r->dfl_lo = r->dfl_n = r->dfl_cap = r->dfl_raw_n = 0;
}

static const spec_ops dfl_ops = {"dflash", dfl_draft, dfl_done, dfl_taps, dfl_after};

static loom_status dfl_create(loom_spec *sp, loom_model *target, int n_ctx, int draft_exact) {
    const loom_dflash *d = sp->dfl = sp->m->dflash;
    sp->target = target;
    sp->ops = &dfl_ops;
    loom_status s = target ? loom_dflash_check(d, target)
                           : loom_err(LOOM_ERR_INVALID_ARG, "dflash: the target model is needed");
    if (!s) s = loom_dflash_prepare(sp->m->dflash, target, !draft_exact);
    if (s) return s;
    /* A target on a device exports the hidden states to the host (exec.h's
     * loom_exec_set_taps); the drafter runs on the CPU over the target's
     * host weights (embeddings, lm_head), which stay mapped. */
    size_t proj = (size_t)sp->step_tokens * (size_t)(d->hidden + d->n_kv * d->head_dim);
    sp->dfl_batch = LOOM_MAX(1, LOOM_MIN(sp->max_seqs, DFL_BATCH));
    size_t scr = LOOM_MAX(proj, loom_dflash_scratch(d, n_ctx, sp->dfl_batch));
    sp->taps = loom_alloc(sizeof(float) * (size_t)sp->step_tokens * (size_t)d->n_taps * (size_t)d->target_hidden);
    sp->scratch = loom_alloc(sizeof(float) * scr);
    sp->logits = loom_alloc(sizeof(float) * (size_t)sp->dfl_batch * (size_t)(d->block - 1) * (size_t)sp->vocab);
    sp->dfl_reqs = calloc((size_t)sp->dfl_batch, sizeof *sp->dfl_reqs);
    sp->dfl_rows = calloc((size_t)sp->dfl_batch, sizeof *sp->dfl_rows);
    if (!sp->taps || !sp->scratch || !sp->logits || !sp->dfl_reqs || !sp->dfl_rows) return loom_err(LOOM_ERR_NOMEM, "dflash: out of memory");
    return LOOM_OK;
}

/* ---- the drafter ------------------------------------------------------------- */

loom_status loom_spec_create(const loom_engine_params *p, loom_model *target, int vocab, int max_seqs,
                             int n_ctx, int step_tokens, loom_spec **out) {
    *out = NULL;
    if (p->speculative != LOOM_SPEC_NGRAM && p->speculative != LOOM_SPEC_DRAFT)
        return loom_err(LOOM_ERR_INVALID_ARG, "speculative: expected ngram (%d) or a draft model (%d), "
                        "found %d", LOOM_SPEC_NGRAM, LOOM_SPEC_DRAFT, (int)p->speculative);
    loom_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    sp->ops = &ngram_ops;
    sp->max_seqs = max_seqs;
    sp->vocab = vocab;
    sp->step_tokens = step_tokens;
    if (p->speculative == LOOM_SPEC_NGRAM) {
        *out = sp;
        return LOOM_OK;
    }
    sp->ops = &model_ops;
    sp->min_prob = DRAFT_MIN_PROB;
    loom_model *m = sp->m = p->draft_model;
    loom_status s = LOOM_OK;
    if (!m) s = loom_err(LOOM_ERR_INVALID_ARG, "speculative: a draft model is needed");
    else if (m->cfg.vocab_size != vocab)
        s = loom_err(LOOM_ERR_INVALID_ARG, "draft model: expected the target's vocabulary of %d "
                     "tokens, found %d", vocab, m->cfg.vocab_size);
    else if (m->device >= 0)
        s = loom_err(LOOM_ERR_UNSUPPORTED, "draft model: expected a CPU model, found cuda:%d", m->device);
    if (!s && m->dflash) {
        s = dfl_create(sp, target, n_ctx, p->draft_exact);
        if (s) {
            loom_spec_free(sp);
            return s;
        }
        *out = sp;
        return LOOM_OK;
    }
    if (!s) {
        int kvd = loom_model_kv_dim(m), L = m->cfg.n_layers;
        size_t block = loom_kv_block_bytes(L, kvd, DRAFT_BLOCK, LOOM_KV_F32);
        size_t want = (size_t)max_seqs * (size_t)((n_ctx + DRAFT_BLOCK - 1) / DRAFT_BLOCK);
        int n_blocks = (int)LOOM_MAX(LOOM_MIN(want, DRAFT_POOL_BYTES / block), 1);
        s = loom_kv_pool_create(L, kvd, DRAFT_BLOCK, n_blocks, LOOM_KV_F32, &sp->kv);
    }
    if (!s) s = loom_exec_create(m, sp->kv, step_tokens, n_ctx, &sp->exec);
    if (m) sp->state_bytes = loom_seq_state_bytes(m);
    if (!s) {
        sp->logits = loom_alloc(sizeof(float) * (size_t)max_seqs * (size_t)vocab);
        sp->rows = calloc((size_t)max_seqs, sizeof *sp->rows);
        if (!sp->logits || !sp->rows) s = loom_err(LOOM_ERR_NOMEM, "draft model: out of memory");
    }
    if (s) {
        loom_spec_free(sp);
        return s;
    }
    *out = sp;
    return LOOM_OK;
}

void loom_spec_free(loom_spec *sp) {
    if (!sp) return;
    loom_exec_free(sp->exec);
    loom_kv_pool_free(sp->kv);
    loom_free(sp->logits);
    loom_free(sp->taps);
    loom_free(sp->scratch);
    free(sp->rows);
    free(sp->dfl_reqs);
    free(sp->dfl_rows);
    free(sp);
}

const char *loom_spec_name(const loom_spec *sp) { return sp->ops->name; }

loom_status loom_spec_draft(loom_spec *sp, step_plan *plan) {
    loom_status st = sp->ops->draft(sp, plan);
    if (st)
        for (int i = 0; i < plan->n_rows; i++)
            if (plan->rows[i].draft > 0) trim(plan, &plan->rows[i], 0);
    return st;
}

void loom_spec_done(loom_spec *sp, loom_request *r) { sp->ops->done(sp, r); }

void loom_spec_taps(loom_spec *sp, loom_exec *x, int on) {
    if (sp->ops->taps) sp->ops->taps(sp, x, on);
}

void loom_spec_after_forward(loom_spec *sp, const step_plan *plan, const loom_fwd_row *rows) {
    if (sp->ops->after) sp->ops->after(sp, plan, rows);
}

int loom_spec_reads_target(const loom_spec *sp) { return sp->ops->after != NULL; }

int loom_spec_block(const loom_spec *sp) { return sp->dfl ? sp->dfl->block - 1 : 0; }
