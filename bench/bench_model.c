/* bench_model: end-to-end prefill and decode speed of whole models, each
 * figure next to the physical limit measured in the same run.
 *
 *   bench_model --model DIR [--model DIR2 ...] [-p 512] [-n 128] [--reps 5]
 *               [--threads N] [--json]
 *
 * 1. Limits. Memory read bandwidth: every thread streams its share of a
 *    1 GiB buffer (far past the caches), median of several passes. Peak
 *    arithmetic: every thread runs independent FMA chains (f32) on the
 *    widest registers the CPU has (AVX-512 where present, else AVX2).
 *    Both are measured at the start, next to each model's timings and at
 *    the end; the table uses the best of those (on a shared machine a
 *    single measurement says what other processes left over, not what the
 *    machine can do).
 * 2. Validation, before anything is timed. With DIR/reference.safetensors
 *    (the Hugging Face reference: prompt.i.ids / .logits / .greedy) the
 *    logits of each prompt must be within 1e-5 (max |diff| / max |ref|) and
 *    the greedy continuation must match exactly. Without one, the logits of
 *    a short prompt evaluated in one batch must equal (within 1e-4, or 5e-2
 *    with --fast, whose batched and one-token paths round differently; same
 *    measure) those from evaluating it one token at a time, and be finite
 *    and not all zero. A model that fails is not timed; the exit code is 1.
 * 3. Prefill (llama-bench "pp"): a p-token prompt in one forward from an
 *    empty context, logits for the last token only; tokens/s, median of
 *    reps (after one untimed warm-up run).
 * 4. Decode (llama-bench "tg"): after a TG_PROMPT-token prompt (untimed), n
 *    single-token steps feeding back the argmax; tokens/s, median of reps.
 *
 * Decode bound. A decode step must read every weight it uses once: every
 * layer's matrices and norms, the final norm, the lm_head (the embedding
 * matrix when tied) and one embedding row, plus the K and V of every
 * earlier position in every layer. bytes/token = those weight bytes (as
 * stored in the file) + the average KV bytes over the timed steps;
 * bound tok/s = bandwidth / bytes per token.
 * Prefill work. FLOPs per prompt token = 2 x (matrix weights of the
 * layers) + attention (QK^T and AV over the causal prefix, averaged over
 * the prompt) + the lm_head once per prompt (shared by p tokens). GFLOP/s =
 * that x pp tok/s, shown as a percentage of the measured FMA peak. */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/kv.h"
#include "load/config.h"
#include "load/safetensors.h"
#include "ops/ops.h"

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 7
#define PEAK_ITERS 20000000L
#define PEAK_PASSES 5
#define TG_PROMPT 8          /* decode starts after this many prompt tokens */
#define CHECK_TOKENS 16      /* prompt length of the batched-vs-stepwise check */
#define REF_TOL 1e-5
#define SELF_TOL 1e-4
/* --fast rounds activations per call: the batched GEMM and the one-token
 * matvec round differently, and on random weights one flipped rounding
 * moves the logits by about 2.6% of the largest (as loom bench allows). */
#define SELF_TOL_FAST 5e-2
static double self_tol = SELF_TOL;
#define MAX_MODELS 16

/* Bytes per element of the KV cache, whatever type the pool stores. */
#define KV_ELEM_BYTES sizeof(float) /* contexts keep f32 KV */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- machine limits ----------------------------------------------------- */

/* Runs fn on n threads that start together behind a barrier; returns the
 * wall time from the first start to the last finish. */
typedef struct par_job {
    void (*fn)(int i, int n, void *arg);
    void *arg;
    int i, n;
    pthread_barrier_t *bar;
    double t0, t1;
} par_job;

static void *par_main(void *p) {
    par_job *j = p;
    pthread_barrier_wait(j->bar);
    j->t0 = loom_now();
    j->fn(j->i, j->n, j->arg);
    j->t1 = loom_now();
    return NULL;
}

static double par_run(int n, void (*fn)(int, int, void *), void *arg) {
    pthread_t th[256];
    par_job jobs[256];
    pthread_barrier_t bar;
    n = LOOM_MIN(n, 256);
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        jobs[i] = (par_job){.fn = fn, .arg = arg, .i = i, .n = n, .bar = &bar};
        if (i) pthread_create(&th[i], NULL, par_main, &jobs[i]);
    }
    par_main(&jobs[0]);
    double t0 = jobs[0].t0, t1 = jobs[0].t1;
    for (int i = 1; i < n; i++) {
        pthread_join(th[i], NULL);
        t0 = LOOM_MIN(t0, jobs[i].t0);
        t1 = LOOM_MAX(t1, jobs[i].t1);
    }
    pthread_barrier_destroy(&bar);
    return t1 - t0;
}

