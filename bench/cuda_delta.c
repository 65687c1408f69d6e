/* cuda_delta: the gated delta rule of prefill, token by token
 * (loom_cuda_lin_delta) against the chunked form
 * (loom_cuda_lin_delta_chunked), on Qwen3-Next / Qwen3.5's shape (16 key
 * heads, 32 value heads, dk = dv = 128). Per case (rows x tokens): both
 * run from the same states and must agree (outputs and states, to f32
 * rounding) before anything is timed; then each runs reps times
 * back-to-back from whatever state the last left, timed on the host
 * around a final sync. Prints microseconds a call of each and their
 * ratio; the short cases say where LOOM_CUDA_LIN_CHUNK should sit.
 * Built with `make CUDA=1`; needs a GPU.  Usage: cuda_delta [reps, default 20] */
#include <stdio.h>

#ifndef LOOM_CUDA
int main(void) {
    puts("cuda_delta: built without CUDA (make CUDA=1)");
    return 0;
}
#else
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cuda/cuda.h"

#define NK 16
#define NV 32
#define DK 128
#define DV 128

static unsigned long long rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 40) / (double)(1ull << 23) - 1.0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TRYB(call)                                                                   \
    do {                                                                             \
        loom_status s_ = (call);                                                     \
        if (s_ != LOOM_OK) {                                                         \
            fprintf(stderr, "cuda_delta: %s: %s\n", #call, loom_last_error());       \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static void *xalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "cuda_delta: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

typedef struct {
    loom_cuda *c;
    float *o, *qkv, *beta, *g, *st;
    float **sp;
    int32_t *rt;
    int T, n_rows, max_n, D;
} dcase;

static void call(const dcase *k, int chunked) {
    if (chunked)
        TRYB(loom_cuda_lin_delta_chunked(k->c, k->o, k->qkv, k->beta, k->g, k->T, k->n_rows,
                                         k->max_n, k->rt, k->sp, 0, k->D, NK, NV, DK, DV, 1));
    else
        TRYB(loom_cuda_lin_delta(k->c, k->o, k->qkv, k->beta, k->g, k->n_rows, k->rt, k->sp, 0,
                                 k->D, NK, NV, DK, DV));
}

/* Worst |a - b| / (1e-6 + 1e-5 |b|): at most 1 is agreement. */
static double worst(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (1e-6 + 1e-5 * fabs((double)b[i]));
        if (!(e <= w)) w = e;  /* NaN too */
    }
    return w;
}

static int run_case(loom_cuda *c, int n_rows, int len, int reps) {
    int T = n_rows * len, D = 2 * NK * DK + NV * DV;
    size_t nx = (size_t)T * D, nb = (size_t)T * NV, no = (size_t)T * NV * DV;
    size_t per = (size_t)NV * DK * DV, ns = per * n_rows;
    float *qkv = xalloc(4 * nx), *beta = xalloc(4 * nb), *g = xalloc(4 * nb);
    float *st = xalloc(4 * ns), *o1 = xalloc(4 * no), *o2 = xalloc(4 * no);
    float *s1 = xalloc(4 * ns), *s2 = xalloc(4 * ns);
    for (size_t i = 0; i < nx; i++) qkv[i] = frand();
    for (int t = 0; t < T; t++)  /* unit q and k heads, as lin_prep leaves them */
        for (int h = 0; h < 2 * NK; h++) {
            float *v = qkv + (size_t)t * D + (size_t)h * DK;
            double ss = 0;
            for (int i = 0; i < DK; i++) ss += (double)v[i] * v[i];
            for (int i = 0; i < DK; i++) v[i] = (float)(v[i] / sqrt(ss + 1e-6));
        }
    for (size_t i = 0; i < nb; i++) {
        beta[i] = 0.5f + 0.5f * frand();
        g[i] = -0.3f * fabsf(frand());
    }
    for (size_t i = 0; i < ns; i++) st[i] = 0.5f * frand();
    int32_t *rt = xalloc(sizeof(int32_t) * (size_t)(n_rows + 1));
    for (int r = 0; r <= n_rows; r++) rt[r] = r * len;
    dcase k = {c, NULL, NULL, NULL, NULL, NULL, NULL, NULL, T, n_rows, len, D};
    TRYB(loom_cuda_alloc(c, (void **)&k.o, 4 * no));
    TRYB(loom_cuda_alloc(c, (void **)&k.qkv, 4 * nx));
    TRYB(loom_cuda_alloc(c, (void **)&k.beta, 4 * nb));
    TRYB(loom_cuda_alloc(c, (void **)&k.g, 4 * nb));
    TRYB(loom_cuda_alloc(c, (void **)&k.st, 4 * ns));
    TRYB(loom_cuda_alloc(c, (void **)&k.sp, sizeof(float *) * (size_t)n_rows));
    TRYB(loom_cuda_alloc(c, (void **)&k.rt, sizeof(int32_t) * (size_t)(n_rows + 1)));
    float **hp = xalloc(sizeof(float *) * (size_t)n_rows);
    for (int r = 0; r < n_rows; r++) hp[r] = k.st + per * r;
    TRYB(loom_cuda_upload(c, k.qkv, qkv, 4 * nx));
    TRYB(loom_cuda_upload(c, k.beta, beta, 4 * nb));
    TRYB(loom_cuda_upload(c, k.g, g, 4 * nb));
    TRYB(loom_cuda_upload(c, k.sp, hp, sizeof(float *) * (size_t)n_rows));
    TRYB(loom_cuda_upload(c, k.rt, rt, sizeof(int32_t) * (size_t)(n_rows + 1)));
    /* validate: both from the same states (the chunked call also grows
     * the scratch before anything is timed) */
    double us[2];
    TRYB(loom_cuda_upload(c, k.st, st, 4 * ns));
    call(&k, 0);
    TRYB(loom_cuda_download(c, o1, k.o, 4 * no));
    TRYB(loom_cuda_download(c, s1, k.st, 4 * ns));
    TRYB(loom_cuda_upload(c, k.st, st, 4 * ns));
    call(&k, 1);
    TRYB(loom_cuda_download(c, o2, k.o, 4 * no));
    TRYB(loom_cuda_download(c, s2, k.st, 4 * ns));
    double wo = worst(o2, o1, no), ws = worst(s2, s1, ns);
    int ok = wo <= 1 && ws <= 1;
    if (ok)
        for (int v = 0; v < 2; v++) {
            call(&k, v);  /* warm */
            TRYB(loom_cuda_sync(c));
            double t0 = now();
            for (int i = 0; i < reps; i++) call(&k, v);
            TRYB(loom_cuda_sync(c));
            us[v] = 1e6 * (now() - t0) / reps;
        }
    if (ok)
        printf("%3d x %5d tokens  token by token %10.1f us  chunked %10.1f us  x%.2f\n", n_rows,
               len, us[0], us[1], us[0] / us[1]);
    else
        printf("%3d x %5d tokens  MISMATCH: outputs worst %.3g, states worst %.3g (1 = tolerance)\n",
               n_rows, len, wo, ws);
    void *ds[] = {k.o, k.qkv, k.beta, k.g, k.st, k.sp, k.rt};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) loom_cuda_release(c, ds[i]);
    free(qkv), free(beta), free(g), free(st), free(o1), free(o2), free(s1), free(s2), free(rt);
    free(hp);
    return ok;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) reps = 1;
    loom_cuda *c = NULL;
    TRYB(loom_cuda_create(0, &c));
    printf("cuda_delta: %s, nk=%d nv=%d dk=%d dv=%d, %d reps (chunks of %d tokens)\n",
           loom_cuda_device_name(c), NK, NV, DK, DV, reps, loom_cuda_lin_delta_chunk_len());
    static const int cases[][2] = {{1, 4096}, {8, 512}, {1, 1024}, {1, 256},
                                   {1, 128},  {1, 64},  {4, 64}};
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ok &= run_case(c, cases[i][0], cases[i][1], reps);
    loom_cuda_free(c);
    return ok ? 0 : 1;
}
#endif
