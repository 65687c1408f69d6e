/* qwen25_vit: Qwen2.5-VL's vision tower (qwen25_vit.h). The window
 * permutation, its segment bounds and the reverse permutation follow the
 * reference's get_window_index: merge units are ordered by frame, then
 * window (row-major over a grid padded up to whole windows), then row-major
 * inside the window; empty windows add no segment. */
#include "vision/qwen25_vit.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "vision/vision_int.h"
#include "vision/vit.h"

typedef struct qv_block {
    const float *norm1, *norm2;       /* (dim) */
    loom_weight qkv;                  /* (3 * dim, dim): q | k | v */
    const float *qkv_b;               /* (3 * dim) */
    loom_weight proj;                 /* (dim, dim) */
    const float *proj_b;
    loom_weight gate, up;             /* (inter, dim) */
    const float *gate_b, *up_b;       /* (inter) */
    loom_weight down;                 /* (dim, inter) */
    const float *down_b;              /* (dim) */
    int full;                         /* attention over whole frames */
} qv_block;

struct loom_qwen25_vit {
    loom_model *m;                    /* borrowed: tensors, pool, kernels */
    int depth, dim, inter, heads, hd;
    int patch, tpatch, merge, window, in_ch, out_dim, patch_dim;
    loom_vit_act act;
    const float *inv_freq;            /* (hd / 4) rotary frequencies, f32 as the reference has them */
    loom_weight patch_embed;          /* (dim, patch_dim) */
    qv_block *blocks;                 /* owned [depth] */
    const float *ln_q;                /* (dim) */
    loom_weight mlp0;                 /* (merge^2 dim, merge^2 dim) */
    const float *mlp0_b;
    loom_weight mlp2;                 /* (out_dim, merge^2 dim) */
    const float *mlp2_b;
    loom_vit_mem mem;                 /* every owned vector */
};

/* The weights' prefix in this checkpoint. */
static const char *find_prefix(const loom_safetensors *st) {
    static const char *const prefixes[] = {"visual.", "model.visual."};
    return loom_vit_prefix(st, prefixes, LOOM_ARRAY_LEN(prefixes), "patch_embed.proj.weight");
}

static loom_status parse_config(loom_qwen25_vit *v, const cJSON *vc, int out_dim,
                                const cJSON **full_idx) {
    const char *w = "vision_config";
    loom_status s;
    if ((s = loom_vit_int(vc, w, "depth", 32, 1, 1024, &v->depth)) ||
        (s = loom_vit_int(vc, w, "hidden_size", 1280, 1, 1 << 16, &v->dim)) ||
        (s = loom_vit_int(vc, w, "intermediate_size", 3420, 1, 1 << 20, &v->inter)) ||
        (s = loom_vit_int(vc, w, "num_heads", 16, 1, 1024, &v->heads)) ||
        (s = loom_vit_int(vc, w, "patch_size", 14, 1, 1024, &v->patch)) ||
        (s = loom_vit_int(vc, w, "temporal_patch_size", 2, 1, 64, &v->tpatch)) ||
        (s = loom_vit_int(vc, w, "spatial_merge_size", 2, 1, 64, &v->merge)) ||
        (s = loom_vit_int(vc, w, "window_size", 112, 1, 1 << 20, &v->window)) ||
        (s = loom_vit_int(vc, w, "out_hidden_size", out_dim, 1, 1 << 20, &v->out_dim)))
        return s;
    /* hub configs spell it in_chans */
    const char *ch = cJSON_GetObjectItemCaseSensitive(vc, "in_channels") ? "in_channels"
                                                                         : "in_chans";
    if ((s = loom_vit_int(vc, w, ch, 3, 1, 64, &v->in_ch))) return s;
    if (v->out_dim != out_dim)
        return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.out_hidden_size %d does not "
                        "match the text model's hidden_size %d", v->out_dim, out_dim);
    if (v->dim % v->heads || (v->dim / v->heads) % 4)
        return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.hidden_size %d over %d heads "
                        "must give a head size that is a multiple of 4", v->dim, v->heads);
    v->hd = v->dim / v->heads;
    if (v->window < v->merge * v->patch || v->window % (v->merge * v->patch))
        return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.window_size %d is not a "
                        "multiple of spatial_merge_size * patch_size = %d", v->window,
                        v->merge * v->patch);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    if ((s = loom_vit_act_parse(cJSON_IsString(act) ? act->valuestring : "silu", &v->act)))
        return s;
    *full_idx = cJSON_GetObjectItemCaseSensitive(vc, "fullatt_block_indexes");
    if (*full_idx && !cJSON_IsArray(*full_idx))
        return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.fullatt_block_indexes must "
                        "be an array of block indexes");
    return LOOM_OK;
}

