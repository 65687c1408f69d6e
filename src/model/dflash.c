/* dflash: loading and the two forwards of the projected-context drafter
 * (model/dflash.h; the checkpoint layout is docs/dflash.md). */
#include "model/dflash.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "model/matmul.h"
#include "model/wquant.h"
#include "ops/ops.h"

#define ARCH "DFlashDraftModel"

typedef struct dflash_priv {
    loom_dflash d;
    loom_safetensors *st;  /* the matrices point into it */
    float **vecs;          /* owned: the norm vectors */
    int n_vecs;
    double *freq;          /* owned [head_dim / 2]: rope's theta^(-2i/head_dim) */
    loom_weight fc0;       /* the checkpoint's matrices, as bound */
    loom_dflash_layer *layers0; /* owned [n_layers] */
    void *q8;              /* owned (loom_alloc): the 8-bit copies */
    const void *q8_head;   /* the target head they were made with */
} dflash_priv;

static cJSON *read_config(const char *dir) {
    char path[1024], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (loom_read_file(path, &text, &len) != LOOM_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

int loom_dflash_is(const char *dir) {
    cJSON *j = read_config(dir);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    int is = cJSON_IsString(a0) && !strcmp(a0->valuestring, ARCH);
    cJSON_Delete(j);
    loom_err_clear();
    return is;
}

static loom_status get_int(const cJSON *j, const char *key, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v && dflt >= 0) {
        *out = dflt;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble < 0)
        return loom_err(LOOM_ERR_FORMAT, "%s config.json: expected a non-negative integer %s", ARCH, key);
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static double get_num(const cJSON *j, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static loom_status parse(dflash_priv *p, const cJSON *j) {
    loom_dflash *d = &p->d;
    const cJSON *taps = cJSON_GetObjectItemCaseSensitive(j, "target_layer_ids");
    int n = cJSON_IsArray(taps) ? cJSON_GetArraySize(taps) : 0;
    if (n < 1 || n > LOOM_DFLASH_MAX_TAPS)
        return loom_err(LOOM_ERR_FORMAT, "%s config.json: expected target_layer_ids, 1 to %d layers, "
                        "found %d", ARCH, LOOM_DFLASH_MAX_TAPS, n);
    d->n_taps = n;
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(taps, i);
        if (!cJSON_IsNumber(v) || v->valuedouble < 0)
            return loom_err(LOOM_ERR_FORMAT, "%s config.json: target_layer_ids[%d] is not a layer", ARCH, i);
        d->taps[i] = (int)v->valuedouble;
    }
    loom_status s = LOOM_OK;
    if (!s) s = get_int(j, "block_size", 16, &d->block);
    if (!s) s = get_int(j, "mask_token_id", -1, &d->mask_id);
    if (!s) s = get_int(j, "hidden_size", -1, &d->hidden);
    if (!s) s = get_int(j, "num_hidden_layers", -1, &d->n_layers);
    if (!s) s = get_int(j, "num_attention_heads", -1, &d->n_heads);
    if (!s) s = get_int(j, "num_key_value_heads", d->n_heads, &d->n_kv);
    if (!s) s = get_int(j, "head_dim", d->n_heads ? d->hidden / d->n_heads : 0, &d->head_dim);
    if (!s) s = get_int(j, "intermediate_size", -1, &d->inter);
    if (!s) s = get_int(j, "vocab_size", -1, &d->vocab);
    if (!s) s = get_int(j, "target_hidden_size", d->hidden, &d->target_hidden);
    if (s) return s;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    d->theta = get_num(j, "rope_theta", get_num(rp, "rope_theta", 10000.0));
    d->eps = (float)get_num(j, "rms_norm_eps", 1e-6);
    if (d->block < 2 || d->block > 64 || d->n_layers < 1 || d->n_heads < 1 || d->n_kv < 1 ||
        d->n_heads % d->n_kv || d->head_dim < 2 || d->head_dim % 2 || d->hidden < 1 || d->inter < 1 ||
        d->mask_id >= d->vocab)
        return loom_err(LOOM_ERR_FORMAT, "%s config.json: inconsistent sizes (block %d, layers %d, "
                        "heads %d/%d, head_dim %d, mask_token_id %d, vocab %d)", ARCH, d->block,
                        d->n_layers, d->n_heads, d->n_kv, d->head_dim, d->mask_id, d->vocab);
    return LOOM_OK;
}

/* A matrix (rows, cols) named name, borrowed from the file. */
static loom_status matrix(dflash_priv *p, const char *name, int rows, int cols, loom_weight *w) {
    const loom_st_tensor *t = loom_st_find(p->st, name);
    if (!t) return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s is missing", ARCH, name);
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols ||
        (t->dtype != LOOM_DT_F32 && t->dtype != LOOM_DT_BF16 && t->dtype != LOOM_DT_F16)) {
        char got[96];
        loom_st_describe(t, got, sizeof got);
        return loom_err(LOOM_ERR_FORMAT, "%s: %s: expected F32, BF16 or F16 [%d, %d], found %s", ARCH,
                        name, rows, cols, got);
    }
    *w = (loom_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    return LOOM_OK;
}

/* A vector of n as f32 (owned by p). */
static loom_status vector(dflash_priv *p, const char *name, int n, const float **out) {
    const loom_st_tensor *t = loom_st_find(p->st, name);
    if (!t) return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s is missing", ARCH, name);
    if (t->ndim != 1 || t->shape[0] != n ||
        (t->dtype != LOOM_DT_F32 && t->dtype != LOOM_DT_BF16 && t->dtype != LOOM_DT_F16))
        return loom_err(LOOM_ERR_FORMAT, "%s: %s: expected F32, BF16 or F16 [%d]", ARCH, name, n);
    float *v = malloc(sizeof(float) * (size_t)n), **vs = realloc(p->vecs, sizeof *vs * (size_t)(p->n_vecs + 1));
    if (vs) p->vecs = vs;
    if (!v || !vs) {
        free(v);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    p->vecs[p->n_vecs++] = v;
    for (int i = 0; i < n; i++)
        v[i] = t->dtype == LOOM_DT_F32    ? ((const float *)t->data)[i]
               : t->dtype == LOOM_DT_BF16 ? loom_bf16_to_f32(((const uint16_t *)t->data)[i])
                                          : loom_f16_to_f32(((const uint16_t *)t->data)[i]);
    *out = v;
    return LOOM_OK;
}

static loom_status bind(dflash_priv *p) {
    loom_dflash *d = &p->d;
    int H = d->hidden, qd = d->n_heads * d->head_dim, kvd = d->n_kv * d->head_dim;
    loom_status s = matrix(p, "fc.weight", H, d->n_taps * d->target_hidden, &d->fc);
    if (!s) s = vector(p, "hidden_norm.weight", H, &d->hidden_norm);
    if (!s) s = vector(p, "norm.weight", H, &d->norm);
    d->layers = calloc((size_t)d->n_layers, sizeof *d->layers);
    if (!d->layers) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < d->n_layers && !s; l++) {
        loom_dflash_layer *L = &d->layers[l];
        char n[128];
#define NAME(x) (snprintf(n, sizeof n, "layers.%d.%s", l, x), n)
        s = vector(p, NAME("input_layernorm.weight"), H, &L->in_norm);
        if (!s) s = vector(p, NAME("post_attention_layernorm.weight"), H, &L->post_norm);
        if (!s) s = vector(p, NAME("self_attn.q_norm.weight"), d->head_dim, &L->q_norm);
        if (!s) s = vector(p, NAME("self_attn.k_norm.weight"), d->head_dim, &L->k_norm);
        if (!s) s = matrix(p, NAME("self_attn.q_proj.weight"), qd, H, &L->q);
        if (!s) s = matrix(p, NAME("self_attn.k_proj.weight"), kvd, H, &L->k);
        if (!s) s = matrix(p, NAME("self_attn.v_proj.weight"), kvd, H, &L->v);
        if (!s) s = matrix(p, NAME("self_attn.o_proj.weight"), H, qd, &L->o);
        if (!s) s = matrix(p, NAME("mlp.gate_proj.weight"), d->inter, H, &L->mlp.gate);
        if (!s) s = matrix(p, NAME("mlp.up_proj.weight"), d->inter, H, &L->mlp.up);
        if (!s) s = matrix(p, NAME("mlp.down_proj.weight"), H, d->inter, &L->mlp.down);
#undef NAME
    }
    return s;
}

loom_status loom_dflash_load(const char *dir, loom_dflash **out) {
    *out = NULL;
    dflash_priv *p = calloc(1, sizeof *p);
    if (!p) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    cJSON *j = read_config(dir);
    loom_status s = j ? parse(p, j) : loom_err(LOOM_ERR_FORMAT, "%s/config.json: not readable JSON", dir);
    cJSON_Delete(j);
    if (!s) {
        char path[1024];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        s = loom_st_open(path, &p->st);
    }
    if (!s) s = bind(p);
    if (!s && !(p->freq = malloc(sizeof(double) * (size_t)(p->d.head_dim / 2))))
        s = loom_err(LOOM_ERR_NOMEM, "out of memory");
    if (!s && !(p->layers0 = malloc(sizeof *p->layers0 * (size_t)p->d.n_layers)))
        s = loom_err(LOOM_ERR_NOMEM, "out of memory");
    if (!s) {
        p->fc0 = p->d.fc;
        memcpy(p->layers0, p->d.layers, sizeof *p->layers0 * (size_t)p->d.n_layers);
    }
    for (int i = 0; !s && i < p->d.head_dim / 2; i++)
        p->freq[i] = pow(p->d.theta, -2.0 * i / p->d.head_dim);
    if (s) {
        loom_dflash_free(&p->d);
        return s;
    }
    *out = &p->d;
    return LOOM_OK;
}

void loom_dflash_free(loom_dflash *d) {
    if (!d) return;
    dflash_priv *p = (dflash_priv *)d; /* d is its first member */
    for (int i = 0; i < p->n_vecs; i++) free(p->vecs[i]);
    free(p->vecs);
    free(p->freq);
    free(d->layers);
    free(p->layers0);
    loom_free(p->q8);
    loom_st_close(p->st);
    free(p);
}

loom_status loom_dflash_check(const loom_dflash *d, const loom_model *t) {
    const loom_config *c = &t->cfg;
    if (d->hidden != c->hidden_size || d->target_hidden != c->hidden_size || d->vocab != c->vocab_size)
        return loom_err(LOOM_ERR_INVALID_ARG, "%s: expected the target's hidden size %d and vocabulary "
                        "of %d (it shares the embeddings and lm_head), found hidden %d (target %d), "
                        "vocabulary %d", ARCH, c->hidden_size, c->vocab_size, d->hidden,
                        d->target_hidden, d->vocab);
    for (int i = 0; i < d->n_taps; i++)
        if (d->taps[i] >= c->n_layers)
            return loom_err(LOOM_ERR_INVALID_ARG, "%s: target_layer_ids[%d] is %d; the target has %d "
                            "layers", ARCH, i, d->taps[i], c->n_layers);
    return LOOM_OK;
}

/* ---- the drafter's arithmetic -------------------------------------------------- */

typedef struct q8_pass {
    const loom_model *t;
    const loom_kernels *k;
    uint8_t *mem;          /* NULL: a pass that only sizes */
    size_t used;
    loom_status s;
} q8_pass;

/* Replaces dense w by its 8-bit copy, laid out for ps->k, carved from
 * ps->mem. */
static void q8_copy(q8_pass *ps, loom_weight *w) {
    size_t n = loom_wq_bytes(w, 8, ps->k->q_il16);
    if (!n || ps->s) return;
    if (ps->mem) ps->s = loom_wq_copy(ps->t, w, 8, ps->k->q_il16, ps->mem + ps->used, w);
    ps->used += n;
}

static void q8_all(q8_pass *ps, loom_dflash *d) {
    q8_copy(ps, &d->fc);
    for (int l = 0; l < d->n_layers; l++) {
        loom_dflash_layer *L = &d->layers[l];
        loom_weight *ws[] = {&L->q, &L->k, &L->v, &L->o, &L->mlp.gate, &L->mlp.up, &L->mlp.down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) q8_copy(ps, ws[i]);
    }
    q8_copy(ps, &d->head);
}

int loom_dflash_is_q8(const loom_dflash *d) { return ((const dflash_priv *)d)->q8 != NULL; }

loom_status loom_dflash_prepare(loom_dflash *d, const loom_model *t, int fast) {
    dflash_priv *p = (dflash_priv *)d; /* d is its first member */
    const loom_kernels *kf = loom_kernels_get_fast();
    /* only where the fast table's 8-bit matmul outruns the exact one over
     * a block's rows (VNNI; not AVX2's VPMADDUBSW) */
    int q8 = fast && kf->q8_prompt_fast;
    if (q8 && p->q8 && p->q8_head == t->lm_head.data) return LOOM_OK;
    loom_free(p->q8);
    p->q8 = NULL;
    p->q8_head = NULL;
    d->fc = p->fc0;
    memcpy(d->layers, p->layers0, sizeof *d->layers * (size_t)d->n_layers);
    d->head = t->lm_head;
    d->k = t->k;
    if (!q8) return LOOM_OK;
    q8_pass ps = {.t = t, .k = kf};
    q8_all(&ps, d); /* sizes, changing nothing */
    if (!(ps.mem = loom_alloc(ps.used)))
        return loom_err(LOOM_ERR_NOMEM, "%s: out of memory for 8-bit copies (%zu bytes)", ARCH, ps.used);
    ps.used = 0;
    q8_all(&ps, d);
    if (ps.s) {
        loom_free(ps.mem);
        d->fc = p->fc0;
        memcpy(d->layers, p->layers0, sizeof *d->layers * (size_t)d->n_layers);
        d->head = t->lm_head;
        return ps.s;
    }
    p->q8 = ps.mem;
    p->q8_head = t->lm_head.data;
    d->k = kf;
    return LOOM_OK;
}

/* ---- the forwards ------------------------------------------------------------ */

/* The table and head loom_dflash_prepare chose (the target's before it). */
static const loom_kernels *mmk(const loom_dflash *d, const loom_model *t) { return d->k ? d->k : t->k; }
static const loom_weight *head(const loom_dflash *d, const loom_model *t) {
    return d->k ? &d->head : &t->lm_head;
}

static void mm(const loom_dflash *d, loom_model *t, float *y, const float *x, const loom_weight *w, int n) {
    loom_fwd_matmul_k(t, mmk(d, t), 1, &y, x, &w, n);
}

/* Rotate-half rope of one head v [hd] by the angles' cos c and sin s. */
static void rope(int half, float *v, const float *c, const float *s) {
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
    }
}

/* rmsnorm with w and rope over every head of rows x [n, heads * hd] at
 * positions pos.. (each position's angles once for all its heads) */
static void heads_norm_rope(const loom_dflash *d, loom_model *t, float *x, int n, int heads,
                            const float *w, int pos) {
    const double *freq = ((const dflash_priv *)d)->freq; /* d is its first member */
    int hd = d->head_dim, half = hd / 2;
    float c[half], s[half];
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < half; i++) {
            double ang = (double)(pos + j) * freq[i];
            c[i] = (float)cos(ang);
            s[i] = (float)sin(ang);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)j * heads + h) * hd;
            t->k->rmsnorm(v, v, w, hd, d->eps);
            rope(half, v, c, s);
        }
    }
}

