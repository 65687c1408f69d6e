/* The text side of the vision-language models: bidirectional spans (Gemma
 * 3's images attend to each other both ways inside one image) in the CPU
 * forward, and a row that would split one is refused; both spellings of
 * M-RoPE's sections. Every family's logits and greedy tokens through the
 * prepared prompt are test_vision's. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/kv.h"
#include "load/config.h"
#include "load/safetensors.h"
#include "model/forward.h"
#include "ops/ops.h"
#include "model/matmul.h"
#include "test.h"

#define GEMMA_DIR "tests/fixtures/models/gemma3-vl-tiny"

static const loom_st_tensor *ref_t(const loom_safetensors *ref, const char *fmt, int i) {
    char name[96];
    snprintf(name, sizeof name, fmt, i);
    return loom_st_find(ref, name);
}

/* Gemma's image groups from its ids: each run of image_token is a span. */
static void image_groups(const int32_t *ids, int n, int image_token, int32_t *g) {
    for (int i = 0, k = -1; i < n; i++) {
        if (ids[i] == image_token && (i == 0 || ids[i - 1] != image_token)) k++;
        g[i] = ids[i] == image_token ? k : -1;
    }
}

typedef struct lm {
    loom_model *m;
    loom_kv_pool *kv;
    loom_fwd_state *fs;
    loom_kv_seq seq;
    int V;
} lm;

static int lm_open(lm *t, const char *dir) {
    memset(t, 0, sizeof *t);
    if (loom_model_load(dir, NULL, &t->m) != LOOM_OK) return 0;
    t->V = t->m->cfg.vocab_size;
    return loom_kv_pool_create(t->m->cfg.n_layers, loom_model_kv_dim(t->m), 16, 64, LOOM_KV_F32,
                               &t->kv) == LOOM_OK &&
           loom_fwd_state_create(t->m, 256, 256, &t->fs) == LOOM_OK;
}

static void lm_close(lm *t) {
    loom_kv_seq_release(t->kv, &t->seq);
    loom_fwd_state_free(t->fs);
    loom_kv_pool_free(t->kv);
    loom_model_free(t->m);
}

/* Prefills ids [0, n) from position 0 in rows cut at cuts[] (ascending,
 * ending with n), all logits into out; groups may be NULL. */
static loom_status prefill(lm *t, const int32_t *ids, int n, const int32_t *groups,
                           const int *cuts, float *out) {
    loom_kv_seq_release(t->kv, &t->seq);
    loom_status s = loom_kv_seq_reserve(t->kv, &t->seq, n);
    for (int a = 0, c = 0; s == LOOM_OK && a < n; a = cuts[c++]) {
        loom_fwd_row r = {.tokens = ids + a, .n = cuts[c] - a, .seq = &t->seq,
                          .logits = LOOM_LOGITS_ALL, .out = out + (size_t)a * t->V,
                          .groups = groups ? groups + a : NULL, .pos_ld = n, .pos_off = a};
        s = loom_forward(t->m, t->fs, &t->kv->lay, &r, 1);
    }
    return s;
}

/* max |a - b| / max |b| over rows [r0, r1) of V logits */
static double rows_err(const float *a, const float *b, int r0, int r1, int V) {
    return test_rel_err(a + (size_t)r0 * V, b + (size_t)r0 * V, (size_t)(r1 - r0) * V);
}

