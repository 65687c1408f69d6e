/* linear_attn: Gated DeltaNet (Qwen3.5, Qwen3-Next) and the per-sequence
 * recurrent state it carries.
 *
 * Per token and value head h (key head h / (n_v / n_k)):
 *   [q|k|v] = silu(causal depthwise conv1d over the last `kernel` inputs)
 *   q, k    = l2norm(q) / sqrt(k_dim), l2norm(k)
 *   beta    = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
 *   S       = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q
 *   out     = rmsnorm(o) * w * silu(z)
 * Decode (one token) runs that recurrence. Prefill runs the chunked form:
 * within a chunk of C tokens with G = cumsum(g),
 *   u_i = beta_i (v_i - e^{G_i} S0^T k_i - sum_{j<i} e^{G_i-G_j} (k_i.k_j) u_j)
 *   o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i-G_j} (q_i.k_j) u_j
 *   S   = e^{G_C} S0 + sum_j e^{G_C-G_j} k_j u_j^T
 * which is the same recurrence regrouped (tests compare the two). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/fwd_buf.h"
#include "model/linear_attn.h"
#include "model/matmul.h"

#define DELTA_CHUNK 64   /* tokens per chunk of the chunked delta rule */

struct loom_lin_state {
    float *qkv;        /* (step_tokens, conv_dim) conv input [q | k | v] */
    double *conv;      /* (step_tokens, conv_dim) conv output, then normed q/k */
    float *z;          /* (step_tokens, n_v * v_dim) */
    float *b, *a;      /* (step_tokens, n_v) raw b and a */
    double *beta, *g;  /* (step_tokens, n_v) beta and log-decay */
    double *od;        /* (step_tokens, n_v * v_dim) delta-rule output */
    float *raw;        /* (step_tokens, conv_dim + n_v * v_dim + 2 n_v) grouped projections */
    float *out;        /* (step_tokens, n_v * v_dim) */
    double *scratch;   /* (n_threads, scratch_per) delta-rule workspace */
    size_t scratch_per;
    int *row_first;    /* [step_tokens] first token of each row */
};

struct loom_seq_state {
    int n_tokens;              /* tokens consumed */
    int n_slots;               /* linear layers */
    size_t conv_per, rec_per;  /* floats per slot */
    float *conv;               /* owned (n_slots, kernel - 1, conv_dim) oldest first */
    float *rec;                /* owned (n_slots, n_v, k_dim, v_dim) */
    loom_seq_state_dev *dev;   /* borrowed: the backend holding a device copy, or NULL */
    int dev_slot;              /* its slot there */
    int where;                 /* ST_* below: which copy is live */
};

/* With a device copy: the host arrays are newer (ST_HOST), the device
 * copy is (ST_DEV), or both are the same (ST_BOTH). Without: ST_HOST. */
enum { ST_HOST, ST_DEV, ST_BOTH };

/* Brings the host arrays up to date before the host reads them. */
static void host_current(const loom_seq_state *cst) {
    loom_seq_state *st = (loom_seq_state *)cst; /* the live copy moves; the value does not */
    if (!st->dev || st->where != ST_DEV) return;
    size_t conv = st->conv_per * (size_t)st->n_slots, rec = st->rec_per * (size_t)st->n_slots;
    if (st->dev->pull(st->dev, st->dev_slot, st->conv, conv, st->rec, rec) != LOOM_OK) {
        loom_log(LOOM_LOG_ERROR, "recurrent state: copy from the device failed: %s",
                 loom_last_error());
        return;
    }
    st->where = ST_BOTH;
}

/* The host is about to write its arrays. */
static void host_writes(loom_seq_state *st) { st->where = ST_HOST; }

int loom_seq_state_dev_slot(const loom_seq_state *st, const loom_seq_state_dev *d) {
    return st && d && st->dev == d ? st->dev_slot : -1;
}

void loom_seq_state_dev_bind(loom_seq_state *st, loom_seq_state_dev *d, int slot) {
    if (st->dev) {
        host_current(st);
        if (d) st->dev->release(st->dev, st->dev_slot);
    }
    st->dev = d;
    st->dev_slot = d ? slot : 0;
    st->where = ST_HOST;
}

const float *loom_seq_state_dev_stale(const loom_seq_state *st, size_t *conv_n,
                                      const float **rec, size_t *rec_n) {
    *conv_n = st->conv_per * (size_t)st->n_slots;
    *rec_n = st->rec_per * (size_t)st->n_slots;
    *rec = st->rec;
    return st->where == ST_HOST ? st->conv : NULL;
}

void loom_seq_state_dev_synced(loom_seq_state *st) { st->where = ST_BOTH; }

