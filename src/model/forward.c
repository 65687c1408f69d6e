/* forward: the decoder stack, assembled from shared blocks by the model's
 * architecture flags and per-layer plan:
 *
 *   embed (* scale) [-> per-layer inputs]
 *   per layer: norm -> mixer (softmax attention over paged KV, or Gated
 *              DeltaNet) [-> post norm] -> residual
 *              -> norm -> MLP (dense or MoE) [-> post norm] -> residual
 *              [-> per-layer input block] [* layer scalar]
 *   final norm -> head [-> softcap] on the selected tokens.
 *
 * Attention covers GQA, partial/proportional rope per layer kind, q/k/v
 * norms, sliding windows, logit softcapping, output gates and KV shared
 * across layers; MoE (moe.c), Gated DeltaNet (linear_attn.c) and per-layer
 * inputs (ple.c) are blocks of their own, with their own state. */
#include "model/fwd_internal.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/fwd_buf.h"
#include "model/linear_attn.h"
#include "model/matmul.h"
#include "model/moe.h"
#include "model/ple.h"

/* Query rows (token x head) one attention task covers. Keys and values
 * are read once per task and reused by all of them while they sit in L1,
 * instead of once per query. */
#define ATT_SLOTS 32
/* Keys per chunk: the chunk's K rows as f32 (32 KiB at head_dim 128) stay
 * in L1 while every query row of the task is scored against them. */
#define ATT_CHUNK 64
/* A decode token whose span holds at least ATT_SPLIT keys attends by
 * position chunks of ATT_SPLIT_CHUNK over all KV heads: a task reads
 * whole KV rows in order, where a task per head reads a head_dim slice of
 * every row (512 B out of each 4 KB at Qwen3-0.6B), which the prefetchers
 * serve badly. The span is fixed, not scaled by the threads, so that a
 * token's bits do not depend on them. LOOM_ATTN_SPLIT=n sets it (0:
 * never). */
#define ATT_SPLIT 256
#define ATT_SPLIT_CHUNK 256
/* Positions whose rows (all heads) a chunk task gathers per matmul. */
#define ATT_SPLIT_SUB 32

loom_status loom_fwd_state_create(const loom_model *m, int step_tokens, int max_ctx,
                                  loom_fwd_state **out) {
    *out = NULL;
    const loom_config *c = &m->cfg;
    if (step_tokens <= 0 || max_ctx <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG,
                        "forward state: step_tokens and max_ctx must be positive");
    loom_fwd_state *s = calloc(1, sizeof *s);
    if (!s) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    size_t T = (size_t)step_tokens, H = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * (size_t)LOOM_MAX(m->max_head_dim, 1);
    size_t kvd = (size_t)m->kv_dim, I = (size_t)LOOM_MAX(m->max_inter, 1);
    s->step_tokens = step_tokens;
    s->max_ctx = max_ctx;
    s->n_threads = loom_pool_size(m->pool);
    s->max_rot = 2;
    for (int i = 0; i < m->n_ropes; i++) s->max_rot = LOOM_MAX(s->max_rot, m->ropes[i].rot_dim);
    size_t half = (size_t)s->max_rot / 2 * (size_t)LOOM_MAX_ROPES;
    loom_fwd_bufs *b = &s->mem;
    LOOM_FWD_BUF(b, s->x, T * H);
    LOOM_FWD_BUF(b, s->xb, T * H);
    LOOM_FWD_BUF(b, s->qraw, T * (size_t)LOOM_MAX(m->max_q_dim, 1));
    LOOM_FWD_BUF(b, s->q, T * qd);
    LOOM_FWD_BUF(b, s->gate, T * qd);
    LOOM_FWD_BUF(b, s->kx, T * kvd);
    LOOM_FWD_BUF(b, s->vx, T * kvd);
    LOOM_FWD_BUF(b, s->att, T * qd);
    LOOM_FWD_BUF(b, s->hb, T * I);
    LOOM_FWD_BUF(b, s->hb2, T * I);
    LOOM_FWD_BUF(b, s->cos, T * half);
    LOOM_FWD_BUF(b, s->sin, T * half);
    /* ATT_SLOTS query rows per task, or a whole group when it is larger */
    s->att_slots = LOOM_MAX(ATT_SLOTS, c->n_heads);
    LOOM_FWD_BUF(b, s->scores, (size_t)s->n_threads * (size_t)s->att_slots * (size_t)max_ctx);
    LOOM_FWD_BUF(b, s->tiles, 2 * T);
    /* q rows and output (slots, head_dim each), a K chunk (ATT_CHUNK,
     * head_dim), then the slots' key ranges (2 ints each) */
    s->att_tmp_per = (2 * (size_t)s->att_slots + ATT_CHUNK) * (size_t)LOOM_MAX(m->max_head_dim, 1) +
                     2 * (size_t)s->att_slots;
    LOOM_FWD_BUF(b, s->att_tmp, (size_t)s->n_threads * s->att_tmp_per);
    s->att_split = ATT_SPLIT;
    const char *env = getenv("LOOM_ATTN_SPLIT");
    if (env && *env) s->att_split = LOOM_MAX(0, atoi(env));
    s->att_chunk = ATT_SPLIT_CHUNK;
    /* every chunk of a max_ctx span, or more when they are few */
    s->att_parts = LOOM_MAX(64, max_ctx / ATT_SPLIT_CHUNK + 2);
    LOOM_FWD_BUF(b, s->att_part, (size_t)s->att_parts * (size_t)c->n_heads *
                                     ((size_t)LOOM_MAX(m->max_head_dim, 1) + 2));
    LOOM_FWD_BUF(b, s->split_task, 3 * (size_t)s->att_parts);
    LOOM_FWD_BUF(b, s->split_tok, T);
    s->split_tmp_per = (size_t)ATT_SPLIT_SUB * kvd + 2 * (size_t)c->n_heads;
    LOOM_FWD_BUF(b, s->split_tmp, (size_t)s->n_threads * s->split_tmp_per);
    LOOM_FWD_BUF(b, s->tok_row, T);
    LOOM_FWD_BUF(b, s->tok_pos, T);
    LOOM_FWD_BUF(b, s->rot_pos, 3 * T);
    LOOM_FWD_BUF(b, s->tok_first, T);
    LOOM_FWD_BUF(b, s->tok_last, T);
    /* each feature's state only where the model has it */
    if (m->n_linear > 0) s->lin = loom_lin_state_create(m, step_tokens, b);
    if (c->n_experts > 0) s->moe = loom_moe_state_create(m, step_tokens, b);
    if (m->has_ple) s->ple = loom_ple_state_create(m, step_tokens, b);
    if (b->failed) {
        loom_fwd_state_free(s);
        return loom_err(LOOM_ERR_NOMEM, "forward state: out of memory for %d tokens", step_tokens);
    }
    *out = s;
    return LOOM_OK;
}

