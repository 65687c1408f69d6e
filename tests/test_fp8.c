/* FP8 checkpoints (Hugging Face quant_method "fp8" and fbgemm's per-channel
 * "fbgemm_fp8"): qwen3-tiny's linears quantized here to e4m3 the way those
 * checkpoints store them (128 x 128 block scales with partial edge blocks,
 * F32 or BF16 scales; per-channel [out, 1]; per-tensor [1]) must give the
 * logits and greedy tokens of the same model with the dequantized weights
 * stored as F32, prompt by prompt and token by token; malformed scales,
 * unknown formats and FP8 tensors without the config are refused by name.
 * (tests/test_model.c checks the reference fixture qwen3-tiny-fp8, made by
 * tools/make_fp8_fixture.py with transformers.) */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "model/forward.h"
#include "ops/ops.h"
#include "test.h"

#define SRC "tests/fixtures/models/qwen3-tiny"
#define TOL 1e-5

static char tmpdir[] = "/tmp/loom-test-fp8-XXXXXX";

enum { BLOCK, CHANNEL, TENSOR };

typedef struct variant {
    const char *name;
    int layout;            /* BLOCK, CHANNEL, TENSOR */
    int bf16_layer;        /* layer whose scales are BF16 (-1: none) */
    const char *scale_suffix;
    const char *qcfg;      /* quantization_config, JSON */
    /* damage for the refusal cases */
    const char *drop;      /* a tensor left out */
    const char *bad_shape; /* a scale written one column too wide */
    int no_qcfg;           /* config.json without quantization_config */
} variant;

static int is_linear(const char *name) {
    size_t n = strlen(name);
    return strstr(name, ".layers.") && n > 12 && !strcmp(name + n - 12, "_proj.weight");
}

/* Quantizes w [rows, cols] as the FP8 checkpoints do: per block, scale =
 * amax / 448 (stored as F32, or BF16 when bf16), codes = e4m3(w / scale
 * as stored); deq gets code * scale rounded to f32, the weight the model
 * should behave as. */
static void quantize(const float *w, int rows, int cols, int br, int bc, int bf16, uint8_t *q,
                     void *scales, float *deq) {
    int sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    for (int a = 0; a < sr; a++)
        for (int b = 0; b < sc; b++) {
            float amax = 0;
            for (int i = a * br; i < LOOM_MIN(rows, (a + 1) * br); i++)
                for (int j = b * bc; j < LOOM_MIN(cols, (b + 1) * bc); j++)
                    amax = fmaxf(amax, fabsf(w[(size_t)i * cols + j]));
            float s = fmaxf(amax, 1e-12f) / 448.0f;
            if (bf16) {
                uint16_t h = loom_f32_to_bf16(s);
                ((uint16_t *)scales)[a * sc + b] = h;
                s = loom_bf16_to_f32(h);
            } else {
                ((float *)scales)[a * sc + b] = s;
            }
            for (int i = a * br; i < LOOM_MIN(rows, (a + 1) * br); i++)
                for (int j = b * bc; j < LOOM_MIN(cols, (b + 1) * bc); j++) {
                    size_t k = (size_t)i * cols + j;
                    q[k] = loom_f32_to_e4m3(w[k] / s);
                    deq[k] = loom_e4m3_to_f32(q[k]) * s;
                }
        }
}

static void write_config(const char *dir, const char *qcfg) {
    char path[512], *text = NULL;
    size_t n;
    CHECK(loom_read_file(SRC "/config.json", &text, &n) == LOOM_OK);
    if (!text) return;
    char *end = strrchr(text, '}');
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (qcfg) fprintf(f, "%.*s, \"quantization_config\": %s}\n", (int)(end - text), text, qcfg);
    else fputs(text, f);
    fclose(f);
    free(text);
}

/* dir/fp8: the FP8 checkpoint of variant v; dir/deq (when deq_dir): the
 * dequantized one in F32. */
