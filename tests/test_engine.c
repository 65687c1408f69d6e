/* The engine: batched equals solo under every mix of budgets, chunk sizes
 * and arrivals; cancellation leaves the others untouched; preemption under
 * a small KV pool; nothing leaks; admission errors. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "engine/kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "load/safetensors.h"
#include "test.h"
#include "test_fixture.h"
#include "test_path.h"

#define NP TEST_FIXTURE_PROMPTS
#define NG 20

typedef test_fixture fixture;

static loom_request *submit(loom_engine *e, const int32_t *ids, int n, int max_tokens, int chunk) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = max_tokens;
    rp.ignore_eos = 1;
    rp.prefill_chunk = chunk;
    rp.logprobs = 0;
    loom_request *r = NULL;
    loom_status s = loom_engine_submit(e, &rp, &r);
    CHECKF(s == LOOM_OK, "submit: %s", loom_last_error());
    return r;
}

/* Reads every event; returns the finish reason. lps and cached (the final
 * event's cached prompt tokens, left alone on a timeout) may be NULL. */
static loom_finish drain_cached(loom_request *r, int32_t *toks, float *lps, int *n, int *cached) {
    *n = 0;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, 60000) != LOOM_OK) return LOOM_FINISH_ERROR;
        if (ev.finish != LOOM_FINISH_NONE) {
            if (cached) *cached = ev.n_cached;
            return ev.finish;
        }
        if (lps) lps[*n] = ev.logprob;
        toks[(*n)++] = ev.token;
    }
}

static loom_finish drain(loom_request *r, int32_t *toks, float *lps, int *n) {
    return drain_cached(r, toks, lps, n, NULL);
}

/* Waits until the engine is idle and checks every block is back. */
static void check_idle(loom_engine *e) {
    loom_engine_stats st;
    for (int i = 0; i < 2000; i++) {
        loom_engine_get_stats(e, &st);
        if (st.running == 0 && st.waiting == 0 && st.kv_blocks_free == st.kv_blocks_total) break;
        usleep(1000);
    }
    CHECKF(st.running == 0 && st.waiting == 0, "engine not idle: %d running %d waiting", st.running,
           st.waiting);
    CHECKF(st.kv_blocks_free == st.kv_blocks_total, "blocks leaked: %d of %d free",
           st.kv_blocks_free, st.kv_blocks_total);
}

static int same_tokens(const int32_t *a, const int32_t *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* Log-probabilities of the greedy tokens, solo through a context. */
static void solo_logprobs(fixture *f, int i, float *out) {
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = f->len[i] + NG;
    CHECK(loom_context_create(f->m, &cp, &c) == LOOM_OK);
    int V = loom_model_vocab_size(f->m);
    float *l = malloc(sizeof(float) * V);
    CHECK(loom_context_eval(c, f->ids[i], f->len[i], 0, l) == LOOM_OK);
    for (int t = 0; t < NG; t++) {
        double mx = l[0], sum = 0;
        for (int k = 1; k < V; k++) mx = test_max(mx, l[k]);
        for (int k = 0; k < V; k++) sum += exp(l[k] - mx);
        out[t] = (float)(l[f->greedy[i][t]] - mx - log(sum));
        CHECK(loom_context_eval(c, &f->greedy[i][t], 1, 0, l) == LOOM_OK);
    }
    free(l);
    loom_context_free(c);
}

static void batched_equals_solo(const char *dir) {
    fixture f;
    if (!test_fixture_load(dir, &f)) { CHECK(0); return; }
    float solo_lp[NP][NG];
    for (int i = 0; i < NP; i++) solo_logprobs(&f, i, solo_lp[i]);
    static const int budgets[] = {16, 64, 2048};
    static const int chunks[] = {1, 7, 64};
    for (size_t b = 0; b < LOOM_ARRAY_LEN(budgets); b++)
        for (size_t c = 0; c < LOOM_ARRAY_LEN(chunks); c++)
            for (int staggered = 0; staggered < 2; staggered++) {
                if (chunks[c] == 1 && budgets[b] == 2048 && staggered) continue;
                loom_engine_params ep = loom_engine_default_params();
                ep.max_batch_tokens = budgets[b];
                ep.max_seqs = 8;
                ep.n_ctx = 400;
                ep.prefill_chunk = chunks[c];
                loom_engine *e = NULL;
                CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
                if (!e) continue;
                loom_request *r[NP];
                int32_t toks[NP][NG + 1];
                float lps[NP][NG + 1];
                int n[NP];
                if (!staggered) {
                    for (int i = 0; i < NP; i++) r[i] = submit(e, f.ids[i], f.len[i], NG, 0);
                } else {
                    /* each request joins after the previous produced a token */
                    for (int i = 0; i < NP; i++) {
                        r[i] = submit(e, f.ids[NP - 1 - i], f.len[NP - 1 - i], NG, 0);
                        loom_event ev;
                        CHECK(loom_request_next(r[i], &ev, 60000) == LOOM_OK);
                        toks[i][0] = ev.token;
                        lps[i][0] = ev.logprob;
                    }
                }
                for (int i = 0; i < NP; i++) {
                    int p = staggered ? NP - 1 - i : i, off = staggered;
                    loom_finish fin = drain(r[i], toks[i] + off, lps[i] + off, &n[i]);
                    n[i] += off;
                    CHECK(fin == LOOM_FINISH_LENGTH);
                    CHECK_EQ_INT(n[i], NG);
                    int ok = n[i] == NG && same_tokens(toks[i], f.greedy[p], NG);
                    double worst = 0;
                    for (int t = 0; t < n[i] && t < NG; t++)
                        worst = test_max(worst, fabs(lps[i][t] - solo_lp[p][t]));
                    CHECKF(ok && worst < 1e-4, "%s budget %d chunk %d %s prompt %d: tokens %s, "
                           "logprob diff %g", dir, budgets[b], chunks[c],
                           staggered ? "staggered" : "together", p, ok ? "ok" : "DIFFER", worst);
                    loom_request_free(r[i]);
                }
                check_idle(e);
                loom_engine_free(e);
            }
    test_fixture_free(&f);
}

/* ---- prompt logprobs -------------------------------------------------------- */

#define PLP_TOP 5

/* What the prompt logprobs of one prompt must be: for each position p >= 1,
 * log_softmax of a context's logits at p - 1, at the token at p, and the
 * PLP_TOP best log-probabilities there. */
typedef struct plp_ref {
    int n, vocab;
    float *lp;       /* [n] (lp[0] unused) */
    float *all;      /* [n, vocab] log-probabilities at p - 1 (row 0 unused) */
    float *top;      /* [n, PLP_TOP] */
} plp_ref;

static void plp_ref_make(fixture *f, int i, plp_ref *ref) {
    int n = f->len[i], V = loom_model_vocab_size(f->m);
    *ref = (plp_ref){n, V, calloc((size_t)n, sizeof(float)), calloc((size_t)n * V, sizeof(float)),
                     calloc((size_t)n * PLP_TOP, sizeof(float))};
    float *l = malloc(sizeof(float) * (size_t)n * V);
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n + 1;
    CHECK(loom_context_create(f->m, &cp, &c) == LOOM_OK);
    CHECK(loom_context_eval(c, f->ids[i], n, 1, l) == LOOM_OK);
    for (int p = 1; p < n; p++) {
        const float *row = l + (size_t)(p - 1) * V;
        double mx = row[0], sum = 0;
        for (int k = 1; k < V; k++) mx = test_max(mx, row[k]);
        for (int k = 0; k < V; k++) sum += exp(row[k] - mx);
        float *a = ref->all + (size_t)p * V;
        for (int k = 0; k < V; k++) a[k] = (float)(row[k] - mx - log(sum));
        ref->lp[p] = a[f->ids[i][p]];
        float *t = ref->top + (size_t)p * PLP_TOP; /* the best PLP_TOP, in order */
        for (int k = 0; k < PLP_TOP; k++) t[k] = -INFINITY;
        for (int k = 0; k < V; k++)
            for (int j = 0; j < PLP_TOP; j++)
                if (a[k] > t[j]) {
                    memmove(t + j + 1, t + j, sizeof *t * (size_t)(PLP_TOP - 1 - j));
                    t[j] = a[k];
                    break;
                }
    }
    free(l);
    loom_context_free(c);
}

static void plp_ref_free(plp_ref *ref) {
    free(ref->lp);
    free(ref->all);
    free(ref->top);
}

static loom_request *submit_plp(loom_engine *e, fixture *f, int i, int top) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = f->ids[i];
    rp.n_prompt = f->len[i];
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.prompt_logprobs = top;
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    return r;
}

/* Drains a prompt-logprobs request of prompt i and checks every event
 * against ref: the prompt's tokens 1.. in order, before any generated one,
 * then the greedy tokens; nothing taken from the prefix cache. */
static void check_plp(loom_request *r, fixture *f, int i, const plp_ref *ref, const char *what) {
    int n_prompt = 0, n_gen = 0, order_ok = 1, tok_ok = 1, top_ok = 1, gen_ok = 1;
    double worst = 0;
    loom_event ev;
    for (;;) {
        if (loom_request_next(r, &ev, 60000) != LOOM_OK) {
            CHECKF(0, "%s: no event within 60 s", what);
            return;
        }
        if (ev.finish != LOOM_FINISH_NONE) break;
        if (!ev.prompt) {
            gen_ok &= n_gen < NG && ev.token == f->greedy[i][n_gen];
            n_gen++;
            continue;
        }
        int p = ++n_prompt;
        order_ok &= n_gen == 0;
        if (p >= ref->n) continue;
        tok_ok &= ev.token == f->ids[i][p];
        worst = test_max(worst, fabs(ev.logprob - ref->lp[p]));
        top_ok &= ev.n_top == PLP_TOP;
        for (int k = 0; k < ev.n_top && k < PLP_TOP; k++) {
            /* the k-th best value, and that of the token named (ties may swap ids) */
            worst = test_max(worst, fabs(ev.top_logprobs[k] - ref->top[(size_t)p * PLP_TOP + k]));
            worst = test_max(worst, fabs(ev.top_logprobs[k] - ref->all[(size_t)p * ref->vocab + ev.top_ids[k]]));
        }
    }
    CHECKF(ev.finish == LOOM_FINISH_LENGTH && ev.n_cached == 0, "%s: finish %d, %d cached", what,
           (int)ev.finish, ev.n_cached);
    CHECKF(n_prompt == ref->n - 1 && order_ok && tok_ok && top_ok && worst < 1e-4,
           "%s: %d prompt events of %d, order %s, tokens %s, top %s, worst diff %g", what, n_prompt,
           ref->n - 1, order_ok ? "ok" : "WRONG", tok_ok ? "ok" : "WRONG", top_ok ? "ok" : "WRONG", worst);
    CHECKF(n_gen == NG && gen_ok, "%s: generated %d tokens, %s", what, n_gen, gen_ok ? "greedy" : "NOT greedy");
}

/* Prompt logprobs are the model's however the prompt is cut (chunks, the
 * step budget, other such requests wanting the same buffer), though the
 * prefix cache holds the prompt, and across preemptions. */
