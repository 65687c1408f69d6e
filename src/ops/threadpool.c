/* threadpool: workers spin briefly on a generation counter (a forward
 * issues hundreds of short parallel-fors: ~225 per decoded token of a
 * 28-layer model), then sleep on a condvar. The caller only takes the
 * mutex to wake workers that are asleep, so a dispatch to spinning workers
 * is one atomic increment; it then waits for them yielding (on a shared
 * machine a worker may have lost its core).
 *
 * Sleeping without a lost wake-up: a worker increments `sleeping` and
 * re-reads `gen` under the mutex before waiting; run() bumps `gen` and
 * then reads `sleeping` (both sequentially consistent). Either run() sees
 * the sleeper and broadcasts under the mutex (after the worker waits), or
 * the worker sees the new generation and does not wait. */
#include "ops/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/base.h"

/* ~20-40 us of polling. A PAUSE in the loop (or a longer spin) measured
 * worse on a shared 2-core machine: the spinning worker holds a core the
 * caller or another process needs. */
#define SPIN_ITERS 20000

struct loom_pool {
    int n;                      /* threads including the caller */
    pthread_t *threads;         /* owned [n-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;            /* bumped per run; workers wait for change */
    atomic_int next;            /* next task index */
    atomic_int done;            /* workers finished with this run */
    atomic_int sleeping;        /* workers blocked (or about to) on cv */
    atomic_int stop;
    int n_tasks;
    loom_pool_fn fn;
    void *ctx;
};

typedef struct { loom_pool *p; int id; } worker_arg;

static void drain(loom_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    loom_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) continue;
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        drain(p, wa.id);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
    return NULL;
}

loom_status loom_pool_create(int n_threads, loom_pool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = loom_cpu_count();
    loom_pool *p = calloc(1, sizeof *p);
    if (!p) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        loom_pool_free(p);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){.p = p, .id = i};
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker, wa) != 0) {
            free(wa);
            p->n = i;
            loom_pool_free(p);
            return loom_err(LOOM_ERR_NOMEM, "cannot start worker thread %d", i);
        }
    }
    *out = p;
    return LOOM_OK;
}

void loom_pool_free(loom_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int loom_pool_size(const loom_pool *p) { return p ? p->n : 1; }

void loom_pool_run(loom_pool *p, int n_tasks, loom_pool_fn fn, void *ctx) {
    if (!p || p->n == 1 || n_tasks <= 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    drain(p, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n - 1) sched_yield();
}