void loom_fwd_state_free(loom_fwd_state *s) {
    if (!s) return;
    loom_fwd_bufs_free(&s->mem);
    loom_free(s->logits);
    free(s);
}

/* ---- small helpers ------------------------------------------------------ */

static void add_bias(float *y, const float *b, int T, int n) {
    if (!b) return;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

/* ---- attention --------------------------------------------------------- */

typedef struct attn_job {
    loom_model *m;
    loom_fwd_state *s;
    loom_kv_layout *kv;
    const loom_fwd_row *rows;
    const loom_attn *A;
    const int *tiles;        /* [2 * n_tiles] token ranges [ta, tb) of one row */
    int n_plain;             /* tasks of attn_task first, then split_task's */
} attn_job;

/* Head kh's slice of a K or V row of layer l as f32 into dst. */
static void kv_slice(const loom_kv_layout *kv, int l, const void *row, int kh, int hd, float *dst) {
    if (kv->layer[l].type == LOOM_KV_F32)
        memcpy(dst, (const float *)row + (size_t)kh * hd, sizeof(float) * (size_t)hd);
    else
        loom_kv_layer_load(kv, l, row, kh * hd, hd, dst);
}

/* Rows [p0, p0 + n) of KV head kh's keys (vals: values) as f32, *ld apart:
 * in place where the layer stores f32, in_place allows it and the rows lie
 * in one block; else widened or copied into buf (n rows of head_dim). */
static const float *kv_rows(const attn_job *j, const loom_kv_seq *seq, int kh, int vals, int p0,
                            int n, float *buf, int in_place, int *ld) {
    const loom_kv_layout *kv = j->kv;
    int l = j->A->kv_layer, hd = j->A->head_dim, f32 = kv->layer[l].type == LOOM_KV_F32;
    if (in_place && f32 && p0 / kv->block_size == (p0 + n - 1) / kv->block_size) {
        *ld = kv->kv_dim;
        return (const float *)(vals ? loom_kv_v_row(kv, seq, l, p0) : loom_kv_k_row(kv, seq, l, p0)) +
               (size_t)kh * hd;
    }
    for (int i = 0; i < n; i++)
        kv_slice(kv, l, vals ? loom_kv_v_row(kv, seq, l, p0 + i) : loom_kv_k_row(kv, seq, l, p0 + i),
                 kh, hd, buf + (size_t)i * hd);
    *ld = hd;
    return buf;
}

/* The q rows of tokens [ta, tb) for KV head kh's group into dst, (slots,
 * hd); tile_att_put puts such rows back into s->att. */
static void tile_q_get(const loom_fwd_state *s, int nh, int kh, int group, int hd, int ta, int tb,
                       float *dst) {
    for (int t = ta; t < tb; t++)
        memcpy(dst + (size_t)(t - ta) * group * hd, s->q + ((size_t)t * nh + kh * group) * hd,
               sizeof(float) * (size_t)group * hd);
}

static void tile_att_put(loom_fwd_state *s, int nh, int kh, int group, int hd, int ta, int tb,
                         const float *src) {
    for (int t = ta; t < tb; t++)
        memcpy(s->att + ((size_t)t * nh + kh * group) * hd, src + (size_t)(t - ta) * group * hd,
               sizeof(float) * (size_t)group * hd);
}

/* The first key a query at pos attends to (its sliding window). */
static int key_lo(const loom_attn *A, int pos) {
    return A->window > 0 ? LOOM_MAX(0, pos - A->window + 1) : 0;
}

/* Token t's keys [tok_lo, tok_hi]: causal inside its window, and its whole
 * bidirectional span (which sees itself whatever the window). */
static int tok_lo(const loom_attn *A, const loom_fwd_state *s, int t) {
    return LOOM_MIN(key_lo(A, s->tok_pos[t]), s->tok_first[t]);
}
static int tok_hi(const loom_fwd_state *s, int t) { return s->tok_last[t]; }

/* Chunks of ch positions a split decode token at pos spans. */
static int split_chunks(const loom_attn *A, int pos, int ch) {
    return pos / ch - key_lo(A, pos) / ch + 1;
}

/* Raw scores scaled and softcapped in place. */
static void score_scale(float *row, int n, float scale, float cap) {
    for (int i = 0; i < n; i++) {
        float v = row[i] * scale;
        row[i] = cap > 0 ? tanhf(v / cap) * cap : v;
    }
}

/* A query's raw scores over its own keys: scaled, softcapped, softmaxed. */
static void score_softmax(const loom_kernels *k, float *row, int n, float scale, float cap) {
    score_scale(row, n, scale, cap);
    k->softmax(row, n);
}

/* One task = a tile of consecutive tokens of one row and one KV head, with
 * the q heads of its group. Chunks of keys are gathered as f32 and every
 * query row of the tile is scored against them in one matmul_f32 (whose
 * sums do not depend on the rows beside them), then attn_pv adds the
 * weighted values for all rows while each V row is loaded once, one FMA
 * per key in order. Every query computes exactly what it would alone (a
 * decode row among a batch, or a prompt token in a chunk of another size). */
static void attn_task(void *ctx, int task, int thread) {
    const attn_job *j = ctx;
    const loom_config *c = &j->m->cfg;
    const loom_kernels *k = j->m->k;
    const loom_attn *A = j->A;
    loom_fwd_state *s = j->s;
    int hd = A->head_dim, nh = c->n_heads, n_kv = A->n_kv_heads, group = nh / n_kv;
    int kh = task % n_kv, ta = j->tiles[2 * (task / n_kv)], tb = j->tiles[2 * (task / n_kv) + 1];
    int slots = (tb - ta) * group;
    const loom_kv_seq *seq = j->rows[s->tok_row[ta]].seq;
    int lo0 = tok_lo(A, s, ta), pos1 = tok_hi(s, ta);
    for (int t = ta + 1; t < tb; t++) {
        lo0 = LOOM_MIN(lo0, tok_lo(A, s, t));
        pos1 = LOOM_MAX(pos1, tok_hi(s, t));
    }
    int span = pos1 - lo0 + 1;
    size_t smax = (size_t)s->att_slots;
    float *sc = s->scores + (size_t)thread * smax * s->max_ctx;
    float cap = (float)c->attn_softcap;
    float *tmp = s->att_tmp + (size_t)thread * s->att_tmp_per;
    float *kc = tmp + 2 * smax * hd; /* (ATT_CHUNK, hd): a chunk of K or V */
    int *keys = (int *)(kc + (size_t)ATT_CHUNK * hd);
    /* One token's group rows are adjacent in s->q and s->att; a tile of
     * several tokens goes through (slots, hd) copies. */
    const float *qs = s->q + ((size_t)ta * nh + kh * group) * hd;
    float *out = s->att + ((size_t)ta * nh + kh * group) * hd;
    if (tb - ta > 1) {
        tile_q_get(s, nh, kh, group, hd, ta, tb, tmp);
        qs = tmp;
        out = tmp + smax * hd;
    }
    for (int p0 = lo0; p0 <= pos1; p0 += ATT_CHUNK) {
        int cn = LOOM_MIN(ATT_CHUNK, pos1 - p0 + 1), ld;
        const float *kr = kv_rows(j, seq, kh, 0, p0, cn, kc, 0, &ld);
        k->matmul_f32(sc + (p0 - lo0), span, qs, hd, kr, hd, slots, 0, cn);
    }
    for (int t = ta; t < tb; t++) {
        int hi = tok_hi(s, t), lo = tok_lo(A, s, t);
        for (int g = 0; g < group; g++)
            score_softmax(k, sc + (size_t)((t - ta) * group + g) * span + (lo - lo0), hi - lo + 1,
                          A->scale, cap);
    }
    memset(out, 0, sizeof(float) * (size_t)slots * hd);
    for (int p0 = lo0, p1; p0 <= pos1; p0 = p1) {
        /* f32 values are read in place, one block at a time */
        p1 = LOOM_MIN(p0 + ATT_CHUNK, pos1 + 1);
        if (j->kv->layer[A->kv_layer].type == LOOM_KV_F32)
            p1 = LOOM_MIN(p1, (p0 / j->kv->block_size + 1) * j->kv->block_size);
        int ld;
        const float *vr = kv_rows(j, seq, kh, 1, p0, p1 - p0, kc, 1, &ld);
        for (int t = ta; t < tb; t++) {
            int hi = tok_hi(s, t), lo = tok_lo(A, s, t);
            int a = LOOM_MIN(LOOM_MAX(lo, p0), p1) - p0, b = LOOM_MAX(LOOM_MIN(hi + 1, p1) - p0, a);
            for (int g = 0; g < group; g++) {
                keys[2 * ((t - ta) * group + g)] = a;
                keys[2 * ((t - ta) * group + g) + 1] = b;
            }
        }
        k->attn_pv(out, hd, sc + (p0 - lo0), span, keys, slots, vr, ld, p1 - p0, hd);
    }
    if (tb - ta > 1) tile_att_put(s, nh, kh, group, hd, ta, tb, out);
}

/* Rows [a, b) of all KV heads as f32 into dst, head kh's at dst + kh *
 * ATT_SPLIT_SUB * hd: each row is read once, in order. */
static void split_rows(const attn_job *j, const loom_kv_seq *seq, int vals, int a, int b,
                       float *dst) {
    const loom_kv_layout *kv = j->kv;
    int l = j->A->kv_layer, hd = j->A->head_dim, nkv = j->A->n_kv_heads;
    for (int p = a; p < b; p++) {
        const void *row = vals ? loom_kv_v_row(kv, seq, l, p) : loom_kv_k_row(kv, seq, l, p);
        for (int kh = 0; kh < nkv; kh++)
            kv_slice(kv, l, row, kh, hd, dst + ((size_t)kh * ATT_SPLIT_SUB + (size_t)(p - a)) * hd);
    }
}

/* One task = one decode token's keys [p0, p1) (a chunk on a grid of
 * att_chunk positions) for all its heads: per query head, the softmax over
 * the chunk alone, its max and sum, and the values weighted by it; the
 * chunks are combined afterwards (split_combine). */
static void split_task(const attn_job *j, int task, int thread) {
    const loom_config *c = &j->m->cfg;
    const loom_kernels *k = j->m->k;
    const loom_attn *A = j->A;
    const loom_kv_layout *kv = j->kv;
    loom_fwd_state *s = j->s;
    int hd = A->head_dim, nh = c->n_heads, nkv = A->n_kv_heads, group = nh / nkv;
    int t = s->split_task[3 * task], p0 = s->split_task[3 * task + 1];
    int p1 = s->split_task[3 * task + 2], n = p1 - p0;
    const loom_kv_seq *seq = j->rows[s->tok_row[t]].seq;
    float *sc = s->scores + (size_t)thread * s->att_slots * s->max_ctx; /* (nh, n) */
    float *buf = s->split_tmp + (size_t)thread * s->split_tmp_per;
    int *keys = (int *)(buf + (size_t)ATT_SPLIT_SUB * nkv * hd);
    float *acc = s->att_part + (size_t)task * nh * (hd + 2), *mx = acc + (size_t)nh * hd;
    float *sum = mx + nh, cap = (float)c->attn_softcap;
    const float *q = s->q + (size_t)t * nh * hd;
    for (int a = p0; a < p1; a += ATT_SPLIT_SUB) {
        int b = LOOM_MIN(a + ATT_SPLIT_SUB, p1);
        split_rows(j, seq, 0, a, b, buf);
        for (int kh = 0; kh < nkv; kh++)
            k->matmul_f32(sc + (size_t)kh * group * n + (a - p0), n, q + (size_t)kh * group * hd, hd,
                          buf + (size_t)kh * ATT_SPLIT_SUB * hd, hd, group, 0, b - a);
    }
    for (int h = 0; h < nh; h++) {
        float *row = sc + (size_t)h * n;
        score_scale(row, n, A->scale, cap);
        int am = loom_argmax(row, n);
        mx[h] = row[am];
        k->softmax(row, n);
        sum[h] = 1.0f / row[am]; /* sum of e^(x - m): the max's weight is 1 / sum */
    }
    memset(acc, 0, sizeof(float) * (size_t)nh * hd);
    int f32 = kv->layer[A->kv_layer].type == LOOM_KV_F32;
    for (int a = p0, b; a < p1; a = b) {
        /* f32 values are read in place, one block at a time */
        const float *vr;
        int ld;
        if (f32) {
            b = LOOM_MIN(p1, (a / kv->block_size + 1) * kv->block_size);
            vr = loom_kv_v_row(kv, seq, A->kv_layer, a);
            ld = kv->kv_dim;
        } else {
            b = LOOM_MIN(a + ATT_SPLIT_SUB, p1);
            split_rows(j, seq, 1, a, b, buf);
            vr = buf;
            ld = hd;
        }
        for (int g = 0; g < group; g++) {
            keys[2 * g] = 0;
            keys[2 * g + 1] = b - a;
        }
        for (int kh = 0; kh < nkv; kh++)
            k->attn_pv(acc + (size_t)kh * group * hd, hd, sc + (size_t)kh * group * n + (a - p0), n,
                       keys, group, vr + (size_t)kh * (size_t)(f32 ? hd : ATT_SPLIT_SUB * hd), ld,
                       b - a, hd);
    }
}

static void attn_any(void *ctx, int task, int thread) {
    const attn_job *j = ctx;
    if (task < j->n_plain) attn_task(ctx, task, thread);
    else split_task(j, task - j->n_plain, thread);
}

/* Token t's output from its chunks' partial results [first, first + n), in
 * chunk order: out = sum_c e^(m_c - M) l_c o_c / sum_c e^(m_c - M) l_c. */
static void split_combine(loom_fwd_state *s, int nh, int hd, int t, int first, int n) {
    for (int h = 0; h < nh; h++) {
        float M = -INFINITY, den = 0;
        for (int ci = first; ci < first + n; ci++) {
            const float *mx = s->att_part + (size_t)ci * nh * (hd + 2) + (size_t)nh * hd;
            M = LOOM_MAX(M, mx[h]);
        }
        for (int ci = first; ci < first + n; ci++) {
            const float *mx = s->att_part + (size_t)ci * nh * (hd + 2) + (size_t)nh * hd;
            den += expf(mx[h] - M) * mx[nh + h];
        }
        float *out = s->att + ((size_t)t * nh + h) * hd;
        memset(out, 0, sizeof(float) * (size_t)hd);
        for (int ci = first; ci < first + n; ci++) {
            const float *acc = s->att_part + (size_t)ci * nh * (hd + 2);
            const float *mx = acc + (size_t)nh * hd;
            float w = expf(mx[h] - M) * mx[nh + h] / den;
            for (int d = 0; d < hd; d++) out[d] += w * acc[(size_t)h * hd + d];
        }
    }
}

static void rope_tables(loom_model *m, loom_fwd_state *s, int T) {
    int half_max = s->max_rot / 2;
    for (int r = 0; r < m->n_ropes; r++) {
        const loom_rope *R = &m->ropes[r];
        float *cs = s->cos + (size_t)r * s->step_tokens * half_max;
        float *sn = s->sin + (size_t)r * s->step_tokens * half_max;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < R->rot_dim / 2; i++) {
                /* Angles in double: positions reach 1e5+ and f32 loses the phase. */
                int k = R->stream ? R->stream[i] : 0;
                double a = (double)s->rot_pos[3 * t + k] * R->inv_freq[i];
                cs[(size_t)t * half_max + i] = (float)(cos(a) * R->scale);
                sn[(size_t)t * half_max + i] = (float)(sin(a) * R->scale);
            }
    }
}

