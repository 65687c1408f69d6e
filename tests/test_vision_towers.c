/* The vision towers against the Hugging Face reference fixtures: from each
 * case's preprocessed pixel values to its image embeddings (the rows that
 * replace the image tokens' embeddings), and the intermediates the
 * fixtures keep. The reference is float64 math; the towers run in f32. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "model/model.h"
#include "ops/ops.h"
#include "ops/threadpool.h"
#include "test.h"
#include "vision/qwen25_vit.h"
#include "vision/siglip.h"

/* max |err| / max |ref| the towers must reach (f32 against float64) */
#define TOL 1e-6

#define QWEN_DIR "tests/fixtures/models/qwen2.5-vl-tiny"
#define GEMMA_DIR "tests/fixtures/models/gemma3-vl-tiny"

/* What the towers read of a model: its tensors, pool and kernels. */
typedef struct shell {
    loom_model m;
    cJSON *cfg;
    loom_safetensors *ref;
    int text_hidden;
} shell;

static int shell_open(shell *s, const char *dir, int threads) {
    memset(s, 0, sizeof *s);
    char path[256], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (loom_read_file(path, &text, &len)) return 0;
    s->cfg = cJSON_Parse(text);
    free(text);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(s->cfg, "text_config");
    s->text_hidden = cJSON_GetObjectItemCaseSensitive(tc, "hidden_size")->valueint;
    s->m.k = loom_kernels_get();
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    return loom_st_open_dir(dir, &s->m.st) == LOOM_OK && loom_pool_create(threads, &s->m.pool) ==
           LOOM_OK && loom_st_open(path, &s->ref) == LOOM_OK;
}

static void shell_close(shell *s) {
    loom_st_close(s->m.st);
    loom_st_close(s->ref);
    loom_pool_free(s->m.pool);
    cJSON_Delete(s->cfg);
}

static const loom_st_tensor *ref_t(const shell *s, const char *fmt, int i) {
    char name[96];
    snprintf(name, sizeof name, fmt, i);
    return loom_st_find(s->ref, name);
}