/* Rotary base: rope_parameters.rope_theta, else rope_theta, else 10000. */
static loom_status rope_theta(const cJSON *vc, double *theta) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(vc, "rope_parameters");
    if (cJSON_IsObject(rp)) return loom_vit_num(rp, "vision_config.rope_parameters", "rope_theta",
                                                10000.0, theta);
    return loom_vit_num(vc, "vision_config", "rope_theta", 10000.0, theta);
}

static loom_status bind_block(loom_qwen25_vit *v, const char *pre, int i, qv_block *b) {
    const loom_safetensors *st = v->m->st;
    char bp[96];
    snprintf(bp, sizeof bp, "%sblocks.%d.", pre, i);
    int d = v->dim, I = v->inter;
    loom_status s;
    if ((s = loom_vit_vec(st, &v->mem, bp, "norm1.weight", (size_t)d, 0, &b->norm1)) ||
        (s = loom_vit_vec(st, &v->mem, bp, "norm2.weight", (size_t)d, 0, &b->norm2)) ||
        (s = loom_vit_weight(st, bp, "attn.qkv.weight", 3 * d, d, &b->qkv)) ||
        (s = loom_vit_vec(st, &v->mem, bp, "attn.qkv.bias", (size_t)3 * d, 0, &b->qkv_b)) ||
        (s = loom_vit_weight(st, bp, "attn.proj.weight", d, d, &b->proj)) ||
        (s = loom_vit_vec(st, &v->mem, bp, "attn.proj.bias", (size_t)d, 0, &b->proj_b)) ||
        (s = loom_vit_weight(st, bp, "mlp.gate_proj.weight", I, d, &b->gate)) ||
        (s = loom_vit_vec(st, &v->mem, bp, "mlp.gate_proj.bias", (size_t)I, 0, &b->gate_b)) ||
        (s = loom_vit_weight(st, bp, "mlp.up_proj.weight", I, d, &b->up)) ||
        (s = loom_vit_vec(st, &v->mem, bp, "mlp.up_proj.bias", (size_t)I, 0, &b->up_b)) ||
        (s = loom_vit_weight(st, bp, "mlp.down_proj.weight", d, I, &b->down)) ||
        (s = loom_vit_vec(st, &v->mem, bp, "mlp.down_proj.bias", (size_t)d, 0, &b->down_b)))
        return s;
    return LOOM_OK;
}