void loom_seq_state_dev_zeroed(loom_seq_state *st) {
    st->where = ST_DEV;
    st->n_tokens = 0;
}

void loom_seq_state_dev_advanced(loom_seq_state *st) { st->where = ST_DEV; }

static void state_sizes(const loom_model *m, size_t *conv, size_t *rec) {
    const loom_config *c = &m->cfg;
    *conv = (size_t)(c->lin_conv_kernel - 1) * (size_t)m->lin_conv_dim;
    *rec = (size_t)c->lin_n_v_heads * c->lin_k_head_dim * c->lin_v_head_dim;
}

size_t loom_seq_state_bytes(const loom_model *m) {
    if (m->n_linear == 0) return 0;
    size_t conv, rec;
    state_sizes(m, &conv, &rec);
    return sizeof(float) * (conv + rec) * (size_t)m->n_linear;
}

loom_status loom_seq_state_create(const loom_model *m, loom_seq_state **out) {
    *out = NULL;
    if (m->n_linear == 0) return LOOM_OK;
    loom_seq_state *st = calloc(1, sizeof *st);
    if (!st) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    state_sizes(m, &st->conv_per, &st->rec_per);
    st->n_slots = m->n_linear;
    st->conv = calloc(st->conv_per * (size_t)st->n_slots + 1, sizeof(float));
    st->rec = calloc(st->rec_per * (size_t)st->n_slots, sizeof(float));
    if (!st->conv || !st->rec) {
        loom_seq_state_free(st);
        return loom_err(LOOM_ERR_NOMEM, "recurrent state: out of memory");
    }
    *out = st;
    return LOOM_OK;
}

void loom_seq_state_free(loom_seq_state *st) {
    if (!st) return;
    if (st->dev) st->dev->release(st->dev, st->dev_slot);
    free(st->conv);
    free(st->rec);
    free(st);
}

void loom_seq_state_reset(loom_seq_state *st) {
    if (!st) return;
    host_writes(st);
    memset(st->conv, 0, sizeof(float) * st->conv_per * (size_t)st->n_slots);
    memset(st->rec, 0, sizeof(float) * st->rec_per * (size_t)st->n_slots);
    st->n_tokens = 0;
}

int loom_seq_state_tokens(const loom_seq_state *st) { return st ? st->n_tokens : 0; }

void loom_seq_state_save(const loom_seq_state *st, void *buf) {
    host_current(st);
    size_t conv = st->conv_per * (size_t)st->n_slots, rec = st->rec_per * (size_t)st->n_slots;
    memcpy(buf, st->conv, conv * sizeof(float));
    memcpy((float *)buf + conv, st->rec, rec * sizeof(float));
}

void loom_seq_state_load(loom_seq_state *st, const void *buf, int n_tokens) {
    host_writes(st);
    size_t conv = st->conv_per * (size_t)st->n_slots, rec = st->rec_per * (size_t)st->n_slots;
    memcpy(st->conv, buf, conv * sizeof(float));
    memcpy(st->rec, (const float *)buf + conv, rec * sizeof(float));
    st->n_tokens = n_tokens;
}

void loom_seq_state_copy(loom_seq_state *dst, const loom_seq_state *src) {
    host_current(src);
    host_writes(dst);
    memcpy(dst->conv, src->conv, sizeof(float) * src->conv_per * (size_t)src->n_slots);
    memcpy(dst->rec, src->rec, sizeof(float) * src->rec_per * (size_t)src->n_slots);
    dst->n_tokens = src->n_tokens;
}

loom_status loom_fwd_check_states(const loom_model *m, loom_fwd_row *rows, int n_rows) {
    if (m->n_linear == 0) return LOOM_OK;
    for (int r = 0; r < n_rows; r++) {
        const loom_seq_state *st = rows[r].state;
        if (!st)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d has no recurrent state (the "
                            "model has %d linear-attention layers)", r, m->n_linear);
        if (st->n_slots != m->n_linear)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d: recurrent state made for "
                            "another model", r);
        for (int j = 0; j < r; j++)
            if (rows[j].state == st)
                return loom_err(LOOM_ERR_INVALID_ARG, "forward: rows %d and %d share a recurrent "
                                "state", j, r);
        int n = rows[r].seq->n_tokens;
        if (n != 0 && st->n_tokens != n)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d: recurrent state holds %d "
                            "tokens, the sequence %d (linear-attention state cannot be rewound)",
                            r, st->n_tokens, n);
    }
    for (int r = 0; r < n_rows; r++) {
        /* the CPU forward reads and writes the host arrays */
        host_current(rows[r].state);
        host_writes(rows[r].state);
        if (rows[r].seq->n_tokens == 0 && rows[r].state->n_tokens != 0)
            loom_seq_state_reset(rows[r].state);
    }
    return LOOM_OK;
}

