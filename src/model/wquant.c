#include "model/wquant.h"

#include <stdlib.h>

#include "base/base.h"
#include "load/quantize.h"
#include "model/matmul.h"
#include "ops/ops.h"

#define ALIGN64(n) (((n) + (size_t)63) & ~(size_t)63)

static int dense(const loom_weight *w) {
    return w->dtype == LOOM_DT_F32 || w->dtype == LOOM_DT_F16 || w->dtype == LOOM_DT_BF16;
}

/* The plain layout: levels, then scales, then biases, each 64-aligned. */
static size_t plain_bytes(const loom_weight *w, int bits, size_t *wb, size_t *sb) {
    *wb = ALIGN64((size_t)w->rows * (size_t)w->cols * (size_t)bits / 8);
    *sb = ALIGN64((size_t)w->rows * (size_t)(w->cols / LOOM_WQ_GROUP) * sizeof(uint16_t));
    return *wb + 2 * *sb;
}

static loom_qmat shape(const loom_weight *w, int bits) {
    return (loom_qmat){.n = w->cols, .bits = bits, .group = LOOM_WQ_GROUP, .f16 = w->dtype == LOOM_DT_F16};
}

size_t loom_wq_bytes(const loom_weight *w, int bits, int il16) {
    if (!dense(w) || !w->data || w->rows < 1 || w->cols < 1 || w->cols % LOOM_WQ_GROUP ||
        (bits != 4 && bits != 8))
        return 0;
    loom_qmat q = shape(w, bits);
    size_t wb, sb;
    return il16 && loom_q_il16_ok(&q, w->rows) ? ALIGN64(loom_q_il16_bytes(&q, w->rows))
                                               : plain_bytes(w, bits, &wb, &sb);
}

loom_status loom_wq_copy(const loom_model *m, const loom_weight *w, int bits, int il16, void *dst,
                         loom_weight *out) {
    if (!loom_wq_bytes(w, bits, il16))
        return loom_err(LOOM_ERR_INVALID_ARG, "%d-bit copy: expected a float matrix with columns in "
                        "groups of %d, found dtype %d [%d, %d]", bits, LOOM_WQ_GROUP, (int)w->dtype,
                        w->rows, w->cols);
    loom_qmat q = shape(w, bits);
    int il = il16 && loom_q_il16_ok(&q, w->rows);
    size_t wb, sb, plain = plain_bytes(w, bits, &wb, &sb);
    /* the 16-row layout is made from a plain copy */
    uint8_t *base = il ? loom_alloc(plain) : dst;
    float *row = malloc(sizeof(float) * (size_t)w->cols);
    if (!base || !row) {
        if (il) loom_free(base);
        free(row);
        return loom_err(LOOM_ERR_NOMEM, "%d-bit copy of a %d x %d matrix: out of memory", bits,
                        w->rows, w->cols);
    }
    uint32_t *qw = (uint32_t *)base;
    uint16_t *sc = (uint16_t *)(base + wb), *bi = (uint16_t *)(base + wb + sb);
    size_t words = (size_t)w->cols * (size_t)bits / 32, ng = (size_t)(w->cols / LOOM_WQ_GROUP);
    loom_dtype half = q.f16 ? LOOM_DT_F16 : LOOM_DT_BF16;
    loom_status s = LOOM_OK;
    for (int r = 0; r < w->rows && !s; r++) {
        loom_fwd_weight_row(m, w, row, r);
        if (loom_quant_row(row, w->cols, bits, LOOM_WQ_GROUP, half, LOOM_QPACK_STORED,
                           qw + (size_t)r * words, sc + (size_t)r * ng, bi + (size_t)r * ng))
            s = loom_err(LOOM_ERR_FORMAT, "%d-bit copy: row %d of a %d x %d matrix holds a NaN or an "
                         "infinity", bits, r, w->rows, w->cols);
    }
    free(row);
    q.w = qw, q.scales = sc, q.biases = bi;
    if (il && !s) {
        loom_qmat qi;
        s = loom_q_interleave_into(&q, w->rows, &qi, dst);
        q = qi;
    }
    if (il) loom_free(base);
    if (!s) *out = (loom_weight){.dtype = LOOM_DT_U32, .rows = w->rows, .cols = w->cols, .data = q.w, .q = q};
    return s;
}