static void make_dirs(const char *fp8_dir, const char *deq_dir, const variant *v) {
    mkdir(fp8_dir, 0700);
    if (deq_dir) mkdir(deq_dir, 0700);
    write_config(fp8_dir, v->no_qcfg ? NULL : v->qcfg);
    if (deq_dir) write_config(deq_dir, NULL);
    loom_safetensors *src = NULL;
    CHECK(loom_st_open(SRC "/model.safetensors", &src) == LOOM_OK);
    if (!src) return;
    int cnt = loom_st_count(src), k = 0, kd = 0;
    loom_st_write_entry *e = calloc((size_t)cnt * 2, sizeof *e), *d = calloc((size_t)cnt, sizeof *d);
    void **owned = calloc((size_t)cnt * 4, sizeof *owned);
    int no = 0;
    for (int i = 0; i < cnt; i++) {
        const loom_st_tensor *t = loom_st_at(src, i);
        loom_st_write_entry ent = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                   .data = t->data};
        memcpy(ent.shape, t->shape, sizeof t->shape);
        if (!is_linear(t->name)) {
            if (!v->drop || strcmp(v->drop, t->name)) e[k++] = ent;
            d[kd++] = ent;
            continue;
        }
        int rows = (int)t->shape[0], cols = (int)t->shape[1];
        int layer = atoi(strstr(t->name, ".layers.") + 8);
        int br = v->layout == BLOCK ? 128 : v->layout == CHANNEL ? 1 : rows;
        int bc = v->layout == BLOCK ? 128 : cols;
        int sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc, bf16 = layer == v->bf16_layer;
        uint8_t *q = malloc((size_t)rows * cols);
        void *s = calloc((size_t)sr * (sc + 1), 4);
        float *deq = malloc(sizeof(float) * (size_t)rows * cols);
        quantize(t->data, rows, cols, br, bc, bf16, q, s, deq);
        owned[no++] = q, owned[no++] = s, owned[no++] = deq;
        char *sname = malloc(strlen(t->name) + 32);
        snprintf(sname, strlen(t->name) + 32, "%s%s", t->name, v->scale_suffix);
        owned[no++] = sname;
        loom_st_write_entry qe = ent, se = {.name = sname, .dtype = bf16 ? LOOM_DT_BF16 : LOOM_DT_F32,
                                            .data = s};
        qe.dtype = LOOM_DT_F8_E4M3;
        qe.data = q;
        if (v->layout == TENSOR) {
            se.ndim = 1, se.shape[0] = 1;
        } else {
            se.ndim = 2, se.shape[0] = sr, se.shape[1] = sc;
            if (v->bad_shape && !strcmp(v->bad_shape, sname)) se.shape[1] = sc + 1;
        }
        if (!v->drop || strcmp(v->drop, qe.name)) e[k++] = qe;
        if (!v->drop || strcmp(v->drop, sname)) e[k++] = se;
        loom_st_write_entry de = ent;
        de.dtype = LOOM_DT_F32;
        de.data = deq;
        d[kd++] = de;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", fp8_dir);
    CHECK(loom_st_write(path, e, k) == LOOM_OK);
    if (deq_dir) {
        snprintf(path, sizeof path, "%s/model.safetensors", deq_dir);
        CHECK(loom_st_write(path, d, kd) == LOOM_OK);
    }
    for (int i = 0; i < no; i++) free(owned[i]);
    free(owned);
    free(e);
    free(d);
    loom_st_close(src);
}

/* Logits at every position of the whole prompt, then greedy decoding. */
static int run(loom_model *m, const int32_t *tok, int L, float *lg, int32_t *out, int ng,
               int one_by_one) {
    int V = loom_model_vocab_size(m);
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = L + ng + 1;
    if (loom_context_create(m, &cp, &c) != LOOM_OK) return 0;
    int ok = 1;
    if (one_by_one)
        for (int t = 0; ok && t < L; t++)
            ok = loom_context_eval(c, tok + t, 1, 1, lg + (size_t)t * V) == LOOM_OK;
    else
        ok = loom_context_eval(c, tok, L, 1, lg) == LOOM_OK;
    float *last = malloc(sizeof(float) * (size_t)V);
    memcpy(last, lg + (size_t)(L - 1) * V, sizeof(float) * (size_t)V);
    for (int i = 0; ok && i < ng; i++) {
        out[i] = loom_argmax(last, V);
        if (i + 1 < ng) ok = loom_context_eval(c, &out[i], 1, 0, last) == LOOM_OK;
    }
    free(last);
    loom_context_free(c);
    return ok;
}

static void check_variant(const variant *v) {
    char fdir[512], ddir[512];
    snprintf(fdir, sizeof fdir, "%s/%s", tmpdir, v->name);
    snprintf(ddir, sizeof ddir, "%s/%s-deq", tmpdir, v->name);
    make_dirs(fdir, ddir, v);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    loom_model *mf = NULL, *md = NULL;
    loom_safetensors *ref = NULL;
    CHECKF(loom_model_load(fdir, &mp, &mf) == LOOM_OK, "%s: %s", v->name, loom_last_error());
    CHECKF(loom_model_load(ddir, &mp, &md) == LOOM_OK, "%s: %s", v->name, loom_last_error());
    CHECK(loom_st_open(SRC "/reference.safetensors", &ref) == LOOM_OK);
    if (!mf || !md || !ref) goto out;
    CHECKF(mf->n_f8 == 3 * 7, "%s: %d FP8 weights bound", v->name, mf->n_f8);
    CHECK(mf->layers[1].mlp.gate.dtype == LOOM_DT_F8_E4M3);
    int V = loom_model_vocab_size(mf);
    double worst = 0;
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *ids = loom_st_find(ref, name);
        if (!ids) continue;
        int L = (int)ids->shape[0], ng = 8;
        float *a = malloc(sizeof(float) * (size_t)L * V), *b = malloc(sizeof(float) * (size_t)L * V);
        int32_t ga[8], gb[8];
        for (int obo = 0; obo < (L <= 45 ? 2 : 1); obo++) {
            CHECK(run(mf, ids->data, L, a, ga, ng, obo) && run(md, ids->data, L, b, gb, ng, 0));
            double e = test_rel_err(a, b, (size_t)L * V);
            worst = test_max(worst, e);
            CHECKF(e <= TOL, "%s prompt %d%s: rel err %.3g against the dequantized model",
                   v->name, i, obo ? " token by token" : "", e);
            CHECKF(!memcmp(ga, gb, sizeof ga), "%s prompt %d: greedy tokens differ", v->name, i);
        }
        free(a);
        free(b);
    }
    fprintf(stderr, "test_fp8: %-8s max rel err %.2g against the dequantized F32 model\n",
            v->name, worst);
