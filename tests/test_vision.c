/* Vision-language parity against the Hugging Face fixtures of every family
 * (Qwen3-VL, Qwen3.5-VL, Qwen2.5-VL, Gemma 3), all through loom_vision_load,
 * loom_vision_encode and loom_vision_prompt_build: the tower alone (patch
 * embeddings and the merger's input where the fixture keeps them, image
 * features, deepstack planes), the positions and delta of every case
 * (M-RoPE, or plain with Gemma's image spans), logits at every position of
 * each prepared prompt (in one forward and in chunks), 8 greedy tokens
 * through the KV cache with the decode delta, and the errors of prompts
 * whose placeholders do not match. */
#include <png.h>
#include <stdint.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/context.h"
#include "load/config.h"
#include "load/safetensors.h"
#include "model/model.h"
#include "test.h"
#include "vision/image.h"
#include "vision/imgproc.h"
#include "vision/vision.h"
#include "vision/vision_int.h"

#define N_CASES 4

static const loom_st_tensor *ref_get(const loom_safetensors *ref, int i, const char *what) {
    char name[96];
    snprintf(name, sizeof name, "case.%d.%s", i, what);
    return loom_st_find(ref, name);
}

/* An I64 tensor as int32 (owned). */
static int32_t *ints(const loom_st_tensor *t, int *n) {
    size_t k = t->nbytes / 8;
    int32_t *o = malloc(sizeof *o * (k ? k : 1));
    for (size_t i = 0; i < k; i++) o[i] = (int32_t)((const int64_t *)t->data)[i];
    if (n) *n = (int)k;
    return o;
}

/* The images of case i (borrowed pixels) into imgs; their count. */
static int case_images(const loom_safetensors *ref, int i, const loom_vision_info *vi,
                       loom_vision_image *imgs) {
    const loom_st_tensor *pv = ref_get(ref, i, "pixel_values");
    const loom_st_tensor *gt = ref_get(ref, i, "image_grid_thw");
    if (!pv || (!gt && !vi->tokens_per_image)) return 0;
    /* Gemma: (n, 3, S, S), one whole image each */
    int n_img = (int)(gt ? gt->shape[0] : pv->shape[0]);
    const int64_t *g = gt ? gt->data : NULL;
    const float *px = pv->data;
    for (int k = 0; k < n_img; k++) {
        for (int d = 0; d < 3; d++) imgs[k].grid[d] = g ? (int)g[3 * k + d] : 1;
        imgs[k].pixels = px;
        px += (size_t)imgs[k].grid[0] * imgs[k].grid[1] * imgs[k].grid[2] * vi->patch_dim;
    }
    return n_img;
}

static double rel_err(const float *a, const float *ref, size_t n) {
    return test_rel_err(a, ref, n);
}

/* The tower over each case's images against image_embeds and deepstack
 * (and case 1's internals). */
