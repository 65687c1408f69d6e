/* Parity against the Hugging Face reference fixtures of every supported
 * family: logits at every position (the whole prompt in one forward, one
 * token at a time through the KV cache and recurrent state, chunks of 7 and
 * 64), greedy continuations after each, and several sequences sharing
 * forwards over one KV pool. */
#include <stdint.h>
#include <time.h>

#include "base/base.h"
#include "engine/kv.h"
#include "load/safetensors.h"
#include "model/forward.h"
#include "ops/ops.h"
#include "test.h"
#include "test_path.h"

#define TOL 1e-5

/* Prefills tok in chunks of `chunk` (all logits into got), then decodes
 * greedily n_greedy tokens into out. */
static loom_status run_chunked(loom_context *c, const int32_t *tok, int L, int chunk, float *got,
                               int V, int32_t *out, int n_greedy) {
    loom_status s = loom_context_truncate(c, 0);
    for (int off = 0; s == LOOM_OK && off < L; off += chunk) {
        int n = L - off < chunk ? L - off : chunk;
        s = loom_context_eval(c, tok + off, n, 1, got + (size_t)off * V);
    }
    float *last = malloc(sizeof(float) * (size_t)V);
    memcpy(last, got + (size_t)(L - 1) * V, sizeof(float) * (size_t)V);
    for (int i = 0; s == LOOM_OK && i < n_greedy; i++) {
        out[i] = loom_argmax(last, V);
        if (i + 1 < n_greedy) s = loom_context_eval(c, &out[i], 1, 0, last);
    }
    free(last);
    return s;
}

/* Positions whose max |a - ref| / max |ref| exceeds TOL. */
static int rows_over_tol(const float *a, const float *ref, int L, int V) {
    double m = 0;
    for (size_t i = 0; i < (size_t)L * V; i++) m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    int n = 0;
    for (int t = 0; t < L; t++) {
        double e = 0;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)a[(size_t)t * V + v] - ref[(size_t)t * V + v]);
            e = d > e || d != d ? d : e;
        }
        n += !(e / m <= TOL);
    }
    return n;
}

/* Prompt i of a reference file: its ids, logits and greedy continuation;
 * 0 (after a failed check) if any is missing. */
static int ref_prompt(const loom_safetensors *ref, int i, const loom_st_tensor **ids,
                      const loom_st_tensor **lg, const loom_st_tensor **gr) {
    char name[64];
    snprintf(name, sizeof name, "prompt.%d.ids", i);
    *ids = loom_st_find(ref, name);
    snprintf(name, sizeof name, "prompt.%d.logits", i);
    *lg = loom_st_find(ref, name);
    snprintf(name, sizeof name, "prompt.%d.greedy", i);
    *gr = loom_st_find(ref, name);
    CHECK(*ids && *lg && *gr);
    return *ids && *lg && *gr;
}

/* dir's model (threads: 0 = all cores) and its reference; 0 (checked and
 * reported) when either does not load. */
static int load_fixture(const char *dir, int threads, int fast, loom_safetensors **ref,
                        loom_model **m) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    *ref = NULL;
    *m = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    mp.fast_matmul = fast;
    CHECKF(loom_st_open(path, ref) == LOOM_OK, "%s: %s", path, loom_last_error());
    CHECKF(loom_model_load(dir, &mp, m) == LOOM_OK, "%s: %s", dir, loom_last_error());
    return *ref && *m;
}

