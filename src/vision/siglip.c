/* siglip: the SigLIP tower and Gemma 3's projector (siglip.h). */
#include "vision/siglip.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/matmul.h"
#include "vision/vision_int.h"
#include "vision/vit.h"

typedef struct sg_layer {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;   /* (dim) */
    loom_weight wq, wk, wv, wo;                    /* (dim, dim) */
    const float *bq, *bk, *bv, *bo;                /* (dim) */
    loom_weight fc1;                               /* (inter, dim) */
    const float *fc1_b;                            /* (inter) */
    loom_weight fc2;                               /* (dim, inter) */
    const float *fc2_b;                            /* (dim) */
} sg_layer;

struct loom_siglip {
    loom_model *m;                  /* borrowed: tensors, pool, kernels */
    int n_layers, dim, inter, heads, hd, ch, image, patch;
    int side;                       /* patches a side: image / patch */
    int n_patch;                    /* side^2 */
    int tok_side, pool_k;           /* tokens a side, pooled patches a side per token */
    int out_dim;
    float eps;
    loom_vit_act act;
    loom_weight patch_embed;        /* (dim, ch * patch * patch) */
    const float *patch_b;           /* (dim) */
    const float *pos;               /* (n_patch, dim) */
    sg_layer *layers;               /* owned [n_layers] */
    const float *post_w, *post_b;   /* (dim) */
    const float *soft_norm;         /* (dim): 1 + w */
    loom_weight proj;               /* (out_dim, dim), owned f32 (the file holds its transpose) */
    loom_vit_mem mem;
};

static loom_status parse_config(loom_siglip *v, const cJSON *root, const cJSON *vc) {
    const char *w = "vision_config";
    loom_status s;
    double eps;
    int mm;
    if ((s = loom_vit_int(vc, w, "num_hidden_layers", 27, 1, 1024, &v->n_layers)) ||
        (s = loom_vit_int(vc, w, "hidden_size", 1152, 1, 1 << 16, &v->dim)) ||
        (s = loom_vit_int(vc, w, "intermediate_size", 4304, 1, 1 << 20, &v->inter)) ||
        (s = loom_vit_int(vc, w, "num_attention_heads", 16, 1, 1024, &v->heads)) ||
        (s = loom_vit_int(vc, w, "num_channels", 3, 1, 64, &v->ch)) ||
        (s = loom_vit_int(vc, w, "image_size", 896, 1, 1 << 14, &v->image)) ||
        (s = loom_vit_int(vc, w, "patch_size", 14, 1, 1024, &v->patch)) ||
        (s = loom_vit_num(vc, w, "layer_norm_eps", 1e-6, &eps)) ||
        (s = loom_vit_int(root, "", "mm_tokens_per_image", 256, 1, 1 << 20, &mm)))
        return s;
    v->eps = (float)eps;
    if (v->dim % v->heads)
        return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.hidden_size %d is not a "
                        "multiple of num_attention_heads %d", v->dim, v->heads);
    v->hd = v->dim / v->heads;
    if (v->image % v->patch)
        return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.image_size %d is not a "
                        "multiple of patch_size %d", v->image, v->patch);
    v->side = v->image / v->patch;
    v->n_patch = v->side * v->side;
    v->tok_side = (int)lround(sqrt((double)mm));
    if (v->tok_side * v->tok_side != mm || v->side % v->tok_side)
        return loom_err(LOOM_ERR_FORMAT, "config.json: mm_tokens_per_image %d must be the square "
                        "of a divisor of the %d patches a side", mm, v->side);
    v->pool_k = v->side / v->tok_side;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    return loom_vit_act_parse(cJSON_IsString(act) ? act->valuestring : "gelu_pytorch_tanh",
                              &v->act);
}