static void check_tower(loom_vision *v, const loom_safetensors *ref, int has_deep) {
    const loom_vision_info *vi = loom_vision_get_info(v);
    int H = vi->out_hidden;
    for (int i = 1; i < N_CASES; i++) {
        loom_vision_image imgs[4];
        int n_img = case_images(ref, i, vi, imgs);
        CHECKF(n_img > 0, "case %d has no images", i);
        const loom_st_tensor *ie = ref_get(ref, i, "image_embeds");
        const loom_st_tensor *de = ref_get(ref, i, "deepstack_embeds");
        CHECK(ie && (!has_deep || de));
        if (!ie || (has_deep && !de)) continue;
        CHECK_EQ_INT(vi->n_deep, has_deep ? (int)de->shape[0] : 0);
        int total = (int)ie->shape[0], at = 0, D = vi->n_deep;
        float *emb = malloc(sizeof(float) * (size_t)total * H);
        float *deep = malloc(sizeof(float) * (size_t)LOOM_MAX(D, 1) * total * H);
        for (int k = 0; k < n_img; k++) {
            int cnt = loom_vision_tokens(vi, imgs[k].grid), N = cnt * vi->merge * vi->merge;
            float *tp = NULL, *tm = NULL;
            const loom_st_tensor *pe = loom_st_find(ref, "case.1.vision.patch_embed_out");
            const loom_st_tensor *mi = loom_st_find(ref, "case.1.vision.merger_in");
            if (i == 1 && pe && mi) {
                v->tap_patch = tp = malloc(sizeof(float) * (size_t)N * 1024);
                v->tap_merge_in = tm = malloc(sizeof(float) * (size_t)N * 1024);
            }
            float *e = malloc(sizeof(float) * (size_t)cnt * H);
            float *d = malloc(sizeof(float) * (size_t)LOOM_MAX(D, 1) * cnt * H);
            CHECKF(loom_vision_encode(v, &imgs[k], e, D ? d : NULL) == LOOM_OK, "%s",
                   loom_last_error());
            memcpy(emb + (size_t)at * H, e, sizeof(float) * (size_t)cnt * H);
            for (int p = 0; p < D; p++)
                memcpy(deep + ((size_t)p * total + at) * H, d + (size_t)p * cnt * H,
                       sizeof(float) * (size_t)cnt * H);
            at += cnt;
            if (i == 1 && pe && mi) {
                {
                    size_t sz = pe->nbytes / 4;
                    double e1 = rel_err(tp, pe->data, sz), e2 = rel_err(tm, mi->data, sz);
                    printf("  case 1 patch_embed_out %.2e, merger_in %.2e\n", e1, e2);
                    CHECKF(e1 < 1e-5 && e2 < 1e-5, "patch embed %.3e, merger input %.3e", e1, e2);
                }
                v->tap_patch = v->tap_merge_in = NULL;
                free(tp);
                free(tm);
            }
            free(e);
            free(d);
        }
        CHECK_EQ_INT(at, total);
        double ee = rel_err(emb, ie->data, (size_t)total * H);
        double ed = D ? rel_err(deep, de->data, (size_t)D * total * H) : 0;
        printf("  case %d image_embeds %.2e, deepstack %.2e\n", i, ee, ed);
        CHECKF(ee < 1e-5 && ed < 1e-5, "case %d: image embeds %.3e, deepstack %.3e", i, ee, ed);
        free(emb);
        free(deep);
    }
}

/* Every case's positions and delta: M-RoPE (t, h, w) against position_ids
 * (3, n) and rope_deltas, or, without M-RoPE (Gemma 3: position_ids (n)),
 * plain positions on every stream and delta 0. */
static void check_positions(loom_vision *v, const loom_safetensors *ref) {
    const loom_vision_info *vi = loom_vision_get_info(v);
    for (int i = 0; i < N_CASES; i++) {
        int n, n_want;
        int32_t *ids = ints(ref_get(ref, i, "input_ids"), &n);
        int32_t *want = ints(ref_get(ref, i, "position_ids"), &n_want);
        const loom_st_tensor *rd = ref_get(ref, i, "rope_deltas");
        int32_t *wd = rd ? ints(rd, NULL) : NULL;
        CHECK_EQ_INT(!!rd, vi->mrope);
        CHECK_EQ_INT(n_want, vi->mrope ? 3 * n : n);
        loom_vision_image imgs[4];
        int n_img = i ? case_images(ref, i, vi, imgs) : 0, grids[4][3], delta = 99;
        for (int k = 0; k < n_img; k++) memcpy(grids[k], imgs[k].grid, sizeof grids[k]);
        int32_t *pos = malloc(sizeof *pos * 3 * (size_t)n);
        CHECKF(loom_vision_positions(vi, ids, n, (const int(*)[3])grids, n_img, pos, &delta) ==
                   LOOM_OK, "%s", loom_last_error());
        for (int k = 0; k < (vi->mrope ? 1 : 3); k++)
            CHECKF(!memcmp(pos + (size_t)k * n, want, sizeof *pos * (size_t)n_want),
                   "case %d: positions differ", i);
        CHECK_EQ_INT(delta, wd ? wd[0] : 0);
        if (n_img > 0) {
            /* an image fewer than the placeholders: an error naming both counts */
            CHECK(loom_vision_positions(vi, ids, n, (const int(*)[3])grids, n_img - 1, pos,
                                        &delta) == LOOM_ERR_INVALID_ARG);
            CHECKF(strstr(loom_last_error(), "placeholder tokens") != NULL, "%s", loom_last_error());
            /* a grid that does not fit its run */
            grids[0][2] += vi->merge;
            CHECK(loom_vision_positions(vi, ids, n, (const int(*)[3])grids, n_img, pos, &delta) ==
                  LOOM_ERR_INVALID_ARG);
            CHECKF(strstr(loom_last_error(), vi->tokens_per_image ? "expected 1x1x1"
                                                                  : "placeholder tokens") != NULL,
                   "%s", loom_last_error());
        }
        free(pos);
        free(ids);
        free(want);
        free(wd);
    }
}

