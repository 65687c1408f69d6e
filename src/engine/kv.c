/* kv: block pool policy: reference counts, the free list, the prefix
 * cache (hash table and LRU), parked sequences and the tier below. */
#include "engine/kv.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/base.h"

loom_status loom_kv_pool_create(int n_layers, int kv_dim, int block_size,
                                int n_blocks, loom_kv_type type, loom_kv_pool **out) {
    *out = NULL;
    if (n_layers <= 0) return loom_err(LOOM_ERR_INVALID_ARG, "kv pool: sizes must be positive");
    loom_kv_spec *spec = calloc((size_t)n_layers, sizeof *spec);
    if (!spec) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < n_layers; l++) spec[l].type = type;
    loom_status s = loom_kv_pool_create_spec(n_layers, kv_dim, block_size, n_blocks, spec, out);
    free(spec);
    return s;
}

loom_status loom_kv_pool_create_spec(int n_layers, int kv_dim, int block_size, int n_blocks,
                                     const loom_kv_spec *spec, loom_kv_pool **out) {
    *out = NULL;
    if (n_layers <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "kv pool: sizes must be positive");
    loom_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    loom_status s = loom_kv_layout_init(&p->lay, n_layers, kv_dim, block_size, n_blocks, spec);
    if (s) {
        free(p);
        return s;
    }
    p->refcount = calloc((size_t)n_blocks, sizeof *p->refcount);
    p->parked = calloc((size_t)n_blocks, sizeof *p->parked);
    p->free_list = malloc(sizeof *p->free_list * (size_t)n_blocks);
    if (!p->refcount || !p->parked || !p->free_list) {
        loom_kv_pool_free(p);
        return loom_err(LOOM_ERR_NOMEM, "kv pool: cannot allocate the tables of %d blocks", n_blocks);
    }
    /* Lowest ids on top of the stack, so allocation order is predictable. */
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    *out = p;
    return LOOM_OK;
}

void loom_kv_pool_free(loom_kv_pool *p) {
    if (!p) return;
    free(p->hash);
    free(p->btok);
    free(p->bparent);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->table);
    loom_kv_layout_release(&p->lay);
    free(p->refcount);
    free(p->parked);
    free(p->free_list);
    free(p);
}

/* ---- prefix cache: hash table and LRU ------------------------------------ */

static size_t slot_of(const loom_kv_pool *p, uint64_t h) {
    return (size_t)(h * 0x9e3779b97f4a7c15ull >> 17) & (size_t)(p->table_cap - 1);
}

static void table_insert(loom_kv_pool *p, int b) {
    size_t i = slot_of(p, p->hash[b]);
    while (p->table[i] >= 0) i = (i + 1) & (size_t)(p->table_cap - 1);
    p->table[i] = b;
    p->n_cached++;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void table_remove(loom_kv_pool *p, int b) {
    size_t mask = (size_t)(p->table_cap - 1), i = slot_of(p, p->hash[b]);
    while (p->table[i] != b) i = (i + 1) & mask;
    p->table[i] = -1;
    for (size_t j = (i + 1) & mask; p->table[j] >= 0; j = (j + 1) & mask) {
        size_t home = slot_of(p, p->hash[p->table[j]]);
        /* move j back to i if its home is not in (i, j] cyclically */
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            p->table[i] = p->table[j];
            p->table[j] = -1;
            i = j;
        }
    }
    p->n_cached--;
    p->hash[b] = 0;
}

static int table_find(const loom_kv_pool *p, uint64_t h, uint64_t parent, const int32_t *tok) {
    size_t mask = (size_t)(p->table_cap - 1);
    for (size_t i = slot_of(p, h); p->table[i] >= 0; i = (i + 1) & mask) {
        int b = p->table[i];
        if (p->hash[b] == h && p->bparent[b] == parent &&
            !memcmp(p->btok + (size_t)b * p->lay.block_size, tok, sizeof *tok * (size_t)p->lay.block_size))
            return b;
    }
    return -1;
}

static void lru_unlink(loom_kv_pool *p, int b) {
    int pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_lru--;
}