void loom_dflash_project(const loom_dflash *d, loom_model *t, const float *taps, int pos, int n,
                         float *out, float *scratch) {
    int H = d->hidden, kvd = d->n_kv * d->head_dim;
    size_t row = loom_dflash_row_floats(d);
    float *c = scratch, *kx = scratch + (size_t)n * H;
    mm(d, t, c, taps, &d->fc, n);
    for (int j = 0; j < n; j++) t->k->rmsnorm(c + (size_t)j * H, c + (size_t)j * H, d->hidden_norm, H, d->eps);
    for (int l = 0; l < d->n_layers; l++) {
        const loom_dflash_layer *L = &d->layers[l];
        mm(d, t, kx, c, &L->k, n);
        heads_norm_rope(d, t, kx, n, d->n_kv, L->k_norm, pos);
        for (int j = 0; j < n; j++)
            memcpy(out + (size_t)j * row + (size_t)l * 2 * kvd, kx + (size_t)j * kvd, sizeof(float) * kvd);
        mm(d, t, kx, c, &L->v, n);
        for (int j = 0; j < n; j++)
            memcpy(out + (size_t)j * row + (size_t)(l * 2 + 1) * kvd, kx + (size_t)j * kvd,
                   sizeof(float) * kvd);
    }
}

/* Rows of all blocks in the scratch, and the attention's per request. */
typedef struct blk_buf {
    float *x, *h, *q, *att, *kb, *vb, *hb, *hb2;
    float *keys; /* [n_ctx + block, head_dim]: one kv head's keys, contiguous */
    float *sc;   /* [block, n_ctx + block] */
} blk_buf;