/* Rotate-half rope on the first rot dims of one head vector. */
static void rope_apply(float *v, const float *cs, const float *sn, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

/* Softmax attention block: s->xb (normed input) -> s->xb. */
static void attention(loom_model *m, loom_fwd_state *s, loom_kv_layout *kv,
                      const loom_fwd_row *rows, const loom_layer *L, int l, int T) {
    const loom_config *c = &m->cfg;
    const loom_attn *A = &L->attn;
    unsigned fl = m->arch->flags;
    int hd = A->head_dim, nh = c->n_heads, nkv = A->n_kv_heads;
    int qd = nh * hd, kvd = nkv * hd, gated = (fl & LOOM_ARCH_ATTN_GATE) != 0;
    float eps = (float)c->rms_eps;
    int shared = A->kv_layer != l;

    /* q, and k and v unless an earlier layer's are shared, in one dispatch */
    float *ys[] = {gated ? s->qraw : s->q, s->kx, s->vx};
    const loom_weight *ws[] = {&A->wq, &A->wk, &A->wv};
    loom_fwd_matmul_n(m, shared ? 1 : A->k_eq_v ? 2 : 3, ys, s->xb, ws, T);
    add_bias(gated ? s->qraw : s->q, A->bq, T, A->wq.rows);
    if (gated)  /* per head: [query (hd) | gate (hd)] */
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                const float *src = s->qraw + (size_t)t * 2 * qd + (size_t)h * 2 * hd;
                memcpy(s->q + (size_t)t * qd + (size_t)h * hd, src, sizeof(float) * (size_t)hd);
                memcpy(s->gate + (size_t)t * qd + (size_t)h * hd, src + hd, sizeof(float) * (size_t)hd);
            }
    if (!shared) {
        add_bias(s->kx, A->bk, T, kvd);
        if (A->k_eq_v) memcpy(s->vx, s->kx, sizeof(float) * (size_t)T * kvd);
        else add_bias(s->vx, A->bv, T, kvd);
    }
    const loom_rope *R = &m->ropes[A->rope];
    int half_max = s->max_rot / 2;
    const float *cos_t = s->cos + (size_t)A->rope * s->step_tokens * half_max;
    const float *sin_t = s->sin + (size_t)A->rope * s->step_tokens * half_max;
    for (int t = 0; t < T; t++) {
        const float *cs = cos_t + (size_t)t * half_max, *sn = sin_t + (size_t)t * half_max;
        for (int h = 0; h < nh; h++) {
            float *q = s->q + ((size_t)t * nh + h) * hd;
            if (A->q_norm) m->k->rmsnorm(q, q, A->q_norm, hd, eps);
            rope_apply(q, cs, sn, R->rot_dim);
        }
        if (shared) continue;
        for (int h = 0; h < nkv; h++) {
            float *k = s->kx + ((size_t)t * nkv + h) * hd;
            if (A->k_norm) m->k->rmsnorm(k, k, A->k_norm, hd, eps);
            rope_apply(k, cs, sn, R->rot_dim);
            if (fl & LOOM_ARCH_V_NORM) loom_fwd_rms_plain(s->vx + ((size_t)t * nkv + h) * hd, hd, eps);
        }
        const loom_kv_seq *seq = rows[s->tok_row[t]].seq;
        loom_kv_layer_store(kv, l, loom_kv_k_row(kv, seq, l, s->tok_pos[t]), s->kx + (size_t)t * kvd, kvd);
        loom_kv_layer_store(kv, l, loom_kv_v_row(kv, seq, l, s->tok_pos[t]), s->vx + (size_t)t * kvd, kvd);
    }
    /* Tiles of consecutive tokens of the same row; a tile's scores must
     * fit ATT_SLOTS query rows of max_ctx scores. A decode token with a
     * long span goes by chunks instead (split_task). */
    int per_tile = LOOM_MAX(1, ATT_SLOTS / (nh / nkv)), n_tiles = 0, n_split = 0;
    int ch = LOOM_MAX(1, s->att_chunk);
    for (int t = 0; t < T;) {
        int tb = t + 1;
        while (tb < T && tb - t < per_tile && s->tok_row[tb] == s->tok_row[t]) tb++;
        int pos = s->tok_pos[t];
        /* a verification row's several tokens share tiles: they read each
         * key once for all of them, which chunks would not */
        const loom_fwd_row *row = &rows[s->tok_row[t]];
        if (row->n == 1 && row->decode && s->att_split > 0 &&
            pos - key_lo(A, pos) + 1 >= s->att_split && split_chunks(A, pos, ch) <= s->att_parts) {
            s->split_tok[n_split++] = t;
            s->att_split_tokens++;
        } else {
            s->tiles[2 * n_tiles] = t;
            s->tiles[2 * n_tiles + 1] = tb;
            n_tiles++;
        }
        t = tb;
    }
    attn_job aj = {m, s, kv, rows, A, s->tiles, n_tiles * nkv};
    /* Dispatches of as many chunks as att_part holds, chunk bounds on a
     * grid of positions: a token's bits do not depend on its batch. */
    for (int i0 = 0; i0 == 0 || i0 < n_split;) {
        int i1 = i0, n_parts = 0;
        for (; i1 < n_split; i1++) {
            int t = s->split_tok[i1], pos = s->tok_pos[t], lo = key_lo(A, pos);
            if (n_parts + split_chunks(A, pos, ch) > s->att_parts) break;
            for (int c0 = lo / ch; c0 <= pos / ch; c0++) {
                int *tk = s->split_task + 3 * n_parts++;
                tk[0] = t;
                tk[1] = LOOM_MAX(lo, c0 * ch);
                tk[2] = LOOM_MIN(pos + 1, (c0 + 1) * ch);
            }
        }
        loom_pool_run(m->pool, aj.n_plain + n_parts, attn_any, &aj);
        for (int i = i0, first = 0; i < i1; i++) {
            int t = s->split_tok[i], n = split_chunks(A, s->tok_pos[t], ch);
            split_combine(s, nh, hd, t, first, n);
            first += n;
        }
        aj.n_plain = 0;
        if (i1 == i0) break;
        i0 = i1;
    }
    if (gated)
        for (size_t i = 0; i < (size_t)T * qd; i++) s->att[i] *= 1.0f / (1.0f + expf(-s->gate[i]));
    loom_fwd_matmul(m, s->xb, s->att, &A->wo, T);
    add_bias(s->xb, A->bo, T, c->hidden_size);
}

