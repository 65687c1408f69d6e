/* kv_layout: how the KV pool's blocks hold rows, as the forward sees them.
 *
 * - One allocation of fixed-size blocks (block_size tokens) for K and one
 *   for V. A block holds all layers at block_size positions: layer l's K
 *   rows of block b live at k + layer[l].off + (b * block_size + slot) *
 *   layer[l].row_bytes. Layers may store rows differently (kv_config.json:
 *   per-layer bits), each with its own row codec.
 * - A sequence's block table: position p lives in block
 *   blocks[p / block_size], slot p % block_size.
 * Which blocks are free, shared or cached is the pool's business
 * (engine/kv.h); nothing here counts references. */
#ifndef LOOM_KV_LAYOUT_H
#define LOOM_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* How one layer's rows are stored (a kv_config.json entry, or the pool's
 * type). group 0 = the default for the row width. */
typedef struct loom_kv_spec {
    loom_kv_type type;
    int group;
} loom_kv_spec;

typedef struct loom_kv_layer {
    loom_kv_type type;
    int bits, group;     /* quantized types: bits per value, values per group */
    size_t row_bytes;    /* bytes of one stored row of kv_dim values */
    size_t off;          /* bytes before this layer's rows in k (and in v) */
} loom_kv_layer;

typedef struct loom_kv_layout {
    int n_layers;
    int kv_dim;          /* n_kv_heads * head_dim */
    int block_size;      /* tokens per block */
    int n_blocks;
    loom_kv_layer *layer;/* owned [n_layers]: each layer's row codec */
    int mixed;           /* layers are stored differently (then row_bytes is 0) */
    loom_kv_type type;   /* uniform layouts: how a row is stored (layer 0's for mixed) */
    int bits, group;     /* uniform layouts: quantized types: bits per value, values per group */
    size_t row_bytes;    /* uniform layouts: bytes of one stored row of kv_dim values */
    const struct loom_kernels *kern; /* borrowed: widening kernels */
    uint8_t *k, *v;      /* owned: layer l's (n_blocks, block_size) rows of
                            layer[l].row_bytes start at k + layer[l].off */
} loom_kv_layout;

/* One sequence's block table. The forward reads blocks and advances
 * n_tokens; n_hashed and chain belong to the pool's prefix cache. */
typedef struct loom_kv_seq {
    int *blocks;         /* owned [cap] block ids */
    int n_blocks, cap;
    int n_tokens;        /* positions [0, n_tokens) are written */
    int n_hashed;        /* leading full blocks already offered to the cache */
    uint64_t chain;      /* chain hash after block n_hashed - 1 (or the namespace) */
} loom_kv_seq;

/* Bytes of one stored row of kv_dim values, or 0 for an unknown type. */
size_t loom_kv_row_bytes(loom_kv_type type, int kv_dim);
/* Bytes one block takes (K and V, all layers). */
size_t loom_kv_block_bytes(int n_layers, int kv_dim, int block_size, loom_kv_type type);
/* "f32", "f16", "bf16", "q8", "q4" (NULL for an unknown type). */
const char *loom_kv_type_name(loom_kv_type type);

/* Bytes one block takes when layer l is stored as spec[l]; 0 when a
 * layer's type and group cannot store rows of kv_dim values. */
size_t loom_kv_spec_block_bytes(const loom_kv_spec *spec, int n_layers, int kv_dim, int block_size);

/* Fills *lay for n_blocks blocks storing layer l as spec[l] (spec:
 * [n_layers]; sizes positive) and allocates its rows, not zeroed. On an
 * error *lay owns nothing. */
loom_status loom_kv_layout_init(loom_kv_layout *lay, int n_layers, int kv_dim, int block_size,
                                int n_blocks, const loom_kv_spec *spec);
/* Frees what loom_kv_layout_init allocated. */
void loom_kv_layout_release(loom_kv_layout *lay);

/* Row codec of layer l. Stores n <= kv_dim f32 values into a row of the
 * layer's type (rounded to 16 bits, or quantized per group: scale and bias
 * in f16 from the group's min and max, values rounded to the nearest
 * level); the rest of the row reads as zero. */
void loom_kv_layer_store(const loom_kv_layout *p, int l, void *row, const float *x, int n);
/* Values [off, off + n) of a stored row of layer l as f32: a pointer into
 * the row for f32 layers, else widened into tmp (n floats). */
const float *loom_kv_layer_load(const loom_kv_layout *p, int l, const void *row, int off, int n,
                                float *tmp);
/* The same for layouts whose layers are all stored alike (!p->mixed). */
void loom_kv_store_row(const loom_kv_layout *p, void *row, const float *x, int n);
const float *loom_kv_load(const loom_kv_layout *p, const void *row, int off, int n, float *tmp);

/* K (or V) rows of a block for layer l: block_size rows of layer[l].row_bytes. */
static inline void *loom_kv_block_k(const loom_kv_layout *p, int l, int b) {
    return p->k + p->layer[l].off + (size_t)b * p->block_size * p->layer[l].row_bytes;
}
static inline void *loom_kv_block_v(const loom_kv_layout *p, int l, int b) {
    return p->v + p->layer[l].off + (size_t)b * p->block_size * p->layer[l].row_bytes;
}

/* Row of K (or V) for layer l at a sequence position (block must exist);
 * read and write it with the row codec. */
static inline void *loom_kv_k_row(const loom_kv_layout *p, const loom_kv_seq *s,
                                  int l, int pos) {
    size_t b = (size_t)s->blocks[pos / p->block_size];
    return p->k + p->layer[l].off +
           (b * p->block_size + (size_t)(pos % p->block_size)) * p->layer[l].row_bytes;
}
static inline void *loom_kv_v_row(const loom_kv_layout *p, const loom_kv_seq *s,
                                  int l, int pos) {
    size_t b = (size_t)s->blocks[pos / p->block_size];
    return p->v + p->layer[l].off +
           (b * p->block_size + (size_t)(pos % p->block_size)) * p->layer[l].row_bytes;
}

#endif