static void lru_push(loom_kv_pool *p, int b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

/* Evicts the least recently used cached block onto the free list. */
static void evict_one(loom_kv_pool *p) {
    int b = p->lru_head;
    lru_unlink(p, b);
    if (p->tier.spill) p->tier.spill(p->tier.ctx, p, b);
    table_remove(p, b);
    p->free_list[p->n_free++] = b;
    p->evictions++;
}

/* Every reference to b belongs to parked sequences: evicting them frees b. */
static int only_parked(const loom_kv_pool *p, int b) {
    return p->parked[b] > 0 && p->parked[b] == p->refcount[b];
}

/* Every reference count change goes through here, keeping n_reclaim. */
static void ref_add(loom_kv_pool *p, int b, int d) {
    int was = only_parked(p, b);
    p->refcount[b] += d;
    p->n_reclaim += only_parked(p, b) - was;
}

static void block_unref(loom_kv_pool *p, int b) {
    assert(p->refcount[b] > 0);
    ref_add(p, b, -1);
    if (p->refcount[b] > 0) return;
    if (p->hash && p->hash[b]) {
        lru_push(p, b);
        while (p->n_lru > p->cache_cap) evict_one(p);
    } else {
        p->free_list[p->n_free++] = b;
    }
}

/* A block for a sequence: free ones first, then the oldest cached one. */
static int block_take(loom_kv_pool *p) {
    if (p->n_free == 0) evict_one(p);
    int b = p->free_list[--p->n_free];
    assert(p->refcount[b] == 0);
    p->refcount[b] = 1;
    if (b >= p->n_touched) p->n_touched = b + 1;
    return b;
}

static loom_status seq_grow(loom_kv_seq *seq, int need) {
    if (need <= seq->cap) return LOOM_OK;
    int cap = LOOM_MAX(need, seq->cap * 2);
    int *nb = realloc(seq->blocks, sizeof *nb * (size_t)cap);
    if (!nb) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    seq->blocks = nb;
    seq->cap = cap;
    return LOOM_OK;
}

loom_status loom_kv_cache_enable(loom_kv_pool *p, int cap_blocks) {
    int n = p->lay.n_blocks;
    p->table_cap = 16;
    while (p->table_cap < 2 * n) p->table_cap *= 2;
    p->hash = calloc((size_t)n, sizeof *p->hash);
    p->bparent = calloc((size_t)n, sizeof *p->bparent);
    p->btok = malloc(sizeof *p->btok * (size_t)n * (size_t)p->lay.block_size);
    p->lru_prev = malloc(sizeof *p->lru_prev * (size_t)n);
    p->lru_next = malloc(sizeof *p->lru_next * (size_t)n);
    p->table = malloc(sizeof *p->table * (size_t)p->table_cap);
    if (!p->hash || !p->bparent || !p->btok || !p->lru_prev || !p->lru_next || !p->table)
        return loom_err(LOOM_ERR_NOMEM, "prefix cache: out of memory");
    for (int i = 0; i < n; i++) p->lru_prev[i] = p->lru_next[i] = -1;
    for (int i = 0; i < p->table_cap; i++) p->table[i] = -1;
    p->lru_head = p->lru_tail = -1;
    p->cache_cap = cap_blocks > 0 ? LOOM_MIN(cap_blocks, n) : n;
    p->cache_on = 1;
    return LOOM_OK;
}

uint64_t loom_kv_namespace(const char *s, size_t n) {
    uint64_t h = XXH3_64bits(s, n);
    return h ? h : 1;
}

static uint64_t chain_hash(uint64_t parent, const int32_t *tok, int bs) {
    uint64_t h = XXH3_64bits_withSeed(tok, sizeof *tok * (size_t)bs, parent);
    return h ? h : 1;
}

uint64_t loom_kv_chain_hash(uint64_t parent, const int32_t *tokens, int block_size) {
    return chain_hash(parent, tokens, block_size);
}

int loom_kv_cache_lookup(loom_kv_pool *p, loom_kv_seq *seq, const int32_t *tokens, int n,
                         uint64_t ns) {
    assert(seq->n_blocks == 0);
    seq->n_hashed = 0;
    seq->chain = ns;
    if (!p->cache_on) return 0;
    int bs = p->lay.block_size, max = (n - 1) / bs, hit = 0;
    if (max <= 0 || seq_grow(seq, max) != LOOM_OK) return 0;
    uint64_t chain = ns;
    for (; hit < max; hit++) {
        const int32_t *t = tokens + (size_t)hit * bs;
        uint64_t h = chain_hash(chain, t, bs);
        int b = table_find(p, h, chain, t);
        if (b >= 0) {
            if (p->refcount[b] == 0) lru_unlink(p, b);
            ref_add(p, b, 1);
        } else {
            /* Not in memory: the tier may have it. Keep one block spare so
             * a restore never starves the rest of the prompt. */
            if (!p->tier.fetch || loom_kv_available(p) < 2) break;
            b = block_take(p);
            if (p->tier.fetch(p->tier.ctx, p, h, chain, t, b) != 0) {
                p->refcount[b] = 0;
                p->free_list[p->n_free++] = b;
                break;
            }
            p->hash[b] = h;
            p->bparent[b] = chain;
            memcpy(p->btok + (size_t)b * bs, t, sizeof *t * (size_t)bs);
            table_insert(p, b);
            p->tier_hits++;
        }
        seq->blocks[seq->n_blocks++] = b;
        chain = h;
    }
    p->hits += (uint64_t)hit;
    p->misses += (uint64_t)(max - hit);
    seq->n_tokens = hit * bs;
    seq->n_hashed = hit;
    seq->chain = chain;
    return hit * bs;
}

void loom_kv_cache_commit(loom_kv_pool *p, loom_kv_seq *seq, const int32_t *tokens, uint64_t ns) {
    if (!p->cache_on) return;
    int bs = p->lay.block_size;
    if (seq->n_hashed == 0) seq->chain = ns;
    while ((seq->n_hashed + 1) * bs <= seq->n_tokens) {
        int i = seq->n_hashed;
        const int32_t *t = tokens + (size_t)i * bs;
        uint64_t h = chain_hash(seq->chain, t, bs);
        int b = seq->blocks[i];
        if (b >= 0 && !p->hash[b] && table_find(p, h, seq->chain, t) < 0) {
            p->hash[b] = h;
            p->bparent[b] = seq->chain;
            memcpy(p->btok + (size_t)b * bs, t, sizeof *t * (size_t)bs);
            table_insert(p, b);
        }
        seq->chain = h;
        seq->n_hashed++;
    }
}

void loom_kv_cache_clear(loom_kv_pool *p) {
    while (p->n_lru > 0) evict_one(p);
}

int loom_kv_cache_evict_one(loom_kv_pool *p) {
    if (p->n_lru == 0) return 0;
    evict_one(p);
    return 1;
}

void loom_kv_cache_spill_all(loom_kv_pool *p) {
    if (!p->cache_on || !p->tier.spill) return;
    for (int i = 0; i < p->table_cap; i++)
        if (p->table[i] >= 0) p->tier.spill(p->tier.ctx, p, p->table[i]);
}

loom_status loom_kv_seq_reserve(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens) {
    int need = (n_tokens + p->lay.block_size - 1) / p->lay.block_size;
    if (need <= seq->n_blocks) return LOOM_OK;
    if (need - seq->n_blocks > loom_kv_available(p))
        return loom_err(LOOM_ERR_NO_KV, "kv: need %d more blocks, %d free",
                        need - seq->n_blocks, loom_kv_available(p));
    loom_status s = seq_grow(seq, need);
    if (s != LOOM_OK) return s;
    while (seq->n_blocks < need) seq->blocks[seq->n_blocks++] = block_take(p);
    return LOOM_OK;
}

/* A fresh block holding a copy of b's rows (a block must be available). */
static int block_copy(loom_kv_pool *p, int b) {
    int nb = block_take(p);
    for (int l = 0; l < p->lay.n_layers; l++) {
        size_t row = (size_t)p->lay.block_size * p->lay.layer[l].row_bytes;
        memcpy(loom_kv_block_k(&p->lay, l, nb), loom_kv_block_k(&p->lay, l, b), row);
        memcpy(loom_kv_block_v(&p->lay, l, nb), loom_kv_block_v(&p->lay, l, b), row);
    }
    return nb;
}

void loom_kv_seq_truncate(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens) {
    if (n_tokens < 0) n_tokens = 0;
    int bs = p->lay.block_size, keep = (n_tokens + bs - 1) / bs;
    while (seq->n_blocks > keep) {
        int b = seq->blocks[--seq->n_blocks];
        if (b >= 0) block_unref(p, b);
    }
    if (seq->n_tokens > n_tokens) seq->n_tokens = n_tokens;
    if (seq->n_hashed * bs > n_tokens) seq->n_hashed = 0; /* rehash from the start */
    /* The next write lands in the last block: copy it first if shared. */
    if (n_tokens % bs && keep > 0) {
        int b = seq->blocks[keep - 1];
        if (b < 0) {
            /* dropped from a sliding window; the write needs a block again */
            if (loom_kv_available(p) > 0) seq->blocks[keep - 1] = block_take(p);
        } else if (p->refcount[b] == 1 && p->hash && p->hash[b]) {
            table_remove(p, b); /* ours alone: just stop caching it */
        } else if (p->refcount[b] > 1 && loom_kv_available(p) > 0) {
            seq->blocks[keep - 1] = block_copy(p, b);
            block_unref(p, b);
        }
    }
}

void loom_kv_seq_release(loom_kv_pool *p, loom_kv_seq *seq) {
    loom_kv_seq_truncate(p, seq, 0);
    free(seq->blocks);
    *seq = (loom_kv_seq){0};
}

int loom_kv_seq_drop_before(loom_kv_pool *p, loom_kv_seq *seq, int pos) {
    int dropped = 0;
    for (int i = 0; i < seq->n_blocks && (i + 1) * p->lay.block_size <= pos; i++) {
        if (seq->blocks[i] < 0) continue;
        block_unref(p, seq->blocks[i]);
        seq->blocks[i] = -1;
        dropped++;
    }
    return dropped;
}

void loom_kv_seq_park(loom_kv_pool *p, const loom_kv_seq *seq, int on) {
    for (int i = 0; i < seq->n_blocks; i++) {
        int b = seq->blocks[i];
        if (b < 0) continue;
        int was = only_parked(p, b);
        p->parked[b] += on ? 1 : -1;
        assert(p->parked[b] >= 0 && p->parked[b] <= p->refcount[b]);
        p->n_reclaim += only_parked(p, b) - was;
    }
}

loom_status loom_kv_seq_share(loom_kv_pool *p, loom_kv_seq *dst, const loom_kv_seq *src,
                              int n_tokens) {
    assert(dst->n_blocks == 0 && n_tokens > 0 && n_tokens <= src->n_tokens);
    int bs = p->lay.block_size, keep = (n_tokens + bs - 1) / bs, partial = n_tokens % bs != 0;
    if (partial && (src->blocks[keep - 1] < 0 || loom_kv_available(p) < 1))
        return loom_err(LOOM_ERR_NO_KV, "kv: no block for a copy of the last shared block");
    loom_status s = seq_grow(dst, keep);
    if (s != LOOM_OK) return s;
    for (int i = 0; i < keep; i++) {
        int b = src->blocks[i];
        dst->blocks[i] = b;
        if (b >= 0) ref_add(p, b, 1); /* src holds it: never on the LRU list */
    }
    dst->n_blocks = keep;
    if (partial) { /* the next write lands in it */
        int b = dst->blocks[keep - 1];
        dst->blocks[keep - 1] = block_copy(p, b);
        block_unref(p, b);
    }
    dst->n_tokens = n_tokens;
    dst->n_hashed = 0; /* the next commit walks the chain again */
    dst->chain = 0;
    return LOOM_OK;
}

loom_kv_counts loom_kv_counters(const loom_kv_pool *p) {
    return (loom_kv_counts){.hits = p->hits, .misses = p->misses, .evictions = p->evictions,
                            .tier_hits = p->tier_hits, .blocks_free = p->n_free,
                            .blocks_lru = p->n_lru, .blocks_parked = p->n_reclaim,
                            .blocks_running = p->lay.n_blocks - p->n_free - p->n_lru - p->n_reclaim,
                            .blocks_touched = p->n_touched};
}

void loom_kv_count_restored(loom_kv_pool *p, int n) {
    p->tier_hits += (uint64_t)n;
    p->hits += (uint64_t)n;
    p->misses -= (uint64_t)n;
}

void loom_kv_tier_no_fetch(loom_kv_pool *p) { p->tier.fetch = NULL; }
