/* Speculative decoding with the target on CUDA device 0 and the drafters
 * on the CPU beside it: prompt lookup, a draft model, and the DFlash
 * projected-context drafter reading the hidden states the device forward
 * exports. Greedy output must be plain decoding's on the same device,
 * token for token, with proposals accepted. The verification forward
 * keeps to decode's roundings, so only the order of f32 sums differs
 * from plain decoding; a difference is let pass (and counted) only where
 * plain decoding's top two log-probabilities were within TIE. The
 * trained pair (pycoder-16m, bf16) runs one request at a time, as plain
 * decoding at batch 1 is what a batch-1 verification must equal; the f32
 * fixtures run batched (plain rows, proposals and prefills in one step),
 * drafted by prompt lookup and by their own CPU copy. Needs a GPU; run
 * through tools/cuda_check.sh. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "../test.h"

#define NP 5      /* a fixture's prompts (up to 4) and one repetitive one */
#define NG 40     /* tokens generated per request */
#define TIE 1e-3  /* log-probability gap of a near-tie */

typedef struct prompts {
    int32_t *ids[NP];
    int len[NP], n;
} prompts;

typedef struct run_out {
    int32_t toks[NP][NG];
    float gap[NP][NG]; /* the chosen token's log-probability over the runner-up's */
    int n[NP];
    loom_finish fin[NP];
    loom_engine_stats st;
} run_out;

/* The reference prompts of dir's reference.safetensors, and the first of
 * at least 6 tokens repeated to 48 or more (what follows is largely in the
 * prompt already: prompt lookup finds it). */
static int load_prompts(const char *dir, prompts *p) {
    char path[512];
    loom_safetensors *ref = NULL;
    memset(p, 0, sizeof *p);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (loom_st_open(path, &ref)) {
        fprintf(stderr, "%s: %s\n", path, loom_last_error());
        return 0;
    }
    for (int i = 0; i < NP - 1; i++) {
        char k[64];
        snprintf(k, sizeof k, "prompt.%d.ids", i);
        const loom_st_tensor *t = loom_st_find(ref, k);
        if (!t) break;
        int n = (int)t->shape[0];
        p->ids[p->n] = malloc(sizeof(int32_t) * (size_t)n);
        memcpy(p->ids[p->n], t->data, sizeof(int32_t) * (size_t)n);
        p->len[p->n++] = n;
    }
    loom_st_close(ref);
    if (p->n == 0) return 0;
    int src = 0;
    while (src < p->n - 1 && p->len[src] < 6) src++;
    int n0 = p->len[src], n = (48 + n0 - 1) / n0 * n0;
    p->ids[p->n] = malloc(sizeof(int32_t) * (size_t)n);
    for (int k = 0; k < n; k++) p->ids[p->n][k] = p->ids[src][k % n0];
    p->len[p->n++] = n;
    return 1;
}

static void free_prompts(prompts *p) {
    for (int i = 0; i < p->n; i++) free(p->ids[i]);
}

static loom_request *submit(loom_engine *e, const prompts *p, int i, int lp) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = p->ids[i];
    rp.n_prompt = p->len[i];
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.logprobs = lp ? 2 : -1;
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    return r;
}

static void drain(loom_request *r, run_out *o, int i) {
    loom_event ev;
    while (r && loom_request_next(r, &ev, 120000) == LOOM_OK) {
        if (ev.finish != LOOM_FINISH_NONE) {
            o->fin[i] = ev.finish;
            break;
        }
        if (o->n[i] < NG) {
            o->toks[i][o->n[i]] = ev.token;
            o->gap[i][o->n[i]] = ev.n_top >= 2 ? ev.top_logprobs[0] - ev.top_logprobs[1] : 1e9f;
        }
        o->n[i]++;
    }
    loom_request_free(r);
}

/* Every prompt of p through an engine on m: one request at a time, or all
 * at once (batched); lp: with the top two log-probabilities. Checks that
 * every block comes back. */
