/* test_cuda_forward: loom_cuda_forward against loom_forward (the CPU
 * reference) on the tiny fixtures (dense, Qwen3-MoE, and the Qwen3.5 and
 * Qwen3-Next hybrids with their recurrent states on the device): a two-row
 * prefill, decode steps, and a step mixing a decode row with a prefill
 * chunk, for f32 and f16 KV; for the hybrids also the device state against
 * the CPU's and a decode step replayed from a saved state; speculative
 * verification rows with a drafter's hidden states exported.
 * Needs a GPU; run by tools/cuda_check.sh. One PASS/FAIL line per step:
 * err = max |gpu - cpu| / max |cpu| over the step's logits, and how many
 * of the logit rows agree on the argmax. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../test.h"
#include "../test_fp8.h"
#include "cuda/cuda.h"
#include "engine/kv.h"
#include "load/safetensors.h"
#include "model/forward.h"
#include "model/model.h"
#include "ops/ops.h"

static loom_cuda *C;
static int n_pass, n_fail;

/* Rounding x to 16 bits before the GPU's GEMMs costs about this much. A
 * bf16 KV cache sends prefill attention through bf16 tensor cores (Q and
 * the probabilities rounded too), which a MoE's routing can amplify where
 * two experts nearly tie. */
static double tolerance(const loom_model *m, loom_kv_type kvt) {
    int dt = m->layers[0].attn.wq.dtype;
    /* FP8 prompts run on bf16 tensor cores (loom_cuda_f8_gemm) unless
     * LOOM_CUDA_F8_F32=1 */
    const char *f32 = getenv("LOOM_CUDA_F8_F32");
    if (dt == LOOM_DT_F8_E4M3 && !(f32 && !strcmp(f32, "1"))) return 5e-2;
    if (dt == LOOM_DT_BF16 || m->lm_head.dtype == LOOM_DT_BF16 || kvt == LOOM_KV_BF16) return 5e-2;
    if (dt == LOOM_DT_F16 || m->lm_head.dtype == LOOM_DT_F16) return 1e-2;
    return 2e-3;
}

/* A greedy pick made on the device agrees with the CPU's logits c when it
 * is their argmax or ties it within what compare() allows the logits on
 * either side (tol relative to the row's largest magnitude, twice): a bf16
 * row can hold a near-tie that rounding breaks either way. */
static int pick_agrees(const float *c, int V, int id, double tol) {
    if (id < 0 || id >= V) return 0;
    int best = loom_argmax(c, V);
    double mx = 0;
    for (int i = 0; i < V; i++)
        if (fabs(c[i]) > mx) mx = fabs(c[i]);
    return id == best || (double)c[best] - c[id] <= 2 * tol * (mx > 0 ? mx : 1);
}

static void compare(const char *fixture, const char *kvn, const char *step, const float *g,
                    const float *c, int n_rows, int V, double tol) {
    double e = 0, mx = 0;
    int agree = 0;
    for (size_t i = 0; i < (size_t)n_rows * V; i++) {
        double d = fabs((double)g[i] - c[i]);
        if (d > e || d != d) e = d;
        if (fabs(c[i]) > mx) mx = fabs(c[i]);
    }
    for (int r = 0; r < n_rows; r++)
        agree += loom_argmax(g + (size_t)r * V, V) == loom_argmax(c + (size_t)r * V, V);
    double rel = mx > 0 ? e / mx : e;
    int ok = rel <= tol && rel == rel;
    printf("%s  forward %-18s kv=%-3s %-28s err=%.3g (tol %.0e) argmax %d/%d\n", ok ? "PASS" : "FAIL",
           fixture, kvn, step, rel, tol, agree, n_rows);
    fflush(stdout);
    if (ok) n_pass++;
    else n_fail++;
}

typedef struct side {
    loom_kv_pool *kv;
    loom_kv_seq a, b;
    loom_seq_state *sa, *sb;   /* recurrent states (hybrids), else NULL */
} side;

/* The model at dir, or NULL after a FAIL line naming the test. */
static loom_model *load(const char *test, const char *name, const char *dir) {
    loom_model *m = NULL;
    if (loom_model_load(dir, NULL, &m) == LOOM_OK) return m;
    printf("FAIL  %s %-18s load: %s\n", test, name, loom_last_error());
    n_fail++;
    return NULL;
}

/* The CPU and GPU sides of a test: a pool each (16-position blocks, 64 of
 * them), the CPU forward's state and the device model. */
static loom_status sides_create(loom_model *m, loom_kv_type kvt, int max_tokens, int max_ctx,
                                loom_kv_pool **cpu, loom_kv_pool **gpu, loom_fwd_state **fs,
                                loom_cuda_model **g) {
    int L = m->cfg.n_layers, kvd = loom_model_kv_dim(m);
    loom_status st = loom_kv_pool_create(L, kvd, 16, 64, kvt, cpu);
    if (st == LOOM_OK) st = loom_kv_pool_create(L, kvd, 16, 64, kvt, gpu);
    if (st == LOOM_OK) st = loom_fwd_state_create(m, max_tokens, max_ctx, fs);
    if (st == LOOM_OK) st = loom_cuda_model_create(C, m, &(*gpu)->lay, max_tokens, max_ctx, g);
    return st;
}

