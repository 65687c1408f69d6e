/* bench_vision: one image through a vision-language model, timed.
 *
 *   bench_vision --model DIR --image FILE [--reps R] [--threads N] [--json]
 *   bench_vision --gen DIR [--text-layers N]
 *
 * In order:
 * 1. Validation: the image is decoded and preprocessed, the tower encodes
 *    it twice (finite, and the same bits both times), and the prompt built
 *    around it prefills to finite logits.
 * 2. The peer: the model's own matmul (loom_fwd_matmul on the pool) over a
 *    [1280, 1280] weight of the tower's dtype with T = 1024 rows, the
 *    achievable peak of this CPU for the tower's work, measured in the
 *    same run.
 * 3. Timed, median of R after one warm-up: preprocessing (decode + resize
 *    + patches), the tower's encode, and the time to the first token: file
 *    to first greedy token (decode, preprocess, encode, prompt build,
 *    prefill of a short prompt holding the image's placeholders).
 *    The tower's FLOPs per image are counted from its shapes
 *    (loom_vision_flops); GFLOP/s and the share of the peer follow.
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
#include "engine/context.h"
#include "load/safetensors.h"
#include "model/matmul.h"
#include "model/model.h"
#include "ops/threadpool.h"
#include "vision/image.h"
#include "vision/imgproc.h"
#include "vision/vision.h"

static const char usage[] =
    "usage: bench_vision --model DIR --image FILE [--reps R] [--threads N] [--json]\n"
    "       bench_vision --gen DIR [--text-layers N]\n";

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

/* ---- the run ------------------------------------------------------------- */

typedef struct run {
    loom_model *m;
    loom_vision *v;
    loom_imgproc proc;
    const char *image, *dir;
} run;

/* File -> pixels: decode, preprocess. */
static loom_status prep(const run *r, loom_imgproc_out *px) {
    loom_image img = {0};
    loom_status s = loom_image_load(r->image, &img);
    if (!s) s = loom_imgproc_run(&r->proc, &img, px);
    loom_image_free(&img);
    return s;
}

/* A short prompt around the image's tok placeholders:
 * 8 text, start, image x tok, end, 8 text. *n gets its length. */
static int32_t *prompt_ids(const loom_vision_info *vi, int tok, int *n) {
    int32_t *ids = malloc(sizeof *ids * (size_t)(tok + 18));
    int k = 0;
    for (int i = 0; i < 8; i++) ids[k++] = 10 + i;
    if (vi->vision_start >= 0) ids[k++] = vi->vision_start;
    for (int i = 0; i < tok; i++) ids[k++] = vi->image_token;
    if (vi->vision_end >= 0) ids[k++] = vi->vision_end;
    for (int i = 0; i < 8; i++) ids[k++] = 20 + i;
    *n = k;
    return ids;
}

/* File to first greedy token; *tok gets it. */
static loom_status first_token(run *r, int32_t *tok) {
    loom_imgproc_out px;
    loom_status s = prep(r, &px);
    if (s) return s;
    const loom_vision_info *vi = loom_vision_get_info(r->v);
    loom_vision_image img = {px.pixel_values,
                             {px.plan.grid_t, px.plan.grid_h, px.plan.grid_w}};
    int n = 0;
    int32_t *ids = prompt_ids(vi, loom_vision_tokens(vi, img.grid), &n);
    loom_vision_prompt p;
    loom_context *c = NULL;
    float *logits = malloc(sizeof(float) * (size_t)r->m->cfg.vocab_size);
    s = loom_vision_prompt_build(r->v, ids, n, &img, 1, &p);
    int built = !s;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n + 1;
    /* whole prompt in one row: no image span is cut */
    cp.n_batch = n;
    if (!s) s = loom_context_create(r->m, &cp, &c);
    if (!s) s = loom_context_eval_input(c, ids, n, &p.in, 0, logits);
    if (!s) {
        int V = r->m->cfg.vocab_size, ok = 1;
        for (int i = 0; i < V; i++) ok &= isfinite(logits[i]) != 0;
        if (!ok) s = loom_err(LOOM_ERR_INTERNAL, "bench_vision: the prompt's logits are not finite");
        *tok = loom_argmax(logits, V);
    }
    loom_context_free(c);
    if (built) loom_vision_prompt_free(&p);
    free(logits);
    free(ids);
    loom_imgproc_out_free(&px);
    return s;
}

