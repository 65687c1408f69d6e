/* snapshot: saved recurrent state at chosen prompt boundaries.
 *
 * Linear-attention layers keep one running state per sequence, which
 * cannot be cut back to a shorter prefix the way paged KV can. So a
 * prefix-cache hit on such a model is only usable up to a boundary where
 * the state was saved. Snapshots are keyed by the chain hash of the block
 * ending at the boundary (the same key the KV blocks use, so namespaces and
 * sessions apply), hold the boundary's token count and a copy of the state,
 * and are evicted least recently used under a byte cap. Engine thread only. */
#ifndef LOOM_SNAPSHOT_H
#define LOOM_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

typedef struct loom_snapshots loom_snapshots;

/* spill, when set, sees every snapshot about to be evicted (and, through
 * loom_snapshots_spill_all, the rest), e.g. to write it to disk. */
typedef void (*loom_snapshot_spill)(void *ctx, uint64_t hash, int n_tokens, const void *state);

loom_status loom_snapshots_create(size_t state_bytes, size_t cap_bytes, loom_snapshots **out);
void loom_snapshots_set_spill(loom_snapshots *s, loom_snapshot_spill fn, void *ctx);
void loom_snapshots_spill_all(loom_snapshots *s);
void loom_snapshots_free(loom_snapshots *s);
/* The state saved at the boundary with this chain hash, or NULL; *n_tokens
 * receives the boundary. Marks it recently used. */
const void *loom_snapshots_find(loom_snapshots *s, uint64_t hash, int *n_tokens);
/* Room for a state under hash (evicting old ones), or NULL when it already
 * exists or cannot be had. The caller fills the returned buffer. */
void *loom_snapshots_put(loom_snapshots *s, uint64_t hash, int n_tokens);
int loom_snapshots_count(const loom_snapshots *s);

#endif