static loom_status bind_layer(loom_siglip *v, const char *pre, int i, sg_layer *l) {
    const loom_safetensors *st = v->m->st;
    loom_vit_mem *mem = &v->mem;
    char p[128];
    snprintf(p, sizeof p, "%sencoder.layers.%d.", pre, i);
    size_t d = (size_t)v->dim;
    int D = v->dim, I = v->inter;
    loom_status s;
    if ((s = loom_vit_vec(st, mem, p, "layer_norm1.weight", d, 0, &l->ln1_w)) ||
        (s = loom_vit_vec(st, mem, p, "layer_norm1.bias", d, 0, &l->ln1_b)) ||
        (s = loom_vit_vec(st, mem, p, "layer_norm2.weight", d, 0, &l->ln2_w)) ||
        (s = loom_vit_vec(st, mem, p, "layer_norm2.bias", d, 0, &l->ln2_b)) ||
        (s = loom_vit_weight(st, p, "self_attn.q_proj.weight", D, D, &l->wq)) ||
        (s = loom_vit_weight(st, p, "self_attn.k_proj.weight", D, D, &l->wk)) ||
        (s = loom_vit_weight(st, p, "self_attn.v_proj.weight", D, D, &l->wv)) ||
        (s = loom_vit_weight(st, p, "self_attn.out_proj.weight", D, D, &l->wo)) ||
        (s = loom_vit_vec(st, mem, p, "self_attn.q_proj.bias", d, 0, &l->bq)) ||
        (s = loom_vit_vec(st, mem, p, "self_attn.k_proj.bias", d, 0, &l->bk)) ||
        (s = loom_vit_vec(st, mem, p, "self_attn.v_proj.bias", d, 0, &l->bv)) ||
        (s = loom_vit_vec(st, mem, p, "self_attn.out_proj.bias", d, 0, &l->bo)) ||
        (s = loom_vit_weight(st, p, "mlp.fc1.weight", I, D, &l->fc1)) ||
        (s = loom_vit_vec(st, mem, p, "mlp.fc1.bias", (size_t)I, 0, &l->fc1_b)) ||
        (s = loom_vit_weight(st, p, "mlp.fc2.weight", D, I, &l->fc2)) ||
        (s = loom_vit_vec(st, mem, p, "mlp.fc2.bias", d, 0, &l->fc2_b)))
        return s;
    return LOOM_OK;
}

/* The projector: its soft-token norm as 1 + w, and its weight, stored
 * (dim, out_dim) for x @ W, transposed into an owned f32 (out_dim, dim). */
static loom_status bind_projector(loom_siglip *v) {
    static const char *const pres[] = {"multi_modal_projector.", "model.multi_modal_projector."};
    const loom_safetensors *st = v->m->st;
    const char *pre = loom_vit_prefix(st, pres, LOOM_ARRAY_LEN(pres), "mm_input_projection_weight");
    if (!pre)
        return loom_err(LOOM_ERR_FORMAT, "tensor multi_modal_projector.mm_input_projection_weight:"
                        " missing (nor under model.)");
    loom_weight w;
    loom_status s = loom_vit_weight(st, pre, "mm_input_projection_weight", v->dim, v->out_dim, &w);
    if (s) return s;
    const float *nw;
    if ((s = loom_vit_vec(st, &v->mem, pre, "mm_soft_emb_norm.weight", (size_t)v->dim, 0, &nw)))
        return s;
    float *n1 = loom_vit_alloc(&v->mem, (size_t)v->dim);
    float *t = loom_vit_alloc(&v->mem, (size_t)v->dim * v->out_dim);
    float *row = loom_vit_alloc(&v->mem, (size_t)v->out_dim);
    if (!n1 || !t || !row) return LOOM_ERR_NOMEM;
    for (int i = 0; i < v->dim; i++) n1[i] = 1.0f + nw[i];
    for (int i = 0; i < v->dim; i++) {
        loom_fwd_weight_row(v->m, &w, row, i);
        for (int j = 0; j < v->out_dim; j++) t[(size_t)j * v->dim + i] = row[j];
    }
    v->soft_norm = n1;
    v->proj = (loom_weight){.dtype = LOOM_DT_F32, .rows = v->out_dim, .cols = v->dim, .data = t};
    return LOOM_OK;
}

static loom_status bind_all(loom_siglip *v) {
    static const char *const pres[] = {"vision_tower.vision_model.", "vision_tower.",
                                       "model.vision_tower.vision_model.", "model.vision_tower."};
    const loom_safetensors *st = v->m->st;
    const char *pre = loom_vit_prefix(st, pres, LOOM_ARRAY_LEN(pres),
                                  "embeddings.patch_embedding.weight");
    if (!pre)
        return loom_err(LOOM_ERR_FORMAT, "tensor vision_tower.vision_model.embeddings."
                        "patch_embedding.weight: missing (nor without vision_model., nor under "
                        "model.)");
    const loom_safetensors *s_ = st;
    loom_status s;
    if ((s = loom_vit_weight(s_, pre, "embeddings.patch_embedding.weight", v->dim,
                             v->ch * v->patch * v->patch, &v->patch_embed)) ||
        (s = loom_vit_vec(s_, &v->mem, pre, "embeddings.patch_embedding.bias", (size_t)v->dim, 0,
                          &v->patch_b)) ||
        (s = loom_vit_vec(s_, &v->mem, pre, "embeddings.position_embedding.weight",
                          (size_t)v->n_patch * v->dim, 0, &v->pos)) ||
        (s = loom_vit_vec(s_, &v->mem, pre, "post_layernorm.weight", (size_t)v->dim, 0,
                          &v->post_w)) ||
        (s = loom_vit_vec(s_, &v->mem, pre, "post_layernorm.bias", (size_t)v->dim, 0,
                          &v->post_b)))
        return s;
    v->layers = calloc((size_t)v->n_layers, sizeof *v->layers);
    if (!v->layers) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < v->n_layers; i++)
        if ((s = bind_layer(v, pre, i, &v->layers[i]))) return s;
    return bind_projector(v);
}

