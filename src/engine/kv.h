/* kv: paged KV memory.
 *
 * Design notes
 * - One pool of fixed-size blocks (block_size tokens) shared by every
 *   sequence; how a block holds its rows, and how a sequence's block table
 *   addresses them, is the layout's (model/kv_layout.h).
 * - Blocks carry reference counts so a block can be shared.
 * - Prefix cache (when enabled). A full block is keyed by a hash chained
 *   over every token up to its end, seeded with a namespace (model, KV
 *   layout, optional session). Full blocks are never written again
 *   (sequences only append), so sharing them needs no copy. A new sequence
 *   maps the longest cached run of its prompt's blocks into its table
 *   (refcount + 1). A cached block whose count drops to zero is not freed
 *   but kept on an LRU list; allocation takes free blocks first, then
 *   evicts the least recently used cached block.
 * Invariants
 *   1. refcount[b] == 0  <=>  b is on the free list or on the LRU list.
 *   2. b is on the LRU list  <=>  refcount[b] == 0 and b is in the hash table.
 *   3. A sequence holding n tokens has exactly ceil(n / block_size) table
 *      entries; entries wholly outside every layer's sliding window may be
 *      -1 (released).
 *   4. free + lru + (blocks with refcount > 0) == n_blocks.
 *   5. parked[b] <= refcount[b]; n_reclaim counts the blocks with
 *      parked[b] == refcount[b] > 0 (held only by parked sequences).
 * - Parked sequences. A finished request's sequence may be kept whole
 *   (partial last block included) so a later request continues it; its
 *   references are marked parked. Blocks only parked sequences hold are
 *   reclaimable: their owner (the engine's session store) drops parked
 *   sequences when the pool runs short. A sequence continuing a parked one
 *   maps its blocks (refcount + 1) and copies the partial last block.
 * Only the engine thread calls these functions. */
#ifndef LOOM_KV_H
#define LOOM_KV_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "model/kv_layout.h"

struct loom_kv_pool;

/* A slower tier below the prefix cache (e.g. disk): evicted cached blocks
 * are offered to spill; a lookup that misses in memory asks fetch to fill
 * a fresh block (0 on success). Both run on the engine thread. */
typedef struct loom_kv_tier {
    void *ctx;
    void (*spill)(void *ctx, const struct loom_kv_pool *p, int block);
    int (*fetch)(void *ctx, struct loom_kv_pool *p, uint64_t hash, uint64_t parent,
                 const int32_t *tokens, int block);
} loom_kv_tier;

/* Prefix cache counters, in blocks. */
typedef struct loom_kv_counts {
    uint64_t hits, misses;   /* looked-up blocks found cached, or not */
    uint64_t evictions;      /* cached blocks evicted */
    uint64_t tier_hits;      /* of the hits, blocks restored from the tier */
    /* where the blocks are now: they sum to the pool's */
    int blocks_free, blocks_lru, blocks_parked, blocks_running;
    int blocks_touched;      /* handed out at least once: the resident part */
} loom_kv_counts;

typedef struct loom_kv_pool {
    loom_kv_layout lay;  /* owned: the blocks and how they hold rows */
    int *refcount;       /* owned [n_blocks] */
    int *parked;         /* owned [n_blocks]: references held by parked sequences */
    int n_reclaim;       /* blocks only parked sequences hold */
    int *free_list;      /* owned [n_blocks], stack of free ids */
    int n_free;
    int n_touched;       /* blocks [0, n_touched) have been handed out at least
                            once (released ones go back on top of the stack, so
                            the set stays contiguous); the pool's pages past
                            them were never written and take no memory */
    /* prefix cache; all NULL / 0 when disabled */
    int cache_on;
    int cache_cap;       /* max unreferenced cached blocks kept */
    uint64_t *hash;      /* owned [n_blocks]: chain hash of a cached block, 0 = none */
    int32_t *btok;       /* owned (n_blocks, block_size): a cached block's tokens */
    uint64_t *bparent;   /* owned [n_blocks]: chain hash before the block */
    int *lru_prev, *lru_next; /* owned [n_blocks]; -1 ends */
    int lru_head, lru_tail, n_lru;  /* head = least recently used */
    int *table;          /* owned [table_cap] open addressing: block id or -1 */
    int table_cap, n_cached;
    uint64_t hits, misses, evictions; /* blocks; read with loom_kv_counters */
    uint64_t tier_hits;  /* blocks restored from the tier */
    loom_kv_tier tier;   /* optional; fns NULL = none */
} loom_kv_pool;

