#include "model/matmul.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Up to MM_MAX weights that read the same x (q/k/v, gate/up) go out as
 * one parallel-for: a decode step is ~8 dispatches per layer, and each
 * costs a wake-up and a wait for the slowest thread. */
#define MM_MAX 4

typedef struct mm_job {
    const loom_kernels *k;
    const float *x; int ldx;
    int T;
    float *y[MM_MAX];
    const loom_weight *w[MM_MAX];
    int chunk[MM_MAX], first[MM_MAX + 1]; /* rows per task; first task of each weight */
    const void *prep;                     /* x rounded once for every slice (prep_bytes) */
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
    (void)thread;
    const mm_job *j = ctx;
    int i = 0;
    while (task >= j->first[i + 1]) i++;
    const loom_weight *w = j->w[i];
    float *y = j->y[i];
    int r0 = (task - j->first[i]) * j->chunk[i], r1 = LOOM_MIN(r0 + j->chunk[i], w->rows);
    switch (w->dtype) {
    case LOOM_DT_F32:
        j->k->matmul_f32(y, w->rows, j->x, j->ldx, w->data, w->cols, j->T, r0, r1);
        break;
    case LOOM_DT_F16:
        j->k->matmul_f16(y, w->rows, j->x, j->ldx, w->data, w->cols, j->T, r0, r1);
        break;
    case LOOM_DT_F8_E4M3:
        j->k->matmul_f8(y, w->rows, j->x, j->ldx, &w->f8, j->T, r0, r1);
        break;
    case LOOM_DT_U32:
        if (j->prep) j->k->matmul_q_prep(y, w->rows, j->prep, &w->q, j->T, r0, r1);
        else j->k->matmul_q(y, w->rows, j->x, j->ldx, &w->q, j->T, r0, r1);
        break;
    default:
        if (j->prep) j->k->matmul_bf16_prep(y, w->rows, j->prep, w->data, w->cols, j->T, r0, r1);
        else j->k->matmul_bf16(y, w->rows, j->x, j->ldx, w->data, w->cols, j->T, r0, r1);
        break;
    }
}

/* Bytes of x rounded once for all of a dispatch's matrices (0: none): the
 * kernels' q_prep for interleaved quantized ones over one group size, or
 * bf16_prep for bf16 ones. */
static size_t prep_bytes(const loom_kernels *k, const loom_weight *const *w, int n_w, int T) {
    int q = k->q_prep != NULL, b = k->bf16_prep != NULL;
    for (int i = 0; i < n_w; i++) {
        q &= w[i]->dtype == LOOM_DT_U32 && w[i]->q.il16 && w[i]->q.group == w[0]->q.group;
        b &= w[i]->dtype == LOOM_DT_BF16;
    }
    return q ? k->q_prep_bytes(&w[0]->q, T) : b ? k->bf16_prep_bytes(w[0]->cols, T) : 0;
}

void loom_fwd_matmul_n(loom_model *m, int n_w, float *const *y, const float *x,
                       const loom_weight *const *w, int T) {
    loom_fwd_matmul_k(m, m->k, n_w, y, x, w, T);
}

