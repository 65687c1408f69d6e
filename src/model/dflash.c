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

#define ARCH "DFlashDraftModel"

typedef struct dflash_priv {
    loom_dflash d;
    loom_safetensors *st;  /* the matrices point into it */
    float **vecs;          /* owned: the norm vectors */
    int n_vecs;
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
    free(d->layers);
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

/* ---- the forwards ------------------------------------------------------------ */

/* Rotate-half rope of one head v [hd] at position pos. */
static void rope(const loom_dflash *d, float *v, int pos) {
    int half = d->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double ang = (double)pos * pow(d->theta, -2.0 * i / d->head_dim);
        float c = (float)cos(ang), s = (float)sin(ang), a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

/* rmsnorm with w and rope over every head of rows x [n, heads * hd] at
 * positions pos.. */
static void heads_norm_rope(const loom_dflash *d, loom_model *t, float *x, int n, int heads,
                            const float *w, int pos) {
    int hd = d->head_dim;
    for (int j = 0; j < n; j++)
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)j * heads + h) * hd;
            t->k->rmsnorm(v, v, w, hd, d->eps);
            rope(d, v, pos + j);
        }
}

void loom_dflash_project(const loom_dflash *d, loom_model *t, const float *taps, int pos, int n,
                         float *out, float *scratch) {
    int H = d->hidden, kvd = d->n_kv * d->head_dim;
    size_t row = loom_dflash_row_floats(d);
    float *c = scratch, *kx = scratch + (size_t)n * H;
    loom_fwd_matmul(t, c, taps, &d->fc, n);
    for (int j = 0; j < n; j++) t->k->rmsnorm(c + (size_t)j * H, c + (size_t)j * H, d->hidden_norm, H, d->eps);
    for (int l = 0; l < d->n_layers; l++) {
        const loom_dflash_layer *L = &d->layers[l];
        loom_fwd_matmul(t, kx, c, &L->k, n);
        heads_norm_rope(d, t, kx, n, d->n_kv, L->k_norm, pos);
        for (int j = 0; j < n; j++)
            memcpy(out + (size_t)j * row + (size_t)l * 2 * kvd, kx + (size_t)j * kvd, sizeof(float) * kvd);
        loom_fwd_matmul(t, kx, c, &L->v, n);
        for (int j = 0; j < n; j++)
            memcpy(out + (size_t)j * row + (size_t)(l * 2 + 1) * kvd, kx + (size_t)j * kvd,
                   sizeof(float) * kvd);
    }
}

size_t loom_dflash_scratch(const loom_dflash *d, int n_ctx) {
    size_t B = (size_t)d->block, H = (size_t)d->hidden, qd = (size_t)(d->n_heads * d->head_dim);
    size_t kvd = (size_t)(d->n_kv * d->head_dim);
    return B * (2 * H + 2 * qd + 2 * kvd + 2 * (size_t)d->inter) + (size_t)n_ctx + B;
}

void loom_dflash_block(const loom_dflash *d, loom_model *t, const float *ctx, int n_ctx, int pos,
                       int32_t last, float *logits, float *scratch) {
    int B = d->block, H = d->hidden, hd = d->head_dim, nh = d->n_heads, nkv = d->n_kv;
    int qd = nh * hd, kvd = nkv * hd, group = nh / nkv;
    size_t row = loom_dflash_row_floats(d);
    float *x = scratch, *h = x + (size_t)B * H, *q = h + (size_t)B * H, *att = q + (size_t)B * qd;
    float *kb = att + (size_t)B * qd, *vb = kb + (size_t)B * kvd, *hb = vb + (size_t)B * kvd;
    float *hb2 = hb + (size_t)B * d->inter, *sc = hb2 + (size_t)B * d->inter;
    float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < B; i++) {
        float *xi = x + (size_t)i * H;
        loom_fwd_weight_row(t, &t->embed, xi, i ? d->mask_id : last);
        if (t->embed_scale != 1.0f)
            for (int k = 0; k < H; k++) xi[k] *= t->embed_scale;
    }
    for (int l = 0; l < d->n_layers; l++) {
        const loom_dflash_layer *L = &d->layers[l];
        for (int i = 0; i < B; i++) t->k->rmsnorm(h + (size_t)i * H, x + (size_t)i * H, L->in_norm, H, d->eps);
        loom_fwd_matmul(t, q, h, &L->q, B);
        loom_fwd_matmul(t, kb, h, &L->k, B);
        loom_fwd_matmul(t, vb, h, &L->v, B);
        heads_norm_rope(d, t, q, B, nh, L->q_norm, pos);
        heads_norm_rope(d, t, kb, B, nkv, L->k_norm, pos);
        const float *kc = ctx + (size_t)l * 2 * kvd, *vc = kc + kvd;
        /* every block row sees every context row and the whole block */
        for (int i = 0; i < B; i++)
            for (int a = 0; a < nh; a++) {
                const float *qa = q + (size_t)i * qd + (size_t)a * hd;
                int g = a / group, n = n_ctx + B;
                float mx = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    const float *kj = j < n_ctx ? kc + (size_t)j * row + (size_t)g * hd
                                                : kb + (size_t)(j - n_ctx) * kvd + (size_t)g * hd;
                    sc[j] = t->k->dot(qa, kj, hd) * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j < n; j++) sum += sc[j] = expf(sc[j] - mx);
                float *o = att + (size_t)i * qd + (size_t)a * hd;
                memset(o, 0, sizeof(float) * hd);
                for (int j = 0; j < n; j++) {
                    const float *vj = j < n_ctx ? vc + (size_t)j * row + (size_t)g * hd
                                                : vb + (size_t)(j - n_ctx) * kvd + (size_t)g * hd;
                    float w = sc[j] / sum;
                    for (int k = 0; k < hd; k++) o[k] += w * vj[k];
                }
            }
        loom_fwd_matmul(t, h, att, &L->o, B);
        for (size_t k = 0; k < (size_t)B * H; k++) x[k] += h[k];
        for (int i = 0; i < B; i++) t->k->rmsnorm(h + (size_t)i * H, x + (size_t)i * H, L->post_norm, H, d->eps);
        loom_fwd_mlp(t, &L->mlp, h, h, B, hb, hb2);
        for (size_t k = 0; k < (size_t)B * H; k++) x[k] += h[k];
    }
    for (int i = 1; i < B; i++)
        t->k->rmsnorm(h + (size_t)(i - 1) * H, x + (size_t)i * H, d->norm, H, d->eps);
    loom_fwd_matmul(t, logits, h, &t->lm_head, B - 1);
}