static void prompt_logprobs(const char *dir, int preempt) {
    fixture f;
    if (!test_fixture_load(dir, &f)) { CHECK(0); return; }
    plp_ref ref[NP];
    for (int i = 0; i < NP; i++) plp_ref_make(&f, i, &ref[i]);
    static const struct { int budget, chunk; } cfg[] = {{2048, 0}, {2048, 7}, {16, 64}, {64, 0}};
    char what[160];
    for (size_t c = 0; c < LOOM_ARRAY_LEN(cfg); c++) {
        loom_engine_params ep = loom_engine_default_params();
        ep.max_batch_tokens = cfg[c].budget;
        ep.prefill_chunk = cfg[c].chunk;
        ep.max_seqs = 8;
        ep.n_ctx = 400;
        loom_engine *e = NULL;
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        if (!e) continue;
        /* the prefix cache gets prompt 3 first */
        int32_t toks[NG + 1];
        int n;
        loom_request *warm = submit(e, f.ids[3], f.len[3], NG, 0);
        CHECK(drain(warm, toks, NULL, &n) == LOOM_FINISH_LENGTH);
        loom_request_free(warm);
        loom_request *a = submit_plp(e, &f, 3, PLP_TOP), *b = submit_plp(e, &f, 1, PLP_TOP);
        loom_request *plain = submit(e, f.ids[1], f.len[1], NG, 0);
        snprintf(what, sizeof what, "%s budget %d chunk %d prompt 3", dir, cfg[c].budget, cfg[c].chunk);
        check_plp(a, &f, 3, &ref[3], what);
        snprintf(what, sizeof what, "%s budget %d chunk %d prompt 1", dir, cfg[c].budget, cfg[c].chunk);
        check_plp(b, &f, 1, &ref[1], what);
        CHECK(drain(plain, toks, NULL, &n) == LOOM_FINISH_LENGTH && n == NG && same_tokens(toks, f.greedy[1], NG));
        loom_request_free(a);
        loom_request_free(b);
        loom_request_free(plain);
        check_idle(e);
        loom_engine_free(e);
    }
    /* Preempted while prefilling, then recomputed: a request decoding for
     * long (admitted first, so never the newest) outgrows a pool that the
     * 300-token prompt's prefill (one token a step) fills. If that prompt
     * comes too late to be admitted before the pool is short, it waits
     * instead: then try again. */
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_memory = 22 * loom_kv_block_bytes(f.m->cfg.n_layers, loom_model_kv_dim(f.m), 16, LOOM_KV_F32);
    ep.max_batch_tokens = 2;
    ep.prefix_cache = 0;
    ep.n_ctx = 400;
    loom_engine *e = NULL;
    int preempted = 0;
    for (int attempt = 0; preempt && attempt < 5 && !preempted; attempt++) {
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        if (!e) break;
        loom_request *d = submit(e, f.ids[1], f.len[1], 300, 0);
        loom_event ev;
        CHECK(loom_request_next(d, &ev, 60000) == LOOM_OK && !ev.finish);
        loom_request *a = submit_plp(e, &f, 3, PLP_TOP);
        snprintf(what, sizeof what, "%s preempted while prefilling (attempt %d)", dir, attempt);
        check_plp(a, &f, 3, &ref[3], what);
        int32_t toks[301];
        int n;
        CHECK(drain(d, toks, NULL, &n) == LOOM_FINISH_LENGTH && n == 299);
        loom_request_free(a);
        loom_request_free(d);
        loom_engine_stats st;
        loom_engine_get_stats(e, &st);
        preempted = st.preemptions > 0;
        check_idle(e);
        if (!preempted) {
            loom_engine_free(e);
            e = NULL;
        }
    }
    CHECKF(preempted || !preempt, "%s: the prompt-logprobs request was never preempted", dir);
    if (!e) CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    /* out of range */
    loom_request_params rp = loom_request_default_params();
    rp.prompt = f.ids[0];
    rp.n_prompt = f.len[0];
    rp.prompt_logprobs = 21;
    loom_request *bad = NULL;
    if (e) CHECK(loom_engine_submit(e, &rp, &bad) == LOOM_ERR_INVALID_ARG && !bad);
    loom_engine_free(e);
    for (int i = 0; i < NP; i++) plp_ref_free(&ref[i]);
    test_fixture_free(&f);
}

static void cancellation(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    loom_engine_params ep = loom_engine_default_params();
    ep.max_batch_tokens = 32;
    ep.prefill_chunk = 7;
    ep.n_ctx = 400;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    enum { N = 8 };
    /* Requests 3 and 5 run to the end of the context unless cancelled. On
     * a loaded machine a cancel can still come after their last token:
     * then every token must have come, and the round runs again. */
    int landed = 0;
    for (int round = 0; round < 8 && !landed; round++) {
        loom_request *r[N];
        for (int i = 0; i < N; i++)
            r[i] = submit(e, f.ids[i % NP], f.len[i % NP], i == 3 || i == 5 ? 0 : NG, 0);
        /* request 3 (300-token prompt, 32-token budget) is still prefilling */
        loom_request_cancel(r[3]);
        /* request 5 is cancelled once it is decoding */
        loom_event ev;
        for (int k = 0; k < 3; k++) CHECK(loom_request_next(r[5], &ev, 60000) == LOOM_OK && !ev.finish);
        loom_request_cancel(r[5]);
        landed = 1;
        for (int i = 0; i < N; i++) {
            int32_t toks[400];
            int n;
            loom_finish fin = drain(r[i], toks, NULL, &n);
            if (i == 3 || i == 5) {
                int budget = ep.n_ctx - f.len[i % NP] - (i == 5 ? 3 : 0); /* 5's first 3 were read */
                CHECKF(fin == LOOM_FINISH_CANCELLED || (fin == LOOM_FINISH_LENGTH && n == budget),
                       "request %d: finish %d after %d of %d tokens", i, fin, n, budget);
                landed &= fin == LOOM_FINISH_CANCELLED;
            } else {
                CHECK(fin == LOOM_FINISH_LENGTH);
                CHECKF(n == NG && same_tokens(toks, f.greedy[i % NP], NG), "request %d changed", i);
            }
            loom_request_free(r[i]);
        }
    }
    CHECK(landed);
    /* freeing a handle mid-flight cancels it */
    loom_request *x = submit(e, f.ids[3], f.len[3], NG, 0);
    loom_request_free(x);
    check_idle(e);
    loom_engine_free(e);
    /* freeing the engine with work in flight cancels it (the same retry) */
    loom_finish fin = LOOM_FINISH_NONE;
    for (int round = 0; round < 8 && fin != LOOM_FINISH_CANCELLED; round++) {
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        loom_request *y = submit(e, f.ids[3], f.len[3], 0, 0);
        loom_engine_free(e);
        int32_t toks[400];
        int n;
        fin = drain(y, toks, NULL, &n);
        CHECKF(fin == LOOM_FINISH_CANCELLED || (fin == LOOM_FINISH_LENGTH && n == ep.n_ctx - f.len[3]),
               "engine freed: finish %d after %d tokens", fin, n);
        loom_request_free(y);
    }
    CHECK(fin == LOOM_FINISH_CANCELLED);
    test_fixture_free(&f);
}

static void preemption(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    /* qwen3-tiny: 3 layers x 64 KV dims x 16 tokens x K,V x f32 = 24 KiB a
     * block. 12 blocks admit four 45-token prompts (3 blocks each) but not
     * their growth to 65 tokens (5 blocks each). */
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_memory = 12 * 24576;
    ep.n_ctx = 400;
    loom_engine *e = NULL;
    /* without the prefix cache (which would share their first blocks), then
     * with it. The four must run at once to preempt; the engine starts on
     * the first while the others are submitted, so on a loaded machine it
     * can finish one before the last arrives: try again a few times. */
    for (int cache = 0; cache < 2; cache++) {
        ep.prefix_cache = cache;
        unsigned long long preempted = 0;
        for (int attempt = 0; attempt < 5 && (cache ? attempt < 1 : !preempted); attempt++) {
            if (attempt) loom_engine_free(e);
            CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
            loom_request *r[4];
            for (int i = 0; i < 4; i++) r[i] = submit(e, f.ids[2], f.len[2], NG, 0);
            for (int i = 0; i < 4; i++) {
                int32_t toks[NG + 1];
                int n;
                CHECK(drain(r[i], toks, NULL, &n) == LOOM_FINISH_LENGTH);
                CHECKF(n == NG && same_tokens(toks, f.greedy[2], NG), "preempted request %d differs", i);
                loom_request_free(r[i]);
            }
            loom_engine_stats st;
            loom_engine_get_stats(e, &st);
            preempted = st.preemptions;
            check_idle(e);
        }
        if (!cache) {
            CHECKF(preempted > 0, "expected preemptions in 5 tries, got %llu", preempted);
            loom_engine_free(e);
        }
    }
    /* a prompt larger than the whole pool is refused at submit */
    loom_request_params rp = loom_request_default_params();
    rp.prompt = f.ids[3];
    rp.n_prompt = f.len[3];
    loom_request *big = NULL;
    CHECK(loom_engine_submit(e, &rp, &big) == LOOM_ERR_RANGE && big == NULL);
    CHECK(strstr(loom_last_error(), "KV pool") != NULL);
    loom_engine_free(e);

    /* admission errors; the engine keeps serving */
    ep = loom_engine_default_params();
    ep.n_ctx = 100;
    ep.max_seqs = 1;
    ep.max_queue = 1;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    rp = loom_request_default_params();
    rp.prompt = f.ids[3];
    rp.n_prompt = f.len[3];
    CHECK(loom_engine_submit(e, &rp, &big) == LOOM_ERR_RANGE);
    CHECK(strstr(loom_last_error(), "context holds 100") != NULL);
    int32_t bad[2] = {1, 1 << 20};
    rp.prompt = bad;
    rp.n_prompt = 2;
    CHECK(loom_engine_submit(e, &rp, &big) == LOOM_ERR_RANGE);
    CHECK(strstr(loom_last_error(), "out of range") != NULL);
    rp.n_prompt = 0;
    CHECK(loom_engine_submit(e, &rp, &big) == LOOM_ERR_INVALID_ARG);
    rp = loom_request_default_params();
    rp.prompt = f.ids[1];
    rp.n_prompt = f.len[1];
    rp.sampling.top_p = 2;
    CHECK(loom_engine_submit(e, &rp, &big) == LOOM_ERR_INVALID_ARG);
    CHECK(strstr(loom_last_error(), "top_p") != NULL);
    /* queue limit: one running, one waiting, the next is refused */
    loom_request *a = submit(e, f.ids[1], f.len[1], 60, 0), *b = NULL, *c = NULL;
    loom_event ev;
    CHECK(loom_request_next(a, &ev, 60000) == LOOM_OK); /* a is running */
    loom_engine_stats st2;
    for (int i = 0; i < 1000; i++) {
        loom_engine_get_stats(e, &st2);
        if (st2.waiting == 0) break;
        usleep(1000);
    }
    rp = loom_request_default_params();
    rp.prompt = f.ids[1];
    rp.n_prompt = f.len[1];
    CHECK(loom_engine_submit(e, &rp, &b) == LOOM_OK);
    CHECK(loom_engine_submit(e, &rp, &c) == LOOM_ERR_BUSY && c == NULL);
    loom_request_free(a);
    loom_request_free(b);
    check_idle(e);
    /* still serving */
    loom_request *d = submit(e, f.ids[2], f.len[2], NG, 0);
    int32_t toks[NG + 1];
    int n;
    CHECK(drain(d, toks, NULL, &n) == LOOM_FINISH_LENGTH && same_tokens(toks, f.greedy[2], NG));
    loom_request_free(d);
    check_idle(e);
    loom_engine_free(e);
    test_fixture_free(&f);
}

