/* bench_ops: single-thread matmul workbench. Validates the selected kernel
 * table against the reference first, then times
 *   - decode matvec (T = 1) for f32 / f16 / bf16 weights of the Qwen3-0.6B
 *     MLP shapes [3072 x 1024] and [1024 x 3072], in GB/s of weight bytes:
 *     "hot" reuses one matrix (cache-resident), "cold" cycles through copies
 *     larger than the last-level cache (memory bandwidth);
 *   - a small decode batch (T = 4, cold), in GB/s of weight bytes;
 *   - prefill (T = 64) in GFLOP/s,
 * and prints each next to the reference kernel timed in the same run.
 * Each figure is the fastest of repeated calls (robust to a busy machine).
 * Usage: bench_ops [seconds per measurement, default 0.3] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"
#include "ops/threadpool.h"

enum { W_F32, W_F16, W_BF16 };
static const char *DT_NAME[] = {"f32", "f16", "bf16"};
static const size_t DT_SIZE[] = {4, 2, 2};

#define COLD_BYTES ((size_t)192 << 20) /* well past a 32 MiB L3 */

static unsigned long long rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 40) / (double)(1ull << 23) - 1.0);
}

static void mm_range(const loom_kernels *k, int dt, float *y, const float *x, const void *w,
                     int rows, int n, int T, int r0, int r1) {
    if (dt == W_F32) k->matmul_f32(y, rows, x, n, w, n, T, r0, r1);
    else if (dt == W_F16) k->matmul_f16(y, rows, x, n, w, n, T, r0, r1);
    else k->matmul_bf16(y, rows, x, n, w, n, T, r0, r1);
}

/* With g_pool set, mm() splits the rows into g_tasks slices on the pool,
 * the way the model code parallelizes a matmul. */
static loom_pool *g_pool;
static int g_tasks;

typedef struct {
    const loom_kernels *k;
    int dt, rows, n, T;
    float *y;
    const float *x;
    const void *w;
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
    (void)thread;
    const mm_job *j = ctx;
    int per = (j->rows / g_tasks + 3) & ~3; /* whole 4-row groups */
    int r0 = task * per, r1 = LOOM_MIN(j->rows, r0 + per);
    if (r0 < r1) mm_range(j->k, j->dt, j->y, j->x, j->w, j->rows, j->n, j->T, r0, r1);
}

static void mm(const loom_kernels *k, int dt, float *y, const float *x, const void *w,
               int rows, int n, int T) {
    if (!g_pool) {
        mm_range(k, dt, y, x, w, rows, n, T, 0, rows);
        return;
    }
    mm_job j = {k, dt, rows, n, T, y, x, w};
    loom_pool_run(g_pool, g_tasks, mm_task, &j);
}

static void fill_w(void *w, int dt, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float v = frand();
        if (dt == W_F32) ((float *)w)[i] = v;
        else if (dt == W_F16) ((uint16_t *)w)[i] = loom_f32_to_f16(v);
        else ((uint16_t *)w)[i] = loom_f32_to_bf16(v);
    }
}

/* Seconds per call: the fastest single call over `budget` seconds, calls
 * cycling through the copies w[0..n_copies) so that with copies larger than
 * the caches every call streams its weights from memory. The minimum keeps
 * other processes on a busy machine out of the result as far as possible. */
static double time_mm(const loom_kernels *k, int dt, float *y, const float *x,
                      char *w, size_t wbytes, int n_copies, int rows, int n, int T,
                      double budget) {
    for (int c = 0; c < n_copies; c++) /* warm up, and evict the first copies */
        mm(k, dt, y, x, w + (size_t)c * wbytes, rows, n, T);
    double best = 1e30, start = loom_now();
    int c = 0;
    do {
        double t0 = loom_now();
        mm(k, dt, y, x, w + (size_t)c * wbytes, rows, n, T);
        double t = loom_now() - t0;
        best = t < best ? t : best;
        c = (c + 1) % n_copies;
    } while (loom_now() - start < budget);
    return best;
}

/* The reference validate() compares with (the --fast tables have their own). */
static const loom_kernels *g_ref = &loom_kernels_ref;