/* Logits of every case (one forward, then chunks of 5) and the greedy
 * continuation through the KV cache. */
static void check_logits(loom_model *m, loom_vision *v, const loom_safetensors *ref, double tol) {
    const loom_vision_info *vi = loom_vision_get_info(v);
    int V = m->cfg.vocab_size;
    for (int i = 0; i < N_CASES; i++) {
        int n;
        int32_t *ids = ints(ref_get(ref, i, "input_ids"), &n);
        int32_t *greedy = ints(ref_get(ref, i, "greedy"), NULL);
        const loom_st_tensor *lt = ref_get(ref, i, "logits");
        loom_vision_image imgs[4];
        int n_img = i ? case_images(ref, i, vi, imgs) : 0;
        loom_vision_prompt p;
        CHECKF(loom_vision_prompt_build(v, ids, n, imgs, n_img, &p) == LOOM_OK, "%s",
               loom_last_error());
        /* Gemma: the image tokens are the spans mm_token_type_ids marks */
        const loom_st_tensor *tt = ref_get(ref, i, "mm_token_type_ids");
        CHECK_EQ_INT(p.groups != NULL, vi->spans && n_img > 0);
        for (int k = 0; p.groups && tt && k < n; k++)
            CHECKF((p.groups[k] >= 0) == (((const int64_t *)tt->data)[k] != 0),
                   "case %d: token %d in span %d, token type %d", i, k, p.groups[k],
                   (int)((const int64_t *)tt->data)[k]);
        float *got = malloc(sizeof(float) * (size_t)n * V);
        if (p.groups) {
            /* chunks of 5 cut a span: refused naming it */
            loom_context_params cp = loom_context_default_params();
            cp.n_batch = 5;
            loom_context *c = NULL;
            CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
            CHECK(loom_context_eval_input(c, ids, n, &p.in, 1, got) == LOOM_ERR_INVALID_ARG);
            CHECKF(strstr(loom_last_error(), "bidirectional span") != NULL, "%s",
                   loom_last_error());
            loom_context_free(c);
        }
        int batch = loom_vision_prompt_batch(&p, 5);
        CHECK(p.groups ? batch >= 16 && batch <= n : batch == 5);
        for (int chunk = 0; chunk < 2; chunk++) {
            loom_context_params cp = loom_context_default_params();
            cp.n_ctx = 256;
            cp.n_batch = chunk ? batch : 0;
            loom_context *c = NULL;
            CHECKF(loom_context_create(m, &cp, &c) == LOOM_OK, "%s", loom_last_error());
            CHECKF(loom_context_eval_input(c, ids, n, &p.in, 1, got) == LOOM_OK, "%s",
                   loom_last_error());
            double e = rel_err(got, lt->data, (size_t)n * V);
            printf("  case %d logits %.2e%s\n", i, e, chunk ? " (in chunks)" : "");
            CHECKF(e < tol, "case %d: logits off by %.3e of max |logit| (tolerance %.0e)", i, e, tol);
            int32_t tok = loom_argmax(got + (size_t)(n - 1) * V, V), out[8];
            float *last = malloc(sizeof(float) * (size_t)V);
            for (int g = 0; g < 8; g++) {
                out[g] = tok;
                if (g < 7 && loom_context_eval(c, &tok, 1, 0, last) == LOOM_OK)
                    tok = loom_argmax(last, V);
            }
            CHECKF(!memcmp(out, greedy, sizeof out), "case %d: greedy %d %d %d %d %d %d %d %d", i,
                   out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]);
            free(last);
            loom_context_free(c);
        }
        free(got);
        loom_vision_prompt_free(&p);
        free(ids);
        free(greedy);
    }
}

