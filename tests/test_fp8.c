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
#include "test_fp8.h"

#define SRC "tests/fixtures/models/qwen3-tiny"
#define TOL 1e-5

static char tmpdir[] = "/tmp/loom-test-fp8-XXXXXX";

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

/* The FP8 copy of src (quantized as v says) against its dequantized twin;
 * n_f8 weights must come out FP8. */
static void check_variant_of(const char *src, const test_fp8_variant *v, int n_f8) {
    char fdir[512], ddir[512];
    snprintf(fdir, sizeof fdir, "%s/%s", tmpdir, v->name);
    snprintf(ddir, sizeof ddir, "%s/%s-deq", tmpdir, v->name);
    CHECKF(test_fp8_write(src, fdir, ddir, v), "%s: writing the checkpoints", v->name);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    loom_model *mf = NULL, *md = NULL;
    loom_safetensors *ref = NULL;
    CHECKF(loom_model_load(fdir, &mp, &mf) == LOOM_OK, "%s: %s", v->name, loom_last_error());
    CHECKF(loom_model_load(ddir, &mp, &md) == LOOM_OK, "%s: %s", v->name, loom_last_error());
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", src);
    CHECK(loom_st_open(path, &ref) == LOOM_OK);
    if (!mf || !md || !ref) goto out;
    CHECKF(mf->n_f8 == n_f8, "%s: %d FP8 weights bound, expected %d", v->name, mf->n_f8, n_f8);
    CHECK(mf->layers[1].attn.wq.dtype == LOOM_DT_F8_E4M3);
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

static void check_variant(const test_fp8_variant *v) { check_variant_of(SRC, v, 3 * 7); }

static void expect_refused(const test_fp8_variant *v, loom_status want, const char *needle) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, v->name);
    CHECKF(test_fp8_write(SRC, dir, NULL, v), "%s: writing the checkpoint", v->name);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    loom_model *m = (loom_model *)1;
    loom_status s = loom_model_load(dir, &mp, &m);
    CHECKF(s == want, "%s: got %s (%s)", v->name, loom_status_str(s), loom_last_error());
    CHECK(m == NULL);
    CHECKF(strstr(loom_last_error(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", v->name,
           loom_last_error(), needle);
}

int main(void) {
    CHECK(mkdtemp(tmpdir) != NULL);
    const test_fp8_variant block = {.name = "block", .layout = TEST_FP8_BLOCK, .bf16_layer = 1,
                                     .scale_suffix = "_scale_inv", .qcfg = TEST_FP8_HF};
    check_variant(&block);
    check_variant(&(test_fp8_variant){
        .name = "channel", .layout = TEST_FP8_CHANNEL, .bf16_layer = 2, .scale_suffix = "_scale",
        .qcfg = "{\"quant_method\": \"fbgemm_fp8\", \"activation_scale_ub\": 1200.0}"});
    check_variant(&(test_fp8_variant){
        .name = "tensor", .layout = TEST_FP8_TENSOR, .bf16_layer = -1, .scale_suffix = "_scale_inv",
        .qcfg = "{\"quant_method\": \"fp8\", \"weight_block_size\": null, "
                "\"modules_to_not_convert\": [\"lm_head\"]}"});

    /* Qwen3-MoE: every expert's projections FP8 (the router stays float) */
    check_variant_of("tests/fixtures/models/qwen3moe-tiny",
                     &(test_fp8_variant){.name = "moe", .layout = TEST_FP8_BLOCK, .bf16_layer = 0,
                                         .scale_suffix = "_scale_inv", .qcfg = TEST_FP8_HF},
                     84);

    test_fp8_variant v = block;
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
    v = (test_fp8_variant){.name = "mixed", .layout = TEST_FP8_CHANNEL, .bf16_layer = -1,
                           .scale_suffix = "_scale_inv", .qcfg = TEST_FP8_HF};
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.0.self_attn.q_proj.weight_scale_inv: expected "
                   "F32/BF16 [1, 1] (128x128 blocks of F8_E4M3 [128, 64]), found F32 [128, 1]");
    /* block scales without a block config (a single block reads as
     * per-tensor: the same weights) */
    v = (test_fp8_variant){.name = "noblock", .layout = TEST_FP8_BLOCK, .bf16_layer = -1,
                           .scale_suffix = "_scale_inv",
                           .qcfg = "{\"quant_method\": \"fp8\", \"weight_block_size\": null}"};
    expect_refused(&v, LOOM_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight_scale_inv: expected "
                   "F32/BF16 [192] or [192, 1] per channel, or [1] per tensor");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    CHECK(system(cmd) == 0);
    return test_report("test_fp8");
}
