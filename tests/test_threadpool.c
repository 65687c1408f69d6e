/* test_threadpool: loom_pool runs every task exactly once per run, with the
 * thread index in range, across many runs of varied sizes, for pools of one
 * and several threads. Meant to be run under ThreadSanitizer as well. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "ops/threadpool.h"
#include "test.h"

typedef struct {
    atomic_int *hits;   /* [n_tasks] times each task ran */
    atomic_int bad_thread;
    int n_threads;
    int *plain;         /* [n_tasks] written without atomics: each task owns its slot */
    int stamp;
} run_ctx;

static void count_task(void *vctx, int task, int thread) {
    run_ctx *c = vctx;
    atomic_fetch_add_explicit(&c->hits[task], 1, memory_order_relaxed);
    if (thread < 0 || thread >= c->n_threads)
        atomic_fetch_add_explicit(&c->bad_thread, 1, memory_order_relaxed);
    /* Plain writes must be visible to the caller once run() returns. */
    c->plain[task] = c->stamp + task;
}

/* Runs n_tasks once and checks every task ran exactly once. Returns 1 if ok. */
static int run_once(loom_pool *p, int n_tasks, int stamp) {
    run_ctx c = {0};
    int cap = n_tasks ? n_tasks : 1;
    c.hits = calloc((size_t)cap, sizeof *c.hits);
    c.plain = calloc((size_t)cap, sizeof *c.plain);
    c.n_threads = loom_pool_size(p);
    c.stamp = stamp;
    loom_pool_run(p, n_tasks, count_task, &c);
    int ok = atomic_load(&c.bad_thread) == 0;
    for (int t = 0; t < n_tasks; t++)
        ok &= atomic_load(&c.hits[t]) == 1 && c.plain[t] == stamp + t;
    free(c.hits);
    free(c.plain);
    return ok;
}

static void test_pool(int n_threads, int runs) {
    loom_pool *p = NULL;
    CHECK_EQ_INT(loom_pool_create(n_threads, &p), LOOM_OK);
    CHECK(p != NULL);
    if (!p) return;
    CHECK_EQ_INT(loom_pool_size(p), n_threads);
    const int counts[] = {0, 1, 2, n_threads, n_threads + 1, 7, 64, 1000};
    int fails = 0;
    for (int i = 0; i < runs; i++) {
        int n = counts[i % (int)(sizeof counts / sizeof counts[0])];
        if (!run_once(p, n, i * 7919)) fails++;
    }
    CHECKF(fails == 0, "pool of %d: %d of %d runs went wrong", n_threads, fails, runs);
    loom_pool_free(p);
}

/* Tasks whose cost varies a lot, so threads finish at different times and a
 * slow worker is still inside a task when the others are done. */
typedef struct {
    atomic_int sum;
} skew_ctx;

static void skew_task(void *vctx, int task, int thread) {
    (void)thread;
    skew_ctx *c = vctx;
    volatile unsigned x = (unsigned)task;
    int iters = (task % 5 == 0) ? 20000 : 10;
    for (int i = 0; i < iters; i++) x = x * 1664525u + 1013904223u;
    atomic_fetch_add_explicit(&c->sum, task, memory_order_relaxed);
}

static void test_skewed(void) {
    loom_pool *p = NULL;
    CHECK_EQ_INT(loom_pool_create(4, &p), LOOM_OK);
    if (!p) return;
    int fails = 0;
    for (int r = 0; r < 200; r++) {
        skew_ctx c = {0};
        int n = 3 + r % 40;
        loom_pool_run(p, n, skew_task, &c);
        if (atomic_load(&c.sum) != n * (n - 1) / 2) fails++;
    }
    CHECKF(fails == 0, "skewed: %d runs lost tasks", fails);
    loom_pool_free(p);
}

/* After an idle pause long enough for workers to fall asleep on the condvar,
 * a run must still wake them and complete. */
static void test_sleep_wake(void) {
    loom_pool *p = NULL;
    CHECK_EQ_INT(loom_pool_create(3, &p), LOOM_OK);
    if (!p) return;
    for (int i = 0; i < 5; i++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        CHECK(run_once(p, 50, i));
    }
    loom_pool_free(p);
}

int main(void) {
    /* Create/free without any run, for several sizes. */
    for (int n = 1; n <= 8; n++) {
        loom_pool *p = NULL;
        CHECK_EQ_INT(loom_pool_create(n, &p), LOOM_OK);
        CHECK_EQ_INT(loom_pool_size(p), n);
        loom_pool_free(p);
    }
    loom_pool_free(NULL);
    CHECK_EQ_INT(loom_pool_size(NULL), 1);
    /* n_threads <= 0 means one per CPU. */
    loom_pool *p = NULL;
    CHECK_EQ_INT(loom_pool_create(0, &p), LOOM_OK);
    CHECK(p && loom_pool_size(p) >= 1);
    CHECK(run_once(p, 100, 1));
    loom_pool_free(p);
    /* A NULL pool runs inline. */
    CHECK(run_once(NULL, 10, 3));

    test_pool(1, 2000);
    test_pool(2, 5000);
    test_pool(3, 3000);
    test_pool(8, 1000);
    test_skewed();
    test_sleep_wake();
    return test_report("test_threadpool");
}