/* The matmul peer: GFLOP/s of loom_fwd_matmul over [1280, 1280] of dtype
 * dt at T = 1024, best of 5 after a warm-up. */
static double matmul_peer(loom_model *m, loom_dtype dt) {
    enum { R = 1280, C = 1280, T = 1024 };
    size_t es = loom_dtype_size(dt);
    void *w = loom_alloc((size_t)R * C * es);
    float *x = loom_alloc(sizeof(float) * (size_t)T * C), *y = loom_alloc(sizeof(float) * (size_t)T * R);
    if (!w || !x || !y) return 0;
    for (size_t i = 0; i < (size_t)R * C; i++) {
        float f = 0.03f * frand();
        if (dt == LOOM_DT_F32) ((float *)w)[i] = f;
        else if (dt == LOOM_DT_BF16) ((uint16_t *)w)[i] = loom_f32_to_bf16(f);
        else ((uint16_t *)w)[i] = loom_f32_to_f16(f);
    }
    for (size_t i = 0; i < (size_t)T * C; i++) x[i] = frand();
    loom_weight lw = {.dtype = dt, .rows = R, .cols = C, .data = w};
    double best = 0;
    for (int r = 0; r < 6; r++) {
        double t0 = loom_now();
        loom_fwd_matmul(m, y, x, &lw, T);
        double dtm = loom_now() - t0;
        if (r) best = LOOM_MAX(best, 2.0 * R * C * T / dtm / 1e9);
    }
    loom_free(w), loom_free(x), loom_free(y);
    return best;
}