static blk_buf blk_carve(const loom_dflash *d, float *s, int n_ctx, int n_req) {
    size_t R = (size_t)d->block * (size_t)n_req, H = (size_t)d->hidden;
    size_t qd = (size_t)(d->n_heads * d->head_dim), kvd = (size_t)(d->n_kv * d->head_dim);
    size_t nk = (size_t)n_ctx + (size_t)d->block;
    blk_buf b;
    b.x = s, b.h = b.x + R * H, b.q = b.h + R * H, b.att = b.q + R * qd, b.kb = b.att + R * qd;
    b.vb = b.kb + R * kvd, b.hb = b.vb + R * kvd, b.hb2 = b.hb + R * (size_t)d->inter;
    b.keys = b.hb2 + R * (size_t)d->inter, b.sc = b.keys + nk * (size_t)d->head_dim;
    return b;
}

size_t loom_dflash_scratch(const loom_dflash *d, int n_ctx, int n_req) {
    size_t R = (size_t)d->block * (size_t)n_req, H = (size_t)d->hidden;
    size_t qd = (size_t)(d->n_heads * d->head_dim), kvd = (size_t)(d->n_kv * d->head_dim);
    size_t nk = (size_t)n_ctx + (size_t)d->block;
    return R * (2 * H + 2 * qd + 2 * kvd + 2 * (size_t)d->inter) + nk * (size_t)(d->head_dim + d->block);
}

