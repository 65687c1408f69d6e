/* qwen_vit: the vision tower of Qwen3-VL and Qwen3.5:
 *
 *   patches (t*h*w, C*2*P*P) -> patch embed (the Conv3d as one matmul)
 *   + learned position embeddings, bilinearly interpolated from their
 *     square table to the (h, w) grid
 *   -> blocks: x += proj(attn(LN1(x))) with 2-D rotary (rows, columns) over
 *      all patches of a frame in both directions; x += fc2(gelu(fc1(LN2(x))))
 *   -> merger: LN per patch, 2x2 patches concatenated, fc1, GELU, fc2
 *   deepstack (Qwen3-VL): after the blocks in deepstack_visual_indexes,
 *   the same merger shape with the norm after the concatenation.
 *
 * Patches arrive in the processor's order: frame, merge-block row, block
 * column, then the merge x merge patches inside the block, so the merger's
 * groups of merge^2 consecutive patches are its blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/matmul.h"
#include "vision/vision_int.h"
#include "vision/vit.h"

#define VIT_MAX_DEEP 8

typedef struct vit_block {
    const float *n1_w, *n1_b, *n2_w, *n2_b;   /* (D) */
    loom_weight qkv;                          /* (3D, D) */
    const float *qkv_b;                       /* (3D) */
    loom_weight proj;                         /* (D, D) */
    const float *proj_b;
    loom_weight fc1, fc2;                     /* (I, D), (D, I) */
    const float *fc1_b, *fc2_b;
} vit_block;

typedef struct vit_merger {
    int post;                                 /* norm after the concatenation */
    const float *norm_w, *norm_b;             /* (D) or (M^2 D) when post */
    loom_weight fc1, fc2;                     /* (M^2 D, M^2 D), (out, M^2 D) */
    const float *fc1_b, *fc2_b;
} vit_merger;

typedef struct qwen_vit {
    int D, n_heads, hd, inter, depth, grid_side; /* grid_side^2 position embeddings */
    double theta;
    loom_vit_act act;                         /* the blocks' MLP (the mergers' is GELU) */
    loom_weight patch;                        /* (D, patch_dim) */
    const float *patch_b;
    const float *pos_embed;                   /* (grid_side^2, D) */
    vit_block *blocks;                        /* owned [depth] */
    vit_merger merger;
    vit_merger deep[VIT_MAX_DEEP];
    int deep_at[VIT_MAX_DEEP];                /* block after which each plane is taken */
    int n_deep;
    loom_vit_mem mem;                         /* every owned vector */
} qwen_vit;

void loom_qwen_vit_family_free(void *tower) {
    qwen_vit *q = tower;
    if (!q) return;
    loom_vit_mem_free(&q->mem);
    free(q->blocks);
    free(q);
}

static loom_status bind_merger(const loom_safetensors *st, qwen_vit *q, const char *pre, int post,
                               int M2, int out, vit_merger *g) {
    size_t D = (size_t)q->D, W = (size_t)M2 * D;
    loom_status s;
    g->post = post;
    if ((s = loom_vit_vec(st, &q->mem, pre, "norm.weight", post ? W : D, 0, &g->norm_w)) ||
        (s = loom_vit_vec(st, &q->mem, pre, "norm.bias", post ? W : D, 0, &g->norm_b)) ||
        (s = loom_vit_weight(st, pre, "linear_fc1.weight", (int)W, (int)W, &g->fc1)) ||
        (s = loom_vit_vec(st, &q->mem, pre, "linear_fc1.bias", W, 0, &g->fc1_b)) ||
        (s = loom_vit_weight(st, pre, "linear_fc2.weight", out, (int)W, &g->fc2)) ||
        (s = loom_vit_vec(st, &q->mem, pre, "linear_fc2.bias", (size_t)out, 0, &g->fc2_b)))
        return s;
    return LOOM_OK;
}

