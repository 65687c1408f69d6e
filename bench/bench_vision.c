/* bench_vision: one image through a vision-language model, timed.
 *
 *   bench_vision --model DIR --image FILE [--reps R] [--threads N] [--json]
 *   bench_vision --gen DIR [--text-layers N]
 *
 * The measuring is src/vision/vision_bench.c's (validation, the matmul
 * peer, the timed medians), shared with `loom bench --image`.
 *
 * --gen writes a random-weight Qwen2.5-VL-3B-shaped model to DIR: the
 * vision tower of the 3B checkpoint (depth 32, hidden 1280, MLP 3420, 16
 * heads, patch 14, window 112, full attention at blocks 7, 15, 23, 31,
 * out 2048) in bf16, and a text model of the 3B's width (hidden 2048, 16
 * heads, 2 KV heads, MLP 11008) with --text-layers layers (default 2) and
 * a vocabulary of 4096, so that the tower dominates the first token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "model/model.h"
#include "vision/vision.h"
#include "vision/vision_bench.h"

static const char usage[] =
    "usage: bench_vision --model DIR --image FILE [--reps R] [--threads N] [--json]\n"
    "       bench_vision --gen DIR [--text-layers N]\n";

/* ---- the random Qwen2.5-VL-3B-shaped model ------------------------------ */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* roughly N(0, 1): sum of 4 uniforms, centred */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        s += (float)(rng >> 40) / (float)(1 << 24);
    }
    return (s - 2.0f) * 1.7320508f;
}

typedef struct gen_list {
    loom_st_write_entry e[512];
    char names[512][96];
    int n;
} gen_list;

/* A bf16 tensor of shape (a[, b]): ones + N(0, 0.02) for a norm, else
 * N(0, 1 / sqrt(fan_in)). */
static int gen_add(gen_list *g, const char *name, int a, int b, int norm) {
    if (g->n == (int)(sizeof g->e / sizeof g->e[0])) return 0;
    size_t n = (size_t)a * (b ? b : 1);
    uint16_t *d = malloc(n * 2);
    if (!d) return 0;
    float sd = norm ? 0.02f : 1.0f / sqrtf((float)(b ? b : a));
    for (size_t i = 0; i < n; i++) d[i] = loom_f32_to_bf16((norm ? 1.0f : 0.0f) + sd * frand());
    snprintf(g->names[g->n], sizeof g->names[0], "%s", name);
    g->e[g->n] = (loom_st_write_entry){.name = g->names[g->n], .dtype = LOOM_DT_BF16,
                                       .ndim = b ? 2 : 1, .shape = {a, b}, .data = d};
    g->n++;
    return 1;
}

