/* restore: reads prefix-cache blocks from the disk tier on a thread of its
 * own, so a request waiting for its blocks never holds up the engine step.
 *
 * The engine thread fills a job (which block files go into which of the
 * request's blocks), submits it and goes on stepping; the request sits in
 * the running set holding its blocks but takes no rows. The worker reads
 * the files in order, stopping at the first that fails, sets `done` and
 * calls notify. The engine thread then accounts the reads, puts the blocks
 * in the cache and lets the request prefill the rest. A job's blocks and
 * tokens must stay put until done: a cancelled request waits for its job
 * before it releases them. One worker runs the jobs in submission order,
 * so a slow file delays the restores queued behind it (never the step). */
#ifndef LOOM_RESTORE_H
#define LOOM_RESTORE_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/kvdisk.h"

typedef struct loom_restore_job {
    /* set by the engine thread before submit */
    int first;               /* sequence index of the first block to read */
    int n;                   /* block files to read, in chain order (may be 0) */
    uint64_t *hash, *parent; /* owned [n]: each block's chain hash and the one before */
    int *block;              /* owned [n]: pool blocks the request owns alone */
    const int32_t *tokens;   /* borrowed (n, block_size): each block's tokens */
    /* models with recurrent state: snapshot files worth reading, highest
     * boundary first; the first one read whole wins */
    int n_states;
    uint64_t *state_hash;    /* owned [n_states] */
    int *state_block;        /* owned [n_states]: sequence index of the block it ends */
    void *state;             /* owned [state_bytes]: the state read */
    size_t state_bytes;
    double t_submit;
    /* set by the worker, valid once done */
    int n_ok;                /* leading blocks read */
    int result;              /* LOOM_KVDISK_* of block n_ok when n_ok < n */
    const char *why;         /* static, for a damaged file */
    size_t *bytes;           /* owned [n]: file sizes read */
    int state_found;         /* index of the state read, or -1 */
    int state_tokens;        /* its boundary */
    int *state_result;       /* owned [n_states]: LOOM_KVDISK_* per state, -1 = not tried */
    const char **state_why;  /* owned [n_states] */
    atomic_int done;
    struct loom_restore_job *next; /* queue link, worker side */
} loom_restore_job;

typedef struct loom_restorer loom_restorer;

/* Starts the worker over disk tier d and pool p (both borrowed). notify
 * runs on the worker after each job. */
loom_status loom_restorer_create(loom_kvdisk *d, loom_kv_pool *p, void (*notify)(void *ctx), void *ctx,
                                 loom_restorer **out);
/* Waits for every submitted job, then stops the worker. */
void loom_restorer_free(loom_restorer *w);
/* A job for n blocks and n_states snapshot candidates of state_bytes
 * each (arrays allocated), or NULL when out of memory. */
loom_restore_job *loom_restore_job_new(int n, int n_states, size_t state_bytes);
void loom_restore_job_free(loom_restore_job *j);
void loom_restorer_submit(loom_restorer *w, loom_restore_job *j);
/* Blocks until every submitted job is done. */
void loom_restorer_drain(loom_restorer *w);

#endif