/* A pool storing every layer as type. */
loom_status loom_kv_pool_create(int n_layers, int kv_dim, int block_size,
                                int n_blocks, loom_kv_type type, loom_kv_pool **out);
/* A pool storing layer l as spec[l] (spec: [n_layers]). */
loom_status loom_kv_pool_create_spec(int n_layers, int kv_dim, int block_size, int n_blocks,
                                     const loom_kv_spec *spec, loom_kv_pool **out);

void loom_kv_pool_free(loom_kv_pool *p);

/* Makes seq hold blocks for positions [0, n_tokens). Returns LOOM_ERR_NO_KV
 * (allocating nothing) if the pool cannot supply them. Does not change
 * seq->n_tokens: the forward sets it once the positions are written. */
loom_status loom_kv_seq_reserve(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens);
/* Drops positions from n_tokens on, releasing whole blocks past it. */
void loom_kv_seq_truncate(loom_kv_pool *p, loom_kv_seq *seq, int n_tokens);
/* Releases the blocks that lie wholly before position pos (they left every
 * layer's sliding window); their table entries become -1 and are never
 * read again. Returns how many were released. */
int loom_kv_seq_drop_before(loom_kv_pool *p, loom_kv_seq *seq, int pos);
/* Releases every block and the table. seq is empty afterwards. */
void loom_kv_seq_release(loom_kv_pool *p, loom_kv_seq *seq);

/* Marks (on) or unmarks every block reference of seq as parked: held by a
 * sequence kept for continuation (see design notes). Unmark before release. */
void loom_kv_seq_park(loom_kv_pool *p, const loom_kv_seq *seq, int on);
/* Maps the first n_tokens (> 0, <= src->n_tokens) of src into the empty
 * dst without copying (refcount + 1); a partial last block is copied, as
 * dst will write into it. LOOM_ERR_NO_KV (dst untouched but for its table)
 * when no block is available for that copy. */
loom_status loom_kv_seq_share(loom_kv_pool *p, loom_kv_seq *dst, const loom_kv_seq *src,
                              int n_tokens);

/* Blocks that can be handed out now: free plus evictable cached ones. */
static inline int loom_kv_available(const loom_kv_pool *p) { return p->n_free + p->n_lru; }

/* The prefix cache's counters so far. */
loom_kv_counts loom_kv_counters(const loom_kv_pool *p);
/* Counts n blocks that a lookup missed and that were then restored from
 * the tier by someone else (a restore thread) as hits from the tier. */
void loom_kv_count_restored(loom_kv_pool *p, int n);

/* Turns the prefix cache on, keeping at most cap_blocks unreferenced cached
 * blocks (0 = as many as the pool holds). Call before any sequence exists. */
loom_status loom_kv_cache_enable(loom_kv_pool *p, int cap_blocks);
/* A namespace seed for chain hashes from a string (model, layout, session). */
uint64_t loom_kv_namespace(const char *s, size_t n);
/* The chain hash of a full block of tokens after the chain hash parent. */
uint64_t loom_kv_chain_hash(uint64_t parent, const int32_t *tokens, int block_size);
/* Maps the longest cached run of full blocks of tokens[0, n) into the empty
 * sequence seq (which must hold no blocks), chaining from ns, never the
 * whole prompt: at least one token is left to compute. Returns the number
 * of tokens mapped (a multiple of block_size). */
int loom_kv_cache_lookup(loom_kv_pool *p, loom_kv_seq *seq, const int32_t *tokens, int n,
                         uint64_t ns);
/* Offers the sequence's newly completed full blocks to the cache. tokens
 * are the sequence's tokens [0, seq->n_tokens). */
void loom_kv_cache_commit(loom_kv_pool *p, loom_kv_seq *seq, const int32_t *tokens, uint64_t ns);
/* Drops every unreferenced cached block (e.g. when the namespace changes). */
void loom_kv_cache_clear(loom_kv_pool *p);
/* Drops the least recently used unreferenced cached block (to the tier, if
 * any). Returns 0 when there is none. */
int loom_kv_cache_evict_one(loom_kv_pool *p);
/* Lookups stop asking the tier to fetch (restores go elsewhere, e.g. a
 * restore thread); evicted blocks are still offered to spill. */
void loom_kv_tier_no_fetch(loom_kv_pool *p);
/* Offers every cached block to the tier (e.g. before shutdown). */
void loom_kv_cache_spill_all(loom_kv_pool *p);

#endif
