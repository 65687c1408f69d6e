/* The text side of the vision-language models: bidirectional spans (Gemma
 * 3's images attend to each other both ways inside one image) in the CPU
 * forward, and a row that would split one is refused; Gemma 3's logits and
 * greedy tokens for every fixture case, images encoded by the SigLIP
 * tower. */
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
#include "vision/qwen25_vit.h"
#include "vision/siglip.h"

#define GEMMA_DIR "tests/fixtures/models/gemma3-vl-tiny"
#define QWEN_DIR "tests/fixtures/models/qwen2.5-vl-tiny"

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

/* The prompt's layer-0 rows: each token's embedding (times the model's
 * scale, as the forward does for ids), with image token tok's rows taken
 * from the tower's output in order. */
static float *prompt_embeds(loom_model *m, const int32_t *ids, int n, int tok, const float *img) {
    int H = m->cfg.hidden_size;
    float *e = malloc(sizeof(float) * (size_t)n * H);
    for (int i = 0, k = 0; i < n; i++) {
        float *x = e + (size_t)i * H;
        if (ids[i] == tok) {
            memcpy(x, img + (size_t)k++ * H, sizeof(float) * (size_t)H);
            continue;
        }
        loom_fwd_weight_row(m, &m->embed, x, ids[i]);
        for (int j = 0; j < H; j++) x[j] *= m->embed_scale;
    }
    return e;
}

/* Gemma 3 with images, end to end: the SigLIP tower's (projected) rows go
 * in where the image tokens' embeddings were (after the embedding scale),
 * the image's tokens attending to each other both ways. */
static void gemma_logits(void) {
    lm t;
    loom_safetensors *ref = NULL;
    CHECKF(lm_open(&t, GEMMA_DIR), "%s", loom_last_error());
    CHECK(loom_st_open(GEMMA_DIR "/reference.safetensors", &ref) == LOOM_OK);
    char *text = NULL;
    size_t len;
    CHECK(loom_read_file(GEMMA_DIR "/config.json", &text, &len) == LOOM_OK);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    loom_model *m = t.m;
    int V = t.V, H = m->cfg.hidden_size;
    loom_siglip *tower = NULL;
    CHECKF(loom_siglip_load(m, cfg, H, &tower) == LOOM_OK, "%s", loom_last_error());
    for (int c = 0; tower && c <= 3; c++) {
        const loom_st_tensor *it = ref_t(ref, "case.%d.input_ids", c);
        const loom_st_tensor *lg = ref_t(ref, "case.%d.logits", c);
        const loom_st_tensor *gr = ref_t(ref, "case.%d.greedy", c);
        const loom_st_tensor *px = ref_t(ref, "case.%d.pixel_values", c);
        int n = (int)it->shape[0], n_img = px ? (int)px->shape[0] : 0;
        int32_t *ids = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((const int64_t *)it->data)[i];
        image_groups(ids, n, 507, g);
        float *rows = malloc(sizeof(float) * ((size_t)n_img * 16 + 1) * H);
        if (n_img) CHECKF(loom_siglip_encode(tower, px->data, n_img, rows, NULL) == LOOM_OK, "%s",
                          loom_last_error());
        float *emb = prompt_embeds(m, ids, n, 507, rows);
        float *out = calloc((size_t)n * V, 4);
        loom_kv_seq_release(t.kv, &t.seq);
        CHECK(loom_kv_seq_reserve(t.kv, &t.seq, n + 8) == LOOM_OK);
        loom_fwd_row r = {.tokens = ids, .n = n, .seq = &t.seq, .logits = LOOM_LOGITS_ALL,
                          .out = out, .embeds = emb, .groups = g, .pos_ld = n};
        CHECKF(loom_forward(m, t.fs, &t.kv->lay, &r, 1) == LOOM_OK, "%s", loom_last_error());
        double e = test_rel_err(out, lg->data, (size_t)n * V);
        fprintf(stderr, "  gemma3-vl case %d logits: max err / max |ref| = %.3g\n", c, e);
        CHECKF(e < 1e-5, "gemma3-vl case %d logits: %g", c, e);
        /* greedy through the KV cache */
        float *last = out + (size_t)(n - 1) * V;
        int same = 1;
        for (int k = 0; k < 8; k++) {
            int32_t next = loom_argmax(last, V);
            same &= next == ((const int64_t *)gr->data)[k];
            r = (loom_fwd_row){.tokens = &next, .n = 1, .seq = &t.seq, .logits = LOOM_LOGITS_LAST,
                               .out = out, .decode = 1};
            last = out;
            if (k < 7) CHECK(loom_forward(m, t.fs, &t.kv->lay, &r, 1) == LOOM_OK);
        }
        CHECKF(same, "gemma3-vl case %d greedy tokens differ", c);
        free(out);
        free(emb);
        free(rows);
        free(ids);
        free(g);
    }
    loom_siglip_free(tower);
    cJSON_Delete(cfg);
    loom_st_close(ref);
    lm_close(&t);
}