static void check_model_tol(const char *dir, int n_prompts, int n_greedy, double tol) {
    loom_safetensors *ref;
    loom_model *m;
    /* One thread: these models are tiny and pool hand-offs would dominate
     * (pycoder below runs threaded). */
    if (!load_fixture(dir, strstr(dir, "trained") ? 0 : 1, 0, &ref, &m)) goto out;
    int V = loom_model_vocab_size(m);
    double worst = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_prompts; i++) {
        const loom_st_tensor *ids, *lg, *gr;
        if (!ref_prompt(ref, i, &ids, &lg, &gr)) continue;
        int L = (int)ids->shape[0];
        const int32_t *tok = ids->data;
        const float *want = lg->data;
        CHECK_EQ_INT(lg->shape[1], V);
        int ng = (int)gr->shape[0];
        CHECK(ng <= 64 && ng <= n_greedy);
        float *got = malloc(sizeof(float) * (size_t)L * V);
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = L + ng + 8;
        CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
        if (!c) {
            free(got);
            continue;
        }
        /* The whole prompt in one forward, then token by token through the
         * KV cache (and recurrent state), then in chunks of 7 and 64; each
         * followed by greedy decoding. */
        const int chunks[] = {L, 1, 7, 64};
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            /* chunked variants on the long prompt (short ones: whole and 1) */
            if (k > 0 && (chunks[k] >= L || (L < 100 && chunks[k] != 1))) continue;
            int32_t out[64];
            loom_status s = run_chunked(c, tok, L, chunks[k], got, V, out, ng);
            CHECKF(s == LOOM_OK, "%s prompt %d chunk %d: %s", dir, i, chunks[k], loom_last_error());
            double e = test_rel_err(got, want, (size_t)L * V);
            worst = test_max(worst, e);
            CHECKF(e <= tol, "%s prompt %d (L=%d) chunks of %d: rel err %.3g", dir, i, L,
                   chunks[k], e);
            int over = rows_over_tol(got, want, L, V);
            CHECKF(over <= L / 25, "%s prompt %d chunks of %d: %d of %d positions over %g", dir,
                   i, chunks[k], over, L, TOL);
            int same = 1;
            for (int t = 0; t < ng; t++) same &= out[t] == ((const int32_t *)gr->data)[t];
            CHECKF(same, "%s prompt %d chunks of %d: greedy continuation differs", dir, i,
                   chunks[k]);
        }
        loom_context_free(c);
        free(got);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "%-45s max rel err %.2g (%.2f s)\n", dir, worst,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
out:
    loom_model_free(m);
    loom_st_close(ref);
}

/* Prompts 1..3 share forwards over one KV pool: step 1 runs prompt 1 and 2
 * whole with the first 100 tokens of prompt 3; step 2 runs the rest of
 * prompt 3 with one decode token for each of the others. Every row must
 * match the reference as if run alone. */
static void check_batched(const char *dir, double tol) {
    loom_safetensors *ref;
    loom_model *m;
    if (!load_fixture(dir, 2, 0, &ref, &m)) {
        loom_model_free(m);
        loom_st_close(ref);
        return;
    }
    int V = loom_model_vocab_size(m);
    const int32_t *ids[3], *greedy[3];
    const float *want[3];
    int len[3];
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i + 1);
        const loom_st_tensor *t = loom_st_find(ref, name);
        ids[i] = t->data;
        len[i] = (int)t->shape[0];
        snprintf(name, sizeof name, "prompt.%d.logits", i + 1);
        want[i] = loom_st_find(ref, name)->data;
        snprintf(name, sizeof name, "prompt.%d.greedy", i + 1);
        greedy[i] = loom_st_find(ref, name)->data;
    }
    loom_kv_pool *kv = NULL;
    loom_fwd_state *fs = NULL;
    loom_kv_seq seq[3] = {{0}};
    loom_seq_state *st[3] = {0};
    CHECK(loom_kv_pool_create(m->cfg.n_layers, loom_model_kv_dim(m), 16, 64, LOOM_KV_F32, &kv) == LOOM_OK);
    CHECK(loom_fwd_state_create(m, 512, 512, &fs) == LOOM_OK);
    float *out[3], dec[2][512];
    for (int i = 0; i < 3; i++) {
        out[i] = malloc(sizeof(float) * (size_t)len[i] * V);
        CHECK(loom_seq_state_create(m, &st[i]) == LOOM_OK);
        CHECK(loom_kv_seq_reserve(kv, &seq[i], len[i] + 1) == LOOM_OK);
    }
    CHECK(V <= 512);
    loom_fwd_row rows[3] = {
        {.tokens = ids[0], .n = len[0], .seq = &seq[0], .logits = LOOM_LOGITS_ALL, .out = out[0], .state = st[0], .decode = 0},
        {.tokens = ids[2], .n = 100, .seq = &seq[2], .logits = LOOM_LOGITS_ALL, .out = out[2], .state = st[2], .decode = 0},
        {.tokens = ids[1], .n = len[1], .seq = &seq[1], .logits = LOOM_LOGITS_ALL, .out = out[1], .state = st[1], .decode = 0},
    };
    loom_status s = loom_forward(m, fs, &kv->lay, rows, 3);
    CHECKF(s == LOOM_OK, "%s batched step 1: %s", dir, loom_last_error());
    loom_fwd_row rows2[3] = {
        {.tokens = &greedy[0][0], .n = 1, .seq = &seq[0], .logits = LOOM_LOGITS_LAST, .out = dec[0], .state = st[0], .decode = 1},
        {.tokens = greedy[1], .n = 1, .seq = &seq[1], .logits = LOOM_LOGITS_LAST, .out = dec[1], .state = st[1], .decode = 1},
        {.tokens = ids[2] + 100, .n = len[2] - 100, .seq = &seq[2], .logits = LOOM_LOGITS_ALL, .out = out[2] + (size_t)100 * V, .state = st[2], .decode = 0},
    };
    s = loom_forward(m, fs, &kv->lay, rows2, 3);
    CHECKF(s == LOOM_OK, "%s batched step 2: %s", dir, loom_last_error());
    for (int i = 0; i < 3; i++) {
        double e = test_rel_err(out[i], want[i], (size_t)len[i] * V);
        CHECKF(e <= tol, "%s batched prompt %d: rel err %.3g", dir, i + 1, e);
    }
    for (int i = 0; i < 2; i++)
        CHECKF(loom_argmax(dec[i], V) == greedy[i][1], "%s batched decode %d differs", dir, i + 1);
    /* A sequence whose recurrent state does not match is refused. */
    if (st[0]) {
        loom_fwd_row bad = {.tokens = ids[0], .n = 1, .seq = &seq[0], .logits = LOOM_LOGITS_NONE, .out = NULL, .state = st[1], .decode = 0};
        CHECK(loom_forward(m, fs, &kv->lay, &bad, 1) == LOOM_ERR_INVALID_ARG);
    }
    for (int i = 0; i < 3; i++) {
        loom_kv_seq_release(kv, &seq[i]);
        loom_seq_state_free(st[i]);
        free(out[i]);
    }
    CHECK_EQ_INT(kv->n_free, kv->lay.n_blocks);
    loom_fwd_state_free(fs);
    loom_kv_pool_free(kv);
    loom_model_free(m);
    loom_st_close(ref);
}

