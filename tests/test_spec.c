/* Speculative decoding in the engine: greedy output is token for token
 * that of plain decoding for every fixture family (prompt lookup, a draft
 * model that agrees often, one that agrees rarely, and the target drafting
 * for itself), batched with plain rows and prefills, over the long-span
 * attention path and through the recurrent-state rewind of hybrid models;
 * a stop id or max_tokens inside an accepted run ends the request at that
 * token; cancellation mid-round; nothing leaks; the trained pair. */
#include <unistd.h>

#include "base/base.h"
#include "engine/spec.h"
#include "load/safetensors.h"
#include "model/model.h"
#include "test.h"
#include "test_fixture.h"
#include "tokenize/tokenizer.h"

#define NP TEST_FIXTURE_PROMPTS
#define NG 40
#define NR (NP + 2) /* the fixture's prompts, a long one, a sampled one with XTC */

typedef struct fixture {
    test_fixture t;           /* the model and its reference */
    loom_model *m;            /* t.m */
    int32_t *ids[NR];         /* owned: the prompts (64 tokens at most), a long one, a copy */
    int len[NR];
} fixture;

static int load_fixture(const char *dir, fixture *f) {
    memset(f, 0, sizeof *f);
    if (!test_fixture_load(dir, &f->t)) return 0;
    f->m = f->t.m;
    for (int i = 0; i < NP; i++) {
        f->len[i] = LOOM_MIN(f->t.len[i], 64);
        f->ids[i] = malloc(sizeof(int32_t) * (size_t)f->len[i]);
        memcpy(f->ids[i], f->t.ids[i], sizeof(int32_t) * (size_t)f->len[i]);
    }
    /* a prompt whose decode tokens attend over more than 256 keys (the
     * chunked decode path), with repeats for prompt lookup to find */
    f->len[NP] = 300;
    f->len[NP + 1] = f->len[1];
    f->ids[NP] = malloc(sizeof(int32_t) * 300);
    f->ids[NP + 1] = malloc(sizeof(int32_t) * (size_t)f->len[1]);
    for (int k = 0; k < 300; k++) f->ids[NP][k] = f->ids[0][k % f->len[0]];
    memcpy(f->ids[NP + 1], f->ids[1], sizeof(int32_t) * (size_t)f->len[1]);
    return 1;
}

static void free_fixture(fixture *f) {
    for (int i = 0; i < NR; i++) free(f->ids[i]);
    test_fixture_free(&f->t);
}

typedef struct run_out {
    int32_t toks[NR][NG];
    float lps[NR][NG];   /* the chosen tokens' log-probabilities */
    int n[NR];
    loom_finish fin[NR];
    loom_engine_stats st;
} run_out;

static loom_request *submit(loom_engine *e, const int32_t *ids, int n, int max_tokens, int xtc) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = max_tokens;
    rp.ignore_eos = 1;
    rp.logprobs = 0;
    if (xtc) { /* sampled, never speculated: a plain row beside the others */
        rp.sampling.temperature = 1;
        rp.sampling.xtc_probability = 0.5f;
        rp.sampling.seed = 7;
    }
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    return r;
}

static loom_finish drain_lp(loom_request *r, int32_t *toks, float *lps, int *n, int cap) {
    *n = 0;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, 60000) != LOOM_OK) return LOOM_FINISH_ERROR;
        if (ev.finish != LOOM_FINISH_NONE) return ev.finish;
        if (*n < cap) toks[*n] = ev.token;
        if (*n < cap && lps) lps[*n] = ev.logprob;
        ++*n;
    }
}

static loom_finish drain(loom_request *r, int32_t *toks, int *n, int cap) {
    return drain_lp(r, toks, NULL, n, cap);
}

static void check_idle(loom_engine *e, loom_engine_stats *st) {
    for (int i = 0; i < 2000; i++) {
        loom_engine_get_stats(e, st);
        if (st->running == 0 && st->waiting == 0 && st->kv_blocks_free == st->kv_blocks_total) break;
        usleep(1000);
    }
    CHECKF(st->kv_blocks_free == st->kv_blocks_total, "blocks leaked: %d of %d free",
           st->kv_blocks_free, st->kv_blocks_total);
}

static loom_engine_params params(loom_speculative spec, loom_model *draft, int k) {
    loom_engine_params ep = loom_engine_default_params();
    ep.max_batch_tokens = 64; /* proposals, decodes and prefill pieces share it */
    ep.max_seqs = 8;
    ep.n_ctx = 400;
    ep.speculative = spec;
    ep.draft_model = draft;
    ep.draft_tokens = k;
    return ep;
}