void loom_fwd_commit_states(loom_fwd_row *rows, int n_rows) {
    for (int r = 0; r < n_rows; r++)
        if (rows[r].state) rows[r].state->n_tokens += rows[r].n;
}

loom_lin_state *loom_lin_state_create(const loom_model *m, int step_tokens, loom_fwd_bufs *b) {
    const loom_config *c = &m->cfg;
    loom_lin_state *ls = loom_fwd_buf(b, sizeof *ls);
    if (!ls) return NULL;
    size_t T = (size_t)step_tokens, conv = (size_t)m->lin_conv_dim, nv = (size_t)c->lin_n_v_heads;
    size_t vd = nv * (size_t)c->lin_v_head_dim, C = DELTA_CHUNK;
    LOOM_FWD_BUF(b, ls->qkv, T * conv);
    LOOM_FWD_BUF(b, ls->conv, T * conv);
    LOOM_FWD_BUF(b, ls->z, T * vd);
    LOOM_FWD_BUF(b, ls->b, T * nv);
    LOOM_FWD_BUF(b, ls->a, T * nv);
    LOOM_FWD_BUF(b, ls->beta, T * nv);
    LOOM_FWD_BUF(b, ls->g, T * nv);
    LOOM_FWD_BUF(b, ls->od, T * vd);
    LOOM_FWD_BUF(b, ls->raw, T * (size_t)m->lin_proj_dim);
    LOOM_FWD_BUF(b, ls->out, T * vd);
    /* state (k_dim, v_dim), u (C, v_dim), G (C), tmp (v_dim) */
    ls->scratch_per = (size_t)c->lin_k_head_dim * c->lin_v_head_dim +
                      C * (size_t)c->lin_v_head_dim + C + (size_t)c->lin_v_head_dim + 8;
    LOOM_FWD_BUF(b, ls->scratch, (size_t)loom_pool_size(m->pool) * ls->scratch_per);
    LOOM_FWD_BUF(b, ls->row_first, T);
    return ls;
}

static double silu(double x) { return x / (1.0 + exp(-x)); }
static double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

/* Causal depthwise conv over one row's tokens, continuing from the row's
 * conv state; then rolls the state forward. in/out: (n, D). */
static void conv_row(const float *w, int K, int D, float *state, const float *in, double *out,
                     int n) {
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int src = i - (K - 1) + j;  /* index into this row; < 0 reads the state */
                float x = src >= 0 ? in[(size_t)src * D + d]
                                   : state[(size_t)(K - 1 + src) * D + d];
                acc += (double)w[(size_t)d * K + j] * x;
            }
            out[(size_t)i * D + d] = silu(acc);
        }
    /* Keep the last K-1 inputs, oldest first. */
    for (int j = 0; j < K - 1; j++) {
        int src = n - (K - 1) + j;
        if (src < 0) {
            memmove(state + (size_t)j * D, state + (size_t)(j + n) * D, sizeof(float) * (size_t)D);
        } else {
            memcpy(state + (size_t)j * D, in + (size_t)src * D, sizeof(float) * (size_t)D);
        }
    }
}

typedef struct delta_job {
    loom_model *m;
    loom_lin_state *s;
    const loom_fwd_row *rows;
    const int *row_start;      /* first token of each row */
    int slot;
} delta_job;

/* One token through the recurrence: S (dk, dv). */
static void delta_step(double *S, const double *q, const double *k, const double *v, double g,
                       double beta, double *o, double *tmp, int dk, int dv) {
    double decay = exp((double)g);
    for (int i = 0; i < dk * dv; i++) S[i] *= decay;
    for (int b = 0; b < dv; b++) tmp[b] = 0;
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dv; b++) tmp[b] += S[a * dv + b] * k[a];
    for (int b = 0; b < dv; b++) tmp[b] = (v[b] - tmp[b]) * beta;
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dv; b++) S[a * dv + b] += k[a] * tmp[b];
    for (int b = 0; b < dv; b++) {
        double acc = 0;
        for (int a = 0; a < dk; a++) acc += S[a * dv + b] * q[a];
        o[b] = acc;
    }
}