out:
    loom_st_close(ref);
    loom_model_free(mf);
    loom_model_free(md);
}

static void expect_refused(const variant *v, loom_status want, const char *needle) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, v->name);
    make_dirs(dir, NULL, v);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    loom_model *m = (loom_model *)1;
    loom_status s = loom_model_load(dir, &mp, &m);
    CHECKF(s == want, "%s: got %s (%s)", v->name, loom_status_str(s), loom_last_error());
    CHECK(m == NULL);
    CHECKF(strstr(loom_last_error(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", v->name,
           loom_last_error(), needle);
}

#define HF_FP8 "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", " \
               "\"weight_block_size\": [128, 128]}"

int main(void) {
    CHECK(mkdtemp(tmpdir) != NULL);
    const variant block = {.name = "block", .layout = BLOCK, .bf16_layer = 1,
                           .scale_suffix = "_scale_inv", .qcfg = HF_FP8};
    check_variant(&block);
    check_variant(&(variant){.name = "channel", .layout = CHANNEL, .bf16_layer = 2,
                             .scale_suffix = "_scale", .qcfg = "{\"quant_method\": \"fbgemm_fp8\", \"activation_scale_ub\": 1200.0}"});
    check_variant(&(variant){.name = "tensor", .layout = TENSOR, .bf16_layer = -1,
                             .scale_suffix = "_scale_inv", .qcfg = "{\"quant_method\": \"fp8\", \"weight_block_size\": null, "
                             "\"modules_to_not_convert\": [\"lm_head\"]}"});

    variant v = block;
    v.name = "noscale";
    v.drop = "model.layers.1.mlp.up_proj.weight_scale_inv";
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.1.mlp.up_proj.weight_scale_inv: missing "
                   "(expected F32/BF16 [2, 1] (128x128 blocks of F8_E4M3 [192, 64]))");
    v = block;
    v.name = "shape";
    v.bad_shape = "model.layers.2.mlp.down_proj.weight_scale_inv";
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.2.mlp.down_proj.weight_scale_inv: expected "
                   "F32/BF16 [1, 2] (128x128 blocks of F8_E4M3 [64, 192]), found F32 [1, 3]");
    v = block;
    v.name = "noconfig";
    v.no_qcfg = 1;
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.0.self_attn.q_proj.weight: F8_E4M3 but "
                   "config.json has no quantization_config");
    v = block;
    v.name = "e5m2";
    v.qcfg = "{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}";
    expect_refused(&v, LOOM_ERR_UNSUPPORTED, "fmt \"e5m2\" is not supported (expected \"e4m3\")");
    v.name = "static";
    v.qcfg = "{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}";
    expect_refused(&v, LOOM_ERR_UNSUPPORTED, "activation_scheme \"static\" is not supported");
    v.name = "blocksize";
    v.qcfg = "{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}";
    expect_refused(&v, LOOM_ERR_FORMAT, "weight_block_size: expected [rows, cols]");
    /* per-channel scales under a block config */
    v = (variant){.name = "mixed", .layout = CHANNEL, .bf16_layer = -1,
                  .scale_suffix = "_scale_inv", .qcfg = HF_FP8};
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.0.self_attn.q_proj.weight_scale_inv: expected "
                   "F32/BF16 [1, 1] (128x128 blocks of F8_E4M3 [128, 64]), found F32 [128, 1]");
    /* block scales without a block config (a single block reads as
     * per-tensor: the same weights) */
    v = (variant){.name = "noblock", .layout = BLOCK, .bf16_layer = -1, .scale_suffix = "_scale_inv",
                  .qcfg = "{\"quant_method\": \"fp8\", \"weight_block_size\": null}"};
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight_scale_inv: expected "
                   "F32/BF16 [192] or [192, 1] per channel, or [1] per tensor");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    CHECK(system(cmd) == 0);
    return test_report("test_fp8");
}
