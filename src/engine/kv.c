/* kv: block pool with reference counts and per-sequence block tables. */
#include "engine/kv.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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

static void store_row(const loom_kv_pool *p, const loom_kv_layer *L, void *row, const float *x, int n) {
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

static const float *load_row(const loom_kv_pool *p, const loom_kv_layer *L, const void *row, int off,
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

void loom_kv_store_row(const loom_kv_pool *p, void *row, const float *x, int n) {
    assert(!p->mixed);
    store_row(p, &p->layer[0], row, x, n);
}

const float *loom_kv_load(const loom_kv_pool *p, const void *row, int off, int n, float *tmp) {
    assert(!p->mixed);
    return load_row(p, &p->layer[0], row, off, n, tmp);
}

void loom_kv_layer_store(const loom_kv_pool *p, int l, void *row, const float *x, int n) {
    store_row(p, &p->layer[l], row, x, n);
}

const float *loom_kv_layer_load(const loom_kv_pool *p, int l, const void *row, int off, int n,
                                float *tmp) {
    return load_row(p, &p->layer[l], row, off, n, tmp);
}

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
    for (int l = 0; l < n_layers; l++)
        if (!row_bytes_g(spec[l].type, kv_dim, spec_group(&spec[l], kv_dim)))
            return loom_err(LOOM_ERR_INVALID_ARG,
                            "kv pool: layer %d: type %d, group %d with rows of %d values (expected "
                            "f32, f16, bf16, or q8/q4 in groups of 32, 64 or 128 dividing the row)",
                            l, (int)spec[l].type, spec_group(&spec[l], kv_dim), kv_dim);
    loom_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return loom_err(LOOM_ERR_NOMEM, "out of memory");
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
    /* A uniform pool keeps the plain description (what the CUDA twin reads). */
    p->type = spec[0].type;
    p->bits = kv_bits(p->type);
    p->group = p->layer ? p->layer[0].group : 0;
    p->row_bytes = p->mixed ? 0 : p->layer ? p->layer[0].row_bytes : 0;
    /* Not zeroed: every row is written before it is read, and untouched
     * pages of a large pool then cost no memory. */
    if (posix_memalign((void **)&p->k, 64, half) != 0) p->k = NULL;
    if (posix_memalign((void **)&p->v, 64, half) != 0) p->v = NULL;
    p->refcount = calloc((size_t)n_blocks, sizeof *p->refcount);
    p->parked = calloc((size_t)n_blocks, sizeof *p->parked);
    p->free_list = malloc(sizeof *p->free_list * (size_t)n_blocks);
    if (!p->layer || !p->k || !p->v || !p->refcount || !p->parked || !p->free_list) {
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
    free(p->hash);
    free(p->btok);
    free(p->bparent);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->table);
    free(p->k);
    free(p->v);
    free(p->refcount);
    free(p->layer);
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
            !memcmp(p->btok + (size_t)b * p->block_size, tok, sizeof *tok * (size_t)p->block_size))
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
    int n = p->n_blocks;
    p->table_cap = 16;
    while (p->table_cap < 2 * n) p->table_cap *= 2;
    p->hash = calloc((size_t)n, sizeof *p->hash);
    p->bparent = calloc((size_t)n, sizeof *p->bparent);
    p->btok = malloc(sizeof *p->btok * (size_t)n * (size_t)p->block_size);
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
    int bs = p->block_size, max = (n - 1) / bs, hit = 0;
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
    int bs = p->block_size;
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

void loom_kv_cache_spill_all(loom_kv_pool *p) {
    if (!p->cache_on || !p->tier.spill) return;
    for (int i = 0; i < p->table_cap; i++)
        if (p->table[i] >= 0) p->tier.spill(p->tier.ctx, p, p->table[i]);
}

loom_status loom_kv_seq_reserve(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens) {
    int need = (n_tokens + p->block_size - 1) / p->block_size;
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
    for (int l = 0; l < p->n_layers; l++) {
        size_t row = (size_t)p->block_size * p->layer[l].row_bytes;
        memcpy(loom_kv_block_k(p, l, nb), loom_kv_block_k(p, l, b), row);
        memcpy(loom_kv_block_v(p, l, nb), loom_kv_block_v(p, l, b), row);
    }
    return nb;
}

void loom_kv_seq_truncate(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens) {
    if (n_tokens < 0) n_tokens = 0;
    int bs = p->block_size, keep = (n_tokens + bs - 1) / bs;
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
    for (int i = 0; i < seq->n_blocks && (i + 1) * p->block_size <= pos; i++) {
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
    int bs = p->block_size, keep = (n_tokens + bs - 1) / bs, partial = n_tokens % bs != 0;
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
