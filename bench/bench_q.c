/* bench_q: workbench for the matmuls over MLX affine-quantized weights
 * (4- and 8-bit, group 64, bf16 scales), Qwen3-0.6B's MLP shapes. Validates
 * the exact table against the reference and the --fast table against the
 * fast reference, then times, for each table and the AVX2 peer:
 *   - decode (T = 1), single thread, weights cache-resident (hot): the
 *     kernel's compute rate in GB/s of weight bytes;
 *   - decode on the pool (all cores), weights cycling through copies past
 *     the last-level cache (cold): what a decode step sees;
 *   - prefill T = 512 on the pool, in GOP/s (2 per multiply-add).
 * "fast-il" is the --fast table on the matrices as a --fast model loads
 * them (loom_q_interleave: 16 rows interleaved).
 * With one thread (second argument 1) every figure is single-threaded and
 * timed in thread CPU time.
 * Each figure is the fastest of repeated calls over the budget.
 * Usage: bench_q [seconds per measurement, default 0.3] [threads, default all] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "ops/ops.h"
#include "ops/threadpool.h"

#define COLD_BYTES ((size_t)192 << 20)

static unsigned long long rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 40) / (double)(1ull << 23) - 1.0);
}

typedef struct {
    const loom_kernels *k;
    float *y;
    const float *x;
    const loom_qmat *w;
    int rows, T, tasks;
} job;

static void task_fn(void *ctx, int task, int thread) {
    (void)thread;
    const job *j = ctx;
    int per = ((j->rows + j->tasks - 1) / j->tasks + 15) & ~15;
    int r0 = task * per, r1 = LOOM_MIN(j->rows, r0 + per);
    if (r0 < r1) j->k->matmul_q(j->y, j->rows, j->x, j->w->n, j->w, j->T, r0, r1);
}

static void run(loom_pool *pool, const loom_kernels *k, float *y, const float *x,
                const loom_qmat *w, int rows, int T) {
    job j = {k, y, x, w, rows, T, 4 * loom_pool_size(pool)};
    if (!pool) k->matmul_q(y, rows, x, w->n, w, T, 0, rows);
    else loom_pool_run(pool, j.tasks, task_fn, &j);
}

/* This thread's CPU time: on a shared machine, single-thread figures that
 * leave out the time other processes held the core. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Fastest call over budget seconds, cycling through n_copies matrices
 * (CPU time without a pool, wall time with one). */
static double time_q(loom_pool *pool, const loom_kernels *k, float *y, const float *x,
                     const loom_qmat *w, int n_copies, int rows, int T, double budget) {
    for (int c = 0; c < n_copies; c++) run(pool, k, y, x, &w[c], rows, T);
    double best = 1e30, start = loom_now();
    int c = 0;
    do {
        double t0 = pool ? loom_now() : cpu_now();
        run(pool, k, y, x, &w[c], rows, T);
        double e = (pool ? loom_now() : cpu_now()) - t0;
        best = e < best ? e : best;
        c = (c + 1) % n_copies;
    } while (loom_now() - start < budget);
    return best;
}