/* One sequence fed a token per forward, then again in tiles of 1-7 tokens
 * beside two other sequences (one decoding, one in 2-token chunks): the
 * logits must be the same bits. The engine relies on it (a request gives
 * the same tokens alone or batched, and the prefix cache's cached equals
 * cold). Tiles stay under the attention's matmul tiles (16 query rows);
 * the AVX2 table is not batch-invariant, so the check runs on the AVX-512
 * and plain-C tables only. fast: --fast (the interleaved 4-/8-bit path). */
static void check_tiles_exact(const char *dir, loom_kv_type kt, int fast) {
    const loom_kernels *k = fast ? loom_kernels_get_fast() : loom_kernels_get();
    int invariant = k->matmul_f32 == loom_kernels_ref.matmul_f32;
#if defined(__x86_64__)
    invariant |= k->matmul_f32 == loom_kernels_avx512_dense.matmul_f32;
#endif
    if (!invariant) return;
    loom_safetensors *ref;
    loom_model *m;
    if (!load_fixture(dir, 2, fast, &ref, &m)) goto out;
    enum { L = 48, LB = 20, LC = 24 };
    int V = loom_model_vocab_size(m);
    int32_t tok[3][L];
    for (int i = 0; i < 3; i++) {
        const loom_st_tensor *ids, *lg, *gr;
        CHECK(ref_prompt(ref, i, &ids, &lg, &gr));
        for (int k = 0; k < L; k++) tok[i][k] = ((const int32_t *)ids->data)[k % ids->shape[0]];
    }
    float *solo = malloc(sizeof(float) * L * V), *bat = malloc(sizeof(float) * L * V);
    float *junk = malloc(sizeof(float) * 3 * V);
    loom_kv_pool *kv = NULL;
    loom_fwd_state *fs = NULL;
    loom_kv_seq sq[3] = {{0}};
    loom_seq_state *st[3] = {0};
    CHECK(loom_kv_pool_create(m->cfg.n_layers, loom_model_kv_dim(m), 16, 32, kt, &kv) == LOOM_OK);
    CHECK(loom_fwd_state_create(m, 16, 128, &fs) == LOOM_OK);
    for (int i = 0; i < 3; i++) CHECK(loom_seq_state_create(m, &st[i]) == LOOM_OK);
    CHECK(loom_kv_seq_reserve(kv, &sq[0], L) == LOOM_OK);
    for (int t = 0; t < L; t++) {
        loom_fwd_row r = {.tokens = tok[0] + t, .n = 1, .seq = &sq[0], .logits = LOOM_LOGITS_LAST, .out = solo + (size_t)t * V, .state = st[0], .decode = 0};
        CHECKF(loom_forward(m, fs, &kv->lay, &r, 1) == LOOM_OK, "%s: %s", dir, loom_last_error());
    }
    loom_kv_seq_release(kv, &sq[0]);
    loom_seq_state_reset(st[0]);
    CHECK(loom_kv_seq_reserve(kv, &sq[0], L) == LOOM_OK);
    CHECK(loom_kv_seq_reserve(kv, &sq[1], LB) == LOOM_OK);
    CHECK(loom_kv_seq_reserve(kv, &sq[2], LC) == LOOM_OK);
    static const int chunks[] = {1, 2, 3, 1, 5, 7, 4, 6, 1, 1, 2};
    int maxc = LOOM_MAX(1, 15 / (m->cfg.n_heads / m->cfg.n_kv_heads));
    for (int step = 0, oa = 0, ob = 0, oc = 0; oa < L; step++) {
        loom_fwd_row rows[3];
        int n = 0, ca = LOOM_MIN(LOOM_MIN(chunks[step % 11], maxc), L - oa);
        int cc = LOOM_MIN(2, LC - oc);
        if (ob < LB) rows[n++] = (loom_fwd_row){.tokens = tok[1] + ob++, .n = 1, .seq = &sq[1], .logits = LOOM_LOGITS_LAST, .out = junk, .state = st[1], .decode = 0};
        rows[n++] = (loom_fwd_row){.tokens = tok[0] + oa, .n = ca, .seq = &sq[0], .logits = LOOM_LOGITS_ALL, .out = bat + (size_t)oa * V, .state = st[0], .decode = 0};
        if (cc > 0)
            rows[n++] = (loom_fwd_row){.tokens = tok[2] + oc, .n = cc, .seq = &sq[2], .logits = LOOM_LOGITS_ALL, .out = junk + V, .state = st[2], .decode = 0};
        oa += ca;
        oc += cc;
        if (loom_forward(m, fs, &kv->lay, rows, n) != LOOM_OK) {
            CHECKF(0, "%s tiles: %s", dir, loom_last_error());
            break;
        }
    }
    CHECKF(!memcmp(solo, bat, sizeof(float) * L * V),
           "%s kv %d fast %d: a token per forward and batched tiles differ", dir, (int)kt, fast);
    for (int i = 0; i < 3; i++) {
        loom_kv_seq_release(kv, &sq[i]);
        loom_seq_state_free(st[i]);
    }
    free(solo);
    free(bat);
    free(junk);
    loom_fwd_state_free(fs);
    loom_kv_pool_free(kv);
out:
    loom_model_free(m);
    loom_st_close(ref);
}

