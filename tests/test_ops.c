/* test_ops: every entry of the SIMD kernel table against the plain-C
 * reference on random data (never zeros) and odd sizes, plus the base
 * f16/bf16 conversions against an independent computation in double, and
 * loom_argmax.
 *
 * Tolerances: sums may be reassociated, so a sum is compared with
 * |a - b| <= 1e-5 * sum|terms| + 1e-6. Element-wise kernels get a few ulp:
 * the SIMD exp is within ~1 ulp of the true value over [-103, 88.7]
 * (checked exhaustively when it was written), libm's expf within 0.5, so
 * the exp sweeps below allow 5e-7 relative (about 4 ulp). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"
#include "test.h"

static unsigned long long rng = 0x9e3779b97f4a7c15ull;

static const int SIZES[] = {1, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 257, 1000, 1023};
static const int TOKENS[] = {1, 2, 3, 5, 8, 13};

static const loom_kernels *K;          /* table under test */
static const loom_kernels *R = &loom_kernels_ref;

/* Exactly sized allocations so that the sanitizers see any overread. */
static float *rand_f32(size_t n, float scale) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        float v = test_rand_f(&rng) * scale;
        p[i] = v != 0 ? v : scale * 0.5f;
    }
    return p;
}

static uint16_t *rand_h16(size_t n, int bf16) {
    uint16_t *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        float v = test_rand_f(&rng);
        if (v == 0) v = 0.25f;
        p[i] = bf16 ? loom_f32_to_bf16(v) : loom_f32_to_f16(v);
    }
    return p;
}

static int close_sum(float got, float want, double sumabs) {
    return fabs((double)got - (double)want) <= 1e-5 * sumabs + 1e-6;
}

static int close_rel(float got, float want, double rel, double abs_tol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs((double)got - (double)want) <= rel * fabs((double)want) + abs_tol;
}

/* ---- matmul ---------------------------------------------------------------- */

enum { W_F32, W_F16, W_BF16 };

static float wval(const void *w, size_t i, int dt) {
    if (dt == W_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return dt == W_F16 ? loom_f16_to_f32(h) : loom_bf16_to_f32(h);
}

static void call_mm(const loom_kernels *k, int dt, float *y, int ldy, const float *x,
                    int ldx, const void *w, int n, int T, int r0, int r1) {
    if (dt == W_F32) k->matmul_f32(y, ldy, x, ldx, w, n, T, r0, r1);
    else if (dt == W_F16) k->matmul_f16(y, ldy, x, ldx, w, n, T, r0, r1);
    else k->matmul_bf16(y, ldy, x, ldx, w, n, T, r0, r1);
}

static const float SENTINEL = 12345.0f;

/* One case: rows weight rows of length n, T tokens with padded strides,
 * output rows [r0, r1). Checks the range against the reference and that
 * nothing outside it was written. */
static void check_matmul(int dt, int n, int T, int rows, int r0, int r1, int ldx, int ldy) {
    size_t nw = (size_t)rows * n;
    void *w = dt == W_F32 ? (void *)rand_f32(nw, 1.0f) : (void *)rand_h16(nw, dt == W_BF16);
    size_t nx = (size_t)(T - 1) * ldx + n;
    float *x = rand_f32(nx, 1.0f);
    size_t ny = (size_t)(T - 1) * ldy + rows;
    float *y = malloc(ny * sizeof *y), *yr = malloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++) y[i] = yr[i] = SENTINEL;
    call_mm(K, dt, y, ldy, x, ldx, w, n, T, r0, r1);
    call_mm(R, dt, yr, ldy, x, ldx, w, n, T, r0, r1);
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++)
        for (int r = 0; r < rows && bad < 3; r++) {
            size_t i = (size_t)t * ldy + r;
            if (r < r0 || r >= r1) {
                if (y[i] != SENTINEL) bad++;
                CHECKF(y[i] == SENTINEL, "dt %d n %d T %d [%d,%d): wrote outside at t %d r %d",
                       dt, n, T, r0, r1, t, r);
                continue;
            }
            double sa = 0;
            for (int k = 0; k < n; k++)
                sa += fabs((double)x[(size_t)t * ldx + k] * wval(w, (size_t)r * n + k, dt));
            int ok = close_sum(y[i], yr[i], sa);
            if (!ok) bad++;
            CHECKF(ok, "dt %d n %d T %d [%d,%d) t %d r %d: got %.9g want %.9g", dt, n, T, r0,
                   r1, t, r, y[i], yr[i]);
        }
    /* Stride padding between tokens must be untouched too. */
    for (int t = 0; t + 1 < T; t++)
        for (int r = rows; r < ldy; r++)
            if (y[(size_t)t * ldy + r] != SENTINEL) {
                CHECKF(0, "dt %d n %d T %d: wrote into ldy padding", dt, n, T);
                t = T;
                break;
            }
    /* x rounded once (the forward's path for a prompt's slices) gives the
     * same bits. */
    size_t pb = dt == W_BF16 && K->bf16_prep ? K->bf16_prep_bytes(n, T) : 0;
    if (pb) {
        void *buf = malloc(pb);
        float *yp = malloc(ny * sizeof *yp);
        for (size_t i = 0; i < ny; i++) yp[i] = SENTINEL;
        K->bf16_prep(buf, x, ldx, n, T);
        K->matmul_bf16_prep(yp, ldy, buf, w, n, T, r0, r1);
        CHECKF(!memcmp(y, yp, ny * sizeof *y), "matmul_bf16_prep n %d T %d [%d,%d): not "
               "matmul_bf16's bits", n, T, r0, r1);
        free(yp);
        free(buf);
    }
    free(w);
    free(x);
    free(y);
    free(yr);
}

static void test_matmul(void) {
    static const int ranges[][2] = {{0, 19}, {1, 18}, {3, 10}, {5, 6}, {2, 7}, {4, 4}};
    for (int dt = 0; dt < 3; dt++)
        for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++)
            for (size_t ti = 0; ti < LOOM_ARRAY_LEN(TOKENS); ti++)
                for (size_t ri = 0; ri < LOOM_ARRAY_LEN(ranges); ri++) {
                    int n = SIZES[ni], T = TOKENS[ti];
                    check_matmul(dt, n, T, 19, ranges[ri][0], ranges[ri][1], n + (int)ri % 3,
                                 19 + 2 * (int)ri);
                }
    /* Larger shapes with many full tiles. */
    for (int dt = 0; dt < 3; dt++) {
        check_matmul(dt, 1024, 1, 96, 0, 96, 1024, 96);
        check_matmul(dt, 1024, 64, 67, 0, 67, 1024, 67);
        check_matmul(dt, 600, 7, 130, 13, 121, 611, 140);
    }
    /* Token counts past the small-batch paths, split into uneven register
     * tiles; rows over several 32-row panels and 128-row packed blocks,
     * ranges that start and end inside a panel; columns over several packed
     * blocks (256 / 512) with odd tails. */
    static const int bigT[] = {14, 15, 16, 17, 25, 31, 40, 97};
    static const int big[][5] = {/* n, rows, r0, r1, ldx pad */
                                 {1031, 40, 0, 40, 0}, {529, 150, 3, 147, 2}, {33, 70, 5, 69, 7},
                                 {2049, 33, 1, 33, 1}, {17, 300, 0, 300, 0}};
    for (int dt = 0; dt < 3; dt++)
        for (size_t ti = 0; ti < LOOM_ARRAY_LEN(bigT); ti++)
            for (size_t si = 0; si < LOOM_ARRAY_LEN(big); si++) {
                const int *b = big[si];
                if (bigT[ti] > 40 && b[0] > 1000) continue; /* the reference is slow */
                check_matmul(dt, b[0], bigT[ti], b[1], b[2], b[3], b[0] + b[4], b[1] + (int)ti % 3);
            }
    check_matmul(W_BF16, 4099, 3, 9, 0, 9, 4099, 9); /* past the --fast matvec's column chunk */
    check_matmul(W_BF16, 8300, 1, 5, 0, 5, 8300, 5);
}

/* Batch invariance: each output the same bits whether its token comes
 * alone, among others, or its row in another row range (the engine's
 * prefix cache and chunked prefill rely on it). Checked on the tables that
 * promise it: the reference, the AVX2 and the exact AVX-512 entries. */