/* Cached equals uncached: a prompt served from the prefix cache gives the
 * reference tokens and the solo log-probabilities. */
static void prefix_cache_expect(const char *dir, const int want_cached[3]);
static void prefix_cache(const char *dir) {
    static const int want[3] = {0, 96, (300 - 1) / 16 * 16};
    prefix_cache_expect(dir, want);
}

/* Models with linear-attention layers resume only from saved states: none
 * at 96 tokens (under 256), one at the last full block of a prompt. */
static void prefix_cache_hybrid(const char *dir) {
    static const int want[3] = {0, 0, (300 - 1) / 16 * 16};
    prefix_cache_expect(dir, want);
}

static void prefix_cache_expect(const char *dir, const int want_cached[3]) {
    fixture f;
    if (!test_fixture_load(dir, &f)) { CHECK(0); return; }
    float solo[NG];
    solo_logprobs(&f, 3, solo);
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.max_batch_tokens = 64;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    int L = f.len[3];
    /* a prompt sharing the first 100 tokens of prompt 3, then prompt 3 */
    int32_t *mixed = malloc(sizeof(int32_t) * (size_t)L);
    memcpy(mixed, f.ids[3], sizeof(int32_t) * (size_t)L);
    for (int i = 100; i < L; i++) mixed[i] = (mixed[i] + 1) % loom_model_vocab_size(f.m);
    for (int round = 0; round < 3; round++) {
        const int32_t *ids = round == 0 ? mixed : f.ids[3];
        loom_request *r = submit(e, ids, L, NG, 0);
        int32_t toks[NG + 1];
        float lps[NG + 1];
        int n = 0, cached = -1;
        drain_cached(r, toks, lps, &n, &cached);
        int want = want_cached[round];
        CHECKF(cached == want, "%s round %d: %d cached tokens, want %d", dir, round, cached, want);
        if (round > 0) {
            double worst = test_max_abs_err(lps, solo, (size_t)LOOM_MIN(n, NG));
            CHECKF(n == NG && same_tokens(toks, f.greedy[3], NG) && worst < 1e-5,
                   "%s round %d: cached run differs (logprob diff %g)", dir, round, worst);
        }
        loom_request_free(r);
    }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_cached > 0 && st.cache_hit_tokens > 0);
    check_idle(e);
    free(mixed);
    loom_engine_free(e);
    test_fixture_free(&f);
}

/* Runs prompt 3 once on a fresh engine over dir; returns cached tokens. */
static int run_disk(fixture *f, const char *dir, const float *solo, loom_engine_stats *st);

/* A hybrid model's snapshot survives a restart through the disk tier. */
static void disk_tier_hybrid(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3.5-tiny-hybrid", &f)) { CHECK(0); return; }
    float solo[NG];
    solo_logprobs(&f, 3, solo);
    char dir[] = "/tmp/loom-test-kvdisk-hybrid-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    loom_engine_stats st;
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), 0);
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), (f.len[3] - 1) / 16 * 16);
    CHECK(st.disk_reads > 0);
    /* a damaged snapshot is refused: the run starts cold and stays right */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cd %s && for f in *.lks; do printf '\\377' | dd of=$f bs=1 seek=100 "
             "conv=notrunc 2>/dev/null; done", dir);
    CHECK(system(cmd) == 0);
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), 0);
    CHECK(st.disk_bad_files >= 1);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    test_fixture_free(&f);
}

static int disk_zstd; /* zstd level of run_disk's engines */

static int run_disk(fixture *f, const char *dir, const float *solo, loom_engine_stats *st) {
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.prefix_cache_disk_zstd = disk_zstd;
    ep.prefix_cache_dir = dir;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f->m, &ep, &e) == LOOM_OK);
    if (!e) return -1;
    loom_request *r = submit(e, f->ids[3], f->len[3], NG, 0);
    int32_t toks[NG + 1];
    float lps[NG + 1];
    int n = 0, cached = -1;
    drain_cached(r, toks, lps, &n, &cached);
    double worst = test_max_abs_err(lps, solo, (size_t)LOOM_MIN(n, NG));
    CHECKF(n == NG && same_tokens(toks, f->greedy[3], NG) && worst < 1e-5,
           "disk-tier run differs (logprob diff %g, %d cached)", worst, cached);
    loom_request_free(r);
    check_idle(e);
    loom_engine_get_stats(e, st);
    loom_engine_free(e);
    return cached;
}

static void disk_tier(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    float solo[NG];
    solo_logprobs(&f, 3, solo);
    char dir[] = "/tmp/loom-test-kvdisk-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    loom_engine_stats st;
    int full = (f.len[3] - 1) / 16 * 16;
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), 0);     /* cold; spills at shutdown */
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), full);  /* after a restart: from disk */
    CHECK(st.disk_hit_tokens == (uint64_t)full && st.disk_reads > 0);
    /* a request cancelled while its blocks are read from disk leaves the
     * pool idle, and the next one still restores them (in a copy: the
     * runs spill what they generate, which the damage below must not see) */
    {
        char copy[64], cmd[160];
        snprintf(copy, sizeof copy, "%s-cancel", dir);
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", copy, dir, copy);
        CHECK(system(cmd) == 0);
        loom_engine_params ep = loom_engine_default_params();
        ep.n_ctx = 400;
        ep.prefix_cache_dir = copy;
        loom_engine *e = NULL;
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        for (int k = 0; e && k < 2; k++) {
            /* Runs to the end of the context, so the cancel lands unless
             * the whole request ran first on a loaded machine: then every
             * token must have come, and it tries again. */
            int budget = ep.n_ctx - f.len[3];
            loom_finish fin = LOOM_FINISH_NONE;
            for (int attempt = 0; attempt < 8 && fin != LOOM_FINISH_CANCELLED; attempt++) {
                loom_request *x = submit(e, f.ids[3], f.len[3], 0, 0);
                if (k) usleep(200);
                loom_request_cancel(x);
                int32_t toks[400];
                int n = 0;
                fin = drain(x, toks, NULL, &n);
                CHECKF(fin == LOOM_FINISH_CANCELLED || (fin == LOOM_FINISH_LENGTH && n == budget),
                       "cancelled restore: finish %d after %d of %d tokens", fin, n, budget);
                loom_request_free(x);
                check_idle(e);
            }
            CHECK(fin == LOOM_FINISH_CANCELLED);
        }
        if (e) {
            loom_request *x = submit(e, f.ids[3], f.len[3], NG, 0);
            int32_t toks[NG + 1];
            int n = 0;
            loom_finish fin = drain(x, toks, NULL, &n);
            CHECKF(fin == LOOM_FINISH_LENGTH && same_tokens(toks, f.greedy[3], NG),
                   "run after cancelled restores differs");
            loom_request_free(x);
            check_idle(e);
        }
        loom_engine_get_stats(e, &st);
        CHECK(st.disk_hit_tokens >= (uint64_t)full);
        loom_engine_free(e);
        snprintf(cmd, sizeof cmd, "rm -rf %s", copy);
        CHECK(system(cmd) == 0);
    }
    /* damage three files: a flipped byte, a truncation, a foreign version */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "cd %s && set -- $(ls *.lkv | sort) && "
             "printf '\\377' | dd of=$3 bs=1 seek=200 conv=notrunc 2>/dev/null && "
             "truncate -s 100 $5 && printf '\\002' | dd of=$7 bs=1 seek=8 conv=notrunc 2>/dev/null",
             dir);
    CHECK(system(cmd) == 0);
    int cached = run_disk(&f, dir, solo, &st);
    CHECKF(cached >= 0 && cached < full, "damaged files still hit: %d", cached);
    /* Each damaged file is found when its turn in the chain comes, deleted,
     * recomputed and written again: within three more runs all hit. */
    uint64_t bad = st.disk_bad_files;
    for (int i = 0; i < 3 && cached != full; i++) {
        cached = run_disk(&f, dir, solo, &st);
        bad += st.disk_bad_files;
    }
    CHECK_EQ_INT(cached, full);
    CHECK_EQ_INT(bad, 3);
    /* an unusable directory leaves the cache in memory */
    CHECK_EQ_INT(run_disk(&f, "/dev/null/kv", solo, &st), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    test_fixture_free(&f);
}

/* Traced requests write their spans as JSON lines; shared forwards carry
 * one work id on every request that took part. */
static void tracing(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    /* Whether the second request arrives while the first still prefills is
     * up to the scheduler of a busy machine: a few tries. */
    int shared = 0;
    for (int attempt = 0; attempt < 8 && !shared; attempt++) {
        char path[] = "/tmp/loom-test-trace-XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        close(fd);
        loom_engine_params ep = loom_engine_default_params();
        ep.n_ctx = 400;
        ep.max_batch_tokens = 64;
        ep.prefill_chunk = 32;
        ep.trace_file = path;
        loom_engine *e = NULL;
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        loom_request *r[2];
        for (int i = 0; i < 2; i++) {
            loom_request_params rp = loom_request_default_params();
            rp.prompt = f.ids[2 + i];
            rp.n_prompt = f.len[2 + i];
            rp.max_tokens = 5;
            rp.trace = 1;
            CHECK(loom_engine_submit(e, &rp, &r[i]) == LOOM_OK);
        }
        for (int i = 0; i < 2; i++) {
            int32_t toks[8];
            int n;
            CHECK(drain(r[i], toks, NULL, &n) == LOOM_FINISH_LENGTH);
            loom_request_free(r[i]);
        }
        loom_engine_free(e);
        char *text = NULL;
        CHECK(loom_read_file(path, &text, NULL) == LOOM_OK);
        int lines = 0, chunks = 0, decodes = 0, totals = 0, lookups = 0;
        uint64_t works[2][64];
        int n_works[2] = {0, 0};
        for (char *line = text, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            cJSON *j = cJSON_Parse(line);
            CHECKF(j != NULL, "trace line is not JSON: %.80s", line);
            if (!j) continue;
            const cJSON *spans = cJSON_GetObjectItem(j, "spans");
            CHECK(cJSON_IsArray(spans));
            for (const cJSON *sp = spans ? spans->child : NULL; sp; sp = sp->next) {
                const char *name = cJSON_GetObjectItem(sp, "name")->valuestring;
                chunks += !strcmp(name, "prefill.chunk");
                decodes += !strcmp(name, "decode.step");
                totals += !strcmp(name, "prefill.total");
                lookups += !strcmp(name, "cache.lookup_restore");
                CHECK(cJSON_GetObjectItem(sp, "dur_ms")->valuedouble >= 0);
                if (!strcmp(name, "prefill.forward") && lines < 2 && n_works[lines] < 64)
                    works[lines][n_works[lines]++] =
                        (uint64_t)cJSON_GetObjectItem(cJSON_GetObjectItem(sp, "attrs"), "workId")->valuedouble;
            }
            cJSON_Delete(j);
            lines++;
        }
        CHECK_EQ_INT(lines, 2);
        CHECK(chunks >= 2 + 10 && decodes == 2 * 4 && totals == 2 && lookups == 2);
        for (int a = 0; a < n_works[0]; a++)
            for (int b = 0; b < n_works[1]; b++) shared |= works[0][a] == works[1][b];
        free(text);
        unlink(path);
    }
    CHECKF(shared, "the two prefills never shared a forward in 8 tries");
    test_fixture_free(&f);
}

