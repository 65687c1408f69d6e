/* forward: the decoder stack for Llama-family models (Llama, Mistral,
 * Qwen2, Qwen3): RMSNorm -> attention (GQA, rope, optional biases and q/k
 * norms, optional sliding window) -> residual -> RMSNorm -> SiLU-gated MLP
 * -> residual, then the final norm and the head on the selected tokens. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct loom_fwd_state {
    int max_tokens, max_ctx, n_threads;
    float *x;          /* (max_tokens, hidden) residual stream */
    float *xb;         /* (max_tokens, hidden) normed input / scratch */
    float *q;          /* (max_tokens, n_heads * head_dim) */
    float *kx, *vx;    /* (max_tokens, kv_dim) this step's keys and values */
    float *att;        /* (max_tokens, n_heads * head_dim) attention output */
    float *hb, *hb2;   /* (max_tokens, intermediate) */
    float *cos, *sin;  /* (max_tokens, rot_dim / 2) */
    float *scores;     /* (n_threads, max_ctx) */
    int *tok_row;      /* [max_tokens] row of each token */
    int *tok_pos;      /* [max_tokens] position of each token */
    float *logits;     /* (logits_cap / vocab, vocab), grown on demand */
    size_t logits_cap;
};

loom_status loom_fwd_state_create(const loom_model *m, int max_tokens, int max_ctx,
                                  loom_fwd_state **out) {
    *out = NULL;
    const loom_config *c = &m->cfg;
    if (max_tokens <= 0 || max_ctx <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "forward state: max_tokens and max_ctx must be positive");
    loom_fwd_state *s = calloc(1, sizeof *s);
    if (!s) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    size_t T = (size_t)max_tokens, H = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t I = (size_t)c->intermediate_size;
    s->max_tokens = max_tokens;
    s->max_ctx = max_ctx;
    s->n_threads = loom_pool_size(m->pool);
    s->x = loom_alloc(T * H * 4);
    s->xb = loom_alloc(T * H * 4);
    s->q = loom_alloc(T * qd * 4);
    s->kx = loom_alloc(T * kvd * 4);
    s->vx = loom_alloc(T * kvd * 4);
    s->att = loom_alloc(T * qd * 4);
    s->hb = loom_alloc(T * I * 4);
    s->hb2 = loom_alloc(T * I * 4);
    s->cos = loom_alloc(T * (size_t)(m->rot_dim / 2) * 4);
    s->sin = loom_alloc(T * (size_t)(m->rot_dim / 2) * 4);
    s->scores = loom_alloc((size_t)s->n_threads * (size_t)max_ctx * 4);
    s->tok_row = loom_alloc(T * sizeof(int));
    s->tok_pos = loom_alloc(T * sizeof(int));
    if (!s->x || !s->xb || !s->q || !s->kx || !s->vx || !s->att || !s->hb || !s->hb2 ||
        !s->cos || !s->sin || !s->scores || !s->tok_row || !s->tok_pos) {
        loom_fwd_state_free(s);
        return loom_err(LOOM_ERR_NOMEM, "forward state: out of memory for %d tokens", max_tokens);
    }
    *out = s;
    return LOOM_OK;
}

void loom_fwd_state_free(loom_fwd_state *s) {
    if (!s) return;
    loom_free(s->x); loom_free(s->xb); loom_free(s->q); loom_free(s->kx);
    loom_free(s->vx); loom_free(s->att); loom_free(s->hb); loom_free(s->hb2);
    loom_free(s->cos); loom_free(s->sin); loom_free(s->scores);
    loom_free(s->tok_row); loom_free(s->tok_pos); loom_free(s->logits);
    free(s);
}

int loom_fwd_state_max_tokens(const loom_fwd_state *s) { return s->max_tokens; }

/* ---- matmul over the pool ---------------------------------------------- */