static void check_model(const char *dir, int has_deep, double tol) {
    printf("%s\n", dir);
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    loom_model *m = NULL;
    loom_vision *v = NULL;
    loom_model_params mp = loom_model_default_params();
    CHECKF(loom_st_open(path, &ref) == LOOM_OK, "%s", loom_last_error());
    CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s", loom_last_error());
    if (m) CHECKF(loom_vision_load(m, dir, &v) == LOOM_OK && v, "%s", loom_last_error());
    if (ref && m && v) {
        check_tower(v, ref, has_deep);
        check_positions(v, ref);
        check_logits(m, v, ref, tol);
    }
    loom_vision_free(v);
    loom_model_free(m);
    loom_st_close(ref);
}

/* The rope's stream per rotated pair: interleaved t,h,w (Qwen3-VL's
 * [6, 5, 5]) and, from the same checkpoint with mrope_interleaved false,
 * sectioned runs (Qwen2.5-VL's layout); a text row of a VL model is the
 * row with pos3 = (p, p, p) bit for bit. */
static void check_rope_streams(void) {
    const char *src = "tests/fixtures/models/qwen3-vl-tiny";
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    loom_model *m = NULL;
    CHECKF(loom_model_load(src, &mp, &m) == LOOM_OK, "%s", loom_last_error());
    if (!m) return;
    const loom_rope *R = &m->ropes[0];
    CHECK(R->stream && R->rot_dim == 32);
    for (int i = 0; R->stream && i < 16; i++) {
        int want = i % 3 == 1 && i < 15 ? 1 : i % 3 == 2 && i < 15 ? 2 : 0;
        CHECKF(R->stream[i] == want, "interleaved pair %d: stream %d, expected %d", i,
               R->stream[i], want);
    }
    /* text row vs the same row with explicit (p, p, p) positions */
    int V = m->cfg.vocab_size, n = 6;
    int32_t ids[6] = {5, 17, 300, 42, 9, 77}, pos3[18];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++) pos3[k * n + i] = i;
    loom_fwd_input in = {.pos3 = pos3};
    float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
    loom_context *c = NULL;
    CHECK(loom_context_create(m, NULL, &c) == LOOM_OK);
    CHECK(loom_context_eval(c, ids, n, 1, a) == LOOM_OK);
    loom_context_truncate(c, 0);
    CHECK(loom_context_eval_input(c, ids, n, &in, 1, b) == LOOM_OK);
    CHECK(!memcmp(a, b, sizeof(float) * (size_t)n * V));
    /* a delta moves the rope of the rows that follow */
    in.pos_delta = -2;
    loom_context_truncate(c, 0);
    CHECK(loom_context_eval_input(c, ids, n, &in, 1, b) == LOOM_OK);
    CHECK(loom_context_eval(c, ids, 1, 0, b) == LOOM_OK);
    loom_context_truncate(c, 0);
    CHECK(loom_context_eval(c, ids, n, 1, a) == LOOM_OK);
    CHECK(loom_context_eval(c, ids, 1, 0, a) == LOOM_OK);
    CHECK(memcmp(a, b, sizeof(float) * (size_t)V) != 0);
    free(a);
    free(b);
    loom_context_free(c);
    loom_model_free(m);

    /* sectioned: the same config with mrope_interleaved false */
    char dir[] = "/tmp/loom_vision_XXXXXX", path[512], *text = NULL;
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/config.json", src);
    CHECK(loom_read_file(path, &text, NULL) == LOOM_OK);
    char *at = text ? strstr(text, "\"mrope_interleaved\": true") : NULL;
    CHECK(at != NULL);
    if (at) memcpy(at + strlen("\"mrope_interleaved\": "), "0   ", 4);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (f && text) fputs(text, f);
    if (f) fclose(f);
    free(text);
    char target[512];
    snprintf(target, sizeof target, "%s/%s/model.safetensors", getenv("PWD") ? getenv("PWD") : ".",
             src);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(symlink(target, path) == 0);
    m = NULL;
    CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s", loom_last_error());
    for (int i = 0; m && m->ropes[0].stream && i < 16; i++) {
        int want = i < 6 ? 0 : i < 11 ? 1 : 2;
        CHECKF(m->ropes[0].stream[i] == want, "sectioned pair %d: stream %d, expected %d", i,
               m->ropes[0].stream[i], want);
    }
    loom_model_free(m);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* mrope_section must be 3 integers; a well-formed one is kept. */
