/* loom bench: prefill and decode throughput, llama-bench style.
 *
 * pp<p>: one prompt of p tokens evaluated from an empty context (a single
 * batched forward when p fits the batch). tg<n>: n tokens generated one at
 * a time (greedy, each fed back) after a short untimed prompt. Each test
 * runs once to warm up, then reps times; the table gives the median and
 * the spread (standard deviation, min..max), plus tokens per CPU second.
 * Several models interleave their repeats and are reported as ratios to
 * the first, so a comparison holds even on a machine busy with other work.
 * tg<n>@b<B> (--batch B,...): B sequences decoding together through the
 * engine (continuous batching, one forward per step for all B rows):
 * aggregate tokens per second over the steps after every sequence has its
 * first token; before timing, the greedy tokens of the batch are checked
 * against the context's for the same prompts (a row may leave them only
 * where the context's top two logits were within the paths' tolerance).
 * Before anything is timed the
 * run is validated: logits are finite and the one-token decode path agrees
 * with the batched path on a short prompt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cli/cli.h"
#include "load/safetensors.h"
#include "ops/ops.h"
#include "tokenize/tokenizer.h"
#include "vision/vision_bench.h"

static const char usage[] =
    "usage: loom bench --model DIR [--model DIR2 ...] [-p 512] [-n 128] [--threads N]\n"
    "                  [--reps R] [--batch B,...] [--tg-prompt N] [--kv-type T] [--json]\n"
    "                  [--speculative ngram | --draft-model DIR] [--tg-text FILE]\n"
    "       loom bench --model DIR [--model DIR2 ...] --image FILE [--reps R] [--threads N] [--json]\n"
    "\n"
    "Measures prompt processing (pp: p tokens from an empty context) and text\n"
    "generation (tg: n tokens decoded one at a time after a 4-token prompt)\n"
    "in tokens per second: the median of R runs after one warm-up run, with\n"
    "the standard deviation and range, and tokens per CPU second (process CPU\n"
    "time over all threads: steadier than wall time on a machine shared with\n"
    "other work). Validates the logits first: finite, and the one-token\n"
    "decode path agrees with the batched path on a short prompt.\n"
    "\n"
    "With several --model the repeats interleave (each repeat runs every\n"
    "model in turn, so all share the machine's load) and the table adds the\n"
    "ratio to the first model. --json prints one JSON object per model, one\n"
    "per line.\n"
    "\n"
    "  --model DIR        Hugging Face model directory (up to 8)\n"
    "  -p, --prompt N     prompt tokens for pp (default 512, 0 = skip)\n"
    "  -n, --gen N        generated tokens for tg (default 128, 0 = skip)\n"
    "  --threads N        worker threads (default: all cores)\n"
    "  --reps R           timed repeats (default 5)\n"
    "  --batch B,...      also decode n tokens in B sequences at once through the\n"
    "                     engine (aggregate tokens/s), for each B in the list\n"
    "  --tg-prompt N      prompt tokens before tg and the batched decode (default 4)\n"
    "  --kv-type T        KV cache type: f32 (default), f16, bf16, q8, q4\n"
    "  --kv-config FILE   per-layer KV bits (see loom serve --help; default: each\n"
    "                     model directory's kv_config.json, if any)\n"
    "  --json             print JSON instead of the table\n"
    "  --speculative ngram, --draft-model DIR, --draft-tokens K, --spec-gate on|off,\n"
    "  --draft-exact on|off\n"
    "                     also run each --batch decode with speculative decoding,\n"
    "                     the runs alternating with the plain ones (checked to\n"
    "                     give the same greedy tokens first): tokens/s, speed-up\n"
    "                     and tokens per verifying step (1 + mean accepted run)\n"
    "  --tg-text FILE     the batched decode's prompts: tg-prompt tokens of FILE's\n"
    "                     text each (row i from token i x tg-prompt), not random ids\n"
    "  --image FILE       instead, one PNG or JPEG through each vision-language\n"
    "                     model: preprocessing, the tower's encode (GFLOP/s and its\n"
    "                     share of the model's own matmul on the tower's dtype) and\n"
    "                     file to first token, medians of R (bench/bench_vision's run)\n";

/* Speculative decoding of the batched decode (--speculative, --draft-model). */
static loom_engine_params spec_ep;
static const char *spec_draft_dir, *tg_text;

#define CHECK_LEN 8
#define MAX_BATCHES 8
#define CHECK_GEN 8         /* greedy tokens compared, batch vs context */

static int tg_prompt = 4;   /* --tg-prompt */

/* --image: the vision first-token bench (vision/vision_bench.h) on each model. */
static int bench_image(const char *const *dirs, int nm, const char *image, int reps, int threads,
                       int json) {
    for (int k = 0; k < nm; k++) {
        loom_model *m = NULL;
        loom_vision *v = NULL;
        loom_model_params mp = loom_model_default_params();
        mp.n_threads = threads;
        mp.fast_matmul = cli_fast;
        mp.quantize_bits = cli_quantize;
        loom_status s = loom_model_load(dirs[k], &mp, &m);
        if (!s) s = loom_vision_load(m, dirs[k], &v);
        if (!s && !v)
            s = loom_err(LOOM_ERR_UNSUPPORTED, "%s has no vision tower (no vision_config in "
                         "config.json), so it takes no --image", dirs[k]);
        loom_vision_bench b;
        if (!s) s = loom_vision_bench_run(m, v, dirs[k], image, reps, &b);
        if (!s) {
            loom_buf out = {0};
            loom_vision_bench_format(&b, dirs[k], image, json, &out);
            if (out.p) fputs(out.p, stdout);
            loom_buf_free(&out);
        }
        loom_vision_free(v);
        loom_model_free(m);
        if (s) return cli_fail("bench --image", s);
    }
    return 0;
}

