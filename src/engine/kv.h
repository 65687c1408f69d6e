/* kv: paged KV memory.
 *
 * Design notes
 * - One pool of fixed-size blocks (block_size tokens) shared by every
 *   sequence. A block holds K and V for all layers at block_size positions:
 *   layer l's K rows of block b live at k + ((l * n_blocks + b) * block_size
 *   + slot) * kv_dim.
 * - A sequence owns a block table: position p lives in block
 *   table[p / block_size], slot p % block_size.
 * - Blocks carry reference counts so a block can be shared (prefix cache);
 *   a block returns to the free list when its count drops to zero.
 * Invariants
 *   1. refcount[b] == 0  <=>  b is on the free list.
 *   2. A sequence holding n tokens has exactly ceil(n / block_size) blocks.
 *   3. free + sum over blocks of (refcount > 0) == n_blocks.
 * Only the engine thread calls these functions. */
#ifndef LOOM_KV_H
#define LOOM_KV_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

typedef struct loom_kv_pool {
    int n_layers;
    int kv_dim;          /* n_kv_heads * head_dim */
    int block_size;      /* tokens per block */
    int n_blocks;
    float *k, *v;        /* owned (n_layers, n_blocks, block_size, kv_dim) */
    int *refcount;       /* owned [n_blocks] */
    int *free_list;      /* owned [n_blocks], stack of free ids */
    int n_free;
} loom_kv_pool;

typedef struct loom_kv_seq {
    int *blocks;         /* owned [cap] block ids */
    int n_blocks, cap;
    int n_tokens;        /* positions [0, n_tokens) are written */
} loom_kv_seq;

/* Bytes one block takes (K and V, all layers). */
size_t loom_kv_block_bytes(int n_layers, int kv_dim, int block_size);

loom_status loom_kv_pool_create(int n_layers, int kv_dim, int block_size,
                                int n_blocks, loom_kv_pool **out);
void loom_kv_pool_free(loom_kv_pool *p);

/* Makes seq hold blocks for positions [0, n_tokens). Returns LOOM_ERR_NO_KV
 * (allocating nothing) if the pool cannot supply them. Does not change
 * seq->n_tokens: the forward sets it once the positions are written. */
loom_status loom_kv_seq_reserve(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens);
/* Drops positions from n_tokens on, releasing whole blocks past it. */
void loom_kv_seq_truncate(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens);
/* Releases every block and the table. seq is empty afterwards. */
void loom_kv_seq_release(loom_kv_pool *p, loom_kv_seq *seq);

/* Row of K (or V) for layer l at a sequence position (block must exist). */
static inline float *loom_kv_k_row(const loom_kv_pool *p, const loom_kv_seq *s,
                                   int l, int pos) {
    size_t b = (size_t)s->blocks[pos / p->block_size];
    return p->k + (((size_t)l * p->n_blocks + b) * p->block_size +
                   (size_t)(pos % p->block_size)) * p->kv_dim;
}
static inline float *loom_kv_v_row(const loom_kv_pool *p, const loom_kv_seq *s,
                                   int l, int pos) {
    size_t b = (size_t)s->blocks[pos / p->block_size];
    return p->v + (((size_t)l * p->n_blocks + b) * p->block_size +
                   (size_t)(pos % p->block_size)) * p->kv_dim;
}

#endif