static void run(loom_model *m, const loom_engine_params *ep, const prompts *p, int batched, int lp,
                run_out *o) {
    memset(o, 0, sizeof *o);
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(m, ep, &e) == LOOM_OK, "engine: %s", loom_last_error());
    if (!e) return;
    loom_request *r[NP] = {0};
    for (int i = 0; i < p->n; i++) {
        r[i] = submit(e, p, i, lp);
        if (!batched) drain(r[i], o, i);
    }
    for (int i = 0; i < p->n && batched; i++) drain(r[i], o, i);
    for (int i = 0; i < 2000; i++) {
        loom_engine_get_stats(e, &o->st);
        if (o->st.running == 0 && o->st.waiting == 0 && o->st.kv_blocks_free == o->st.kv_blocks_total) break;
        usleep(1000);
    }
    CHECKF(o->st.kv_blocks_free == o->st.kv_blocks_total, "blocks leaked: %d of %d free",
           o->st.kv_blocks_free, o->st.kv_blocks_total);
    loom_engine_free(e);
}

/* o's tokens against plain's; prints one PASS/FAIL line. */
static void check_same(const char *model, const char *what, const prompts *p, const run_out *plain,
                       const run_out *o) {
    int exact = 0, ties = 0, bad = 0;
    for (int i = 0; i < p->n; i++) {
        int full = o->n[i] == NG && plain->n[i] == NG && o->fin[i] == LOOM_FINISH_LENGTH &&
                   plain->fin[i] == LOOM_FINISH_LENGTH;
        int d = 0;
        while (d < NG && o->toks[i][d] == plain->toks[i][d]) d++;
        if (full && d == NG) {
            exact++;
        } else if (full && plain->gap[i][d] < TIE) {
            ties++;
            printf("      %s %s request %d: token %d is %d, plain decoding's %d at a near-tie (%.2g)\n",
                   model, what, i, d, o->toks[i][d], plain->toks[i][d], plain->gap[i][d]);
        } else {
            bad++;
            printf("      %s %s request %d: %d tokens (finish %d, plain %d, %d), first difference at %d "
                   "(%d, plain %d, whose lead was %.3g)\n", model, what, i, o->n[i], (int)o->fin[i],
                   plain->n[i], (int)plain->fin[i], d, d < NG ? o->toks[i][d] : -1,
                   d < NG ? plain->toks[i][d] : -1, d < NG ? plain->gap[i][d] : 0.0);
        }
    }
    uint64_t dr = o->st.spec_drafted, ac = o->st.spec_accepted, ro = o->st.spec_rounds;
    int ok = bad == 0 && ac > 0;
    printf("%s  %-18s %-12s %d/%d requests plain decoding's tokens, %d at a near-tie; "
           "%llu of %llu proposals accepted, %.2f tokens per verifying step\n", ok ? "PASS" : "FAIL",
           model, what, exact, p->n, ties, (unsigned long long)ac, (unsigned long long)dr,
           ro ? 1.0 + (double)ac / (double)ro : 0.0);
    fflush(stdout);
    CHECK(ok);
}

static loom_engine_params params(loom_speculative spec, loom_model *draft, int k) {
    loom_engine_params ep = loom_engine_default_params();
    ep.max_batch_tokens = 128;
    ep.max_seqs = 8;
    ep.n_ctx = 400;
    ep.speculative = spec;
    ep.draft_model = draft;
    ep.draft_tokens = k;
    return ep;
}

/* pycoder-16m on the device; prompt lookup, pycoder-draft-3m and the DFlash
 * drafter models/pycoder-16m-dflash on the CPU; one request at a time. */