static size_t numel(const loom_st_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static double report(const char *what, int i, const float *got, const loom_st_tensor *ref,
                     double *worst) {
    double e = test_rel_err(got, ref->data, numel(ref));
    fprintf(stderr, "  %s case %d: max err / max |ref| = %.3g\n", what, i, e);
    *worst = test_max(*worst, e);
    CHECKF(e < TOL, "%s case %d: %g", what, i, e);
    return e;
}

static void qwen_cases(int threads) {
    shell s;
    CHECK(shell_open(&s, QWEN_DIR, threads));
    loom_qwen25_vit *v = NULL;
    loom_status st = loom_qwen25_vit_load(&s.m, s.cfg, s.text_hidden, &v);
    CHECKF(st == LOOM_OK, "%s", loom_last_error());
    if (!v) goto out;
    CHECK_EQ_INT(loom_qwen25_vit_patch_dim(v), 3 * 2 * 14 * 14);
    double worst = 0;
    for (int i = 1; i <= 3; i++) {
        const loom_st_tensor *px = ref_t(&s, "case.%d.pixel_values", i);
        const loom_st_tensor *gt = ref_t(&s, "case.%d.image_grid_thw", i);
        const loom_st_tensor *emb = ref_t(&s, "case.%d.image_embeds", i);
        CHECK(px && gt && emb && gt->dtype == LOOM_DT_I64);
        if (!px || !gt || !emb) continue;
        int n_img = (int)gt->shape[0], grids[3 * 8], tokens = 0;
        for (int k = 0; k < 3 * n_img; k++) grids[k] = (int)((const int64_t *)gt->data)[k];
        for (int k = 0; k < n_img; k++) tokens += loom_qwen25_vit_tokens(v, grids + 3 * k);
        CHECK_EQ_INT(tokens, emb->shape[0]);
        CHECK_EQ_INT(px->shape[1], loom_qwen25_vit_patch_dim(v));
        float *out = calloc(numel(emb), sizeof(float));
        size_t N = (size_t)px->shape[0];
        float *pe = calloc(N * 32, sizeof(float)), *mi = calloc(N * 32, sizeof(float));
        loom_qwen25_vit_taps taps = {.patch_embed = pe, .merger_in = mi};
        st = loom_qwen25_vit_encode(v, px->data, grids, n_img, out, &taps);
        CHECKF(st == LOOM_OK, "%s", loom_last_error());
        report("qwen2.5-vl image_embeds", i, out, emb, &worst);
        const loom_st_tensor *r_pe = ref_t(&s, "case.%d.vision.patch_embed_out", i);
        const loom_st_tensor *r_mi = ref_t(&s, "case.%d.vision.merger_in", i);
        if (r_pe) report("qwen2.5-vl patch_embed_out", i, pe, r_pe, &worst);
        if (r_mi) report("qwen2.5-vl merger_in", i, mi, r_mi, &worst);
        free(out);
        free(pe);
        free(mi);
    }
    fprintf(stderr, "  qwen2.5-vl worst (%d threads): %.3g\n", threads, worst);
    /* a grid the merge does not divide is refused */
    int bad[3] = {1, 3, 4};
    CHECK_EQ_INT(loom_qwen25_vit_tokens(v, bad), 0);
    float dummy[1];
    CHECK(loom_qwen25_vit_encode(v, dummy, bad, 1, dummy, NULL) == LOOM_ERR_INVALID_ARG);
out:
    loom_qwen25_vit_free(v);
    shell_close(&s);
}

static void gemma_cases(int threads) {
    shell s;
    CHECK(shell_open(&s, GEMMA_DIR, threads));
    loom_siglip *v = NULL;
    loom_status st = loom_siglip_load(&s.m, s.cfg, s.text_hidden, &v);
    CHECKF(st == LOOM_OK, "%s", loom_last_error());
    if (!v) goto out;
    CHECK_EQ_INT(loom_siglip_image_size(v), 112);
    CHECK_EQ_INT(loom_siglip_tokens(v), 16);
    double worst = 0;
    for (int i = 1; i <= 3; i++) {
        const loom_st_tensor *px = ref_t(&s, "case.%d.pixel_values", i);
        const loom_st_tensor *emb = ref_t(&s, "case.%d.image_embeds", i);
        CHECK(px && emb);
        if (!px || !emb) continue;
        int n_img = (int)px->shape[0];
        CHECK_EQ_INT(n_img * loom_siglip_tokens(v), emb->shape[0]);
        float *out = calloc(numel(emb), sizeof(float));
        st = loom_siglip_encode(v, px->data, n_img, out, NULL);
        CHECKF(st == LOOM_OK, "%s", loom_last_error());
        report("gemma3-vl image_embeds", i, out, emb, &worst);
        free(out);
    }
    fprintf(stderr, "  gemma3-vl worst (%d threads): %.3g\n", threads, worst);
out:
    loom_siglip_free(v);
    shell_close(&s);
}

/* m's tensors written again under other names: each name starting with
 * from[i] gets to[i] in its place. Returns the reopened file, or NULL. */
static loom_safetensors *renamed(const loom_safetensors *st, const char *const *from,
                                 const char *const *to, int n_pre, char *path, size_t n) {
    char dir[] = "/tmp/loom_vit_XXXXXX";
    if (!mkdtemp(dir)) return NULL;
    snprintf(path, n, "%s/model.safetensors", dir);
    int cnt = loom_st_count(st);
    loom_st_write_entry *e = calloc((size_t)cnt, sizeof *e);
    char (*names)[160] = calloc((size_t)cnt, sizeof *names);
    for (int i = 0; i < cnt; i++) {
        const loom_st_tensor *t = loom_st_at(st, i);
        snprintf(names[i], sizeof names[i], "%s", t->name);
        for (int k = 0; k < n_pre; k++)
            if (!strncmp(t->name, from[k], strlen(from[k]))) {
                snprintf(names[i], sizeof names[i], "%s%s", to[k], t->name + strlen(from[k]));
                break;
            }
        e[i] = (loom_st_write_entry){.name = names[i], .dtype = t->dtype, .ndim = t->ndim,
                                     .data = t->data};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
    }
    loom_safetensors *out = NULL;
    if (loom_st_write(path, e, cnt) != LOOM_OK || loom_st_open(path, &out) != LOOM_OK) out = NULL;
    free(e);
    free(names);
    return out;
}

static void remove_file(const char *path) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    remove(path);
    rmdir(dir);
}