static int check(const char *what, const float *y, const float *yr, size_t n) {
    double maxd = 0, maxy = 0;
    for (size_t i = 0; i < n; i++) {
        maxd = fmax(maxd, fabs((double)y[i] - yr[i]));
        maxy = fmax(maxy, fabs((double)yr[i]));
    }
    if (maxd > 1e-4 * maxy + 1e-5) {
        printf("%s MISMATCH: max |diff| %g (max |y| %g)\n", what, maxd, maxy);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    double budget = argc > 1 ? atof(argv[1]) : 0.3;
    if (!getenv("LOOM_KERNELS") && !loom_cpu_has_avx512())
        printf("no AVX-512 here: the exact and fast tables are the AVX2 one\n");
    const loom_kernels *ex = loom_kernels_get(), *fa = loom_kernels_get_fast();
    static loom_kernels avx2, ref_fast;
    avx2 = loom_kernels_ref;
#if defined(__x86_64__)
    avx2 = loom_kernels_over(avx2, &loom_kernels_avx2);
#endif
    avx2.name = "avx2";
    ref_fast = loom_kernels_over(loom_kernels_ref, &loom_kernels_ref_q_fast);
    /* where no table rounds activations (no AVX-512), --fast runs the exact
     * kernels: they are checked against the exact reference */
    const loom_kernels *fref = fa->matmul_q == ex->matmul_q ? &loom_kernels_ref : &ref_fast;
    int nt = argc > 2 ? atoi(argv[2]) : loom_cpu_count();
    loom_pool *pool = NULL;
    if (nt > 1 && loom_pool_create(nt, &pool) != LOOM_OK) pool = NULL;
    printf("bench_q: %s / %s / avx2, %d threads on the pool, %.2f s per measurement\n", ex->name,
           fa->name, loom_pool_size(pool), budget);
    static const int shapes[][2] = {{3072, 1024}, {1024, 3072}};
    const int T = 512;
    int fail = 0;
    for (int s = 0; s < 2; s++) {
        int rows = shapes[s][0], n = shapes[s][1];
        float *x = malloc((size_t)T * n * sizeof *x);
        float *y = malloc((size_t)T * rows * sizeof *y), *yr = malloc((size_t)T * rows * sizeof *yr);
        for (size_t i = 0; i < (size_t)T * n; i++) x[i] = frand();
        for (int bits = 4; bits <= 8; bits += 4) {
            int group = 64, ng = n / group;
            size_t words = (size_t)rows * n * bits / 32;
            double bytes = (double)words * 4 + (double)rows * ng * 4;
            int copies = (int)(COLD_BYTES / bytes);
            uint32_t *wq = malloc(words * sizeof *wq * copies);
            uint16_t *sc = malloc((size_t)rows * ng * 2), *bi = malloc((size_t)rows * ng * 2);
            for (size_t i = 0; i < words; i++) wq[i] = (uint32_t)(frand() * 4e9f);
            for (int c = 1; c < copies; c++) memcpy(wq + c * words, wq, words * sizeof *wq);
            for (size_t i = 0; i < (size_t)rows * ng; i++) {
                sc[i] = loom_f32_to_bf16(0.01f + 0.001f * frand());
                bi[i] = loom_f32_to_bf16(-0.08f + 0.01f * frand());
            }
            loom_qmat *q = malloc(sizeof *q * copies);
            for (int c = 0; c < copies; c++)
                q[c] = (loom_qmat){.w = wq + c * words, .scales = sc, .biases = bi, .n = n,
                                   .bits = bits, .group = group, .f16 = 0};
            /* the interleaved copies (or the row-major ones where the table has none) */
            loom_qmat *qi = malloc(sizeof *qi * copies);
            void **qmem = calloc((size_t)copies, sizeof *qmem);
            for (int c = 0; c < copies; c++)
                if (!fa->q_il16 || loom_q_interleave(&q[c], rows, &qi[c], &qmem[c]) != LOOM_OK)
                    qi[c] = q[c];
            char what[64];
            for (int tt = 0; tt < 2; tt++) {
                int TT = tt ? 64 : 1; /* the reference is slow: validate T = 64 */
                run(pool, ex, y, x, q, rows, TT);
                run(pool, &loom_kernels_ref, yr, x, q, rows, TT);
                snprintf(what, sizeof what, "q%d [%d x %d] T=%d exact", bits, rows, n, TT);
                fail |= !check(what, y, yr, (size_t)TT * rows);
                run(pool, fa, y, x, q, rows, TT);
                run(pool, fref, yr, x, q, rows, TT);
                snprintf(what, sizeof what, "q%d [%d x %d] T=%d fast", bits, rows, n, TT);
                fail |= !check(what, y, yr, (size_t)TT * rows);
                run(pool, fa, y, x, qi, rows, TT);
                snprintf(what, sizeof what, "q%d [%d x %d] T=%d fast-il", bits, rows, n, TT);
                fail |= !check(what, y, yr, (size_t)TT * rows);
            }
            if (!fail) {
                const loom_kernels *tabs[4] = {ex, fa, &avx2, fa};
                const loom_qmat *qs[4] = {q, q, q, qi};
                double hot[4], cold[4], pf[4];
                for (int i = 0; i < 4; i++) {
                    hot[i] = time_q(NULL, tabs[i], y, x, qs[i], 1, rows, 1, budget);
                    cold[i] = time_q(pool, tabs[i], y, x, qs[i], copies, rows, 1, budget);
                    pf[i] = time_q(pool, tabs[i], y, x, qs[i], 1, rows, T, budget);
                }
                double op = 2.0 * rows * n * T;
                printf("q%d [%4d x %4d] decode hot 1 thread GB/s: exact %5.1f fast %5.1f avx2 %5.1f "
                       "fast-il %5.1f | cold pool GB/s: exact %5.1f fast %5.1f avx2 %5.1f fast-il "
                       "%5.1f | prefill T=%d GOP/s: exact %5.1f fast %5.1f avx2 %5.1f fast-il %5.1f\n",
                       bits, rows, n, bytes / hot[0] / 1e9, bytes / hot[1] / 1e9, bytes / hot[2] / 1e9,
                       bytes / hot[3] / 1e9, bytes / cold[0] / 1e9, bytes / cold[1] / 1e9,
                       bytes / cold[2] / 1e9, bytes / cold[3] / 1e9, T, op / pf[0] / 1e9,
                       op / pf[1] / 1e9, op / pf[2] / 1e9, op / pf[3] / 1e9);
                fflush(stdout);
            }
            for (int c = 0; c < copies; c++) loom_free(qmem[c]);
            free(qmem);
            free(qi);
            free(q);
            free(wq);
            free(sc);
            free(bi);
        }
        free(x);
        free(y);
        free(yr);
    }
    loom_pool_free(pool);
    if (fail) printf("validation FAILED; timings skipped for the failing cases\n");
    return fail;
}