static void test_matmul_batch_invariant(void) {
    static const int ns[] = {1, 17, 1029, 3000};
    enum { T = 50, ROWS = 11 };
    for (int dt = 0; dt < 3; dt++)
        for (size_t ni = 0; ni < LOOM_ARRAY_LEN(ns); ni++) {
            int n = ns[ni];
            void *w = dt == W_F32 ? (void *)rand_f32((size_t)ROWS * n, 1.0f)
                                  : (void *)rand_h16((size_t)ROWS * n, dt == W_BF16);
            float *x = rand_f32((size_t)T * n, 1.0f);
            float *all = malloc(sizeof(float) * T * ROWS), *part = malloc(sizeof(float) * T * ROWS);
            call_mm(K, dt, all, ROWS, x, n, w, n, T, 0, ROWS);
            /* one token at a time; then uneven token chunks over two row ranges */
            for (int t = 0; t < T; t++) call_mm(K, dt, part + t * ROWS, ROWS, x + (size_t)t * n, n, w, n, 1, 0, ROWS);
            CHECKF(!memcmp(all, part, sizeof(float) * T * ROWS), "batch invariance dt %d n %d: T=%d vs 1", dt, n, T);
            for (int t0 = 0, c = 2; t0 < T; t0 += c, c = c * 2 + 1) {
                int tt = LOOM_MIN(c, T - t0);
                call_mm(K, dt, part + t0 * ROWS, ROWS, x + (size_t)t0 * n, n, w, n, tt, 0, 3);
                call_mm(K, dt, part + t0 * ROWS, ROWS, x + (size_t)t0 * n, n, w, n, tt, 3, ROWS);
            }
            CHECKF(!memcmp(all, part, sizeof(float) * T * ROWS), "batch invariance dt %d n %d: chunks", dt, n);
            free(w);
            free(x);
            free(all);
            free(part);
        }
}

/* The --fast bf16 matvec (fewer than 16 tokens) gives each token the bits
 * it gets alone, for rows shorter and longer than its buffer's pass (the
 * engine's batched decode relies on it). */
static void test_matvec_fast_small_t(void) {
    static const int ns[] = {1029, 3000, 4999, 40000};
    enum { T = 15, ROWS = 9 };
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(ns); ni++) {
        int n = ns[ni];
        uint16_t *w = rand_h16((size_t)ROWS * n, 1);
        float *x = rand_f32((size_t)T * n, 1.0f);
        float *all = malloc(sizeof(float) * T * ROWS), *one = malloc(sizeof(float) * T * ROWS);
        call_mm(K, W_BF16, all, ROWS, x, n, w, n, T, 0, ROWS);
        for (int t = 0; t < T; t++)
            call_mm(K, W_BF16, one + t * ROWS, ROWS, x + (size_t)t * n, n, w, n, 1, 0, ROWS);
        CHECKF(!memcmp(all, one, sizeof(float) * T * ROWS), "fast matvec n %d: T=%d vs 1", n, T);
        free(w);
        free(x);
        free(all);
        free(one);
    }
}

/* One-hot weights (w[r][k] = 1 for k == r): y[t][r] is the product of one
 * activation and 1 whatever the summation order, so every table must
 * match its reference bit for bit. The activations sit on and next to the
 * bf16 rounding ties (even and odd below), and include values too small for
 * bf16's normal range: this pins down the rounding of the --fast kernels. */
static void test_matmul_rounding(void) {
    enum { N = 45, TT = 20 };
    float *x = malloc(sizeof(float) * N * TT);
    for (int i = 0; i < N * TT; i++) {
        uint32_t u = 0x3f800000u + ((uint32_t)(i % 37) << 16) + ((i % 5) == 0 ? 0x8000u : 0);
        u += (uint32_t)(i % 3) - 1; /* tie - 1, tie, tie + 1 */
        u |= (uint32_t)(i & 64) << 25; /* some negative */
        float f;
        memcpy(&f, &u, 4);
        x[i] = i % 41 == 7 ? f * 1e-39f : f;
    }
    for (int dt = 0; dt < 3; dt++) {
        void *w = dt == W_F32 ? malloc(sizeof(float) * N * N) : malloc(sizeof(uint16_t) * N * N);
        for (int r = 0; r < N; r++)
            for (int k = 0; k < N; k++) {
                float v = k == r ? 1.0f : 0.0f;
                if (dt == W_F32) ((float *)w)[r * N + k] = v;
                else ((uint16_t *)w)[r * N + k] = dt == W_F16 ? loom_f32_to_f16(v) : loom_f32_to_bf16(v);
            }
        for (int T = 1; T <= TT; T += 19) {
            float y[N * TT], yr[N * TT];
            call_mm(K, dt, y, N, x, N, w, N, T, 0, N);
            call_mm(R, dt, yr, N, x, N, w, N, T, 0, N);
            int bad = 0;
            for (int i = 0; i < N * T && bad < 3; i++) {
                int ok = memcmp(&y[i], &yr[i], 4) == 0 || (y[i] == 0 && yr[i] == 0);
                bad += !ok;
                CHECKF(ok, "rounding dt %d T %d i %d (x %a): %a vs %a", dt, T, i, x[i], y[i], yr[i]);
            }
        }
        free(w);
    }
    free(x);
}

/* The --fast references against the exact ones: with bf16 weights the
 * only change is x rounded to bf16 (relative error <= 2^-8 per product),
 * so |fast - exact| <= 2^-8 sum |x w| (+ the usual f32 summation bound). */
static void test_fast_vs_exact(void) {
    static loom_kernels fast;
    fast = loom_kernels_over(loom_kernels_ref, &loom_kernels_ref_dense_fast);
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++) {
        int n = SIZES[ni], rows = 7, T = 3;
        uint16_t *w = rand_h16((size_t)rows * n, 1);
        float *x = rand_f32((size_t)T * n, 3.0f);
        float y[3 * 7], ye[3 * 7];
        fast.matmul_bf16(y, rows, x, n, w, n, T, 0, rows);
        loom_kernels_ref.matmul_bf16(ye, rows, x, n, w, n, T, 0, rows);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rows; r++) {
                double sa = 0;
                for (int k = 0; k < n; k++)
                    sa += fabs((double)x[t * n + k] * loom_bf16_to_f32(w[(size_t)r * n + k]));
                double d = fabs((double)y[t * rows + r] - ye[t * rows + r]);
                CHECKF(d <= (0x1p-8 + 1e-5) * sa + 1e-6, "fast vs exact n %d t %d r %d: %.9g vs %.9g",
                       n, t, r, y[t * rows + r], ye[t * rows + r]);
            }
        free(w);
        free(x);
    }
}

/* Weights with a large dynamic range and special (non-NaN) values: each
 * f16 / bf16 bit pattern converts exactly, so any mismatch beyond
 * reassociation is a conversion bug. */
static void test_matmul_specials(void) {
    for (int dt = W_F16; dt <= W_BF16; dt++) {
        int n = 43, rows = 9;
        uint16_t *w = malloc((size_t)n * rows * sizeof *w);
        for (int i = 0; i < n * rows; i++) {
            uint16_t h;
            do h = (uint16_t)test_rand_u32(&rng);
            while (dt == W_F16 ? ((h & 0x7c00) == 0x7c00 || (h & 0x7c00) > 0x5000)
                               : ((h & 0x7f80) == 0x7f80 || (h & 0x7f80) > 0x4a00 ||
                                  (h & 0x7f80) < 0x3000));
            w[i] = h;
        }
        float *x = rand_f32(2 * (size_t)n, 1.0f);
        float y[2 * 9], yr[2 * 9];
        call_mm(K, dt, y, rows, x, n, w, n, 2, 0, rows);
        call_mm(R, dt, yr, rows, x, n, w, n, 2, 0, rows);
        for (int t = 0; t < 2; t++)
            for (int r = 0; r < rows; r++) {
                double sa = 0;
                for (int k = 0; k < n; k++)
                    sa += fabs((double)x[t * n + k] * wval(w, (size_t)r * n + k, dt));
                CHECKF(close_sum(y[t * rows + r], yr[t * rows + r], sa),
                       "specials dt %d t %d r %d: %g vs %g", dt, t, r, y[t * rows + r],
                       yr[t * rows + r]);
            }
        free(w);
        free(x);
    }
}

/* ---- affine-quantized matmul --------------------------------------------- */

/* Field k of a packed row, read bit by bit from the little-endian stream. */
static unsigned q_field_indep(const uint32_t *row, int k, int bits) {
    unsigned v = 0;
    for (int b = 0; b < bits; b++) {
        size_t bit = (size_t)k * bits + b;
        v |= ((row[bit / 32] >> (bit % 32)) & 1u) << b;
    }
    return v;
}

static float q_param_f(const uint16_t *p, size_t i, int f16) {
    return f16 ? loom_f16_to_f32(p[i]) : loom_bf16_to_f32(p[i]);
}

/* A random MLX-style quantized matrix (rows, n): codes, and per-group
 * scales and biases that centre each group's values near 0. */