static loom_status bind_block(const loom_safetensors *st, qwen_vit *q, const char *pre, int l,
                              vit_block *b) {
    char bp[96];
    snprintf(bp, sizeof bp, "%sblocks.%d.", pre, l);
    int D = q->D, I = q->inter;
    loom_vit_mem *mem = &q->mem;
    loom_status s;
    if ((s = loom_vit_vec(st, mem, bp, "norm1.weight", (size_t)D, 0, &b->n1_w)) ||
        (s = loom_vit_vec(st, mem, bp, "norm1.bias", (size_t)D, 0, &b->n1_b)) ||
        (s = loom_vit_vec(st, mem, bp, "norm2.weight", (size_t)D, 0, &b->n2_w)) ||
        (s = loom_vit_vec(st, mem, bp, "norm2.bias", (size_t)D, 0, &b->n2_b)) ||
        (s = loom_vit_weight(st, bp, "attn.qkv.weight", 3 * D, D, &b->qkv)) ||
        (s = loom_vit_vec(st, mem, bp, "attn.qkv.bias", (size_t)3 * D, 0, &b->qkv_b)) ||
        (s = loom_vit_weight(st, bp, "attn.proj.weight", D, D, &b->proj)) ||
        (s = loom_vit_vec(st, mem, bp, "attn.proj.bias", (size_t)D, 0, &b->proj_b)) ||
        (s = loom_vit_weight(st, bp, "mlp.linear_fc1.weight", I, D, &b->fc1)) ||
        (s = loom_vit_vec(st, mem, bp, "mlp.linear_fc1.bias", (size_t)I, 0, &b->fc1_b)) ||
        (s = loom_vit_weight(st, bp, "mlp.linear_fc2.weight", D, I, &b->fc2)) ||
        (s = loom_vit_vec(st, mem, bp, "mlp.linear_fc2.bias", (size_t)D, 0, &b->fc2_b)))
        return s;
    return LOOM_OK;
}

static loom_status parse_config(qwen_vit *q, loom_vision_info *vi, const cJSON *vc, int *n_pos) {
    const char *w = "vision_config";
    loom_status s;
    if ((s = loom_vit_int(vc, w, "hidden_size", 0, 1, 1 << 16, &q->D)) ||
        (s = loom_vit_int(vc, w, "num_heads", 0, 1, 1024, &q->n_heads)) ||
        (s = loom_vit_int(vc, w, "intermediate_size", 0, 1, 1 << 20, &q->inter)) ||
        (s = loom_vit_int(vc, w, "depth", 0, 1, 1024, &q->depth)) ||
        (s = loom_vit_int(vc, w, "num_position_embeddings", 0, 1, 1 << 24, n_pos)) ||
        (s = loom_vit_int(vc, w, "patch_size", 16, 1, 1024, &vi->patch)) ||
        (s = loom_vit_int(vc, w, "temporal_patch_size", 2, 1, 64, &vi->temporal_patch)) ||
        (s = loom_vit_int(vc, w, "in_channels", 3, 1, 64, &vi->in_channels)) ||
        (s = loom_vit_int(vc, w, "spatial_merge_size", 2, 1, 64, &vi->merge)) ||
        (s = loom_vit_int(vc, w, "out_hidden_size", 0, 1, 1 << 20, &vi->out_hidden)))
        return s;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(vc, "rope_parameters");
    if ((s = loom_vit_num(cJSON_IsObject(rp) ? rp : NULL, "vision_config.rope_parameters",
                          "rope_theta", 10000.0, &q->theta)))
        return s;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    if ((s = loom_vit_act_parse(cJSON_IsString(a) ? a->valuestring : "gelu_pytorch_tanh",
                                &q->act)))
        return s;
    q->grid_side = (int)lround(sqrt((double)*n_pos));
    if (!q->D || !q->n_heads || !q->inter || !q->depth || !vi->out_hidden ||
        q->D % q->n_heads || q->grid_side * q->grid_side != *n_pos)
        return loom_err(LOOM_ERR_FORMAT, "vision_config: expected positive hidden_size (a multiple "
                        "of num_heads), intermediate_size, depth, out_hidden_size and a square "
                        "num_position_embeddings");
    q->hd = q->D / q->n_heads;
    if (q->hd % 4)
        return loom_err(LOOM_ERR_FORMAT, "vision_config: head size %d is not a multiple of 4 "
                        "(2-D rotary)", q->hd);
    vi->patch_dim = vi->in_channels * vi->temporal_patch * vi->patch * vi->patch;
    return LOOM_OK;
}