static loom_status bind_all(loom_qwen25_vit *v, const cJSON *full_idx) {
    const loom_safetensors *st = v->m->st;
    const char *pre = find_prefix(st);
    if (!pre)
        return loom_err(LOOM_ERR_FORMAT, "tensor visual.patch_embed.proj.weight: missing (nor "
                        "model.visual.patch_embed.proj.weight)");
    loom_status s;
    v->patch_dim = v->in_ch * v->tpatch * v->patch * v->patch;
    if ((s = loom_vit_weight(st, pre, "patch_embed.proj.weight", v->dim, v->patch_dim,
                             &v->patch_embed)))
        return s;
    v->blocks = calloc((size_t)v->depth, sizeof *v->blocks);
    if (!v->blocks) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < v->depth; i++)
        if ((s = bind_block(v, pre, i, &v->blocks[i]))) return s;
    const cJSON *e;
    cJSON_ArrayForEach(e, full_idx) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= v->depth)
            return loom_err(LOOM_ERR_FORMAT, "config.json: vision_config.fullatt_block_indexes "
                            "holds %g, expected block indexes below depth %d", e->valuedouble,
                            v->depth);
        v->blocks[(int)e->valuedouble].full = 1;
    }
    int md = v->dim * v->merge * v->merge;
    if ((s = loom_vit_vec(st, &v->mem, pre, "merger.ln_q.weight", (size_t)v->dim, 0, &v->ln_q)) ||
        (s = loom_vit_weight(st, pre, "merger.mlp.0.weight", md, md, &v->mlp0)) ||
        (s = loom_vit_vec(st, &v->mem, pre, "merger.mlp.0.bias", (size_t)md, 0, &v->mlp0_b)) ||
        (s = loom_vit_weight(st, pre, "merger.mlp.2.weight", v->out_dim, md, &v->mlp2)) ||
        (s = loom_vit_vec(st, &v->mem, pre, "merger.mlp.2.bias", (size_t)v->out_dim, 0,
                          &v->mlp2_b)))
        return s;
    return LOOM_OK;
}

loom_status loom_qwen25_vit_load(loom_model *m, const cJSON *root, int out_dim,
                                 loom_qwen25_vit **out) {
    *out = NULL;
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    if (!cJSON_IsObject(vc))
        return loom_err(LOOM_ERR_FORMAT, "config.json: missing \"vision_config\" (a Qwen2.5-VL "
                        "checkpoint has one)");
    loom_qwen25_vit *v = calloc(1, sizeof *v);
    if (!v) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    v->m = m;
    const cJSON *full_idx = NULL;
    double theta = 0;
    loom_status s = parse_config(v, vc, out_dim, &full_idx);
    if (!s) s = rope_theta(vc, &theta);
    if (!s) s = bind_all(v, full_idx);
    if (!s) {
        /* the reference's frequencies are f32: 1 / theta^(2i / (hd / 2)) */
        int nf = v->hd / 4;
        float *f = loom_vit_alloc(&v->mem, (size_t)nf);
        if (!f) s = LOOM_ERR_NOMEM;
        for (int i = 0; f && i < nf; i++)
            f[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)(v->hd / 2));
        v->inv_freq = f;
    }
    if (s) {
        loom_qwen25_vit_free(v);
        return s;
    }
    *out = v;
    return LOOM_OK;
}

void loom_qwen25_vit_free(loom_qwen25_vit *v) {
    if (!v) return;
    loom_vit_mem_free(&v->mem);
    free(v->blocks);
    free(v);
}

int loom_qwen25_vit_patch_dim(const loom_qwen25_vit *v) { return v->patch_dim; }

int loom_qwen25_vit_tokens(const loom_qwen25_vit *v, const int grid[3]) {
    if (grid[0] < 1 || grid[1] < 1 || grid[2] < 1 || grid[1] % v->merge || grid[2] % v->merge) {
        loom_err(LOOM_ERR_INVALID_ARG, "image grid (t %d, h %d, w %d): expected positive sizes "
                 "with h and w multiples of the merge size %d", grid[0], grid[1], grid[2],
                 v->merge);
        return 0;
    }
    return grid[0] * grid[1] * grid[2] / (v->merge * v->merge);
}

/* The window order of merge units over all images: unit[k] is the k-th
 * unit in window order (units numbered in image order), and wcu[0..n_w]
 * the windows' bounds in patch rows, empty windows left out. */
