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
    loom_weight patch;                        /* (D, patch_dim) */
    const float *patch_b;
    const loom_st_tensor *pos_embed;          /* (grid_side^2, D) */
    vit_block *blocks;                        /* owned [depth] */
    vit_merger merger;
    vit_merger deep[VIT_MAX_DEEP];
    int deep_at[VIT_MAX_DEEP];                /* block after which each plane is taken */
    int n_deep;
} qwen_vit;

void loom_qwen_vit_family_free(void *tower) {
    qwen_vit *q = tower;
    if (!q) return;
    free(q->blocks);
    free(q);
}

static loom_status bind_merger(loom_vision *v, const char *pre, int post, int D, int M2,
                               int out, vit_merger *g) {
    char n[160];
    loom_status s;
    g->post = post;
    snprintf(n, sizeof n, "%s.norm.weight", pre);
    if ((s = loom_vision_vec(v, n, post ? M2 * D : D, &g->norm_w))) return s;
    snprintf(n, sizeof n, "%s.norm.bias", pre);
    if ((s = loom_vision_vec(v, n, post ? M2 * D : D, &g->norm_b))) return s;
    snprintf(n, sizeof n, "%s.linear_fc1.weight", pre);
    if ((s = loom_vision_weight(v, n, M2 * D, M2 * D, &g->fc1))) return s;
    snprintf(n, sizeof n, "%s.linear_fc1.bias", pre);
    if ((s = loom_vision_vec(v, n, M2 * D, &g->fc1_b))) return s;
    snprintf(n, sizeof n, "%s.linear_fc2.weight", pre);
    if ((s = loom_vision_weight(v, n, out, M2 * D, &g->fc2))) return s;
    snprintf(n, sizeof n, "%s.linear_fc2.bias", pre);
    return loom_vision_vec(v, n, out, &g->fc2_b);
}

static loom_status bind_block(loom_vision *v, const qwen_vit *q, int l, vit_block *b) {
    char n[160];
    loom_status s;
    int D = q->D, I = q->inter;
#define VEC(field, fmt, len)                                                \
    do {                                                                    \
        snprintf(n, sizeof n, "blocks.%d." fmt, l);                         \
        if ((s = loom_vision_vec(v, n, (len), &b->field))) return s;        \
    } while (0)
#define MAT(field, fmt, r, c)                                               \
    do {                                                                    \
        snprintf(n, sizeof n, "blocks.%d." fmt, l);                         \
        if ((s = loom_vision_weight(v, n, (r), (c), &b->field))) return s;  \
    } while (0)
    VEC(n1_w, "norm1.weight", D);
    VEC(n1_b, "norm1.bias", D);
    VEC(n2_w, "norm2.weight", D);
    VEC(n2_b, "norm2.bias", D);
    MAT(qkv, "attn.qkv.weight", 3 * D, D);
    VEC(qkv_b, "attn.qkv.bias", 3 * D);
    MAT(proj, "attn.proj.weight", D, D);
    VEC(proj_b, "attn.proj.bias", D);
    MAT(fc1, "mlp.linear_fc1.weight", I, D);
    VEC(fc1_b, "mlp.linear_fc1.bias", I);
    MAT(fc2, "mlp.linear_fc2.weight", D, I);
    VEC(fc2_b, "mlp.linear_fc2.bias", D);
#undef VEC
#undef MAT
    return LOOM_OK;
}