typedef struct mm_job {
    const loom_kernels *k;
    float *y; int ldy;
    const float *x; int ldx;
    const loom_weight *w;
    int T, chunk;
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
    (void)thread;
    const mm_job *j = ctx;
    int r0 = task * j->chunk, r1 = LOOM_MIN(r0 + j->chunk, j->w->rows);
    switch (j->w->dtype) {
    case LOOM_DT_F32:
        j->k->matmul_f32(j->y, j->ldy, j->x, j->ldx, j->w->data, j->w->cols, j->T, r0, r1);
        break;
    case LOOM_DT_F16:
        j->k->matmul_f16(j->y, j->ldy, j->x, j->ldx, j->w->data, j->w->cols, j->T, r0, r1);
        break;
    default:
        j->k->matmul_bf16(j->y, j->ldy, j->x, j->ldx, j->w->data, j->w->cols, j->T, r0, r1);
        break;
    }
}

/* y (T, w->rows) = x (T, w->cols) @ w^T, split over output rows. */
static void matmul(loom_model *m, float *y, const float *x, const loom_weight *w, int T) {
    int n = loom_pool_size(m->pool);
    int chunk = (w->rows + 4 * n - 1) / (4 * n);
    chunk = (chunk + 15) & ~15;
    mm_job j = {m->k, y, w->rows, x, w->cols, w, T, chunk};
    loom_pool_run(m->pool, (w->rows + chunk - 1) / chunk, mm_task, &j);
}

/* ---- attention --------------------------------------------------------- */

typedef struct attn_job {
    loom_model *m;
    loom_fwd_state *s;
    loom_kv_pool *kv;
    const loom_fwd_row *rows;
    int layer, window;
} attn_job;

/* One task = one token and one KV head, covering its group of q heads. */
static void attn_task(void *ctx, int task, int thread) {
    const attn_job *j = ctx;
    const loom_config *c = &j->m->cfg;
    const loom_kernels *k = j->m->k;
    int hd = c->head_dim, n_kv = c->n_kv_heads, group = c->n_heads / n_kv;
    int t = task / n_kv, kh = task % n_kv;
    const loom_kv_seq *seq = j->rows[j->s->tok_row[t]].seq;
    int pos = j->s->tok_pos[t];
    int lo = j->window > 0 ? LOOM_MAX(0, pos - j->window + 1) : 0;
    float *sc = j->s->scores + (size_t)thread * j->s->max_ctx;
    for (int g = 0; g < group; g++) {
        int h = kh * group + g;
        const float *q = j->s->q + ((size_t)t * c->n_heads + h) * hd;
        for (int p = lo; p <= pos; p++)
            sc[p - lo] = k->dot(q, loom_kv_k_row(j->kv, seq, j->layer, p) + kh * hd, hd) *
                         j->m->attn_scale;
        k->softmax(sc, pos - lo + 1);
        float *o = j->s->att + ((size_t)t * c->n_heads + h) * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int p = lo; p <= pos; p++)
            k->axpy(o, sc[p - lo], loom_kv_v_row(j->kv, seq, j->layer, p) + kh * hd, hd);
    }
}

/* ---- per-token elementwise work ---------------------------------------- */

static void rope_tables(loom_model *m, loom_fwd_state *s, int T) {
    int half = m->rot_dim / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            /* Angles in double: positions reach 1e5+ and f32 loses the phase. */
            double a = (double)s->tok_pos[t] * m->inv_freq[i];
            s->cos[(size_t)t * half + i] = (float)(cos(a) * m->rope_scale);
            s->sin[(size_t)t * half + i] = (float)(sin(a) * m->rope_scale);
        }
}