typedef struct bw_arg {
    const uint8_t *buf;
    size_t bytes;
    volatile uint64_t sink[256];
} bw_arg;

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0;
    for (size_t i = 0; i + 2 <= n / 8; i += 2) {
        a ^= q[i];
        b ^= q[i + 1];
    }
    return a ^ b;
}

static void bw_worker(int i, int n, void *p) {
    bw_arg *a = p;
    size_t chunk = (a->bytes / (size_t)n) & ~(size_t)127;
    const uint8_t *s = a->buf + (size_t)i * chunk;
    a->sink[i] = __builtin_cpu_supports("avx2") ? read_avx2(s, chunk) : read_scalar(s, chunk);
}

/* Read bandwidth in GB/s (1e9 bytes), median of BW_PASSES; 0 on failure. */
static double measure_bandwidth(int threads) {
    static bw_arg a;
    a.bytes = BW_BYTES;
    uint8_t *buf = loom_alloc(BW_BYTES);
    if (!buf) return 0;
    memset(buf, 0x5a, BW_BYTES); /* real pages, not the shared zero page */
    a.buf = buf;
    double gbs[BW_PASSES];
    par_run(threads, bw_worker, &a); /* warm-up */
    size_t chunk = (BW_BYTES / (size_t)threads) & ~(size_t)127;
    for (int r = 0; r < BW_PASSES; r++)
        gbs[r] = (double)(chunk * (size_t)threads) / par_run(threads, bw_worker, &a) / 1e9;
    loom_free(buf);
    return median(gbs, BW_PASSES);
}

typedef struct peak_arg {
    volatile float sink[256];
} peak_arg;

/* 12 independent chains cover FMA latency x ports on current x86 cores.
 * Each chain starts from a different value: identical chains would be
 * merged into one by the compiler. */
__attribute__((target("avx2,fma"))) static float fma_chains(long iters) {
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 x0 = _mm256_set1_ps(1.00f), x1 = _mm256_set1_ps(1.01f), x2 = _mm256_set1_ps(1.02f);
    __m256 x3 = _mm256_set1_ps(1.03f), x4 = _mm256_set1_ps(1.04f), x5 = _mm256_set1_ps(1.05f);
    __m256 x6 = _mm256_set1_ps(1.06f), x7 = _mm256_set1_ps(1.07f), x8 = _mm256_set1_ps(1.08f);
    __m256 x9 = _mm256_set1_ps(1.09f), x10 = _mm256_set1_ps(1.10f), x11 = _mm256_set1_ps(1.11f);
    for (long i = 0; i < iters; i++) {
        x0 = _mm256_fmadd_ps(x0, m, c); x1 = _mm256_fmadd_ps(x1, m, c);
        x2 = _mm256_fmadd_ps(x2, m, c); x3 = _mm256_fmadd_ps(x3, m, c);
        x4 = _mm256_fmadd_ps(x4, m, c); x5 = _mm256_fmadd_ps(x5, m, c);
        x6 = _mm256_fmadd_ps(x6, m, c); x7 = _mm256_fmadd_ps(x7, m, c);
        x8 = _mm256_fmadd_ps(x8, m, c); x9 = _mm256_fmadd_ps(x9, m, c);
        x10 = _mm256_fmadd_ps(x10, m, c); x11 = _mm256_fmadd_ps(x11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                             _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

/* The same on 512-bit registers: on cores with two 512-bit FMA ports
 * (Intel Xeon) twice the AVX2 figure, which the AVX-512 kernels can
 * reach; on Zen 4 (double-pumped) the same. */
__attribute__((target("avx512f"))) static float fma_chains512(long iters) {
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 x[12];
    for (int i = 0; i < 12; i++) x[i] = _mm512_set1_ps(1.0f + 0.01f * (float)i);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) x[j] = _mm512_fmadd_ps(x[j], m, c);
    }
    __m512 s = x[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, x[i]);
    return _mm512_reduce_add_ps(s);
}

static int peak_lanes(void) { return __builtin_cpu_supports("avx512f") ? 16 : 8; }

static void peak_worker(int i, int n, void *p) {
    (void)n;
    ((peak_arg *)p)->sink[i] = peak_lanes() == 16 ? fma_chains512(PEAK_ITERS) : fma_chains(PEAK_ITERS);
}

/* f32 FMA peak in GFLOP/s over all threads, median of PEAK_PASSES; 0 when
 * the CPU has no AVX2/FMA. */
static double measure_peak(int threads) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    static peak_arg a;
    double g[PEAK_PASSES];
    double flop = 12.0 * peak_lanes() * 2 * (double)PEAK_ITERS * threads;
    par_run(threads, peak_worker, &a);
    for (int r = 0; r < PEAK_PASSES; r++) g[r] = flop / par_run(threads, peak_worker, &a) / 1e9;
    return median(g, PEAK_PASSES);
}