static void window_index(const loom_qwen25_vit *v, const int *grids, int n_images, int *unit,
                         int *wcu, int *n_w) {
    int ws = v->window / v->merge / v->patch, U = v->merge * v->merge;
    int k = 0, base = 0, nw = 0;
    wcu[0] = 0;
    for (int im = 0; im < n_images; im++) {
        int gt = grids[3 * im], gh = grids[3 * im + 1] / v->merge, gw = grids[3 * im + 2] / v->merge;
        /* as the reference pads: a whole extra window when the size divides */
        int nwh = (gh + ws - gh % ws) / ws, nww = (gw + ws - gw % ws) / ws;
        for (int t = 0; t < gt; t++)
            for (int wh = 0; wh < nwh; wh++)
                for (int ww = 0; ww < nww; ww++) {
                    int n = 0;
                    for (int i = wh * ws; i < LOOM_MIN((wh + 1) * ws, gh); i++)
                        for (int j = ww * ws; j < LOOM_MIN((ww + 1) * ws, gw); j++, n++)
                            unit[k++] = base + (t * gh + i) * gw + j;
                    if (n) {
                        wcu[nw + 1] = wcu[nw] + n * U;
                        nw++;
                    }
                }
        base += gt * gh * gw;
    }
    *n_w = nw;
}

typedef struct qv_bufs {
    float *x, *xn, *qkv, *att, *hb, *hb2, *cs, *sn, *mo;
    int *unit, *wcu, *fcu, *upos;
} qv_bufs;

static void bufs_free(qv_bufs *b) {
    loom_free(b->x); loom_free(b->xn); loom_free(b->qkv); loom_free(b->att);
    loom_free(b->hb); loom_free(b->hb2); loom_free(b->cs); loom_free(b->sn); loom_free(b->mo);
    free(b->unit); free(b->wcu); free(b->fcu); free(b->upos);
}

static loom_status run_block(loom_qwen25_vit *v, const qv_block *b, qv_bufs *u, int N,
                             const int *cu, int n_seg) {
    loom_model *m = v->m;
    int d = v->dim, I = v->inter;
    loom_vit_rmsnorm(u->xn, u->x, b->norm1, N, d, 1e-6f);
    loom_vit_linear(m, u->qkv, u->xn, &b->qkv, b->qkv_b, N);
    loom_vit_rope(u->qkv, 3 * d, N, 2 * v->heads, v->hd, u->cs, u->sn); /* q heads, k heads */
    loom_status s = loom_vit_attention(m, u->att, u->qkv, u->qkv + d, u->qkv + 2 * d, 3 * d,
                                       v->heads, v->hd, cu, n_seg,
                                       (float)(1.0 / sqrt((double)v->hd)));
    if (s) return s;
    loom_vit_linear(m, u->xn, u->att, &b->proj, b->proj_b, N);
    for (size_t i = 0; i < (size_t)N * d; i++) u->x[i] += u->xn[i];
    loom_vit_rmsnorm(u->xn, u->x, b->norm2, N, d, 1e-6f);
    loom_vit_linear(m, u->hb, u->xn, &b->gate, b->gate_b, N);
    loom_vit_linear(m, u->hb2, u->xn, &b->up, b->up_b, N);
    loom_vit_act_mul(u->hb, u->hb2, (size_t)N * I, v->act);
    loom_vit_linear(m, u->xn, u->hb, &b->down, b->down_b, N);
    for (size_t i = 0; i < (size_t)N * d; i++) u->x[i] += u->xn[i];
    return LOOM_OK;
}