static void fail_status(const char *test, const char *name, const char *kvn, const char *what,
                        loom_status st) {
    printf("FAIL  %s %-18s kv=%-3s %s%s: %s\n", test, name, kvn, what, loom_status_str(st),
           loom_last_error());
    n_fail++;
}

/* Largest |x - y| / max |y| over n floats. */
static double rel_err(const float *x, const float *y, size_t n) {
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - y[i]);
        if (d > e || d != d) e = d;
        if (fabs(y[i]) > mx) mx = fabs(y[i]);
    }
    return mx > 0 ? e / mx : e;
}

static void verdict(int ok, const char *fixture, const char *kvn, const char *what, double err,
                    double tol) {
    printf("%s  forward %-18s kv=%-3s %-28s err=%.3g (tol %.0e)\n", ok ? "PASS" : "FAIL", fixture,
           kvn, what, err, tol);
    fflush(stdout);
    ok ? n_pass++ : n_fail++;
}

/* The hybrids' recurrent state of row a (na tokens in) brought back from
 * the device (a snapshot's copy) against the CPU's; then a decode step on
 * each side, the GPU's state restored from that copy (the host changed
 * it: uploaded again) with its KV cut back, and the step replayed: the
 * replay gives the first run's logits, and both the CPU's. */
static loom_status check_states(loom_model *m, loom_fwd_state *fs, const char *fixture,
                                const char *kvn, side *cpu, side *gpu, loom_cuda_model *g,
                                const int32_t *ta, int na, float *lc, float *lg, double tol) {
    int V = loom_model_vocab_size(m);
    size_t bytes = loom_seq_state_bytes(m), n = bytes / sizeof(float);
    float *sc = malloc(bytes), *sg = malloc(bytes), *first = malloc(sizeof(float) * (size_t)V);
    if (!sc || !sg || !first) {
        free(sc), free(sg), free(first);
        return LOOM_ERR_NOMEM;
    }
    loom_seq_state_save(cpu->sa, sc);
    loom_seq_state_save(gpu->sa, sg);
    /* 16-bit weights: the device rounds the projections' inputs too */
    double e = rel_err(sg, sc, n), stol = tol >= 1e-2 ? tol : 1e-4;
    verdict(e <= stol, fixture, kvn, "state from the device", e, stol);
    loom_status st = LOOM_OK;
    for (int k = 0; k < 3 && st == LOOM_OK; k++) {
        /* k 0: the CPU; 1: the GPU; 2: the GPU again from the saved state */
        side *sd = k ? gpu : cpu;
        if (k == 2) {
            loom_seq_state_load(gpu->sa, sg, na);
            loom_kv_seq_truncate(gpu->kv, &gpu->a, na);
        }
        loom_fwd_row row = {.tokens = ta + na, .n = 1, .seq = &sd->a, .logits = LOOM_LOGITS_LAST,
                            .out = k == 0 ? lc : k == 1 ? first : lg, .state = sd->sa, .decode = 1};
        st = k ? loom_cuda_forward(g, &gpu->kv->lay, &row, 1, NULL, NULL)
               : loom_forward(m, fs, &cpu->kv->lay, &row, 1);
    }
    if (st == LOOM_OK) {
        compare(fixture, kvn, "decode after the state", first, lc, 1, V, tol);
        e = rel_err(lg, first, (size_t)V);
        verdict(e <= 1e-6, fixture, kvn, "replay from a saved state", e, 1e-6);
    }
    free(sc), free(sg), free(first);
    return st;
}