loom_status loom_siglip_load(loom_model *m, const cJSON *root, int out_dim, loom_siglip **out) {
    *out = NULL;
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    if (!cJSON_IsObject(vc))
        return loom_err(LOOM_ERR_FORMAT, "config.json: missing \"vision_config\" (a Gemma 3 "
                        "vision checkpoint has one)");
    loom_siglip *v = calloc(1, sizeof *v);
    if (!v) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    v->m = m;
    v->out_dim = out_dim;
    loom_status s = parse_config(v, root, vc);
    if (!s) s = bind_all(v);
    if (s) {
        loom_siglip_free(v);
        return s;
    }
    *out = v;
    return LOOM_OK;
}

void loom_siglip_free(loom_siglip *v) {
    if (!v) return;
    loom_vit_mem_free(&v->mem);
    free(v->layers);
    free(v);
}

int loom_siglip_image_size(const loom_siglip *v) { return v->image; }
int loom_siglip_tokens(const loom_siglip *v) { return v->tok_side * v->tok_side; }

/* Patch rows (n * n_patch, ch * P * P) in the convolution's (c, y, x)
 * order, patches row-major. */
static void gather_patches(const loom_siglip *v, const float *px, int n, float *dst) {
    int P = v->patch, S = v->image, pd = v->ch * P * P;
    for (int im = 0; im < n; im++)
        for (int py = 0; py < v->side; py++)
            for (int pxi = 0; pxi < v->side; pxi++) {
                float *r = dst + ((size_t)im * v->n_patch + (size_t)py * v->side + pxi) * pd;
                for (int c = 0; c < v->ch; c++)
                    for (int y = 0; y < P; y++)
                        memcpy(r + ((size_t)c * P + y) * P,
                               px + (((size_t)im * v->ch + c) * S + (size_t)py * P + y) * S +
                                   (size_t)pxi * P,
                               (size_t)P * sizeof(float));
            }
}

static loom_status run_layer(loom_siglip *v, const sg_layer *l, float *x, float *xn, float *q,
                             float *k, float *vv, float *att, float *hb, int T, const int *cu,
                             int n_seg) {
    loom_model *m = v->m;
    int d = v->dim;
    size_t Td = (size_t)T * d;
    loom_vit_layernorm(xn, x, l->ln1_w, l->ln1_b, T, d, v->eps);
    loom_vit_linear(m, q, xn, &l->wq, l->bq, T);
    loom_vit_linear(m, k, xn, &l->wk, l->bk, T);
    loom_vit_linear(m, vv, xn, &l->wv, l->bv, T);
    loom_status s = loom_vit_attention(m, att, q, k, vv, d, v->heads, v->hd, cu, n_seg,
                                       (float)(1.0 / sqrt((double)v->hd)));
    if (s) return s;
    loom_vit_linear(m, xn, att, &l->wo, l->bo, T);
    for (size_t i = 0; i < Td; i++) x[i] += xn[i];
    loom_vit_layernorm(xn, x, l->ln2_w, l->ln2_b, T, d, v->eps);
    loom_vit_linear(m, hb, xn, &l->fc1, l->fc1_b, T);
    loom_vit_act_apply(hb, (size_t)T * v->inter, v->act);
    loom_vit_linear(m, xn, hb, &l->fc2, l->fc2_b, T);
    for (size_t i = 0; i < Td; i++) x[i] += xn[i];
    return LOOM_OK;
}

/* Average pool of each image's patch grid (side x side) to tok_side x
 * tok_side tokens, row-major, into dst (n * tokens, dim). */
static void avg_pool(const loom_siglip *v, const float *x, int n, float *dst) {
    int d = v->dim, K = v->pool_k, ts = v->tok_side;
    for (int im = 0; im < n; im++)
        for (int ty = 0; ty < ts; ty++)
            for (int tx = 0; tx < ts; tx++) {
                float *o = dst + ((size_t)im * ts * ts + (size_t)ty * ts + tx) * d;
                for (int c = 0; c < d; c++) {
                    double sum = 0;
                    for (int a = 0; a < K; a++)
                        for (int b = 0; b < K; b++)
                            sum += x[((size_t)im * v->n_patch +
                                      (size_t)(ty * K + a) * v->side + (size_t)(tx * K + b)) *
                                         d + c];
                    o[c] = (float)(sum / (K * K));
                }
            }
}

