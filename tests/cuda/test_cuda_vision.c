/* Images with the language model on CUDA device 0: the vision tower runs
 * on the CPU, the prompt's prepared rows (image features spliced into the
 * embeddings, M-RoPE positions, Qwen3-VL's deepstack, bidirectional
 * spans) and the decode rows
 * turned by the rope delta run on the device. For every case of the
 * Qwen2.5-VL, Qwen3-VL, Qwen3.5-VL and Gemma 3 fixtures (the processor's
 * pixel_values from the reference; Gemma 3's image tokens attend to each
 * other both ways): the greedy tokens of the reference, alone and with all
 * four cases batched in chunks, and the first token's log-probability
 * against the reference logits.
 * Needs a GPU; run through tools/cuda_check.sh. */
#include <stdint.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "../test.h"

#define NG 8
#define NCASE 4

typedef struct vcase {
    int32_t ids[512];
    int n;
    loom_request_image img[4];
    int n_img;
    int32_t greedy[NG];
    double lp0;            /* the reference's log-probability of greedy[0] */
} vcase;

typedef struct result {
    int32_t tok[NG];
    float lp[NG];
    int n;
    loom_finish fin;
    char err[256];
} result;

static const loom_st_tensor *find(const loom_safetensors *ref, int c, const char *what) {
    char k[64];
    snprintf(k, sizeof k, "case.%d.%s", c, what);
    return loom_st_find(ref, k);
}

/* Element i of an integer tensor (the reference stores I64). */
static int64_t int_at(const loom_st_tensor *t, size_t i) {
    return t->dtype == LOOM_DT_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

/* Case c of the reference: prompt, images (pixel rows split by their
 * grids), greedy tokens and the first one's log-probability. */
static int load_case(const loom_safetensors *ref, int c, vcase *v) {
    memset(v, 0, sizeof *v);
    const loom_st_tensor *ids = find(ref, c, "input_ids"), *gr = find(ref, c, "greedy");
    const loom_st_tensor *lg = find(ref, c, "logits");
    if (!ids || !gr || !lg) return 0;
    v->n = (int)ids->shape[ids->ndim - 1];
    if (v->n > (int)LOOM_ARRAY_LEN(v->ids)) return 0;
    for (int i = 0; i < v->n; i++) v->ids[i] = (int32_t)int_at(ids, (size_t)i);
    for (int i = 0; i < NG; i++) v->greedy[i] = (int32_t)int_at(gr, (size_t)i);
    int V = (int)lg->shape[lg->ndim - 1];
    const float *last = (const float *)lg->data + (size_t)(v->n - 1) * V;
    double mx = last[0], sum = 0;
    for (int j = 1; j < V; j++) mx = test_max(mx, last[j]);
    for (int j = 0; j < V; j++) sum += exp(last[j] - mx);
    v->lp0 = last[v->greedy[0]] - mx - log(sum);
    const loom_st_tensor *px = find(ref, c, "pixel_values"), *grid = find(ref, c, "image_grid_thw");
    if (!px) return 1;
    /* patches with a grid per image (Qwen), or whole images (Gemma 3's
     * (n, 3, h, w): one row each, grid 1x1x1) */
    v->n_img = grid ? (int)grid->shape[0] : (int)px->shape[0];
    const float *p = px->data;
    size_t dim = 1;
    for (int d = 1; d < px->ndim; d++) dim *= (size_t)px->shape[d];
    for (int i = 0; i < v->n_img && i < 4; i++) {
        int g[3] = {1, 1, 1};
        for (int d = 0; grid && d < 3; d++) g[d] = (int)int_at(grid, (size_t)(3 * i + d));
        v->img[i] = (loom_request_image){.pixels = p, .grid = {g[0], g[1], g[2]},
                                         .hash = 0x9e3779b97f4a7c15ull * (uint64_t)(16 * c + i + 1)};
        p += (size_t)g[0] * g[1] * g[2] * dim;
    }
    return 1;
}

static loom_engine *engine(loom_model *m, const char *dir, int budget) {
    loom_engine_params ep = loom_engine_default_params();
    ep.max_batch_tokens = budget;
    ep.max_seqs = 8;
    ep.n_ctx = 256;
    ep.model_dir = dir;
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(m, &ep, &e) == LOOM_OK, "%s", loom_last_error());
    return e;
}

