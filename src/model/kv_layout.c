/* kv_layout: how the KV pool's blocks hold rows, and the row codec. */
#include "model/kv_layout.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"

/* Quantized rows: groups of 64 values, or 32 when the row is not a
 * multiple of 64 (narrow heads), unless a layer asks for its own. */
static int kv_group(int kv_dim) { return kv_dim % 64 == 0 ? 64 : 32; }
static int kv_bits(loom_kv_type t) { return t == LOOM_KV_Q8 ? 8 : t == LOOM_KV_Q4 ? 4 : 0; }

static size_t row_bytes_g(loom_kv_type type, int kv_dim, int group) {
    switch (type) {
    case LOOM_KV_F32: return 4 * (size_t)kv_dim;
    case LOOM_KV_F16:
    case LOOM_KV_BF16: return 2 * (size_t)kv_dim;
    case LOOM_KV_Q8:
    case LOOM_KV_Q4:
        if (group != 32 && group != 64 && group != 128) return 0;
        if (kv_dim % group) return 0;
        /* packed values, then an f16 scale and bias per group */
        return (size_t)kv_dim * (size_t)kv_bits(type) / 8 + (size_t)(kv_dim / group) * 4;
    }
    return 0;
}

size_t loom_kv_row_bytes(loom_kv_type type, int kv_dim) {
    return row_bytes_g(type, kv_dim, kv_group(kv_dim));
}

const char *loom_kv_type_name(loom_kv_type type) {
    static const char *names[] = {"f32", "f16", "bf16", "q8", "q4"};
    return (unsigned)type < 5 ? names[type] : NULL;
}

size_t loom_kv_block_bytes(int n_layers, int kv_dim, int block_size, loom_kv_type type) {
    return 2 * loom_kv_row_bytes(type, kv_dim) * (size_t)n_layers * (size_t)block_size;
}

static int spec_group(const loom_kv_spec *s, int kv_dim) { return s->group ? s->group : kv_group(kv_dim); }

size_t loom_kv_spec_block_bytes(const loom_kv_spec *spec, int n_layers, int kv_dim, int block_size) {
    size_t sum = 0;
    for (int l = 0; l < n_layers; l++) {
        size_t r = row_bytes_g(spec[l].type, kv_dim, spec_group(&spec[l], kv_dim));
        if (!r) return 0;
        sum += r;
    }
    return 2 * sum * (size_t)block_size;
}

static void store_row(const loom_kv_layout *p, const loom_kv_layer *L, void *row, const float *x, int n) {
    switch (L->type) {
    case LOOM_KV_F32:
        memcpy(row, x, sizeof(float) * (size_t)n);
        return;
    case LOOM_KV_F16:
        for (int i = 0; i < n; i++) ((uint16_t *)row)[i] = loom_f32_to_f16(x[i]);
        return;
    case LOOM_KV_BF16:
        for (int i = 0; i < n; i++) ((uint16_t *)row)[i] = loom_f32_to_bf16(x[i]);
        return;
    case LOOM_KV_Q8:
    case LOOM_KV_Q4:
        break;
    }
    int G = L->group, bits = L->bits, levels = (1 << bits) - 1, full = n / G;
    uint8_t *q = row;
    uint16_t *sb = (uint16_t *)(q + (size_t)p->kv_dim * bits / 8);
    memset(q, 0, (size_t)p->kv_dim * bits / 8);
    float pad[128];
    for (int g = 0; g < p->kv_dim / G; g++) {
        const float *xs = x + (size_t)g * G;
        if (g >= full) { /* past n the row reads as zero */
            for (int i = 0; i < G; i++) pad[i] = g * G + i < n ? x[g * G + i] : 0;
            xs = pad;
        }
        float lo = xs[0], hi = xs[0];
        for (int i = 1; i < G; i++) {
            lo = xs[i] < lo ? xs[i] : lo;
            hi = xs[i] > hi ? xs[i] : hi;
        }
        /* scale and bias as stored, so values round against what is read */
        uint16_t s16 = loom_f32_to_f16((hi - lo) / (float)levels), b16 = loom_f32_to_f16(lo);
        float scale = loom_f16_to_f32(s16), bias = loom_f16_to_f32(b16);
        sb[2 * g] = s16;
        sb[2 * g + 1] = b16;
        for (int i = 0; i < G; i++) {
            int v = scale > 0 ? (int)lrintf((xs[i] - bias) / scale) : 0;
            v = v < 0 ? 0 : v > levels ? levels : v;
            int at = g * G + i;
            if (bits == 8) q[at] = (uint8_t)v;
            else q[at / 2] |= (uint8_t)(v << (4 * (at & 1)));
        }
    }
}

