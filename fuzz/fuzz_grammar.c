/* libFuzzer target: the grammar compilers and the matcher. Byte 0 picks
 * the input's kind (GBNF, JSON Schema or regex) and a seed; the rest is the
 * text. Checks: a compile either fails with *out NULL and a message, or
 * gives a grammar; a schema's GBNF text that translates always compiles
 * (unless a $ref cycle makes it left-recursive or it is over a limit);
 * from the start, masks over a small vocabulary agree with feeding each
 * token's bytes (the count is the bits set, every allowed token is
 * accepted, every refused one refused) along a walk of allowed tokens. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const TOKS[] = {"{", "}", "\"", "\":", "\",", "a", "ab", "name", " ", "\n", ":", ",", "1",
                                   "12", "-", ".5", "true", "null", "[", "]", "\xc3", "\xa9", "\xc3\xa9", "\\",
                                   "\\n", "x", "0", "e", "abcdefghijklmnopqrstuvwxyz0123", "\xe2\x82\xac", NULL};

static loom_gvocab *vocab(int *n) {
    static loom_gvocab *v;
    static int V;
    if (!v) {
        int lens[64];
        const char *bytes[64];
        while (TOKS[V]) bytes[V] = TOKS[V], lens[V] = (int)strlen(TOKS[V]), V++;
        bytes[V] = "", lens[V] = -1, V++; /* a token without bytes */
        if (loom_gvocab_create(bytes, lens, V, &v)) abort();
    }
    *n = V;
    return v;
}

static void walk(loom_grammar *g, int V, unsigned seed) {
    uint32_t bits[4];
    loom_gmatcher m;
    loom_gmatcher_init(&m, g);
    for (int step = 0; step < 12; step++) {
        int count = loom_gmatcher_mask(&m, bits), set = 0, pick = -1;
        for (int t = 0; t < V; t++) {
            int on = bits[t >> 5] >> (t & 31) & 1;
            loom_gmatcher c = m;
            int ok = loom_gmatcher_accept_token(&c, t) == 0;
            assert(on == ok);
            set += on;
            if (on && (pick < 0 || (seed >> (t & 15) & 1))) pick = t;
        }
        assert(count == set);
        if (pick < 0) return;
        assert(loom_gmatcher_accept_token(&m, pick) == 0);
        seed = seed * 1103515245u + 12345u;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 8192) return 0;
    int kind = data[0] % 3;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    int V;
    loom_gvocab *v = vocab(&V);
    char err[256];
    loom_grammar *g = (loom_grammar *)1;
    loom_status st = kind == 0   ? loom_grammar_from_gbnf(text, v, &g, err, sizeof err)
                     : kind == 1 ? loom_grammar_from_schema(text, v, &g, err, sizeof err)
                                 : loom_grammar_from_regex(text, v, &g, err, sizeof err);
    if (st) {
        assert(!g && err[0]);
    } else {
        assert(g);
        walk(g, V, data[0]);
        loom_grammar_release(g);
    }
    if (kind == 1) {
        char *gbnf = loom_grammar_schema_to_gbnf(text, err, sizeof err);
        if (gbnf) {
            loom_grammar *h = NULL;
            loom_status s2 = loom_grammar_from_gbnf(gbnf, NULL, &h, err, sizeof err);
            assert(s2 == LOOM_OK || strstr(err, "left-recursive") || strstr(err, "more than") ||
                   strstr(err, "out of memory") || strstr(err, "matches nothing"));
            loom_grammar_release(h);
            free(gbnf);
        }
    }
    free(text);
    return 0;
}
