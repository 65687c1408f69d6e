#include "model/shard.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

typedef struct shard {
    loom_model m;              /* first: the shard is handed out as this */
    uint8_t *mem;              /* owned: the column slices */
} shard;

static int dense(const loom_weight *w) {
    return w->dtype == LOOM_DT_F32 || w->dtype == LOOM_DT_F16 || w->dtype == LOOM_DT_BF16;
}

/* Rows [r0, r0 + n) of w, borrowed. */
static loom_weight rows_of(const loom_weight *w, int r0, int n) {
    loom_weight s = *w;
    s.rows = n;
    s.data = (const uint8_t *)w->data + (size_t)r0 * w->cols * loom_dtype_size(w->dtype);
    return s;
}

/* Columns [c0, c0 + n) of w copied to *mem (which advances). */
static loom_weight cols_of(const loom_weight *w, int c0, int n, uint8_t **mem) {
    size_t es = loom_dtype_size(w->dtype);
    loom_weight s = *w;
    s.cols = n;
    s.data = *mem;
    for (int r = 0; r < w->rows; r++)
        memcpy(*mem + (size_t)r * n * es, (const uint8_t *)w->data + ((size_t)r * w->cols + c0) * es,
               (size_t)n * es);
    *mem += (size_t)w->rows * n * es;
    return s;
}

/* Why layer l cannot be split n ways (an error naming it), or LOOM_OK. */
static loom_status check_layer(const loom_model *m, int l, int n) {
    const loom_layer *L = &m->layers[l];
    const loom_attn *A = &L->attn;
    int nh = m->cfg.n_heads, nkv = A->n_kv_heads, I = L->mlp.gate.rows;
    if (L->kind == LOOM_LAYER_LINEAR || L->is_moe || L->moe_beside || A->kv_layer != l ||
        A->k_eq_v || (m->arch->flags & LOOM_ARCH_ATTN_GATE))
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: layer %d is not a dense attention "
                        "layer with its own K and V (MoE, linear attention, gated or shared "
                        "attention are not split)", l);
    if (!dense(&A->wq) || !dense(&A->wk) || !dense(&A->wv) || !dense(&A->wo) ||
        !dense(&L->mlp.gate) || !dense(&L->mlp.up) || !dense(&L->mlp.down))
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: layer %d has quantized weights "
                        "(expected F32, F16 or BF16)", l);
    if (nh % n || I % n || (nkv % n && n % nkv) || A->wq.rows != nh * A->head_dim)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: layer %d has %d heads, %d KV "
                        "heads and an MLP of %d, which do not split %d ways (expected heads and "
                        "MLP width multiples of %d, and KV heads a multiple or a divisor of it)",
                        l, nh, nkv, I, n, n);
    return LOOM_OK;
}

loom_status loom_model_shard(const loom_model *m, int rank, int n, loom_model **out) {
    *out = NULL;
    const loom_config *c = &m->cfg;
    if (n < 1 || rank < 0 || rank >= n || c->n_layers <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "tensor parallel: rank %d of %d, %d layers", rank,
                        n, c->n_layers);
    if (m->n_linear || m->has_ple || m->dflash)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: %s is not a dense attention "
                        "model (linear attention, per-layer inputs or a drafter)", c->arch);
    if (m->il_mem)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: the weights are laid out for the "
                        "CPU kernels (expected a model loaded for a device, or without the copy)");
    size_t bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        loom_status s = check_layer(m, l, n);
        if (s) return s;
        const loom_layer *L = &m->layers[l];
        bytes += (size_t)L->attn.wo.rows * (L->attn.wo.cols / n) * loom_dtype_size(L->attn.wo.dtype);
        bytes += (size_t)L->mlp.down.rows * (L->mlp.down.cols / n) *
                 loom_dtype_size(L->mlp.down.dtype);
    }
    shard *sh = calloc(1, sizeof *sh);
    loom_layer *layers = calloc((size_t)c->n_layers, sizeof *layers);
    uint8_t *mem = bytes ? loom_alloc(bytes) : NULL;
    if (!sh || !layers || (bytes && !mem)) {
        free(sh), free(layers), loom_free(mem);
        return loom_err(LOOM_ERR_NOMEM, "tensor parallel: out of memory for a shard");
    }
    sh->m = *m;
    sh->mem = mem;
    loom_model *s = &sh->m;
    s->layers = layers;
    if (rank > 0) s->lm_head = s->embed;  /* never run there: no second head to upload */
    int nh = c->n_heads, qh = nh / n;
    s->cfg.n_heads = qh;
    s->kv_dim = s->max_q_dim = s->max_inter = 0;
    for (int l = 0; l < c->n_layers; l++) {
        loom_layer *L = &layers[l];
        *L = m->layers[l];
        loom_attn *A = &L->attn;
        int hd = A->head_dim, nkv = A->n_kv_heads;
        int kvl = nkv >= n ? nkv / n : 1;
        int k0 = nkv >= n ? rank * kvl : rank * qh / (nh / nkv);
        A->wq = rows_of(&A->wq, rank * qh * hd, qh * hd);
        A->wk = rows_of(&A->wk, k0 * hd, kvl * hd);
        A->wv = rows_of(&A->wv, k0 * hd, kvl * hd);
        A->wo = cols_of(&m->layers[l].attn.wo, rank * qh * hd, qh * hd, &mem);
        if (A->bq) A->bq += (size_t)rank * qh * hd;
        if (A->bk) A->bk += (size_t)k0 * hd;
        if (A->bv) A->bv += (size_t)k0 * hd;
        if (rank > 0) A->bo = NULL;  /* added once, by the sum */
        A->n_kv_heads = kvl;
        int il = L->mlp.gate.rows / n;
        L->mlp.gate = rows_of(&L->mlp.gate, rank * il, il);
        L->mlp.up = rows_of(&L->mlp.up, rank * il, il);
        L->mlp.down = cols_of(&m->layers[l].mlp.down, rank * il, il, &mem);
        s->kv_dim = LOOM_MAX(s->kv_dim, kvl * hd);
        s->max_q_dim = LOOM_MAX(s->max_q_dim, qh * hd);
        s->max_inter = LOOM_MAX(s->max_inter, il);
        if (l == 0) {
            s->cfg.n_kv_heads = kvl;
            s->cfg.intermediate_size = il;
        }
    }
    *out = s;
    return LOOM_OK;
}

void loom_model_shard_free(loom_model *s) {
    if (!s) return;
    shard *sh = (shard *)s;
    free(s->layers);
    loom_free(sh->mem);
    free(sh);
}