/* fixture: a name under tests/fixtures/models, or a directory path. */
static void run_fixture(const char *fixture, loom_kv_type kvt) {
    char dir[1024];
    if (strchr(fixture, '/')) snprintf(dir, sizeof dir, "%s", fixture);
    else snprintf(dir, sizeof dir, "tests/fixtures/models/%s", fixture);
    const char *kvn = loom_kv_type_name(kvt);
    loom_model *m = load("forward", fixture, dir);
    if (!m) return;
    int V = loom_model_vocab_size(m), max_tokens = 128, max_ctx = 256;
    double tol = tolerance(m, kvt);
    side cpu = {0}, gpu = {0};
    loom_fwd_state *fs = NULL;
    loom_cuda_model *g = NULL;
    float *lc = malloc(sizeof(float) * (size_t)max_tokens * V);
    float *lg = malloc(sizeof(float) * (size_t)max_tokens * V);
    loom_status st = sides_create(m, kvt, max_tokens, max_ctx, &cpu.kv, &gpu.kv, &fs, &g);
    if (st != LOOM_OK) {
        fail_status("forward", fixture, kvn, "setup ", st);
        goto out;
    }
    unsigned long long rng = 0x1234567ull;
    int32_t ta[80], tb[80];
    for (int i = 0; i < 80; i++) {
        ta[i] = (int32_t)(test_rand_u32(&rng) % (unsigned)V);
        tb[i] = (int32_t)(test_rand_u32(&rng) % (unsigned)V);
    }
    side *sides[2] = {&cpu, &gpu};
    for (int s = 0; s < 2; s++) {
        loom_kv_seq_reserve(sides[s]->kv, &sides[s]->a, 80);
        loom_kv_seq_reserve(sides[s]->kv, &sides[s]->b, 80);
        if (loom_seq_state_create(m, &sides[s]->sa) != LOOM_OK ||
            loom_seq_state_create(m, &sides[s]->sb) != LOOM_OK) {
            st = LOOM_ERR_NOMEM;
            goto fail;
        }
    }
    /* step 1: prefill 45 + 20 tokens, all logits */
    int na = 45, nb = 20;
    for (int s = 0; s < 2; s++) {
        float *out = s ? lg : lc;
        loom_fwd_row rows[2] = {{.tokens = ta, .n = na, .seq = &sides[s]->a, .logits = LOOM_LOGITS_ALL, .out = out, .state = sides[s]->sa, .decode = 0},
                                {.tokens = tb, .n = nb, .seq = &sides[s]->b, .logits = LOOM_LOGITS_ALL, .out = out + (size_t)na * V, .state = sides[s]->sb, .decode = 0}};
        st = s ? loom_cuda_forward(g, &gpu.kv->lay, rows, 2, NULL, NULL) : loom_forward(m, fs, &cpu.kv->lay, rows, 2);
        if (st != LOOM_OK) goto fail;
    }
    compare(fixture, kvn, "prefill 45+20", lg, lc, na + nb, V, tol);
    /* steps 2-4: decode both rows (the CPU's greedy tokens). The GPU runs
     * step 2 eagerly, captures step 3 into a graph and replays it at step
     * 4, where row 0 also takes its greedy pick on the device. */
    for (int k = 0; k < 3; k++) {
        char what[64];
        snprintf(what, sizeof what, "decode %d (pos %d, %d)", k + 1, na, nb);
        int32_t picks[2] = {-1, -2};
        for (int s = 0; s < 2; s++) {
            float *out = s ? lg : lc;
            loom_fwd_row rows[2] = {{.tokens = ta + na, .n = 1, .seq = &sides[s]->a, .logits = LOOM_LOGITS_LAST, .out = out, .state = sides[s]->sa, .decode = 1},
                                    {.tokens = tb + nb, .n = 1, .seq = &sides[s]->b, .logits = LOOM_LOGITS_LAST, .out = out + V, .state = sides[s]->sb, .decode = 1}};
            st = s ? loom_cuda_forward(g, &gpu.kv->lay, rows, 2, k == 2 ? picks : NULL, NULL)
                   : loom_forward(m, fs, &cpu.kv->lay, rows, 2);
            if (st != LOOM_OK) goto fail;
        }
        if (k == 2) {
            /* row 0's logits were not copied: check its pick instead */
            int best = loom_argmax(lc, V);
            int ok = pick_agrees(lc, V, picks[0], tol) && picks[1] == -2;
            printf("%s  forward %-18s kv=%-3s %-28s pick %d, CPU argmax %d\n", ok ? "PASS" : "FAIL",
                   fixture, kvn, "device greedy pick", picks[0], best);
            ok ? n_pass++ : n_fail++;
            memcpy(lg, lc, sizeof *lg * (size_t)V);
        }
        compare(fixture, kvn, what, lg, lc, 2, V, tol);
        na++, nb++;
    }
    /* step 5: a decode row beside a prefill chunk of 9 */
    for (int s = 0; s < 2; s++) {
        float *out = s ? lg : lc;
        loom_fwd_row rows[2] = {{.tokens = ta + na, .n = 1, .seq = &sides[s]->a, .logits = LOOM_LOGITS_LAST, .out = out, .state = sides[s]->sa, .decode = 1},
                                {.tokens = tb + nb, .n = 9, .seq = &sides[s]->b, .logits = LOOM_LOGITS_ALL, .out = out + V, .state = sides[s]->sb, .decode = 0}};
        st = s ? loom_cuda_forward(g, &gpu.kv->lay, rows, 2, NULL, NULL) : loom_forward(m, fs, &cpu.kv->lay, rows, 2);
        if (st != LOOM_OK) goto fail;
    }
    compare(fixture, kvn, "mixed 1 + chunk 9", lg, lc, 10, V, tol);
    na++, nb += 9;
    if (cpu.sa) {
        st = check_states(m, fs, fixture, kvn, &cpu, &gpu, g, ta, na, lc, lg, tol);
        if (st != LOOM_OK) goto fail;
    }
    goto out;
fail:
    fail_status("forward", fixture, kvn, "", st);
out:
    loom_seq_state_free(cpu.sa);
    loom_seq_state_free(cpu.sb);
    loom_seq_state_free(gpu.sa);
    loom_seq_state_free(gpu.sb);
    if (cpu.kv) {
        loom_kv_seq_release(cpu.kv, &cpu.a);
        loom_kv_seq_release(cpu.kv, &cpu.b);
    }
    if (gpu.kv) {
        loom_kv_seq_release(gpu.kv, &gpu.a);
        loom_kv_seq_release(gpu.kv, &gpu.b);
    }
    loom_cuda_model_free(g);
    loom_fwd_state_free(fs);
    loom_kv_pool_free(cpu.kv);
    loom_kv_pool_free(gpu.kv);
    loom_model_free(m);
    free(lc);
    free(lg);
}

/* One row a step (batch 1), the steps a single sequence takes: a short and
 * a long sequence (20 and 150 positions) decode in turn against the CPU;
 * each key runs eagerly, is captured, then replayed, and the last two
 * steps take the greedy pick on the device. */
