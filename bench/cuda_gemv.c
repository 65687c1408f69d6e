/* cuda_gemv: the decode GEMV (loom_cuda_gemv, both of its kernels: f32
 * FMAs and tensor cores) against cuBLAS (loom_cuda_gemm16) on the
 * projection shapes of Qwen3-0.6B and Llama-3-8B, bf16, for 1, 2, 4 and 8
 * tokens. Checks that they give the same products first, then times back-to-back calls cycling through
 * copies of the matrix larger than L2 together (so every call reads its
 * weights from memory) and prints microseconds per call and GB/s of weight
 * bytes. Small shapes are bound by the host's launch rate here (a decode
 * step replays them from a graph): read them as upper bounds.
 * Built with `make CUDA=1`; needs a GPU.  Usage: cuda_gemv [reps, default 50] */
#include <stdio.h>

#ifndef LOOM_CUDA
int main(void) {
    puts("cuda_gemv: built without CUDA (make CUDA=1)");
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

#define COLD_BYTES ((size_t)256 << 20) /* five times the H200's L2 */

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
            fprintf(stderr, "cuda_gemv: %s: %s\n", #call, loom_last_error());        \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static const struct { const char *name; int rows, cols; } SHAPES[] = {
    {"0.6b qkv", 4096, 1024},     {"0.6b o", 1024, 2048},        {"0.6b gate_up", 6144, 1024},
    {"0.6b down", 1024, 3072},    {"0.6b head", 151936, 1024},   {"8b qkv", 6144, 4096},
    {"8b o", 4096, 4096},         {"8b gate_up", 28672, 4096},   {"8b down", 4096, 14336},
    {"8b head", 128256, 4096},
};

typedef struct { loom_cuda *c; int cublas; } variant;

/* Microseconds per call of one variant, cycling through the copies. */
static double time_calls(const variant *v, char *dw, size_t bytes, int copies, void *dx,
                         float *dy, int T, int rows, int cols, int reps) {
    loom_cuda_gemv_in in = {LOOM_CUDA_GEMV_X16, dx, NULL, 0};
    double t0 = 0;
    for (int r = -copies; r < reps; r++) {  /* the first pass over the copies warms up */
        if (r == 0) {
            TRYB(loom_cuda_sync(v->c));
            t0 = now();
        }
        const char *w = dw + bytes * (size_t)((r + copies) % copies);
        if (v->cublas) TRYB(loom_cuda_gemm16(v->c, dy, dx, w, LOOM_CUDA_BF16, T, rows, cols));
        else TRYB(loom_cuda_gemv(v->c, dy, &in, w, LOOM_CUDA_BF16, T, rows, cols, NULL, 0));
    }
    TRYB(loom_cuda_sync(v->c));
    return (now() - t0) / reps * 1e6;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 50;
    loom_cuda *cf, *cm;  /* the GEMV forced to its f32-FMA kernel, and to its tensor-core one */
    setenv("LOOM_CUDA_GEMV_MMA", "9", 1);
    TRYB(loom_cuda_create(0, &cf));
    setenv("LOOM_CUDA_GEMV_MMA", "1", 1);
    TRYB(loom_cuda_create(0, &cm));
    const variant V[3] = {{cf, 0}, {cm, 0}, {cf, 1}};
    printf("device: %s; us per call (GB/s of weights)\n", loom_cuda_device_name(cf));
    printf("| shape | rows x cols | T | gemv fma | gemv mma | cuBLAS | max rel diff |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        int rows = SHAPES[s].rows, cols = SHAPES[s].cols;
        size_t nw = (size_t)rows * cols, bytes = nw * 2;
        int copies = (int)((COLD_BYTES + bytes - 1) / bytes);
        if (copies > 32) copies = 32;
        uint16_t *hw = malloc(bytes);
        uint16_t *hx = malloc((size_t)8 * cols * 2);
        float *ya = malloc((size_t)8 * rows * 4), *yb = malloc((size_t)8 * rows * 4);
        if (!hw || !hx || !ya || !yb) return 1;
        for (size_t i = 0; i < nw; i++) hw[i] = loom_f32_to_bf16(frand() * 0.05f);
        for (int i = 0; i < 8 * cols; i++) hx[i] = loom_f32_to_bf16(frand());
        char *dw;
        void *dx;
        float *dy;
        TRYB(loom_cuda_alloc(cf, (void **)&dw, bytes * copies));
        TRYB(loom_cuda_alloc(cf, &dx, (size_t)8 * cols * 2));
        TRYB(loom_cuda_alloc(cf, (void **)&dy, (size_t)8 * rows * 4));
        for (int k = 0; k < copies; k++) TRYB(loom_cuda_upload(cf, dw + bytes * k, hw, bytes));
        TRYB(loom_cuda_upload(cf, dx, hx, (size_t)8 * cols * 2));
        static const int TS[] = {1, 2, 4, 8};
        for (int ti = 0; ti < 4; ti++) {
            int T = TS[ti];
            if (T > loom_cuda_gemv_max_tokens(cf, LOOM_CUDA_BF16, cols)) continue;
            /* validate: each GEMV kernel against cuBLAS, to f32 summation order */
            TRYB(loom_cuda_gemm16(cf, dy, dx, dw, LOOM_CUDA_BF16, T, rows, cols));
            TRYB(loom_cuda_download(cf, yb, dy, (size_t)T * rows * 4));
            double rel = 0;
            for (int v = 0; v < 2; v++) {
                loom_cuda_gemv_in in = {LOOM_CUDA_GEMV_X16, dx, NULL, 0};
                TRYB(loom_cuda_gemv(V[v].c, dy, &in, dw, LOOM_CUDA_BF16, T, rows, cols, NULL, 0));
                TRYB(loom_cuda_download(V[v].c, ya, dy, (size_t)T * rows * 4));
                double md = 0, mr = 0;
                for (size_t i = 0; i < (size_t)T * rows; i++) {
                    double d = fabs((double)ya[i] - yb[i]);
                    md = d > md ? d : md;
                    mr = fabs((double)yb[i]) > mr ? fabs((double)yb[i]) : mr;
                }
                double r = mr > 0 ? md / mr : md;
                rel = r > rel ? r : rel;
            }
            if (!(rel < 1e-3)) {
                printf("cuda_gemv: %s T=%d: gemv and cuBLAS differ (%.3g of the largest)\n",
                       SHAPES[s].name, T, rel);
                return 1;
            }
            double us[3];
            for (int v = 0; v < 3; v++)
                us[v] = time_calls(&V[v], dw, bytes, copies, dx, dy, T, rows, cols, reps);
            printf("| %s | %d x %d | %d | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.1e |\n",
                   SHAPES[s].name, rows, cols, T, us[0], bytes / us[0] / 1e3, us[1],
                   bytes / us[1] / 1e3, us[2], bytes / us[2] / 1e3, rel);
            fflush(stdout);
        }
        loom_cuda_release(cf, dw);
        loom_cuda_release(cf, dx);
        loom_cuda_release(cf, dy);
        free(hw), free(hx), free(ya), free(yb);
    }
    loom_cuda_free(cf);
    loom_cuda_free(cm);
    return 0;
}
#endif
