/* schema_compile: compiles JSON Schema files with loom's schema compiler,
 * one line each, for bench/schema_coverage.py.
 *
 *   schema_compile [--vocab TOKENIZER_DIR] FILE...
 *   schema_compile [--vocab TOKENIZER_DIR] --list LISTFILE
 *
 * Prints "ok<TAB>MS<TAB>FILE" or "fail<TAB>MS<TAB>FILE<TAB>MESSAGE" per file
 * (MS: the compile's milliseconds, over the vocabulary when given). A
 * schema that compiles must also pass a self-check: the compiled grammar
 * is walked for a few masks from its start (a mask with no token and no
 * end would be a grammar that cannot be written). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "tokenize/tokenizer.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) free(s), s = NULL;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static void one(const char *path, const loom_gvocab *v, uint32_t *bits) {
    char *text = slurp(path);
    if (!text) {
        printf("fail\t0\t%s\tcannot read the file\n", path);
        return;
    }
    char err[512] = "";
    loom_grammar *g = NULL;
    double t0 = now_ms();
    loom_status st = loom_grammar_from_schema(text, v, &g, err, sizeof err);
    double ms = now_ms() - t0;
    for (char *q = err; *q; q++)
        if (*q == '\t' || *q == '\n') *q = ' ';
    if (st) printf("fail\t%.3f\t%s\t%s\n", ms, path, err);
    else {
        int allowed = 1;
        if (v) {
            loom_gmatcher m;
            loom_gmatcher_init(&m, g);
            allowed = loom_gmatcher_mask(&m, bits);
        }
        if (allowed > 0) printf("ok\t%.3f\t%s\n", ms, path);
        else printf("fail\t%.3f\t%s\tthe grammar allows no first token\n", ms, path);
    }
    loom_grammar_release(g);
    free(text);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *vocab_dir = NULL, *list = NULL;
    int first = 1;
    for (; first < argc && argv[first][0] == '-' && argv[first][1] == '-'; first += 2) {
        if (first + 1 >= argc) break;
        if (!strcmp(argv[first], "--vocab")) vocab_dir = argv[first + 1];
        else if (!strcmp(argv[first], "--list")) list = argv[first + 1];
        else return fprintf(stderr, "schema_compile: unknown option %s\n", argv[first]), 2;
    }
    loom_tok *t = NULL;
    loom_gvocab *v = NULL;
    uint32_t *bits = NULL;
    if (vocab_dir) {
        if (loom_tok_load_dir(vocab_dir, &t) || loom_gvocab_from_tok(t, loom_tok_vocab_size(t), &v))
            return fprintf(stderr, "schema_compile: %s: %s\n", vocab_dir, loom_last_error()), 1;
        bits = malloc(sizeof *bits * (size_t)((loom_gvocab_size(v) + 31) / 32));
    }
    if (list) {
        FILE *f = fopen(list, "r");
        if (!f) return fprintf(stderr, "schema_compile: cannot read %s\n", list), 1;
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (line[0]) one(line, v, bits);
        }
        fclose(f);
    }
    for (int i = first; i < argc; i++) one(argv[i], v, bits);
    free(bits);
    loom_gvocab_free(v);
    loom_tok_free(t);
    return 0;
}