void loom_fwd_matmul_k(loom_model *m, const loom_kernels *k, int n_w, float *const *y,
                       const float *x, const loom_weight *const *w, int T) {
    if (T <= 0 || n_w <= 0) return;
    assert(n_w <= MM_MAX);
    int n = loom_pool_size(m->pool), cols = w[0]->cols;
    size_t macs = 0;
    for (int i = 0; i < n_w; i++) {
        assert(w[i]->cols == cols);
        macs += (size_t)w[i]->rows * (size_t)cols * (size_t)T;
    }
    /* Below ~256K multiply-adds waking the workers costs more than it saves. */
    if (macs < ((size_t)1 << 18)) n = 1;
    /* Slices per thread and weight: 4 let a thread whose core went to
     * another process hand its share over. Each slice repeats the kernel's
     * work on x (packing; rounding under --fast where no prep_bytes buffer
     * does it once below), which a prompt (T >= 16) makes large: 2 there,
     * and one slice on one thread. */
    int per = n == 1 ? 1 : T >= 16 ? 2 : 4;
    mm_job j = {.k = k, .x = x, .ldx = cols, .T = T};
    for (int i = 0; i < n_w; i++) {
        int chunk = (w[i]->rows + per * n - 1) / (per * n);
        j.y[i] = y[i];
        j.w[i] = w[i];
        j.chunk[i] = (chunk + 15) & ~15;
        j.first[i + 1] = j.first[i] + (w[i]->rows + j.chunk[i] - 1) / j.chunk[i];
    }
    /* x rounded once here rather than once per slice */
    _Alignas(64) uint8_t stack[32 << 10];
    void *heap = NULL;
    size_t bytes = prep_bytes(k, w, n_w, T);
    if (bytes) {
        void *buf = bytes <= sizeof stack ? stack : (heap = malloc(bytes));
        if (buf && w[0]->dtype == LOOM_DT_U32) k->q_prep(buf, x, cols, &w[0]->q, T);
        else if (buf) k->bf16_prep(buf, x, cols, cols, T);
        j.prep = buf;
    }
    if (n == 1)
        for (int t = 0; t < j.first[n_w]; t++) mm_task(&j, t, 0);
    else
        loom_pool_run(m->pool, j.first[n_w], mm_task, &j);
    free(heap);
}

void loom_fwd_matmul(loom_model *m, float *y, const float *x, const loom_weight *w, int T) {
    loom_fwd_matmul_n(m, 1, &y, x, &w, T);
}

void loom_fwd_weight_row(const loom_model *m, const loom_weight *e, float *dst, int id) {
    size_t off = (size_t)id * e->cols;
    if (e->dtype == LOOM_DT_F32) {
        memcpy(dst, (const float *)e->data + off, (size_t)e->cols * 4);
    } else if (e->dtype == LOOM_DT_F16) {
        m->k->f16_to_f32(dst, (const uint16_t *)e->data + off, e->cols);
    } else if (e->dtype == LOOM_DT_BF16) {
        m->k->bf16_to_f32(dst, (const uint16_t *)e->data + off, e->cols);
    } else if (e->dtype == LOOM_DT_F8_E4M3) {
        const loom_f8mat *f = &e->f8;
        const float *s = f->scales + (size_t)(id / f->br) * loom_f8_scale_cols(f);
        for (int k = 0; k < e->cols; k++) dst[k] = loom_e4m3_to_f32(f->w[off + k]) * s[k / f->bc];
    } else {
        const loom_qmat *q = &e->q;
        int ng = q->n / q->group, bits = q->bits;
        const uint32_t *row = q->w + (size_t)id * ((size_t)q->n * bits / 32);
        for (int g = 0; g < ng; g++) {
            size_t si = (size_t)id * ng + g;
            float sc = q->f16 ? loom_f16_to_f32(q->scales[si]) : loom_bf16_to_f32(q->scales[si]);
            float bi = q->f16 ? loom_f16_to_f32(q->biases[si]) : loom_bf16_to_f32(q->biases[si]);
            for (int k = g * q->group; k < (g + 1) * q->group; k++) {
                size_t bit = (size_t)k * bits;
                uint64_t v = row[bit / 32] >> (bit % 32);
                if (bit % 32 + (size_t)bits > 32) v |= (uint64_t)row[bit / 32 + 1] << (32 - bit % 32);
                dst[k] = sc * (float)(v & ((1u << bits) - 1)) + bi;
            }
        }
    }
}

void loom_fwd_mlp(loom_model *m, const loom_mlp *p, float *out, const float *in, int T,
                  float *hb, float *hb2) {
    int I = p->gate.rows;
    float *ys[] = {hb, hb2};
    const loom_weight *ws[] = {&p->gate, &p->up};
    loom_fwd_matmul_n(m, 2, ys, in, ws, T);
    for (int t = 0; t < T; t++) loom_fwd_act_mul(m, hb + (size_t)t * I, hb2 + (size_t)t * I, I);
    loom_fwd_matmul(m, out, hb, &p->down, T);
}
