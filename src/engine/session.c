/* session: a small LRU of parked sequences. Entries are few next to the
 * pool's blocks, so lookups scan. Slots never move (an empty one has key
 * 0), so an entry pointer stays valid while others are evicted. */
#include "engine/session.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/base.h"

struct loom_sessions {
    loom_kv_pool *kv;      /* borrowed */
    loom_session *e;       /* owned [cap] slots */
    int n, cap;            /* n slots in use */
    size_t state_bytes;
    int max_states;        /* entries with a state that fit the state cap */
    uint64_t clock;
    uint64_t evictions;    /* entries dropped for room, by any caller */
};

loom_status loom_sessions_create(loom_kv_pool *kv, int max_entries, size_t state_bytes,
                                 size_t state_cap, loom_sessions **out) {
    *out = NULL;
    loom_sessions *s = calloc(1, sizeof *s);
    if (!s) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    s->kv = kv;
    s->state_bytes = state_bytes;
    s->cap = LOOM_MAX(max_entries, 1);
    if (state_bytes) s->cap = (int)LOOM_MIN((size_t)s->cap, LOOM_MAX(state_cap / state_bytes, 1));
    s->e = calloc((size_t)s->cap, sizeof *s->e);
    if (!s->e) {
        free(s);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return LOOM_OK;
}

static void drop(loom_sessions *s, int i) {
    loom_session *x = &s->e[i];
    loom_kv_seq_park(s->kv, &x->seq, 0);
    loom_kv_seq_release(s->kv, &x->seq);
    free(x->tokens);
    free(x->state);
    *x = (loom_session){0};
    s->n--;
}

void loom_sessions_free(loom_sessions *s) {
    if (!s) return;
    for (int i = 0; i < s->cap; i++)
        if (s->e[i].key) drop(s, i);
    free(s->e);
    free(s);
}

uint64_t loom_sessions_key(const char *kind, const char *id) {
    /* the kind seeds the hash, so a response id and a session id never meet */
    uint64_t h = XXH3_64bits_withSeed(id, strlen(id), XXH3_64bits(kind, strlen(kind)));
    return h ? h : 1;
}

loom_session *loom_sessions_find(loom_sessions *s, uint64_t key, uint64_t ns) {
    if (!key) return NULL;
    for (int i = 0; i < s->cap; i++) {
        loom_session *x = &s->e[i];
        if (x->key && (x->key == key || x->alias == key) && x->ns == ns) {
            x->age = ++s->clock;
            return x;
        }
    }
    return NULL;
}

int loom_sessions_evict_one(loom_sessions *s) {
    int at = -1;
    for (int i = 0; i < s->cap; i++)
        if (s->e[i].key && !s->e[i].pinned && (at < 0 || s->e[i].age < s->e[at].age)) at = i;
    if (at < 0) return 0;
    drop(s, at);
    s->evictions++;
    return 1;
}

loom_session *loom_sessions_put(loom_sessions *s, uint64_t key, uint64_t alias, uint64_t ns,
                                loom_kv_seq *seq, const int32_t *tokens) {
    for (int i = 0; i < s->cap; i++) {
        if (!s->e[i].key) continue;
        if (s->e[i].key == key && !s->e[i].pinned) drop(s, i);
        else if (alias && s->e[i].alias == alias) s->e[i].alias = 0;
    }
    if (s->n == s->cap) loom_sessions_evict_one(s);
    int at = 0;
    while (at < s->cap && s->e[at].key) at++;
    int32_t *tok = malloc(sizeof *tok * (size_t)LOOM_MAX(seq->n_tokens, 1));
    void *state = s->state_bytes ? malloc(s->state_bytes) : NULL;
    if (at == s->cap || !tok || (s->state_bytes && !state)) {
        free(tok);
        free(state);
        loom_kv_seq_release(s->kv, seq);
        return NULL;
    }
    memcpy(tok, tokens, sizeof *tok * (size_t)seq->n_tokens);
    loom_session *x = &s->e[at];
    s->n++;
    *x = (loom_session){.key = key, .alias = alias, .ns = ns, .tokens = tok, .seq = *seq,
                        .state = state, .age = ++s->clock};
    *seq = (loom_kv_seq){0};
    loom_kv_seq_park(s->kv, &x->seq, 1);
    return x;
}

int loom_sessions_count(const loom_sessions *s) { return s->n; }
uint64_t loom_sessions_evictions(const loom_sessions *s) { return s->evictions; }