/* Largest |fast - ref| relative to the sum of |terms| of that output. */
static int validate(const loom_kernels *k, int dt, const void *w, const float *x,
                    int rows, int n, int T) {
    float *y = malloc((size_t)T * rows * sizeof *y), *yr = malloc((size_t)T * rows * sizeof *yr);
    mm(k, dt, y, x, w, rows, n, T);
    mm(g_ref, dt, yr, x, w, rows, n, T);
    int ok = 1;
    for (int t = 0; t < T && ok; t++)
        for (int r = 0; r < rows; r++) {
            double sa = 0;
            for (int i = 0; i < n; i++) {
                size_t j = (size_t)r * n + i;
                float wv = dt == W_F32 ? ((const float *)w)[j]
                         : dt == W_F16 ? loom_f16_to_f32(((const uint16_t *)w)[j])
                                       : loom_bf16_to_f32(((const uint16_t *)w)[j]);
                sa += fabs((double)x[(size_t)t * n + i] * wv);
            }
            size_t o = (size_t)t * rows + r;
            if (fabs((double)y[o] - yr[o]) > 1e-5 * sa + 1e-6) {
                fprintf(stderr, "MISMATCH %s [%d x %d] T=%d t=%d r=%d: %.9g vs %.9g\n",
                        DT_NAME[dt], rows, n, T, t, r, y[o], yr[o]);
                ok = 0;
                break;
            }
        }
    free(y);
    free(yr);
    return ok;
}