/* ---- model accounting --------------------------------------------------- */

typedef struct model_cost {
    char dtype[16];          /* dtype holding most of the weight bytes */
    double params;           /* every stored element (tied lm_head once) */
    double weight_bytes;     /* read per decode token */
    double kv_bytes;         /* average KV read per timed decode token */
    double flop_per_pp_token;
} model_cost;

static loom_status model_cost_get(const char *dir, const loom_config *c, int p, int n,
                                  model_cost *mc) {
    loom_safetensors *st = NULL;
    loom_status s = loom_st_open_dir(dir, &st);
    if (s != LOOM_OK) return s;
    memset(mc, 0, sizeof *mc);
    double by_dtype[LOOM_DT_COUNT] = {0};
    double layer_matrix_params = 0;
    const loom_st_tensor *embed = loom_st_find(st, "model.embed_tokens.weight");
    int lm_is_embed = !loom_st_find(st, "lm_head.weight") && c->tie_embeddings;
    for (int i = 0; i < loom_st_count(st); i++) {
        const loom_st_tensor *t = loom_st_at(st, i);
        double numel = (double)t->nbytes / (double)loom_dtype_size(t->dtype);
        size_t nl = strlen(t->name);
        /* MLX packed weights: count the values, not the U32 words; their
         * scales and biases are not parameters. (Per-module bit overrides
         * are rare; the default width is used.) */
        if (t->dtype == LOOM_DT_U32 && c->quant_bits > 0) numel *= 32.0 / c->quant_bits;
        int qaux = c->quant_bits > 0 && ((nl > 7 && !strcmp(t->name + nl - 7, ".scales")) ||
                                         (nl > 7 && !strcmp(t->name + nl - 7, ".biases")));
        if (!qaux) mc->params += numel;
        by_dtype[t->dtype] += (double)t->nbytes;
        if (t == embed && !lm_is_embed) /* a gather: one row per token */
            mc->weight_bytes += (double)t->nbytes / (double)c->vocab_size;
        else
            mc->weight_bytes += (double)t->nbytes;
        if (t->ndim == 2 && !qaux && !strncmp(t->name, "model.layers.", 13)) layer_matrix_params += numel;
    }
    if (embed && lm_is_embed) /* the token's embedding row, on top of the lm_head */
        mc->weight_bytes += (double)embed->nbytes / (double)c->vocab_size;
    int best = 0;
    for (int d = 1; d < LOOM_DT_COUNT; d++)
        if (by_dtype[d] > by_dtype[best]) best = d;
    snprintf(mc->dtype, sizeof mc->dtype, "%s", loom_dtype_name((loom_dtype)best));
    for (char *q = mc->dtype; *q; q++) *q = (char)(*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
    loom_st_close(st);

    /* KV: the step at position pos attends to pos + 1 positions (the window
     * caps that), K and V, every layer. Steps run at TG_PROMPT .. +n-1. */
    double kv_row = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * (double)KV_ELEM_BYTES;
    double sum = 0;
    for (int pos = TG_PROMPT; pos < TG_PROMPT + n; pos++) {
        int span = pos + 1;
        if (c->sliding_window > 0) span = LOOM_MIN(span, c->sliding_window);
        sum += span;
    }
    mc->kv_bytes = n > 0 ? kv_row * sum / n : 0;

    /* Prefill FLOPs per token, averaged over a p-token prompt. */
    double attn = 0;
    for (int t = 0; t < p; t++) {
        int span = t + 1;
        if (c->sliding_window > 0) span = LOOM_MIN(span, c->sliding_window);
        attn += 4.0 * c->n_heads * c->head_dim * span; /* QK^T and AV */
    }
    mc->flop_per_pp_token = 2.0 * layer_matrix_params + attn * c->n_layers / p +
                            2.0 * c->vocab_size * c->hidden_size / p;
    return LOOM_OK;
}

/* ---- validation --------------------------------------------------------- */

/* max |a - ref| / max |ref|; +inf if anything is not finite or ref is all 0. */
static double rel_err(const float *a, const float *ref, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i])) return INFINITY;
        e = LOOM_MAX(e, fabs((double)a[i] - ref[i]));
        m = LOOM_MAX(m, fabs((double)ref[i]));
    }
    return m > 0 ? e / m : INFINITY;
}