/* Every request of f at once (the long one joining after the first
 * token), each to NG tokens. */
static void run(fixture *f, const loom_engine_params *ep, run_out *o) {
    memset(o, 0, sizeof *o);
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(f->m, ep, &e) == LOOM_OK, "engine: %s", loom_last_error());
    if (!e) return;
    loom_request *r[NR];
    for (int i = 0; i < NR; i++) {
        r[i] = submit(e, f->ids[i], f->len[i], NG, i == NP + 1);
        if (i == 0) { /* the others join a decoding request */
            loom_event ev;
            CHECK(loom_request_next(r[0], &ev, 60000) == LOOM_OK);
            o->lps[0][0] = ev.logprob;
            o->toks[0][o->n[0]++] = ev.token;
        }
    }
    for (int i = 0; i < NR; i++) {
        int n, off = i == 0;
        o->fin[i] = drain_lp(r[i], o->toks[i] + off, o->lps[i] + off, &n, NG - off);
        o->n[i] = n + off;
        loom_request_free(r[i]);
    }
    check_idle(e, &o->st);
    loom_engine_free(e);
}

static void check_same(const char *what, const run_out *plain, const run_out *o) {
    for (int i = 0; i < NR; i++) {
        /* the same tokens, and log-probabilities within what another batch
         * composition moves them (test_engine's batched_equals_solo) */
        double worst = 0;
        for (int t = 0; t < NG; t++) worst = test_max(worst, fabs(o->lps[i][t] - plain->lps[i][t]));
        int same = o->n[i] == plain->n[i] && o->fin[i] == LOOM_FINISH_LENGTH &&
                   !memcmp(o->toks[i], plain->toks[i], sizeof(int32_t) * NG) && worst < 1e-4;
        int at = 0;
        while (at < NG && o->toks[i][at] == plain->toks[i][at]) at++;
        CHECKF(same, "%s request %d: %d tokens (finish %d), first difference at %d, logprob diff %g",
               what, i, o->n[i], (int)o->fin[i], at, worst);
    }
}

/* Plain, prompt lookup, the draft models given, and (dense targets) the
 * target drafting for itself, which accepts every proposal. */
static void identity(const char *dir, const char *draft_dir) {
    fixture f;
    if (!load_fixture(dir, &f)) { CHECK(0); return; }
    loom_model *dm = NULL;
    CHECKF(loom_model_load(draft_dir, NULL, &dm) == LOOM_OK, "%s: %s", draft_dir, loom_last_error());
    run_out plain, o;
    loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
    run(&f, &ep, &plain);
    for (int i = 0; i < NR; i++) CHECK_EQ_INT(plain.n[i], NG);
    ep = params(LOOM_SPEC_NGRAM, NULL, 5);
    run(&f, &ep, &o);
    check_same("ngram", &plain, &o);
    CHECKF(o.st.spec_drafted > 0, "%s ngram: nothing drafted", dir);
    uint64_t rejected = o.st.spec_drafted - o.st.spec_accepted;
    printf("%s: ngram %llu/%llu accepted\n", dir, (unsigned long long)o.st.spec_accepted,
           (unsigned long long)o.st.spec_drafted);
    if (dm) {
        ep = params(LOOM_SPEC_DRAFT, dm, 4);
        run(&f, &ep, &o);
        check_same("draft model", &plain, &o);
        CHECKF(o.st.spec_drafted > 0, "%s draft: nothing drafted", dir);
        rejected += o.st.spec_drafted - o.st.spec_accepted;
        printf("%s: draft %s %llu/%llu accepted\n", dir, draft_dir,
               (unsigned long long)o.st.spec_accepted, (unsigned long long)o.st.spec_drafted);
    }
    CHECKF(rejected > 0, "%s: no proposal was rejected (nothing rolled back)", dir);
    {   /* hybrids too: the draft's state goes back to its snapshot */
        ep = params(LOOM_SPEC_DRAFT, f.m, 8);
        run(&f, &ep, &o);
        check_same("self-draft", &plain, &o);
        /* the XTC request never speculates; every other proposal stands */
        CHECKF(o.st.spec_accepted == o.st.spec_drafted && o.st.spec_drafted > 0,
               "%s self-draft: %llu of %llu accepted", dir, (unsigned long long)o.st.spec_accepted,
               (unsigned long long)o.st.spec_drafted);
    }
    loom_model_free(dm);
    free_fixture(&f);
}