static void trained(void) {
    const char *dir = "tests/fixtures/trained/pycoder-16m";
    loom_model *m = NULL, *dm = NULL, *df = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.device = 0;
    prompts p;
    if (!load_prompts(dir, &p) || loom_model_load(dir, &mp, &m) ||
        loom_model_load("models/pycoder-draft-3m", NULL, &dm) ||
        loom_model_load("models/pycoder-16m-dflash", NULL, &df)) {
        fprintf(stderr, "trained: %s\n", loom_last_error());
        CHECK(0);
    }
    if (m && dm && df) {
        run_out plain, o;
        loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
        run(m, &ep, &p, 0, 1, &plain);
        ep = params(LOOM_SPEC_NGRAM, NULL, 8);
        run(m, &ep, &p, 0, 0, &o);
        check_same("pycoder-16m", "ngram", &p, &plain, &o);
        ep = params(LOOM_SPEC_DRAFT, dm, 6);
        run(m, &ep, &p, 0, 0, &o);
        check_same("pycoder-16m", "draft-3m", &p, &plain, &o);
        ep = params(LOOM_SPEC_DRAFT, df, 0);
        run(m, &ep, &p, 0, 0, &o);
        check_same("pycoder-16m", "dflash", &p, &plain, &o);
    }
    loom_model_free(df);
    loom_model_free(dm);
    loom_model_free(m);
    free_prompts(&p);
}

/* An f32 fixture on the device, drafted by prompt lookup and by its own
 * CPU copy, every prompt at once. */
static void fixture(const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    loom_model *m = NULL, *dm = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.device = 0;
    prompts p;
    if (!load_prompts(dir, &p) || loom_model_load(dir, &mp, &m) || loom_model_load(dir, NULL, &dm)) {
        fprintf(stderr, "%s: %s\n", name, loom_last_error());
        CHECK(0);
    }
    if (m && dm) {
        run_out plain, o;
        loom_engine_params ep = params(LOOM_SPEC_NONE, NULL, 0);
        run(m, &ep, &p, 1, 1, &plain);
        ep = params(LOOM_SPEC_NGRAM, NULL, 8);
        run(m, &ep, &p, 1, 0, &o);
        check_same(name, "ngram", &p, &plain, &o);
        /* every step speculating: the gate's timing-led choices aside */
        ep.spec_always = 1;
        run(m, &ep, &p, 1, 0, &o);
        check_same(name, "ngram always", &p, &plain, &o);
        ep = params(LOOM_SPEC_DRAFT, dm, 4);
        run(m, &ep, &p, 1, 0, &o);
        check_same(name, "self-draft", &p, &plain, &o);
    }
    loom_model_free(dm);
    loom_model_free(m);
    free_prompts(&p);
}

/* A hybrid on the device: verification rows would run its recurrent
 * layers as one-token sequences, so the engine refuses by name. */
static void hybrid_refused(void) {
    loom_model *m = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.device = 0;
    CHECK(loom_model_load("tests/fixtures/models/qwen3.5-tiny-hybrid", &mp, &m) == LOOM_OK);
    if (!m) return;
    loom_engine_params ep = loom_engine_default_params();
    ep.speculative = LOOM_SPEC_NGRAM;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(m, &ep, &e) == LOOM_ERR_UNSUPPORTED && !e);
    CHECKF(strstr(loom_last_error(), "linear-attention model runs on the CPU only") != NULL, "%s",
           loom_last_error());
    printf("%s  qwen3.5-tiny-hybrid speculation refused on the device\n", e ? "FAIL" : "PASS");
    loom_engine_free(e);
    loom_model_free(m);
}

int main(void) {
    static const char *models[] = {"llama3-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny-swa",
                                   "qwen3-tiny-mlx4", "gemma2-tiny", "gemma3-tiny", "gemma4-tiny",
                                   "qwen3moe-tiny"};
    trained();
    hybrid_refused();
    for (size_t i = 0; i < LOOM_ARRAY_LEN(models); i++) fixture(models[i]);
    return test_report("test_cuda_spec");
}