static const float *load_row(const loom_kv_layout *p, const loom_kv_layer *L, const void *row, int off,
                             int n, float *tmp) {
    switch (L->type) {
    case LOOM_KV_F32: return (const float *)row + off;
    case LOOM_KV_F16: p->kern->f16_to_f32(tmp, (const uint16_t *)row + off, n); return tmp;
    case LOOM_KV_BF16: p->kern->bf16_to_f32(tmp, (const uint16_t *)row + off, n); return tmp;
    case LOOM_KV_Q8:
    case LOOM_KV_Q4: break;
    }
    const uint8_t *q = row;
    const uint16_t *sb = (const uint16_t *)(q + (size_t)p->kv_dim * L->bits / 8);
    for (int i = 0; i < n; i++) {
        int at = off + i, g = at / L->group;
        int v = L->bits == 8 ? q[at] : (q[at / 2] >> (4 * (at & 1))) & 15;
        tmp[i] = loom_f16_to_f32(sb[2 * g]) * (float)v + loom_f16_to_f32(sb[2 * g + 1]);
    }
    return tmp;
}

void loom_kv_store_row(const loom_kv_layout *p, void *row, const float *x, int n) {
    assert(!p->mixed);
    store_row(p, &p->layer[0], row, x, n);
}

const float *loom_kv_load(const loom_kv_layout *p, const void *row, int off, int n, float *tmp) {
    assert(!p->mixed);
    return load_row(p, &p->layer[0], row, off, n, tmp);
}

void loom_kv_layer_store(const loom_kv_layout *p, int l, void *row, const float *x, int n) {
    store_row(p, &p->layer[l], row, x, n);
}

const float *loom_kv_layer_load(const loom_kv_layout *p, int l, const void *row, int off, int n,
                                float *tmp) {
    return load_row(p, &p->layer[l], row, off, n, tmp);
}

loom_status loom_kv_layout_init(loom_kv_layout *p, int n_layers, int kv_dim, int block_size,
                                int n_blocks, const loom_kv_spec *spec) {
    *p = (loom_kv_layout){0};
    if (n_layers <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "kv pool: sizes must be positive");
    for (int l = 0; l < n_layers; l++)
        if (!row_bytes_g(spec[l].type, kv_dim, spec_group(&spec[l], kv_dim)))
            return loom_err(LOOM_ERR_INVALID_ARG,
                            "kv pool: layer %d: type %d, group %d with rows of %d values (expected "
                            "f32, f16, bf16, or q8/q4 in groups of 32, 64 or 128 dividing the row)",
                            l, (int)spec[l].type, spec_group(&spec[l], kv_dim), kv_dim);
    p->n_layers = n_layers;
    p->kv_dim = kv_dim;
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->kern = loom_kernels_get();
    p->layer = calloc((size_t)n_layers, sizeof *p->layer);
    size_t half = 0;
    for (int l = 0; p->layer && l < n_layers; l++) {
        loom_kv_layer *L = &p->layer[l];
        L->type = spec[l].type;
        L->bits = kv_bits(L->type);
        L->group = spec_group(&spec[l], kv_dim);
        L->row_bytes = row_bytes_g(L->type, kv_dim, L->group);
        L->off = half;
        half += L->row_bytes * (size_t)block_size * (size_t)n_blocks;
        if (L->type != spec[0].type || L->group != p->layer[0].group) p->mixed = 1;
    }
    /* A uniform layout keeps the plain description (what the CUDA twin reads). */
    p->type = spec[0].type;
    p->bits = kv_bits(p->type);
    p->group = p->layer ? p->layer[0].group : 0;
    p->row_bytes = p->mixed ? 0 : p->layer ? p->layer[0].row_bytes : 0;
    /* Not zeroed: every row is written before it is read, and untouched
     * pages of a large pool then cost no memory. */
    if (posix_memalign((void **)&p->k, 64, half) != 0) p->k = NULL;
    if (posix_memalign((void **)&p->v, 64, half) != 0) p->v = NULL;
    if (!p->layer || !p->k || !p->v) {
        loom_kv_layout_release(p);
        return loom_err(LOOM_ERR_NOMEM, "kv pool: cannot allocate %zu bytes", 2 * half);
    }
    return LOOM_OK;
}

void loom_kv_layout_release(loom_kv_layout *p) {
    free(p->k);
    free(p->v);
    free(p->layer);
    *p = (loom_kv_layout){0};
}