static loom_qmat rand_qmat(int bits, int group, int n, int f16, int rows) {
    int words = n * bits / 32, ng = n / group;
    uint32_t *wq = malloc((size_t)rows * words * sizeof *wq);
    for (int i = 0; i < rows * words; i++) wq[i] = test_rand_u32(&rng);
    uint16_t *sc = malloc((size_t)rows * ng * sizeof *sc), *bi = malloc((size_t)rows * ng * sizeof *bi);
    for (int i = 0; i < rows * ng; i++) {
        float s = (0.02f + 0.05f * fabsf(test_rand_f(&rng))) / (float)(1 << bits);
        float b = -s * (float)(1 << (bits - 1)) * (1.0f + 0.2f * test_rand_f(&rng));
        sc[i] = f16 ? loom_f32_to_f16(s) : loom_f32_to_bf16(s);
        bi[i] = f16 ? loom_f32_to_f16(b) : loom_f32_to_bf16(b);
    }
    return (loom_qmat){.w = wq, .scales = sc, .biases = bi, .n = n, .bits = bits, .group = group,
                       .f16 = f16};
}

static void free_qmat(loom_qmat *w) {
    free((void *)w->w);
    free((void *)w->scales);
    free((void *)w->biases);
}

/* Set by run_all for the AVX-512 tables: their 4- and 8-bit matmuls give
 * each of up to 8 tokens the bits it gets alone. */
static int q_invariant;

/* il: K runs on the matrix in the 16-row interleaved layout (rows % 16 == 0). */
static void check_matmul_q_il(int bits, int group, int n, int T, int f16, int rows, int r0,
                              int r1, int ldx, int ldy, int il) {
    int words = n * bits / 32, ng = n / group;
    loom_qmat w = rand_qmat(bits, group, n, f16, rows);
    const uint32_t *wq = w.w;
    const uint16_t *sc = w.scales, *bi = w.biases;
    loom_qmat wk = w;
    void *il_mem = NULL;
    if (il) CHECK(loom_q_interleave(&w, rows, &wk, &il_mem) == LOOM_OK);
    float *x = rand_f32((size_t)(T - 1) * ldx + n, 1.0f);
    size_t ny = (size_t)(T - 1) * ldy + rows;
    float *y = malloc(ny * sizeof *y), *yr = malloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++) y[i] = yr[i] = SENTINEL;
    K->matmul_q(y, ldy, x, ldx, &wk, T, r0, r1);
    R->matmul_q(yr, ldy, x, ldx, &w, T, r0, r1);
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++)
        for (int r = 0; r < rows && bad < 3; r++) {
            size_t i = (size_t)t * ldy + r;
            if (r < r0 || r >= r1) {
                bad += y[i] != SENTINEL;
                CHECKF(y[i] == SENTINEL, "matmul_q: wrote outside [%d,%d) at t %d r %d", r0, r1, t, r);
                continue;
            }
            /* Bound for either way of summing: scale*q and bias separately. */
            double sa = 0;
            for (int k = 0; k < n; k++) {
                size_t gi = (size_t)r * ng + k / group;
                double q = q_field_indep(wq + (size_t)r * words, k, bits);
                sa += fabs((double)x[(size_t)t * ldx + k]) *
                      (fabs(q_param_f(sc, gi, f16) * q) + fabs((double)q_param_f(bi, gi, f16)));
            }
            int ok = close_sum(y[i], yr[i], sa);
            bad += !ok;
            CHECKF(ok, "matmul_q bits %d group %d n %d T %d f16 %d il %d [%d,%d) t %d r %d: %.9g "
                   "vs %.9g", bits, group, n, T, f16, il, r0, r1, t, r, y[i], yr[i]);
        }
    /* x rounded once (the forward's path for several slices and matrices)
     * gives the same bits. */
    if (il && K->q_prep) {
        void *buf = malloc(K->q_prep_bytes(&wk, T));
        float *yp = malloc(ny * sizeof *yp);
        for (size_t i = 0; i < ny; i++) yp[i] = SENTINEL;
        K->q_prep(buf, x, ldx, &wk, T);
        K->matmul_q_prep(yp, ldy, buf, &wk, T, r0, r1);
        CHECKF(!memcmp(y, yp, ny * sizeof *y), "matmul_q_prep bits %d group %d n %d T %d [%d,%d): "
               "not matmul_q's bits", bits, group, n, T, r0, r1);
        free(yp);
        free(buf);
    }
    /* Batched decode (2..8 tokens, groups of 64 << s) on the tables that promise batch
     * invariance: every token's outputs the bits it gets alone. */
    if (q_invariant && T > 1 && (T <= 8 || il) && (bits == 4 || bits == 8) && group % 64 == 0 &&
        !(group & (group - 1))) {
        float *y1 = malloc(ny * sizeof *y1);
        for (size_t i = 0; i < ny; i++) y1[i] = y[i];
        for (int t = 0; t < T; t++)
            K->matmul_q(y1 + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, &wk, 1, r0, r1);
        CHECKF(!memcmp(y, y1, ny * sizeof *y), "matmul_q bits %d group %d n %d il %d: T=%d vs 1 "
               "at a time", bits, group, n, il, T);
        free(y1);
    }
    loom_free(il_mem);
    free_qmat(&w);
    free(x);
    free(y);
    free(yr);
}

static void check_matmul_q(int bits, int group, int n, int T, int f16, int rows, int r0, int r1,
                           int ldx, int ldy) {
    check_matmul_q_il(bits, group, n, T, f16, rows, r0, r1, ldx, ldy, 0);
}

/* Tables that read the 16-row interleaved layout: every token count of a
 * decode, a batch and a prompt, ranges inside and across row blocks, the
 * layout's checks. */
static void test_matmul_q_il(void) {
    static const int shapes[][2] = {{64, 64}, {128, 384}, {64, 1088}, {1024, 2048}};
    static const int rr[][2] = {{0, 48}, {16, 32}, {5, 37}, {47, 48}};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < LOOM_ARRAY_LEN(shapes); si++)
            for (int T = 1; T <= 19; T += (T < 9 ? 1 : 5)) {
                int ri = (T + (int)si) % 4;
                check_matmul_q_il(bits, shapes[si][0], shapes[si][1], T, T % 2, 48, rr[ri][0],
                                  rr[ri][1], shapes[si][1] + T % 3, 50, 1);
            }
    loom_qmat w = {.n = 128, .bits = 4, .group = 64}, o;
    void *mem;
    CHECK(loom_q_il16_ok(&w, 32) && !loom_q_il16_ok(&w, 40));
    w.bits = 3;
    CHECK(!loom_q_il16_ok(&w, 32));
    CHECK(loom_q_interleave(&w, 32, &o, &mem) == LOOM_ERR_INVALID_ARG && !mem);
    w.bits = 8, w.n = 16384;
    CHECK(!loom_q_il16_ok(&w, 32));
}

static void test_matmul_q(void) {
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    /* {group, n}: one group, several, past the 1024-column chunk, a group
     * split by the chunk boundary (384), tiny groups. */
    static const int shapes[][2] = {{32, 32}, {64, 192}, {128, 2176}, {384, 1152}, {8, 40}, {32, 1056}};
    static const int qT[] = {1, 2, 4, 5, 13};
    static const int ranges[][2] = {{0, 9}, {1, 8}, {3, 4}, {2, 7}};
    for (size_t bi = 0; bi < LOOM_ARRAY_LEN(bitss); bi++)
        for (size_t si = 0; si < LOOM_ARRAY_LEN(shapes); si++)
            for (size_t ti = 0; ti < LOOM_ARRAY_LEN(qT); ti++)
                for (size_t ri = 0; ri < LOOM_ARRAY_LEN(ranges); ri++) {
                    int group = shapes[si][0], n = shapes[si][1];
                    if ((n * bitss[bi]) % 32) continue;
                    check_matmul_q(bitss[bi], group, n, qT[ti], (int)(ri + ti) % 2, 9,
                                   ranges[ri][0], ranges[ri][1], n + (int)ri, 11 + (int)ri);
                }
    /* Groups that are not a multiple of 8 (the reference path). */
    check_matmul_q(8, 4, 12, 3, 0, 5, 0, 5, 12, 5);
    check_matmul_q(4, 24, 48, 2, 1, 5, 1, 4, 50, 6);
    /* The 4- and 8-bit AVX-512 kernels: every token count through the
     * decode kernel and the 12-token tiles, rows over 16-row panels and
     * four-row passes, columns over the 128- and 256-column panels. */
    static const int q48[][2] = {{64, 320}, {128, 384}, {64, 1088}};
    static const int rr[][2] = {{0, 37}, {5, 33}, {16, 17}, {3, 20}};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < LOOM_ARRAY_LEN(q48); si++)
            for (int T = 1; T <= 13; T++) {
                int ri = (T + (int)si) % 4, group = q48[si][0], n = q48[si][1];
                check_matmul_q(bits, group, n, T, T % 2, 37, rr[ri][0], rr[ri][1], n + T % 3, 40);
            }
    /* A batched decode's token counts (several tiles, a partial one) over
     * the 128-column panels with a 64-column tail and partial row panels. */
    for (int bits = 4; bits <= 8; bits += 4)
        for (int T = 31; T <= 33; T++)
            check_matmul_q(bits, 64, 1088, T, T % 2, 37, T % 5, 37 - T % 3, 1088 + T % 3, 40);
    /* Wide rows: a prompt that AVX2's --fast 8-bit path rounds in several
     * chunks (16 tokens of 4096 columns at a time). */
    check_matmul_q(8, 64, 4096, 37, 1, 9, 1, 8, 4099, 38);
}

