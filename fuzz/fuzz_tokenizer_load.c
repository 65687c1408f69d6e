/* libFuzzer target: the tokenizer.json loader (loom_tok_load_mem), and
 * whatever it accepts put to work.
 *
 * Input: the text of a tokenizer.json (not NUL-terminated; no
 * tokenizer_config.json). A load either fails with *out NULL and a message,
 * or gives a tokenizer that then encodes a few fixed strings (ASCII,
 * accented and CJK text, an emoji, digits, whitespace runs, look-alikes of
 * special tokens) in every add_special mode. For each encode that succeeds:
 *   - every id is inside the vocabulary and has a token string that maps
 *     back to an id with the same string;
 *   - decode succeeds, returns NUL-terminated valid UTF-8 of the stated
 *     length, with and without skip_special;
 *   - the streaming detokenizer gives exactly decode's text, one id at a
 *     time (the contract in tokenizer.h).
 * Encode itself may refuse a string (e.g. a character it cannot spell and
 * no unk token): any status is accepted, with a message. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenize/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const TEXTS[] = {
    "Hello world! The quick brown fox, 1234567 times.",
    "  leading  and\ttabs\n\n\nnewlines  ",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 x\xcc\x81",
    "<s><|endoftext|><|im_start|>user\n<unk></s>[INST]",
    "def f(x):\n    return x ** 2  # 0.5\n",
    "",
};

/* Strict UTF-8 (no surrogates, no overlongs, at most U+10FFFF), by
 * utf8proc through base rather than the code under test. */
static int utf8_ok(const unsigned char *s, size_t n) { return loom_utf8_valid((const char *)s, n); }

static void check_decode(const loom_tok *t, const int32_t *ids, size_t n, int skip) {
    char *text = NULL;
    size_t len = (size_t)-1;
    loom_status st = loom_tok_decode(t, ids, n, skip, &text, &len);
    assert(st == LOOM_OK);
    assert(text && text[len] == '\0' && utf8_ok((const unsigned char *)text, len));

    loom_detok *d = NULL;
    assert(loom_detok_create(t, skip, &d) == LOOM_OK);
    size_t got = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t pl;
        if (i < n) assert(loom_detok_push(d, ids[i], &piece, &pl) == LOOM_OK);
        else assert(loom_detok_flush(d, &piece, &pl) == LOOM_OK);
        if (got + pl > len || memcmp(text + got, piece, pl) != 0) {
            fprintf(stderr, "fuzz_tokenizer_load: streamed text differs from decode "
                            "(skip_special %d) after id %zu of %zu\n", skip, i, n);
            abort();
        }
        got += pl;
    }
    assert(got == len);
    assert(loom_detok_pending(d) == 0);
    loom_detok_free(d);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom_tok *t = (loom_tok *)1;
    loom_status st = loom_tok_load_mem((const char *)data, size, NULL, 0, &t);
    if (st != LOOM_OK) {
        assert(t == NULL);
        assert(loom_last_error() && loom_last_error()[0]);
        return 0;
    }
    assert(t != NULL);
    int vocab = loom_tok_vocab_size(t);
    assert(vocab >= 0);
    for (size_t k = 0; k < sizeof TEXTS / sizeof *TEXTS; k++) {
        for (int mode = LOOM_TOK_NO_SPECIAL; mode <= LOOM_TOK_ADD_SPECIAL_CONFIG; mode++) {
            int32_t *ids = (int32_t *)1;
            size_t n = (size_t)-1;
            st = loom_tok_encode(t, TEXTS[k], strlen(TEXTS[k]), mode, &ids, &n);
            if (st != LOOM_OK) {
                assert(loom_last_error()[0]);
                continue;
            }
            assert(n == 0 ? ids == NULL : ids != NULL);
            for (size_t i = 0; i < n; i++) {
                assert(ids[i] >= 0 && ids[i] < vocab);
                size_t tl;
                const char *s = loom_tok_id_to_token(t, ids[i], &tl);
                if (s) {
                    int32_t back = loom_tok_token_to_id(t, s, tl);
                    size_t bl;
                    const char *s2 = back >= 0 ? loom_tok_id_to_token(t, back, &bl) : NULL;
                    assert(s2 && bl == tl && memcmp(s, s2, tl) == 0);
                }
            }
            check_decode(t, ids, n, 0);
            check_decode(t, ids, n, 1);
            free(ids);
        }
    }
    loom_tok_free(t);
    return 0;
}
