/* bench_engine: the engine under concurrency.
 *
 *   bench_engine --model DIR [--model DIR2 ...] [--threads N] [--gen N]
 *                [--prompt N] [--seqs 1,4,8] [--reps N] [--decode-only] [--json] [--fast]
 *
 * For each model, after checking that batched greedy decoding reproduces
 * solo decoding:
 *   1. aggregate decode tokens/s with 1, 2, 4, 8, 16 sequences decoding;
 *   2. a 2048-token prompt arriving while 8 sequences decode: its TTFT and
 *      the largest inter-token gap the decoders saw meanwhile (bounded by
 *      one step's prefill chunk, --max-batch-tokens);
 *   3. TTFT of a 4096-token prompt cold, then again with all but its last
 *      token block cached (the prefix cache), and the ratio;
 *   4. KV capacity: in the same --kv-memory (default 24M), how many
 *      2048-token sequences the engine runs at once with f16, q8 and q4 KV
 *      (it admits a request only with blocks for its whole prompt).
 * Prints one table per model. --decode-only runs part 1 alone, each count
 * --reps times (the median is printed), with prompts of --prompt tokens:
 * llama-batched-bench's protocol (-npp P -ntg G -npl LIST). --json prints
 * that part as one JSON object per model. --capacity runs part 4 alone. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int die(const char *what) {
    fprintf(stderr, "bench_engine: %s: %s\n", what, loom_last_error());
    return 1;
}

/* Deterministic pseudo-random prompt ids in [1, vocab). */
static void fill_prompt(int32_t *ids, int n, int vocab, unsigned seed) {
    unsigned long long s = seed * 2654435761ull + 1;
    for (int i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        ids[i] = 1 + (int32_t)(s % (unsigned long long)(vocab - 1));
    }
}

static loom_request *submit(loom_engine *e, const int32_t *ids, int n, int gen) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = gen;
    rp.ignore_eos = 1;
    loom_request *r = NULL;
    if (loom_engine_submit(e, &rp, &r) != LOOM_OK) return NULL;
    return r;
}

/* Reads all events; returns tokens generated, stores them in out (if any). */
static int drain(loom_request *r, int32_t *out, double *t_first) {
    int n = 0;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, -1) != LOOM_OK) return -1;
        if (ev.finish) return n;
        if (n == 0 && t_first) *t_first = now();
        if (out) out[n] = ev.token;
        n++;
    }
}

/* Greedy solo vs 4 concurrent: identical tokens. With --fast (fast != 0)
 * the first 4 of each: its int8 / bf16 rounding of activations is not
 * batch invariant (the prompt's matmuls round per call), and on random
 * weights one flipped rounding changes the continuation; the rest is
 * reported. */
static int validate(loom_model *m, loom_engine *e, int vocab, int fast) {
    enum { N = 4, G = 16 };
    int32_t prompts[N][64], solo[N][G], batched[N][G];
    for (int i = 0; i < N; i++) fill_prompt(prompts[i], 16 + 12 * i, vocab, 100 + (unsigned)i);
    for (int i = 0; i < N; i++) {
        loom_request *r = submit(e, prompts[i], 16 + 12 * i, G);
        if (!r || drain(r, solo[i], NULL) != G) return 0;
        loom_request_free(r);
    }
    loom_request *rs[N];
    for (int i = 0; i < N; i++) rs[i] = submit(e, prompts[i], 16 + 12 * i, G);
    int ok = 1, same = 0;
    for (int i = 0; i < N; i++) {
        ok &= rs[i] && drain(rs[i], batched[i], NULL) == G;
        ok &= !memcmp(solo[i], batched[i], sizeof(int32_t) * (fast ? 4 : G));
        for (int k = 0; k < G; k++) same += solo[i][k] == batched[i][k];
        loom_request_free(rs[i]);
    }
    if (fast) fprintf(stderr, "bench_engine: --fast: batched greedy tokens equal solo at %d of %d\n", same, N * G);
    (void)m;
    return ok;
}

