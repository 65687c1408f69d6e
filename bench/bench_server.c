/* bench_server: the engine's own decode speed for one stream, the peer that
 * bench/bench_server.sh compares `loom serve` against.
 *
 *   bench_server --model DIR [--prompt 1,2,3] [-n 128] [--reps 3] [--threads N]
 *
 * One request at a time through loom_engine (greedy, ignore_eos), as the
 * server submits it. Validation first: two untimed runs must give the same
 * ids. Then reps timed runs; decode tok/s = (n - 1) / (time of the last
 * token - time of the first), TTFT = submit to the first token; medians.
 * Prints one JSON line: {"ids":[...],"decode_tok_s":..,"ttft_ms":..}; the
 * ids let the script check that the server produces the same tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "loom.h"

#define MAX_PROMPT 256

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One greedy request of n tokens; ids[n] receives them. */
static int run_once(loom_engine *e, const int32_t *prompt, int n_prompt, int n, int32_t *ids,
                    double *ttft, double *decode) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.max_tokens = n;
    rp.ignore_eos = 1;
    rp.sampling.temperature = 0;
    loom_request *r = NULL;
    double t0 = loom_now(), first = 0, last = 0;
    if (loom_engine_submit(e, &rp, &r) != LOOM_OK) {
        fprintf(stderr, "bench_server: submit: %s\n", loom_last_error());
        return -1;
    }
    int got = 0;
    for (;;) {
        loom_event ev;
        if (loom_request_next(r, &ev, -1) != LOOM_OK) continue;
        if (ev.finish != LOOM_FINISH_NONE) break;
        last = loom_now();
        if (!got) first = last;
        if (got < n) ids[got] = ev.token;
        got++;
    }
    loom_request_free(r);
    if (got != n) {
        fprintf(stderr, "bench_server: expected %d tokens, got %d\n", n, got);
        return -1;
    }
    *ttft = first - t0;
    *decode = (n - 1) / (last - first);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *prompt_s = "785,1630,25,1638,7";
    int n = 128, reps = 3, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_server: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--prompt")) prompt_s = v;
        else if (!strcmp(a, "-n")) n = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else {
            fprintf(stderr, "bench_server: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!dir || n < 2 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_server --model DIR [--prompt 1,2,3] [-n N>=2] [--reps R] [--threads T]\n");
        return 2;
    }
    int32_t prompt[MAX_PROMPT];
    int n_prompt = 0;
    for (const char *p = prompt_s; *p && n_prompt < MAX_PROMPT;) {
        char *end;
        prompt[n_prompt++] = (int32_t)strtol(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
    }
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    loom_model *m = NULL;
    loom_engine *e = NULL;
    if (loom_model_load(dir, &mp, &m) != LOOM_OK) {
        fprintf(stderr, "bench_server: %s\n", loom_last_error());
        return 1;
    }
    loom_engine_params ep = loom_engine_default_params();
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) {
        fprintf(stderr, "bench_server: %s\n", loom_last_error());
        loom_model_free(m);
        return 1;
    }
    int32_t *ids = malloc(sizeof *ids * (size_t)n), *again = malloc(sizeof *ids * (size_t)n);
    double ttft[64], dec[64], t, d;
    int rc = 1;
    if (!ids || !again) goto done;
    /* validation: greedy is repeatable (this also warms up) */
    if (run_once(e, prompt, n_prompt, n, ids, &t, &d) || run_once(e, prompt, n_prompt, n, again, &t, &d))
        goto done;
    if (memcmp(ids, again, sizeof *ids * (size_t)n)) {
        fprintf(stderr, "bench_server: two greedy runs differ\n");
        goto done;
    }
    for (int r = 0; r < reps; r++)
        if (run_once(e, prompt, n_prompt, n, again, &ttft[r], &dec[r])) goto done;
    qsort(ttft, (size_t)reps, sizeof *ttft, cmp_double);
    qsort(dec, (size_t)reps, sizeof *dec, cmp_double);
    printf("{\"ids\":[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],\"decode_tok_s\":%.2f,\"ttft_ms\":%.3f}\n", dec[reps / 2], ttft[reps / 2] * 1e3);
    rc = 0;
done:
    free(ids);
    free(again);
    loom_engine_free(e);
    loom_model_free(m);
    return rc;
}