/* --fast (loom_model_params.fast_matmul) against the exact reference:
 * the prompt whole and token by token, and the next-token logits at every
 * step along the reference's greedy path, all within tol of the largest
 * prompt logit. bf16 models: activations are rounded to bf16 before each
 * bf16 matmul (a relative error of at most 2^-8 per product), so logits
 * move by far more than TOL; FAST_TOL bounds it (pycoder-16m measured
 * 2.4e-3), and the whole greedy continuation must stay the reference's. */
#define FAST_TOL 1e-2
/* MLX 4- and 8-bit weights: --fast rounds the activations to int8 per 64
 * columns (a relative error up to 1/254 per element), ~10x bf16's; the
 * random tiny fixtures measured 3.4e-2 (decode steps included). Their logits have near-ties, so
 * the greedy continuation must be the reference's wherever the exact lead
 * of the best token over the second is above twice the bound (no error
 * within it can change the pick): fed the reference path, at every such
 * step, and running on its own, up to the first step with a smaller lead
 * and for at least FAST_Q_GREEDY tokens (the fixtures measured the first
 * difference at token 5; their leads are clear at 25 of 80 steps (8-bit)
 * and 62 of 80 (4-bit)). */
#define FAST_Q_TOL 5e-2
#define FAST_Q_GREEDY 4