static loom_status bind_all(qwen_vit *q, const loom_safetensors *st, loom_vision_info *vi,
                            const cJSON *vc, int n_pos) {
    static const char *const prefixes[] = {"model.visual.", "visual."};
    const char *pre = loom_vit_prefix(st, prefixes, LOOM_ARRAY_LEN(prefixes),
                                      "patch_embed.proj.weight");
    if (!pre)
        return loom_err(LOOM_ERR_FORMAT, "tensor model.visual.patch_embed.proj.weight: missing "
                        "(nor visual.patch_embed.proj.weight)");
    int D = q->D, M2 = vi->merge * vi->merge;
    loom_status s;
    if ((s = loom_vit_weight(st, pre, "patch_embed.proj.weight", D, vi->patch_dim, &q->patch)) ||
        (s = loom_vit_vec(st, &q->mem, pre, "patch_embed.proj.bias", (size_t)D, 0, &q->patch_b)) ||
        (s = loom_vit_vec(st, &q->mem, pre, "pos_embed.weight", (size_t)n_pos * D, 0,
                          &q->pos_embed)))
        return s;
    q->blocks = calloc((size_t)q->depth, sizeof *q->blocks);
    if (!q->blocks) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < q->depth; l++)
        if ((s = bind_block(st, q, pre, l, &q->blocks[l]))) return s;
    char mp[64];
    snprintf(mp, sizeof mp, "%smerger.", pre);
    if ((s = bind_merger(st, q, mp, 0, M2, vi->out_hidden, &q->merger))) return s;
    const cJSON *di = cJSON_GetObjectItemCaseSensitive(vc, "deepstack_visual_indexes");
    int nd = cJSON_IsArray(di) ? cJSON_GetArraySize(di) : 0;
    if (nd > VIT_MAX_DEEP)
        return loom_err(LOOM_ERR_UNSUPPORTED, "vision_config: %d deepstack_visual_indexes, at "
                        "most %d supported", nd, VIT_MAX_DEEP);
    for (int i = 0; i < nd; i++) {
        const cJSON *x = cJSON_GetArrayItem(di, i);
        if (!cJSON_IsNumber(x) || x->valueint < 0 || x->valueint >= q->depth)
            return loom_err(LOOM_ERR_FORMAT, "vision_config: deepstack_visual_indexes[%d] is not "
                            "a block index below depth %d", i, q->depth);
        q->deep_at[i] = x->valueint;
        snprintf(mp, sizeof mp, "%sdeepstack_merger_list.%d.", pre, i);
        if ((s = bind_merger(st, q, mp, 1, M2, vi->out_hidden, &q->deep[i]))) return s;
    }
    q->n_deep = vi->n_deep = nd;
    return LOOM_OK;
}

loom_status loom_qwen_vit_family_load(loom_vision *v, const cJSON *root, const cJSON *vc) {
    (void)root;
    qwen_vit *q = calloc(1, sizeof *q);
    if (!q) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    v->tower = q;
    int n_pos = 0;
    loom_status s = parse_config(q, &v->info, vc, &n_pos);
    return s ? s : bind_all(q, v->m->st, &v->info, vc, n_pos);
}

/* ---- the pieces ---------------------------------------------------------- */