/* The spans of one request, from loom_request_trace_json after its final
 * event (NULL when that is not a JSON array). */
static cJSON *trace_of(loom_request *r) {
    char *text = loom_request_trace_json(r);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECKF(cJSON_IsArray(j), "trace is not a JSON array: %.80s", text ? text : "(null)");
    free(text);
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static int count_spans(const cJSON *spans, const char *name) {
    int n = 0;
    for (const cJSON *sp = spans ? spans->child : NULL; sp; sp = sp->next)
        n += !strcmp(cJSON_GetObjectItem(sp, "name")->valuestring, name);
    return n;
}

/* attrs[key] of the first span called name, or -1. */
static double span_attr(const cJSON *spans, const char *name, const char *key) {
    for (const cJSON *sp = spans ? spans->child : NULL; sp; sp = sp->next) {
        if (strcmp(cJSON_GetObjectItem(sp, "name")->valuestring, name)) continue;
        const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(sp, "attrs"), key);
        return cJSON_IsNumber(v) ? v->valuedouble : -1;
    }
    return -1;
}

/* A traced request records the seed's span names where their work happens,
 * with the mechanism on the ones the seed tags, durations >= 0 and every
 * chunk inside prefill.total; an untraced one records nothing; a second
 * run of the prompt shows its cache hit; a request whose first token ends
 * it still closes its prefill; a hybrid model's boundary snapshot is a
 * checkpoint. */
static void trace_spans(void) {
    static const char *prefill_names[] = {
        "cache.lookup_restore", "prefill.batch_setup", "prefill.row_sync", "prefill.chunk",
        "prefill.forward", "prefill.kv_maintenance", "prefill.evaluate", "prefill.complete",
        "prefill.total"};
    static const char *tagged[] = {"cache.lookup_restore", "prefill.batch_setup", "prefill.chunk",
                                   "prefill.total"};
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.prefill_chunk = 32;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    int L = f.len[3], chunks = (L + 31) / 32;
    for (int run = 0; run < 4; run++) {
        loom_request_params rp = loom_request_default_params();
        rp.prompt = f.ids[3];
        rp.n_prompt = L;
        rp.max_tokens = run == 3 ? 1 : 3;
        rp.ignore_eos = 1;
        rp.trace = run != 1; /* run 1 is untraced */
        loom_request *r = NULL;
        CHECK(loom_engine_submit(e, &rp, &r) == LOOM_OK);
        int32_t toks[4];
        int n = 0;
        CHECK(drain(r, toks, NULL, &n) == LOOM_FINISH_LENGTH);
        cJSON *spans = trace_of(r);
        loom_request_free(r);
        if (!spans) continue;
        if (run == 1) {
            CHECKF(cJSON_GetArraySize(spans) == 0, "an untraced request has %d spans",
                   cJSON_GetArraySize(spans));
            cJSON_Delete(spans);
            continue;
        }
        for (size_t k = 0; k < sizeof prefill_names / sizeof *prefill_names; k++)
            CHECKF(count_spans(spans, prefill_names[k]) > 0, "run %d: no %s span", run, prefill_names[k]);
        /* run 0 is cold: every chunk; runs 2 and 3 compute only the last block's tokens */
        int want_chunks = run == 0 ? chunks : 1;
        CHECK_EQ_INT(count_spans(spans, "prefill.chunk"), want_chunks);
        CHECK_EQ_INT(count_spans(spans, "prefill.forward"), want_chunks);
        CHECK_EQ_INT(count_spans(spans, "prefill.total"), 1);
        CHECK_EQ_INT(count_spans(spans, "decode.step"), rp.max_tokens - 1);
        CHECK_EQ_INT(count_spans(spans, "prefill.project") + count_spans(spans, "prefill.companion"), 0);
        int cached = (int)span_attr(spans, "cache.lookup_restore", "cachedTokens");
        CHECKF(run == 0 ? cached == 0 : cached == (L - 1) / 16 * 16, "run %d: %d cached tokens", run, cached);
        CHECK_EQ_INT((int)span_attr(spans, "prefill.total", "cachedTokens"), cached);
        CHECK_EQ_INT((int)span_attr(spans, "prefill.total", "promptTokens"), L);
        CHECK_EQ_INT((int)span_attr(spans, "prefill.chunk", "startToken"), cached);
        double t0 = 0, t1 = 0;
        for (const cJSON *sp = spans->child; sp; sp = sp->next) {
            const char *name = cJSON_GetObjectItem(sp, "name")->valuestring;
            const cJSON *mech = cJSON_GetObjectItem(cJSON_GetObjectItem(sp, "attrs"), "mechanism");
            int want_mech = 0;
            for (size_t k = 0; k < sizeof tagged / sizeof *tagged; k++) want_mech |= !strcmp(name, tagged[k]);
            CHECKF(want_mech ? cJSON_IsString(mech) && !strcmp(mech->valuestring, "continuous") : !mech,
                   "run %d: %s has mechanism %s", run, name, mech ? mech->valuestring : "(none)");
            double start = cJSON_GetObjectItem(sp, "start_ms")->valuedouble;
            double dur = cJSON_GetObjectItem(sp, "dur_ms")->valuedouble;
            CHECKF(start >= 0 && dur >= 0, "run %d: %s starts at %g ms for %g ms", run, name, start, dur);
            if (!strcmp(name, "prefill.total")) t0 = start, t1 = start + dur;
        }
        for (const cJSON *sp = spans->child; sp; sp = sp->next) {
            if (strcmp(cJSON_GetObjectItem(sp, "name")->valuestring, "prefill.chunk")) continue;
            double start = cJSON_GetObjectItem(sp, "start_ms")->valuedouble;
            double end = start + cJSON_GetObjectItem(sp, "dur_ms")->valuedouble;
            /* start and duration are each rounded to 1 us, so an end is off by up to 1 us
             * and two ends compare within 2 us */
            CHECKF(start >= t0 - 2.5e-3 && end <= t1 + 2.5e-3,
                   "run %d: chunk [%g, %g] ms outside prefill.total [%g, %g]", run, start, end, t0, t1);
        }
        cJSON_Delete(spans);
    }
    check_idle(e);
    loom_engine_free(e);
    test_fixture_free(&f);

    /* a state snapshot at the prompt's last full block (>= 256 tokens in) */
    if (!test_fixture_load("tests/fixtures/models/qwen3.5-tiny-hybrid", &f)) { CHECK(0); return; }
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    loom_request_params rp = loom_request_default_params();
    rp.prompt = f.ids[3];
    rp.n_prompt = f.len[3];
    rp.max_tokens = 2;
    rp.trace = 1;
    loom_request *r = NULL;
    CHECK(loom_engine_submit(e, &rp, &r) == LOOM_OK);
    int32_t toks[4];
    int n = 0;
    drain(r, toks, NULL, &n);
    cJSON *spans = trace_of(r);
    CHECK_EQ_INT(count_spans(spans, "prefill.checkpoint"), 1);
    cJSON_Delete(spans);
    loom_request_free(r);
    loom_engine_free(e);
    test_fixture_free(&f);
}

/* Every layer of mistral-tiny-swa slides over 32 tokens: a sequence
 * decoding at position 300+ holds only the blocks of its window. */
static void sliding_window_blocks(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/mistral-tiny-swa", &f)) { CHECK(0); return; }
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.prefix_cache = 0;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    loom_request *r = submit(e, f.ids[3], f.len[3], NG, 0);
    int32_t toks[NG + 1];
    int n = 0, worst = 0;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, 60000) != LOOM_OK || ev.finish) break;
        toks[n++] = ev.token;
        loom_engine_stats st;
        loom_engine_get_stats(e, &st);
        if (n > 2 && st.kv_blocks_total - st.kv_blocks_free > worst)
            worst = st.kv_blocks_total - st.kv_blocks_free;
    }
    CHECK(n == NG && same_tokens(toks, f.greedy[3], NG));
    CHECKF(worst <= 4, "%d blocks held while decoding with a 32-token window", worst);
    loom_request_free(r);
    check_idle(e);
    loom_engine_free(e);
    test_fixture_free(&f);
}

/* 16-bit and quantized KV: logits stay close to the f32 reference, and
 * the engine's greedy tokens match the reference on the fixtures (16-bit
 * and 8-bit). */
static void kv_lossy(const char *dir) {
    fixture f;
    if (!test_fixture_load(dir, &f)) { CHECK(0); return; }
    static const loom_kv_type types[] = {LOOM_KV_F16, LOOM_KV_BF16, LOOM_KV_Q8, LOOM_KV_Q4};
    static const double tol[] = {1e-3, 1e-2, 2e-2, 2.5e-1};
    /* 4-bit on random weights is only bounded in logits; its greedy
     * tokens are checked on the trained model (kv_q4_greedy). */
    static const int min_same[] = {NP, NP, NP, 0};
    int V = loom_model_vocab_size(f.m);
    for (int k = 0; k < 4; k++) {
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = 400;
        cp.kv_type = types[k];
        loom_context *c = NULL;
        CHECK(loom_context_create(f.m, &cp, &c) == LOOM_OK);
        char name[64];
        double worst = 0;
        for (int i = 0; i < NP; i++) {
            snprintf(name, sizeof name, "prompt.%d.logits", i);
            const float *ref = loom_st_find(f.ref, name)->data;
            float *got = malloc(sizeof(float) * (size_t)f.len[i] * V);
            loom_context_truncate(c, 0);
            CHECK(loom_context_eval(c, f.ids[i], f.len[i], 1, got) == LOOM_OK);
            worst = test_max(worst, test_rel_err(got, ref, (size_t)f.len[i] * V));
            free(got);
        }
        CHECKF(worst < tol[k], "%s kv type %d: rel err %g", dir, (int)types[k], worst);
        fprintf(stderr, "%s kv type %d: max rel err %.2g\n", dir, (int)types[k], worst);
        loom_context_free(c);
        loom_engine_params ep = loom_engine_default_params();
        ep.n_ctx = 400;
        ep.kv_type = types[k];
        loom_engine *e = NULL;
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        loom_request *r[NP];
        for (int i = 0; i < NP; i++) r[i] = submit(e, f.ids[i], f.len[i], NG, 0);
        int same = 0;
        for (int i = 0; i < NP; i++) {
            int32_t toks[NG + 1];
            int n;
            CHECK(drain(r[i], toks, NULL, &n) == LOOM_FINISH_LENGTH);
            same += n == NG && same_tokens(toks, f.greedy[i], NG);
            loom_request_free(r[i]);
        }
        fprintf(stderr, "%s kv type %d: %d of %d greedy continuations identical\n", dir, (int)types[k], same, NP);
        CHECK(same >= min_same[k]);
        check_idle(e);
        loom_engine_free(e);
    }
    test_fixture_free(&f);
}