loom_status loom_qwen_vit_family_load(loom_vision *v, const cJSON *root, const cJSON *vc) {
    (void)root;
    loom_vision_info *vi = &v->info;
    qwen_vit *q = calloc(1, sizeof *q);
    if (!q) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    v->tower = q;
    q->D = loom_vision_cfg_int(vc, "hidden_size", 0);
    q->n_heads = loom_vision_cfg_int(vc, "num_heads", 0);
    q->inter = loom_vision_cfg_int(vc, "intermediate_size", 0);
    q->depth = loom_vision_cfg_int(vc, "depth", 0);
    int n_pos = loom_vision_cfg_int(vc, "num_position_embeddings", 0);
    vi->patch = loom_vision_cfg_int(vc, "patch_size", 16);
    vi->temporal_patch = loom_vision_cfg_int(vc, "temporal_patch_size", 2);
    vi->in_channels = loom_vision_cfg_int(vc, "in_channels", 3);
    vi->merge = loom_vision_cfg_int(vc, "spatial_merge_size", 2);
    vi->out_hidden = loom_vision_cfg_int(vc, "out_hidden_size", 0);
    const char *act = "gelu_pytorch_tanh";
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    if (cJSON_IsString(a)) act = a->valuestring;
    q->theta = 10000.0;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(vc, "rope_parameters");
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta");
    if (cJSON_IsNumber(th)) q->theta = th->valuedouble;
    q->grid_side = (int)lround(sqrt((double)n_pos));
    if (q->D <= 0 || q->n_heads <= 0 || q->D % q->n_heads || q->inter <= 0 || q->depth <= 0 ||
        q->depth > 1024 || vi->patch <= 0 || vi->temporal_patch <= 0 || vi->in_channels <= 0 ||
        vi->merge <= 0 || vi->out_hidden <= 0 || n_pos <= 0 ||
        q->grid_side * q->grid_side != n_pos)
        return loom_err(LOOM_ERR_FORMAT, "vision_config: expected positive hidden_size (a multiple "
                        "of num_heads), intermediate_size, depth, patch sizes, spatial_merge_size, "
                        "out_hidden_size and a square num_position_embeddings");
    if (strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_new"))
        return loom_err(LOOM_ERR_UNSUPPORTED, "vision_config: hidden_act \"%s\" is not supported "
                        "(expected gelu_pytorch_tanh)", act);
    q->hd = q->D / q->n_heads;
    if (q->hd % 4)
        return loom_err(LOOM_ERR_FORMAT, "vision_config: head size %d is not a multiple of 4 "
                        "(2-D rotary)", q->hd);
    vi->patch_dim = vi->in_channels * vi->temporal_patch * vi->patch * vi->patch;
    int D = q->D, M2 = vi->merge * vi->merge;
    loom_status s;
    if ((s = loom_vision_weight(v, "patch_embed.proj.weight", D, vi->patch_dim, &q->patch)))
        return s;
    if ((s = loom_vision_vec(v, "patch_embed.proj.bias", D, &q->patch_b))) return s;
    loom_weight pe;
    if ((s = loom_vision_weight(v, "pos_embed.weight", n_pos, D, &pe))) return s;
    q->pos_embed = loom_vision_tensor(v, "pos_embed.weight");
    q->blocks = calloc((size_t)q->depth, sizeof *q->blocks);
    if (!q->blocks) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < q->depth; l++)
        if ((s = bind_block(v, q, l, &q->blocks[l]))) return s;
    if ((s = bind_merger(v, "merger", 0, D, M2, vi->out_hidden, &q->merger))) return s;
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
        char pre[64];
        snprintf(pre, sizeof pre, "deepstack_merger_list.%d", i);
        if ((s = bind_merger(v, pre, 1, D, M2, vi->out_hidden, &q->deep[i]))) return s;
    }
    q->n_deep = vi->n_deep = nd;
    return LOOM_OK;
}

/* ---- the pieces ---------------------------------------------------------- */

/* LayerNorm (eps 1e-6) of T rows of n, y may alias x. */
static void layernorm(float *y, const float *x, const float *w, const float *b, int T, int n) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        double mean = 0, var = 0;
        for (int i = 0; i < n; i++) mean += xr[i];
        mean /= n;
        for (int i = 0; i < n; i++) var += (xr[i] - mean) * (xr[i] - mean);
        double inv = 1.0 / sqrt(var / n + 1e-6);
        for (int i = 0; i < n; i++) yr[i] = (float)((xr[i] - mean) * inv * w[i] + b[i]);
    }
}

static void add_bias(float *y, const float *b, int T, int n) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