/* The (row, col) of patch p of a frame with w patches a row: blocks of
 * merge x merge patches, row by row. */
static void patch_rc(int p, int w, int merge, int *row, int *col) {
    int m2 = merge * merge, blk = p / m2, in = p % m2, bw = w / merge;
    *row = blk / bw * merge + in / merge;
    *col = blk % bw * merge + in % merge;
}

/* Coordinate i of n points spread evenly over [0, side - 1], as
 * torch.linspace computes it in float32 (from each end, half way). */
static float lin_at(int i, int n, int side) {
    if (n == 1) return 0;
    float step = (float)(side - 1) / (float)(n - 1);
    return i < n / 2 ? (float)i * step : (float)(side - 1) - (float)(n - 1 - i) * step;
}

/* x (N, D) += the position embeddings of an h x w grid, each bilinear over
 * the four table rows around (row, col) scaled onto the table. */
static void add_pos_embed(const qwen_vit *q, float *x, int t, int h, int w, int merge,
                          float *acc) {
    int G = q->grid_side, D = q->D;
    for (int p = 0; p < h * w; p++) {
        int r, c;
        patch_rc(p, w, merge, &r, &c);
        float hy = lin_at(r, h, G), wx = lin_at(c, w, G);
        int h0 = (int)hy, w0 = (int)wx, h1 = LOOM_MIN(h0 + 1, G - 1), w1 = LOOM_MIN(w0 + 1, G - 1);
        float dh = hy - (float)h0, dw = wx - (float)w0;
        int idx[4] = {h0 * G + w0, h0 * G + w1, h1 * G + w0, h1 * G + w1};
        float wt[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
        memset(acc, 0, sizeof(float) * (size_t)D);
        for (int k = 0; k < 4; k++) {
            const float *row = q->pos_embed + (size_t)idx[k] * D;
            for (int d = 0; d < D; d++) acc[d] += row[d] * wt[k];
        }
        for (int f = 0; f < t; f++)
            for (int d = 0; d < D; d++) x[((size_t)f * h * w + p) * D + d] += acc[d];
    }
}

/* out (N / M^2, out_hidden) = merger g over x (N, D); x is kept. */
static void merge(loom_model *m, const vit_merger *g, const float *x, int N, int D, int M2,
                  float *tmp, float *tmp2, float *out) {
    int G = N / M2, W = M2 * D;
    if (g->post)
        loom_vit_layernorm(tmp, x, g->norm_w, g->norm_b, G, W, 1e-6f);
    else
        loom_vit_layernorm(tmp, x, g->norm_w, g->norm_b, N, D, 1e-6f);
    loom_vit_linear(m, tmp2, tmp, &g->fc1, g->fc1_b, G);
    loom_vit_act_apply(tmp2, (size_t)G * W, LOOM_VIT_GELU);
    loom_vit_linear(m, out, tmp2, &g->fc2, g->fc2_b, G);
}

loom_status loom_qwen_vit_family_encode(loom_vision *v, const loom_vision_image *img,
                                        float *embeds, float *deep) {
    const qwen_vit *q = v->tower;
    const loom_vision_info *vi = &v->info;
    loom_model *m = v->m;
    int T = img->grid[0], h = img->grid[1], w = img->grid[2], n = h * w, N = T * n;
    int D = q->D, hd = q->hd, I = q->inter, M2 = vi->merge * vi->merge, half = hd / 2;
    int W = LOOM_MAX(M2 * D, LOOM_MAX(3 * D, I));
    float *x = loom_alloc_raw(sizeof(float) * (size_t)N * D);
    float *xb = loom_alloc_raw(sizeof(float) * (size_t)N * D);
    float *big = loom_alloc_raw(sizeof(float) * (size_t)N * W);
    float *big2 = loom_alloc_raw(sizeof(float) * (size_t)N * W);
    float *cs = loom_alloc_raw(sizeof(float) * (size_t)N * hd);
    int *cu = malloc(sizeof(int) * ((size_t)T + 1));
    loom_status s = LOOM_OK;
    if (!x || !xb || !big || !big2 || !cs || !cu) {
        s = loom_err(LOOM_ERR_NOMEM, "vision tower: out of memory for %d patches", N);
        goto out;
    }
    float *sn = cs + (size_t)N * half;
    /* attention runs over each frame's patches */
    for (int f = 0; f <= T; f++) cu[f] = f * n;

    /* patch embed + position embeddings */
    loom_vit_linear(m, x, img->pixels, &q->patch, q->patch_b, N);
    if (v->tap_patch) memcpy(v->tap_patch, x, sizeof(float) * (size_t)N * D);
    add_pos_embed(q, x, T, h, w, vi->merge, xb);
    /* rotary angles per patch: pair i < hd/4 by its row, the rest by its
     * column, at frequency theta^(-4j/hd) (every frame the same) */
    int quarter = hd / 4;
    for (int t = 0; t < N; t++) {
        int r, c;
        patch_rc(t % n, w, vi->merge, &r, &c);
        for (int i = 0; i < half; i++) {
            double inv = 1.0 / pow(q->theta, (double)(2 * (i % quarter)) / half);
            double a = (i < quarter ? r : c) * inv;
            cs[(size_t)t * half + i] = (float)cos(a);
            sn[(size_t)t * half + i] = (float)sin(a);
        }
    }
    for (int l = 0; !s && l < q->depth; l++) {
        const vit_block *b = &q->blocks[l];
        loom_vit_layernorm(xb, x, b->n1_w, b->n1_b, N, D, 1e-6f);
        loom_vit_linear(m, big, xb, &b->qkv, b->qkv_b, N);
        loom_vit_rope(big, 3 * D, N, 2 * q->n_heads, hd, cs, sn); /* q heads, then k heads */
        s = loom_vit_attention(m, xb, big, big + D, big + 2 * D, 3 * D, q->n_heads, hd, cu, T,
                               1.0f / sqrtf((float)hd));
        if (s) break;
        loom_vit_linear(m, big2, xb, &b->proj, b->proj_b, N);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += big2[i];
        loom_vit_layernorm(xb, x, b->n2_w, b->n2_b, N, D, 1e-6f);
        loom_vit_linear(m, big, xb, &b->fc1, b->fc1_b, N);
        loom_vit_act_apply(big, (size_t)N * I, q->act);
        loom_vit_linear(m, big2, big, &b->fc2, b->fc2_b, N);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += big2[i];
        for (int d = 0; deep && d < q->n_deep; d++)
            if (q->deep_at[d] == l)
                merge(m, &q->deep[d], x, N, D, M2, big, big2,
                      deep + (size_t)d * (N / M2) * vi->out_hidden);
    }
    if (!s) {
        if (v->tap_merge_in) memcpy(v->tap_merge_in, x, sizeof(float) * (size_t)N * D);
        merge(m, &q->merger, x, N, D, M2, big, big2, embeds);
    }
out:
    loom_free(x), loom_free(xb), loom_free(big), loom_free(big2), loom_free(cs);
    free(cu);
    return s;
}

double loom_qwen_vit_family_flops(const loom_vision *v, const int grid[3]) {
    const qwen_vit *q = v->tower;
    const loom_vision_info *vi = &v->info;
    double n = (double)grid[1] * grid[2], N = grid[0] * n, D = q->D, I = q->inter;
    double M2 = (double)vi->merge * vi->merge, G = N / M2, W = M2 * D;
    double f = 2 * N * vi->patch_dim * D;
    f += q->depth * (2 * N * (3 * D * D + D * D + 2 * D * I) + 4 * grid[0] * n * n * D);
    f += (1 + q->n_deep) * 2 * G * (W * W + W * vi->out_hidden);
    return f;
}
