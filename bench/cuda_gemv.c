/* cuda_gemv: the decode GEMV (loom_cuda_gemv) against cuBLAS
 * (loom_cuda_gemm16) on the projection shapes of Qwen3-0.6B and
 * Llama-3-8B, bf16. Checks that every variant gives cuBLAS's products
 * first, then:
 *   1. per shape, for 1, 2, 4 and 8 tokens: the default kernel, the
 *      row-group kernel (LOOM_CUDA_GEMV_KS=0), the tensor-core kernel and
 *      cuBLAS, back-to-back calls timed on the host, cycling through copies
 *      of the matrix larger than L2 together (so every call reads its
 *      weights from memory). Small shapes are bound by the host's launch
 *      rate here: read them as upper bounds;
 *   2. the 1-token variants (column slices, vectors a batch, blocks an SM)
 *      on the same shapes, timed the same way;
 *   3. each variant on whole layers' GEMVs as a decode step runs them:
 *      qkv (RMSNorm inside) -> o (adds into x) -> gate/up (RMSNorm inside)
 *      -> down (activation inside, adds into x), several layers of distinct
 *      weights captured in one CUDA graph and replayed (CUDA events);
 *      microseconds a layer and GB/s of weights.
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
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

/* The 1-2 token variants: LOOM_CUDA_GEMV_KS, _U, _BPS. The first is the
 * default, the second the row-group kernel. */
static const struct { const char *name, *ks, *u, *bps; } VARS[] = {
    {"default", NULL, NULL, NULL}, {"rows", "0", "4", "0"},   {"ks1 u4", "1", "4", "0"},
    {"ks1 u8", "1", "8", "0"},     {"ks2 u4", "2", "4", "0"}, {"ks2 u8", "2", "8", "0"},
    {"ks4 u8", "4", "8", "0"},     {"ks1 u8 1bps", "1", "8", "1"},
};
#define N_VARS (sizeof VARS / sizeof VARS[0])

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

/* Largest |a - b| over the largest |b|. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        md = d > md ? d : md;
        mr = fabs((double)b[i]) > mr ? fabs((double)b[i]) : mr;
    }
    return mr > 0 ? md / mr : md;
}

/* ---- whole layers ------------------------------------------------------- */

typedef struct {
    const char *name;
    int H, qkv, q, I, layers;  /* hidden, qkv rows, attention width, intermediate */
} layer_shape;

static const layer_shape LAYERS[] = {
    {"qwen3-0.6b", 1024, 4096, 2048, 3072, 16},  /* 31 MB a layer */
    {"llama3-8b", 4096, 6144, 4096, 14336, 2},   /* 436 MB a layer */
};

typedef struct {
    const layer_shape *s;
    char *w;            /* layers x (qkv, o, gate_up, down), bf16 */
    float *x, *qkv, *att, *hb, *norm;
} chain;

static size_t layer_params(const layer_shape *s) {
    return (size_t)s->qkv * s->H + (size_t)s->H * s->q + (size_t)2 * s->I * s->H +
           (size_t)s->H * s->I;
}