/* One request's attention at layer l: its block rows q, kb, vb (row
 * strides qd, kvd) see every context row and the whole block; into att. */
static void blk_attend(const loom_dflash *d, loom_model *t, const blk_buf *b, const loom_dflash_req *rq,
                       int l, const float *q, const float *kb, const float *vb, float *att) {
    int B = d->block, hd = d->head_dim, nh = d->n_heads, nkv = d->n_kv;
    int qd = nh * hd, kvd = nkv * hd, group = nh / nkv, nc = rq->n_ctx, n = nc + B;
    size_t row = loom_dflash_row_floats(d);
    const float *kc = rq->ctx + (size_t)l * 2 * kvd, *vc = kc + kvd;
    float scale = 1.0f / sqrtf((float)hd);
    int ctx_keys[2 * 64], blk_keys[2 * 64];
    for (int i = 0; i < B; i++) {
        ctx_keys[2 * i] = blk_keys[2 * i] = 0;
        ctx_keys[2 * i + 1] = nc;
        blk_keys[2 * i + 1] = B;
    }
    memset(att, 0, sizeof(float) * (size_t)B * qd);
    for (int g = 0; g < nkv; g++) {
        /* the kv head's keys in one run, so scores are one kernel matmul */
        for (int j = 0; j < nc; j++)
            memcpy(b->keys + (size_t)j * hd, kc + (size_t)j * row + (size_t)g * hd, sizeof(float) * hd);
        for (int j = 0; j < B; j++)
            memcpy(b->keys + (size_t)(nc + j) * hd, kb + (size_t)j * kvd + (size_t)g * hd, sizeof(float) * hd);
        for (int a = g * group; a < (g + 1) * group; a++) {
            t->k->matmul_f32(b->sc, n, q + (size_t)a * hd, qd, b->keys, hd, B, 0, n);
            for (int i = 0; i < B; i++) {
                float *s = b->sc + (size_t)i * n;
                for (int j = 0; j < n; j++) s[j] *= scale;
                t->k->softmax(s, n);
            }
            float *o = att + (size_t)a * hd;
            if (nc) t->k->attn_pv(o, qd, b->sc, n, ctx_keys, B, vc + (size_t)g * hd, (int)row, nc, hd);
            t->k->attn_pv(o, qd, b->sc + nc, n, blk_keys, B, vb + (size_t)g * hd, kvd, B, hd);
        }
    }
}