static void spans(void) {
    lm t;
    loom_safetensors *ref = NULL;
    CHECKF(lm_open(&t, GEMMA_DIR), "%s", loom_last_error());
    CHECK(loom_st_open(GEMMA_DIR "/reference.safetensors", &ref) == LOOM_OK);
    const loom_st_tensor *it = ref_t(ref, "case.%d.input_ids", 1);
    int n = (int)it->shape[0], V = t.V;
    int32_t *ids = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((const int64_t *)it->data)[i];
    image_groups(ids, n, 507, g);
    int a = 0, b = 0; /* the image's span [a, b) */
    while (g[a] < 0) a++;
    for (b = a; b < n && g[b] == 0;) b++;
    CHECK(a == 6 && b == 22);
    float *one = calloc((size_t)n * V, 4), *three = calloc((size_t)n * V, 4);
    float *causal = calloc((size_t)n * V, 4);
    int whole[] = {n}, split3[] = {a, b, n};
    CHECKF(prefill(&t, ids, n, g, whole, one) == LOOM_OK, "%s", loom_last_error());
    CHECKF(prefill(&t, ids, n, g, split3, three) == LOOM_OK, "%s", loom_last_error());
    CHECK(prefill(&t, ids, n, NULL, whole, causal) == LOOM_OK);
    /* chunks at the span's bounds compute the same; before the span nothing
     * changes; inside and after it the span's tokens see each other */
    double e3 = rows_err(three, one, 0, n, V), before = rows_err(causal, one, 0, a, V);
    double in = rows_err(causal, one, a, b, V);
    CHECKF(e3 < 1e-6, "chunked at the span's bounds: %g", e3);
    CHECKF(before < 1e-6, "before the span: %g", before);
    CHECKF(in > 1e-3, "inside the span: %g", in);
    /* rows that end or start inside the span are refused, and leave the
     * sequence where it was */
    int ends_in[] = {a + 3, n};
    CHECK(prefill(&t, ids, n, g, ends_in, one) == LOOM_ERR_INVALID_ARG);
    CHECKF(strstr(loom_last_error(), "inside the bidirectional span 0"), "%s", loom_last_error());
    CHECK_EQ_INT(t.seq.n_tokens, 0);
    loom_fwd_row r = {.tokens = ids, .n = a + 3, .seq = &t.seq, .logits = LOOM_LOGITS_NONE};
    CHECK(loom_forward(t.m, t.fs, &t.kv->lay, &r, 1) == LOOM_OK);
    r = (loom_fwd_row){.tokens = ids + a + 3, .n = n - a - 3, .seq = &t.seq,
                       .logits = LOOM_LOGITS_NONE, .groups = g + a + 3, .pos_ld = n,
                       .pos_off = a + 3};
    CHECK(loom_forward(t.m, t.fs, &t.kv->lay, &r, 1) == LOOM_ERR_INVALID_ARG);
    CHECKF(strstr(loom_last_error(), "starts at position 9 inside"), "%s", loom_last_error());
    CHECK_EQ_INT(t.seq.n_tokens, a + 3);
    free(one);
    free(three);
    free(causal);
    free(ids);
    free(g);
    loom_st_close(ref);
    lm_close(&t);
}

/* Both spellings of M-RoPE's sections: transformers 5's rope_parameters
 * and the older rope_scaling of type "mrope". */
static void mrope_config(void) {
    static const char *older = "{\"architectures\": [\"Qwen2_5_VLForConditionalGeneration\"], "
        "\"hidden_size\": 64, \"vocab_size\": 512, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"rope_theta\": 1e6, "
        "\"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [16, 24, 24]}}";
    loom_config c;
    CHECKF(loom_config_parse(older, "config.json", &c) == LOOM_OK, "%s", loom_last_error());
    CHECK(c.rope.type == LOOM_ROPE_DEFAULT && c.rope.theta == 1e6);
    CHECK(c.rope.mrope_section[0] == 16 && c.rope.mrope_section[1] == 24 &&
          c.rope.mrope_section[2] == 24);
    static const char *bad = "{\"architectures\": [\"Qwen2_5_VLForConditionalGeneration\"], "
        "\"hidden_size\": 64, \"vocab_size\": 512, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 4, \"intermediate_size\": 128, "
        "\"rope_parameters\": {\"rope_type\": \"default\", \"mrope_section\": [16, 24]}}";
    CHECK(loom_config_parse(bad, "config.json", &c) == LOOM_ERR_FORMAT);
    CHECKF(strstr(loom_last_error(), "mrope_section must be an array of 3 integers"), "%s", loom_last_error());
}

int main(void) {
    mrope_config();
    spans();
    return test_report("test_vision_lm");
}