static double dotd(const double *a, const double *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One task = one row and one value head: the row's tokens through the
 * head's state, in chunks (or the recurrence for a single token). The
 * arithmetic is double: outputs are later RMS-normalised per head, which
 * magnifies any cancellation in S^T q, and the state is small. */
static void delta_task(void *ctx, int task, int thread) {
    const delta_job *j = ctx;
    const loom_config *c = &j->m->cfg;
    loom_lin_state *s = j->s;
    int nv = c->lin_n_v_heads, nk = c->lin_n_k_heads, dk = c->lin_k_head_dim;
    int dv = c->lin_v_head_dim, D = j->m->lin_conv_dim, rep = nv / nk;
    int r = task / nv, h = task % nv, kh = h / rep;
    const loom_fwd_row *row = &j->rows[r];
    float *Sf = row->state->rec + row->state->rec_per * (size_t)j->slot + (size_t)h * dk * dv;
    double *S = s->scratch + s->scratch_per * (size_t)thread;
    double *u = S + (size_t)dk * dv;                 /* (C, dv) */
    double *G = u + (size_t)DELTA_CHUNK * dv;   /* (C) */
    double *tmp = G + DELTA_CHUNK;              /* (dv) */
    int t0 = j->row_start[r], n = row->n;
    for (int i = 0; i < dk * dv; i++) S[i] = Sf[i];
#define Q(t) (s->conv + (size_t)(t) * D + (size_t)kh * dk)
#define K(t) (s->conv + (size_t)(t) * D + (size_t)nk * dk + (size_t)kh * dk)
#define V(t) (s->conv + (size_t)(t) * D + (size_t)2 * nk * dk + (size_t)h * dv)
#define O(t) (s->od + (size_t)(t) * nv * dv + (size_t)h * dv)
    /* A decode row of several tokens (a speculative verification) steps
     * token by token, the state rounded to its stored floats after each,
     * so that every token's bits are those of plain decoding. */
    int step = n == 1 || row->decode;
    for (int t = t0; step && t < t0 + n; t++) {
        delta_step(S, Q(t), K(t), V(t), s->g[(size_t)t * nv + h], s->beta[(size_t)t * nv + h],
                   O(t), tmp, dk, dv);
        if (t + 1 < t0 + n)
            for (int i = 0; i < dk * dv; i++) S[i] = (float)S[i];
    }
    for (int c0 = 0; !step && c0 < n; c0 += DELTA_CHUNK) {
        int C = LOOM_MIN(DELTA_CHUNK, n - c0), tb = t0 + c0;
        double acc = 0;
        for (int i = 0; i < C; i++) G[i] = acc += s->g[(size_t)(tb + i) * nv + h];
        for (int i = 0; i < C; i++) {
            double beta = s->beta[(size_t)(tb + i) * nv + h], eg = exp(G[i]);
            const double *ki = K(tb + i), *vi = V(tb + i);
            double *ui = u + (size_t)i * dv;
            /* u_i = beta (v_i - e^{G_i} S0^T k_i - sum_j e^{G_i-G_j} (k_i.k_j) u_j) */
            for (int b = 0; b < dv; b++) tmp[b] = 0;
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) tmp[b] += S[a * dv + b] * ki[a];
            for (int b = 0; b < dv; b++) ui[b] = vi[b] - eg * tmp[b];
            for (int jj = 0; jj < i; jj++) {
                double w = exp(G[i] - G[jj]) * dotd(ki, K(tb + jj), dk);
                const double *uj = u + (size_t)jj * dv;
                for (int b = 0; b < dv; b++) ui[b] -= w * uj[b];
            }
            for (int b = 0; b < dv; b++) ui[b] *= beta;
        }
        for (int i = 0; i < C; i++) {
            /* o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i-G_j} (q_i.k_j) u_j */
            const double *qi = Q(tb + i);
            double eg = exp(G[i]);
            for (int b = 0; b < dv; b++) tmp[b] = 0;
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) tmp[b] += S[a * dv + b] * qi[a];
            for (int b = 0; b < dv; b++) tmp[b] *= eg;
            for (int jj = 0; jj <= i; jj++) {
                double w = exp(G[i] - G[jj]) * dotd(qi, K(tb + jj), dk);
                const double *uj = u + (size_t)jj * dv;
                for (int b = 0; b < dv; b++) tmp[b] += w * uj[b];
            }
            double *o = O(tb + i);
            for (int b = 0; b < dv; b++) o[b] = tmp[b];
        }
        /* S = e^{G_C} S0 + sum_j e^{G_C-G_j} k_j u_j^T */
        double eg = exp(G[C - 1]);
        for (int i = 0; i < dk * dv; i++) S[i] *= eg;
        for (int jj = 0; jj < C; jj++) {
            double w = exp(G[C - 1] - G[jj]);
            const double *kj = K(tb + jj);
            const double *uj = u + (size_t)jj * dv;
            for (int a = 0; a < dk; a++) {
                double ka = w * kj[a];
                for (int b = 0; b < dv; b++) S[a * dv + b] += ka * uj[b];
            }
        }
    }
    for (int i = 0; i < dk * dv; i++) Sf[i] = (float)S[i];
