/* bench_tokenizer: single-thread encode throughput of one tokenizer.json on
 * text files, and the time to load the tokenizer. bench/tokenizer.sh runs it
 * in turns with the JS peer (bench/tokenizer_peer/) and prints the table;
 * this program only measures and prints raw lines.
 *
 *   bench_tokenizer TOKENIZER.json [--reps R] [--load-reps L]
 *                   [--ids-out DIR] FILE...
 *
 * Validation, before timing: every file is encoded once (text only, no
 * special tokens added) and decoded back; the text must come back byte for
 * byte, else the program stops with exit code 1. With --ids-out DIR the ids
 * of FILE go to DIR/<basename of FILE>.ids (one decimal id per line) for the
 * peer to compare, and nothing is timed.
 *
 * Output on stdout, one measurement per line:
 *   load <ms>                         (each of L loads of TOKENIZER.json)
 *   enc <file> <bytes> <ids> <sec>    (each of R timed encodes, after one
 *                                      untimed warm-up per file) */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenize/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whole file into a malloc'd buffer; *len its size. NULL on failure. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "bench_tokenizer: %s: read failed\n", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Encodes once, checks decode(encode(text)) == text, optionally writes the
 * ids. Returns 0 when valid. */
static int validate(const loom_tok *tok, const char *path, const char *text, size_t len,
                    const char *ids_dir) {
    int32_t *ids = NULL;
    size_t n = 0;
    loom_status st = loom_tok_encode(tok, text, len, LOOM_TOK_NO_SPECIAL, &ids, &n);
    if (st != LOOM_OK) {
        fprintf(stderr, "bench_tokenizer: %s: encode failed: %s\n", path, loom_last_error());
        return 1;
    }
    char *back = NULL;
    size_t blen = 0;
    st = loom_tok_decode(tok, ids, n, 0, &back, &blen);
    int bad = st != LOOM_OK;
    if (bad) {
        fprintf(stderr, "bench_tokenizer: %s: decode failed: %s\n", path, loom_last_error());
    } else if (blen != len || memcmp(back, text, len) != 0) {
        size_t i = 0;
        while (i < len && i < blen && back[i] == text[i]) i++;
        fprintf(stderr,
                "bench_tokenizer: %s: decode(encode(text)) differs from the text at byte %zu "
                "(text %zu bytes, decoded %zu bytes)\n",
                path, i, len, blen);
        bad = 1;
    }
    if (!bad && ids_dir) {
        char out[4096];
        snprintf(out, sizeof out, "%s/%s.ids", ids_dir, base_name(path));
        FILE *f = fopen(out, "w");
        if (!f) {
            fprintf(stderr, "bench_tokenizer: %s: %s\n", out, strerror(errno));
            bad = 1;
        } else {
            for (size_t i = 0; i < n; i++) fprintf(f, "%d\n", (int)ids[i]);
            if (fclose(f) != 0) {
                fprintf(stderr, "bench_tokenizer: %s: write failed\n", out);
                bad = 1;
            }
        }
    }
    free(back);
    free(ids);
    return bad;
}

static void usage(void) {
    fprintf(stderr,
            "usage: bench_tokenizer TOKENIZER.json [--reps R] [--load-reps L] "
            "[--ids-out DIR] FILE...\n");
}

int main(int argc, char **argv) {
    const char *json = NULL, *ids_dir = NULL;
    int reps = 5, load_reps = 1;
    const char **files = calloc((size_t)argc, sizeof *files);
    int n_files = 0;
    if (!files) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--load-reps") && i + 1 < argc) load_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ids-out") && i + 1 < argc) ids_dir = argv[++i];
        else if (argv[i][0] == '-') {
            usage();
            return 2;
        } else if (!json) json = argv[i];
        else files[n_files++] = argv[i];
    }
    if (!json || reps < 0 || load_reps < 1) {
        usage();
        return 2;
    }

    loom_tok *tok = NULL;
    for (int r = 0; r < load_reps; r++) {
        if (tok) loom_tok_free(tok);
        double t0 = now_s();
        if (loom_tok_load(json, NULL, &tok) != LOOM_OK) {
            fprintf(stderr, "bench_tokenizer: %s: %s\n", json, loom_last_error());
            return 1;
        }
        printf("load %.3f\n", (now_s() - t0) * 1e3);
        fflush(stdout);
    }

    char **texts = calloc((size_t)n_files + 1, sizeof *texts);
    size_t *lens = calloc((size_t)n_files + 1, sizeof *lens);
    if (!texts || !lens) return 1;
    int rc = 0;
    for (int f = 0; f < n_files && !rc; f++) {
        texts[f] = read_file(files[f], &lens[f]);
        if (!texts[f] || validate(tok, files[f], texts[f], lens[f], ids_dir)) rc = 1;
    }
    if (rc || ids_dir) goto done;

    for (int f = 0; f < n_files; f++) {
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            int32_t *ids = NULL;
            size_t n = 0;
            double t0 = now_s();
            loom_status st = loom_tok_encode(tok, texts[f], lens[f], LOOM_TOK_NO_SPECIAL, &ids, &n);
            double dt = now_s() - t0;
            free(ids);
            if (st != LOOM_OK) {
                fprintf(stderr, "bench_tokenizer: %s: encode failed: %s\n", files[f],
                        loom_last_error());
                rc = 1;
                goto done;
            }
            if (r >= 0) printf("enc %s %zu %zu %.6f\n", base_name(files[f]), lens[f], n, dt);
        }
        fflush(stdout);
    }
done:
    for (int f = 0; f < n_files; f++) free(texts[f]);
    free(texts);
    free(lens);
    free(files);
    loom_tok_free(tok);
    return rc;
}
