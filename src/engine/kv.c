/* kv: block pool with reference counts and per-sequence block tables. */
#include "engine/kv.h"

#include <assert.h>
#include <stdlib.h>

#include "base/base.h"

size_t loom_kv_block_bytes(int n_layers, int kv_dim, int block_size) {
    return 2 * sizeof(float) * (size_t)n_layers * (size_t)kv_dim * (size_t)block_size;
}

loom_status loom_kv_pool_create(int n_layers, int kv_dim, int block_size,
                                int n_blocks, loom_kv_pool **out) {
    *out = NULL;
    if (n_layers <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "kv pool: sizes must be positive");
    loom_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    p->n_layers = n_layers;
    p->kv_dim = kv_dim;
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    size_t half = loom_kv_block_bytes(n_layers, kv_dim, block_size) / 2 * (size_t)n_blocks;
    /* Not zeroed: every row is written before it is read, and untouched
     * pages of a large pool then cost no memory. */
    if (posix_memalign((void **)&p->k, 64, half) != 0) p->k = NULL;
    if (posix_memalign((void **)&p->v, 64, half) != 0) p->v = NULL;
    p->refcount = calloc((size_t)n_blocks, sizeof *p->refcount);
    p->free_list = malloc(sizeof *p->free_list * (size_t)n_blocks);
    if (!p->k || !p->v || !p->refcount || !p->free_list) {
        loom_kv_pool_free(p);
        return loom_err(LOOM_ERR_NOMEM, "kv pool: cannot allocate %zu bytes", 2 * half);
    }
    /* Lowest ids on top of the stack, so allocation order is predictable. */
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    *out = p;
    return LOOM_OK;
}

void loom_kv_pool_free(loom_kv_pool *p) {
    if (!p) return;
    free(p->k);
    free(p->v);
    free(p->refcount);
    free(p->free_list);
    free(p);
}

static void block_unref(loom_kv_pool *p, int b) {
    assert(p->refcount[b] > 0);
    if (--p->refcount[b] == 0) p->free_list[p->n_free++] = b;
}

loom_status loom_kv_seq_reserve(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens) {
    int need = (n_tokens + p->block_size - 1) / p->block_size;
    if (need <= seq->n_blocks) return LOOM_OK;
    if (need - seq->n_blocks > p->n_free)
        return loom_err(LOOM_ERR_NO_KV, "kv: need %d more blocks, %d free",
                        need - seq->n_blocks, p->n_free);
    if (need > seq->cap) {
        int cap = LOOM_MAX(need, seq->cap * 2);
        int *nb = realloc(seq->blocks, sizeof *nb * (size_t)cap);
        if (!nb) return loom_err(LOOM_ERR_NOMEM, "out of memory");
        seq->blocks = nb;
        seq->cap = cap;
    }
    while (seq->n_blocks < need) {
        int b = p->free_list[--p->n_free];
        assert(p->refcount[b] == 0);
        p->refcount[b] = 1;
        seq->blocks[seq->n_blocks++] = b;
    }
    return LOOM_OK;
}

void loom_kv_seq_truncate(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens) {
    if (n_tokens < 0) n_tokens = 0;
    int keep = (n_tokens + p->block_size - 1) / p->block_size;
    while (seq->n_blocks > keep) block_unref(p, seq->blocks[--seq->n_blocks]);
    if (seq->n_tokens > n_tokens) seq->n_tokens = n_tokens;
}

void loom_kv_seq_release(loom_kv_pool *p, loom_kv_seq *seq) {
    loom_kv_seq_truncate(p, seq, 0);
    free(seq->blocks);
    *seq = (loom_kv_seq){0};
}