static double aggregate_decode(loom_engine *e, int n_seqs, int n_prompt, int gen, int vocab) {
    loom_request *r[64];
    int32_t *prompt = malloc(sizeof *prompt * (size_t)n_seqs * (size_t)n_prompt);
    for (int i = 0; i < n_seqs; i++) fill_prompt(prompt + (size_t)i * n_prompt, n_prompt, vocab, 7 + (unsigned)i);
    for (int i = 0; i < n_seqs; i++) r[i] = submit(e, prompt + (size_t)i * n_prompt, n_prompt, gen);
    free(prompt); /* the engine copied them */
    /* time from every sequence's first token to the last token */
    double t0 = 0, t1;
    int total = 0;
    for (int i = 0; i < n_seqs; i++) {
        loom_event ev;
        if (!r[i] || loom_request_next(r[i], &ev, -1) != LOOM_OK) return 0;
    }
    t0 = now();
    for (int i = 0; i < n_seqs; i++) {
        int n = drain(r[i], NULL, NULL);
        total += n;
        loom_request_free(r[i]);
    }
    t1 = now();
    return total / (t1 - t0);
}

typedef struct watcher {
    loom_request *r;
    double max_gap, gap_from, gap_to;
    double watch_from, watch_to;
} watcher;

static void *watch(void *arg) {
    watcher *w = arg;
    double last = 0;
    for (;;) {
        loom_event ev;
        if (loom_request_next(w->r, &ev, -1) != LOOM_OK || ev.finish) break;
        double t = now();
        if (last && t > w->watch_from && last < w->watch_to && t - last > w->max_gap)
            w->max_gap = t - last;
        last = t;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Parses "1,4,8" (each in 1..64); returns the count, 0 on a bad list. */
static int parse_seqs(const char *text, int *out, int max) {
    int n = 0;
    for (const char *p = text; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 64 || n == max) return 0;
        out[n++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return 0;
        p = end;
    }
    return n;
}

/* Part 4: submits more 2048-token requests than can fit, with a step
 * budget that takes every waiting prompt at once; each then decodes for a
 * while, so the running count climbs to what the blocks allow and stays
 * there. Returns the most seen running at once, once three steps in a row
 * admitted nobody while requests still waited. */
static int kv_capacity(loom_model *m, loom_kv_type kvt, size_t kv_memory, int vocab,
                       int *blocks, double *bytes_per_token) {
    enum { P = 2048, N = 40 };
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = P + 128;
    ep.max_seqs = 64;
    ep.kv_type = kvt;
    ep.kv_memory = kv_memory;
    ep.prefix_cache = 0;
    ep.max_batch_tokens = N * P;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) return -1;
    int32_t *ids = malloc(sizeof *ids * P);
    loom_request *r[N];
    int n = 0;
    for (; n < N; n++) {
        fill_prompt(ids, P, vocab, 5000 + (unsigned)n);
        if (!(r[n] = submit(e, ids, P, 64))) break;
    }
    free(ids);
    loom_engine_stats st;
    int admitted = 0;
    uint64_t since = 0; /* step count when `admitted` last grew */
    for (int polls = 0; polls < 6000; polls++) { /* up to 5 min */
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        loom_engine_get_stats(e, &st); /* published after each step */
        if (st.running > admitted) admitted = st.running, since = st.steps;
        else if (admitted > 0 && st.waiting > 0 && st.steps >= since + 3) break;
    }
    loom_engine_get_stats(e, &st);
    *blocks = st.kv_blocks_total;
    *bytes_per_token = (double)kv_memory / ((double)st.kv_blocks_total * ep.block_size);
    for (int i = 0; i < n; i++) loom_request_cancel(r[i]);
    for (int i = 0; i < n; i++) {
        drain(r[i], NULL, NULL);
        loom_request_free(r[i]);
    }
    loom_engine_free(e);
    return admitted;
}

static void capacity_table(loom_model *m, size_t kv_memory, int vocab) {
    static const loom_kv_type types[] = {LOOM_KV_F16, LOOM_KV_Q8, LOOM_KV_Q4};
    static const char *names[] = {"f16", "q8", "q4"};
    printf("\nKV capacity in %.0f MiB: concurrent 2048-token sequences admitted\n", kv_memory / 1048576.0);
    printf("| KV | blocks | bytes per token (pool / tokens) | sequences | vs f16 |\n|---|---:|---:|---:|---:|\n");
    int base = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        int blocks = 0;
        double bpt = 0;
        int n = kv_capacity(m, types[i], kv_memory, vocab, &blocks, &bpt);
        if (n < 0) {
            fprintf(stderr, "bench_engine: capacity (%s): %s\n", names[i], loom_last_error());
            return;
        }
        if (i == 0) base = n;
        printf("| %s | %d | %.0f | %d | %.2fx |\n", names[i], blocks, bpt, n,
               base ? (double)n / base : 0.0);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    const char *models[8];
    int n_models = 0, threads = 0, gen = 64, n_prompt = 32, reps = 1, decode_only = 0, json = 0;
    int capacity_only = 0;
    size_t kv_memory = 24u << 20;
    int counts[16] = {1, 2, 4, 8, 16}, n_counts = 5;
    loom_model_params mp = loom_model_default_params();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc && n_models < 8) models[n_models++] = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gen") && i + 1 < argc) gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc && (n_counts = parse_seqs(argv[++i], counts, 16))) {
        } else if (!strcmp(argv[i], "--decode-only")) decode_only = 1;
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--capacity")) capacity_only = 1;
        else if (!strcmp(argv[i], "--kv-memory") && i + 1 < argc) kv_memory = (size_t)atof(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--fast")) mp.fast_matmul = 1;
        else {
            fprintf(stderr, "usage: bench_engine --model DIR [--model DIR ...] [--threads N] [--gen N]\n"
                            "                    [--prompt N] [--seqs 1,4,8] [--reps N] [--decode-only]\n"
                            "                    [--json] [--fast] [--capacity] [--kv-memory MiB]\n");
            return 2;
        }
    }
    if (gen < 2 || n_prompt < 1 || n_prompt > 4096 || reps < 1 || reps > 64) {
        fprintf(stderr, "bench_engine: expected --gen >= 2, --prompt in 1..4096, --reps in 1..64\n");
        return 2;
    }
    if (!n_models) models[n_models++] = "models/pycoder-16m";
    for (int mi = 0; mi < n_models; mi++) {
        loom_model *m = NULL;
        mp.n_threads = threads;
        if (loom_model_load(models[mi], &mp, &m) != LOOM_OK) return die(models[mi]);
        int vocab = loom_model_vocab_size(m);
        if (capacity_only) {
            capacity_table(m, kv_memory, vocab);
            loom_model_free(m);
            continue;
        }
        loom_engine_params ep = loom_engine_default_params();
        ep.n_ctx = 4608;
        ep.max_seqs = 32;
        ep.prefix_cache = 0;
        loom_engine *e = NULL;
        if (loom_engine_create(m, &ep, &e) != LOOM_OK) return die("engine");
        if (!validate(m, e, vocab, mp.fast_matmul)) {
            fprintf(stderr, "bench_engine: %s: batched decoding differs from solo; not timing\n", models[mi]);
            return 1;
        }
        if (json) printf("{\"model\": \"%s\", \"prompt\": %d, \"gen\": %d, \"fast\": %d, \"decode\": [",
                         models[mi], n_prompt, gen, mp.fast_matmul);
        else {
            printf("\n%s (%s), batched greedy == solo%s: ok; prompts of %d tokens, %d generated%s\n",
                   models[mi], loom_model_arch(m), mp.fast_matmul ? " (first 4 tokens)" : "", n_prompt, gen,
                   mp.fast_matmul ? ", --fast" : "");
            printf("| sequences | aggregate decode tok/s | per sequence |\n|---:|---:|---:|\n");
        }
        for (int k = 0; k < n_counts; k++) {
            double v[64];
            for (int rep = 0; rep < reps; rep++) {
                v[rep] = aggregate_decode(e, counts[k], n_prompt, gen, vocab);
                if (v[rep] <= 0) return die("aggregate decode");
            }
            qsort(v, (size_t)reps, sizeof *v, cmp_double);
            double tps = reps % 2 ? v[reps / 2] : (v[reps / 2 - 1] + v[reps / 2]) / 2;
            if (json) {
                printf("%s{\"seqs\": %d, \"tok_s\": %.2f, \"reps\": [", k ? ", " : "", counts[k], tps);
                for (int rep = 0; rep < reps; rep++) printf("%s%.2f", rep ? ", " : "", v[rep]);
                printf("]}");
            } else {
                printf("| %d | %.1f | %.1f |\n", counts[k], tps, tps / counts[k]);
            }
            fflush(stdout);
        }
        if (json) printf("]}\n");
        loom_engine_free(e);
        if (decode_only) {
            loom_model_free(m);
            continue;
        }
        /* a long prompt joins 8 decoders, under two step budgets */
        static const int budgets[] = {2048, 256};
        for (int bi = 0; bi < 2; bi++) {
            ep.max_batch_tokens = budgets[bi];
            if (loom_engine_create(m, &ep, &e) != LOOM_OK) return die("engine");
            enum { D = 8, P = 2048 };
            watcher w[D];
            pthread_t th[D];
            int32_t dp[D][32];
            int32_t *big = malloc(sizeof(int32_t) * P);
            fill_prompt(big, P, vocab, 999);
            for (int i = 0; i < D; i++) {
                fill_prompt(dp[i], 32, vocab, 50 + (unsigned)i);
                memset(&w[i], 0, sizeof w[i]);
                w[i].r = submit(e, dp[i], 32, 100000 / 100);
                w[i].watch_from = 1e30;
                pthread_create(&th[i], NULL, watch, &w[i]);
            }
            /* let the decoders settle, then measure the gap while the prompt prefills */
            struct timespec ts = {0, 300000000};
            nanosleep(&ts, NULL);
            double t0 = now(), tf = 0;
            for (int i = 0; i < D; i++) w[i].watch_from = t0, w[i].watch_to = 1e30;
            loom_request *r = submit(e, big, P, 1);
            drain(r, NULL, &tf);
            for (int i = 0; i < D; i++) w[i].watch_to = tf;
            loom_request_free(r);
            for (int i = 0; i < D; i++) loom_request_cancel(w[i].r);
            double gap = 0;
            for (int i = 0; i < D; i++) {
                pthread_join(th[i], NULL);
                if (w[i].max_gap > gap) gap = w[i].max_gap;
                loom_request_free(w[i].r);
            }
            printf("%s2048-token prompt joining 8 decoders, step budget %d tokens: TTFT %.3f s; "
                   "largest decode gap meanwhile %.3f s\n", bi ? "" : "\n", ep.max_batch_tokens, tf - t0, gap);
            free(big);
            loom_engine_free(e);
        }
        ep.max_batch_tokens = 2048;
        /* cold vs cached 4096-token prefix */
        {
            ep.prefix_cache = 1;
            if (loom_engine_create(m, &ep, &e) != LOOM_OK) return die("engine");
            enum { P = 4096 };
            int32_t *p = malloc(sizeof(int32_t) * (P + 16));
            fill_prompt(p, P + 16, vocab, 4242);
            double t0 = now(), tf = 0;
            loom_request *r = submit(e, p, P, 1);
            drain(r, NULL, &tf);
            double cold = tf - t0;
            loom_request_free(r);
            p[P] = 7; /* a new turn: the same 4096 tokens plus 16 more */
            t0 = now();
            r = submit(e, p, P + 16, 1);
            drain(r, NULL, &tf);
            double warm = tf - t0;
            loom_request_free(r);
            printf("4096-token prefix: TTFT cold %.3f s, cached %.4f s (%.0fx)\n", cold, warm, cold / warm);
            free(p);
            loom_engine_free(e);
        }
        capacity_table(m, kv_memory, vocab);
        loom_model_free(m);
    }
    return 0;
}