/* Both towers bind the other spellings of their names (newer
 * checkpoints nest them under model., hub Gemma 3 under vision_model.)
 * and give the same bits from them. */
static void key_spellings(void) {
    shell s;
    CHECK(shell_open(&s, QWEN_DIR, 1));
    const char *qf[] = {"visual."}, *qt[] = {"model.visual."};
    char path[300];
    loom_safetensors *alt = renamed(s.m.st, qf, qt, 1, path, sizeof path);
    CHECK(alt && !loom_st_find(alt, "visual.merger.ln_q.weight"));
    const loom_st_tensor *px = ref_t(&s, "case.%d.pixel_values", 1);
    int grid[3] = {1, 4, 4};
    float a[4 * 64], b[4 * 64];
    loom_qwen25_vit *v = NULL;
    CHECK(loom_qwen25_vit_load(&s.m, s.cfg, s.text_hidden, &v) == LOOM_OK);
    if (v) CHECK(loom_qwen25_vit_encode(v, px->data, grid, 1, a, NULL) == LOOM_OK);
    loom_qwen25_vit_free(v);
    v = NULL;
    loom_safetensors *orig = s.m.st;
    s.m.st = alt;
    CHECKF(alt && loom_qwen25_vit_load(&s.m, s.cfg, s.text_hidden, &v) == LOOM_OK, "%s",
           loom_last_error());
    if (v) CHECK(loom_qwen25_vit_encode(v, px->data, grid, 1, b, NULL) == LOOM_OK);
    if (v) CHECK(!memcmp(a, b, sizeof a));
    loom_qwen25_vit_free(v);
    s.m.st = orig;
    loom_st_close(alt);
    remove_file(path);
    shell_close(&s);

    CHECK(shell_open(&s, GEMMA_DIR, 1));
    const char *gf[] = {"vision_tower.", "multi_modal_projector."};
    const char *gt[] = {"model.vision_tower.vision_model.", "model.multi_modal_projector."};
    alt = renamed(s.m.st, gf, gt, 2, path, sizeof path);
    CHECK(alt && loom_st_find(alt, "model.vision_tower.vision_model.post_layernorm.weight"));
    px = ref_t(&s, "case.%d.pixel_values", 1);
    float c[16 * 64], d[16 * 64];
    loom_siglip *g = NULL;
    CHECK(loom_siglip_load(&s.m, s.cfg, s.text_hidden, &g) == LOOM_OK);
    if (g) CHECK(loom_siglip_encode(g, px->data, 1, c, NULL) == LOOM_OK);
    loom_siglip_free(g);
    g = NULL;
    orig = s.m.st;
    s.m.st = alt;
    CHECKF(alt && loom_siglip_load(&s.m, s.cfg, s.text_hidden, &g) == LOOM_OK, "%s",
           loom_last_error());
    if (g) CHECK(loom_siglip_encode(g, px->data, 1, d, NULL) == LOOM_OK);
    if (g) CHECK(!memcmp(c, d, sizeof c));
    loom_siglip_free(g);
    s.m.st = orig;
    loom_st_close(alt);
    remove_file(path);
    shell_close(&s);
}

/* A missing tensor is named in the error. */
static void missing_tensor(void) {
    shell s;
    CHECK(shell_open(&s, GEMMA_DIR, 1));
    const char *gf[] = {"vision_tower.post_layernorm.bias"}, *gt[] = {"unused."};
    char path[300];
    loom_safetensors *alt = renamed(s.m.st, gf, gt, 1, path, sizeof path), *orig = s.m.st;
    s.m.st = alt;
    loom_siglip *g = NULL;
    CHECK(alt && loom_siglip_load(&s.m, s.cfg, s.text_hidden, &g) == LOOM_ERR_FORMAT && !g);
    CHECKF(strstr(loom_last_error(), "vision_tower.post_layernorm.bias: missing"), "%s",
           loom_last_error());
    s.m.st = orig;
    loom_st_close(alt);
    remove_file(path);
    shell_close(&s);
}

int main(void) {
    qwen_cases(1);
    qwen_cases(3);
    gemma_cases(1);
    gemma_cases(3);
    key_spellings();
    missing_tensor();
    return test_report("test_vision_towers");
}