static loom_status chain_run(loom_cuda *c, void *arg) {
    const chain *ch = arg;
    const layer_shape *s = ch->s;
    const char *w = ch->w;
    for (int l = 0; l < s->layers; l++) {
        loom_cuda_gemv_in qi = {LOOM_CUDA_GEMV_RMSNORM, ch->x, ch->norm, 1e-6f};
        loom_cuda_gemv_in oi = {LOOM_CUDA_GEMV_F32, ch->att, NULL, 0};
        loom_cuda_gemv_in gi = {LOOM_CUDA_GEMV_RMSNORM, ch->x, ch->norm, 1e-6f};
        loom_cuda_gemv_in di = {LOOM_CUDA_GEMV_SILU, ch->hb, NULL, 0};
        loom_status st = loom_cuda_gemv(c, ch->qkv, &qi, w, LOOM_CUDA_BF16, 1, s->qkv, s->H, NULL, 0);
        w += (size_t)s->qkv * s->H * 2;
        if (st == LOOM_OK)
            st = loom_cuda_gemv(c, ch->x, &oi, w, LOOM_CUDA_BF16, 1, s->H, s->q, NULL, 1);
        w += (size_t)s->H * s->q * 2;
        if (st == LOOM_OK)
            st = loom_cuda_gemv(c, ch->hb, &gi, w, LOOM_CUDA_BF16, 1, 2 * s->I, s->H, NULL, 0);
        w += (size_t)2 * s->I * s->H * 2;
        if (st == LOOM_OK)
            st = loom_cuda_gemv(c, ch->x, &di, w, LOOM_CUDA_BF16, 1, s->H, s->I, NULL, 1);
        w += (size_t)s->H * s->I * 2;
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

static float *up_rand(loom_cuda *c, size_t n, float scale) {
    float *h = malloc(n * 4), *d;
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) h[i] = frand() * scale;
    TRYB(loom_cuda_alloc(c, (void **)&d, n * 4));
    TRYB(loom_cuda_upload(c, d, h, n * 4));
    free(h);
    return d;
}

static void chain_make(loom_cuda *c, chain *ch, const layer_shape *s) {
    ch->s = s;
    size_t n = layer_params(s) * s->layers, chunk = (size_t)1 << 24;
    uint16_t *h = malloc(chunk * 2);
    if (!h) exit(1);
    TRYB(loom_cuda_alloc(c, (void **)&ch->w, n * 2));
    for (size_t o = 0; o < n; o += chunk) {
        size_t k = n - o < chunk ? n - o : chunk;
        for (size_t i = 0; i < k; i++) h[i] = loom_f32_to_bf16(frand() * 0.05f);
        TRYB(loom_cuda_upload(c, ch->w + o * 2, h, k * 2));
    }
    free(h);
    ch->x = up_rand(c, (size_t)s->H, 1.0f);
    ch->norm = up_rand(c, (size_t)s->H, 1.0f);
    ch->att = up_rand(c, (size_t)s->q, 1.0f);
    ch->hb = up_rand(c, (size_t)2 * s->I, 1.0f);
    ch->qkv = up_rand(c, (size_t)s->qkv, 1.0f);
}

static void chain_free(loom_cuda *c, chain *ch) {
    loom_cuda_release(c, ch->w);
    loom_cuda_release(c, ch->x);
    loom_cuda_release(c, ch->norm);
    loom_cuda_release(c, ch->att);
    loom_cuda_release(c, ch->hb);
    loom_cuda_release(c, ch->qkv);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 50;
    loom_cuda *cv[N_VARS], *cm;  /* the GEMV's variants (f32-FMA kernels), its tensor-core kernel */
    for (size_t v = 0; v < N_VARS; v++) {
        setenv("LOOM_CUDA_GEMV_MMA", "9", 1);
        if (VARS[v].ks) {
            setenv("LOOM_CUDA_GEMV_KS", VARS[v].ks, 1);
            setenv("LOOM_CUDA_GEMV_U", VARS[v].u, 1);
            setenv("LOOM_CUDA_GEMV_BPS", VARS[v].bps, 1);
        }
        TRYB(loom_cuda_create(0, &cv[v]));
        unsetenv("LOOM_CUDA_GEMV_KS");
        unsetenv("LOOM_CUDA_GEMV_U");
        unsetenv("LOOM_CUDA_GEMV_BPS");
    }
    setenv("LOOM_CUDA_GEMV_MMA", "1", 1);
    TRYB(loom_cuda_create(0, &cm));
    loom_cuda *cf = cv[0];
    const variant V[4] = {{cv[0], 0}, {cv[1], 0}, {cm, 0}, {cf, 1}};
    static double us1[N_VARS][N_SHAPES];  /* part 2 */
    printf("device: %s; us per call (GB/s of weights)\n", loom_cuda_device_name(cf));
    printf("| shape | rows x cols | T | gemv | gemv rows | gemv mma | cuBLAS | max rel diff |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t s = 0; s < N_SHAPES; s++) {
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
            /* validate: every GEMV variant against cuBLAS, to f32 summation order */
            TRYB(loom_cuda_gemm16(cf, dy, dx, dw, LOOM_CUDA_BF16, T, rows, cols));
            TRYB(loom_cuda_download(cf, yb, dy, (size_t)T * rows * 4));
            double rel = 0;
            for (size_t v = 0; v < N_VARS + 1; v++) {
                loom_cuda *cx = v < N_VARS ? cv[v] : cm;
                if (v < N_VARS && v > 1 && T > 1) continue;
                loom_cuda_gemv_in in = {LOOM_CUDA_GEMV_X16, dx, NULL, 0};
                TRYB(loom_cuda_memset0(cx, dy, (size_t)T * rows * 4));
                TRYB(loom_cuda_gemv(cx, dy, &in, dw, LOOM_CUDA_BF16, T, rows, cols, NULL, 0));
                TRYB(loom_cuda_download(cx, ya, dy, (size_t)T * rows * 4));
                double r = rel_diff(ya, yb, (size_t)T * rows);
                rel = r > rel ? r : rel;
            }
            if (!(rel < 1e-3)) {
                printf("cuda_gemv: %s T=%d: gemv and cuBLAS differ (%.3g of the largest)\n",
                       SHAPES[s].name, T, rel);
                return 1;
            }
            double us[4];
            for (int v = 0; v < 4; v++)
                us[v] = time_calls(&V[v], dw, bytes, copies, dx, dy, T, rows, cols, reps);
            printf("| %s | %d x %d | %d | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | "
                   "%.1e |\n", SHAPES[s].name, rows, cols, T, us[0], bytes / us[0] / 1e3, us[1],
                   bytes / us[1] / 1e3, us[2], bytes / us[2] / 1e3, us[3], bytes / us[3] / 1e3,
                   rel);
            fflush(stdout);
            if (T == 1)
                for (size_t v = 0; v < N_VARS; v++) {
                    variant x = {cv[v], 0};
                    us1[v][s] = time_calls(&x, dw, bytes, copies, dx, dy, 1, rows, cols, reps);
                }
        }
        loom_cuda_release(cf, dw);
        loom_cuda_release(cf, dx);
        loom_cuda_release(cf, dy);
        free(hw), free(hx), free(ya), free(yb);
    }

    printf("\n1 token, the variants (LOOM_CUDA_GEMV_KS / _U / _BPS): us per call\n|  variant |");
    for (size_t s = 0; s < N_SHAPES; s++) printf(" %s |", SHAPES[s].name);
    printf("\n| --- |");
    for (size_t s = 0; s < N_SHAPES; s++) printf(" ---: |");
    printf("\n");
    for (size_t v = 0; v < N_VARS; v++) {
        printf("| %s |", VARS[v].name);
        for (size_t s = 0; s < N_SHAPES; s++) printf(" %.1f |", us1[v][s]);
        printf("\n");
    }

    printf("\nwhole layers' GEMVs (qkv+norm, o+=, gate_up+norm, down+act+=), 1 token, one CUDA "
           "graph: us a layer (GB/s)\n| variant |");
    size_t nl = sizeof LAYERS / sizeof LAYERS[0];
    for (size_t m = 0; m < nl; m++) printf(" %s x%d |", LAYERS[m].name, LAYERS[m].layers);
    printf("\n| --- |");
    for (size_t m = 0; m < nl; m++) printf(" ---: |");
    printf("\n");
    double best[2] = {1e30, 1e30};
    size_t bestv[2] = {0, 0};
    static double lus[N_VARS][2];
    for (size_t m = 0; m < nl; m++) {
        chain ch;
        chain_make(cf, &ch, &LAYERS[m]);
        for (size_t v = 0; v < N_VARS; v++) {
            double us;
            TRYB(chain_run(cv[v], &ch));  /* sizes nothing, but warms each kernel's setup */
            TRYB(loom_cuda_sync(cv[v]));
            TRYB(loom_cuda_time_graph(cv[v], chain_run, &ch, reps / 2 + 5, &us));
            lus[v][m] = us / LAYERS[m].layers;
            if (lus[v][m] < best[m]) best[m] = lus[v][m], bestv[m] = v;
        }
        chain_free(cf, &ch);
    }
    for (size_t v = 0; v < N_VARS; v++) {
        printf("| %s |", VARS[v].name);
        for (size_t m = 0; m < nl; m++)
            printf(" %.1f (%.0f) |", lus[v][m], layer_params(&LAYERS[m]) * 2 / lus[v][m] / 1e3);
        printf("\n");
    }
    for (size_t m = 0; m < nl; m++) {
        size_t b = bestv[m];
        printf("best %s: %s (%.1f us a layer; default %.1f, rows %.1f)\n", LAYERS[m].name,
               VARS[b].name, best[m], lus[0][m], lus[1][m]);
        if (VARS[b].ks)
            printf("best-env %s LOOM_CUDA_GEMV_KS=%s LOOM_CUDA_GEMV_U=%s LOOM_CUDA_GEMV_BPS=%s\n",
                   LAYERS[m].name, VARS[b].ks, VARS[b].u, VARS[b].bps);
        else
            printf("best-env %s LOOM_CUDA_GEMV_KS=1\n", LAYERS[m].name);
    }
    for (size_t v = 0; v < N_VARS; v++) loom_cuda_free(cv[v]);
    loom_cuda_free(cm);
    return 0;
}
#endif