/* The dtype most of the tower's bytes are in (F32 if unsure). */
static loom_dtype tower_dtype(const loom_model *m) {
    double by[LOOM_DT_COUNT] = {0};
    for (int i = 0; i < loom_st_count(m->st); i++) {
        const loom_st_tensor *t = loom_st_at(m->st, i);
        if (strstr(t->name, "visual.") || strstr(t->name, "vision_tower."))
            by[t->dtype] += (double)t->nbytes;
    }
    loom_dtype best = LOOM_DT_F32;
    for (int d = 0; d < LOOM_DT_COUNT; d++)
        if (by[d] > by[best]) best = (loom_dtype)d;
    return best == LOOM_DT_BF16 || best == LOOM_DT_F16 ? best : LOOM_DT_F32;
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
    run r = {.image = image, .dir = model};
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    loom_status s = loom_model_load(model, &mp, &r.m);
    if (!s) s = loom_vision_load(r.m, model, &r.v);
    if (!s && !r.v) s = loom_err(LOOM_ERR_UNSUPPORTED, "%s has no vision tower", model);
    if (!s) s = loom_imgproc_load(model, &r.proc);
    loom_imgproc_out px = {0};
    if (!s) s = prep(&r, &px);
    if (s) {
        fprintf(stderr, "bench_vision: %s\n", loom_last_error());
        return 1;
    }
    const loom_vision_info *vi = loom_vision_get_info(r.v);
    loom_vision_image img = {px.pixel_values, {px.plan.grid_t, px.plan.grid_h, px.plan.grid_w}};
    int tok = loom_vision_tokens(vi, img.grid), H = vi->out_hidden, D = vi->n_deep;
    size_t ne = (size_t)tok * H, nd = (size_t)LOOM_MAX(D, 1) * tok * H;
    float *e1 = malloc(sizeof(float) * ne), *e2 = malloc(sizeof(float) * ne);
    float *d1 = malloc(sizeof(float) * nd), *d2 = malloc(sizeof(float) * nd);
    /* 1. validate */
    s = loom_vision_encode(r.v, &img, e1, D ? d1 : NULL);
    if (!s) s = loom_vision_encode(r.v, &img, e2, D ? d2 : NULL);
    int ok = !s && !memcmp(e1, e2, sizeof(float) * ne) && (!D || !memcmp(d1, d2, sizeof(float) * nd));
    for (size_t i = 0; ok && i < ne; i++) ok = isfinite(e1[i]) != 0;
    int32_t first = -1;
    if (ok && (s = first_token(&r, &first))) ok = 0;
    if (!ok) {
        fprintf(stderr, "bench_vision: validation failed: %s\n",
                s ? loom_last_error() : "the tower's output is not finite or not reproducible");
        return 1;
    }
    /* 2. the peer */
    loom_dtype dt = tower_dtype(r.m);
    double peer = matmul_peer(r.m, dt);
    /* 3. timed */
    double *tp = malloc(sizeof(double) * (size_t)reps), *te = malloc(sizeof(double) * (size_t)reps);
    double *tt = malloc(sizeof(double) * (size_t)reps);
    for (int k = -1; k < reps; k++) {
        loom_imgproc_out o;
        double t0 = loom_now();
        if (prep(&r, &o)) return 1;
        double t1 = loom_now();
        loom_imgproc_out_free(&o);
        if (loom_vision_encode(r.v, &img, e1, D ? d1 : NULL)) return 1;
        double t2 = loom_now();
        int32_t t_;
        if (first_token(&r, &t_) || t_ != first) {
            fprintf(stderr, "bench_vision: the first token changed (%d, then %d)\n", first, t_);
            return 1;
        }
        double t3 = loom_now();
        if (k >= 0) tp[k] = t1 - t0, te[k] = t2 - t1, tt[k] = t3 - t2;
    }
    double flops = loom_vision_flops(r.v, img.grid);
    double mp_ = median(tp, reps), me = median(te, reps), mt = median(tt, reps);
    double gf = flops / me / 1e9;
    int nt = loom_pool_size(r.m->pool);
    if (json)
        printf("{\"model\":\"%s\",\"image\":\"%s\",\"resized\":[%d,%d],\"grid\":[%d,%d,%d],"
               "\"tokens\":%d,\"threads\":%d,\"dtype\":\"%s\",\"tower_gflop\":%.4f,"
               "\"preprocess_s\":%.6f,\"encode_s\":%.6f,\"ttft_s\":%.6f,\"encode_gflops\":%.3f,"
               "\"matmul_peer_gflops\":%.3f,\"share_of_peer\":%.4f}\n",
               model, image, px.plan.resized_w, px.plan.resized_h, img.grid[0], img.grid[1],
               img.grid[2], tok, nt, loom_dtype_name(dt), flops / 1e9, mp_, me, mt, gf, peer,
               peer > 0 ? gf / peer : 0);
    else {
        printf("%s, %s: %dx%d -> grid %dx%dx%d, %d image tokens; %d threads, tower %s\n", model,
               image, px.plan.resized_w, px.plan.resized_h, img.grid[0], img.grid[1], img.grid[2],
               tok, nt, loom_dtype_name(dt));
        printf("  tower      %.3f GFLOP per image (counted from the shapes)\n", flops / 1e9);
        printf("  preprocess %8.2f ms   (decode + resize + patches)\n", mp_ * 1e3);
        printf("  encode     %8.2f ms   %.1f GFLOP/s, %.0f%% of the matmul peer (%.1f GFLOP/s, "
               "%s [1280 x 1280] at T = 1024)\n", me * 1e3, gf, peer > 0 ? 100 * gf / peer : 0,
               peer, loom_dtype_name(dt));
        printf("  TTFT       %8.2f ms   (file to first token, %d-token prompt)\n", mt * 1e3,
               tok + 16 + (vi->vision_start >= 0) + (vi->vision_end >= 0));
    }
    free(tp), free(te), free(tt);
    free(e1), free(e2), free(d1), free(d2);
    loom_imgproc_out_free(&px);
    loom_vision_free(r.v);
    loom_model_free(r.m);
    return 0;
}