/* Qwen2.5-VL with images, end to end: the tower's rows in place of the
 * image pads, M-RoPE positions from loom_qwen25_rope_index, decode
 * positions continuing from its delta. */
static void qwen_logits(void) {
    lm t;
    loom_safetensors *ref = NULL;
    CHECKF(lm_open(&t, QWEN_DIR), "%s", loom_last_error());
    CHECK(loom_st_open(QWEN_DIR "/reference.safetensors", &ref) == LOOM_OK);
    char *text = NULL;
    size_t len;
    CHECK(loom_read_file(QWEN_DIR "/config.json", &text, &len) == LOOM_OK);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    loom_model *m = t.m;
    int V = t.V, H = m->cfg.hidden_size;
    CHECK(m->cfg.rope.mrope_section[0] == 2 && m->cfg.rope.mrope_section[2] == 3);
    loom_qwen25_vit *tower = NULL;
    CHECKF(loom_qwen25_vit_load(m, cfg, H, &tower) == LOOM_OK, "%s", loom_last_error());
    for (int c = 0; tower && c <= 3; c++) {
        const loom_st_tensor *it = ref_t(ref, "case.%d.input_ids", c);
        const loom_st_tensor *lg = ref_t(ref, "case.%d.logits", c);
        const loom_st_tensor *gr = ref_t(ref, "case.%d.greedy", c);
        const loom_st_tensor *px = ref_t(ref, "case.%d.pixel_values", c);
        const loom_st_tensor *gt = ref_t(ref, "case.%d.image_grid_thw", c);
        int n = (int)it->shape[0], n_img = gt ? (int)gt->shape[0] : 0, grids[24], n_rows = 0;
        for (int k = 0; k < 3 * n_img; k++) grids[k] = (int)((const int64_t *)gt->data)[k];
        for (int k = 0; k < n_img; k++) n_rows += loom_qwen25_vit_tokens(tower, grids + 3 * k);
        int32_t *ids = malloc((size_t)n * 4), *mpos = malloc((size_t)n * 12);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((const int64_t *)it->data)[i];
        float *rows = malloc(sizeof(float) * ((size_t)n_rows + 1) * H);
        if (n_img) CHECKF(loom_qwen25_vit_encode(tower, px->data, grids, n_img, rows, NULL) ==
                          LOOM_OK, "%s", loom_last_error());
        int delta = 0;
        CHECK(loom_qwen25_rope_index(ids, n, 504, grids, n_img, 2, mpos, &delta) == LOOM_OK);
        float *emb = prompt_embeds(m, ids, n, 504, rows);
        float *out = calloc((size_t)n * V, 4);
        loom_kv_seq_release(t.kv, &t.seq);
        CHECK(loom_kv_seq_reserve(t.kv, &t.seq, n + 8) == LOOM_OK);
        loom_fwd_row r = {.tokens = ids, .n = n, .seq = &t.seq, .logits = LOOM_LOGITS_ALL,
                          .out = out, .embeds = emb, .pos3 = mpos, .pos_ld = n};
        CHECKF(loom_forward(m, t.fs, &t.kv->lay, &r, 1) == LOOM_OK, "%s", loom_last_error());
        double e = test_rel_err(out, lg->data, (size_t)n * V);
        fprintf(stderr, "  qwen2.5-vl case %d logits: max err / max |ref| = %.3g\n", c, e);
        CHECKF(e < 1e-5, "qwen2.5-vl case %d logits: %g", c, e);
        /* greedy through the KV cache, positions past the prompt + delta */
        float *last = out + (size_t)(n - 1) * V;
        int same = 1;
        for (int k = 0; k < 8; k++) {
            int32_t next = loom_argmax(last, V);
            same &= next == ((const int64_t *)gr->data)[k];
            r = (loom_fwd_row){.tokens = &next, .n = 1, .seq = &t.seq, .logits = LOOM_LOGITS_LAST,
                               .out = out, .decode = 1, .pos_delta = delta};
            last = out;
            if (k < 7) CHECK(loom_forward(m, t.fs, &t.kv->lay, &r, 1) == LOOM_OK);
        }
        CHECKF(same, "qwen2.5-vl case %d greedy tokens differ", c);
        free(out);
        free(emb);
        free(rows);
        free(ids);
        free(mpos);
    }
    loom_qwen25_vit_free(tower);
    cJSON_Delete(cfg);
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
    gemma_logits();
    qwen_logits();
    return test_report("test_vision_lm");
}