static void check_mrope_config(void) {
    static const char *base = "{\"architectures\": [\"Qwen3VLForConditionalGeneration\"], "
        "\"text_config\": {\"vocab_size\": 16, \"hidden_size\": 8, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 1, \"intermediate_size\": 8, \"rope_parameters\": "
        "{\"rope_theta\": 10000, \"rope_type\": \"default\", %s}}}";
    static const char *bad[] = {"\"mrope_section\": [1, 2]", "\"mrope_section\": [1, 2, -1]",
                                "\"mrope_section\": \"1,2,3\""};
    char text[1024];
    loom_config cfg;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(bad); i++) {
        snprintf(text, sizeof text, base, bad[i]);
        CHECKF(loom_config_parse(text, "config.json", &cfg) == LOOM_ERR_FORMAT, "%s", bad[i]);
        CHECKF(strstr(loom_last_error(), "mrope_section") != NULL, "%s", loom_last_error());
    }
    snprintf(text, sizeof text, base, "\"mrope_section\": [2, 1, 1], \"mrope_interleaved\": true");
    CHECKF(loom_config_parse(text, "config.json", &cfg) == LOOM_OK, "%s", loom_last_error());
    CHECK(cfg.rope.mrope_section[0] == 2 && cfg.rope.mrope_section[2] == 1);
    CHECK(cfg.rope.mrope_interleaved == 1);
}

/* The tower's FLOPs from its shapes, worked by hand for two fixtures:
 * Qwen2.5-VL (grid 1x4x4: 16 patches of 1176, D 32, MLP 96, 2 blocks,
 * one window of all 16 patches, merger 128 -> 128 -> 64) and Gemma 3 (64
 * patches of 588, D 64, MLP 128, 2 layers, 16 tokens projected to 64). */
static void check_flops(void) {
    static const struct { const char *dir; int grid[3]; double want; } cases[] = {
        {"tests/fixtures/models/qwen2.5-vl-tiny", {1, 4, 4},
         2.0 * 16 * 1176 * 32 + 2 * (2.0 * 16 * (4 * 32 * 32 + 3 * 32 * 96) + 4.0 * 16 * 16 * 32) +
             2.0 * 4 * (128 * 128 + 128 * 64)},
        {"tests/fixtures/models/gemma3-vl-tiny", {1, 1, 1},
         2.0 * 64 * 588 * 64 + 2 * (2.0 * 64 * (4 * 64 * 64 + 2 * 64 * 128) + 4.0 * 64 * 64 * 64) +
             2.0 * 16 * 64 * 64},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++) {
        loom_model *m = NULL;
        loom_vision *v = NULL;
        CHECK(loom_model_load(cases[i].dir, NULL, &m) == LOOM_OK);
        if (m) CHECK(loom_vision_load(m, cases[i].dir, &v) == LOOM_OK && v);
        if (v) {
            double f = loom_vision_flops(v, cases[i].grid);
            CHECKF(f == cases[i].want, "%s: %.0f FLOPs, expected %.0f", cases[i].dir, f,
                   cases[i].want);
            int bad[3] = {1, 3, 4};
            CHECK(loom_vision_flops(v, bad) == 0);
        }
        loom_vision_free(v);
        loom_model_free(m);
    }
}

/* A w x h RGB PNG of a gradient (fast to write: no filter, deflate level
 * 1) at path; 0 on failure. */