int main(int argc, char **argv) {
    double budget = argc > 1 ? atof(argv[1]) : 0.3;
    const loom_kernels *k = loom_kernels_get();
    const loom_kernels *ref = &loom_kernels_ref;
    printf("kernels: %s (peer: ref), single thread, %.2f s per measurement\n", k->name, budget);
    static const int shapes[][2] = {{3072, 1024}, {1024, 3072}};
    const int T = 64;
    int fail = 0;
    for (int s = 0; s < 2; s++) {
        int rows = shapes[s][0], n = shapes[s][1];
        float *x = malloc((size_t)T * n * sizeof *x);
        float *y = malloc((size_t)T * rows * sizeof *y);
        for (size_t i = 0; i < (size_t)T * n; i++) x[i] = frand();
        for (int dt = 0; dt < 3; dt++) {
            size_t wbytes = (size_t)rows * n * DT_SIZE[dt];
            int copies = (int)(COLD_BYTES / wbytes);
            char *w = malloc(wbytes * (size_t)copies);
            if (!w) { fprintf(stderr, "out of memory\n"); return 1; }
            fill_w(w, dt, (size_t)rows * n);
            for (int c = 1; c < copies; c++) memcpy(w + (size_t)c * wbytes, w, wbytes);
            if (!validate(k, dt, w, x, rows, n, 1) || !validate(k, dt, w, x, rows, n, T)) {
                fail = 1;
                free(w);
                continue;
            }
            double gb = (double)wbytes / 1e9, flop = 2.0 * rows * n * T;
            double hot = time_mm(k, dt, y, x, w, wbytes, 1, rows, n, 1, budget);
            double cold = time_mm(k, dt, y, x, w, wbytes, copies, rows, n, 1, budget);
            double hot_r = time_mm(ref, dt, y, x, w, wbytes, 1, rows, n, 1, budget);
            double cold_r = time_mm(ref, dt, y, x, w, wbytes, copies, rows, n, 1, budget);
            double b4 = time_mm(k, dt, y, x, w, wbytes, copies, rows, n, 4, budget);
            double pf = time_mm(k, dt, y, x, w, wbytes, 1, rows, n, T, budget);
            double pf_r = time_mm(ref, dt, y, x, w, wbytes, 1, rows, n, T, budget);
            printf("%-4s [%4d x %4d]  matvec hot %6.1f GB/s (ref %5.1f, x%4.1f)  "
                   "cold %6.1f GB/s (ref %5.1f, x%4.1f)  batch T=4 cold %6.1f GB/s  "
                   "prefill T=%d %6.1f GFLOP/s (ref %5.2f, x%5.1f)\n",
                   DT_NAME[dt], rows, n, gb / hot, gb / hot_r, hot_r / hot, gb / cold,
                   gb / cold_r, cold_r / cold, gb / b4, T, flop / pf / 1e9, flop / pf_r / 1e9,
                   pf_r / pf);
            fflush(stdout);
            free(w);
        }
        free(x);
        free(y);
    }
    /* Affine-quantized weights (MLX layout, bf16 scales/biases, group 64):
     * bytes counted are the packed weights plus scales and biases. */
    for (int s = 0; s < 2 && !fail; s++) {
        int rows = shapes[s][0], n = shapes[s][1];
        float *x = malloc((size_t)T * n * sizeof *x);
        float *y = malloc((size_t)T * rows * sizeof *y), *yr = malloc((size_t)T * rows * sizeof *yr);
        for (size_t i = 0; i < (size_t)T * n; i++) x[i] = frand();
        static const int bitss[] = {4, 8};
        for (int b = 0; b < 2; b++) {
            int bits = bitss[b], group = 64, ng = n / group;
            size_t words = (size_t)rows * n * bits / 32;
            uint32_t *wq = malloc(words * sizeof *wq);
            uint16_t *sc = malloc((size_t)rows * ng * 2), *bi = malloc((size_t)rows * ng * 2);
            for (size_t i = 0; i < words; i++) wq[i] = (uint32_t)(frand() * 4e9f);
            for (size_t i = 0; i < (size_t)rows * ng; i++) {
                sc[i] = loom_f32_to_bf16(0.01f + 0.001f * frand());
                bi[i] = loom_f32_to_bf16(-0.08f + 0.01f * frand());
            }
            loom_qmat q = {.w = wq, .scales = sc, .biases = bi, .n = n, .bits = bits,
                           .group = group, .f16 = 0};
            double bytes = (double)words * 4 + (double)rows * ng * 4;
            double t[2][2];
            for (int v = 0; v < 2; v++) { /* v = 0: fast table, 1: reference */
                const loom_kernels *kk = v ? ref : k;
                for (int tt = 0; tt < 2; tt++) {
                    int TT = tt ? T : 1;
                    kk->matmul_q(v ? yr : y, rows, x, n, &q, TT, 0, rows);
                    double best = 1e30, start = loom_now();
                    do {
                        double t0 = loom_now();
                        kk->matmul_q(v ? yr : y, rows, x, n, &q, TT, 0, rows);
                        double e = loom_now() - t0;
                        best = e < best ? e : best;
                    } while (loom_now() - start < budget);
                    t[v][tt] = best;
                }
            }
            /* Validate the T = T outputs against the reference. */
            double maxd = 0, maxy = 0;
            for (size_t i = 0; i < (size_t)T * rows; i++) {
                maxd = fmax(maxd, fabs((double)y[i] - yr[i]));
                maxy = fmax(maxy, fabs((double)yr[i]));
            }
            if (maxd > 1e-4 * maxy + 1e-5) {
                printf("q%d MISMATCH: max |diff| %g (max |y| %g)\n", bits, maxd, maxy);
                fail = 1;
            }
            double flop = 2.0 * rows * n * T;
            printf("q%d g64 [%4d x %4d]  matvec hot %6.1f GB/s (ref %5.2f, x%5.1f)  "
                   "prefill T=%d %6.1f GFLOP/s (ref %5.2f, x%5.1f)\n",
                   bits, rows, n, bytes / t[0][0] / 1e9, bytes / t[1][0] / 1e9, t[1][0] / t[0][0],
                   T, flop / t[0][1] / 1e9, flop / t[1][1] / 1e9, t[1][1] / t[0][1]);
            fflush(stdout);
            free(wq);
            free(sc);
            free(bi);
        }
        free(x);
        free(y);
        free(yr);
    }
    /* All cores through the pool (what decode actually sees), fast table only. */
    int nt = loom_cpu_count();
    if (!fail && nt > 1 && loom_pool_create(nt, &g_pool) == LOOM_OK) {
        g_tasks = 4 * nt;
        printf("%d threads (pool, %d row slices):\n", nt, g_tasks);
        for (int s = 0; s < 2; s++) {
            int rows = shapes[s][0], n = shapes[s][1];
            float *x = malloc((size_t)T * n * sizeof *x);
            float *y = malloc((size_t)T * rows * sizeof *y);
            for (size_t i = 0; i < (size_t)T * n; i++) x[i] = frand();
            for (int dt = 0; dt < 3; dt++) {
                size_t wbytes = (size_t)rows * n * DT_SIZE[dt];
                int copies = (int)(COLD_BYTES / wbytes);
                char *w = malloc(wbytes * (size_t)copies);
                if (!w) break;
                fill_w(w, dt, (size_t)rows * n);
                for (int c = 1; c < copies; c++) memcpy(w + (size_t)c * wbytes, w, wbytes);
                if (!validate(k, dt, w, x, rows, n, 1) || !validate(k, dt, w, x, rows, n, T)) {
                    fail = 1;
                    free(w);
                    continue;
                }
                double gb = (double)wbytes / 1e9, flop = 2.0 * rows * n * T;
                double cold = time_mm(k, dt, y, x, w, wbytes, copies, rows, n, 1, budget);
                double pf = time_mm(k, dt, y, x, w, wbytes, 1, rows, n, T, budget);
                printf("%-4s [%4d x %4d]  matvec cold %6.1f GB/s  prefill T=%d %6.1f GFLOP/s\n",
                       DT_NAME[dt], rows, n, gb / cold, T, flop / pf / 1e9);
                fflush(stdout);
                free(w);
            }
            free(x);
            free(y);
        }
        loom_pool_free(g_pool);
        g_pool = NULL;
    }
    /* Prompt-sized prefill (T = 512, x 2 MiB: past L2, as in the model)
     * on the pool, exact and --fast tables against the AVX2 one, and the
     * FMA peak of this machine measured in the same run. */
    if (!fail && loom_pool_create(nt, &g_pool) == LOOM_OK) {
        const int TP = 512;
        const loom_kernels *fast = loom_kernels_get_fast();
        static loom_kernels avx2;
        int have_avx2 = 0;
#if defined(__x86_64__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            avx2 = loom_kernels_over(loom_kernels_ref, &loom_kernels_avx2);
            have_avx2 = 1;
        }
#endif
        g_tasks = 4 * nt;
        loom_pool *pool = g_pool;
        for (int pass = 0; pass < 2; pass++) {
        g_pool = pass ? pool : NULL;
        printf("prefill T=%d, %d thread(s); %s and %s against avx2:\n", TP, pass ? nt : 1,
               k->name, fast->name);
        for (int s = 0; s < 2; s++) {
            int rows = shapes[s][0], n = shapes[s][1];
            float *x = malloc((size_t)TP * n * sizeof *x);
            float *y = malloc((size_t)TP * rows * sizeof *y);
            for (size_t i = 0; i < (size_t)TP * n; i++) x[i] = frand();
            for (int dt = 0; dt < 3; dt++) {
                size_t wbytes = (size_t)rows * n * DT_SIZE[dt];
                char *w = malloc(wbytes);
                fill_w(w, dt, (size_t)rows * n);
                static loom_kernels ref_fast;
                ref_fast = loom_kernels_over(loom_kernels_ref, &loom_kernels_ref_dense_fast);
                int ok = validate(k, dt, w, x, rows, n, 37);
                g_ref = &ref_fast;
                ok &= validate(fast, dt, w, x, rows, n, 37);
                g_ref = &loom_kernels_ref;
                if (!ok) {
                    fail = 1;
                    free(w);
                    continue;
                }
                double flop = 2.0 * rows * n * TP;
                double te = time_mm(k, dt, y, x, w, wbytes, 1, rows, n, TP, budget);
                double tf = time_mm(fast, dt, y, x, w, wbytes, 1, rows, n, TP, budget);
                double ta = have_avx2 ? time_mm(&avx2, dt, y, x, w, wbytes, 1, rows, n, TP, budget) : 0;
                printf("%-4s [%4d x %4d]  exact %6.1f GFLOP/s  fast %6.1f GFLOP/s  avx2 %6.1f GFLOP/s\n",
                       DT_NAME[dt], rows, n, flop / te / 1e9, flop / tf / 1e9,
                       have_avx2 ? flop / ta / 1e9 : 0.0);
                fflush(stdout);
                free(w);
            }
            free(x);
            free(y);
        }
        }
        loom_pool_free(pool);
        g_pool = NULL;
    }
    if (fail) printf("validation FAILED; timings skipped for the failing cases\n");
    return fail;
}