/* ---- MLP and MoE ------------------------------------------------------- */

/* The gated MLP over the state's (T, max_inter) scratch. */
static void mlp(loom_model *m, loom_fwd_state *s, const loom_mlp *p, float *out, const float *in,
                int T) {
    loom_fwd_mlp(m, p, out, in, T, s->hb, s->hb2);
}

/* Gemma 4 feed-forward with the MoE block beside the dense MLP:
 * post1(mlp(pre(x))) + the MoE block's output -> s->xb. */
static void ffn_moe_beside(loom_model *m, loom_fwd_state *s, const loom_layer *L, int T) {
    int H = m->cfg.hidden_size;
    loom_fwd_norm_rows(m, s->xb, s->x, L->ffn_norm, T, H);
    mlp(m, s, &L->mlp, s->xb, s->xb, T);
    loom_fwd_norm_rows(m, s->xb, s->xb, L->post_ffn_norm1, T, H);
    loom_moe_beside(m, s->moe, L, s->x, s->xb, T, s->hb, s->hb2);
}

/* ---- the pass ------------------------------------------------------------ */

/* Token i of row r (the step's token t): its layer-0 input into s->x and
 * its rope positions, from the row's prepared input where it has one. */
static void token_input(const loom_model *m, loom_fwd_state *s, const loom_fwd_row *r, int i,
                        int t) {
    int H = m->cfg.hidden_size;
    float *x = s->x + (size_t)t * H;
    if (r->embeds) {
        memcpy(x, r->embeds + (size_t)i * H, sizeof(float) * (size_t)H);
    } else {
        loom_fwd_weight_row(m, &m->embed, x, r->tokens[i]);
        if (m->embed_scale != 1.0f)
            for (int j = 0; j < H; j++) x[j] *= m->embed_scale;
    }
    for (int k = 0; k < 3; k++)
        s->rot_pos[3 * t + k] = r->pos3 ? r->pos3[(size_t)k * r->pos_ld + i]
                                        : s->tok_pos[t] + r->pos_delta;
}

