/* vocab_tok: a grammar vocabulary from a tokenizer (each token's bytes).
 * Apart from grammar.c so that a build without the tokenizer (the minimal
 * GPU-test build) still has the matcher the engine calls. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "tokenize/tokenizer.h"

loom_status loom_gvocab_from_tok(const loom_tok *t, int n_vocab, loom_gvocab **out) {
    *out = NULL;
    int n = LOOM_MAX(n_vocab, loom_tok_vocab_size(t));
    char **bytes = calloc((size_t)n, sizeof *bytes);
    int *lens = calloc((size_t)n, sizeof *lens);
    loom_status st = bytes && lens ? LOOM_OK : loom_err(LOOM_ERR_NOMEM, "out of memory");
    char buf[1024];
    for (int i = 0; i < n && !st; i++) {
        int len = i < loom_tok_vocab_size(t) ? loom_tok_token_bytes(t, i, buf, sizeof buf) : -1;
        lens[i] = len > (int)sizeof buf ? -1 : len;
        if (lens[i] > 0 && !(bytes[i] = malloc((size_t)len))) st = loom_err(LOOM_ERR_NOMEM, "out of memory");
        if (lens[i] > 0 && bytes[i]) memcpy(bytes[i], buf, (size_t)len);
    }
    if (!st) st = loom_gvocab_create((const char *const *)bytes, lens, n, out);
    for (int i = 0; i < n && bytes; i++) free(bytes[i]);
    free(bytes), free(lens);
    return st;
}