typedef struct stats {
    double median, mean, sd, min, max;
} stats;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static stats summarize(double *v, int n) {
    stats s = {0};
    if (!n) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    s.min = v[0];
    s.max = v[n - 1];
    for (int i = 0; i < n; i++) s.mean += v[i] / n;
    for (int i = 0; i < n; i++) s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(s.sd / (n - 1)) : 0;
    return s;
}

/* Deterministic prompt ids spread over the vocabulary. */
static void fill_tokens(int32_t *t, int n, int vocab) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        t[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

/* Logit tolerance between the batched and one-row paths, relative to
 * max(1, max |logit|): the reasons are in validate(). */
static double path_tol(void) { return cli_device >= 0 || cli_fast ? 5e-2 : 1e-2; }

/* Batched vs one-at-a-time logits on a short prompt; prints the failure
 * and returns nonzero when they are not finite or do not agree. */
static int validate(loom_context *c, const int32_t *toks, int V, float *a, float *b) {
    loom_status s;
    if ((s = loom_context_truncate(c, 0)) || (s = loom_context_eval(c, toks, CHECK_LEN, 1, a)))
        return cli_fail("validation (batched)", s);
    if ((s = loom_context_truncate(c, 0))) return cli_fail("validation", s);
    for (int i = 0; i < CHECK_LEN; i++)
        if ((s = loom_context_eval(c, toks + i, 1, 0, b + (size_t)i * V)))
            return cli_fail("validation (decode)", s);
    double max_abs = 0, max_diff = 0;
    int argmax_diff = 0;
    for (size_t i = 0; i < (size_t)CHECK_LEN * V; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            fprintf(stderr, "loom: error: bench validation: logit %zu of position %zu is not "
                    "finite (batched %g, decode %g)\n", i % V, i / V, a[i], b[i]);
            return 1;
        }
        max_abs = fmax(max_abs, fabs(a[i]));
        max_diff = fmax(max_diff, fabs(a[i] - b[i]));
    }
    for (int i = 0; i < CHECK_LEN; i++)
        argmax_diff += loom_argmax(a + (size_t)i * V, V) != loom_argmax(b + (size_t)i * V, V);
    /* Batched and decode kernels sum in different orders (and may round
     * activations differently): agree to 1% of the logit range. On a GPU
     * the activations enter each bf16/f16 GEMM rounded to 8 (11) bits; a
     * rounding that flips in one path and not the other grows through the
     * layers (1.8% seen on a 32-layer random model): 5% there, and with
     * --fast on the CPU (int8 activations: 2.6% seen on a 28-layer random
     * model). */
    double tol = path_tol() * fmax(1.0, max_abs);
    if (max_diff > tol) {
        fprintf(stderr, "loom: error: bench validation: the batched and decode paths disagree: "
                "max |diff| %.3g over %d positions, expected <= %.3g (max |logit| %.3g; "
                "%d argmax differ)\n", max_diff, CHECK_LEN, tol, max_abs, argmax_diff);
        return 1;
    }
    fprintf(stderr, "loom bench: validated %d positions: batched vs decode max |diff| %.3g "
            "(max |logit| %.3g), %d argmax differ\n", CHECK_LEN, max_diff, max_abs, argmax_diff);
    return 0;
}

/* CPU seconds used by the whole process (every thread). On a machine
 * shared with other work this moves much less than wall time. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One pp run: wall and CPU seconds to evaluate p tokens from an empty
 * context. */
static loom_status run_pp(loom_context *c, const int32_t *toks, int p, float *logits,
                          double *secs, double *cpu) {
    loom_status s = loom_context_truncate(c, 0);
    if (s) return s;
    double t0 = loom_now(), c0 = cpu_now();
    s = loom_context_eval(c, toks, p, 0, logits);
    *cpu = cpu_now() - c0;
    *secs = loom_now() - t0;
    return s;
}

/* One tg run: wall and CPU seconds to decode n tokens one at a time after
 * the prompt. */
static loom_status run_tg(loom_context *c, const int32_t *toks, int n, int V, float *logits,
                          double *secs, double *cpu) {
    loom_status s = loom_context_truncate(c, 0);
    if (s || (s = loom_context_eval(c, toks, tg_prompt, 0, logits))) return s;
    double t0 = loom_now(), c0 = cpu_now();
    for (int i = 0; i < n && !s; i++) {
        int32_t id = loom_argmax(logits, V);
        s = loom_context_eval(c, &id, 1, 0, logits);
    }
    *cpu = cpu_now() - c0;
    *secs = loom_now() - t0;
    return s;
}

/* The context's n greedy tokens after a prompt, and at each step the
 * margin of the chosen logit over the runner-up, relative as path_tol. */
