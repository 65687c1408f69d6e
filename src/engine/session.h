/* session: finished sequences kept whole so a later request continues them.
 *
 * When a request that asked for it finishes, the engine parks its sequence
 * here under a key (a response id, and optionally the latest turn of a
 * cache session): every KV block including the partial last one, the
 * tokens those blocks hold, and for models with recurrent state a copy of
 * the state after the last token. A later request naming the key resumes
 * from it when its prompt extends those tokens (see engine.c).
 *
 * Memory. Parked blocks stay in the KV pool and count as reclaimable (see
 * kv.h): when the pool runs short the engine evicts the least recently
 * used entries, never a pinned one (an entry is pinned only while a
 * request maps it). Entries are also capped in number and in state bytes.
 * Engine thread only. */
#ifndef LOOM_SESSION_H
#define LOOM_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv.h"

typedef struct loom_session {
    uint64_t key;          /* hash of the id the sequence was kept under; 0 = empty slot */
    uint64_t alias;        /* second key (a cache session's latest turn), 0 = none */
    uint64_t ns;           /* prefix-cache namespace of the request that made it */
    int32_t *tokens;       /* owned [seq.n_tokens]: the tokens in KV (their keys:
                              an image's placeholders hold its hash) */
    loom_kv_seq seq;       /* owned, parked block references */
    void *state;           /* owned [state_bytes] recurrent state after the tokens, or NULL */
    uint64_t age;
    int pinned;            /* a request is mapping it: not evictable */
} loom_session;

typedef struct loom_sessions loom_sessions;

/* max_entries bounds the entries; state_bytes is the size of one
 * recurrent state (0 for models without), state_cap bounds their sum. */
loom_status loom_sessions_create(loom_kv_pool *kv, int max_entries, size_t state_bytes,
                                 size_t state_cap, loom_sessions **out);
/* Releases every entry's blocks into the pool. */
void loom_sessions_free(loom_sessions *s);
/* The entry kept under key (or with it as alias) in namespace ns, or NULL.
 * Marks it recently used. */
loom_session *loom_sessions_find(loom_sessions *s, uint64_t key, uint64_t ns);
/* Parks seq (moved in: *seq is empty afterwards) with its tokens
 * [0, seq->n_tokens) under key and alias, replacing an entry with the same
 * key and taking the alias from any other. Returns the entry, whose state
 * buffer (if any) the caller fills, or NULL when it cannot be kept (the
 * sequence is then released). */
loom_session *loom_sessions_put(loom_sessions *s, uint64_t key, uint64_t alias, uint64_t ns,
                                loom_kv_seq *seq, const int32_t *tokens);
/* Drops the least recently used unpinned entry. Returns 0 when none. */
int loom_sessions_evict_one(loom_sessions *s);
int loom_sessions_count(const loom_sessions *s);
/* Entries evicted so far: for the pool, the prefix-cache cap or the
 * entry cap (a put into a full store). Replaced entries do not count. */
uint64_t loom_sessions_evictions(const loom_sessions *s);
/* Key of an id string (never 0). */
uint64_t loom_sessions_key(const char *kind, const char *id);

#endif