/* The AVX-512 exact 4-/8-bit prompt path (more than 8 tokens) promises
 * one f32 chain per output: starting at 0, y = fma(w_k, x_k, y) over the
 * columns in order, each weight dequantized as sc * q + bi (the product
 * of a 4-/8-bit code and a bf16/f16 scale is exact in f32). Its panels, tiles and token blocks may change shape; these
 * bits may not. Token counts cross the 12-token tiles and the 240-token
 * blocks, columns the 256-column panels (a 64- and a 128-column tail). */
static void check_matmul_q_chain(int bits, int group, int n, int T, int f16, int r0, int r1) {
    enum { ROWS = 37 };
    int words = n * bits / 32, ng = n / group, ldx = n + T % 3, ldy = ROWS + 2;
    loom_qmat w = rand_qmat(bits, group, n, f16, ROWS);
    const uint32_t *wq = w.w;
    const uint16_t *sc = w.scales, *bi = w.biases;
    float *x = rand_f32((size_t)(T - 1) * ldx + n, 1.0f);
    float *y = malloc((size_t)T * ldy * sizeof *y), *wr = malloc((size_t)n * sizeof *wr);
    K->matmul_q(y, ldy, x, ldx, &w, T, r0, r1);
    int bad = 0;
    for (int r = r0; r < r1 && bad < 3; r++) {
        for (int k = 0; k < n; k++) {
            size_t gi = (size_t)r * ng + k / group;
            float q = (float)q_field_indep(wq + (size_t)r * words, k, bits);
            wr[k] = q_param_f(sc, gi, f16) * q + q_param_f(bi, gi, f16);
        }
        for (int t = 0; t < T && bad < 3; t++) {
            const float *xt = x + (size_t)t * ldx;
            float s = 0;
            for (int k = 0; k < n; k++) s = fmaf(wr[k], xt[k], s);
            float got = y[(size_t)t * ldy + r];
            bad += memcmp(&got, &s, sizeof s) != 0;
            CHECKF(!memcmp(&got, &s, sizeof s), "matmul_q chain bits %d group %d n %d T %d f16 %d "
                   "t %d r %d: %.9g, the chain gives %.9g", bits, group, n, T, f16, t, r, got, s);
        }
    }
    free_qmat(&w);
    free(x);
    free(y);
    free(wr);
}

static void test_matmul_q_chain(void) {
    static const int shapes[][2] = {{64, 320}, {128, 384}, {64, 1088}, {128, 2176}};
    static const int Ts[] = {9, 12, 13, 32, 241, 250};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < LOOM_ARRAY_LEN(shapes); si++)
            for (size_t ti = 0; ti < LOOM_ARRAY_LEN(Ts); ti++) {
                int v = (int)(si + ti);
                check_matmul_q_chain(bits, shapes[si][0], shapes[si][1], Ts[ti], v % 2, v % 5,
                                     37 - v % 3);
            }
}

/* ---- FP8 (e4m3 with block scales) ------------------------------------------ */

/* e4m3 by its definition, in double. */
static double e4m3_indep(unsigned b) {
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    if (e == 15 && m == 7) v = NAN;
    return b & 0x80 ? -v : v;
}

/* Random codes over the whole range (no NaN), random positive scales. */
static void check_matmul_f8(int n, int T, int rows, int r0, int r1, int br, int bc, int ldx,
                            int ldy) {
    uint8_t *w = malloc((size_t)rows * n + 1);
    for (size_t i = 0; i < (size_t)rows * n; i++) {
        unsigned b;
        do b = test_rand_u32(&rng) & 0xff; while ((b & 0x7f) == 0x7f || b == 0);
        w[i] = (uint8_t)b;
    }
    int sr = (rows + br - 1) / br, sc = (n + bc - 1) / bc;
    float *s = malloc((size_t)sr * sc * sizeof *s);
    for (int i = 0; i < sr * sc; i++) s[i] = ldexpf(1.0f + 0.5f * test_rand_f(&rng), -9 + i % 5);
    loom_f8mat q = {.w = w, .scales = s, .n = n, .br = br, .bc = bc};
    size_t nx = (size_t)(T - 1) * ldx + n, ny = (size_t)(T - 1) * ldy + rows;
    float *x = rand_f32(nx, 1.0f), *y = malloc(ny * sizeof *y), *yr = malloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++) y[i] = yr[i] = SENTINEL;
    K->matmul_f8(y, ldy, x, ldx, &q, T, r0, r1);
    R->matmul_f8(yr, ldy, x, ldx, &q, T, r0, r1);
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++)
        for (int r = 0; r < rows && bad < 3; r++) {
            size_t i = (size_t)t * ldy + r;
            if (r < r0 || r >= r1) {
                if (y[i] != SENTINEL || yr[i] != SENTINEL) bad++;
                CHECKF(y[i] == SENTINEL && yr[i] == SENTINEL, "f8 n %d T %d [%d,%d): wrote "
                       "outside at t %d r %d", n, T, r0, r1, t, r);
                continue;
            }
            /* against the definition in double, and the table under test
             * against the reference */
            double want = 0, sa = 0;
            for (int k = 0; k < n; k++) {
                double v = x[(size_t)t * ldx + k] * e4m3_indep(w[(size_t)r * n + k]) *
                           s[(r / br) * sc + k / bc];
                want += v;
                sa += fabs(v);
            }
            int ok = close_sum(y[i], yr[i], sa) && close_sum(yr[i], (float)want, sa);
            if (!ok) bad++;
            CHECKF(ok, "f8 n %d T %d blocks %dx%d [%d,%d) t %d r %d: got %.9g ref %.9g want %.9g",
                   n, T, br, bc, r0, r1, t, r, y[i], yr[i], want);
        }
    for (int t = 0; t + 1 < T; t++)
        for (int r = rows; r < ldy; r++)
            if (y[(size_t)t * ldy + r] != SENTINEL) {
                CHECKF(0, "f8 n %d T %d: wrote into ldy padding", n, T);
                t = T;
                break;
            }
    free(w);
    free(s);
    free(x);
    free(y);
    free(yr);
}

/* Every code through the kernel (one column each, scale 1 then a scale
 * that is not a power of 2) for one token and for two: NaN codes give NaN. */
static void check_f8_codes(void) {
    uint8_t w[256 * 8] = {0};
    float x[16] = {1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, y[2 * 256];
    for (int i = 0; i < 256; i++) w[i * 8] = (uint8_t)i;
    for (int pass = 0; pass < 2; pass++) {
        float sc = pass ? 0.3f : 1.0f;
        loom_f8mat q = {.w = w, .scales = &sc, .n = 8, .br = 256, .bc = 8};
        for (int T = 1; T <= 2; T++) {
            K->matmul_f8(y, 256, x, 8, &q, T, 0, 256);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int i = 0; i < 256 && bad < 3; i++) {
                    float want = (float)e4m3_indep((unsigned)i) * sc, got = y[t * 256 + i];
                    int ok = isnan(want) ? isnan(got) : got == want;
                    if (!ok) bad++;
                    CHECKF(ok, "f8 code 0x%02x scale %g T %d: got %.9g want %.9g", i, sc, T, got,
                           want);
                }
        }
    }
}

static void test_matmul_f8(void) {
    check_f8_codes();
    /* {n, rows, br, bc}: 128 x 128 blocks with partial edges both ways,
     * one partial block, per-channel (bc n), per-tensor, narrow blocks,
     * past the 1024-column chunk. */
    static const int shapes[][4] = {{64, 19, 128, 128}, {192, 19, 128, 128}, {320, 140, 128, 128},
                                    {200, 19, 8, 16},   {72, 19, 1, 72},     {96, 19, 19, 96},
                                    {1152, 9, 128, 128}, {2056, 5, 2, 128}};
    static const int fT[] = {1, 2, 3, 5, 13};
    static const int ranges[][2] = {{0, 19}, {1, 18}, {3, 10}, {5, 6}};
    for (size_t si = 0; si < LOOM_ARRAY_LEN(shapes); si++)
        for (size_t ti = 0; ti < LOOM_ARRAY_LEN(fT); ti++)
            for (size_t ri = 0; ri < LOOM_ARRAY_LEN(ranges); ri++) {
                int n = shapes[si][0], rows = shapes[si][1];
                int r0 = LOOM_MIN(ranges[ri][0], rows), r1 = LOOM_MIN(ranges[ri][1], rows);
                if (rows > 100 && ri == 0) r0 = 0, r1 = rows;  /* across the 128-row block */
                check_matmul_f8(n, fT[ti], rows, r0, r1, shapes[si][2], shapes[si][3],
                                n + (int)ri, rows + (int)ti);
            }
    /* Columns or blocks that split an 8-wide vector (the reference path). */
    check_matmul_f8(13, 3, 7, 0, 7, 128, 128, 13, 7);
    check_matmul_f8(48, 1, 7, 1, 6, 2, 12, 50, 7);
}