static loom_status context_greedy(loom_context *c, const int32_t *prompt, int n_prompt, int n,
                                  int V, float *logits, int32_t *out, double *margin) {
    loom_status s = loom_context_truncate(c, 0);
    if (!s) s = loom_context_eval(c, prompt, n_prompt, 0, logits);
    for (int i = 0; !s && i < n; i++) {
        int top = loom_argmax(logits, V);
        double second = -INFINITY, big = 1;
        for (int v = 0; v < V; v++) {
            if (v != top && logits[v] > second) second = logits[v];
            big = fmax(big, fabs(logits[v]));
        }
        out[i] = top;
        margin[i] = (logits[top] - second) / big;
        if (i + 1 < n) s = loom_context_eval(c, &out[i], 1, 0, logits);
    }
    return s;
}

/* Prompt of request i in a batch: its own ids, so no two rows share KV. */
static void batch_prompt(int32_t *t, int n, int vocab, int i) {
    uint64_t x = 0x2545f4914f6cdd1dull * (uint64_t)(i + 1);
    for (int k = 0; k < n; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        t[k] = (int32_t)(x % (uint64_t)vocab);
    }
}

/* Engine stats' speculative counters, for the tokens per verifying step. */
static void spec_counts(loom_engine *e, uint64_t *acc, uint64_t *rounds, uint64_t *gated, uint64_t *steps) {
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    *acc = st.spec_accepted;
    *rounds = st.spec_rounds;
    *gated = st.spec_gated;
    *steps = st.steps;
}

/* The engine thread's CPU time per decode step by kind (loom_engine_stats),
 * over the timed repeats: a0 from before them (plain engine e, speculating
 * e2), printed as milliseconds a step. */
static void print_step_cpu(int B, const loom_engine_stats *a0, loom_engine *e,
                           const loom_engine_stats *b0, loom_engine *e2) {
    loom_engine_stats a, b;
    loom_engine_get_stats(e, &a);
    loom_engine_get_stats(e2, &b);
    double np = (double)(a.plain_steps - a0->plain_steps), ns = (double)(b.spec_steps - b0->spec_steps);
    double nsp = (double)(b.plain_steps - b0->plain_steps);
    if (np <= 0 || ns <= 0) return;
    fprintf(stderr, "loom bench: batch %d: engine thread CPU ms a step: plain forward %.3f, commit %.3f "
            "(%.0f steps); speculating: draft %.3f, forward %.3f, commit %.3f (%.0f steps; %.0f plain, "
            "forward %.3f)\n", B, 1e3 * (a.plain_fwd_cpu_s - a0->plain_fwd_cpu_s) / np,
            1e3 * (a.plain_commit_cpu_s - a0->plain_commit_cpu_s) / np, np,
            1e3 * (b.spec_draft_cpu_s - b0->spec_draft_cpu_s) / ns, 1e3 * (b.spec_fwd_cpu_s - b0->spec_fwd_cpu_s) / ns,
            1e3 * (b.spec_commit_cpu_s - b0->spec_commit_cpu_s) / ns, ns, nsp,
            nsp > 0 ? 1e3 * (b.plain_fwd_cpu_s - b0->plain_fwd_cpu_s) / nsp : 0);
}

/* Whether the speculating engine's tokens (spec) are plain decoding's
 * (plain, with its top-2 gaps). On the CPU they must be, token for token.
 * On a GPU verification runs a row's tokens through the kernels of a
 * larger step, whose f32 sums go in another order than batch-1
 * decoding's, so a row may part from plain decoding where plain's top two
 * log-probabilities were within SPEC_TIE (counted and printed). */
#define SPEC_TIE 1e-3
static int spec_same(int B, int n, const int32_t *plain, const int32_t *spec, const float *gap) {
    int ties = 0;
    for (int q = 0; q < B; q++) {
        const int32_t *p = plain + (size_t)q * n, *t = spec + (size_t)q * n;
        int d = 0;
        while (d < n && p[d] == t[d]) d++;
        if (d == n) continue;
        float g = gap[(size_t)q * n + d];
        if (cli_device >= 0 && g <= SPEC_TIE) {
            ties++;
            continue;
        }
        fprintf(stderr, "loom: error: bench validation: batch %d row %d: speculative decoding "
                "changed the greedy tokens: token %d is %d, plain decoding's %d, whose "
                "log-probability led the next by %.3g\n", B, q, d, t[d], p[d], (double)g);
        return 0;
    }
    if (ties)
        fprintf(stderr, "loom bench: batch %d: %d rows part from plain decoding at a near-tie "
                "(log-probabilities within %g)\n", B, ties, SPEC_TIE);
    return 1;
}

/* B greedy requests of n tokens after tg_prompt-token prompts, read in
 * lockstep. Aggregate tokens/s over the steps after every request had its
 * first token (prefill excluded), and the same per CPU second of the
 * process (*tok_cpu). first (B * n) receives the tokens, gap (when not
 * NULL) each token's log-probability over the runner-up's. */