loom_status loom_siglip_encode(loom_siglip *v, const float *pixels, int n_images, float *out,
                               const loom_siglip_taps *taps) {
    if (n_images <= 0) return LOOM_OK;
    if ((long long)n_images * v->n_patch > (1 << 24))
        return loom_err(LOOM_ERR_INVALID_ARG, "images: more than %d patches", 1 << 24);
    int T = n_images * v->n_patch, d = v->dim, pd = v->ch * v->patch * v->patch;
    size_t Td = (size_t)T * d;
    int ntok = n_images * loom_siglip_tokens(v);
    float *pat = loom_alloc_raw((size_t)T * pd * 4), *x = loom_alloc_raw(Td * 4);
    float *xn = loom_alloc_raw(Td * 4), *q = loom_alloc_raw(Td * 4), *k = loom_alloc_raw(Td * 4);
    float *vv = loom_alloc_raw(Td * 4), *att = loom_alloc_raw(Td * 4);
    float *hb = loom_alloc_raw((size_t)T * v->inter * 4);
    int *cu = malloc(((size_t)n_images + 1) * sizeof *cu);
    loom_status s = LOOM_OK;
    if (!pat || !x || !xn || !q || !k || !vv || !att || !hb || !cu) {
        s = loom_err(LOOM_ERR_NOMEM, "out of memory (vision tower over %d patches)", T);
        goto out;
    }
    gather_patches(v, pixels, n_images, pat);
    loom_vit_linear(v->m, x, pat, &v->patch_embed, v->patch_b, T);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < d; c++) x[(size_t)t * d + c] += v->pos[(size_t)(t % v->n_patch) * d + c];
    if (taps && taps->embeddings) memcpy(taps->embeddings, x, Td * 4);
    for (int i = 0; i <= n_images; i++) cu[i] = i * v->n_patch;
    for (int i = 0; i < v->n_layers && !s; i++)
        s = run_layer(v, &v->layers[i], x, xn, q, k, vv, att, hb, T, cu, n_images);
    if (s) goto out;
    loom_vit_layernorm(x, x, v->post_w, v->post_b, T, d, v->eps);
    if (taps && taps->post_layernorm) memcpy(taps->post_layernorm, x, Td * 4);
    avg_pool(v, x, n_images, xn);
    loom_vit_rmsnorm(xn, xn, v->soft_norm, ntok, d, v->eps);
    loom_vit_linear(v->m, out, xn, &v->proj, NULL, ntok);
out:
    loom_free(pat); loom_free(x); loom_free(xn); loom_free(q); loom_free(k);
    loom_free(vv); loom_free(att); loom_free(hb);
    free(cu);
    return s;
}

/* ---- its row of the vision family table (vision.c) ---------------------- */

/* An image is one (3, S, S) plane of pixels, grid (1, 1, 1), giving
 * mm_tokens_per_image tokens. */
loom_status loom_siglip_family_load(loom_vision *v, const cJSON *root, const cJSON *vc) {
    (void)vc;
    loom_siglip *t = NULL;
    loom_status s = loom_siglip_load(v->m, root, v->m->cfg.hidden_size, &t);
    if (s) return s;
    v->tower = t;
    loom_vision_info *vi = &v->info;
    vi->patch = t->patch;
    vi->temporal_patch = 1;
    vi->in_channels = t->ch;
    vi->patch_dim = t->ch * t->image * t->image;
    vi->merge = 1;
    vi->tokens_per_image = loom_siglip_tokens(t);
    vi->out_hidden = t->out_dim;
    return LOOM_OK;
}

/* The tower's merger input is the post layer norm's output (the projector
 * pools it); there is no tap before the position embeddings. */
loom_status loom_siglip_family_encode(loom_vision *v, const loom_vision_image *img,
                                      float *embeds, float *deep) {
    (void)deep;
    loom_siglip_taps taps = {.post_layernorm = v->tap_merge_in};
    return loom_siglip_encode(v->tower, img->pixels, 1, embeds, &taps);
}

void loom_siglip_family_free(void *tower) { loom_siglip_free(tower); }

double loom_siglip_family_flops(const loom_vision *v, const int grid[3]) {
    (void)grid;
    const loom_siglip *t = v->tower;
    double T = t->n_patch, D = t->dim, I = t->inter, tok = loom_siglip_tokens(t);
    double f = 2 * T * (t->ch * t->patch * t->patch) * D;
    f += t->n_layers * (2 * T * (4 * D * D + 2 * D * I) + 4 * T * T * D);
    return f + 2 * tok * D * t->out_dim;
}