/* The --fast reference against the exact one on 4- and 8-bit weights: the
 * only change is x rounded per 64 columns to sx * qx with |x - sx qx| <=
 * sx / 2 = max|x| / 254 over the block, so |fast - exact| <= sum over the
 * blocks of sx / 2 * sum |w| (+ the usual f32 summation bound). */
static void test_fast_q_vs_exact(void) {
    static loom_kernels fast;
    fast = loom_kernels_over(loom_kernels_ref, &loom_kernels_ref_q_fast);
    static const int shapes[][2] = {{64, 64}, {64, 192}, {128, 1024}};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < LOOM_ARRAY_LEN(shapes); si++) {
            int group = shapes[si][0], n = shapes[si][1], rows = 7, T = 3, ng = n / group;
            int words = n * bits / 32;
            uint32_t *wq = malloc((size_t)rows * words * sizeof *wq);
            for (int i = 0; i < rows * words; i++) wq[i] = test_rand_u32(&rng);
            uint16_t sc[7 * 16], bi[7 * 16];
            for (int i = 0; i < rows * ng; i++) {
                float sv = (0.02f + 0.05f * fabsf(test_rand_f(&rng))) / (float)(1 << bits);
                sc[i] = loom_f32_to_bf16(sv);
                bi[i] = loom_f32_to_bf16(-sv * (float)(1 << (bits - 1)) * (1.0f + 0.2f * test_rand_f(&rng)));
            }
            loom_qmat w = {.w = wq, .scales = sc, .biases = bi, .n = n, .bits = bits,
                           .group = group, .f16 = 0};
            float *x = rand_f32((size_t)T * n, 3.0f);
            float y[3 * 7], ye[3 * 7];
            fast.matmul_q(y, rows, x, n, &w, T, 0, rows);
            loom_kernels_ref.matmul_q(ye, rows, x, n, &w, T, 0, rows);
            double worst = 0;
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows; r++) {
                    double sa = 0, bound = 0;
                    for (int j = 0; j < n / 64; j++) {
                        double amax = 0, sw = 0;
                        for (int k = j * 64; k < j * 64 + 64; k++) {
                            size_t gi = (size_t)r * ng + k / group;
                            double wv = loom_bf16_to_f32(sc[gi]) *
                                            q_field_indep(wq + (size_t)r * words, k, bits) +
                                        loom_bf16_to_f32(bi[gi]);
                            amax = test_max(amax, fabs((double)x[t * n + k]));
                            sw += fabs(wv);
                            sa += fabs(wv * x[t * n + k]);
                        }
                        bound += amax / 254 * sw;
                    }
                    double d = fabs((double)y[t * rows + r] - ye[t * rows + r]);
                    worst = test_max(worst, d / sa);
                    CHECKF(d <= bound * (1 + 1e-5) + 1e-5 * sa + 1e-6,
                           "fast q%d vs exact n %d t %d r %d: %.9g vs %.9g (bound %.3g)", bits, n, t,
                           r, y[t * rows + r], ye[t * rows + r], bound);
                }
            /* And the error is well inside 1% of sum |x w| on random data. */
            CHECKF(worst < 1e-2, "fast q%d vs exact n %d: error %.3g of sum |x w|", bits, n, worst);
            free(wq);
            free(x);
        }
}

/* ---- vector kernels -------------------------------------------------------- */

static void test_dot_axpy(void) {
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++) {
        int n = SIZES[ni];
        float *a = rand_f32((size_t)n, 1.0f), *b = rand_f32((size_t)n, 3.0f);
        double sa = 0;
        for (int i = 0; i < n; i++) sa += fabs((double)a[i] * b[i]);
        float got = K->dot(a, b, n), want = R->dot(a, b, n);
        CHECKF(close_sum(got, want, sa), "dot n %d: %.9g vs %.9g", n, got, want);

        float *y = rand_f32((size_t)n, 2.0f), *yr = malloc((size_t)n * sizeof *yr);
        memcpy(yr, y, (size_t)n * sizeof *y);
        float s = test_rand_f(&rng) * 4.0f + 0.1f;
        K->axpy(y, s, a, n);
        R->axpy(yr, s, a, n);
        for (int i = 0; i < n; i++) {
            double mag = fabs((double)yr[i]) + fabs((double)s * a[i]) * 2;
            CHECKF(fabs((double)y[i] - yr[i]) <= 2e-7 * mag + 1e-12, "axpy n %d i %d: %.9g vs %.9g",
                   n, i, y[i], yr[i]);
        }
        free(a);
        free(b);
        free(y);
        free(yr);
    }
    CHECK(K->dot(NULL, NULL, 0) == 0);
}

/* attn_pv: slots with their own key ranges (empty, shared, partial, all),
 * padded strides. Weights outside a slot's range are NaN, so reading one
 * shows; the output's padding must stay untouched. On every table a slot
 * gets the same bits alone, among the others, and with its keys split
 * over two calls. */
static void check_attn_pv(int slots, int hd, int n_keys) {
    int ldo = hd + slots % 3, ldp = n_keys + 1 + hd % 2, ldv = hd + (n_keys % 2) * 5;
    int keys[2 * 9];
    for (int s = 0; s < slots; s++) {
        int a = (int)(test_rand_u32(&rng) % (unsigned)(n_keys + 1));
        int b = a + (int)(test_rand_u32(&rng) % (unsigned)(n_keys - a + 1));
        switch (s % 4) {
        case 0: a = 0, b = n_keys; break;             /* all keys */
        case 1: a = keys[2 * s - 2], b = keys[2 * s - 1]; break; /* as the slot before */
        case 2: if (s == 6) b = a; break;              /* some empty */
        default: break;
        }
        keys[2 * s] = a;
        keys[2 * s + 1] = b;
    }
    size_t no = (size_t)(slots - 1) * ldo + hd, np = (size_t)(slots - 1) * ldp + n_keys;
    size_t nv = (size_t)(n_keys - 1) * ldv + hd;
    float *p = rand_f32(np, 1.0f), *v = rand_f32(nv, 2.0f), *o0 = rand_f32(no, 1.0f);
    for (int s = 0; s < slots; s++)
        for (int i = 0; i < n_keys; i++) {
            float *w = p + (size_t)s * ldp + i;
            if (i < keys[2 * s] || i >= keys[2 * s + 1]) *w = NAN;
            else *w = fabsf(*w);
        }
    for (int s = 0; s + 1 < slots; s++)
        for (int d = hd; d < ldo; d++) o0[(size_t)s * ldo + d] = SENTINEL;
    float *o = malloc(no * sizeof *o), *orf = malloc(no * sizeof *orf), *alt = malloc(no * sizeof *alt);
    memcpy(o, o0, no * sizeof *o);
    memcpy(orf, o0, no * sizeof *o);
    K->attn_pv(o, ldo, p, ldp, keys, slots, v, ldv, n_keys, hd);
    R->attn_pv(orf, ldo, p, ldp, keys, slots, v, ldv, n_keys, hd);
    int bad = 0;
    for (int s = 0; s < slots && bad < 3; s++) {
        for (int d = 0; d < hd && bad < 3; d++) {
            size_t at = (size_t)s * ldo + d;
            double sa = fabs((double)o0[at]);
            for (int i = keys[2 * s]; i < keys[2 * s + 1]; i++)
                sa += fabs((double)p[(size_t)s * ldp + i] * v[(size_t)i * ldv + d]);
            int ok = close_sum(o[at], orf[at], sa);
            bad += !ok;
            CHECKF(ok, "attn_pv slots %d hd %d keys %d: s %d [%d,%d) d %d: %.9g vs %.9g", slots, hd,
                   n_keys, s, keys[2 * s], keys[2 * s + 1], d, o[at], orf[at]);
        }
        for (int d = hd; s + 1 < slots && d < ldo; d++)
            if (o[(size_t)s * ldo + d] != SENTINEL) {
                CHECKF(0, "attn_pv slots %d hd %d keys %d: wrote into ldo padding", slots, hd, n_keys);
                bad++;
                break;
            }
    }
    /* each slot alone, its keys split at a random point over two calls */
    memcpy(alt, o0, no * sizeof *o);
    for (int s = 0; s < slots; s++) {
        int a = keys[2 * s], b = keys[2 * s + 1];
        int cut = a + (int)(test_rand_u32(&rng) % (unsigned)(b - a + 1));
        int k1[2] = {a, cut}, k2[2] = {0, b - cut};
        const float *ps = p + (size_t)s * ldp;
        K->attn_pv(alt + (size_t)s * ldo, ldo, ps, ldp, k1, 1, v, ldv, cut, hd);
        if (b > cut)
            K->attn_pv(alt + (size_t)s * ldo, ldo, ps + cut, ldp, k2, 1, v + (size_t)cut * ldv, ldv,
                       n_keys - cut, hd);
    }
    CHECKF(!memcmp(alt, o, no * sizeof *o), "attn_pv slots %d hd %d keys %d: alone or split differs",
           slots, hd, n_keys);
    free(p);
    free(v);
    free(o0);
    free(o);
    free(orf);
    free(alt);
}

