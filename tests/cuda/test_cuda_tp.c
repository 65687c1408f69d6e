/* Tensor parallelism on CUDA device 0: the dense fixtures split over 2 and
 * 4 ranks that share the one GPU (their sums through the kernel reducer)
 * and over 1 rank (through NCCL where built with it): every prompt's logits
 * against the reference (the tolerance of test_cuda_engine) and against the
 * unsplit model on the device (the split reorders only the o and down
 * sums), the reference's greedy continuations through the context and the
 * four prompts batched through the engine; the refusals of what does not
 * split. Needs a GPU; run through tools/cuda_check.sh. */
#include <stdint.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "../test.h"
#include "ref_prompt.h"

static const char *models[] = {"llama3-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny-swa",
                               "gemma2-tiny", "gemma3-tiny"};

static loom_model *load(const char *dir, int tp, int on_one) {
    static const int zeros[8] = {0};
    loom_model_params mp = loom_model_default_params();
    mp.device = 0;
    mp.tensor_parallel = tp;
    mp.tp_devices = on_one ? zeros : NULL;
    loom_model *m = NULL;
    if (loom_model_load(dir, &mp, &m) != LOOM_OK) return NULL;
    return m;
}

/* All logits of prompt ids [n] through a context of m, or NULL. */
static float *eval(loom_model *m, const int32_t *ids, int n) {
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n + 24;
    float *got = malloc(sizeof(float) * (size_t)n * loom_model_vocab_size(m));
    if (!got || loom_context_create(m, &cp, &c) != LOOM_OK || loom_context_eval(c, ids, n, 1, got)) {
        fprintf(stderr, "eval: %s\n", loom_last_error());
        free(got);
        got = NULL;
    }
    loom_context_free(c);
    return got;
}

static void check(const char *name, int tp) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    loom_model *one = load(dir, 0, 0), *split = load(dir, tp, tp > 1);
    if (loom_st_open(path, &ref) || !one || !split) {
        fprintf(stderr, "%s over %d: %s\n", name, tp, loom_last_error());
        CHECK(0);
        loom_st_close(ref);
        loom_model_free(one);
        loom_model_free(split);
        return;
    }
    int V = loom_model_vocab_size(split);
    const int32_t *ids[4], *greedy[4];
    int len[4], same = 0;
    double worst_ref = 0, worst_one = 0;
    for (int i = 0; i < 4; i++) {
        const float *want;
        if (!ref_prompt(ref, i, &ids[i], &len[i], &greedy[i], &want)) {
            CHECK(0);
            continue;
        }
        float *a = eval(split, ids[i], len[i]), *b = eval(one, ids[i], len[i]);
        CHECK(a && b);
        if (a && b) {
            size_t n = (size_t)len[i] * V;
            worst_ref = test_max(worst_ref, test_rel_err(a, want, n));
            worst_one = test_max(worst_one, test_rel_err(a, b, n));
        }
        free(a);
        free(b);
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = len[i] + 24;
        int32_t out[20];
        int n = 0;
        if (loom_context_create(split, &cp, &c) == LOOM_OK &&
            loom_generate_greedy(c, ids[i], len[i], 20, NULL, 0, out, &n) == LOOM_OK)
            same += n == 20 && !memcmp(out, greedy[i], sizeof out);
        loom_context_free(c);
    }
    fprintf(stderr, "%s over %d ranks: logits %.2g of the reference's max, %.2g of one device's; "
            "%d of 4 greedy runs as the reference\n", name, tp, worst_ref, worst_one, same);
    CHECKF(worst_ref < 1e-4, "%s over %d: logits off the reference by %g", name, tp, worst_ref);
    CHECKF(worst_one < 1e-4, "%s over %d: logits off one device's by %g", name, tp, worst_one);
    CHECK_EQ_INT(same, 4);
    /* the four prompts batched, in chunks */
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 400;
    ep.max_batch_tokens = 24;
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(split, &ep, &e) == LOOM_OK, "%s", loom_last_error());
    if (e) {
        loom_request *r[4];
        for (int i = 0; i < 4; i++) {
            loom_request_params rp = loom_request_default_params();
            rp.prompt = ids[i];
            rp.n_prompt = len[i];
            rp.max_tokens = 20;
            rp.ignore_eos = 1;
            r[i] = NULL;
            CHECK(loom_engine_submit(e, &rp, &r[i]) == LOOM_OK);
        }
        for (int i = 0; i < 4; i++) {
            int32_t out[21];
            int n = 0;
            for (loom_event ev; r[i] && loom_request_next(r[i], &ev, 60000) == LOOM_OK && !ev.finish;)
                if (n < 21) out[n++] = ev.token;
            CHECKF(n == 20 && !memcmp(out, greedy[i], sizeof(int32_t) * 20),
                   "%s over %d: batched prompt %d gave %d tokens, not the reference's", name, tp, i, n);
            loom_request_free(r[i]);
        }
        loom_engine_free(e);
    }
    loom_model_free(split);
    loom_model_free(one);
    loom_st_close(ref);
}

/* What does not split fails at the first context, naming why. */
static void refused(const char *name, int tp, const char *why) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    loom_model *m = load(dir, tp, 1);
    CHECKF(m != NULL, "%s: %s", name, loom_last_error());
    if (!m) return;
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    loom_status st = loom_context_create(m, &cp, &c);
    CHECKF(st != LOOM_OK && strstr(loom_last_error(), why), "%s over %d: %s", name, tp,
           st ? loom_last_error() : "created");
    loom_context_free(c);
    loom_model_free(m);
}

int main(void) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(models); i++) check(models[i], 2);
    check("qwen3-tiny", 4);
    check("llama3-tiny", 1);
    refused("qwen3moe-tiny", 2, "dense attention");
    refused("qwen3-tiny", 3, "do not split 3 ways");
    refused("qwen3-tiny-mlx4", 2, "quantized");
    return test_report("test_cuda_tp");
}