/* Deepstack: after layer l, row r's features of plane l added to its
 * tokens' hidden states (zero rows at text tokens leave them as they are). */
static void add_deepstack(const loom_model *m, loom_fwd_state *s, const loom_fwd_row *rows,
                          int n_rows, int l) {
    int H = m->cfg.hidden_size;
    for (int r = 0, t = 0; r < n_rows; t += rows[r].n, r++) {
        const loom_fwd_row *row = &rows[r];
        if (!row->deepstack || l >= row->n_deep) continue;
        const float *d = row->deepstack + (size_t)l * row->pos_ld * H;
        for (size_t i = 0; i < (size_t)row->n * H; i++) s->x[(size_t)t * H + i] += d[i];
    }
}

/* Each token's key bounds from its row's bidirectional spans; a span lies
 * whole inside its row (loom_fwd_check_rows). */
static void spans(loom_fwd_state *s, const loom_fwd_row *rows, int n_rows) {
    for (int r = 0, t0 = 0; r < n_rows; t0 += rows[r].n, r++) {
        const int32_t *g = rows[r].groups;
        int p0 = rows[r].seq->n_tokens, n = rows[r].n;
        for (int a = 0, b; g && a < n; a = b) {
            for (b = a + 1; g[a] >= 0 && b < n && g[b] == g[a];) b++;
            if (g[a] < 0) continue;
            for (int i = a; i < b; i++) {
                s->tok_first[t0 + i] = p0 + a;
                s->tok_last[t0 + i] = p0 + b - 1;
            }
        }
    }
}

