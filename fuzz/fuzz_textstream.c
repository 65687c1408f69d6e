/* libFuzzer target: stop strings over streamed detokenization. Input:
 * up to three stop strings separated by 0xff bytes, a 0xfe byte, then
 * token ids as little-endian 16-bit numbers (taken modulo the vocabulary).
 * The text sent with stops must be exactly the text sent without them, cut
 * before the first occurrence of any stop, and nothing sent may contain a
 * stop. The tokenizer is pycoder-16m's (run from the repo root), or the
 * directory in $LOOM_FUZZ_TOKENIZER. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"
#include "stream/textstream.h"
#include "tokenize/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static loom_tok *tok;
static int vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("LOOM_FUZZ_TOKENIZER");
    if (!dir) dir = "tests/fixtures/trained/pycoder-16m";
    if (loom_tok_load_dir(dir, &tok) != LOOM_OK) {
        fprintf(stderr, "fuzz_textstream: cannot load the tokenizer in %s: %s\n", dir, loom_last_error());
        abort();
    }
    vocab = loom_tok_vocab_size(tok);
    return 0;
}

/* Streams ids through a textstream; returns what was sent. */
static void run(const int32_t *ids, size_t n, const char *const *stops, int n_stops, loom_buf *out,
                int *stopped) {
    loom_textstream *ts = NULL;
    assert(loom_ts_create(tok, stops, n_stops, 1, &ts) == LOOM_OK);
    *stopped = 0;
    const char *t;
    size_t len;
    for (size_t i = 0; i < n && !*stopped; i++) {
        assert(loom_ts_push(ts, ids[i], &t, &len, stopped) == LOOM_OK);
        loom_buf_put(out, t, len);
    }
    if (!*stopped) {
        assert(loom_ts_finish(ts, &t, &len, stopped) == LOOM_OK);
        loom_buf_put(out, t, len);
    }
    loom_ts_free(ts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *sep = memchr(data, 0xfe, size);
    if (!sep) return 0;
    char head[256];
    size_t hl = (size_t)(sep - data);
    if (hl >= sizeof head) return 0;
    memcpy(head, data, hl);
    head[hl] = 0;
    const char *stops[3];
    int n_stops = 0;
    for (char *p = head, *q; n_stops < 3; p = q + 1) {
        q = strchr(p, '\xff');
        if (q) *q = 0;
        stops[n_stops++] = p;
        if (!q) break;
    }
    size_t n = (size - hl - 1) / 2;
    int32_t *ids = malloc(sizeof *ids * (n ? n : 1));
    if (!ids) return 0;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)((sep[1 + 2 * i] | sep[2 + 2 * i] << 8) % vocab);

    loom_buf plain = {0}, cut = {0};
    int stopped;
    run(ids, n, NULL, 0, &plain, &stopped);
    assert(!stopped);
    run(ids, n, stops, n_stops, &cut, &stopped);
    const char *text = plain.p ? plain.p : "";
    size_t first = plain.len;
    for (int k = 0; k < n_stops; k++) {
        if (!stops[k][0]) continue;
        const char *h = memmem(text, plain.len, stops[k], strlen(stops[k]));
        if (h && (size_t)(h - text) < first) first = (size_t)(h - text);
    }
    assert(stopped == (first < plain.len));
    assert(cut.len == first && (first == 0 || !memcmp(cut.p, text, first)));
    for (int k = 0; k < n_stops; k++)
        if (stops[k][0] && cut.p) assert(!memmem(cut.p, cut.len, stops[k], strlen(stops[k])));
    loom_buf_free(&plain);
    loom_buf_free(&cut);
    free(ids);
    return 0;
}
