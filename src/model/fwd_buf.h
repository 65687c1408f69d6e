/* fwd_buf: the owned buffers of a forward state and of its features'
 * states, recorded as they are made so that one call frees them all and a
 * buffer added to a state cannot be missed on the way out. Each is its
 * own allocation, so the sanitizers see an overrun of any one. */
#ifndef LOOM_FWD_BUF_H
#define LOOM_FWD_BUF_H

#include <assert.h>
#include <stddef.h>

#include "base/base.h"

#define LOOM_FWD_BUFS 64

typedef struct loom_fwd_bufs {
    void *p[LOOM_FWD_BUFS]; /* owned, zeroed (loom_alloc) */
    int n;
    int failed;             /* an allocation failed: the state is unusable */
} loom_fwd_bufs;

static inline void *loom_fwd_buf(loom_fwd_bufs *b, size_t bytes) {
    assert(b->n < LOOM_FWD_BUFS); /* a state of more buffers raises the bound */
    void *p = loom_alloc(bytes);
    if (p) b->p[b->n++] = p;
    else b->failed = 1;
    return p;
}

/* p = n zeroed elements of its type, recorded in b. */
#define LOOM_FWD_BUF(b, p, n) ((p) = loom_fwd_buf((b), (size_t)(n) * sizeof *(p)))

static inline void loom_fwd_bufs_free(loom_fwd_bufs *b) {
    for (int i = 0; i < b->n; i++) loom_free(b->p[i]);
    b->n = 0;
}

#endif