loom_status loom_fwd_check_rows(const loom_model *m, const loom_fwd_row *rows, int n_rows,
                                int block_size, int max_ctx, int step_tokens, int *total) {
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
        if (end > max_ctx)
            return loom_err(LOOM_ERR_RANGE, "forward: sequence would hold %d tokens, limit %d",
                            end, max_ctx);
        if ((end + block_size - 1) / block_size > row->seq->n_blocks)
            return loom_err(LOOM_ERR_INTERNAL, "forward: row %d has no KV blocks reserved", r);
        if ((row->pos3 || row->deepstack || row->groups) && row->pos_ld < row->pos_off + row->n)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d covers tokens [%d, %d) of its "
                            "prepared arrays, whose stride is %d", r, row->pos_off,
                            row->pos_off + row->n, row->pos_ld);
        if (row->deepstack && row->n_deep > m->cfg.n_layers)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d has %d deepstack planes, the "
                            "model %d layers", r, row->n_deep, m->cfg.n_layers);
        if (row->logits != LOOM_LOGITS_NONE && !row->out)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d wants logits but has no buffer", r);
        const int32_t *g = row->groups;
        if (g && row->pos_off > 0 && g[0] >= 0 && g[-1] == g[0])
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d starts at position %d inside "
                            "the bidirectional span %d (an image's tokens must be computed in "
                            "one row)", r, row->seq->n_tokens, g[0]);
        if (g && row->pos_off + row->n < row->pos_ld && g[row->n] >= 0 &&
            g[row->n - 1] == g[row->n])
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d ends at position %d inside "
                            "the bidirectional span %d (an image's tokens must be computed in "
                            "one row)", r, end, g[row->n]);
        for (int j = 0; j < r; j++)
            if (rows[j].seq == row->seq)
                return loom_err(LOOM_ERR_INVALID_ARG, "forward: rows %d and %d extend the same "
                                "sequence", j, r);
        T += row->n;
    }
    if (T > step_tokens)
        return loom_err(LOOM_ERR_INVALID_ARG, "forward: %d tokens in one batch, limit %d",
                        T, step_tokens);
    *total = T;
    return LOOM_OK;
}