void loom_dflash_blocks(const loom_dflash *d, loom_model *t, const loom_dflash_req *rq, int n_req,
                        float *logits, float *scratch) {
    int B = d->block, H = d->hidden, nh = d->n_heads, nkv = d->n_kv;
    int qd = nh * d->head_dim, kvd = nkv * d->head_dim, R = B * n_req, max_ctx = 0;
    for (int r = 0; r < n_req; r++) max_ctx = LOOM_MAX(max_ctx, rq[r].n_ctx);
    blk_buf b = blk_carve(d, scratch, max_ctx, n_req);
    for (int i = 0; i < R; i++) {
        float *xi = b.x + (size_t)i * H;
        loom_fwd_weight_row(t, &t->embed, xi, i % B ? d->mask_id : rq[i / B].last);
        if (t->embed_scale != 1.0f)
            for (int k = 0; k < H; k++) xi[k] *= t->embed_scale;
    }
    for (int l = 0; l < d->n_layers; l++) {
        const loom_dflash_layer *L = &d->layers[l];
        for (int i = 0; i < R; i++) t->k->rmsnorm(b.h + (size_t)i * H, b.x + (size_t)i * H, L->in_norm, H, d->eps);
        float *ys[] = {b.q, b.kb, b.vb};
        const loom_weight *ws[] = {&L->q, &L->k, &L->v};
        loom_fwd_matmul_k(t, mmk(d, t), 3, ys, b.h, ws, R);
        for (int r = 0; r < n_req; r++) {
            size_t o = (size_t)r * B;
            heads_norm_rope(d, t, b.q + o * qd, B, nh, L->q_norm, rq[r].pos);
            heads_norm_rope(d, t, b.kb + o * kvd, B, nkv, L->k_norm, rq[r].pos);
            blk_attend(d, t, &b, &rq[r], l, b.q + o * qd, b.kb + o * kvd, b.vb + o * kvd, b.att + o * qd);
        }
        mm(d, t, b.h, b.att, &L->o, R);
        for (size_t k = 0; k < (size_t)R * H; k++) b.x[k] += b.h[k];
        for (int i = 0; i < R; i++) t->k->rmsnorm(b.h + (size_t)i * H, b.x + (size_t)i * H, L->post_norm, H, d->eps);
        float *gu[] = {b.hb, b.hb2};
        const loom_weight *gw[] = {&L->mlp.gate, &L->mlp.up};
        loom_fwd_matmul_k(t, mmk(d, t), 2, gu, b.h, gw, R);
        for (int i = 0; i < R; i++)
            loom_fwd_act_mul(t, b.hb + (size_t)i * d->inter, b.hb2 + (size_t)i * d->inter, d->inter);
        mm(d, t, b.h, b.hb, &L->mlp.down, R);
        for (size_t k = 0; k < (size_t)R * H; k++) b.x[k] += b.h[k];
    }
    /* only the wanted rows go through the head: it is most of the work */
    int n_out = 0;
    for (int r = 0; r < n_req; r++)
        for (int i = 1; i <= rq[r].n_out; i++)
            t->k->rmsnorm(b.h + (size_t)n_out++ * H, b.x + ((size_t)r * B + i) * H, d->norm, H, d->eps);
    mm(d, t, logits, b.h, head(d, t), n_out);
}

void loom_dflash_block(const loom_dflash *d, loom_model *t, const float *ctx, int n_ctx, int pos,
                       int32_t last, float *logits, float *scratch) {
    loom_dflash_req rq = {.ctx = ctx, .n_ctx = n_ctx, .pos = pos, .n_out = d->block - 1, .last = last};
    loom_dflash_blocks(d, t, &rq, 1, logits, scratch);
}