static float gelu_tanh(float x) {
    double v = x;
    return (float)(0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
}

static float gelu_erf(float x) { return (float)(0.5 * x * (1 + erf(x / 1.4142135623730951))); }

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
                          float *tmp) {
    int G = q->grid_side, D = q->D;
    const loom_st_tensor *pe = q->pos_embed;
    for (int p = 0; p < h * w; p++) {
        int r, c;
        patch_rc(p, w, merge, &r, &c);
        float hy = lin_at(r, h, G), wx = lin_at(c, w, G);
        int h0 = (int)hy, w0 = (int)wx, h1 = LOOM_MIN(h0 + 1, G - 1), w1 = LOOM_MIN(w0 + 1, G - 1);
        float dh = hy - (float)h0, dw = wx - (float)w0;
        int idx[4] = {h0 * G + w0, h0 * G + w1, h1 * G + w0, h1 * G + w1};
        float wt[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
        float *acc = tmp;
        memset(acc, 0, sizeof(float) * (size_t)D);
        for (int k = 0; k < 4; k++) {
            const void *row = (const char *)pe->data + (size_t)idx[k] * D * loom_dtype_size(pe->dtype);
            for (int d = 0; d < D; d++) {
                float e = pe->dtype == LOOM_DT_F32    ? ((const float *)row)[d]
                          : pe->dtype == LOOM_DT_BF16 ? loom_bf16_to_f32(((const uint16_t *)row)[d])
                                                      : loom_f16_to_f32(((const uint16_t *)row)[d]);
                acc[d] += e * wt[k];
            }
        }
        for (int f = 0; f < t; f++)
            for (int d = 0; d < D; d++) x[((size_t)f * h * w + p) * D + d] += acc[d];
    }
}

/* Rotate-half rotary on one head vector: pair i < hd/4 turns by the
 * patch's row, the rest by its column, at frequency theta^(-4j/hd). */
static void rope_2d(float *v, const float *cs, const float *sn, int hd) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

typedef struct vit_attn_job {
    const qwen_vit *q;
    const loom_kernels *k;
    const float *qkv;        /* (N, 3D) rotated q, k and raw v */
    const float *kh;         /* (frames, heads, n, hd) keys, head by head */
    const float *vt;         /* (frames, heads, hd, n) values, transposed */
    float *out;              /* (N, D) */
    float *scores;           /* (n_threads, VIT_ROWS, n) */
    int n, n_frames;         /* patches per frame, frames */
} vit_attn_job;

/* One task = one head of one frame and a run of VIT_ROWS query patches:
 * softmax(q k^T / sqrt(hd)) v over every patch of the frame, both
 * products on the matmul kernel. */
#define VIT_ROWS 16
static void vit_attn_task(void *ctx, int task, int thread) {
    const vit_attn_job *j = ctx;
    const qwen_vit *q = j->q;
    int D = q->D, hd = q->hd, n = j->n, per = (n + VIT_ROWS - 1) / VIT_ROWS;
    int h = task % q->n_heads, rest = task / q->n_heads, f = rest / per;
    int r0 = rest % per * VIT_ROWS, r1 = LOOM_MIN(r0 + VIT_ROWS, n), rows = r1 - r0;
    float *sc = j->scores + (size_t)thread * VIT_ROWS * n;
    float scale = 1.0f / sqrtf((float)hd);
    size_t fh = (size_t)f * q->n_heads + h;
    const float *qs = j->qkv + ((size_t)f * n + r0) * 3 * D + (size_t)h * hd;
    j->k->matmul_f32(sc, n, qs, 3 * D, j->kh + fh * n * hd, hd, rows, 0, n);
    for (int i = 0; i < rows; i++) {
        float *row = sc + (size_t)i * n, mx = -INFINITY;
        for (int p = 0; p < n; p++) {
            row[p] *= scale;
            mx = LOOM_MAX(mx, row[p]);
        }
        double sum = 0;
        for (int p = 0; p < n; p++) sum += row[p] = expf(row[p] - mx);
        float inv = (float)(1.0 / sum);
        for (int p = 0; p < n; p++) row[p] *= inv;
    }
    float *o = j->out + ((size_t)f * n + r0) * D + (size_t)h * hd;
    j->k->matmul_f32(o, D, sc, n, j->vt + fh * hd * n, n, rows, 0, hd);
}

/* out (N / M^2, out_hidden) = merger g over x (N, D); x is kept. */
static void merge(loom_model *m, const vit_merger *g, const float *x, int N, int D, int M2,
                  float *tmp, float *tmp2, float *out) {
    int G = N / M2, W = M2 * D;
    if (g->post) {
        layernorm(tmp, x, g->norm_w, g->norm_b, G, W);
    } else {
        layernorm(tmp, x, g->norm_w, g->norm_b, N, D);
    }
    loom_fwd_matmul(m, tmp2, tmp, &g->fc1, G);
    add_bias(tmp2, g->fc1_b, G, W);
    for (size_t i = 0; i < (size_t)G * W; i++) tmp2[i] = gelu_erf(tmp2[i]);
    loom_fwd_matmul(m, out, tmp2, &g->fc2, G);
    add_bias(out, g->fc2_b, G, g->fc2.rows);
}

loom_status loom_qwen_vit_family_encode(loom_vision *v, const loom_vision_image *img, float *embeds,
                                 float *deep) {
    const qwen_vit *q = v->tower;
    const loom_vision_info *vi = &v->info;
    loom_model *m = v->m;
    int T = img->grid[0], h = img->grid[1], w = img->grid[2], n = h * w, N = T * n;
    int D = q->D, hd = q->hd, I = q->inter, M2 = vi->merge * vi->merge;
    int nt = loom_pool_size(m->pool), W = LOOM_MAX(M2 * D, LOOM_MAX(3 * D, I));
    float *x = loom_alloc_raw(sizeof(float) * (size_t)N * D);
    float *xb = loom_alloc_raw(sizeof(float) * (size_t)N * D);
    float *big = loom_alloc_raw(sizeof(float) * (size_t)N * W);
    float *big2 = loom_alloc_raw(sizeof(float) * (size_t)N * W);
    float *cs = loom_alloc_raw(sizeof(float) * (size_t)n * hd);
    float *scores = loom_alloc_raw(sizeof(float) * (size_t)nt * VIT_ROWS * n);
    float *kh = loom_alloc_raw(sizeof(float) * (size_t)N * D);
    float *vt = loom_alloc_raw(sizeof(float) * (size_t)N * D);
    if (!x || !xb || !big || !big2 || !cs || !scores || !kh || !vt) {
        loom_free(x), loom_free(xb), loom_free(big), loom_free(big2), loom_free(cs);
        loom_free(scores), loom_free(kh), loom_free(vt);
        return loom_err(LOOM_ERR_NOMEM, "vision tower: out of memory for %d patches", N);
    }
    float *sn = cs + (size_t)n * hd / 2;

    /* patch embed + position embeddings */
    loom_fwd_matmul(m, x, img->pixels, &q->patch, N);
    add_bias(x, q->patch_b, N, D);
    if (v->tap_patch) memcpy(v->tap_patch, x, sizeof(float) * (size_t)N * D);
    add_pos_embed(q, x, T, h, w, vi->merge, xb);
    /* rotary tables per patch of a frame (every frame the same) */
    int quarter = hd / 4;
    for (int p = 0; p < n; p++) {
        int r, c;
        patch_rc(p, w, vi->merge, &r, &c);
        for (int i = 0; i < hd / 2; i++) {
            int j = i % quarter;
            double inv = 1.0 / pow(q->theta, (double)(2 * j) / (hd / 2));
            double a = (i < quarter ? r : c) * inv;
            cs[(size_t)p * hd / 2 + i] = (float)cos(a);
            sn[(size_t)p * hd / 2 + i] = (float)sin(a);
        }
    }
    for (int l = 0; l < q->depth; l++) {
        const vit_block *b = &q->blocks[l];
        layernorm(xb, x, b->n1_w, b->n1_b, N, D);
        loom_fwd_matmul(m, big, xb, &b->qkv, N);
        add_bias(big, b->qkv_b, N, 3 * D);
        for (int t = 0; t < N; t++) {
            int p = t % n;
            for (int hh = 0; hh < 2 * q->n_heads; hh++) /* q heads, then k heads */
                rope_2d(big + (size_t)t * 3 * D + (size_t)hh * hd, cs + (size_t)p * hd / 2,
                        sn + (size_t)p * hd / 2, hd);
        }
        /* keys head by head and values transposed, per frame */
        for (int t = 0; t < N; t++) {
            int f = t / n, p = t % n;
            for (int hh = 0; hh < q->n_heads; hh++) {
                const float *kr = big + (size_t)t * 3 * D + D + (size_t)hh * hd;
                size_t fh = (size_t)f * q->n_heads + hh;
                memcpy(kh + (fh * n + p) * hd, kr, sizeof(float) * (size_t)hd);
                for (int e = 0; e < hd; e++) vt[(fh * hd + e) * n + p] = kr[D + e];
            }
        }
        vit_attn_job j = {q, m->k, big, kh, vt, xb, scores, n, T};
        loom_pool_run(m->pool, q->n_heads * T * ((n + VIT_ROWS - 1) / VIT_ROWS), vit_attn_task, &j);
        loom_fwd_matmul(m, big2, xb, &b->proj, N);
        add_bias(big2, b->proj_b, N, D);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += big2[i];
        layernorm(xb, x, b->n2_w, b->n2_b, N, D);
        loom_fwd_matmul(m, big, xb, &b->fc1, N);
        add_bias(big, b->fc1_b, N, I);
        for (size_t i = 0; i < (size_t)N * I; i++) big[i] = gelu_tanh(big[i]);
        loom_fwd_matmul(m, big2, big, &b->fc2, N);
        add_bias(big2, b->fc2_b, N, D);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += big2[i];
        for (int d = 0; deep && d < q->n_deep; d++)
            if (q->deep_at[d] == l)
                merge(m, &q->deep[d], x, N, D, M2, big, big2,
                      deep + (size_t)d * (N / M2) * vi->out_hidden);
    }
    if (v->tap_merge_in) memcpy(v->tap_merge_in, x, sizeof(float) * (size_t)N * D);
    merge(m, &q->merger, x, N, D, M2, big, big2, embeds);
    loom_free(x), loom_free(xb), loom_free(big), loom_free(big2), loom_free(cs);
    loom_free(scores), loom_free(kh), loom_free(vt);
    return LOOM_OK;
}