static void run_single(const char *dir, loom_kv_type kvt) {
    const char *kvn = loom_kv_type_name(kvt);
    loom_model *m = load("single", dir, dir);
    if (!m) return;
    int V = loom_model_vocab_size(m), max_tokens = 160, max_ctx = 256;
    double tol = tolerance(m, kvt);
    loom_kv_pool *kv[2] = {NULL, NULL};  /* CPU, GPU */
    loom_kv_seq sq[2][2];
    loom_seq_state *ss[2][2] = {{NULL, NULL}, {NULL, NULL}};  /* recurrent states (hybrids) */
    memset(sq, 0, sizeof sq);
    loom_fwd_state *fs = NULL;
    loom_cuda_model *g = NULL;
    float *out[2];
    for (int i = 0; i < 2; i++) out[i] = malloc(sizeof(float) * (size_t)max_tokens * V);
    loom_status st = sides_create(m, kvt, max_tokens, max_ctx, &kv[0], &kv[1], &fs, &g);
    if (st != LOOM_OK) {
        fail_status("single", dir, kvn, "setup ", st);
        goto out;
    }
    unsigned long long rng = 0x51ull;
    int32_t toks[2][200];
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 200; i++) toks[j][i] = (int32_t)(test_rand_u32(&rng) % (unsigned)V);
    int len[2] = {20, 150};
    for (int i = 0; i < 2 && st == LOOM_OK; i++)
        for (int j = 0; j < 2 && st == LOOM_OK; j++) {
            st = loom_kv_seq_reserve(kv[i], &sq[i][j], 200);
            if (st == LOOM_OK) st = loom_seq_state_create(m, &ss[i][j]);
        }
    /* the prompts, one row each */
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 2 && st == LOOM_OK; i++) {
            loom_fwd_row row = {.tokens = toks[j], .n = len[j], .seq = &sq[i][j], .logits = LOOM_LOGITS_LAST, .out = out[i], .state = ss[i][j], .decode = 0};
            st = i ? loom_cuda_forward(g, &kv[i]->lay, &row, 1, NULL, NULL)
                   : loom_forward(m, fs, &kv[0]->lay, &row, 1);
        }
    for (int k = 0; k < 8 && st == LOOM_OK; k++) {
        int j = k & 1, pick_step = k >= 6;
        int32_t pick = -1;
        for (int i = 0; i < 2 && st == LOOM_OK; i++) {
            loom_fwd_row row = {.tokens = toks[j] + len[j], .n = 1, .seq = &sq[i][j], .logits = LOOM_LOGITS_LAST, .out = out[i], .state = ss[i][j], .decode = 1};
            st = i ? loom_cuda_forward(g, &kv[i]->lay, &row, 1, pick_step ? &pick : NULL, NULL)
                   : loom_forward(m, fs, &kv[0]->lay, &row, 1);
        }
        if (st != LOOM_OK) break;
        char what[64];
        snprintf(what, sizeof what, "b1 decode %d (pos %d)", k + 1, len[j]);
        if (pick_step) {
            int best = loom_argmax(out[0], V), ok = pick_agrees(out[0], V, pick, tol);
            printf("%s  single %-18s kv=%-3s %-28s pick %d, CPU argmax %d\n", ok ? "PASS" : "FAIL",
                   dir, kvn, what, pick, best);
            ok ? n_pass++ : n_fail++;
        } else {
            compare(dir, kvn, what, out[1], out[0], 1, V, tol);
        }
        len[j]++;
    }
    if (st != LOOM_OK) fail_status("single", dir, kvn, "", st);
out:
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 2; j++) loom_seq_state_free(ss[i][j]);
        for (int j = 0; j < 2 && kv[i]; j++) loom_kv_seq_release(kv[i], &sq[i][j]);
        loom_kv_pool_free(kv[i]);
        free(out[i]);
    }
    loom_cuda_model_free(g);
    loom_fwd_state_free(fs);
    loom_model_free(m);
}

/* Taps: max |gpu - cpu| / max |cpu| over the step's exported hidden states. */
static void compare_taps(const char *dir, const char *kvn, const char *step, const float *g,
                         const float *c, size_t n, double tol) {
    double rel = test_rel_err(g, c, n);
    int ok = rel <= tol && rel == rel;
    printf("%s  verify  %-18s kv=%-3s %-28s taps err=%.3g (tol %.0e)\n", ok ? "PASS" : "FAIL", dir,
           kvn, step, rel, tol);
    ok ? n_pass++ : n_fail++;
}

/* Speculative verification: a decode row carrying its last token and four
 * proposals (logits at every position) beside a plain decode row, against
 * the CPU, with the hidden states after the last and the first layer
 * exported (loom_cuda_set_taps, in that order) from the prompts on. After
 * each step the row keeps 1 to 3 of its 5 tokens (rejected proposals:
 * the KV cut back, both pools), so the next step writes over what was
 * cut. The four verification steps share a graph key: the first runs
 * eagerly, the second is captured, the others replay it; the fourth
 * takes the row's greedy ids instead of its logits. */
