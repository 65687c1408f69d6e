/* snapshot: a small LRU of state copies. Few entries live at once (states
 * are large), so lookups scan. */
#include "engine/snapshot.h"

#include <stdlib.h>

#include "base/base.h"

typedef struct snap {
    uint64_t hash, age;
    int n_tokens;
    void *state;          /* owned [state_bytes] */
} snap;

struct loom_snapshots {
    size_t state_bytes;
    int cap;              /* entries that fit the byte cap */
    snap *e;              /* owned [cap] */
    int n;
    uint64_t clock;
    loom_snapshot_spill spill;
    void *spill_ctx;
};

void loom_snapshots_set_spill(loom_snapshots *s, loom_snapshot_spill fn, void *ctx) {
    s->spill = fn;
    s->spill_ctx = ctx;
}

void loom_snapshots_spill_all(loom_snapshots *s) {
    for (int i = 0; s->spill && i < s->n; i++)
        if (s->e[i].hash) s->spill(s->spill_ctx, s->e[i].hash, s->e[i].n_tokens, s->e[i].state);
}

loom_status loom_snapshots_create(size_t state_bytes, size_t cap_bytes, loom_snapshots **out) {
    *out = NULL;
    loom_snapshots *s = calloc(1, sizeof *s);
    if (!s) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    s->state_bytes = state_bytes;
    s->cap = (int)LOOM_MIN(LOOM_MAX(cap_bytes / LOOM_MAX(state_bytes, 1), 1), 4096);
    s->e = calloc((size_t)s->cap, sizeof *s->e);
    if (!s->e) {
        free(s);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return LOOM_OK;
}

void loom_snapshots_free(loom_snapshots *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->e[i].state);
    free(s->e);
    free(s);
}

const void *loom_snapshots_find(loom_snapshots *s, uint64_t hash, int *n_tokens) {
    for (int i = 0; i < s->n; i++)
        if (s->e[i].hash == hash) {
            s->e[i].age = ++s->clock;
            *n_tokens = s->e[i].n_tokens;
            return s->e[i].state;
        }
    return NULL;
}

void *loom_snapshots_put(loom_snapshots *s, uint64_t hash, int n_tokens) {
    int dummy;
    if (loom_snapshots_find(s, hash, &dummy)) return NULL;
    void *buf;
    if (s->n < s->cap) {
        buf = malloc(s->state_bytes);
        if (!buf) return NULL;
        s->e[s->n++] = (snap){.state = buf};
    }
    int at = s->n - 1;
    if (s->e[at].hash) { /* full: reuse the least recently used entry's buffer */
        for (int i = 0; i < s->n; i++)
            if (s->e[i].age < s->e[at].age) at = i;
        if (s->spill) s->spill(s->spill_ctx, s->e[at].hash, s->e[at].n_tokens, s->e[at].state);
    }
    s->e[at].hash = hash;
    s->e[at].n_tokens = n_tokens;
    s->e[at].age = ++s->clock;
    return s->e[at].state;
}

int loom_snapshots_count(const loom_snapshots *s) { return s->n; }