#undef Q
#undef K
#undef V
#undef O
}

void loom_lin_forward(loom_model *m, loom_lin_state *s, const loom_fwd_row *rows, int n_rows,
                      const loom_layer *L, float *xb, int T) {
    const loom_config *c = &m->cfg;
    const loom_linattn *A = &L->lin;
    int nk = c->lin_n_k_heads, nv = c->lin_n_v_heads, dk = c->lin_k_head_dim;
    int dv = c->lin_v_head_dim, K = c->lin_conv_kernel, D = m->lin_conv_dim, rep = nv / nk;
    double eps = c->rms_eps;

    /* Projections into [q | k | v], z, b, a. */
    if (A->fused) {
        /* Grouped by key head: [q (dk) | k (dk) | v (rep dv) | z (rep dv)],
         * and [b (rep) | a (rep)]. */
        int W = A->in_qkvz.rows, gw = W / nk;
        loom_fwd_matmul(m, s->raw, xb, &A->in_qkvz, T);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < nk; g++) {
                const float *src = s->raw + (size_t)t * W + (size_t)g * gw;
                float *qkv = s->qkv + (size_t)t * D;
                memcpy(qkv + (size_t)g * dk, src, sizeof(float) * (size_t)dk);
                memcpy(qkv + (size_t)(nk + g) * dk, src + dk, sizeof(float) * (size_t)dk);
                memcpy(qkv + (size_t)2 * nk * dk + (size_t)g * rep * dv, src + 2 * dk,
                       sizeof(float) * (size_t)rep * dv);
                memcpy(s->z + (size_t)t * nv * dv + (size_t)g * rep * dv,
                       src + 2 * dk + rep * dv, sizeof(float) * (size_t)rep * dv);
            }
        loom_fwd_matmul(m, s->raw, xb, &A->in_ba, T);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < nk; g++)
                for (int i = 0; i < rep; i++) {
                    const float *src = s->raw + (size_t)t * 2 * nv + (size_t)g * 2 * rep;
                    s->b[(size_t)t * nv + g * rep + i] = src[i];
                    s->a[(size_t)t * nv + g * rep + i] = src[rep + i];
                }
    } else {
        float *ys[] = {s->qkv, s->z, s->b, s->a};
        const loom_weight *ws[] = {&A->in_qkv, &A->in_z, &A->in_b, &A->in_a};
        loom_fwd_matmul_n(m, 4, ys, xb, ws, T);
    }

    /* Conv per row (sequential in time), then q/k norms, beta and decay. */
    int *row_start = s->row_first;
    for (int r = 0, t = 0; r < n_rows; t += rows[r].n, r++) {
        row_start[r] = t;
        float *cst = rows[r].state->conv + rows[r].state->conv_per * (size_t)A->slot;
        conv_row(A->conv, K, D, cst, s->qkv + (size_t)t * D, s->conv + (size_t)t * D,
                 rows[r].n);
    }
    double qscale = 1.0 / sqrt((double)dk);
    for (int t = 0; t < T; t++) {
        double *x = s->conv + (size_t)t * D;
        for (int h = 0; h < 2 * nk; h++) {
            double *v = x + (size_t)h * dk;
            double inv = 1.0 / sqrt(dotd(v, v, dk) + 1e-6);
            if (h < nk) inv *= qscale;
            for (int i = 0; i < dk; i++) v[i] *= inv;
        }
        for (int h = 0; h < nv; h++) {
            size_t i = (size_t)t * nv + h;
            s->beta[i] = 1.0 / (1.0 + exp(-(double)s->b[i]));
            s->g[i] = A->neg_a[h] * softplus((double)s->a[i] + A->dt_bias[h]);
        }
    }

    delta_job dj = {m, s, rows, row_start, A->slot};
    loom_pool_run(m->pool, n_rows * nv, delta_task, &dj);

    /* Gated RMSNorm per value head, then the output projection. */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            const double *o = s->od + ((size_t)t * nv + h) * dv;
            const float *z = s->z + ((size_t)t * nv + h) * dv;
            float *y = s->out + ((size_t)t * nv + h) * dv;
            double inv = 1.0 / sqrt(dotd(o, o, dv) / dv + eps);
            for (int i = 0; i < dv; i++) y[i] = (float)(o[i] * inv * A->norm[i] * silu(z[i]));
        }
    loom_fwd_matmul(m, xb, s->out, &A->out, T);
}