/* The KV row codec, apart from any model. Quantized rows round each value
 * to the nearest level of its group against the stored f16 scale and bias:
 * groups whose scale and bias are exact in f16 read back as the nearest
 * level bit for bit (a fraction under half a step rounds down, over half
 * up), and random rows stay within half a step (of the stored scale) with
 * a mean error near a quarter step; truncation would reach a whole step
 * and average half. 16-bit rows round to nearest: within 2^-11 (f16) and
 * 2^-8 (bf16) of each value. */
static void kv_codec(void) {
    enum { D = 128, G = 64 }; /* the pool's groups: 64 values */
    static const loom_kv_type types[] = {LOOM_KV_Q8, LOOM_KV_Q4, LOOM_KV_F16, LOOM_KV_BF16};
    static const double fracs[] = {0.1, 0.3, 0.45, 0.55, 0.7, 0.9};
    unsigned long long seed = 0x5eed;
    for (int k = 0; k < 4; k++) {
        loom_kv_type t = types[k];
        loom_kv_pool *p = NULL;
        CHECK(loom_kv_pool_create(1, D, 16, 1, t, &p) == LOOM_OK);
        if (!p) continue;
        void *row = calloc(1, loom_kv_row_bytes(t, D));
        float x[D], tmp[D], want[D];
        const float *y;
        if (t == LOOM_KV_Q8 || t == LOOM_KV_Q4) {
            int levels = t == LOOM_KV_Q8 ? 255 : 15;
            /* group 0 from 0, group 1 from -2, in steps of 1/64: lo and hi
             * set the step exactly, the rest sit a fraction past a level */
            const float s = 1.0f / 64;
            for (int g = 0; g < D / G; g++) {
                float b = g ? -2.0f : 0.0f;
                for (int i = 0; i < G; i++) {
                    int lv = i == 0 ? 0 : i == 1 ? levels : (i * 7) % levels;
                    double fr = i < 2 ? 0 : fracs[i % 6];
                    x[g * G + i] = b + s * (float)(lv + fr);
                    want[g * G + i] = b + s * (float)(lv + (fr > 0.5));
                }
            }
            loom_kv_store_row(&p->lay, row, x, D);
            y = loom_kv_load(&p->lay, row, 0, D, tmp);
            int bad = 0;
            for (int i = 0; i < D; i++) bad += y[i] != want[i];
            CHECKF(bad == 0, "kv %s codec: %d of %d exact-grid values not at the nearest level", loom_kv_type_name(t),
                   bad, D);
            /* random rows: error over the group's step */
            double worst = 0, sum = 0;
            int n = 0;
            for (int r = 0; r < 64; r++) {
                for (int i = 0; i < D; i++) x[i] = test_rand_f(&seed) * (float)(1 + r % 4);
                loom_kv_store_row(&p->lay, row, x, D);
                y = loom_kv_load(&p->lay, row, 0, D, tmp);
                for (int g = 0; g < D / G; g++) {
                    float lo = x[g * G], hi = lo;
                    for (int i = 1; i < G; i++) {
                        lo = x[g * G + i] < lo ? x[g * G + i] : lo;
                        hi = x[g * G + i] > hi ? x[g * G + i] : hi;
                    }
                    double step = ((double)hi - lo) / levels;
                    for (int i = g * G; i < (g + 1) * G; i++) {
                        double e = fabs((double)y[i] - x[i]) / step;
                        worst = test_max(worst, e);
                        sum += e, n++;
                    }
                }
            }
            /* the stored scale is within 2^-11 of the step */
            CHECKF(worst <= 0.5 * (1 + 1e-3), "kv %s codec: max error %.3f steps (nearest level: 0.5)",
                   loom_kv_type_name(t), worst);
            CHECKF(sum / n > 0.2 && sum / n < 0.3, "kv %s codec: mean error %.3f steps (nearest level: 0.25)",
                   loom_kv_type_name(t), sum / n);
            fprintf(stderr, "kv %s codec: max error %.5f steps, mean %.4f\n", loom_kv_type_name(t), worst, sum / n);
        } else {
            double ulp = t == LOOM_KV_F16 ? 1.0 / 2048 : 1.0 / 256, worst = 0;
            for (int r = 0; r < 64; r++) {
                for (int i = 0; i < D; i++) x[i] = test_rand_f(&seed) * (float)(1 + r % 4);
                loom_kv_store_row(&p->lay, row, x, D);
                y = loom_kv_load(&p->lay, row, 0, D, tmp);
                for (int i = 0; i < D; i++)
                    if (fabs(x[i]) > 1e-3) worst = test_max(worst, fabs((double)y[i] - x[i]) / fabs(x[i]));
            }
            CHECKF(worst <= ulp * (1 + 1e-6), "kv %s codec: relative error %.3g, rounding to nearest gives at most %.3g",
                   loom_kv_type_name(t), worst, ulp);
        }
        free(row);
        loom_kv_pool_free(p);
    }
}

/* The engine's greedy pick with KV type t after the prompt ids[0, n). */
static int32_t engine_pick(loom_engine *e, const int32_t *ids, int n) {
    loom_request *r = submit(e, ids, n, 1, 0);
    int32_t tok[2] = {-1, -1};
    int k = 0;
    if (r && drain(r, tok, NULL, &k) != LOOM_FINISH_LENGTH) tok[0] = -1;
    loom_request_free(r);
    return tok[0];
}

/* 4-bit KV on the trained model. Along the reference's greedy path every
 * step's logits stay within Q4_TOL of f32 KV's (pycoder-16m measured
 * 1.27, its largest logits near 20); so where the f32 lead of the best
 * token over the second is above 2 Q4_TOL, no such rounding can change
 * the pick, and the engine with q4 KV must pick the reference's token
 * there, fed the path up to that step. Its own greedy continuation must
 * be the reference's up to the first step with a smaller lead. */
#define Q4_TOL 2.0
#define Q4_NG 32
static void kv_q4_greedy(void) {
    const char *dir = "tests/fixtures/trained/pycoder-16m";
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    loom_model *m = NULL;
    if (loom_st_open(path, &ref) || loom_model_load(dir, NULL, &m)) {
        CHECKF(0, "%s: %s", dir, loom_last_error());
        loom_st_close(ref);
        return;
    }
    int V = loom_model_vocab_size(m), safe = 0;
    float *lf = malloc(sizeof(float) * Q4_NG * V), *lq = malloc(sizeof(float) * Q4_NG * V);
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 128;
    ep.kv_type = LOOM_KV_Q4;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(m, &ep, &e) == LOOM_OK);
    for (int i = 0; i < 3 && e; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *ti = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.greedy", i);
        const loom_st_tensor *tg = loom_st_find(ref, name);
        CHECK(ti && tg && tg->shape[0] >= Q4_NG);
        if (!ti || !tg || tg->shape[0] < Q4_NG) continue;
        const int32_t *gr = tg->data;
        int L = (int)ti->shape[0];
        int32_t seq[128];
        memcpy(seq, ti->data, sizeof(int32_t) * (size_t)L);
        memcpy(seq + L, gr, sizeof(int32_t) * Q4_NG);
        CHECK(test_path_logits(m, LOOM_KV_F32, seq, L, gr, Q4_NG, lf));
        CHECK(test_path_logits(m, LOOM_KV_Q4, seq, L, gr, Q4_NG, lq));
        int first_close = Q4_NG, n_safe = 0, n_picked = 0;
        double err = 0;
        for (int t = 0; t < Q4_NG; t++) {
            const float *f = lf + (size_t)t * V;
            CHECKF(loom_argmax(f, V) == gr[t], "prompt %d step %d: f32 KV leaves the reference path", i, t);
            err = test_max(err, test_max_abs_err(lq + (size_t)t * V, f, (size_t)V));
            if (test_top2_margin(f, V) <= 2 * Q4_TOL) {
                if (first_close == Q4_NG) first_close = t;
                continue;
            }
            int32_t got = engine_pick(e, seq, L + t);
            CHECKF(got == gr[t], "prompt %d step %d: q4 KV picks %d, the reference %d (f32 lead %.2f)", i, t,
                   (int)got, (int)gr[t], test_top2_margin(f, V));
            n_safe++;
            n_picked += got == gr[t];
        }
        CHECKF(err <= Q4_TOL, "prompt %d: q4 KV logits %.3g from f32 KV's (bound %g)", i, err, Q4_TOL);
        loom_request *r = submit(e, seq, L, Q4_NG, 0);
        int32_t toks[Q4_NG + 1];
        int n = 0, same = 0;
        CHECK(drain(r, toks, NULL, &n) == LOOM_FINISH_LENGTH && n == Q4_NG);
        loom_request_free(r);
        while (same < n && toks[same] == gr[same]) same++;
        CHECKF(same >= first_close, "prompt %d: q4 KV greedy leaves the reference at token %d, before the first "
               "close lead (token %d)", i, same, first_close);
        fprintf(stderr, "%s q4 KV prompt %d: logits within %.3g of f32 KV; the reference's pick at %d of %d "
                "steps with leads above %g; greedy the reference's for %d of %d tokens\n", dir, i, err, n_picked,
                n_safe, 2 * Q4_TOL, same, Q4_NG);
        safe += n_safe;
    }
    /* enough steps with clear leads to mean something (30 measured) */
    CHECKF(safe >= 24, "only %d steps with leads above %g", safe, 2 * Q4_TOL);
    if (e) check_idle(e);
    loom_engine_free(e);
    free(lf);
    free(lq);
    loom_model_free(m);
    loom_st_close(ref);
}

/* ---- sessions -------------------------------------------------------------- */

#define NTOP 5

/* Greedy tokens and the log-probabilities of the NTOP best tokens at each
 * step, cold through a context. */
static void cold_run(fixture *f, const int32_t *ids, int n, int32_t *toks, float (*lp)[NTOP]) {
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n + NG + 1;
    CHECK(loom_context_create(f->m, &cp, &c) == LOOM_OK);
    int V = loom_model_vocab_size(f->m);
    float *l = malloc(sizeof(float) * V);
    CHECK(loom_context_eval(c, ids, n, 0, l) == LOOM_OK);
    for (int t = 0; t < NG; t++) {
        double mx = l[0], sum = 0;
        for (int k = 1; k < V; k++) mx = test_max(mx, l[k]);
        for (int k = 0; k < V; k++) sum += exp(l[k] - mx);
        for (int j = 0; j < NTOP; j++) { /* j-th best, ties to the lower id */
            int best = 0;
            for (int k = 1; k < V; k++)
                if (l[k] > l[best]) best = k;
            lp[t][j] = (float)(l[best] - mx - log(sum));
            if (j == 0) toks[t] = best;
            l[best] = -INFINITY;
        }
        CHECK(loom_context_eval(c, &toks[t], 1, 0, l) == LOOM_OK);
    }
    free(l);
    loom_context_free(c);
}

