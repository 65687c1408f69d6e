/* Parity against the Hugging Face reference fixtures: logits at every
 * position (all at once, and one token at a time through the KV cache,
 * and in uneven chunks) and greedy continuations. */
#include <stdint.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "ops/ops.h"
#include "test.h"

#define TOL 1e-5

/* max |a - ref| / max |ref| */
static double rel_err(const float *a, const float *ref, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (d > e || d != d) e = d != d ? INFINITY : d;
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return e / m;
}

static void check_model(const char *dir, int n_prompts, int n_greedy) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    loom_status s = loom_st_open(path, &ref);
    CHECKF(s == LOOM_OK, "%s: %s", path, loom_last_error());
    loom_model *m = NULL;
    s = loom_model_load(dir, NULL, &m);
    CHECKF(s == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (!ref || !m) goto out;
    int V = loom_model_vocab_size(m);
    for (int i = 0; i < n_prompts; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *ids = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.logits", i);
        const loom_st_tensor *lg = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.greedy", i);
        const loom_st_tensor *gr = loom_st_find(ref, name);
        CHECK(ids && lg && gr);
        if (!ids || !lg || !gr) continue;
        int L = (int)ids->shape[0];
        const int32_t *tok = ids->data;
        const float *want = lg->data;
        CHECK_EQ_INT(lg->shape[1], V);
        float *got = malloc(sizeof(float) * (size_t)L * V);

        /* 1. whole prompt in one forward */
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = L + n_greedy + 8;
        CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
        CHECK(loom_context_eval(c, tok, L, 1, got) == LOOM_OK);
        double e1 = rel_err(got, want, (size_t)L * V);
        CHECKF(e1 <= TOL, "%s prompt %d (L=%d) batched: rel err %.3g", dir, i, L, e1);

        /* 2. token by token through the KV cache */
        CHECK(loom_context_truncate(c, 0) == LOOM_OK);
        for (int t = 0; t < L; t++)
            CHECK(loom_context_eval(c, tok + t, 1, 1, got + (size_t)t * V) == LOOM_OK);
        double e2 = rel_err(got, want, (size_t)L * V);
        CHECKF(e2 <= TOL, "%s prompt %d incremental: rel err %.3g", dir, i, e2);

        /* 3. uneven chunks (7, then the rest) */
        CHECK(loom_context_truncate(c, 0) == LOOM_OK);
        int first = L < 7 ? L : 7;
        CHECK(loom_context_eval(c, tok, first, 1, got) == LOOM_OK);
        if (L > first) CHECK(loom_context_eval(c, tok + first, L - first, 1, got + (size_t)first * V) == LOOM_OK);
        double e3 = rel_err(got, want, (size_t)L * V);
        CHECKF(e3 <= TOL, "%s prompt %d chunked: rel err %.3g", dir, i, e3);

        /* greedy continuation through the KV cache */
        CHECK(loom_context_truncate(c, 0) == LOOM_OK);
        int32_t out[64];
        int n_out = 0;
        int ng = (int)gr->shape[0];
        CHECK(loom_generate_greedy(c, tok, L, ng, NULL, 0, out, &n_out) == LOOM_OK);
        CHECK_EQ_INT(n_out, ng);
        int same = n_out == ng;
        for (int t = 0; t < ng && t < n_out; t++) same &= out[t] == ((const int32_t *)gr->data)[t];
        CHECKF(same, "%s prompt %d: greedy continuation differs", dir, i);
        fprintf(stderr, "%s prompt %d L=%d: err %.2g / %.2g / %.2g, greedy %s\n", dir, i, L,
                e1, e2, e3, same ? "ok" : "DIFF");
        loom_context_free(c);
        free(got);
    }
out:
    loom_model_free(m);
    loom_st_close(ref);
}

int main(void) {
    check_model("tests/fixtures/models/llama3-tiny", 4, 20);
    check_model("tests/fixtures/models/qwen2-tiny", 4, 20);
    check_model("tests/fixtures/models/qwen3-tiny", 4, 20);
    check_model("tests/fixtures/models/mistral-tiny-swa", 4, 20);
    check_model("tests/fixtures/trained/pycoder-16m", 3, 32);
    return test_report("test_model");
}