static void test_attn_pv(void) {
    static const int hds[] = {64, 80, 128, 256, 1, 7, 17, 37, 100, 129};
    static const int nks[] = {1, 2, 5, 16, 17, 63, 100, 300};
    for (int slots = 1; slots <= 9; slots++)
        for (size_t hi = 0; hi < LOOM_ARRAY_LEN(hds); hi++)
            for (size_t ki = 0; ki < LOOM_ARRAY_LEN(nks); ki++) check_attn_pv(slots, hds[hi], nks[ki]);
}

static void test_rmsnorm(void) {
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++) {
        int n = SIZES[ni];
        float *x = rand_f32((size_t)n, 5.0f), *w = rand_f32((size_t)n, 2.0f);
        float *y = malloc((size_t)n * sizeof *y), *yr = malloc((size_t)n * sizeof *yr);
        K->rmsnorm(y, x, w, n, 1e-6f);
        R->rmsnorm(yr, x, w, n, 1e-6f);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(y[i], yr[i], 1e-5, 1e-7), "rmsnorm n %d i %d: %.9g vs %.9g", n, i,
                   y[i], yr[i]);
        /* In place (y aliases x). */
        K->rmsnorm(x, x, w, n, 1e-6f);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(x[i], yr[i], 1e-5, 1e-7), "rmsnorm alias n %d i %d: %.9g vs %.9g", n,
                   i, x[i], yr[i]);
        free(x);
        free(w);
        free(y);
        free(yr);
    }
}

static void test_softmax(void) {
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++)
        for (int mode = 0; mode < 3; mode++) {
            int n = SIZES[ni];
            /* mode 0: logits in [-1,1); 1: in [-40,40); 2: with masked -inf. */
            float *x = rand_f32((size_t)n, mode == 0 ? 1.0f : 40.0f);
            if (mode == 2)
                for (int i = 0; i < n; i++)
                    if (i % 3 == 1) x[i] = -INFINITY;
            float *xr = malloc((size_t)n * sizeof *xr);
            memcpy(xr, x, (size_t)n * sizeof *x);
            K->softmax(x, n);
            R->softmax(xr, n);
            double sum = 0;
            for (int i = 0; i < n; i++) {
                sum += x[i];
                CHECKF(close_rel(x[i], xr[i], 1e-5, 1e-9), "softmax n %d mode %d i %d: %.9g vs %.9g",
                       n, mode, i, x[i], xr[i]);
            }
            CHECKF(fabs(sum - 1.0) < 1e-5, "softmax n %d mode %d: sum %.9g", n, mode, sum);
            free(x);
            free(xr);
        }
    /* exp over its whole range: softmax([0, v]) = {1, e^v} / (1 + e^v),
     * from e^v ~ 1 down to subnormal and zero. */
    for (float v = -110.0f; v <= 0.0f; v += 0.0371f) {
        float x[2] = {0.0f, v}, xr[2] = {0.0f, v};
        K->softmax(x, 2);
        R->softmax(xr, 2);
        CHECKF(close_rel(x[0], xr[0], 5e-7, 0) && close_rel(x[1], xr[1], 5e-7, 1e-44),
               "softmax [0, %.9g]: {%.9g, %.9g} vs {%.9g, %.9g}", v, x[0], x[1], xr[0], xr[1]);
    }
}

static void test_silu_mul(void) {
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++) {
        int n = SIZES[ni];
        float *g = rand_f32((size_t)n, 12.0f), *u = rand_f32((size_t)n, 2.0f);
        float *gr = malloc((size_t)n * sizeof *gr);
        memcpy(gr, g, (size_t)n * sizeof *g);
        K->silu_mul(g, u, n);
        R->silu_mul(gr, u, n);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(g[i], gr[i], 1e-6, 1e-30), "silu_mul n %d i %d: %.9g vs %.9g", n, i,
                   g[i], gr[i]);
        free(g);
        free(u);
        free(gr);
    }
    /* Sweep through exp overflow (g < -88.7) and underflow (g > 87). */
    enum { N = 4096 };
    static float g[N], gr[N], u[N];
    for (int i = 0; i < N; i++) {
        g[i] = gr[i] = -120.0f + 240.0f * (float)i / N + 0.013f;
        u[i] = 1.0f + test_rand_f(&rng) * 0.5f;
    }
    g[0] = gr[0] = INFINITY;
    g[1] = gr[1] = -INFINITY;
    g[2] = gr[2] = NAN;
    K->silu_mul(g, u, N);
    R->silu_mul(gr, u, N);
    for (int i = 0; i < N; i++)
        CHECKF(close_rel(g[i], gr[i], 5e-7, 1e-37), "silu_mul sweep i %d: %.9g vs %.9g", i, g[i],
               gr[i]);
}

static int close_gelu(float got, float want, float x, float u) {
    if (isnan(want)) return isnan(got);
    /* The reference's 1 + tanhf(z) carries an absolute error of about an
     * ulp of 1, so allow that much of 0.5 |x u| besides the relative part. */
    return fabs((double)got - want) <= 1e-6 * fabs((double)want) + 3e-7 * fabs((double)x * u) + 1e-37;
}

static void test_gelu_tanh_mul(void) {
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++) {
        int n = SIZES[ni];
        float *g = rand_f32((size_t)n, 6.0f), *u = rand_f32((size_t)n, 2.0f);
        float *g0 = malloc((size_t)n * sizeof *g0), *gr = malloc((size_t)n * sizeof *gr);
        memcpy(g0, g, (size_t)n * sizeof *g);
        memcpy(gr, g, (size_t)n * sizeof *g);
        K->gelu_tanh_mul(g, u, n);
        R->gelu_tanh_mul(gr, u, n);
        for (int i = 0; i < n; i++)
            CHECKF(close_gelu(g[i], gr[i], g0[i], u[i]), "gelu_tanh_mul n %d i %d (x %.9g): %.9g vs %.9g",
                   n, i, g0[i], g[i], gr[i]);
        free(g);
        free(u);
        free(g0);
        free(gr);
    }
    enum { N = 4096 };
    static float g[N], gr[N], g0[N], u[N];
    for (int i = 0; i < N; i++) {
        g[i] = -40.0f + 80.0f * (float)i / N + 0.0071f;
        u[i] = 1.0f + test_rand_f(&rng) * 0.5f;
    }
    g[0] = INFINITY;
    g[1] = -INFINITY;
    g[2] = NAN;
    g[3] = 1e20f; /* x^3 overflows */
    g[4] = -1e20f;
    g[5] = 1e-30f;
    memcpy(gr, g, sizeof g);
    memcpy(g0, g, sizeof g);
    K->gelu_tanh_mul(g, u, N);
    R->gelu_tanh_mul(gr, u, N);
    for (int i = 0; i < N; i++) {
        int ok = isinf(g0[i]) ? (isnan(gr[i]) ? isnan(g[i]) : g[i] == gr[i])
                              : close_gelu(g[i], gr[i], g0[i], u[i]);
        CHECKF(ok, "gelu_tanh_mul sweep x %.9g: %.9g vs %.9g", g0[i], g[i], gr[i]);
    }
}