/* Runs a greedy request; fills tokens, top log-probabilities, cached count. */
static loom_finish run_session(loom_engine *e, const int32_t *ids, int n, const char *save,
                               const char *resume, int32_t *toks, float (*lp)[NTOP], int *cached) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.logprobs = NTOP;
    rp.save_id = save;
    rp.resume_id = resume;
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    if (!r) return LOOM_FINISH_ERROR;
    int k = 0;
    loom_finish fin = LOOM_FINISH_ERROR;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, 60000) != LOOM_OK) break;
        if (ev.finish) {
            fin = ev.finish;
            *cached = ev.n_cached;
            break;
        }
        if (k < NG) {
            toks[k] = ev.token;
            for (int j = 0; j < NTOP; j++) lp[k][j] = ev.top_logprobs[j];
        }
        k++;
    }
    loom_request_free(r);
    return k == NG ? fin : LOOM_FINISH_ERROR;
}

/* Stats once the engine has published the step that finished the last
 * request (events arrive before the step's counters). */
static void settled_stats(loom_engine *e, loom_engine_stats *st) {
    for (int i = 0; i < 2000; i++) {
        loom_engine_get_stats(e, st);
        if (st->running == 0 && st->waiting == 0) return;
        usleep(1000);
    }
}

static double worst_diff(float (*a)[NTOP], float (*b)[NTOP]) {
    double w = 0;
    for (int t = 0; t < NG; t++)
        for (int j = 0; j < NTOP; j++) w = test_max(w, fabs(a[t][j] - b[t][j]));
    return w;
}

/* A request continuing a finished one computes only its new tokens and
 * gives what a cold run of the whole prompt gives; a prompt that strays
 * from the session resumes up to where it strays (dense) or not at all
 * (recurrent state), an evicted session falls back, a cancelled resume
 * leaves the pool idle. */
static void sessions(const char *dir) {
    fixture f;
    if (!test_fixture_load(dir, &f)) { CHECK(0); return; }
    int stateful = strstr(dir, "hybrid") != NULL;
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.max_batch_tokens = 64;
    /* a pool of 32 blocks: the two sessions (15) and a 300-token prompt (20)
     * do not fit together (but for sliding windows, which drop blocks) */
    int swa = strstr(dir, "swa") != NULL;
    ep.kv_memory = loom_kv_block_bytes(f.m->cfg.n_layers, loom_model_kv_dim(f.m), 16, LOOM_KV_F32) * 32;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    if (!e) { test_fixture_free(&f); return; }
    int32_t g1[NG], toks[NG], cold[NG];
    float lp1[NG][NTOP], lp[NG][NTOP], lpc[NG][NTOP];
    int cached = -1, A = 150;
    /* turn 1: 150 prompt tokens, 20 generated; 169 end up in KV */
    CHECK(run_session(e, f.ids[3], A, "r1", NULL, g1, lp1, &cached) == LOOM_FINISH_LENGTH);
    loom_engine_stats st0, st1;
    settled_stats(e, &st0);
    CHECK_EQ_INT(st0.sessions, 1);
    /* turn 2: the whole of turn 1, then 30 new tokens */
    int32_t next[220];
    memcpy(next, f.ids[3], sizeof(int32_t) * A);
    memcpy(next + A, g1, sizeof(int32_t) * NG);
    memcpy(next + A + NG, f.ids[2], sizeof(int32_t) * 30);
    int n2 = A + NG + 30, kept = A + NG - 1;
    cold_run(&f, next, n2, cold, lpc);
    CHECK(run_session(e, next, n2, "r2", "r1", toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st1);
    CHECKF(cached == kept, "%s: %d cached tokens, want %d", dir, cached, kept);
    CHECKF(st1.prefill_tokens - st0.prefill_tokens == (uint64_t)(n2 - kept),
           "%s: %llu tokens prefilled, want %d", dir,
           (unsigned long long)(st1.prefill_tokens - st0.prefill_tokens), n2 - kept);
    CHECK_EQ_INT(st1.session_hits, 1);
    CHECKF(same_tokens(toks, cold, NG) && worst_diff(lp, lpc) < 1e-5,
           "%s: continued run differs from cold (logprob diff %g)", dir, worst_diff(lp, lpc));
    /* a prompt that strays 10 tokens into turn 1's output */
    next[A + 10] = (next[A + 10] + 1) % loom_model_vocab_size(f.m);
    cold_run(&f, next, n2, cold, lpc);
    CHECK(run_session(e, next, n2, NULL, "r1", toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st0);
    if (stateful) {
        CHECK_EQ_INT(st0.session_misses, 1);
        CHECKF(cached == 0, "%s: strayed prompt resumed %d tokens", dir, cached);
    } else {
        CHECK_EQ_INT(st0.session_hits, 2);
        CHECK_EQ_INT(cached, A + 10);
    }
    CHECKF(same_tokens(toks, cold, NG) && worst_diff(lp, lpc) < 1e-5,
           "%s: strayed run differs from cold (logprob diff %g)", dir, worst_diff(lp, lpc));
    /* cancelled right after submit (before or after its restore): the
     * pool is idle again and the session is still there */
    next[A + 10] = g1[10];
    loom_request_params rp = loom_request_default_params();
    rp.prompt = next;
    rp.n_prompt = n2;
    rp.resume_id = "r1";
    loom_request *x = NULL;
    CHECK(loom_engine_submit(e, &rp, &x) == LOOM_OK);
    loom_request_cancel(x);
    loom_request_free(x);
    check_idle(e);
    settled_stats(e, &st0);
    CHECK_EQ_INT(st0.sessions, 2);
    /* a 300-token prompt sharing nothing needs the blocks both sessions
     * hold: they are evicted */
    int32_t other[300];
    for (int i = 0; i < 300; i++) other[i] = (f.ids[3][i] + 7) % loom_model_vocab_size(f.m);
    CHECK(run_session(e, other, 300, NULL, NULL, toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st0);
    if (swa) loom_engine_free(e); /* the sessions are gone with the engine */
    if (swa) CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    else CHECKF(st0.sessions < 2 && st0.session_evictions > 0, "%s: %d sessions, %llu evicted", dir,
                st0.sessions, (unsigned long long)st0.session_evictions);
    cold_run(&f, next, n2, cold, lpc);
    settled_stats(e, &st0);
    uint64_t misses = st0.session_misses;
    int gone = st0.sessions == 0;
    CHECK(run_session(e, next, n2, NULL, "r1", toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st0);
    if (gone) CHECK_EQ_INT(st0.session_misses, misses + 1);
    CHECKF(same_tokens(toks, cold, NG) && worst_diff(lp, lpc) < 1e-5,
           "%s: run after eviction differs from cold (logprob diff %g)", dir, worst_diff(lp, lpc));
    check_idle(e);
    loom_engine_free(e);
    test_fixture_free(&f);
}

/* ---- per-layer KV (kv_config.json) ------------------------------------------- */

static char kvc_dir[] = "/tmp/loom-test-kvconfig-XXXXXX";

/* Writes text to a file in kvc_dir; returns its path (static buffer). */
static const char *kvc_file(const char *name, const char *text) {
    static char path[4][256];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 256, "%s/%s", kvc_dir, name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

/* All-position logits of the fixture's prompts through a context. */
static float *kvc_logits(fixture *f, loom_kv_type type, const char *config, size_t *n) {
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = 400;
    cp.kv_type = type;
    cp.kv_config = config;
    loom_context *c = NULL;
    loom_status s = loom_context_create(f->m, &cp, &c);
    CHECKF(s == LOOM_OK, "context: %s", loom_last_error());
    if (s) return NULL;
    int V = loom_model_vocab_size(f->m);
    size_t total = 0;
    for (int i = 0; i < NP; i++) total += (size_t)f->len[i] * V;
    float *out = malloc(sizeof(float) * total), *at = out;
    for (int i = 0; i < NP; i++) {
        loom_context_truncate(c, 0);
        CHECK(loom_context_eval(c, f->ids[i], f->len[i], 1, at) == LOOM_OK);
        at += (size_t)f->len[i] * V;
    }
    loom_context_free(c);
    *n = total;
    return out;
}

static double mean_sq_err(const float *a, const float *ref, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e += (double)(a[i] - ref[i]) * (a[i] - ref[i]);
    return e / (double)n;
}

/* Cached tokens of prompt 3 on a fresh engine over a disk-tier directory. */
static int kvc_disk_run(fixture *f, loom_kv_type type, const char *config, const char *dir) {
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.kv_type = type;
    ep.kv_config = config;
    ep.prefix_cache_dir = dir;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f->m, &ep, &e) == LOOM_OK);
    if (!e) return -1;
    loom_request *r = submit(e, f->ids[3], f->len[3], 4, 0);
    int cached = -1;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, 60000) != LOOM_OK) break;
        if (ev.finish) {
            cached = ev.finish == LOOM_FINISH_LENGTH ? ev.n_cached : -1;
            break;
        }
    }
    loom_request_free(r);
    check_idle(e);
    loom_engine_free(e);
    return cached;
}

/* A config naming every layer equals the uniform type bitwise; a mixed one
 * lands between the uniform types it mixes; the namespace (and so the disk
 * tier) keeps layouts apart; bad files are refused naming the problem. */