static loom_status run_batch(loom_engine *e, const int32_t *prompts, int B, int n,
                             int32_t *first, float *gap, double *tok_s, double *tok_cpu) {
    loom_request **r = calloc((size_t)B, sizeof *r);
    if (!r) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    loom_status s = LOOM_OK;
    for (int i = 0; i < B && !s; i++) {
        loom_request_params rp = loom_request_default_params();
        rp.prompt = prompts + (size_t)i * tg_prompt;
        rp.n_prompt = tg_prompt;
        rp.max_tokens = n;
        rp.ignore_eos = 1;
        if (gap) rp.logprobs = 2;
        s = loom_engine_submit(e, &rp, &r[i]);
    }
    double t0 = 0, c0 = 0;
    for (int k = 0; k < n && !s; k++) {
        for (int i = 0; i < B && !s; i++) {
            loom_event ev;
            if ((s = loom_request_next(r[i], &ev, -1))) break;
            if (ev.finish) {
                s = ev.finish == LOOM_FINISH_ERROR ? ev.status : LOOM_ERR_INTERNAL;
                if (ev.finish != LOOM_FINISH_ERROR)
                    loom_err(s, "batch decode: request %d finished after %d tokens", i, k);
                break;
            }
            first[(size_t)i * n + k] = ev.token;
            if (gap)
                gap[(size_t)i * n + k] = ev.n_top >= 2 ? ev.top_logprobs[0] - ev.top_logprobs[1] : 1e9f;
        }
        if (k == 0) {
            t0 = loom_now();
            c0 = cpu_now();
        }
    }
    double t1 = loom_now(), c1 = cpu_now();
    for (int i = 0; i < B; i++) loom_request_free(r[i]);
    free(r);
    *tok_s = n > 1 && t1 > t0 ? (double)B * (n - 1) / (t1 - t0) : 0;
    *tok_cpu = n > 1 && c1 > c0 ? (double)B * (n - 1) / (c1 - c0) : 0;
    return s;
}

/* --tg-text: B prompts of tg_prompt tokens of file's text (row i from
 * token i * tg_prompt, wrapping), with the model directory's tokenizer. */
static loom_status text_prompts(const char *dir, const char *file, int32_t *prompts, int B) {
    size_t len = 0, n = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    loom_tok *tok = NULL;
    loom_status s = loom_read_file(file, &text, &len);
    if (!s) s = loom_tok_load_dir(dir, &tok);
    if (!s) s = loom_tok_encode(tok, text, len, LOOM_TOK_NO_SPECIAL, &ids, &n);
    if (!s && n == 0) s = loom_err(LOOM_ERR_INVALID_ARG, "%s encodes to no tokens", file);
    for (int i = 0; !s && i < B; i++)
        for (int k = 0; k < tg_prompt; k++)
            prompts[(size_t)i * tg_prompt + k] = ids[((size_t)i * tg_prompt + k) % n];
    free(ids);
    free(text);
    loom_tok_free(tok);
    return s;
}