loom_status loom_qwen25_vit_encode(loom_qwen25_vit *v, const float *pixels, const int *grids,
                                   int n_images, float *out, const loom_qwen25_vit_taps *taps) {
    int N = 0, n_frames = 0, U = v->merge * v->merge, d = v->dim, half = v->hd / 2;
    for (int im = 0; im < n_images; im++) {
        if (!loom_qwen25_vit_tokens(v, grids + 3 * im))
            return loom_err_wrap(LOOM_ERR_INVALID_ARG, "image %d", im);
        if ((long long)N + (long long)grids[3 * im] * grids[3 * im + 1] * grids[3 * im + 2] >
            (1 << 24))
            return loom_err(LOOM_ERR_INVALID_ARG, "images: more than %d patches", 1 << 24);
        N += grids[3 * im] * grids[3 * im + 1] * grids[3 * im + 2];
        n_frames += grids[3 * im];
    }
    if (N == 0) return LOOM_OK;
    loom_model *m = v->m;
    size_t Nd = (size_t)N * d;
    qv_bufs u = {
        .x = loom_alloc_raw(Nd * 4), .xn = loom_alloc_raw(Nd * 4),
        .qkv = loom_alloc_raw(3 * Nd * 4), .att = loom_alloc_raw(Nd * 4),
        .hb = loom_alloc_raw((size_t)N * v->inter * 4),
        .hb2 = loom_alloc_raw((size_t)N * v->inter * 4),
        .cs = loom_alloc_raw((size_t)N * half * 4), .sn = loom_alloc_raw((size_t)N * half * 4),
        .unit = malloc((size_t)(N / U) * sizeof(int)),
        .wcu = malloc(((size_t)(N / U) + 1) * sizeof(int)),
        .fcu = malloc(((size_t)n_frames + 1) * sizeof(int)),
        .upos = malloc((size_t)(N / U) * 2 * sizeof(int)),
        .mo = loom_alloc_raw((size_t)(N / U) * v->out_dim * 4),
    };
    if (!u.x || !u.xn || !u.qkv || !u.att || !u.hb || !u.hb2 || !u.cs || !u.sn || !u.unit ||
        !u.wcu || !u.fcu || !u.upos || !u.mo) {
        bufs_free(&u);
        return loom_err(LOOM_ERR_NOMEM, "out of memory (vision tower over %d patches)", N);
    }
    /* patch embedding in image order, then rows moved to window order */
    loom_vit_linear(m, u.xn, pixels, &v->patch_embed, NULL, N);
    if (taps && taps->patch_embed) memcpy(taps->patch_embed, u.xn, Nd * 4);
    int n_w = 0;
    window_index(v, grids, n_images, u.unit, u.wcu, &n_w);
    for (int k = 0; k < N / U; k++)
        memcpy(u.x + (size_t)k * U * d, u.xn + (size_t)u.unit[k] * U * d, (size_t)U * d * 4);
    /* each row's angles: the first hd / 4 by its patch row, the rest by its
     * column (cos and sin in double, rounded as the reference rounds them) */
    int nf = v->hd / 4;
    for (int im = 0, g = 0; im < n_images; im++) {
        int gh = grids[3 * im + 1] / v->merge, gw = grids[3 * im + 2] / v->merge;
        for (int t = 0; t < grids[3 * im]; t++)
            for (int i = 0; i < gh * gw; i++, g++) {
                u.upos[2 * g] = i / gw;
                u.upos[2 * g + 1] = i % gw;
            }
    }
    for (int k = 0; k < N / U; k++) {
        int bh = u.upos[2 * u.unit[k]], bw = u.upos[2 * u.unit[k] + 1];
        for (int p = 0; p < U; p++) {
            int ph = bh * v->merge + p / v->merge, pw = bw * v->merge + p % v->merge;
            float *c = u.cs + ((size_t)k * U + p) * half, *s = u.sn + ((size_t)k * U + p) * half;
            for (int i = 0; i < half; i++) {
                double a = (double)(i < nf ? ph : pw) * (double)v->inv_freq[i % nf];
                c[i] = (float)cos(a);
                s[i] = (float)sin(a);
            }
        }
    }
    /* whole frames for the full-attention blocks (window order keeps a
     * frame's rows together) */
    int nf_seg = 0;
    u.fcu[0] = 0;
    for (int im = 0; im < n_images; im++)
        for (int t = 0; t < grids[3 * im]; t++, nf_seg++)
            u.fcu[nf_seg + 1] = u.fcu[nf_seg] + grids[3 * im + 1] * grids[3 * im + 2];
    loom_status s = LOOM_OK;
    for (int i = 0; i < v->depth && !s; i++) {
        const qv_block *b = &v->blocks[i];
        s = run_block(v, b, &u, N, b->full ? u.fcu : u.wcu, b->full ? nf_seg : n_w);
    }
    if (!s) {
        if (taps && taps->merger_in) memcpy(taps->merger_in, u.x, Nd * 4);
        /* merger: U rows side by side make one row of U * dim */
        int T = N / U;
        loom_vit_rmsnorm(u.xn, u.x, v->ln_q, N, d, 1e-6f);
        loom_vit_linear(m, u.x, u.xn, &v->mlp0, v->mlp0_b, T);
        loom_vit_act_apply(u.x, (size_t)T * U * d, LOOM_VIT_GELU);
        loom_vit_linear(m, u.mo, u.x, &v->mlp2, v->mlp2_b, T);
        for (int k = 0; k < T; k++)
            memcpy(out + (size_t)u.unit[k] * v->out_dim, u.mo + (size_t)k * v->out_dim,
                   (size_t)v->out_dim * 4);
    }
    bufs_free(&u);
    return s;
}