static void run_verify(const char *dir, loom_kv_type kvt) {
    const char *kvn = loom_kv_type_name(kvt);
    loom_model *m = load("verify", dir, dir);
    if (!m) return;
    if (m->n_linear > 0) { /* the engine refuses speculation on these (test_cuda_spec) */
        printf("SKIP  verify %s: linear-attention layers take no verification rows\n", dir);
        loom_model_free(m);
        return;
    }
    int V = loom_model_vocab_size(m), H = loom_model_hidden_size(m), L = m->cfg.n_layers;
    int max_tokens = 64, max_ctx = 256, layers[2] = {L - 1, 0};
    double tol = tolerance(m, kvt);
    loom_kv_pool *kv[2] = {NULL, NULL};  /* CPU, GPU */
    loom_kv_seq sq[2][2];
    memset(sq, 0, sizeof sq);
    loom_fwd_state *fs = NULL;
    loom_cuda_model *g = NULL;
    float *out[2], *taps[2];
    for (int i = 0; i < 2; i++) {
        out[i] = malloc(sizeof(float) * (size_t)max_tokens * V);
        taps[i] = calloc((size_t)max_tokens * 2 * H, sizeof(float));
    }
    loom_status st = sides_create(m, kvt, max_tokens, max_ctx, &kv[0], &kv[1], &fs, &g);
    if (st == LOOM_OK) st = loom_cuda_set_taps(g, layers, 2, taps[1]);
    if (st != LOOM_OK) {
        fail_status("verify", dir, kvn, "setup ", st);
        goto out;
    }
    loom_fwd_set_taps(fs, layers, 2, taps[0]);
    unsigned long long rng = 0x7e51ull;
    int32_t toks[2][200];
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 200; i++) toks[j][i] = (int32_t)(test_rand_u32(&rng) % (unsigned)V);
    int len[2] = {30, 12};
    for (int i = 0; i < 2 && st == LOOM_OK; i++)
        for (int j = 0; j < 2 && st == LOOM_OK; j++) st = loom_kv_seq_reserve(kv[i], &sq[i][j], 200);
    for (int i = 0; i < 2 && st == LOOM_OK; i++) {
        loom_fwd_row rows[2] = {{.tokens = toks[0], .n = len[0], .seq = &sq[i][0], .logits = LOOM_LOGITS_LAST, .out = out[i], .decode = 0},
                                {.tokens = toks[1], .n = len[1], .seq = &sq[i][1], .logits = LOOM_LOGITS_LAST, .out = out[i] + V, .decode = 0}};
        st = i ? loom_cuda_forward(g, &kv[i]->lay, rows, 2, NULL, NULL)
               : loom_forward(m, fs, &kv[0]->lay, rows, 2);
    }
    if (st != LOOM_OK) goto fail;
    compare(dir, kvn, "prompts 30+12", out[1], out[0], 2, V, tol);
    compare_taps(dir, kvn, "prompts 30+12", taps[1], taps[0], (size_t)(len[0] + len[1]) * 2 * H, tol);
    for (int k = 0; k < 5 && st == LOOM_OK; k++) {
        int tapped = k < 4, keep = 1 + k % 3, by_ids = k == 3;
        int32_t ids[5] = {-1, -1, -1, -1, -1};
        if (!tapped) { /* the same shape without taps: another key */
            loom_fwd_set_taps(fs, NULL, 0, NULL);
            st = loom_cuda_set_taps(g, NULL, 0, NULL);
        }
        for (int i = 0; i < 2 && st == LOOM_OK; i++) {
            loom_fwd_row rows[2] = {{.tokens = toks[0] + len[0], .n = 5, .seq = &sq[i][0], .logits = LOOM_LOGITS_ALL, .out = out[i], .decode = 1},
                                    {.tokens = toks[1] + len[1], .n = 1, .seq = &sq[i][1], .logits = LOOM_LOGITS_LAST, .out = out[i] + (size_t)5 * V, .decode = 1}};
            if (i && by_ids) rows[0].ids = ids; /* the greedy ids instead of row 0's logits */
            st = i ? loom_cuda_forward(g, &kv[i]->lay, rows, 2, NULL, NULL)
                   : loom_forward(m, fs, &kv[0]->lay, rows, 2);
        }
        if (st != LOOM_OK) break;
        char what[64];
        snprintf(what, sizeof what, "verify %d (pos %d, %d)%s", k + 1, len[0], len[1], tapped ? "" : " no taps");
        if (by_ids) {
            int agree = 0;
            for (int t = 0; t < 5; t++) agree += pick_agrees(out[0] + (size_t)t * V, V, ids[t], tol);
            printf("%s  verify  %-18s kv=%-3s %-28s greedy ids %d/5 the CPU's argmax or tied\n",
                   agree == 5 ? "PASS" : "FAIL", dir, kvn, what, agree);
            agree == 5 ? n_pass++ : n_fail++;
            compare(dir, kvn, what, out[1] + (size_t)5 * V, out[0] + (size_t)5 * V, 1, V, tol);
        } else {
            compare(dir, kvn, what, out[1], out[0], 6, V, tol);
        }
        if (tapped) compare_taps(dir, kvn, what, taps[1], taps[0], (size_t)6 * 2 * H, tol);
        /* the next step's tokens replace the rejected proposals */
        len[0] += keep;
        len[1]++;
        for (int i = 0; i < 2 && st == LOOM_OK; i++) {
            loom_kv_seq_truncate(kv[i], &sq[i][0], len[0]);
            st = loom_kv_seq_reserve(kv[i], &sq[i][0], len[0] + 5);
        }
        for (int t = len[0]; t < len[0] + 5; t++) toks[0][t] = (int32_t)(test_rand_u32(&rng) % (unsigned)V);
    }
    if (st == LOOM_OK) goto out;
fail:
    fail_status("verify", dir, kvn, "", st);