/* A stop id and max_tokens inside an accepted run (the target drafting
 * for itself accepts everything): the request ends at that token. */
static void stops_inside_run(void) {
    fixture f;
    if (!load_fixture("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    run_out plain;
    loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
    run(&f, &ep, &plain);
    ep = params(LOOM_SPEC_DRAFT, f.m, 8);
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    /* the first token comes from the prefill; the next round proposes 8 */
    for (int at = 2; at < 12; at += 3) {
        int32_t stop = plain.toks[0][at];
        int first = 0; /* the request stops at the stop id's first appearance */
        while (plain.toks[0][first] != stop) first++;
        loom_request_params rp = loom_request_default_params();
        rp.prompt = f.ids[0];
        rp.n_prompt = f.len[0];
        rp.max_tokens = NG;
        rp.ignore_eos = 1;
        rp.stop_ids = &stop;
        rp.n_stop_ids = 1;
        loom_request *r = NULL;
        CHECK(loom_engine_submit(e, &rp, &r) == LOOM_OK);
        int32_t toks[NG];
        int n;
        CHECK(drain(r, toks, &n, NG) == LOOM_FINISH_STOP);
        CHECKF(n == first + 1 && !memcmp(toks, plain.toks[0], sizeof(int32_t) * (size_t)n),
               "stop id at %d: %d tokens", first, n);
        loom_request_free(r);
        /* max_tokens */
        loom_request *q = NULL;
        rp.n_stop_ids = 0;
        rp.max_tokens = at + 1;
        CHECK(loom_engine_submit(e, &rp, &q) == LOOM_OK);
        CHECK(drain(q, toks, &n, NG) == LOOM_FINISH_LENGTH);
        CHECKF(n == at + 1 && !memcmp(toks, plain.toks[0], sizeof(int32_t) * (size_t)n),
               "max_tokens %d: %d tokens", at + 1, n);
        loom_request_free(q);
    }
    loom_engine_stats st;
    check_idle(e, &st);
    CHECK(st.spec_accepted > 0);
    loom_engine_free(e);
    free_fixture(&f);
}

/* Cancelled between rounds: it ends cancelled, the others keep their
 * output, every block comes back (target and draft). */
static void cancel_mid_round(void) {
    fixture f;
    if (!load_fixture("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    loom_model *dm = NULL;
    CHECK(loom_model_load("tests/fixtures/models/qwen3-tiny-mlx8", NULL, &dm) == LOOM_OK);
    run_out plain;
    loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
    run(&f, &ep, &plain);
    ep = params(LOOM_SPEC_DRAFT, dm, 6);
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    /* Request 2 runs to the end of the context unless cancelled. On a
     * loaded machine the cancel can still come after its last token: then
     * every token must have come, and the round runs again. */
    int landed = 0;
    for (int round = 0; round < 8 && !landed; round++) {
        loom_request *r[NP];
        for (int i = 0; i < NP; i++) r[i] = submit(e, f.ids[i], f.len[i], i == 2 ? 0 : NG, 0);
        loom_event ev;
        for (int k = 0; k < 5; k++) CHECK(loom_request_next(r[2], &ev, 60000) == LOOM_OK && !ev.finish);
        loom_request_cancel(r[2]);
        for (int i = 0; i < NP; i++) {
            int32_t toks[NG];
            int n;
            loom_finish fin = drain(r[i], toks, &n, NG);
            if (i == 2) {
                int budget = ep.n_ctx - f.len[2] - 5; /* the first 5 were read */
                CHECKF(fin == LOOM_FINISH_CANCELLED || (fin == LOOM_FINISH_LENGTH && n == budget),
                       "request 2: finish %d after %d of %d tokens", fin, n, budget);
                landed = fin == LOOM_FINISH_CANCELLED;
            } else {
                CHECKF(fin == LOOM_FINISH_LENGTH && n == NG && !memcmp(toks, plain.toks[i], sizeof toks),
                       "request %d changed by a cancel beside it", i);
            }
            loom_request_free(r[i]);
        }
    }
    CHECK(landed);
    loom_engine_stats st;
    check_idle(e, &st);
    loom_engine_free(e);
    loom_model_free(dm);
    free_fixture(&f);
}

/* The trained pair: pycoder-16m drafted by pycoder-draft-3m on Python,
 * greedy, beside plain rows. */
static void trained_pair(void) {
    loom_model *m = NULL, *dm = NULL;
    if (loom_model_load("models/pycoder-16m", NULL, &m) || loom_model_load("models/pycoder-draft-3m", NULL, &dm)) {
        CHECKF(0, "trained pair: %s", loom_last_error());
        loom_model_free(m);
        return;
    }
    static const char *texts[] = {"import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n",
                                  "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"};
    fixture f = {0};
    f.m = m;
    loom_tok *tok = NULL;
    CHECK(loom_tok_load_dir("models/pycoder-16m", &tok) == LOOM_OK);
    for (int i = 0; i < NR && tok; i++) {
        size_t n = 0;
        CHECK(loom_tok_encode(tok, texts[i % 2], strlen(texts[i % 2]), LOOM_TOK_NO_SPECIAL, &f.ids[i], &n) == LOOM_OK);
        f.len[i] = (int)n;
    }
    loom_tok_free(tok);
    run_out plain, o;
    loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
    run(&f, &ep, &plain);
    ep = params(LOOM_SPEC_DRAFT, dm, 6);
    run(&f, &ep, &o);
    check_same("pycoder draft", &plain, &o);
    printf("pycoder: draft %llu/%llu accepted\n", (unsigned long long)o.st.spec_accepted,
           (unsigned long long)o.st.spec_drafted);
    CHECK(o.st.spec_accepted * 4 > o.st.spec_drafted); /* the pair agrees often */
    /* where decode-only steps spent the engine thread's CPU, by kind */
    CHECK(plain.st.plain_steps > 0 && plain.st.spec_steps == 0 && plain.st.plain_fwd_cpu_s > 0);
    CHECK(plain.st.spec_draft_cpu_s == 0 && plain.st.spec_fwd_cpu_s == 0);
    CHECK(o.st.spec_steps > 0 && o.st.spec_steps + o.st.plain_steps <= o.st.steps);
    CHECK(o.st.spec_draft_cpu_s > 0 && o.st.spec_fwd_cpu_s > 0 && o.st.spec_commit_cpu_s > 0);
    ep = params(LOOM_SPEC_NGRAM, NULL, 8);
    run(&f, &ep, &o);
    check_same("pycoder ngram", &plain, &o);
    for (int i = 0; i < NR; i++) free(f.ids[i]);
    loom_model_free(dm);
    loom_model_free(m);
}

/* Engine parameters speculation refuses. */
static void refusals(void) {
    fixture f;
    if (!load_fixture("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    loom_model *other = NULL;
    CHECK(loom_model_load("models/pycoder-draft-3m", NULL, &other) == LOOM_OK);
    loom_engine *e = NULL;
    loom_engine_params ep = params(LOOM_SPEC_DRAFT, NULL, 4);
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_ERR_INVALID_ARG && !e);
    ep = params(LOOM_SPEC_DRAFT, other, 4); /* 8192 ids against 512 */
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_ERR_INVALID_ARG && !e);
    CHECK(strstr(loom_last_error(), "vocabulary") != NULL);
    loom_model_free(other);
    free_fixture(&f);
}

/* A traced request's rounds: decode.draft and decode.verify spans carry
 * the drafter's name as their mechanism and the proposals' counts. */
static void traced(void) {
    fixture f;
    if (!load_fixture("tests/fixtures/models/gemma2-tiny", &f)) { CHECK(0); return; }
    loom_engine_params ep = params(LOOM_SPEC_NGRAM, NULL, 4);
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    loom_request_params rp = loom_request_default_params();
    rp.prompt = f.ids[0];
    rp.n_prompt = f.len[0];
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.trace = 1;
    loom_request *r = NULL;
    CHECK(loom_engine_submit(e, &rp, &r) == LOOM_OK);
    int32_t toks[NG];
    int n;
    CHECK(drain(r, toks, &n, NG) == LOOM_FINISH_LENGTH);
    char *js = loom_request_trace_json(r);
    CHECKF(js && strstr(js, "{\"name\":\"decode.verify\"") &&
               strstr(js, "\"attrs\":{\"mechanism\":\"ngram\",\"workId\"") &&
               strstr(js, "{\"name\":\"decode.draft\"") && strstr(js, "\"accepted\":"),
           "trace: %.400s", js ? js : "(null)");
    free(js);
    loom_request_free(r);
    loom_engine_free(e);
    free_fixture(&f);
}

/* Sampled requests keep the target's distribution: the second and third
 * tokens of many seeds (drawn in verification rounds of the target
 * drafting for itself, whose proposals stand with probability p) against
 * plain decoding's, by a two-sample chi-square at significance 1e-6 over
 * cells with enough counts (fixed seeds: deterministic). */
#define NS 2000
static void sample_tokens(fixture *f, const loom_engine_params *ep, int32_t (*out)[3], loom_engine_stats *st,
                          uint64_t seed0) {
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f->m, ep, &e) == LOOM_OK);
    if (!e) return;
    static loom_request *r[NS];
    for (int i = 0; i < NS; i++) {
        loom_request_params rp = loom_request_default_params();
        rp.prompt = f->ids[0];
        rp.n_prompt = f->len[0];
        rp.max_tokens = 3;
        rp.ignore_eos = 1;
        rp.sampling.temperature = 1.5f;
        rp.sampling.top_k = 12;
        rp.sampling.repetition_penalty = 1.3f;
        rp.sampling.seed = seed0 + (uint64_t)i; /* independent of the other run's */
        CHECK(loom_engine_submit(e, &rp, &r[i]) == LOOM_OK);
    }
    for (int i = 0; i < NS; i++) {
        int n;
        CHECK(drain(r[i], out[i], &n, 3) == LOOM_FINISH_LENGTH && n == 3);
        loom_request_free(r[i]);
    }
    check_idle(e, st);
    loom_engine_free(e);
}

static double chi2_crit(int df) { /* Wilson-Hilferty, z = 4.75 (1e-6) */
    double a = 2.0 / (9.0 * df);
    return df * pow(1 - a + 4.75 * sqrt(a), 3);
}

static void sampled_distribution(void) {
    fixture f;
    if (!load_fixture("tests/fixtures/models/qwen3-tiny", &f)) { CHECK(0); return; }
    static int32_t a[NS][3], b[NS][3];
    loom_engine_stats st;
    loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
    ep.max_seqs = 64;
    ep.max_batch_tokens = 2048;
    sample_tokens(&f, &ep, a, &st, 1);
    ep.speculative = LOOM_SPEC_DRAFT;
    ep.draft_model = f.m;
    ep.draft_tokens = 2;
    sample_tokens(&f, &ep, b, &st, 1000001);
    CHECKF(st.spec_drafted > 0 && st.spec_accepted > 0 && st.spec_accepted < st.spec_drafted,
           "sampled: %llu of %llu accepted", (unsigned long long)st.spec_accepted,
           (unsigned long long)st.spec_drafted);
    for (int pos = 0; pos < 3; pos++) {
        int ca[512] = {0}, cb[512] = {0};
        for (int i = 0; i < NS; i++) {
            ca[a[i][pos] & 511]++;
            cb[b[i][pos] & 511]++;
        }
        double x = 0;
        int df = -1, ra = 0, rb = 0;
        for (int v = 0; v < 512; v++) {
            if (ca[v] + cb[v] < 20) { /* the rare ones pooled */
                ra += ca[v];
                rb += cb[v];
                continue;
            }
            x += (double)(ca[v] - cb[v]) * (ca[v] - cb[v]) / (ca[v] + cb[v]);
            df++;
        }
        if (ra + rb > 0) {
            x += (double)(ra - rb) * (ra - rb) / (ra + rb);
            df++;
        }
        CHECKF(df < 1 || x < chi2_crit(df), "token %d: chi2 %.1f, df %d, critical %.1f", pos, x, df, chi2_crit(df));
        printf("sampled token %d: chi2 %.1f (df %d, critical %.1f)\n", pos, x, df, df > 0 ? chi2_crit(df) : 0);
    }
    free_fixture(&f);
}

/* The recurrent state's rewind after partly kept runs (hybrid models):
 * sampled requests drafted by the model itself (its greedy proposals kept
 * with probability p, so runs end inside) report the log-probability of
 * each token they emit; a context replaying prompt and output must give
 * the same ones, which a state left a token off would not. */
static void hybrid_rewind(const char *dir) {
    fixture f;
    if (!load_fixture(dir, &f)) { CHECK(0); return; }
    loom_engine_params ep = params(LOOM_SPEC_DRAFT, f.m, 4);
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    if (!e) return;
    enum { G = 60 };
    loom_request *r[NP];
    for (int i = 0; i < NP; i++) {
        loom_request_params rp = loom_request_default_params();
        rp.prompt = f.ids[i];
        rp.n_prompt = f.len[i];
        rp.max_tokens = G;
        rp.ignore_eos = 1;
        rp.logprobs = 0;
        rp.sampling.temperature = 1;
        rp.sampling.top_k = 2;
        rp.sampling.seed = 3 + (uint64_t)i;
        CHECK(loom_engine_submit(e, &rp, &r[i]) == LOOM_OK);
    }
    static int32_t all[NP][64 + G];
    static float lp[NP][G];
    for (int i = 0; i < NP; i++) {
        int n;
        CHECK(drain_lp(r[i], all[i] + f.len[i], lp[i], &n, G) == LOOM_FINISH_LENGTH && n == G);
        loom_request_free(r[i]);
        memcpy(all[i], f.ids[i], sizeof(int32_t) * (size_t)f.len[i]);
    }
    loom_engine_stats st;
    check_idle(e, &st);
    loom_engine_free(e); /* the model is the replay's alone from here */
    int V = loom_model_vocab_size(f.m);
    float *l = malloc(sizeof(float) * (size_t)(64 + G) * V);
    double worst = 0;
    for (int i = 0; i < NP; i++) {
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = f.len[i] + G;
        CHECK(loom_context_create(f.m, &cp, &c) == LOOM_OK);
        if (!c) continue;
        CHECK(loom_context_eval(c, all[i], f.len[i] + G - 1, 1, l) == LOOM_OK);
        for (int t = 0; t < G; t++) {
            const float *row = l + (size_t)(f.len[i] - 1 + t) * V;
            double mx = row[0], sum = 0;
            for (int v = 1; v < V; v++) mx = test_max(mx, row[v]);
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            worst = test_max(worst, fabs(row[all[i][f.len[i] + t]] - mx - log(sum) - lp[i][t]));
        }
        loom_context_free(c);
    }
    printf("%s: sampled self-draft %llu/%llu accepted, logprob diff %g\n", dir, (unsigned long long)st.spec_accepted,
           (unsigned long long)st.spec_drafted, worst);
    CHECKF(st.spec_accepted > 0 && st.spec_accepted < st.spec_drafted, "%s: %llu of %llu accepted", dir,
           (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted);
    CHECKF(worst < 1e-3, "%s: emitted logprobs differ from a replay by %g", dir, worst);
    free(l);
    free_fixture(&f);
}

static void ngram_lookup(void) {
    int32_t t[] = {1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4}, out[8];
    /* the latest earlier "2 3 4" is followed by 7 8 2 3 4 */
    CHECK_EQ_INT(loom_spec_ngram(t, 14, 3, out), 3);
    CHECK(out[0] == 7 && out[1] == 8 && out[2] == 2);
    CHECK_EQ_INT(loom_spec_ngram(t, 14, 8, out), 5);
    /* "... 9": no 3- or 2-gram recurs, the 1-gram "2" does */
    int32_t u[] = {5, 2, 6, 1, 2};
    CHECK_EQ_INT(loom_spec_ngram(u, 5, 4, out), 3);
    CHECK(out[0] == 6 && out[1] == 1 && out[2] == 2);
    int32_t w[] = {1, 2, 3};
    CHECK_EQ_INT(loom_spec_ngram(w, 3, 4, out), 0);
}

int main(void) {
    ngram_lookup();
    refusals();
    traced();
    sampled_distribution();
    hybrid_rewind("tests/fixtures/models/qwen3.5-tiny-hybrid");
    hybrid_rewind("tests/fixtures/models/qwen3next-tiny-hybrid-moe");
    stops_inside_run();
    cancel_mid_round();
    static const char *dirs[] = {
        "gemma2-tiny", "gemma3-tiny", "gemma4-tiny", "llama3-tiny", "mistral-tiny-swa", "qwen2-tiny",
        "qwen3-tiny", "qwen3-tiny-mlx4", "qwen3-tiny-mlx8", "qwen3.5-tiny-hybrid", "qwen3moe-tiny",
        "qwen3next-tiny-hybrid-moe",
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(dirs); i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", dirs[i]);
        /* a near twin for the qwen3 family (agrees often), qwen3-tiny for the rest (rarely) */
        int twin = !strncmp(dirs[i], "qwen3-tiny", 10);
        identity(dir, twin ? (strcmp(dirs[i], "qwen3-tiny-mlx8") ? "tests/fixtures/models/qwen3-tiny-mlx8"
                                                                  : "tests/fixtures/models/qwen3-tiny-mlx4")
                           : "tests/fixtures/models/qwen3-tiny");
    }
    trained_pair();
    return test_report("test_spec");
}