static loom_status check_rows(const loom_model *m, const loom_fwd_state *s,
                              const loom_kv_layout *kv, const loom_fwd_row *rows,
                              int n_rows, int *total) {
    if (kv->kv_dim < m->kv_dim || kv->n_layers < m->cfg.n_layers)
        return loom_err(LOOM_ERR_INVALID_ARG, "forward: KV pool has %d layers of width %d, model "
                        "needs %d of width %d", kv->n_layers, kv->kv_dim, m->cfg.n_layers,
                        m->kv_dim);
    return loom_fwd_check_rows(m, rows, n_rows, kv->block_size, s->max_ctx, s->step_tokens, total);
}

void loom_fwd_set_taps(loom_fwd_state *s, const int *layers, int n, float *out) {
    s->tap_layers = layers;
    s->n_taps = out ? n : 0;
    s->taps = out;
}

/* Copies the hidden states after layer l (x [T, H]) to the taps asked for. */
static void export_taps(const loom_fwd_state *s, int l, int T, int H) {
    for (int k = 0; k < s->n_taps; k++) {
        if (s->tap_layers[k] != l) continue;
        for (int t = 0; t < T; t++)
            memcpy(s->taps + ((size_t)t * s->n_taps + k) * H, s->x + (size_t)t * H, sizeof(float) * H);
    }
}

