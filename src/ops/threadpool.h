/* threadpool: a fixed set of pthreads that run one parallel-for at a time.
 * The calling thread takes part, so a pool of n threads starts n-1
 * workers. Tasks are handed out with an atomic counter; run() returns when
 * all are done. Only one thread may call run() on a pool at a time (the
 * engine thread owns it). */
#ifndef LOOM_THREADPOOL_H
#define LOOM_THREADPOOL_H

#include "loom.h"

typedef struct loom_pool loom_pool;

/* fn(ctx, task, thread): thread is in [0, n_threads). */
typedef void (*loom_pool_fn)(void *ctx, int task, int thread);

loom_status loom_pool_create(int n_threads, loom_pool **out);
void loom_pool_free(loom_pool *p);
int loom_pool_size(const loom_pool *p);
void loom_pool_run(loom_pool *p, int n_tasks, loom_pool_fn fn, void *ctx);

#endif