static void kv_config(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    if (!mkdtemp(kvc_dir)) { CHECK(0); return; }
    const char *all8 = kvc_file("all8.json",
                                "[{\"layer_idx\": 0, \"bits\": 8, \"group_size\": 64},"
                                " {\"layer_idx\": 1, \"bits\": 8, \"group_size\": 64},"
                                " {\"layer_idx\": 2, \"bits\": 8, \"group_size\": 64}]");
    const char *all16 = kvc_file("all16.json", "[{\"layer_idx\": 2, \"bits\": 16}, {\"layer_idx\": 0, "
                                               "\"bits\": 16}, {\"layer_idx\": 1, \"bits\": 16}]");
    const char *mixed = kvc_file("mixed.json", "[{\"layer_idx\": 1, \"bits\": 4, \"group_size\": 64}]");
    size_t n = 0, n2 = 0;
    float *ref = kvc_logits(&f, LOOM_KV_F32, NULL, &n);
    float *q8 = kvc_logits(&f, LOOM_KV_Q8, NULL, &n2);
    float *q4 = kvc_logits(&f, LOOM_KV_Q4, NULL, &n2);
    float *f16 = kvc_logits(&f, LOOM_KV_F16, NULL, &n2);
    float *c8 = kvc_logits(&f, LOOM_KV_F32, all8, &n2);
    float *c16 = kvc_logits(&f, LOOM_KV_Q4, all16, &n2);
    float *cm = kvc_logits(&f, LOOM_KV_Q8, mixed, &n2);
    if (ref && q8 && q4 && f16 && c8 && c16 && cm) {
        CHECKF(!memcmp(c8, q8, sizeof(float) * n), "all-8 config differs from kv type q8");
        CHECKF(!memcmp(c16, f16, sizeof(float) * n), "all-16 config differs from kv type f16");
        double e8 = mean_sq_err(q8, ref, n), e4 = mean_sq_err(q4, ref, n), em = mean_sq_err(cm, ref, n);
        fprintf(stderr, "kv_config: mean squared logit error q8 %.3g, one layer of three q4 %.3g, q4 %.3g\n",
                e8, em, e4);
        CHECKF(e8 < em && em < e4, "mixed config error %g is not between q8 %g and q4 %g", em, e8, e4);
    }
    free(ref), free(q8), free(q4), free(f16), free(c8), free(c16), free(cm);

    /* the disk tier keeps layouts apart: a q8 run's blocks do not serve
     * the mixed layout, but serve the all-8 config (the same layout) */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/disk", kvc_dir);
    int full = (f.len[3] - 1) / 16 * 16;
    CHECK_EQ_INT(kvc_disk_run(&f, LOOM_KV_Q8, NULL, dir), 0);
    CHECK_EQ_INT(kvc_disk_run(&f, LOOM_KV_Q8, mixed, dir), 0);
    CHECK_EQ_INT(kvc_disk_run(&f, LOOM_KV_Q8, mixed, dir), full);
    CHECK_EQ_INT(kvc_disk_run(&f, LOOM_KV_F32, all8, dir), full);

    /* bad files: the error names the file, the entry and expected vs found */
    static const struct { const char *text, *want; loom_status st; } bad[] = {
        {"[{\"layer_idx\": 0, \"bits\": 8,}]", "not valid JSON", LOOM_ERR_FORMAT},
        {"{\"layer_idx\": 0}", "expected a JSON array", LOOM_ERR_FORMAT},
        {"[{\"layer_idx\": 3, \"bits\": 8}]", "layer_idx 3 is out of range (the model has 3 layers: 0..2)",
         LOOM_ERR_INVALID_ARG},
        {"[{\"layer_idx\": -1, \"bits\": 8}]", "layer_idx -1 is out of range", LOOM_ERR_INVALID_ARG},
        {"[{\"layer_idx\": 0, \"bits\": 3}]", "bits 3 is not supported (expected 4, 8, 16 or 32)",
         LOOM_ERR_INVALID_ARG},
        {"[{\"layer_idx\": 0, \"bits\": 4, \"group_size\": 48}]",
         "group_size 48 is not supported (expected 32, 64 or 128, dividing the KV row of 64 values)",
         LOOM_ERR_INVALID_ARG},
        {"[{\"layer_idx\": 0, \"bits\": 4, \"group_size\": 128}]", "group_size 128 is not supported",
         LOOM_ERR_INVALID_ARG},
        {"[{\"layer_idx\": 1, \"bits\": 8}, {\"layer_idx\": 1, \"bits\": 4}]",
         "entry 1: layer 1 is listed twice (first in entry 0)", LOOM_ERR_INVALID_ARG},
        {"[{\"layer\": 1, \"bits\": 8}]", "unknown key \"layer\"", LOOM_ERR_FORMAT},
        {"[{\"layer_idx\": 1}]", "found no \"bits\"", LOOM_ERR_FORMAT},
        {"[{\"layer_idx\": \"1\", \"bits\": 8}]", "layer_idx: expected an integer, found a string",
         LOOM_ERR_FORMAT},
        {"[{\"layer_idx\": 1, \"bits\": 8.5}]", "bits: expected an integer, found 8.5", LOOM_ERR_FORMAT},
        {"[7]", "entry 0: expected an object, found a number", LOOM_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *path = kvc_file("bad.json", bad[i].text);
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = 64;
        cp.kv_config = path;
        loom_context *c = NULL;
        loom_status s = loom_context_create(f.m, &cp, &c);
        CHECKF(s == bad[i].st && c == NULL && strstr(loom_last_error(), bad[i].want) &&
                   strstr(loom_last_error(), path),
               "%s: status %d, \"%s\"", bad[i].text, (int)s, loom_last_error());
        loom_context_free(c);
        loom_engine_params ep = loom_engine_default_params();
        ep.kv_config = path;
        loom_engine *e = NULL;
        CHECK(loom_engine_create(f.m, &ep, &e) == bad[i].st && e == NULL);
    }
    loom_context_params cp = loom_context_default_params();
    cp.kv_config = "/nonexistent/kv_config.json";
    loom_context *c = NULL;
    CHECK(loom_context_create(f.m, &cp, &c) == LOOM_ERR_IO && strstr(loom_last_error(), "/nonexistent"));
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", kvc_dir);
    CHECK(system(cmd) == 0);
    test_fixture_free(&f);
}

/* Cached tokens of prompt 3 on a fresh engine of KV type t over the disk
 * tier dir; *bad: the files it found damaged or foreign. */
static int layout_run(fixture *f, loom_kv_type t, const char *dir, uint64_t *bad) {
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.kv_type = t;
    ep.prefix_cache_dir = dir;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f->m, &ep, &e) == LOOM_OK);
    if (!e) return -1;
    loom_request *r = submit(e, f->ids[3], f->len[3], 4, 0);
    int32_t toks[8];
    int n = 0, cached = -1;
    if (drain_cached(r, toks, NULL, &n, &cached) != LOOM_FINISH_LENGTH) cached = -1;
    loom_request_free(r);
    check_idle(e);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    *bad = st.disk_bad_files;
    loom_engine_free(e);
    return cached;
}

/* The KV layout is part of the namespace: engines of different KV types
 * over one disk directory never look up each other's blocks (they miss
 * without finding a foreign file), so each keeps its own, even f16 and
 * bf16, whose files have the same size. */
static void kv_layout_namespace(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    char dir[] = "/tmp/loom-test-kvlayout-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); test_fixture_free(&f); return; }
    static const loom_kv_type order[] = {LOOM_KV_F16, LOOM_KV_BF16, LOOM_KV_F16, LOOM_KV_BF16,
                                         LOOM_KV_Q8, LOOM_KV_F32, LOOM_KV_Q4, LOOM_KV_Q8, LOOM_KV_F32, LOOM_KV_Q4};
    int full = (f.len[3] - 1) / 16 * 16, seen[5] = {0};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        uint64_t bad = 0;
        int cached = layout_run(&f, order[i], dir, &bad), want = seen[order[i]]++ ? full : 0;
        CHECKF(cached == want && bad == 0, "kv %s run %zu over a shared directory: %d cached (want %d), %llu foreign files",
               loom_kv_type_name(order[i]), i, cached, want, (unsigned long long)bad);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    test_fixture_free(&f);
}

/* Compressed disk-tier files: smaller, restored exactly, damage detected;
 * files of either form are read whatever the level. */
static void disk_tier_zstd(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    float solo[NG];
    solo_logprobs(&f, 3, solo);
    char dir[] = "/tmp/loom-test-kvdisk-zstd-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    loom_engine_stats st;
    int full = (f.len[3] - 1) / 16 * 16;
#ifdef LOOM_ZSTD
    disk_zstd = 3;
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), 0);
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), full);
    /* qwen3-tiny: a raw file is 64 + 64 + 24576 bytes; f32 rows of random
     * weights still lose a few high bytes to zstd */
    size_t raw = 64 + 16 * 4 + 24576;
    CHECKF(st.disk_bytes < (uint64_t)(st.disk_reads * raw), "%llu bytes on disk for %llu files",
           (unsigned long long)st.disk_bytes, (unsigned long long)st.disk_reads);
    disk_zstd = 0; /* compressed files are read without a level too */
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), full);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cd %s && set -- $(ls *.lkv | sort) && "
             "printf '\\377' | dd of=$2 bs=1 seek=300 conv=notrunc 2>/dev/null", dir);
    CHECK(system(cmd) == 0);
    disk_zstd = 5;
    int cached = run_disk(&f, dir, solo, &st);
    CHECKF(cached >= 0 && cached < full && st.disk_bad_files == 1, "damaged file: %d cached, %llu bad",
           cached, (unsigned long long)st.disk_bad_files);
    disk_zstd = 0;
#else
    /* a level without zstd is refused */
    loom_engine_params ep = loom_engine_default_params();
    ep.prefix_cache_dir = dir;
    ep.prefix_cache_disk_zstd = 3;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_ERR_UNSUPPORTED && strstr(loom_last_error(), "zstd"));
    (void)st, (void)full;
#endif
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    CHECK(system(rm) == 0);
    test_fixture_free(&f);
}

/* ---- tenant isolation ----------------------------------------------------- */

/* Prompt 3 under a cache session id (NULL = none) on e: checks the tokens
 * are the reference's; returns the cached prompt tokens (-1 on failure). */
static int iso_run(loom_engine *e, fixture *f, const char *sid) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = f->ids[3];
    rp.n_prompt = f->len[3];
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.cache_session_id = sid;
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    if (!r) return -1;
    int32_t toks[NG + 1];
    int n = 0, cached = -1;
    loom_finish fin = drain_cached(r, toks, NULL, &n, &cached);
    CHECKF(fin == LOOM_FINISH_LENGTH && n == NG && same_tokens(toks, f->greedy[3], NG),
           "session %s: the run differs", sid ? sid : "(none)");
    loom_request_free(r);
    return fin == LOOM_FINISH_LENGTH ? cached : -1;
}

/* An engine over the disk tier dir (NULL: memory only) with a pool of
 * `blocks` blocks (0: the default). */
static loom_engine *iso_engine(fixture *f, const char *dir, int blocks) {
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.prefix_cache_dir = dir;
    if (blocks)
        ep.kv_memory = loom_kv_block_bytes(f->m->cfg.n_layers, loom_model_kv_dim(f->m), 16, LOOM_KV_F32) *
                       (size_t)blocks;
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(f->m, &ep, &e) == LOOM_OK, "engine: %s", loom_last_error());
    return e;
}

/* cache_session_id keeps tenants apart: one session's cached blocks never
 * serve another's prompt, nor a request without a session (and back), in
 * memory, after an eviction to disk, and after a restart over the same
 * disk directory; the same session hits every time. */