static void test_row_conversions(void) {
    /* Every 16-bit pattern, shifted so the tail path sees each one too. */
    enum { N = 65536 + 7 };
    uint16_t *h = malloc(N * sizeof *h);
    float *y = malloc(N * sizeof *y), *yr = malloc(N * sizeof *yr);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)(i * 40503u);
    for (int bf = 0; bf < 2; bf++)
        for (size_t ni = 0; ni <= LOOM_ARRAY_LEN(SIZES); ni++) {
            int n = ni < LOOM_ARRAY_LEN(SIZES) ? SIZES[ni] : N;
            for (int i = 0; i < n; i++) y[i] = yr[i] = SENTINEL;
            if (bf) {
                K->bf16_to_f32(y, h, n);
                R->bf16_to_f32(yr, h, n);
            } else {
                K->f16_to_f32(y, h, n);
                R->f16_to_f32(yr, h, n);
            }
            int bad = 0;
            for (int i = 0; i < n && bad < 5; i++) {
                /* NaN payloads may differ (hardware may quiet them). */
                int ok = isnan(yr[i]) ? isnan(y[i]) : memcmp(&y[i], &yr[i], 4) == 0;
                bad += !ok;
                CHECKF(ok, "%s n %d i %d (0x%04x): %.9g vs %.9g", bf ? "bf16" : "f16", n, i, h[i],
                       y[i], yr[i]);
            }
        }
    free(h);
    free(y);
    free(yr);
}

/* ---- base conversions against an independent computation ----------------- */

/* Value of a finite f16 pattern (or +-inf), computed from the definition. */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* Round-to-nearest-even of |f| onto the ordered list of non-negative f16
 * patterns 0..0x7c00, where 0x7c00 (inf) takes the place of 2^16 for
 * rounding (IEEE overflow rule). */
static uint16_t f32_to_f16_indep(float f) {
    if (isnan(f)) return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65536.0) return sign | 0x7c00;
    uint16_t lo = 0, hi = 0x7c00;
    while (hi - lo > 1) { /* largest lo with value(lo) <= a */
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (f16_value(mid) <= a) lo = mid;
        else hi = mid;
    }
    if (f16_value(lo) == a) return sign | lo;
    double vhi = lo + 1 == 0x7c00 ? 65536.0 : f16_value((uint16_t)(lo + 1));
    double dlo = a - f16_value(lo), dhi = vhi - a;
    uint16_t r = dlo < dhi ? lo : dhi < dlo ? (uint16_t)(lo + 1) : (lo & 1) ? (uint16_t)(lo + 1) : lo;
    return sign | r;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 by the same nearest-even rule, with the neighbours as doubles. */
static uint16_t f32_to_bf16_indep(float f) {
    if (isnan(f)) return 0xffff; /* only NaN-ness is compared */
    uint32_t u = f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16); /* truncation: |value(lo)| <= |f| */
    double a = fabs((double)f), vlo = fabs((double)bits_f32((uint32_t)lo << 16));
    if (vlo == a) return lo;
    uint16_t up = (uint16_t)(lo + 1);
    double vhi = (up & 0x7fff) == 0x7f80 ? ldexp(1.0, 128) : fabs((double)bits_f32((uint32_t)up << 16));
    double dlo = a - vlo, dhi = vhi - a;
    return dlo < dhi ? lo : dhi < dlo ? up : (lo & 1) ? up : lo;
}

static void check_f32_to_f16(float f) {
    uint16_t got = loom_f32_to_f16(f), want = f32_to_f16_indep(f);
    if (isnan(f)) {
        CHECKF((got & 0x7c00) == 0x7c00 && (got & 0x3ff) && (got & 0x8000) == (f32_bits(f) >> 16 & 0x8000),
               "f32_to_f16(nan 0x%08x) = 0x%04x", f32_bits(f), got);
        return;
    }
    CHECKF(got == want, "f32_to_f16(%.9g = 0x%08x) = 0x%04x, want 0x%04x", f, f32_bits(f), got, want);
}

static void check_f32_to_bf16(float f) {
    uint16_t got = loom_f32_to_bf16(f), want = f32_to_bf16_indep(f);
    if (isnan(f)) {
        CHECKF(isnan(loom_bf16_to_f32(got)) && (got >> 15) == (f32_bits(f) >> 31),
               "f32_to_bf16(nan 0x%08x) = 0x%04x", f32_bits(f), got);
        return;
    }
    CHECKF(got == want, "f32_to_bf16(%.9g = 0x%08x) = 0x%04x, want 0x%04x", f, f32_bits(f), got,
           want);
}

/* e4m3 <-> f32: every code against the definition, exact round trips,
 * ties to even at every midpoint, saturation at 448, NaN. */
static void test_e4m3_conversions(void) {
    int bad = 0;
    for (unsigned b = 0; b < 256 && bad < 5; b++) {
        float f = loom_e4m3_to_f32((uint8_t)b);
        double want = e4m3_indep(b);
        int ok = isnan(want) ? isnan(f) && loom_f32_to_e4m3(f) == 0x7f
                             : (double)f == want && !!signbit(f) == !!(b & 0x80) &&
                                   loom_f32_to_e4m3(f) == b;
        bad += !ok;
        CHECKF(ok, "e4m3 0x%02x -> %.9g -> 0x%02x", b, f, loom_f32_to_e4m3(f));
    }
    for (unsigned b = 0; b < 0x7e; b++) {
        double lo = e4m3_indep(b), hi = e4m3_indep(b + 1);
        float mid = (float)((lo + hi) / 2);
        unsigned even = (b & 1) ? b + 1 : b;
        for (int sgn = 0; sgn < 2; sgn++) {
            float m = sgn ? -mid : mid;
            unsigned sb = sgn ? 0x80u : 0u;
            CHECKF(loom_f32_to_e4m3(m) == (even | sb), "e4m3 midpoint %.9g -> 0x%02x", m,
                   loom_f32_to_e4m3(m));
            CHECKF(loom_f32_to_e4m3(nextafterf(m, 0)) == (b | sb), "e4m3 below %.9g", m);
            CHECKF(loom_f32_to_e4m3(nextafterf(m, sgn ? -INFINITY : INFINITY)) == ((b + 1) | sb),
                   "e4m3 above %.9g", m);
        }
    }
    CHECK(loom_f32_to_e4m3(448.0f) == 0x7e && loom_f32_to_e4m3(1e9f) == 0x7e);
    CHECK(loom_f32_to_e4m3(-470.0f) == 0xfe && loom_f32_to_e4m3(-INFINITY) == 0xfe);
    CHECK(loom_f32_to_e4m3(NAN) == 0x7f && loom_f32_to_e4m3(1e-30f) == 0);
    CHECK(loom_f32_to_e4m3(-0.0f) == 0x80);
}

static void test_base_conversions(void) {
    test_e4m3_conversions();
    /* f16 -> f32 for every pattern, and exact round trip of every non-NaN. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536 && bad < 5; h++) {
        float f = loom_f16_to_f32((uint16_t)h);
        int e = (h >> 10) & 31, m = h & 1023;
        int ok;
        if (e == 31 && m) {
            ok = isnan(f) && !!signbit(f) == !!(h & 0x8000);
        } else {
            ok = (double)f == f16_value((uint16_t)h) && !!signbit(f) == !!(h & 0x8000) &&
                 loom_f32_to_f16(f) == h;
        }
        bad += !ok;
        CHECKF(ok, "f16 0x%04x -> %.9g -> 0x%04x", h, f, loom_f32_to_f16(f));
    }
    /* bf16 -> f32 -> bf16 for every pattern. */
    bad = 0;
    for (uint32_t h = 0; h < 65536 && bad < 5; h++) {
        float f = loom_bf16_to_f32((uint16_t)h);
        int ok = f32_bits(f) == h << 16 &&
                 (isnan(f) ? isnan(loom_bf16_to_f32(loom_f32_to_bf16(f))) : loom_f32_to_bf16(f) == h);
        bad += !ok;
        CHECKF(ok, "bf16 0x%04x round trip", h);
    }
    /* f32 -> f16: every midpoint between neighbouring f16 values (ties go to
     * even) and the floats just either side of it. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double lo = f16_value((uint16_t)h), hi = h + 1 == 0x7c00 ? 65536.0 : f16_value((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: f16 has 11 bits, f32 24 */
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            check_f32_to_f16(m);
            check_f32_to_f16(nextafterf(m, INFINITY));
            check_f32_to_f16(nextafterf(m, -INFINITY));
        }
    }
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX,
                                     FLT_MIN, FLT_TRUE_MIN, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                                     1e-8f, 2.98023224e-8f /* 2^-25 */, 2.98023259e-8f, 5.96046448e-8f,
                                     6.09755516e-5f, 6.10351562e-5f, 1.0f, 1.00048828125f,
                                     1.00146484375f, 3.14159265f};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(specials); i++) {
        check_f32_to_f16(specials[i]);
        check_f32_to_f16(-specials[i]);
        check_f32_to_bf16(specials[i]);
        check_f32_to_bf16(-specials[i]);
    }
    check_f32_to_bf16(bits_f32(0x7f800001u)); /* signalling NaN must stay NaN */
    check_f32_to_bf16(bits_f32(0xff800001u));
    check_f32_to_bf16(bits_f32(0x3f808000u)); /* tie, even below */
    check_f32_to_bf16(bits_f32(0x3f818000u)); /* tie, odd below */
    check_f32_to_bf16(bits_f32(0x7f7f8000u)); /* tie rounding up to inf */
    check_f32_to_bf16(bits_f32(0x00008000u)); /* subnormal tie */
    check_f32_to_bf16(bits_f32(0x00018000u));
    /* Random bit patterns across the whole range (all exponents). */
    for (int i = 0; i < 200000; i++) {
        float f = bits_f32(test_rand_u32(&rng));
        check_f32_to_f16(f);
        check_f32_to_bf16(f);
    }
}