loom_status loom_forward(loom_model *m, loom_fwd_state *s, loom_kv_layout *kv,
                         loom_fwd_row *rows, int n_rows) {
    const loom_config *c = &m->cfg;
    int T = 0;
    loom_status st = check_rows(m, s, kv, rows, n_rows, &T);
    if (st == LOOM_OK) st = loom_fwd_check_states(m, rows, n_rows);
    if (st != LOOM_OK) return st;
    int H = c->hidden_size;

    int n_sel = 0;
    for (int r = 0, t = 0; r < n_rows; r++) {
        for (int i = 0; i < rows[r].n; i++, t++) {
            s->tok_row[t] = r;
            s->tok_pos[t] = rows[r].seq->n_tokens + i;
            token_input(m, s, &rows[r], i, t);
            s->tok_first[t] = s->tok_last[t] = s->tok_pos[t];
        }
        n_sel += loom_fwd_row_logits(&rows[r]);
    }
    spans(s, rows, n_rows);
    size_t need = (size_t)n_sel * (size_t)c->vocab_size;
    if (need > s->logits_cap) {
        float *nl = loom_alloc(need * 4);
        if (!nl) return loom_err(LOOM_ERR_NOMEM, "forward: out of memory for logits");
        loom_free(s->logits);
        s->logits = nl;
        s->logits_cap = need;
    }
    rope_tables(m, s, T);
    if (m->has_ple) loom_ple_inputs(m, s->ple, s->x, rows, n_rows, T);

    for (int l = 0; l < c->n_layers; l++) {
        const loom_layer *L = &m->layers[l];
        loom_fwd_norm_rows(m, s->xb, s->x, L->attn_norm, T, H);
        if (L->kind == LOOM_LAYER_LINEAR) loom_lin_forward(m, s->lin, rows, n_rows, L, s->xb, T);
        else attention(m, s, kv, rows, L, l, T);
        if (L->post_attn_norm) loom_fwd_norm_rows(m, s->xb, s->xb, L->post_attn_norm, T, H);
        for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->xb[i];

        if (L->moe_beside) {
            ffn_moe_beside(m, s, L, T);
        } else {
            loom_fwd_norm_rows(m, s->xb, s->x, L->ffn_norm, T, H);
            if (L->is_moe) {
                loom_moe_ffn(m, s->moe, &L->moe, s->xb, T, s->hb, s->hb2);
            } else {
                mlp(m, s, &L->mlp, s->xb, s->xb, T);
            }
        }
        if (L->post_ffn_norm) loom_fwd_norm_rows(m, s->xb, s->xb, L->post_ffn_norm, T, H);
        for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->xb[i];

        if (m->has_ple) loom_ple_block(m, s->ple, L, l, s->x, s->xb, T);
        if (L->out_scale != 1.0f)
            for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] *= L->out_scale;
        add_deepstack(m, s, rows, n_rows, l);
        export_taps(s, l, T, H);
    }

    /* Hidden states after the final norm, where a row asks for them. */
    for (int r = 0, t = 0; r < n_rows; t += rows[r].n, r++)
        for (int i = 0; rows[r].hidden && i < rows[r].n; i++)
            m->k->rmsnorm(rows[r].hidden + (size_t)i * H, s->x + (size_t)(t + i) * H, m->final_norm, H,
                          (float)c->rms_eps);
    /* Final norm and head only for the tokens whose logits are wanted. */
    if (n_sel > 0) {
        int j = 0;
        for (int r = 0, t = 0; r < n_rows; r++) {
            for (int i = 0; i < rows[r].n; i++, t++) {
                int want = rows[r].logits == LOOM_LOGITS_ALL ||
                           (rows[r].logits == LOOM_LOGITS_LAST && i == rows[r].n - 1);
                if (want)
                    m->k->rmsnorm(s->xb + (size_t)j++ * H, s->x + (size_t)t * H, m->final_norm, H,
                                  (float)c->rms_eps);
            }
        }
        loom_fwd_matmul(m, s->logits, s->xb, &m->lm_head, n_sel);
        size_t V = (size_t)c->vocab_size;
        if (c->final_softcap > 0) {
            float cap = (float)c->final_softcap;
            for (size_t i = 0; i < (size_t)n_sel * V; i++)
                s->logits[i] = tanhf(s->logits[i] / cap) * cap;
        }
        j = 0;
        for (int r = 0; r < n_rows; r++) {
            int cnt = loom_fwd_row_logits(&rows[r]);
            if (cnt) memcpy(rows[r].out, s->logits + (size_t)j * V, (size_t)cnt * V * 4);
            j += cnt;
        }
    }
    loom_fwd_commit_states(rows, n_rows);
    for (int r = 0; r < n_rows; r++) rows[r].seq->n_tokens += rows[r].n;
    return LOOM_OK;
}