static int write_text(const char *dir, const char *file, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

static int gen_model(const char *dir, int text_layers) {
    enum { VD = 1280, VI = 3420, VDEPTH = 32, PD = 3 * 2 * 14 * 14, H = 2048, TI = 11008,
           HEADS = 16, KV = 2, HD = 128, VOCAB = 4096 };
    mkdir(dir, 0755);
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"Qwen2_5_VLForConditionalGeneration\"], \"model_type\": "
             "\"qwen2_5_vl\", \"image_token_id\": 4000, \"video_token_id\": 4001, "
             "\"vision_start_token_id\": 4002, \"vision_end_token_id\": 4003, "
             "\"tie_word_embeddings\": true, \"text_config\": {\"hidden_size\": %d, "
             "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
             "\"num_key_value_heads\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-6, "
             "\"max_position_embeddings\": 32768, \"hidden_act\": \"silu\", "
             "\"tie_word_embeddings\": true, \"rope_parameters\": {\"rope_type\": \"default\", "
             "\"rope_theta\": 1000000.0, \"mrope_section\": [16, 24, 24]}}, \"vision_config\": "
             "{\"depth\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, \"num_heads\": 16, "
             "\"patch_size\": 14, \"spatial_merge_size\": 2, \"temporal_patch_size\": 2, "
             "\"window_size\": 112, \"fullatt_block_indexes\": [7, 15, 23, 31], \"hidden_act\": "
             "\"silu\", \"out_hidden_size\": %d, \"in_channels\": 3}}\n",
             H, TI, text_layers, HEADS, KV, VOCAB, VDEPTH, VD, VI, H);
    static const char *pre =
        "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"do_convert_rgb\": true, "
        "\"do_normalize\": true, \"do_rescale\": true, \"do_resize\": true, \"image_mean\": "
        "[0.48145466, 0.4578275, 0.40821073], \"image_std\": [0.26862954, 0.26130258, "
        "0.27577711], \"merge_size\": 2, \"patch_size\": 14, \"resample\": 3, "
        "\"rescale_factor\": 0.00392156862745098, \"size\": {\"longest_edge\": 12845056, "
        "\"shortest_edge\": 3136}, \"temporal_patch_size\": 2}\n";
    if (!write_text(dir, "config.json", cfg) || !write_text(dir, "preprocessor_config.json", pre)) {
        fprintf(stderr, "bench_vision: cannot write into %s (its parent must exist)\n", dir);
        return 0;
    }
    static gen_list g;
    char n[96];
    int ok = gen_add(&g, "model.embed_tokens.weight", VOCAB, H, 0) &&
             gen_add(&g, "model.norm.weight", H, 0, 1);
    for (int l = 0; ok && l < text_layers; l++) {
        static const struct { const char *name; int a, b, norm; } t[] = {
            {"input_layernorm.weight", H, 0, 1}, {"post_attention_layernorm.weight", H, 0, 1},
            {"self_attn.q_proj.weight", HEADS * HD, H, 0}, {"self_attn.q_proj.bias", HEADS * HD, 0, 0},
            {"self_attn.k_proj.weight", KV * HD, H, 0}, {"self_attn.k_proj.bias", KV * HD, 0, 0},
            {"self_attn.v_proj.weight", KV * HD, H, 0}, {"self_attn.v_proj.bias", KV * HD, 0, 0},
            {"self_attn.o_proj.weight", H, HEADS * HD, 0}, {"mlp.gate_proj.weight", TI, H, 0},
            {"mlp.up_proj.weight", TI, H, 0}, {"mlp.down_proj.weight", H, TI, 0}};
        for (size_t k = 0; ok && k < sizeof t / sizeof t[0]; k++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, t[k].name);
            ok = gen_add(&g, n, t[k].a, t[k].b, t[k].norm);
        }
    }
    ok = ok && gen_add(&g, "visual.patch_embed.proj.weight", VD, PD, 0);
    for (int l = 0; ok && l < VDEPTH; l++) {
        static const struct { const char *name; int a, b, norm; } t[] = {
            {"norm1.weight", VD, 0, 1}, {"norm2.weight", VD, 0, 1},
            {"attn.qkv.weight", 3 * VD, VD, 0}, {"attn.qkv.bias", 3 * VD, 0, 0},
            {"attn.proj.weight", VD, VD, 0}, {"attn.proj.bias", VD, 0, 0},
            {"mlp.gate_proj.weight", VI, VD, 0}, {"mlp.gate_proj.bias", VI, 0, 0},
            {"mlp.up_proj.weight", VI, VD, 0}, {"mlp.up_proj.bias", VI, 0, 0},
            {"mlp.down_proj.weight", VD, VI, 0}, {"mlp.down_proj.bias", VD, 0, 0}};
        for (size_t k = 0; ok && k < sizeof t / sizeof t[0]; k++) {
            snprintf(n, sizeof n, "visual.blocks.%d.%s", l, t[k].name);
            ok = gen_add(&g, n, t[k].a, t[k].b, t[k].norm);
        }
    }
    ok = ok && gen_add(&g, "visual.merger.ln_q.weight", VD, 0, 1) &&
         gen_add(&g, "visual.merger.mlp.0.weight", 4 * VD, 4 * VD, 0) &&
         gen_add(&g, "visual.merger.mlp.0.bias", 4 * VD, 0, 0) &&
         gen_add(&g, "visual.merger.mlp.2.weight", H, 4 * VD, 0) &&
         gen_add(&g, "visual.merger.mlp.2.bias", H, 0, 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ok && loom_st_write(path, g.e, g.n) != LOOM_OK) ok = 0;
    for (int i = 0; i < g.n; i++) free((void *)g.e[i].data);
    if (!ok) fprintf(stderr, "bench_vision: writing %s failed: %s\n", dir, loom_last_error());
    return ok;
}

int main(int argc, char **argv) {
    const char *model = NULL, *image = NULL, *gen = NULL;
    int reps = 5, threads = 0, json = 0, text_layers = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!v || (strcmp(a, "--model") && strcmp(a, "--image") && strcmp(a, "--reps") &&
                   strcmp(a, "--threads") && strcmp(a, "--gen") && strcmp(a, "--text-layers"))) {
            fputs(usage, stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--image")) image = v;
        else if (!strcmp(a, "--gen")) gen = v;
        else if (!strcmp(a, "--reps")) reps = LOOM_MAX(1, atoi(v));
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else text_layers = LOOM_MAX(1, atoi(v));
    }
    if (gen) return gen_model(gen, text_layers) ? 0 : 1;
    if (!model || !image) {
        fputs(usage, stderr);
        return 2;
    }
    loom_model *m = NULL;
    loom_vision *v = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    loom_status s = loom_model_load(model, &mp, &m);
    if (!s) s = loom_vision_load(m, model, &v);
    if (!s && !v) s = loom_err(LOOM_ERR_UNSUPPORTED, "%s has no vision tower", model);
    loom_vision_bench b;
    if (!s) s = loom_vision_bench_run(m, v, model, image, reps, &b);
    if (!s) {
        loom_buf out = {0};
        loom_vision_bench_format(&b, model, image, json, &out);
        if (out.p) fputs(out.p, stdout);
        loom_buf_free(&out);
    } else {
        fprintf(stderr, "bench_vision: %s\n", loom_last_error());
    }
    loom_vision_free(v);
    loom_model_free(m);
    return s ? 1 : 0;
}