/* Reads a 1-D I32 or I64 id tensor into a new int32 array. */
static int32_t *ids_from(const loom_st_tensor *t, int *n) {
    if (t->ndim != 1 || (t->dtype != LOOM_DT_I32 && t->dtype != LOOM_DT_I64)) return NULL;
    *n = (int)t->shape[0];
    int32_t *v = malloc(sizeof *v * (size_t)(*n + 1));
    for (int i = 0; v && i < *n; i++)
        v[i] = t->dtype == LOOM_DT_I32 ? ((const int32_t *)t->data)[i]
                                       : (int32_t)((const int64_t *)t->data)[i];
    return v;
}

/* Checks against reference.safetensors. Returns 1 when every prompt passes;
 * writes a one-line summary (or the failure) into why. */
static int validate_reference(loom_model *m, const char *path, char *why, size_t wn) {
    loom_safetensors *ref = NULL;
    if (loom_st_open(path, &ref) != LOOM_OK) {
        snprintf(why, wn, "%s: %s", path, loom_last_error());
        return 0;
    }
    int V = loom_model_vocab_size(m), ok = 1, n_prompts = 0;
    double worst = 0;
    for (int i = 0; ok; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *ids = loom_st_find(ref, name);
        if (!ids) break;
        snprintf(name, sizeof name, "prompt.%d.logits", i);
        const loom_st_tensor *lg = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.greedy", i);
        const loom_st_tensor *gr = loom_st_find(ref, name);
        int L = 0, G = 0;
        int32_t *tok = ids_from(ids, &L), *want = gr ? ids_from(gr, &G) : NULL;
        if (!tok || !want || !lg || lg->dtype != LOOM_DT_F32 || lg->ndim != 2 ||
            lg->shape[0] != L || lg->shape[1] != V) {
            snprintf(why, wn, "%s: prompt %d: expected I32 ids, F32 logits [%d, %d] and greedy "
                     "ids", path, i, L, V);
            ok = 0;
        }
        float *got = ok ? malloc(sizeof(float) * (size_t)L * V) : NULL;
        int32_t *out = ok ? malloc(sizeof *out * (size_t)(G + 1)) : NULL;
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = L + G + 8;
        if (ok && (!got || !out || loom_context_create(m, &cp, &c) != LOOM_OK ||
                   loom_context_eval(c, tok, L, 1, got) != LOOM_OK)) {
            snprintf(why, wn, "prompt %d: evaluation failed: %s", i, loom_last_error());
            ok = 0;
        }
        if (ok) {
            double e = rel_err(got, lg->data, (size_t)L * V);
            worst = LOOM_MAX(worst, e);
            if (!(e <= REF_TOL)) {
                snprintf(why, wn, "prompt %d (%d tokens): logits differ from the reference by "
                         "%.3g (max |diff| / max |ref|), expected <= %g", i, L, e, REF_TOL);
                ok = 0;
            }
        }
        int n_out = 0;
        if (ok && (loom_context_truncate(c, 0) != LOOM_OK ||
                   loom_generate_greedy(c, tok, L, G, NULL, 0, out, &n_out) != LOOM_OK)) {
            snprintf(why, wn, "prompt %d: greedy generation failed: %s", i, loom_last_error());
            ok = 0;
        }
        for (int t = 0; ok && t < G; t++)
            if (t >= n_out || out[t] != want[t]) {
                snprintf(why, wn, "prompt %d: greedy token %d is %d, reference %d", i, t,
                         t < n_out ? out[t] : -1, want[t]);
                ok = 0;
            }
        loom_context_free(c);
        free(got);
        free(out);
        free(tok);
        free(want);
        n_prompts += ok;
    }
    loom_st_close(ref);
    if (ok && !n_prompts) {
        snprintf(why, wn, "%s: no prompt.0.ids", path);
        ok = 0;
    }
    if (ok)
        snprintf(why, wn, "reference: %d prompts, logits within %.2g, greedy exact", n_prompts,
                 worst);
    return ok;
}