static int write_png(const char *path, int w, int h) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    uint8_t *row = malloc((size_t)w * 3);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(row);
        fclose(f);
        return 0;
    }
    png_init_io(png, f);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_set_compression_level(png, 1);
    png_set_filter(png, 0, PNG_FILTER_NONE);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            row[3 * x] = (uint8_t)(x >> 5);
            row[3 * x + 1] = (uint8_t)(y >> 5);
            row[3 * x + 2] = 128;
        }
        png_write_row(png, row);
    }
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(row);
    return fclose(f) == 0;
}

/* Huge images: a 50-megapixel PNG is decoded and resized within each
 * processor's limits (max_pixels for Qwen, the fixed size for Gemma), its
 * grid one the tower takes; a PNG header claiming 100000 x 100000 is
 * refused from the header, naming the size and the limit; the Qwen plan
 * of that size stays within max_pixels. */
static void check_huge_images(void) {
    char dir[] = "/tmp/loom_vision_big_XXXXXX", big[96], claim[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(big, sizeof big, "%s/big.png", dir);
    snprintf(claim, sizeof claim, "%s/claim.png", dir);
    CHECK(write_png(big, 7200, 7000));
    static const char *const dirs[] = {"tests/fixtures/models/qwen2.5-vl-tiny",
                                       "tests/fixtures/models/gemma3-vl-tiny"};
    loom_image img = {0};
    CHECKF(loom_image_load(big, &img) == LOOM_OK, "%s", loom_last_error());
    for (size_t d = 0; img.rgb && d < LOOM_ARRAY_LEN(dirs); d++) {
        loom_imgproc p;
        loom_imgproc_out o;
        CHECK(loom_imgproc_load(dirs[d], &p) == LOOM_OK);
        CHECKF(loom_imgproc_run(&p, &img, &o) == LOOM_OK, "%s", loom_last_error());
        int64_t px = (int64_t)o.plan.resized_w * o.plan.resized_h;
        printf("  %s: 7200x7000 -> %dx%d, %d tokens\n", dirs[d], o.plan.resized_w,
               o.plan.resized_h, o.plan.n_tokens);
        if (p.kind == LOOM_IMGPROC_QWEN2VL)
            CHECKF(px <= p.max_pixels && px >= p.min_pixels, "%lld pixels", (long long)px);
        else
            CHECK(o.plan.resized_w == p.width && o.plan.resized_h == p.height);
        loom_imgproc_out_free(&o);
    }
    loom_image_free(&img);
    /* the header alone: 100000 x 100000 RGB, no pixel data */
    static const uint8_t hdr[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13,
                                  'I', 'H', 'D', 'R', 0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0,
                                  8, 2, 0, 0, 0, 0, 0, 0, 0};
    FILE *f = fopen(claim, "wb");
    CHECK(f && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr);
    if (f) fclose(f);
    CHECK(loom_image_load(claim, &img) == LOOM_ERR_UNSUPPORTED && !img.rgb);
    CHECKF(strstr(loom_last_error(), "100000x100000") != NULL, "%s", loom_last_error());
    loom_imgproc p;
    loom_imgproc_plan plan;
    CHECK(loom_imgproc_parse("{\"image_processor_type\": \"Qwen2VLImageProcessor\", "
                             "\"patch_size\": 14, \"merge_size\": 2, \"temporal_patch_size\": 2, "
                             "\"max_pixels\": 12845056}", NULL, &p) == LOOM_OK);
    CHECKF(loom_imgproc_plan_image(&p, 100000, 100000, &plan) == LOOM_OK, "%s", loom_last_error());
    CHECK((int64_t)plan.resized_w * plan.resized_h <= 12845056);
    remove(big);
    remove(claim);
    rmdir(dir);
}

int main(void) {
    check_mrope_config();
    check_rope_streams();
    check_model("tests/fixtures/models/qwen3-vl-tiny", 1, 1e-5);
    /* the reference computes the delta rule in float32 (loom lands at ~1e-5) */
    check_model("tests/fixtures/models/qwen3.5-vl-tiny-hybrid", 0, 2e-5);
    check_model("tests/fixtures/models/qwen2.5-vl-tiny", 0, 1e-5);
    check_model("tests/fixtures/models/gemma3-vl-tiny", 0, 1e-5);
    check_huge_images();
    check_flops();
    return test_report("test_vision");
}