out:
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 2 && kv[i]; j++) loom_kv_seq_release(kv[i], &sq[i][j]);
        loom_kv_pool_free(kv[i]);
        free(out[i]);
        free(taps[i]);
    }
    loom_cuda_model_free(g);
    loom_fwd_state_free(fs);
    loom_model_free(m);
}

/* Gemma 4's variants of gemma4-tiny (the CPU forward has them, the fixture
 * not): dir/config.json is the fixture's with the replacements from[i] ->
 * to[i]; dir/model.safetensors its tensors, those named in repl[] (2-D of
 * rows x cols, or 1-D of rows when cols is 0) replaced by random values
 * (1-D: around 1), and with moe_e > 0 every layer's MoE block beside the
 * MLP added (moe_e experts of width moe_i, random). 0 after a FAIL line. */
typedef struct g4_tensor {
    const char *name;
    int64_t rows, cols;
} g4_tensor;

static int g4_variant(const char *dir, const char *const *from, const char *const *to, int n_rep,
                      const g4_tensor *repl, int n_repl, int moe_e, int moe_i) {
    const char *fx = "tests/fixtures/models/gemma4-tiny";
    char path[1200], *text = NULL;
    size_t len;
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", fx);
    int ok = loom_read_file(path, &text, &len) == LOOM_OK;
    for (int i = 0; ok && i < n_rep; i++) {
        char *at = strstr(text, from[i]);
        if (!at) {
            loom_err(LOOM_ERR_FORMAT, "\"%s\" not in the fixture's config", from[i]);
            ok = 0;
            break;
        }
        size_t nl = strlen(text) - strlen(from[i]) + strlen(to[i]) + 1;
        char *nt = malloc(nl);
        snprintf(nt, nl, "%.*s%s%s", (int)(at - text), text, to[i], at + strlen(from[i]));
        free(text);
        text = nt;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = ok ? fopen(path, "wb") : NULL;
    ok = f && fputs(text, f) >= 0;
    if (f) ok &= fclose(f) == 0;
    free(text);
    loom_safetensors *src = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", fx);
    if (ok) ok = loom_st_open(path, &src) == LOOM_OK;
    int cnt = src ? loom_st_count(src) : 0, L = 6, H = 64, k = cnt;
    loom_st_write_entry *e = calloc((size_t)cnt + 8 * (size_t)L, sizeof *e);
    char (*names)[96] = calloc(8 * (size_t)L, sizeof *names);
    float *big = malloc(sizeof(float) * 256 * 256), *ones = malloc(sizeof(float) * 256);
    unsigned long long seed = 99;
    for (int i = 0; i < 256 * 256; i++) big[i] = test_rand_f(&seed) * 0.1f;
    /* norms and scales around 1, unequal (per-expert scales among them) */
    for (int i = 0; i < 256; i++) ones[i] = 0.6f + 0.15f * (float)(i % 7);
    for (int i = 0; ok && i < cnt; i++) {
        const loom_st_tensor *t = loom_st_at(src, i);
        e[i] = (loom_st_write_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                     .data = t->data};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
        for (int j = 0; j < n_repl; j++)
            if (!strcmp(t->name, repl[j].name)) {
                e[i].ndim = repl[j].cols ? 2 : 1;
                e[i].shape[0] = repl[j].rows;
                e[i].shape[1] = repl[j].cols;
                e[i].data = repl[j].cols ? (const void *)big : (const void *)ones;
            }
    }
    for (int l = 0; ok && moe_e > 0 && l < L; l++) {
        static const char *suffix[] = {"router.proj.weight", "router.scale",
                                       "router.per_expert_scale", "experts.gate_up_proj",
                                       "experts.down_proj", "post_feedforward_layernorm_1.weight",
                                       "pre_feedforward_layernorm_2.weight",
                                       "post_feedforward_layernorm_2.weight"};
        int64_t E = moe_e, I = moe_i;
        int64_t shapes[8][3] = {{E, H}, {H}, {E}, {E, 2 * I, H}, {E, H, I}, {H}, {H}, {H}};
        int nd[8] = {2, 1, 1, 3, 3, 1, 1, 1};
        for (int j = 0; j < 8; j++, k++) {
            snprintf(names[l * 8 + j], sizeof names[0], "model.layers.%d.%s", l, suffix[j]);
            e[k] = (loom_st_write_entry){.name = names[l * 8 + j], .dtype = LOOM_DT_F32,
                                         .ndim = nd[j], .data = nd[j] == 1 ? ones : big};
            memcpy(e[k].shape, shapes[j], sizeof shapes[j]);
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ok) ok = loom_st_write(path, e, k) == LOOM_OK;
    if (!ok) {
        printf("FAIL  forward %s: writing the variant: %s\n", dir, loom_last_error());
        n_fail++;
    }
    free(e), free(names), free(big), free(ones);
    loom_st_close(src);
    return ok;
}

/* One FAIL line unless the variant at dir loads with layer l reading the
 * KV of layer kv_l, with head size hd, (k_eq_v) values that are its keys
 * and (moe) a MoE block beside its MLP. */
static int g4_expect(const char *dir, int l, int kv_l, int hd, int k_eq_v, int moe) {
    loom_model *m = load("forward", dir, dir);
    if (!m) return 0;
    const loom_attn *A = &m->layers[l].attn;
    int ok = A->kv_layer == kv_l && A->head_dim == hd && A->k_eq_v == k_eq_v && m->has_ple &&
             m->layers[l].moe_beside == moe;
    if (!ok) {
        printf("FAIL  forward %s: layer %d reads layer %d's KV, head_dim %d, k_eq_v %d, MoE block "
               "%d (expected %d, %d, %d, %d)\n", dir, l, A->kv_layer, A->head_dim, A->k_eq_v,
               m->layers[l].moe_beside, kv_l, hd, k_eq_v, moe);
        n_fail++;
    }
    loom_model_free(m);
    return ok;
}

/* gemma4-tiny's variants, each through the prefill/decode/mixed steps,
 * batch-1 decode and verification against the CPU: layers 4 and 5 reading
 * layers 2 and 3's KV (num_kv_shared_layers, layer kinds alternating so
 * both kinds share); full layers whose values are their keys
 * (attention_k_eq_v); a full layer of global_head_dim 64 beside sliding
 * ones of 32 (wider device KV rows, proportional rope over 64); the MoE
 * block beside every MLP (4 experts of 32, top 2, router and expert
 * scales). */
static void run_gemma4_variants(const char *tmp) {
    static const char *types_from =
        "\"sliding_attention\",\n    \"sliding_attention\",\n    \"sliding_attention\",\n"
        "    \"sliding_attention\",\n    \"sliding_attention\",\n    \"full_attention\"";
    static const char *types_to =
        "\"sliding_attention\",\n    \"full_attention\",\n    \"sliding_attention\",\n"
        "    \"full_attention\",\n    \"sliding_attention\",\n    \"full_attention\"";
    char dir[4][512];
    snprintf(dir[0], sizeof dir[0], "%s/gemma4-kvshare", tmp);
    snprintf(dir[1], sizeof dir[1], "%s/gemma4-keqv", tmp);
    snprintf(dir[2], sizeof dir[2], "%s/gemma4-ghd", tmp);
    snprintf(dir[3], sizeof dir[3], "%s/gemma4-moe", tmp);
    const char *f0[] = {"\"num_kv_shared_layers\": 0", types_from};
    const char *t0[] = {"\"num_kv_shared_layers\": 2", types_to};
    const char *f1[] = {"\"attention_k_eq_v\": false", types_from};
    const char *t1[] = {"\"attention_k_eq_v\": true", types_to};
    const char *f2[] = {"\"head_dim\": 32"};
    const char *t2[] = {"\"head_dim\": 32, \"global_head_dim\": 64"};
    const char *f3[] = {"\"enable_moe_block\": false", "\"moe_intermediate_size\": null",
                        "\"num_experts\": null", "\"top_k_experts\": null"};
    const char *t3[] = {"\"enable_moe_block\": true", "\"moe_intermediate_size\": 32",
                        "\"num_experts\": 4", "\"top_k_experts\": 2"};
    static const g4_tensor ghd[] = {
        {"model.layers.5.self_attn.q_proj.weight", 256, 64},
        {"model.layers.5.self_attn.k_proj.weight", 128, 64},
        {"model.layers.5.self_attn.v_proj.weight", 128, 64},
        {"model.layers.5.self_attn.o_proj.weight", 64, 256},
        {"model.layers.5.self_attn.q_norm.weight", 64, 0},
        {"model.layers.5.self_attn.k_norm.weight", 64, 0},
    };
    int ok[4];
    ok[0] = g4_variant(dir[0], f0, t0, 2, NULL, 0, 0, 0) && g4_expect(dir[0], 4, 2, 32, 0, 0) &&
            g4_expect(dir[0], 5, 3, 32, 0, 0);
    ok[1] = g4_variant(dir[1], f1, t1, 2, NULL, 0, 0, 0) && g4_expect(dir[1], 3, 3, 32, 1, 0);
    ok[2] = g4_variant(dir[2], f2, t2, 1, ghd, 6, 0, 0) && g4_expect(dir[2], 5, 5, 64, 0, 0);
    ok[3] = g4_variant(dir[3], f3, t3, 4, NULL, 0, 4, 32) && g4_expect(dir[3], 2, 2, 32, 0, 1);
    for (int i = 0; i < 4; i++) {
        if (!ok[i]) continue;
        run_fixture(dir[i], LOOM_KV_F32);
        run_fixture(dir[i], LOOM_KV_F16);
        run_single(dir[i], LOOM_KV_F32);
        run_verify(dir[i], LOOM_KV_F32);
    }
}

int main(void) {
    loom_status st = loom_cuda_create(0, &C);
    if (st != LOOM_OK) {
        printf("FAIL  cuda_create  %s: %s\n", loom_status_str(st), loom_last_error());
        return 1;
    }
    static const char *fixtures[] = {"llama3-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny-swa",
                                     "qwen3-tiny-mlx4", "qwen3-tiny-mlx8", "gemma2-tiny",
                                     "gemma3-tiny", "gemma4-tiny", "qwen3moe-tiny",
                                     "qwen3.5-tiny-hybrid", "qwen3next-tiny-hybrid-moe",
                                     "qwen3-tiny-fp8"};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        run_fixture(fixtures[i], LOOM_KV_F32);
        run_fixture(fixtures[i], LOOM_KV_F16);
    }
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", fixtures[i]);
        run_verify(dir, LOOM_KV_F32);
    }
    /* the hybrids' prefill rows through the chunked delta rule: the
     * fixture steps' 45- and 20-token prompts with LOOM_CUDA_LIN_CHUNK=16
     * (the 9-token chunk stays token by token; the states, then decode
     * from a saved one, against the CPU), and a 150-token prompt beside a
     * 20-token one at the default, then decode from their states */
    static const char *hybrids[] = {"qwen3.5-tiny-hybrid", "qwen3next-tiny-hybrid-moe"};
    setenv("LOOM_CUDA_LIN_CHUNK", "16", 1);
    for (size_t i = 0; i < sizeof hybrids / sizeof hybrids[0]; i++) {
        printf("== LOOM_CUDA_LIN_CHUNK=16\n");
        run_fixture(hybrids[i], LOOM_KV_F32);
    }
    unsetenv("LOOM_CUDA_LIN_CHUNK");
    for (size_t i = 0; i < sizeof hybrids / sizeof hybrids[0]; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", hybrids[i]);
        run_single(dir, LOOM_KV_F32);
    }
    /* FP8 copies (128x128 blocks, layer 1's scales bf16) of qwen3-tiny
     * (partial blocks) and of the wide random models (whole blocks,
     * decode GEMV over real widths): prompts through loom_cuda_f8_gemm,
     * decode through loom_cuda_f8_gemv */
    const char *extra = getenv("LOOM_CUDA_TEST_MODELS");
    char buf[4096], tmp[] = "/tmp/loom-cuda-fp8-XXXXXX";
    if (mkdtemp(tmp)) {
        run_gemma4_variants(tmp);
        test_fp8_variant v = {.name = "fp8", .layout = TEST_FP8_BLOCK, .bf16_layer = 1,
                              .scale_suffix = "_scale_inv", .qcfg = TEST_FP8_HF};
        snprintf(buf, sizeof buf, "tests/fixtures/models/qwen3-tiny %s", extra ? extra : "");
        for (char *sv = NULL, *d = strtok_r(buf, " ", &sv); d; d = strtok_r(NULL, " ", &sv)) {
            if (strstr(d, "/rand-") && !strstr(d, "-wide")) continue;
            char out[1200];
            const char *base = strrchr(d, '/');
            snprintf(out, sizeof out, "%s/%s", tmp, base ? base + 1 : d);
            if (!test_fp8_write(d, out, NULL, &v)) {
                printf("FAIL  forward %s: writing its FP8 copy\n", d);
                n_fail++;
                continue;
            }
            run_fixture(out, LOOM_KV_F32);
            run_fixture(out, LOOM_KV_BF16);
            run_single(out, LOOM_KV_BF16);
            /* prompts through f32 SGEMM: the CPU's precision */
            setenv("LOOM_CUDA_F8_F32", "1", 1);
            printf("== LOOM_CUDA_F8_F32=1\n");
            run_fixture(out, LOOM_KV_F32);
            unsetenv("LOOM_CUDA_F8_F32");
        }
        snprintf(buf, sizeof buf, "rm -rf %s", tmp);
        if (system(buf) != 0) printf("note: could not remove %s\n", tmp);
    }
    /* LOOM_CUDA_TEST_MODELS: extra model directories (tools/cuda_check.sh
     * writes random ones with gen_model, bf16 and an f32 MoE), run with
     * bf16 and f32 KV: the paths the fixtures' f32 weights never take
     * (16-bit activations, tensor-core prefill attention, the vectorised
     * decode kernel, 64 experts). */
    snprintf(buf, sizeof buf, "%s", extra ? extra : "");
    for (char *sv = NULL, *d = strtok_r(buf, " ", &sv); d; d = strtok_r(NULL, " ", &sv)) {
        run_fixture(d, LOOM_KV_BF16);
        run_fixture(d, LOOM_KV_F32);
        run_single(d, LOOM_KV_BF16);
        run_verify(d, LOOM_KV_BF16);
    }
    /* the same models with the other settings: the q/k/v GEMM writing f32
     * (LOOM_CUDA_QKV16=0), qkv_post inside the decode attention
     * (LOOM_CUDA_ATTN_QKV=1) */
    snprintf(buf, sizeof buf, "%s", extra ? extra : "");
    setenv("LOOM_CUDA_QKV16", "0", 1);
    setenv("LOOM_CUDA_ATTN_QKV", "1", 1);
    for (char *sv = NULL, *d = strtok_r(buf, " ", &sv); d; d = strtok_r(NULL, " ", &sv)) {
        printf("== LOOM_CUDA_QKV16=0 LOOM_CUDA_ATTN_QKV=1\n");
        run_fixture(d, LOOM_KV_BF16);
        run_verify(d, LOOM_KV_BF16);
    }
    unsetenv("LOOM_CUDA_QKV16");
    unsetenv("LOOM_CUDA_ATTN_QKV");
    /* the greedy picks by the argmax kernel after the head's GEMV
     * (LOOM_CUDA_HEAD_AM=0) */
    snprintf(buf, sizeof buf, "%s", extra ? extra : "");
    setenv("LOOM_CUDA_HEAD_AM", "0", 1);
    for (char *sv = NULL, *d = strtok_r(buf, " ", &sv); d; d = strtok_r(NULL, " ", &sv)) {
        printf("== LOOM_CUDA_HEAD_AM=0\n");
        run_fixture(d, LOOM_KV_BF16);
    }
    unsetenv("LOOM_CUDA_HEAD_AM");
    loom_cuda_free(C);
    printf("cuda forward: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