/* Batched vs one-token-at-a-time logits on a short prompt. */
static int validate_self(loom_model *m, const int32_t *tok, char *why, size_t wn) {
    int V = loom_model_vocab_size(m), L = CHECK_TOKENS, ok = 0;
    float *a = malloc(sizeof(float) * (size_t)L * V), *b = malloc(sizeof(float) * (size_t)L * V);
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = L;
    if (!a || !b || loom_context_create(m, &cp, &c) != LOOM_OK ||
        loom_context_eval(c, tok, L, 1, a) != LOOM_OK || loom_context_truncate(c, 0) != LOOM_OK) {
        snprintf(why, wn, "evaluation failed: %s", loom_last_error());
        goto out;
    }
    for (int t = 0; t < L; t++)
        if (loom_context_eval(c, tok + t, 1, 1, b + (size_t)t * V) != LOOM_OK) {
            snprintf(why, wn, "evaluation failed: %s", loom_last_error());
            goto out;
        }
    double e = rel_err(a, b, (size_t)L * V);
    if (!(e <= self_tol)) {
        snprintf(why, wn, "%d-token prompt: batched logits differ from token-by-token by %.3g "
                 "(max |diff| / max |logit|; inf = non-finite or all zero), expected <= %g",
                 L, e, self_tol);
        goto out;
    }
    snprintf(why, wn, "self-consistency: batched vs token-by-token within %.2g, finite", e);
    ok = 1;
out:
    loom_context_free(c);
    free(a);
    free(b);
    return ok;
}

/* ---- timing ------------------------------------------------------------- */

typedef struct result {
    char name[128];
    model_cost cost;
    double pp[64], tg[64];   /* tok/s per rep */
    char dir[512];
    int has_ref;             /* validated against reference.safetensors */
    double peak;             /* FMA GFLOP/s measured just before the pp reps */
    double bw, bw_after;     /* read GB/s measured just before and after the tg reps */
    double pp_med, tg_med;
} result;

/* Decode as a share of the bound from the bandwidth measured around its
 * own reps: on a shared host the bandwidth left over moves by a factor of
 * two within minutes, so this says how close the kernels come to what the
 * memory gave them at the time. */
static double pct_at_tg(const result *R) {
    double bpt = R->cost.weight_bytes + R->cost.kv_bytes, s = 0;
    int k = 0;
    if (R->bw > 0) s += R->bw, k++;  /* a failed probe reads 0 */
    if (R->bw_after > 0) s += R->bw_after, k++;
    return k ? 100.0 * R->tg_med * bpt / (s / k * 1e9) : 0.0;
}

/* Prefill: the whole prompt from an empty context, last logits only. */
static loom_status time_pp(loom_context *c, const int32_t *tok, int p, float *logits,
                           double *tps) {
    loom_status s = loom_context_truncate(c, 0);
    double t0 = loom_now();
    if (s == LOOM_OK) s = loom_context_eval(c, tok, p, 0, logits);
    *tps = p / (loom_now() - t0);
    return s;
}

/* Decode: TG_PROMPT tokens untimed, then n steps feeding back the argmax. */
static loom_status time_tg(loom_context *c, const int32_t *tok, int n, int V, float *logits,
                           double *tps) {
    loom_status s = loom_context_truncate(c, 0);
    if (s == LOOM_OK) s = loom_context_eval(c, tok, TG_PROMPT, 0, logits);
    double t0 = loom_now();
    for (int i = 0; i < n && s == LOOM_OK; i++) {
        int32_t id = loom_argmax(logits, V);
        s = loom_context_eval(c, &id, 1, 0, logits);
    }
    *tps = n / (loom_now() - t0);
    return s;
}

/* Last-level cache of CPU 0 in bytes from sysfs (sysconf reports the
 * host's in some VMs); 0 if unknown. */
static double llc_bytes(void) {
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    double v = 0;
    char unit = 0;
    if (f && fscanf(f, "%lf%c", &v, &unit) >= 1)
        v *= unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0;
    if (f) fclose(f);
    return v;
}

/* One-minute load average, -1 if unknown. */
static double load_average(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f && fscanf(f, "%lf", &v) != 1) v = -1;
    if (f) fclose(f);
    return v;
}