/* ---- its row of the vision family table (vision.c) ---------------------- */

loom_status loom_qwen25_vit_family_load(loom_vision *v, const cJSON *root, const cJSON *vc) {
    (void)vc;
    loom_qwen25_vit *t = NULL;
    loom_status s = loom_qwen25_vit_load(v->m, root, v->m->cfg.hidden_size, &t);
    if (s) return s;
    v->tower = t;
    loom_vision_info *vi = &v->info;
    vi->patch = t->patch;
    vi->temporal_patch = t->tpatch;
    vi->in_channels = t->in_ch;
    vi->patch_dim = t->patch_dim;
    vi->merge = t->merge;
    vi->out_hidden = t->out_dim;
    return LOOM_OK;
}

loom_status loom_qwen25_vit_family_encode(loom_vision *v, const loom_vision_image *img,
                                          float *embeds, float *deep) {
    (void)deep;
    loom_qwen25_vit_taps taps = {.patch_embed = v->tap_patch, .merger_in = v->tap_merge_in};
    return loom_qwen25_vit_encode(v->tower, img->pixels, img->grid, 1, embeds, &taps);
}

void loom_qwen25_vit_family_free(void *tower) { loom_qwen25_vit_free(tower); }

double loom_qwen25_vit_family_flops(const loom_vision *v, const int grid[3]) {
    const loom_qwen25_vit *t = v->tower;
    int U = t->merge * t->merge, units = grid[0] * grid[1] * grid[2] / U, n_w = 0;
    int *unit = malloc(sizeof(int) * (size_t)units), *wcu = malloc(sizeof(int) * (size_t)(units + 1));
    if (!unit || !wcu) {
        free(unit);
        free(wcu);
        return 0;
    }
    window_index(t, grid, 1, unit, wcu, &n_w);
    double N = (double)units * U, D = t->dim, I = t->inter, W = U * D, frame = N / grid[0];
    double win = 0, full = grid[0] * frame * frame;
    for (int k = 0; k < n_w; k++) win += (double)(wcu[k + 1] - wcu[k]) * (wcu[k + 1] - wcu[k]);
    free(unit);
    free(wcu);
    double f = 2 * N * t->patch_dim * D;
    for (int i = 0; i < t->depth; i++)
        f += 2 * N * (4 * D * D + 3 * D * I) + 4 * (t->blocks[i].full ? full : win) * D;
    return f + 2 * (N / U) * (W * W + W * t->out_dim);
}