static loom_request *submit(loom_engine *e, const vcase *v) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = v->ids;
    rp.n_prompt = v->n;
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.logprobs = 0;
    rp.images = v->n_img ? v->img : NULL;
    rp.n_images = v->n_img;
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    return r;
}

static void drain(loom_request *r, result *out) {
    memset(out, 0, sizeof *out);
    out->fin = LOOM_FINISH_ERROR;
    for (loom_event ev; r && loom_request_next(r, &ev, 60000) == LOOM_OK;) {
        if (ev.finish != LOOM_FINISH_NONE) {
            out->fin = ev.finish;
            snprintf(out->err, sizeof out->err, "%s", loom_request_error(r));
            break;
        }
        if (out->n >= NG) break;
        out->tok[out->n] = ev.token;
        out->lp[out->n++] = ev.logprob;
    }
    loom_request_free(r);
}

static void check_result(const char *name, const char *how, int c, const vcase *v,
                         const result *got) {
    int same = got->fin == LOOM_FINISH_LENGTH && got->n == NG &&
               !memcmp(got->tok, v->greedy, sizeof v->greedy);
    CHECKF(same, "%s case %d %s: finish %d, %d tokens (%d %d %d ..., want %d %d %d ...) %s",
           name, c, how, got->fin, got->n, got->tok[0], got->tok[1], got->tok[2], v->greedy[0],
           v->greedy[1], v->greedy[2], got->err);
    if (got->n > 0)
        CHECKF(fabs(got->lp[0] - v->lp0) < 2e-3, "%s case %d %s: first log-probability %.6f, "
               "reference %.6f", name, c, how, got->lp[0], v->lp0);
}

static void check_model(const char *name) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    loom_model *m = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.device = 0;
    if (loom_st_open(path, &ref) || loom_model_load(dir, &mp, &m)) {
        fprintf(stderr, "%s: %s\n", name, loom_last_error());
        CHECK(0);
        loom_st_close(ref);
        return;
    }
    vcase v[NCASE];
    int nc = 0;
    while (nc < NCASE && load_case(ref, nc, &v[nc])) nc++;
    CHECKF(nc == NCASE, "%s: %d cases in the reference", name, nc);
    int images = 0;
    for (int c = 0; c < nc; c++) images += v[c].n_img;
    CHECKF(images >= 2, "%s: %d images in the cases", name, images);
    /* each case alone, its prompt in one row */
    for (int c = 0; c < nc; c++) {
        loom_engine *e = engine(m, dir, 2048);
        if (!e) break;
        result got;
        drain(submit(e, &v[c]), &got);
        check_result(name, "alone", c, &v[c], &got);
        loom_engine_free(e);
    }
    /* all together, prompts in chunks of a 48-token budget (image runs
     * whole in a chunk), decode rows batched with prompt rows */
    loom_engine *e = engine(m, dir, 48);
    if (e) {
        loom_request *r[NCASE];
        for (int c = 0; c < nc; c++) r[c] = submit(e, &v[c]);
        for (int c = 0; c < nc; c++) {
            result got;
            drain(r[c], &got);
            check_result(name, "batched", c, &v[c], &got);
        }
        loom_engine_free(e);
    }
    loom_model_free(m);
    loom_st_close(ref);
}

int main(void) {
    check_model("qwen2.5-vl-tiny");
    check_model("qwen3-vl-tiny");
    check_model("qwen3.5-vl-tiny-hybrid");
    check_model("gemma3-vl-tiny");
    return test_report("test_cuda_vision");
}