static void check_fast_tol(const char *dir, int n_prompts, double tol, int all_greedy) {
    loom_safetensors *ref;
    loom_model *m, *exact = NULL;
    loom_model_params mp = loom_model_default_params();
    if (!load_fixture(dir, 0, 1, &ref, &m)) goto out;
    CHECKF(loom_model_load(dir, &mp, &exact) == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (!exact) goto out;
    int V = loom_model_vocab_size(m), steps = 0, clear = 0;
    double worst = 0;
    for (int i = 0; i < n_prompts; i++) {
        const loom_st_tensor *ids, *lg, *gr;
        if (!ref_prompt(ref, i, &ids, &lg, &gr)) continue;
        int L = (int)ids->shape[0], ng = (int)gr->shape[0];
        const int32_t *want = gr->data;
        double scale = 0;
        for (size_t k = 0; k < (size_t)L * V; k++) scale = test_max(scale, fabs(((const float *)lg->data)[k]));
        /* along the reference path: exact and --fast next-token logits */
        float *pe = malloc(sizeof(float) * (size_t)ng * V), *pf = malloc(sizeof(float) * (size_t)ng * V);
        CHECK(test_path_logits(exact, LOOM_KV_F32, ids->data, L, want, ng, pe) &&
              test_path_logits(m, LOOM_KV_F32, ids->data, L, want, ng, pf));
        int first_close = ng;
        for (int t = 0; t < ng; t++) {
            const float *e = pe + (size_t)t * V, *f = pf + (size_t)t * V;
            CHECKF(loom_argmax(e, V) == want[t], "%s prompt %d step %d: the exact model leaves the reference path",
                   dir, i, t);
            double d = test_max_abs_err(f, e, (size_t)V) / scale;
            worst = test_max(worst, d);
            CHECKF(d <= tol, "%s --fast prompt %d step %d: rel err %.3g along the reference path", dir, i, t, d);
            if (test_top2_margin(e, V) <= 2 * tol * scale) {
                if (first_close == ng) first_close = t;
                continue;
            }
            CHECKF(loom_argmax(f, V) == want[t], "%s --fast prompt %d step %d: picks %d, the reference %d", dir,
                   i, t, loom_argmax(f, V), (int)want[t]);
            clear++;
        }
        steps += ng;
        free(pe);
        free(pf);
        float *got = malloc(sizeof(float) * (size_t)L * V);
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = L + ng + 8;
        CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
        for (int chunk = L; c && chunk >= 1; chunk = chunk == 1 ? 0 : 1) {
            int32_t out[64];
            loom_status s = run_chunked(c, ids->data, L, chunk, got, V, out, ng);
            CHECKF(s == LOOM_OK, "%s --fast prompt %d: %s", dir, i, loom_last_error());
            double e = test_rel_err(got, lg->data, (size_t)L * V);
            worst = test_max(worst, e);
            CHECKF(e <= tol, "%s --fast prompt %d chunks of %d: rel err %.3g", dir, i, chunk, e);
            int same = 0;
            while (same < ng && out[same] == want[same]) same++;
            int need = all_greedy ? ng : LOOM_MAX(first_close, FAST_Q_GREEDY);
            CHECKF(same >= need, "%s --fast prompt %d chunks of %d: greedy differs at token %d, before token %d",
                   dir, i, chunk, same, need);
        }
        loom_context_free(c);
        free(got);
    }
    fprintf(stderr, "%-45s --fast max rel err %.2g (bound %g); the reference's pick at %d of %d steps "
            "(leads above twice the bound)\n", dir, worst, tol, clear, steps);
out:
    loom_model_free(exact);
    loom_model_free(m);
    loom_st_close(ref);
}

static void check_fast(const char *dir, int n_prompts) {
    check_fast_tol(dir, n_prompts, FAST_TOL, 1);
}

static void check_model(const char *dir, int n_prompts, int n_greedy) {
    check_model_tol(dir, n_prompts, n_greedy, TOL);
}

/* The hybrid references are not float64 throughout: transformers runs the
 * chunked delta rule in f32 (f32 cumulative decays, f32 triangular solve
 * and matmuls), and these random-weight fixtures amplify that rounding at
 * a few positions of the 300-token prompt. An independent float64 forward
 * of exact math lands 2.5e-5 (qwen3.5) and 1.6e-5 (qwen3-next) from the
 * references, over 1e-5 at 8 and 4 positions; loom lands at 3.2e-5 and
 * 2.6e-5, over 1e-5 at 8 and 2 positions. Reproducing the reference's
 * rounding would need its decays exact to ~1e-9, beyond f32 activations. */
#define TOL_HYBRID 5e-5

/* The weights copied onto 2 MiB pages at load (the default) and left in
 * the file mapping (no_copy) give the same bits: the same exact kernels
 * read either, tied embeddings included. (--fast re-lays quantized
 * matrices out for other kernels, which round differently.) */
static void check_copy_same(const char *dir) {
    float *lg[2] = {NULL, NULL};
    int V = 0;
    int32_t tok[24];
    for (int k = 0; k < 2; k++) {
        loom_model_params mp = loom_model_default_params();
        mp.n_threads = 1;
        mp.no_copy = k;
        loom_model *m = NULL;
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = 64;
        CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s: %s", dir, loom_last_error());
        if (m && loom_context_create(m, &cp, &c) == LOOM_OK) {
            V = loom_model_vocab_size(m);
            for (int i = 0; i < 24; i++) tok[i] = (int32_t)((i * 31 + 7) % V);
            lg[k] = malloc(sizeof(float) * (size_t)V * 24);
            CHECKF(loom_context_eval(c, tok, 24, 1, lg[k]) == LOOM_OK, "%s: %s", dir,
                   loom_last_error());
        }
        loom_context_free(c);
        loom_model_free(m);
    }
    if (lg[0] && lg[1])
        CHECKF(!memcmp(lg[0], lg[1], sizeof(float) * (size_t)V * 24),
               "%s: copied and mapped weights give different logits", dir);
    free(lg[0]);
    free(lg[1]);
}

int main(void) {
    check_copy_same("tests/fixtures/trained/pycoder-16m");
    check_copy_same("tests/fixtures/models/qwen3-tiny-mlx4");
    check_copy_same("tests/fixtures/models/gemma2-tiny");
    check_copy_same("tests/fixtures/models/qwen3-tiny-fp8");
    check_model("tests/fixtures/models/llama3-tiny", 4, 20);
    check_model("tests/fixtures/models/qwen2-tiny", 4, 20);
    check_model("tests/fixtures/models/qwen3-tiny", 4, 20);
    check_model("tests/fixtures/models/mistral-tiny-swa", 4, 20);
    check_model("tests/fixtures/models/gemma2-tiny", 4, 20);
    check_model("tests/fixtures/models/gemma3-tiny", 4, 20);
    check_model("tests/fixtures/models/qwen3moe-tiny", 4, 20);
    check_model("tests/fixtures/models/qwen3-tiny-mlx4", 4, 20);
    check_model("tests/fixtures/models/qwen3-tiny-mlx8", 4, 20);
    check_model("tests/fixtures/models/qwen3-tiny-fp8", 4, 20);
    check_model_tol("tests/fixtures/models/qwen3.5-tiny-hybrid", 4, 20, TOL_HYBRID);
    check_model_tol("tests/fixtures/models/qwen3next-tiny-hybrid-moe", 4, 20, TOL_HYBRID);
    check_batched("tests/fixtures/models/gemma2-tiny", TOL);
    check_batched("tests/fixtures/models/qwen3moe-tiny", TOL);
    check_batched("tests/fixtures/models/qwen3-tiny-mlx4", TOL);
    check_batched("tests/fixtures/models/qwen3.5-tiny-hybrid", TOL_HYBRID);
    check_batched("tests/fixtures/models/qwen3next-tiny-hybrid-moe", TOL_HYBRID);
    check_batched("tests/fixtures/models/gemma4-tiny", TOL);
    check_model("tests/fixtures/models/gemma4-tiny", 4, 20);
    check_model("tests/fixtures/trained/pycoder-16m", 3, 32);
    check_fast("tests/fixtures/trained/pycoder-16m", 3);
    check_fast_tol("tests/fixtures/models/qwen3-tiny-mlx8", 4, FAST_Q_TOL, 0);
    check_fast_tol("tests/fixtures/models/qwen3-tiny-mlx4", 4, FAST_Q_TOL, 0);
    check_tiles_exact("tests/fixtures/models/qwen3-tiny", LOOM_KV_F32, 0);
    check_tiles_exact("tests/fixtures/models/qwen3-tiny", LOOM_KV_Q8, 0);
    check_tiles_exact("tests/fixtures/models/gemma2-tiny", LOOM_KV_F16, 0);
    check_tiles_exact("tests/fixtures/models/mistral-tiny-swa", LOOM_KV_BF16, 0);
    check_tiles_exact("tests/fixtures/models/qwen3moe-tiny", LOOM_KV_Q4, 0);
    check_tiles_exact("tests/fixtures/models/qwen3-tiny-mlx4", LOOM_KV_F32, 1);
    check_tiles_exact("tests/fixtures/models/qwen3-tiny-mlx8", LOOM_KV_F16, 1);
    return test_report("test_model");
}