static void cache_isolation(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    int full = (f.len[3] - 1) / 16 * 16;
    loom_engine_stats st;
    /* in memory */
    loom_engine *e = iso_engine(&f, NULL, 0);
    if (e) {
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a"), 0);
        CHECK_EQ_INT(iso_run(e, &f, "tenant-b"), 0);
        CHECK_EQ_INT(iso_run(e, &f, NULL), 0);
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a"), full);
        CHECK_EQ_INT(iso_run(e, &f, "tenant-b"), full);
        CHECK_EQ_INT(iso_run(e, &f, NULL), full);
        /* a session id that extends another's is another session, and an
         * empty one is a session too */
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a2"), 0);
        CHECK_EQ_INT(iso_run(e, &f, ""), 0);
        CHECK_EQ_INT(iso_run(e, &f, ""), full);
        check_idle(e);
        loom_engine_free(e);
    }
    /* a session's blocks evicted to disk by another session's run (a pool
     * of 24 blocks holds one run of prompt 3: 20 blocks) */
    char dir[] = "/tmp/loom-test-kviso-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); test_fixture_free(&f); return; }
    e = iso_engine(&f, dir, 24);
    if (e) {
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a"), 0);
        CHECK_EQ_INT(iso_run(e, &f, "tenant-c"), 0);
        settled_stats(e, &st);
        CHECKF(st.disk_writes > 0, "nothing spilled to disk (%llu writes)", (unsigned long long)st.disk_writes);
        uint64_t disk0 = st.disk_hit_tokens;
        CHECK_EQ_INT(iso_run(e, &f, "tenant-b"), 0);
        CHECK_EQ_INT(iso_run(e, &f, NULL), 0);
        settled_stats(e, &st);
        CHECKF(st.disk_hit_tokens == disk0, "another session read %llu tokens from disk",
               (unsigned long long)(st.disk_hit_tokens - disk0));
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a"), full);
        settled_stats(e, &st);
        CHECKF(st.disk_hit_tokens > disk0, "the session's evicted blocks did not come from disk");
        check_idle(e);
        loom_engine_free(e);
    }
    /* after a restart over the same directory (tenant-a and -b spilled at
     * shutdown; tenant-d never ran) */
    e = iso_engine(&f, dir, 0);
    if (e) {
        CHECK_EQ_INT(iso_run(e, &f, "tenant-d"), 0);
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a2"), 0);
        settled_stats(e, &st);
        CHECKF(st.disk_hit_tokens == 0, "a new session read %llu tokens from disk",
               (unsigned long long)st.disk_hit_tokens);
        CHECK_EQ_INT(iso_run(e, &f, "tenant-a"), full);
        settled_stats(e, &st);
        CHECK_EQ_INT(st.disk_hit_tokens, full);
        check_idle(e);
        loom_engine_free(e);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    test_fixture_free(&f);
}

/* Opens (for writing, without blocking) whichever FIFO in dir a reader is
 * waiting on, then closes it: that reader sees an empty file. Returns
 * whether one was found. */
static int release_fifo_reader(const char *dir) {
    for (int tries = 0; tries < 2000; tries++) {
        DIR *d = opendir(dir);
        struct dirent *de;
        int found = 0;
        while (d && (de = readdir(d)) && !found) {
            char path[600];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            int fd = open(path, O_WRONLY | O_NONBLOCK);
            if (fd >= 0) {
                close(fd);
                found = 1;
            }
        }
        if (d) closedir(d);
        if (found) return 1;
        usleep(1000);
    }
    return 0;
}

/* Disk restores do not hold up the engine: with every block file turned
 * into a FIFO, the restore thread blocks on the first one, and meanwhile
 * another request runs to the end; a request cancelled mid-restore waits
 * for its read, then leaves the pool idle; a released read fails cleanly
 * (an empty file) and the request computes its prompt instead. */
static void disk_restore_async(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    float solo[NG];
    solo_logprobs(&f, 3, solo);
    char dir[] = "/tmp/loom-test-kvdisk-fifo-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    loom_engine_stats st;
    CHECK_EQ_INT(run_disk(&f, dir, solo, &st), 0); /* spills prompt 3's blocks */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cd %s && ls *.lkv > ../%s.names && for x in *.lkv; do rm $x && mkfifo $x; done",
             dir, strrchr(dir, '/') + 1);
    CHECK(system(cmd) == 0);
    for (int round = 0; round < 2; round++) {
        /* a fresh engine indexes the FIFOs again (a failed read drops one);
         * the blocks the last engine spilled go, so only b waits on disk */
        snprintf(cmd, sizeof cmd, "cd %s && for x in *.lkv; do grep -qx $x ../%s.names || rm $x; done; "
                 "for x in $(cat ../%s.names); do [ -e $x ] || mkfifo $x; done", dir, strrchr(dir, '/') + 1,
                 strrchr(dir, '/') + 1);
        CHECK(system(cmd) == 0);
        loom_engine_params ep = loom_engine_default_params();
        ep.n_ctx = 400;
        ep.prefix_cache_dir = dir;
        loom_engine *e = NULL;
        CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
        if (!e) break;
        loom_request *b = submit(e, f.ids[3], f.len[3], NG, 0); /* blocks on a FIFO */
        loom_request *a = submit(e, f.ids[1], f.len[1], NG, 0);
        int32_t toks[NG + 1];
        float lps[NG + 1];
        int n = 0;
        CHECK(drain(a, toks, NULL, &n) == LOOM_FINISH_LENGTH && same_tokens(toks, f.greedy[1], NG));
        loom_request_free(a);
        loom_event ev;
        CHECKF(loom_request_next(b, &ev, 0) == LOOM_ERR_TIMEOUT, "round %d: the restoring request moved", round);
        if (round == 0) loom_request_cancel(b);
        CHECK(release_fifo_reader(dir));
        loom_finish fin = drain(b, toks, lps, &n);
        if (round == 0) {
            CHECK(fin == LOOM_FINISH_CANCELLED);
        } else {
            double worst = test_max_abs_err(lps, solo, (size_t)LOOM_MIN(n, NG));
            CHECKF(fin == LOOM_FINISH_LENGTH && n == NG && same_tokens(toks, f.greedy[3], NG) && worst < 1e-5,
                   "after a failed restore the run differs (logprob diff %g)", worst);
        }
        loom_request_free(b);
        check_idle(e);
        loom_engine_get_stats(e, &st);
        CHECK_EQ_INT(st.disk_bad_files, 1); /* the empty read, reported and deleted */
        loom_engine_free(e);
    }
    snprintf(cmd, sizeof cmd, "rm -f %s.names", dir);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    test_fixture_free(&f);
}

/* A full session store evicts its oldest entry to keep a new one, and the
 * eviction is counted like those made for room (the store of a model with
 * recurrent state holds as many entries as states fit its cap: one here). */
static void session_cap_evictions(const char *dir) {
    fixture f;
    if (!test_fixture_load(dir, &f)) { CHECK(0); return; }
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 256;
    ep.snapshot_bytes = loom_seq_state_bytes(f.m);
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    if (!e) { test_fixture_free(&f); return; }
    int32_t toks[NG];
    float lp[NG][NTOP];
    int cached = 0;
    CHECK(run_session(e, f.ids[0], f.len[0], "a", NULL, toks, lp, &cached) == LOOM_FINISH_LENGTH);
    CHECK(run_session(e, f.ids[1], f.len[1], "b", NULL, toks, lp, &cached) == LOOM_FINISH_LENGTH);
    CHECK(run_session(e, f.ids[2], f.len[2], "c", NULL, toks, lp, &cached) == LOOM_FINISH_LENGTH);
    loom_engine_stats st;
    settled_stats(e, &st);
    CHECKF(st.sessions == 1 && st.session_evictions == 2, "%s: %d sessions, %llu evicted (want 1, 2)",
           dir, st.sessions, (unsigned long long)st.session_evictions);
    /* idle: the pool is free, cached or parked, and the parts add up */
    CHECK_EQ_INT(st.kv_blocks_running, 0);
    CHECK(st.kv_blocks_parked > 0 && st.kv_blocks_touched > 0);
    CHECK_EQ_INT(st.kv_blocks_lru + st.kv_blocks_parked + st.kv_blocks_unused, st.kv_blocks_total);
    loom_engine_free(e);
    test_fixture_free(&f);
}

/* A small prefix cache full of unreferenced blocks: a response kept
 * (save_id) stays parked until a request names it, the cached blocks
 * going first, instead of being evicted the moment it is parked. */
static void kept_response_over_cache_cap(void) {
    fixture f;
    if (!test_fixture_load("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 256;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    if (!e) { test_fixture_free(&f); return; }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    loom_engine_free(e);
    /* the cap holds the kept response's blocks and nothing more */
    int bs = ep.block_size, kept = (f.len[1] + NG + bs - 1) / bs;
    CHECK(f.len[0] + NG >= bs); /* the first request leaves a cached block */
    ep.prefix_cache_bytes = (size_t)kept * st.kv_block_bytes;
    e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    if (!e) { test_fixture_free(&f); return; }
    int32_t toks[NG];
    float lp[NG][NTOP];
    int cached = 0;
    CHECK(run_session(e, f.ids[0], f.len[0], NULL, NULL, toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st);
    CHECK(st.kv_blocks_lru > 0);
    CHECK(run_session(e, f.ids[1], f.len[1], "kept", NULL, toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st);
    CHECKF(st.sessions == 1 && st.session_evictions == 0, "%d sessions, %llu evicted (want 1, 0)",
           st.sessions, (unsigned long long)st.session_evictions);
    CHECK(st.kv_blocks_lru + st.kv_blocks_parked <= (int)st.kv_cache_cap_blocks);
    CHECK(run_session(e, f.ids[1], f.len[1], NULL, "kept", toks, lp, &cached) == LOOM_FINISH_LENGTH);
    settled_stats(e, &st);
    CHECKF(st.session_hits == 1, "kept response: %llu session hits (want 1)",
           (unsigned long long)st.session_hits);
    CHECK_EQ_INT(cached, f.len[1] - 1);
    loom_engine_free(e);
    test_fixture_free(&f);
}

int main(void) {
    kept_response_over_cache_cap();
    prompt_logprobs("tests/fixtures/models/qwen3-tiny", 1);
    prompt_logprobs("tests/fixtures/models/qwen3.5-tiny-hybrid", 1);
    prompt_logprobs("tests/fixtures/models/mistral-tiny-swa", 0); /* the window frees blocks */
    kv_q4_greedy();
    kv_layout_namespace();
    kv_codec();
    cache_isolation();
    disk_restore_async();
    disk_tier_zstd();
    kv_config();
    sessions("tests/fixtures/models/qwen3-tiny");
    sessions("tests/fixtures/models/qwen3.5-tiny-hybrid");
    sessions("tests/fixtures/models/mistral-tiny-swa");
    session_cap_evictions("tests/fixtures/models/qwen3.5-tiny-hybrid");
    disk_tier_hybrid();
    kv_lossy("tests/fixtures/models/qwen3-tiny");
    kv_lossy("tests/fixtures/models/llama3-tiny");
    sliding_window_blocks();
    tracing();
    trace_spans();
    disk_tier();
    prefix_cache("tests/fixtures/models/qwen3-tiny");
    prefix_cache_hybrid("tests/fixtures/models/qwen3.5-tiny-hybrid");
    prefix_cache_hybrid("tests/fixtures/models/qwen3next-tiny-hybrid-moe");
    prefix_cache("tests/fixtures/models/llama3-tiny");
    prefix_cache("tests/fixtures/models/mistral-tiny-swa");
    batched_equals_solo("tests/fixtures/models/qwen3-tiny");
    batched_equals_solo("tests/fixtures/models/llama3-tiny");
    batched_equals_solo("tests/fixtures/models/qwen2-tiny");
    batched_equals_solo("tests/fixtures/models/mistral-tiny-swa");
    batched_equals_solo("tests/fixtures/models/qwen3.5-tiny-hybrid");
    batched_equals_solo("tests/fixtures/models/gemma3-tiny");
    cancellation();
    preemption();
    return test_report("test_engine");
}