static const char *base_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    const char *b = dir + n;
    while (b > dir && b[-1] != '/') b--;
    return b;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: bench_model --model DIR [--model DIR ...] [-p 512] [-n 128] [--reps 5]\n"
        "                   [--threads N] [--json] [--fast]\n"
        "       bench_model --bandwidth [--threads N]\n"
        "Validates each model, then times prefill (pp, p-token prompt) and decode\n"
        "(tg, n steps) and compares decode with the memory-bandwidth bound.\n"
        "--json prints one JSON object per model instead of the table.\n"
        "--fast times the reduced-precision matmuls (loom --fast).\n"
        "--bandwidth only measures the read bandwidth and prints {\"bandwidth_gbs\": X}\n"
        "(to bracket another program's run with the bandwidth it had).\n");
}

static int int_arg(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "bench_model: %s: expected an integer in [%d, %d], got \"%s\"\n", flag,
                lo, hi, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

static void fmt_count(char *buf, size_t n, double v) {
    if (v >= 1e9) snprintf(buf, n, "%.2fB", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.1fM", v / 1e6);
    else snprintf(buf, n, "%.1fK", v / 1e3);
}

int main(int argc, char **argv) {
    const char *dirs[MAX_MODELS];
    int n_dirs = 0, p = 512, n = 128, reps = 5, threads = loom_cpu_count(), json = 0, fast = 0;
    int bw_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--bandwidth")) {
            bw_only = 1;
            continue;
        }
        if (!strcmp(a, "--fast")) {
            fast = 1;
            self_tol = SELF_TOL_FAST;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_model: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int ok = 1;
        if (!strcmp(a, "--model")) {
            if (n_dirs == MAX_MODELS) {
                fprintf(stderr, "bench_model: at most %d models\n", MAX_MODELS);
                return 2;
            }
            dirs[n_dirs++] = v;
        } else if (!strcmp(a, "-p")) ok = int_arg(a, v, 1, 1 << 16, &p);
        else if (!strcmp(a, "-n")) ok = int_arg(a, v, 1, 1 << 16, &n);
        else if (!strcmp(a, "--reps")) ok = int_arg(a, v, 1, 64, &reps);
        else if (!strcmp(a, "--threads")) ok = int_arg(a, v, 1, 256, &threads);
        else {
            fprintf(stderr, "bench_model: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    if (bw_only) {
        double b = measure_bandwidth(threads);
        if (b <= 0) fprintf(stderr, "bench_model: cannot allocate the 1 GiB bandwidth buffer\n");
        else printf("{\"bandwidth_gbs\":%.3f,\"threads\":%d}\n", b, threads);
        return b <= 0;
    }
    if (!n_dirs) {
        usage(stderr);
        return 2;
    }

    double bw = measure_bandwidth(threads), peak = measure_peak(threads);
    double bw_best = bw, peak_best = peak, load_start = load_average();
    if (bw <= 0) {
        fprintf(stderr, "bench_model: cannot allocate the 1 GiB bandwidth buffer\n");
        return 1;
    }
    if (!json) {
        printf("memory read bandwidth: %.1f GB/s (%d threads streaming 1 GiB, median of %d)\n",
               bw, threads, BW_PASSES);
        printf("f32 FMA peak:          %.1f GFLOP/s (%d threads, %s FMA, median of %d)\n",
               peak, threads, peak_lanes() == 16 ? "AVX-512" : "AVX2", PEAK_PASSES);
        if (load_start >= 0.5)
            printf("load average %.2f on %d CPUs: other processes compete for the cores and "
                   "memory; expect noise\n", load_start, loom_cpu_count());
        fflush(stdout);
    }

    static result res[MAX_MODELS];
    int n_res = 0, failed = 0;
    int32_t *tok = malloc(sizeof *tok * (size_t)LOOM_MAX(p, TG_PROMPT + CHECK_TOKENS));
    for (int d = 0; d < n_dirs; d++) {
        const char *dir = dirs[d];
        loom_config cfg;
        loom_model *m = NULL;
        loom_model_params mp = loom_model_default_params();
        mp.n_threads = threads;
        mp.fast_matmul = fast;
        if (loom_config_load(dir, &cfg) != LOOM_OK || loom_model_load(dir, &mp, &m) != LOOM_OK) {
            fprintf(stderr, "bench_model: %s: %s\n", dir, loom_last_error());
            failed = 1;
            continue;
        }
        int V = loom_model_vocab_size(m);
        /* Fixed pseudo-random ids: the same prompt in every run. */
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < LOOM_MAX(p, TG_PROMPT + CHECK_TOKENS); i++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            tok[i] = (int32_t)(r % (uint64_t)V);
        }

        char why[8192], ref_path[4096];
        snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", dir);
        FILE *probe = fopen(ref_path, "rb");
        int has_ref = probe != NULL;
        if (probe) fclose(probe);
        int ok = has_ref ? validate_reference(m, ref_path, why, sizeof why)
                         : validate_self(m, tok, why, sizeof why);
        if (!ok) {
            fprintf(stderr, "bench_model: %s: validation FAILED, not timed: %s\n", dir, why);
            loom_model_free(m);
            failed = 1;
            continue;
        }
        fprintf(json ? stderr : stdout, "validated %s: %s\n", dir, why);
        fflush(stdout);

        result *R = &res[n_res];
        snprintf(R->name, sizeof R->name, "%s", base_name(dir));
        if (model_cost_get(dir, &cfg, p, n, &R->cost) != LOOM_OK) {
            fprintf(stderr, "bench_model: %s: %s\n", dir, loom_last_error());
            loom_model_free(m);
            failed = 1;
            continue;
        }
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = LOOM_MAX(p, TG_PROMPT + n) + 16;
        cp.n_batch = p;
        float *logits = malloc(sizeof(float) * (size_t)V);
        loom_status s = logits ? loom_context_create(m, &cp, &c) : LOOM_ERR_NOMEM;
        double dummy;
        if (s == LOOM_OK) s = time_pp(c, tok, p, logits, &dummy); /* warm-up: pages, caches */
        /* The limits are measured again next to each timing: on a shared
         * machine what other processes leave over changes by the minute. */
        fprintf(stderr, "timing %s: pp%d x %d, tg%d x %d\n", dir, p, reps, n, reps);
        R->peak = measure_peak(threads);
        for (int i = 0; i < reps && s == LOOM_OK; i++) s = time_pp(c, tok, p, logits, &R->pp[i]);
        R->bw = measure_bandwidth(threads);
        if (s == LOOM_OK) s = time_tg(c, tok, n, V, logits, &dummy);
        for (int i = 0; i < reps && s == LOOM_OK; i++)
            s = time_tg(c, tok, n, V, logits, &R->tg[i]);
        R->bw_after = measure_bandwidth(threads);
        loom_context_free(c);
        free(logits);
        loom_model_free(m);
        if (s != LOOM_OK) {
            fprintf(stderr, "bench_model: %s: %s\n", dir, loom_last_error());
            failed = 1;
            continue;
        }
        double tmp[64];
        memcpy(tmp, R->pp, sizeof(double) * (size_t)reps);
        R->pp_med = median(tmp, reps);
        memcpy(tmp, R->tg, sizeof(double) * (size_t)reps);
        R->tg_med = median(tmp, reps);
        R->has_ref = has_ref;
        snprintf(R->dir, sizeof R->dir, "%s", dir);
        n_res++;
    }
    /* One more pair of measurements after the last model, then the limits
     * are the best seen in the run: what the machine can do, not what other
     * processes happened to leave over at one moment. */
    bw_best = LOOM_MAX(bw_best, measure_bandwidth(threads));
    peak_best = LOOM_MAX(peak_best, measure_peak(threads));
    for (int i = 0; i < n_res; i++) {
        bw_best = LOOM_MAX(bw_best, LOOM_MAX(res[i].bw, res[i].bw_after));
        peak_best = LOOM_MAX(peak_best, res[i].peak);
    }

    for (int i = 0; json && i < n_res; i++) {
        const result *R = &res[i];
        const model_cost *mc = &R->cost;
        double bpt = mc->weight_bytes + mc->kv_bytes, bound = bw_best / (bpt / 1e9);
        double gflops = mc->flop_per_pp_token * R->pp_med / 1e9;
        printf("{\"model\":\"%s\",\"dir\":\"%s\",\"weights\":\"%s\",\"params\":%.0f,"
               "\"fast\":%d,\"threads\":%d,\"p\":%d,\"n\":%d,\"reps\":%d,\"validation\":\"%s\","
               "\"bandwidth_gbs\":%.3f,\"bandwidth_gbs_at_tg\":%.3f,"
               "\"bandwidth_gbs_after_tg\":%.3f,\"fma_peak_gflops\":%.3f,"
               "\"fma_peak_gflops_at_pp\":%.3f,"
               "\"weight_bytes_per_token\":%.0f,\"kv_bytes_per_token\":%.0f,"
               "\"flop_per_pp_token\":%.0f,\"pp_tps\":%.3f,\"pp_gflops\":%.3f,"
               "\"pp_pct_of_peak\":%.2f,\"tg_tps\":%.3f,\"tg_bound_tps\":%.3f,"
               "\"tg_pct_of_bound\":%.2f,\"tg_pct_of_bound_at_tg\":%.2f,\"load_avg\":%.2f,",
               R->name, R->dir, mc->dtype, mc->params, fast, threads, p, n, reps,
               R->has_ref ? "reference" : "self", bw_best, R->bw, R->bw_after, peak_best, R->peak,
               mc->weight_bytes, mc->kv_bytes, mc->flop_per_pp_token, R->pp_med, gflops,
               peak_best > 0 ? 100.0 * gflops / peak_best : 0.0, R->tg_med, bound,
               100.0 * R->tg_med / bound, pct_at_tg(R), load_start);
        printf("\"pp_reps\":[");
        for (int k = 0; k < reps; k++) printf("%s%.3f", k ? "," : "", R->pp[k]);
        printf("],\"tg_reps\":[");
        for (int k = 0; k < reps; k++) printf("%s%.3f", k ? "," : "", R->tg[k]);
        printf("]}\n");
    }

    if (!json && n_res) {
        printf("\nlimits (best of %d measurements in this run, each a median of passes): "
               "read bandwidth %.1f GB/s, f32 FMA peak %.1f GFLOP/s\n",
               n_res * 1 + 2, bw_best, peak_best);
        printf("threads %d, pp%d and tg%d (after a %d-token prompt), median of %d reps; "
               "tg bound = bandwidth / MB per decode token; %% at tg: against the bandwidth "
               "measured just before and after the tg reps\n\n", threads, p, n, TG_PROMPT,
               reps);
        printf("| %-18s | %-7s | %-7s | %9s | %10s | %6s | %9s | %8s | %14s | %10s | %9s |\n",
               "model", "weights", "params", "pp tok/s", "pp GFLOP/s", "% peak", "tg tok/s",
               "MB/token", "tg bound tok/s", "% of bound", "% at tg");
        static const int width[] = {20, 9, 9, 11, 12, 8, 11, 10, 16, 12, 11};
        for (size_t k = 0; k < LOOM_ARRAY_LEN(width); k++) {
            printf("|");
            for (int w = 0; w < width[k]; w++) putchar(k >= 3 && w == width[k] - 1 ? ':' : '-');
        }
        printf("|\n");
        for (int i = 0; i < n_res; i++) {
            const result *R = &res[i];
            const model_cost *mc = &R->cost;
            double bpt = mc->weight_bytes + mc->kv_bytes, bound = bw_best / (bpt / 1e9);
            double gflops = mc->flop_per_pp_token * R->pp_med / 1e9;
            char params[32];
            fmt_count(params, sizeof params, mc->params);
            printf("| %-18s | %-7s | %-7s | %9.1f | %10.1f | %5.1f%% | %9.2f | %8.1f | %14.2f | "
                   "%9.1f%% | %8.1f%% |\n",
                   R->name, mc->dtype, params, R->pp_med, gflops,
                   peak_best > 0 ? 100.0 * gflops / peak_best : 0.0, R->tg_med, bpt / 1e6,
                   bound, 100.0 * R->tg_med / bound, pct_at_tg(R));
        }
        for (int i = 0; i < n_res; i++) {
            const result *R = &res[i];
            double lo[2] = {R->pp[0], R->tg[0]}, hi[2] = {R->pp[0], R->tg[0]};
            for (int k = 1; k < reps; k++) {
                lo[0] = LOOM_MIN(lo[0], R->pp[k]);
                hi[0] = LOOM_MAX(hi[0], R->pp[k]);
                lo[1] = LOOM_MIN(lo[1], R->tg[k]);
                hi[1] = LOOM_MAX(hi[1], R->tg[k]);
            }
            for (int k = 0; k < 2; k++)
                if (hi[k] > 1.2 * lo[k])
                    printf("note: %s %s reps spread from %.2f to %.2f tok/s (noise)\n", R->name,
                           k ? "tg" : "pp", lo[k], hi[k]);
        }
        double llc = llc_bytes();
        for (int i = 0; i < n_res; i++) {
            double bpt = res[i].cost.weight_bytes + res[i].cost.kv_bytes;
            if (llc > 0 && bpt < llc)
                printf("note: %s moves %.1f MB per token, less than the %.0f MiB last-level "
                       "cache; its weights can stay cached, so the DRAM bound understates "
                       "what is possible\n", res[i].name, bpt / 1e6, llc / (1 << 20));
        }
    }
    free(tok);
    return failed;
}