/* Bytes of tensor data in the model directory (0 if unreadable). */
static double model_mib(const char *dir) {
    loom_safetensors *st = NULL;
    if (loom_st_open_dir(dir, &st)) return 0;
    double b = 0;
    for (int i = 0; i < loom_st_count(st); i++) b += (double)loom_st_at(st, i)->nbytes;
    loom_st_close(st);
    return b / (1 << 20);
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

#define MAX_MODELS 8

/* One model under test: owned handles and buffers, and its timings. */
typedef struct bench_model {
    const char *dir;
    loom_model *m;          /* owned */
    loom_context *c;        /* owned */
    int V;
    float *la, *lb;         /* owned [CHECK_LEN, V] each */
    double *pp, *tg;        /* owned [reps]: tokens per second */
    double *ppc, *tgc;      /* owned [reps]: tokens per CPU second */
    stats pps, tgs, ppcs, tgcs;
    double *bt;             /* owned [n_batch * reps]: batched decode tokens/s */
    stats bts[MAX_BATCHES];
    double *bt2;            /* owned [n_batch * reps]: the same with speculation */
    stats bts2[MAX_BATCHES];
    double *btc, *bt2c;     /* owned [n_batch * reps]: bt, bt2 per CPU second */
    double *pair;           /* owned [n_batch * reps]: bt2 / bt of the same repeat */
    stats pairs[MAX_BATCHES], btcs[MAX_BATCHES], bt2cs[MAX_BATCHES];
    double spec_len[MAX_BATCHES]; /* tokens per verifying step over the timed runs */
    int b_match[MAX_BATCHES]; /* requests whose greedy tokens match the context */
} bench_model;

static void print_row(const bench_model *b, int nthreads, const char *test, const stats *st,
                      const stats *cpu, double base) {
    const char *slash = strrchr(b->dir, '/');
    const char *name = slash && slash[1] ? slash + 1 : b->dir;
    printf("| %-28.28s | %9.1f | %7d | %-6s | %12.2f | %9.2f | %9.2f .. %9.2f | %9.2f |", name,
           model_mib(b->dir), nthreads, test, st->median, st->sd, st->min, st->max,
           cpu->median);
    if (base > 0) printf(" %6.2fx |", st->median / base);
    printf("\n");
}

static int batches[MAX_BATCHES], n_batches;

static void print_json(const bench_model *b, int nthreads, int p, int n, int reps) {
    printf("{\"model\": ");
    json_string(b->dir);
    printf(", \"arch\": ");
    json_string(loom_model_arch(b->m));
    printf(", \"size_mib\": %.2f, \"threads\": %d, \"p\": %d, \"n\": %d, \"reps\": %d",
           model_mib(b->dir), nthreads, p, n, reps);
    if (p)
        printf(", \"pp_tok_s\": %.3f, \"pp_sd\": %.3f, \"pp_min\": %.3f, \"pp_max\": %.3f, "
               "\"pp_tok_per_cpu_s\": %.3f", b->pps.median, b->pps.sd, b->pps.min, b->pps.max,
               b->ppcs.median);
    if (n)
        printf(", \"tg_tok_s\": %.3f, \"tg_sd\": %.3f, \"tg_min\": %.3f, \"tg_max\": %.3f, "
               "\"tg_tok_per_cpu_s\": %.3f", b->tgs.median, b->tgs.sd, b->tgs.min, b->tgs.max,
               b->tgcs.median);
    if (n_batches) {
        printf(", \"tg_prompt\": %d, \"batch\": [", tg_prompt);
        for (int i = 0; i < n_batches; i++)
        {
            printf("%s{\"b\": %d, \"tok_s\": %.3f, \"sd\": %.3f, \"min\": %.3f, \"max\": %.3f, "
                   "\"greedy_match\": %d", i ? ", " : "", batches[i], b->bts[i].median,
                   b->bts[i].sd, b->bts[i].min, b->bts[i].max, b->b_match[i]);
            if (spec_ep.speculative)
                printf(", \"spec_tok_s\": %.3f, \"spec_speedup\": %.3f, \"spec_tokens_per_step\": %.3f, "
                       "\"spec_speedup_per_repeat\": %.3f, \"tok_per_cpu_s\": %.3f, \"spec_tok_per_cpu_s\": %.3f",
                       b->bts2[i].median, b->bts2[i].median / b->bts[i].median, b->spec_len[i],
                       b->pairs[i].median, b->btcs[i].median, b->bt2cs[i].median);
            printf("}");
        }
        printf("]");
    }
    printf("}\n");
}

int cmd_bench(int argc, char **argv) {
    bench_model bm[MAX_MODELS];
    int nm = 0;
    int p = 512, n = 128, threads = 0, reps = 5, json = 0;
    loom_kv_type kv_type = LOOM_KV_F32;
    const char *kv_config = NULL, *image = NULL;
    char kvc[4096];
    memset(bm, 0, sizeof bm);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        static const char *valued[] = {"--model", "-p", "--prompt", "-n", "--gen",
                                       "--threads", "--reps", "--batch", "--tg-prompt",
                                       "--kv-type", "--kv-config", "--tg-text", "--image",
                                       CLI_SPEC_FLAGS};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("bench", "unknown option \"%s\"", a);
        if (!(v = cli_value("bench", argc, argv, &i))) return 2;
        int bad = cli_spec_flag("bench", a, v, &spec_ep, &spec_draft_dir);
        if (bad >= 0) {
            if (bad) return 2;
            continue;
        }
        bad = 0;
        if (!strcmp(a, "--model")) {
            if (nm == MAX_MODELS) return cli_usage_error("bench", "at most %d --model", MAX_MODELS);
            bm[nm++].dir = v;
        }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) bad = cli_int("bench", a, v, 0, 1 << 20, &p);
        else if (!strcmp(a, "-n") || !strcmp(a, "--gen")) bad = cli_int("bench", a, v, 0, 1 << 20, &n);
        else if (!strcmp(a, "--threads")) bad = cli_int("bench", a, v, 0, 4096, &threads);
        else if (!strcmp(a, "--tg-prompt")) bad = cli_int("bench", a, v, 1, 1 << 20, &tg_prompt);
        else if (!strcmp(a, "--kv-type")) bad = cli_kv_type("bench", v, &kv_type);
        else if (!strcmp(a, "--kv-config")) kv_config = v;
        else if (!strcmp(a, "--tg-text")) tg_text = v;
        else if (!strcmp(a, "--image")) image = v;
        else if (!strcmp(a, "--batch")) {
            int32_t *ids = NULL;
            int cnt = 0;
            if ((bad = cli_ids("bench", a, v, &ids, &cnt))) return 2;
            if (cnt > MAX_BATCHES) bad = cli_usage_error("bench", "--batch: at most %d sizes", MAX_BATCHES);
            for (int k = 0; k < cnt && !bad; k++) {
                if (ids[k] < 1 || ids[k] > 4096)
                    bad = cli_usage_error("bench", "--batch: sizes are 1..4096, found %d", ids[k]);
                batches[k] = ids[k];
            }
            n_batches = bad ? 0 : cnt;
            free(ids);
        }
        else bad = cli_int("bench", a, v, 1, 1000, &reps);
        if (bad) return 2;
    }
    if (!nm) return cli_usage_error("bench", "--model is required");
    if (image && (n_batches || spec_ep.speculative))
        return cli_usage_error("bench", "--image times one image's first token; it takes no --batch "
                               "or speculative decoding");
    if (image) {
        const char *dirs[MAX_MODELS];
        for (int k = 0; k < nm; k++) dirs[k] = bm[k].dir;
        return bench_image(dirs, nm, image, reps, threads, json);
    }
    if (!p && !n) return cli_usage_error("bench", "nothing to measure: -p and -n are both 0");
    if (n_batches && n < 2) return cli_usage_error("bench", "--batch needs -n >= 2");
    if (spec_ep.speculative && !n_batches)
        return cli_usage_error("bench", "speculative decoding is measured on --batch decodes: give --batch");
    loom_model *draft = NULL;

    int rc = 1;
    int n_tok = LOOM_MAX(LOOM_MAX(p, tg_prompt + n), CHECK_LEN);
    int32_t *toks = NULL;
    int min_vocab = 1 << 30;
    loom_status s;
    for (int k = 0; k < nm; k++) {
        bench_model *b = &bm[k];
        loom_model_params mp = cli_model_params(threads);
        if ((s = loom_model_load(b->dir, &mp, &b->m))) {
            fprintf(stderr, "loom: error: %s:\n", b->dir);
            rc = cli_fail("loading model", s);
            goto done;
        }
        b->V = loom_model_vocab_size(b->m);
        min_vocab = LOOM_MIN(min_vocab, b->V);
        if (n_tok > loom_model_max_positions(b->m)) {
            fprintf(stderr, "loom: error: %s: bench needs %d positions; the model allows %d\n",
                    b->dir, n_tok, loom_model_max_positions(b->m));
            goto done;
        }
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = n_tok;
        cp.n_batch = LOOM_MAX(LOOM_MAX(p, CHECK_LEN), tg_prompt);
        cp.kv_type = kv_type;
        cp.kv_config = cli_kv_config(kv_config, b->dir, kvc, sizeof kvc);
        if ((s = loom_context_create(b->m, &cp, &b->c))) {
            rc = cli_fail("creating context", s);
            goto done;
        }
        b->la = malloc(sizeof *b->la * (size_t)b->V * CHECK_LEN);
        b->lb = malloc(sizeof *b->lb * (size_t)b->V * CHECK_LEN);
        b->pp = calloc((size_t)reps, sizeof *b->pp);
        b->tg = calloc((size_t)reps, sizeof *b->tg);
        b->ppc = calloc((size_t)reps, sizeof *b->ppc);
        b->tgc = calloc((size_t)reps, sizeof *b->tgc);
        b->bt = calloc((size_t)reps * (n_batches ? n_batches : 1), sizeof *b->bt);
        b->bt2 = calloc((size_t)reps * (n_batches ? n_batches : 1), sizeof *b->bt2);
        b->btc = calloc((size_t)reps * (n_batches ? n_batches : 1), sizeof *b->btc);
        b->bt2c = calloc((size_t)reps * (n_batches ? n_batches : 1), sizeof *b->bt2c);
        b->pair = calloc((size_t)reps * (n_batches ? n_batches : 1), sizeof *b->pair);
        if (!b->la || !b->lb || !b->pp || !b->tg || !b->ppc || !b->tgc || !b->bt || !b->bt2 ||
            !b->btc || !b->bt2c || !b->pair) {
            fprintf(stderr, "loom: error: out of memory\n");
            goto done;
        }
    }
    /* The same prompt for every model (ids valid in the smallest vocabulary). */
    if (!(toks = malloc(sizeof *toks * (size_t)n_tok))) {
        fprintf(stderr, "loom: error: out of memory\n");
        goto done;
    }
    fill_tokens(toks, n_tok, min_vocab);
    if (spec_draft_dir && (s = loom_draft_model_load(spec_draft_dir, spec_ep.draft_exact, &draft))) {
        rc = cli_fail("loading the draft model", s);
        goto done;
    }
    for (int k = 0; k < nm; k++) {
        bench_model *b = &bm[k];
        if (nm > 1) fprintf(stderr, "loom bench: %s\n", b->dir);
        if (validate(b->c, toks, b->V, b->la, b->lb)) goto done;
    }

    /* Warm-up, then the repeats; with several models each repeat runs
     * every model in turn, so they share whatever else the machine does. */
    double secs, cpu;
    for (int r = -1; r < reps; r++) {
        for (int k = 0; k < nm && p; k++) {
            bench_model *b = &bm[k];
            if ((s = run_pp(b->c, toks, p, b->la, &secs, &cpu))) { rc = cli_fail("pp", s); goto done; }
            if (r < 0) {
                for (int i = 0; i < b->V; i++)
                    if (!isfinite(b->la[i])) {
                        fprintf(stderr, "loom: error: %s: pp logits are not finite\n", b->dir);
                        goto done;
                    }
            } else {
                b->pp[r] = p / secs;
                b->ppc[r] = p / cpu;
            }
        }
        for (int k = 0; k < nm && n; k++) {
            bench_model *b = &bm[k];
            if ((s = run_tg(b->c, toks, n, b->V, b->la, &secs, &cpu))) { rc = cli_fail("tg", s); goto done; }
            if (r >= 0) {
                b->tg[r] = n / secs;
                b->tgc[r] = n / cpu;
            }
        }
    }
    /* Batched decode through the engine, model by model: the context goes
     * first, so a device holds one copy of the weights at a time. */
    for (int k = 0; k < nm && n_batches; k++) {
        bench_model *b = &bm[k];
        int bmax = 0;
        for (int i = 0; i < n_batches; i++) bmax = LOOM_MAX(bmax, batches[i]);
        int32_t *prompts = malloc(sizeof *prompts * (size_t)bmax * tg_prompt);
        int32_t *got = malloc(sizeof *got * (size_t)bmax * n);
        int32_t *want = malloc(sizeof *want * (size_t)CHECK_GEN * bmax);
        double *margin = malloc(sizeof *margin * (size_t)CHECK_GEN * bmax);
        float *lg = malloc(sizeof *lg * (size_t)b->V);
        int ok = prompts && got && want && margin && lg;
        if (!ok) fprintf(stderr, "loom: error: out of memory\n");
        for (int i = 0; ok && i < bmax; i++) batch_prompt(prompts + (size_t)i * tg_prompt, tg_prompt, b->V, i);
        if (ok && tg_text && (s = text_prompts(b->dir, tg_text, prompts, bmax))) {
            ok = 0;
            rc = cli_fail("--tg-text", s);
        }
        int32_t *got2 = malloc(sizeof *got2 * (size_t)bmax * n);
        float *gaps = malloc(sizeof *gaps * (size_t)bmax * n);
        if (!got2 || !gaps) ok = 0;
        /* the context's greedy tokens, for the check below (first 8 rows) */
        int n_want = LOOM_MIN(bmax, 8), gen = LOOM_MIN(n, CHECK_GEN);
        for (int i = 0; ok && i < n_want; i++)
            if ((s = context_greedy(b->c, prompts + (size_t)i * tg_prompt, tg_prompt, gen, b->V,
                                    lg, want + (size_t)i * CHECK_GEN, margin + (size_t)i * CHECK_GEN))) {
                ok = 0;
                rc = cli_fail("batch check (context)", s);
            }
        loom_context_free(b->c);
        b->c = NULL;
        loom_engine_params ep = loom_engine_default_params();
        ep.max_seqs = bmax;
        ep.max_batch_tokens = LOOM_MAX(2048, bmax);
        ep.n_ctx = tg_prompt + n + 1;
        ep.kv_type = kv_type;
        ep.kv_config = cli_kv_config(kv_config, b->dir, kvc, sizeof kvc);
        ep.prefix_cache = 0;
        loom_engine *e = NULL, *e2 = NULL;
        if (ok && (s = loom_engine_create(b->m, &ep, &e))) {
            ok = 0;
            rc = cli_fail("creating engine", s);
        }
        loom_engine_params ep2 = ep;
        ep2.speculative = spec_ep.speculative;
        ep2.draft_tokens = spec_ep.draft_tokens;
        ep2.spec_always = spec_ep.spec_always;
        ep2.draft_exact = spec_ep.draft_exact;
        ep2.draft_model = draft;
        if (ok && spec_ep.speculative && (s = loom_engine_create(b->m, &ep2, &e2))) {
            ok = 0;
            rc = cli_fail("creating the speculating engine", s);
        }
        for (int i = 0; ok && i < n_batches; i++) {
            int B = batches[i];
            double ts = 0, ts2 = 0, tc = 0, tc2 = 0;
            uint64_t acc0 = 0, rounds0 = 0, gated0 = 0, steps0 = 0, acc1, rounds1, gated1, steps1;
            loom_engine_stats cpu0 = {0}, cpu20 = {0};
            for (int r = -1; ok && r < reps; r++) {
                if (e2 && r == 0) {
                    spec_counts(e2, &acc0, &rounds0, &gated0, &steps0);
                    loom_engine_get_stats(e, &cpu0);
                    loom_engine_get_stats(e2, &cpu20);
                }
                if ((s = run_batch(e, prompts, B, n, got, r < 0 && e2 ? gaps : NULL, &ts, &tc)) ||
                    (e2 && (s = run_batch(e2, prompts, B, n, got2, NULL, &ts2, &tc2)))) {
                    ok = 0;
                    rc = cli_fail("batch decode", s);
                } else if (r < 0 && e2 && !spec_same(B, n, got, got2, gaps)) {
                    ok = 0;
                } else if (r < 0) {
                    /* Batched GEMMs sum in another order than the one-row
                     * path, so a near-tie can flip (random weights give
                     * flat logits; on a GPU, bf16 activations). A row may
                     * leave the context's tokens only where the context's
                     * top two logits were within the paths' tolerance. */
                    int match = 0, ties = 0, rows = LOOM_MIN(B, n_want);
                    for (int q = 0; q < rows; q++) {
                        const int32_t *g = got + (size_t)q * n, *w = want + (size_t)q * CHECK_GEN;
                        int d = 0;
                        while (d < gen && g[d] == w[d]) d++;
                        double mg = d < gen ? margin[(size_t)q * CHECK_GEN + d] : 0;
                        if (d == gen) {
                            match++;
                        } else if (mg <= path_tol()) {
                            ties++;
                        } else {
                            fprintf(stderr, "loom: error: bench validation: batch %d row %d: "
                                    "token %d is %d, the context's is %d, whose logit led the "
                                    "next by %.3g (relative; a near-tie is <= %.3g)\n", B, q, d,
                                    g[d], w[d], mg, path_tol());
                            ok = 0;
                        }
                    }
                    b->b_match[i] = match;
                    fprintf(stderr, "loom bench: batch %d: %d of %d rows' first %d greedy tokens "
                            "equal the context's, %d leave them at a near-tie\n", B, match, rows,
                            gen, ties);
                } else {
                    size_t at = (size_t)i * reps + r;
                    b->bt[at] = ts;
                    b->bt2[at] = ts2;
                    b->btc[at] = tc;
                    b->bt2c[at] = tc2;
                    b->pair[at] = ts > 0 ? ts2 / ts : 0;
                }
            }
            if (ok) b->bts[i] = summarize(b->bt + (size_t)i * reps, reps);
            if (ok && e2) {
                b->bts2[i] = summarize(b->bt2 + (size_t)i * reps, reps);
                b->pairs[i] = summarize(b->pair + (size_t)i * reps, reps);
                b->btcs[i] = summarize(b->btc + (size_t)i * reps, reps);
                b->bt2cs[i] = summarize(b->bt2c + (size_t)i * reps, reps);
                spec_counts(e2, &acc1, &rounds1, &gated1, &steps1);
                b->spec_len[i] = rounds1 > rounds0 ? 1.0 + (double)(acc1 - acc0) / (double)(rounds1 - rounds0) : 1;
                fprintf(stderr, "loom bench: batch %d: speculative %.1f tok/s vs plain %.1f (%.2fx), "
                        "%.2f tokens per verifying step, %llu of %llu steps gated; per repeat %.2fx "
                        "(%.2f..%.2f); per CPU second %.1f vs %.1f (%.2fx)\n", B, b->bts2[i].median,
                        b->bts[i].median, b->bts2[i].median / b->bts[i].median, b->spec_len[i],
                        (unsigned long long)(gated1 - gated0), (unsigned long long)(steps1 - steps0),
                        b->pairs[i].median, b->pairs[i].min, b->pairs[i].max, b->bt2cs[i].median,
                        b->btcs[i].median, b->btcs[i].median > 0 ? b->bt2cs[i].median / b->btcs[i].median : 0);
                print_step_cpu(B, &cpu0, e, &cpu20, e2);
            }
        }
        loom_engine_free(e);
        loom_engine_free(e2);
        free(got2);
        free(gaps);
        free(prompts);
        free(got);
        free(want);
        free(margin);
        free(lg);
        if (!ok) goto done;
    }
    int nthreads = threads ? threads : loom_cpu_count();
    for (int k = 0; k < nm; k++) {
        bm[k].pps = summarize(bm[k].pp, p ? reps : 0);
        bm[k].tgs = summarize(bm[k].tg, n ? reps : 0);
        bm[k].ppcs = summarize(bm[k].ppc, p ? reps : 0);
        bm[k].tgcs = summarize(bm[k].tgc, n ? reps : 0);
    }
    if (json) {
        for (int k = 0; k < nm; k++) print_json(&bm[k], nthreads, p, n, reps);
    } else {
        printf("| %-28s | %9s | %7s | %-6s | %12s | %9s | %22s | %9s |%s\n", "model",
               "size MiB", "threads", "test", "t/s (median)", "sd", "min .. max", "t/cpu-s",
               nm > 1 ? "  vs 1st |" : "");
        printf("| %.28s | %.9s | %.7s | %.6s | %.12s | %.9s | %.22s | %.9s |%s\n",
               "-----------------------------", "----------", "--------", "-------",
               "-------------", "----------", "-----------------------", "----------",
               nm > 1 ? " ------: |" : "");
        char test[32];
        for (int k = 0; k < nm && p; k++) {
            snprintf(test, sizeof test, "pp%d", p);
            print_row(&bm[k], nthreads, test, &bm[k].pps, &bm[k].ppcs,
                      nm > 1 ? bm[0].pps.median : 0);
        }
        for (int k = 0; k < nm && n; k++) {
            snprintf(test, sizeof test, "tg%d", n);
            print_row(&bm[k], nthreads, test, &bm[k].tgs, &bm[k].tgcs,
                      nm > 1 ? bm[0].tgs.median : 0);
        }
        for (int k = 0; k < nm; k++)
            for (int i = 0; i < n_batches; i++) {
                snprintf(test, sizeof test, "tg%d@b%d", n, batches[i]);
                print_row(&bm[k], nthreads, test, &bm[k].bts[i], &bm[k].bts[i],
                          nm > 1 ? bm[0].bts[i].median : 0);
                if (!spec_ep.speculative) continue;
                snprintf(test, sizeof test, "tg%d@b%d+%s", n, batches[i], spec_draft_dir ? "draft" : "ngram");
                print_row(&bm[k], nthreads, test, &bm[k].bts2[i], &bm[k].bts2[i],
                          nm > 1 ? bm[0].bts2[i].median : 0);
            }
        printf("(%d reps after 1 warm-up%s; t/cpu-s: median tokens per CPU second of the "
               "process, all threads; %s)\n", reps, nm > 1 ? ", models interleaved" : "",
               loom_model_arch(bm[0].m));
    }
    rc = 0;
done:
    free(toks);
    for (int k = 0; k < nm; k++) {
        free(bm[k].la);
        free(bm[k].lb);
        free(bm[k].pp);
        free(bm[k].tg);
        free(bm[k].ppc);
        free(bm[k].tgc);
        free(bm[k].bt);
        free(bm[k].bt2);
        free(bm[k].btc);
        free(bm[k].bt2c);
        free(bm[k].pair);
        loom_context_free(bm[k].c);
        loom_model_free(bm[k].m);
    }
    loom_model_free(draft);
    return rc;
}