static void test_argmax(void) {
    float a[] = {3.0f};
    CHECK_EQ_INT(loom_argmax(a, 1), 0);
    float b[] = {-5.0f, -2.0f, -2.0f, -7.0f};
    CHECK_EQ_INT(loom_argmax(b, 4), 1);
    float c[] = {-INFINITY, -INFINITY, 1.0f, 4.0f, 4.0f};
    CHECK_EQ_INT(loom_argmax(c, 5), 3);
    float d[] = {-INFINITY, -INFINITY};
    CHECK_EQ_INT(loom_argmax(d, 2), 0);
    for (size_t ni = 0; ni < LOOM_ARRAY_LEN(SIZES); ni++) {
        int n = SIZES[ni];
        float *x = rand_f32((size_t)n, 1.0f);
        int want = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[want]) want = i;
        CHECK_EQ_INT(loom_argmax(x, n), want);
        int j = n / 2;
        x[j] = 2.0f; /* new unique maximum in the middle */
        if (j + 1 < n) x[n - 1] = 2.0f; /* a later tie must not win */
        CHECK_EQ_INT(loom_argmax(x, n), j);
        free(x);
    }
    /* vocabulary-sized rows: ties across and inside blocks, NaNs, -inf */
    unsigned long long rng = 77;
    for (int rep = 0; rep < 200; rep++) {
        int n = 1 + (int)(test_rand_u32(&rng) % 5000) + (rep % 4 == 0 ? 150000 : 0);
        float *x = malloc(sizeof *x * (size_t)n);
        int levels = 1 + (int)(test_rand_u32(&rng) % 50);
        for (int i = 0; i < n; i++) {
            unsigned r = test_rand_u32(&rng);
            x[i] = r % 97 == 0 ? NAN : r % 89 == 0 ? -INFINITY : (float)(r % (unsigned)levels);
        }
        if (rep % 7 == 0) x[0] = NAN;
        int want = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[want]) want = i;
        CHECKF(loom_argmax(x, n) == want, "argmax n=%d rep %d: %d, expected %d", n, rep,
               loom_argmax(x, n), want);
        free(x);
    }
}

/* Every test over table k, against reference table r; batch_invariant:
 * k's dense matmuls promise bit-identical outputs for any batch. */
static void run_all(const char *label, const loom_kernels *k, const loom_kernels *r,
                    int batch_invariant) {
    fprintf(stderr, "test_ops: %s kernels against %s\n", label, r->name);
    K = k;
    R = r;
    test_matmul();
    test_matmul_specials();
    if (batch_invariant) test_matmul_batch_invariant();
    q_invariant = !strcmp(label, "avx512") || !strcmp(label, "avx512-fast") || !strcmp(label, "avx2-fast");
    if (!strcmp(label, "avx512-fast")) test_matvec_fast_small_t();
    test_matmul_rounding();
    test_matmul_q();
    if (!strcmp(label, "avx512")) test_matmul_q_chain();
    test_matmul_f8();
    if (K->q_il16) test_matmul_q_il();
    test_dot_axpy();
    test_attn_pv();
    test_rmsnorm();
    test_softmax();
    test_silu_mul();
    test_gelu_tanh_mul();
    test_row_conversions();
    test_base_conversions();
    test_argmax();
}

/* The error helpers every check reads fail on a NaN anywhere (fmax would
 * pass over it). */
static void test_nan_poisons(void) {
    float a[4] = {1, 2, NAN, 4}, b[4] = {1, 2, 3, 4};
    CHECK(!(test_max(0, NAN) < 1) && !(test_max(NAN, 0) < 1) && test_max(1, 2) == 2);
    CHECK(test_max_abs_err(a, b, 4) == INFINITY && test_max_abs_err(b, a, 4) == INFINITY);
    CHECK(!(test_rel_err(a, b, 4) < 1) && !(test_rel_err(b, a, 4) < 1));
    CHECK(test_max_abs_err(b, b, 4) == 0 && test_rel_err(b, b, 4) == 0);
}

/* --fast takes the bf16 entries only where VDPBF16PS outruns the f32
 * FMAs (on an Intel Xeon that has it, at half their rate, it made the
 * prefill no faster and the logits less exact); LOOM_FAST_BF16 forces
 * either way. Runs before anything else asks for the fast table, so the
 * forced "0" below is what the table is built with. */
static void test_fast_bf16_pick(void) {
    CHECK(loom_fast_bf16_pick(2.0, NULL) == 1);
    CHECK(loom_fast_bf16_pick(0.5, NULL) == 0);
    CHECK(loom_fast_bf16_pick(LOOM_FAST_BF16_MIN_GAIN, NULL) == 1);
    CHECK(loom_fast_bf16_pick(0.5, "1") == 1);
    CHECK(loom_fast_bf16_pick(2.0, "0") == 0);
    CHECK(loom_fast_bf16_pick(0.5, "yes") == 0); /* unknown: the measurement decides */
    CHECK(loom_fast_bf16_pick(2.0, "yes") == 1);
    if (getenv("LOOM_FAST_BF16")) return;
    setenv("LOOM_FAST_BF16", "0", 1);
    const loom_kernels *fast = loom_kernels_get_fast(), *exact = loom_kernels_get();
    unsetenv("LOOM_FAST_BF16");
    CHECKF(fast->matmul_bf16 == exact->matmul_bf16 && fast->bf16_prep_bytes == exact->bf16_prep_bytes,
           "LOOM_FAST_BF16=0: --fast still takes the %s bf16 entries", fast->name);
#if defined(__x86_64__)
    if (loom_cpu_has_avx512()) {
        double g = loom_avx512_bf16_gain();
        CHECKF(g > 0.05 && g < 20, "bf16 gain probe: %g, expected a ratio near 0.5-2", g);
    }
#endif
}

int main(void) {
    test_fast_bf16_pick();
    test_nan_poisons();
    const loom_kernels *best = loom_kernels_get();
    CHECK(best != NULL);
    /* The fast reference: loom_kernels_ref with the rounded variants. */
    static loom_kernels ref_fast;
    ref_fast = loom_kernels_over(loom_kernels_over(loom_kernels_ref, &loom_kernels_ref_dense_fast),
                                 &loom_kernels_ref_q_fast);
    ref_fast.name = "ref-fast";
    test_fast_vs_exact();
    test_fast_q_vs_exact();
    int ran = 0;
#if defined(__x86_64__)
    /* Each SIMD table is tested whatever LOOM_KERNELS picks, on any CPU
     * that can run it. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        static loom_kernels avx2;
        avx2 = loom_kernels_over(loom_kernels_ref, &loom_kernels_avx2);
        run_all("avx2", &avx2, &loom_kernels_ref, 1);
        /* AVX2 rounds only the quantized matmuls' activations */
        static loom_kernels avx2_fast, ref_q_fast;
        avx2_fast = loom_kernels_over(avx2, &loom_kernels_avx2_q_fast);
        ref_q_fast = loom_kernels_over(loom_kernels_ref, &loom_kernels_ref_q_fast);
        ref_q_fast.name = "ref-q-fast";
        run_all("avx2-fast", &avx2_fast, &ref_q_fast, 0);
        ran = 1;
        if (loom_cpu_has_avx512()) {
            static loom_kernels avx512, avx512_fast;
            avx512 = loom_kernels_over(loom_kernels_over(avx2, &loom_kernels_avx512_dense),
                                       &loom_kernels_avx512_q);
            avx512_fast = loom_kernels_over(
                loom_kernels_over(avx512, &loom_kernels_avx512_dense_fast), &loom_kernels_avx512_q_fast);
            run_all("avx512", &avx512, &loom_kernels_ref, 1);
            run_all("avx512-fast", &avx512_fast, &ref_fast, 0);
        } else {
            fprintf(stderr, "test_ops: no AVX-512 (F/BW/DQ/VL/VNNI/BF16); those kernels not tested\n");
        }
        const char *force = getenv("LOOM_KERNELS");
        if (!force) CHECK_STR(best->name, loom_cpu_has_avx512() ? "avx512" : "avx2");
    }
#endif
    if (!ran) {
        fprintf(stderr, "test_ops: no SIMD table for this CPU; checking the reference against itself\n");
        run_all("ref", best, &loom_kernels_ref, 1);
    }
    return test_report("test_ops");
}