/* Rotate-half rope on the first rot_dim dims of one head vector. */
static void rope_apply(float *v, const float *cs, const float *sn, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

static void add_bias(float *y, const float *b, int T, int n) {
    if (!b) return;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

/* Bias, q/k norm and rope for this layer's q and k; writes k and v into the
 * KV blocks of each token's sequence. */
static void qkv_post(loom_model *m, loom_fwd_state *s, loom_kv_pool *kv,
                     const loom_fwd_row *rows, const loom_layer *L, int l, int T) {
    const loom_config *c = &m->cfg;
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, half = m->rot_dim / 2;
    float eps = (float)c->rms_eps;
    add_bias(s->q, L->bq, T, nh * hd);
    add_bias(s->kx, L->bk, T, nkv * hd);
    add_bias(s->vx, L->bv, T, nkv * hd);
    for (int t = 0; t < T; t++) {
        const float *cs = s->cos + (size_t)t * half, *sn = s->sin + (size_t)t * half;
        for (int h = 0; h < nh; h++) {
            float *q = s->q + ((size_t)t * nh + h) * hd;
            if (L->q_norm) m->k->rmsnorm(q, q, L->q_norm, hd, eps);
            rope_apply(q, cs, sn, m->rot_dim);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = s->kx + ((size_t)t * nkv + h) * hd;
            if (L->k_norm) m->k->rmsnorm(k, k, L->k_norm, hd, eps);
            rope_apply(k, cs, sn, m->rot_dim);
        }
        const loom_kv_seq *seq = rows[s->tok_row[t]].seq;
        size_t kvd = (size_t)nkv * hd;
        memcpy(loom_kv_k_row(kv, seq, l, s->tok_pos[t]), s->kx + t * kvd, kvd * 4);
        memcpy(loom_kv_v_row(kv, seq, l, s->tok_pos[t]), s->vx + t * kvd, kvd * 4);
    }
}

static void embed_row(const loom_model *m, float *dst, int id) {
    const loom_weight *e = &m->embed;
    size_t off = (size_t)id * e->cols;
    if (e->dtype == LOOM_DT_F32) memcpy(dst, (const float *)e->data + off, (size_t)e->cols * 4);
    else if (e->dtype == LOOM_DT_F16) m->k->f16_to_f32(dst, (const uint16_t *)e->data + off, e->cols);
    else m->k->bf16_to_f32(dst, (const uint16_t *)e->data + off, e->cols);
}

static loom_status check_rows(const loom_model *m, const loom_fwd_state *s,
                              const loom_kv_pool *kv, const loom_fwd_row *rows,
                              int n_rows, int *total) {
    int T = 0;
    for (int r = 0; r < n_rows; r++) {
        const loom_fwd_row *row = &rows[r];
        if (row->n <= 0 || !row->tokens || !row->seq)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d has no tokens", r);
        for (int i = 0; i < row->n; i++)
            if (row->tokens[i] < 0 || row->tokens[i] >= m->cfg.vocab_size)
                return loom_err(LOOM_ERR_RANGE,
                                "token id %d at index %d is out of range (vocabulary has %d "
                                "tokens: 0..%d)",
                                row->tokens[i], i, m->cfg.vocab_size, m->cfg.vocab_size - 1);
        int end = row->seq->n_tokens + row->n;
        if (end > s->max_ctx)
            return loom_err(LOOM_ERR_RANGE, "forward: sequence would hold %d tokens, limit %d",
                            end, s->max_ctx);
        if ((end + kv->block_size - 1) / kv->block_size > row->seq->n_blocks)
            return loom_err(LOOM_ERR_INTERNAL, "forward: row %d has no KV blocks reserved", r);
        if (row->logits != LOOM_LOGITS_NONE && !row->out)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d wants logits but has no buffer", r);
        T += row->n;
    }
    if (T > s->max_tokens)
        return loom_err(LOOM_ERR_INVALID_ARG, "forward: %d tokens in one batch, limit %d",
                        T, s->max_tokens);
    *total = T;
    return LOOM_OK;
}

loom_status loom_forward(loom_model *m, loom_fwd_state *s, loom_kv_pool *kv,
                         loom_fwd_row *rows, int n_rows) {
    const loom_config *c = &m->cfg;
    const loom_kernels *k = m->k;
    int T = 0;
    loom_status st = check_rows(m, s, kv, rows, n_rows, &T);
    if (st != LOOM_OK) return st;
    int H = c->hidden_size, I = c->intermediate_size;
    float eps = (float)c->rms_eps;

    int n_sel = 0;
    for (int r = 0, t = 0; r < n_rows; r++) {
        for (int i = 0; i < rows[r].n; i++, t++) {
            s->tok_row[t] = r;
            s->tok_pos[t] = rows[r].seq->n_tokens + i;
            embed_row(m, s->x + (size_t)t * H, rows[r].tokens[i]);
        }
        n_sel += rows[r].logits == LOOM_LOGITS_ALL ? rows[r].n : rows[r].logits ? 1 : 0;
    }
    size_t need = (size_t)n_sel * (size_t)c->vocab_size;
    if (need > s->logits_cap) {
        float *nl = loom_alloc(need * 4);
        if (!nl) return loom_err(LOOM_ERR_NOMEM, "forward: out of memory for logits");
        loom_free(s->logits);
        s->logits = nl;
        s->logits_cap = need;
    }
    rope_tables(m, s, T);

    for (int l = 0; l < c->n_layers; l++) {
        const loom_layer *L = &m->layers[l];
        for (int t = 0; t < T; t++)
            k->rmsnorm(s->xb + (size_t)t * H, s->x + (size_t)t * H, L->attn_norm, H, eps);
        matmul(m, s->q, s->xb, &L->wq, T);
        matmul(m, s->kx, s->xb, &L->wk, T);
        matmul(m, s->vx, s->xb, &L->wv, T);
        qkv_post(m, s, kv, rows, L, l, T);
        attn_job aj = {m, s, kv, rows, l, L->window};
        loom_pool_run(m->pool, T * c->n_kv_heads, attn_task, &aj);
        matmul(m, s->xb, s->att, &L->wo, T);
        add_bias(s->xb, L->bo, T, H);
        for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->xb[i];

        for (int t = 0; t < T; t++)
            k->rmsnorm(s->xb + (size_t)t * H, s->x + (size_t)t * H, L->ffn_norm, H, eps);
        matmul(m, s->hb, s->xb, &L->w_gate, T);
        matmul(m, s->hb2, s->xb, &L->w_up, T);
        for (int t = 0; t < T; t++)
            k->silu_mul(s->hb + (size_t)t * I, s->hb2 + (size_t)t * I, I);
        matmul(m, s->xb, s->hb, &L->w_down, T);
        for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->xb[i];
    }

    /* Final norm and head only for the tokens whose logits are wanted. */
    if (n_sel > 0) {
        int j = 0;
        for (int r = 0, t = 0; r < n_rows; r++) {
            for (int i = 0; i < rows[r].n; i++, t++) {
                int want = rows[r].logits == LOOM_LOGITS_ALL ||
                           (rows[r].logits == LOOM_LOGITS_LAST && i == rows[r].n - 1);
                if (want)
                    k->rmsnorm(s->xb + (size_t)j++ * H, s->x + (size_t)t * H, m->final_norm, H, eps);
            }
        }
        matmul(m, s->logits, s->xb, &m->lm_head, n_sel);
        j = 0;
        size_t V = (size_t)c->vocab_size;
        for (int r = 0; r < n_rows; r++) {
            int cnt = rows[r].logits == LOOM_LOGITS_ALL ? rows[r].n : rows[r].logits ? 1 : 0;
            if (cnt) memcpy(rows[r].out, s->logits + (size_t)j * V, (size_t)cnt * V * 4);
            j += cnt;
        }
    }
    for (int r = 0; r < n_rows; r++) rows[r].seq->n_tokens += rows[r].n;
    return LOOM_OK;
}
