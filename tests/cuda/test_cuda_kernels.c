/* test_cuda_kernels: every CUDA kernel against its CPU reference on random
 * data and odd sizes. Needs a GPU; built by `make CUDA=1 cuda-tests`, run by
 * tools/cuda_check.sh. Prints one line per case to stdout:
 *   PASS|FAIL  <kernel> <case>  max_err=<largest |gpu - ref|>  worst=<largest
 *   error / allowed error (<= 1 passes)>
 * and a summary; exits 0 only when every case passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test.h"
#include "base/base.h"
#include "cuda/cuda.h"
#include "engine/kv.h"
#include "ops/ops.h"

static loom_cuda *C;
static loom_cuda *C_fma, *C_mma;  /* the decode GEMV forced to one kernel (LOOM_CUDA_GEMV_MMA) */
/* the f32-FMA kernel's 1-2 token variants (LOOM_CUDA_GEMV_KS, _U, _BPS) besides the default */
#define GV_VARIANTS 10
static loom_cuda *C_gv[GV_VARIANTS];
/* name, LOOM_CUDA_GEMV_KS, _U, _BPS, _PRE2, _W, _NP */
static const char *GV_VAR[GV_VARIANTS][7] = {
    {"rows", "0", "4", "0", "1", "8", "1"},        {"ks1 u4", "1", "4", "0", "1", "8", "1"},
    {"ks1 u8", "1", "8", "0", "1", "8", "1"},      {"ks4 u4 1bps", "4", "4", "1", "1", "8", "1"},
    {"ks2 u8", "2", "8", "0", "1", "8", "1"},      {"ks1 u4 first only", "1", "4", "0", "0", "8", "1"},
    {"ks1 u4 w16", "1", "4", "0", "1", "16", "1"}, {"ks2 u8 w16", "2", "8", "0", "1", "16", "1"},
    {"ks1 u4 gv_fill", "1", "4", "0", "1", "8", "0"},
    {"ks1 u8 w16 gv_fill", "1", "8", "0", "1", "16", "0"}};
/* decode attention besides the default (LOOM_CUDA_ATTN_SPLIT, _CLUSTER):
 * the split kernel down to 16 and to 8 positions, clusters of up to 8 and 2 */
#define ATT_VARIANTS 4
static loom_cuda *C_att[ATT_VARIANTS];
static const char *ATT_VAR[ATT_VARIANTS][3] = {
    {" split>=16", "16", "0"}, {" split", "8", "0"}, {" cluster<=8", "8", "8"},
    {" cluster<=2", "8", "2"}};
/* tensor-core prefill attention besides the default (LOOM_CUDA_FA_MT=1) */
static loom_cuda *C_fa1;
static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static int n_pass, n_fail;

static float rnd(void) { return test_rand_f(&rng); }

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rnd() * scale;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* A failed CUDA call: one FAIL line naming the case and the error. */
static int api_fail(const char *kernel, const char *what, loom_status st) {
    printf("FAIL  %-14s %s  error %s: %s\n", kernel, what, loom_status_str(st), loom_last_error());
    fflush(stdout);
    n_fail++;
    return 0;
}

#define TRY(kernel, what, call)                                           \
    do {                                                                  \
        loom_status st_ = (call);                                         \
        if (st_ != LOOM_OK) return api_fail(kernel, what, st_);           \
    } while (0)

/* Device copy of a host buffer (NULL on failure, which is reported). */
static void *up(const void *h, size_t n) {
    void *d = NULL;
    if (loom_cuda_alloc(C, &d, n) != LOOM_OK) return NULL;
    if (loom_cuda_upload(C, d, h, n) != LOOM_OK) {
        loom_cuda_release(C, d);
        return NULL;
    }
    return d;
}

/* Compares got with ref where element i may be off by bound[i] (or by
 * atol + rtol * |ref| when bound is NULL); prints the case's line. */
static int report(const char *kernel, const char *what, const float *got, const float *ref,
                  const float *bound, size_t n, float atol, float rtol) {
    double max_err = 0, worst = 0;
    size_t wi = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        double allow = bound ? (double)bound[i] : atol + rtol * fabs((double)ref[i]);
        if (isnan(got[i]) != isnan(ref[i]) || isinf(got[i]) != isinf(ref[i])) {
            bad = 1;
            wi = i;
            worst = INFINITY;
            continue;
        }
        if (isnan(ref[i]) || isinf(ref[i])) continue;
        if (e > max_err) max_err = e;
        double r = allow > 0 ? e / allow : (e > 0 ? INFINITY : 0);
        if (r > worst) {
            worst = r;
            wi = i;
        }
    }
    int ok = !bad && worst <= 1.0;
    printf("%s  %-14s %-44s max_err=%.3g worst=%.3g", ok ? "PASS" : "FAIL", kernel, what, max_err,
           worst);
    if (!ok && n) printf("  [at %zu: gpu %.9g ref %.9g]", wi, got[wi], ref[wi]);
    printf("\n");
    fflush(stdout);
    if (ok) n_pass++;
    else n_fail++;
    return ok;
}

static const int SIZES[] = {1, 7, 33, 1000, 4097};
#define N_SIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* ---- RMSNorm ------------------------------------------------------------ */

static int test_rmsnorm(int n, int T, int mode) {
    /* mode 0: weight, 1: (1 + weight), 2: no weight */
    static const char *modes[] = {"w", "1+w", "none"};
    char what[96];
    snprintf(what, sizeof what, "T=%d n=%d weight=%s", T, n, modes[mode]);
    size_t N = (size_t)T * n;
    float *x = xmalloc(N * 4), *w = xmalloc((size_t)n * 4), *w1 = xmalloc((size_t)n * 4);
    float *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    fill(x, N, 3.0f);
    fill(w, (size_t)n, 1.0f);
    for (int i = 0; i < n; i++) w1[i] = mode == 0 ? w[i] : mode == 1 ? 1.0f + w[i] : 1.0f;
    for (int t = 0; t < T; t++)
        loom_kernels_ref.rmsnorm(ref + (size_t)t * n, x + (size_t)t * n, w1, n, 1e-6f);
    float *dx = up(x, N * 4), *dw = up(w, (size_t)n * 4);
    int ok = 0;
    if (!dx || !dw) {
        api_fail("rmsnorm", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_rmsnorm(C, dx, dx, mode == 2 ? NULL : dw, T, n, 1e-6f, mode == 1);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dx, N * 4);
        if (st != LOOM_OK) api_fail("rmsnorm", what, st);
        else ok = report("rmsnorm", what, got, ref, NULL, N, 1e-6f, 2e-5f);
    }
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dw);
    free(x), free(w), free(w1), free(ref), free(got);
    return ok;
}

/* rmsnorm_add: x += rmsnorm(y) * w, against the reference RMSNorm of y
 * added to x on the host. */
static int test_rmsnorm_add(int n, int T, int weighted) {
    char what[96];
    snprintf(what, sizeof what, "T=%d n=%d weight=%s", T, n, weighted ? "w" : "none");
    size_t N = (size_t)T * n;
    float *x = xmalloc(N * 4), *y = xmalloc(N * 4), *w = xmalloc((size_t)n * 4);
    float *w1 = xmalloc((size_t)n * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    fill(x, N, 2.0f);
    fill(y, N, 3.0f);
    fill(w, (size_t)n, 1.0f);
    for (int i = 0; i < n; i++) w1[i] = weighted ? w[i] : 1.0f;
    for (int t = 0; t < T; t++)
        loom_kernels_ref.rmsnorm(ref + (size_t)t * n, y + (size_t)t * n, w1, n, 1e-6f);
    for (size_t i = 0; i < N; i++) ref[i] += x[i];
    float *dx = up(x, N * 4), *dy = up(y, N * 4), *dw = up(w, (size_t)n * 4);
    int ok = 0;
    if (!dx || !dy || !dw) {
        api_fail("rmsnorm_add", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_rmsnorm_add(C, dx, dy, weighted ? dw : NULL, T, n, 1e-6f);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dx, N * 4);
        if (st != LOOM_OK) api_fail("rmsnorm_add", what, st);
        else ok = report("rmsnorm_add", what, got, ref, NULL, N, 1e-5f, 2e-5f);
    }
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    loom_cuda_release(C, dw);
    free(x), free(y), free(w), free(w1), free(ref), free(got);
    return ok;
}

/* ---- rope --------------------------------------------------------------- */

static int test_rope(int T, int nh, int hd, int rot, double theta) {
    char what[96];
    snprintf(what, sizeof what, "T=%d heads=%d head_dim=%d rot=%d", T, nh, hd, rot);
    int half = rot / 2, ld = half + 3;  /* a wider table, like the forward's max_rot */
    size_t N = (size_t)T * nh * hd;
    float *x = xmalloc(N * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    float *cs = xmalloc((size_t)T * ld * 4), *sn = xmalloc((size_t)T * ld * 4);
    double *inv = xmalloc((size_t)(half ? half : 1) * sizeof(double));
    int *pos = xmalloc((size_t)T * sizeof(int));
    fill(x, N, 2.0f);
    for (int i = 0; i < half; i++) inv[i] = pow(theta, -2.0 * i / rot);
    if (half > 2) inv[half - 1] = 0;  /* an unrotated pair */
    for (int t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int)(test_rand_u32(&rng) % 131072);
    memset(cs, 0, (size_t)T * ld * 4);
    memset(sn, 0, (size_t)T * ld * 4);
    loom_cuda_rope_table(cs, sn, ld, pos, T, inv, rot, 1.0);
    memcpy(ref, x, N * 4);
    /* The CPU forward's rope_tables + rope_apply, spelled out. */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            float *v = ref + ((size_t)t * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                double ang = (double)pos[t] * inv[i];
                float c = (float)cos(ang), s = (float)sin(ang);
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    float *dx = up(x, N * 4), *dc = up(cs, (size_t)T * ld * 4), *ds = up(sn, (size_t)T * ld * 4);
    int ok = 0;
    if (!dx || !dc || !ds) {
        api_fail("rope", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_rope(C, dx, T, nh, hd, rot, dc, ds, ld);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dx, N * 4);
        if (st != LOOM_OK) api_fail("rope", what, st);
        else ok = report("rope", what, got, ref, NULL, N, 1e-6f, 1e-5f);
    }
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dc);
    loom_cuda_release(C, ds);
    free(x), free(ref), free(got), free(cs), free(sn), free(inv), free(pos);
    return ok;
}

/* The device-made rope table against the host one (double angles on both
 * sides: equal up to the last bit of cos/sin). With streams, M-RoPE: each
 * pair picks one of three position streams (stride T + 3), against the
 * CPU forward's rope_tables spelled out. */
static int test_rope_table(int T, int rot, double theta, double scale, int streams) {
    char what[112];
    snprintf(what, sizeof what, "T=%d rot=%d theta=%g scale=%g%s", T, rot, theta, scale,
             streams ? " 3 streams" : "");
    int half = rot / 2, ld = half + 5, pld = streams ? T + 3 : T;
    size_t N = (size_t)T * ld, NP = (size_t)(streams ? 3 : 1) * pld;
    float *cs = xmalloc(N * 4), *sn = xmalloc(N * 4), *got = xmalloc(2 * N * 4);
    float *ref = xmalloc(2 * N * 4);
    double *inv = xmalloc((size_t)half * sizeof(double));
    int *pos = xmalloc(NP * sizeof(int));
    int32_t *pos32 = xmalloc(NP * sizeof(int32_t));
    unsigned char *str = xmalloc((size_t)half);
    for (int i = 0; i < half; i++) inv[i] = pow(theta, -2.0 * i / rot);
    for (int i = 0; i < half; i++) str[i] = (unsigned char)(test_rand_u32(&rng) % 3);
    for (size_t t = 0; t < NP; t++) pos32[t] = pos[t] = (int)(test_rand_u32(&rng) % 200000);
    memset(cs, 0, N * 4);
    memset(sn, 0, N * 4);
    if (!streams) {
        loom_cuda_rope_table(cs, sn, ld, pos, T, inv, rot, scale);
    } else {
        for (int t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                double a = (double)pos[(size_t)str[i] * pld + t] * inv[i];
                cs[(size_t)t * ld + i] = (float)(cos(a) * scale);
                sn[(size_t)t * ld + i] = (float)(sin(a) * scale);
            }
    }
    memcpy(ref, cs, N * 4);
    memcpy(ref + N, sn, N * 4);
    float *dc = up(cs, N * 4), *ds = up(sn, N * 4);  /* pad columns stay as on the host */
    int32_t *dp = up(pos32, NP * 4);
    double *di = up(inv, (size_t)half * sizeof(double));
    unsigned char *dstr = streams ? up(str, (size_t)half) : NULL;
    int ok = 0;
    if (!dc || !ds || !dp || !di || (streams && !dstr)) {
        api_fail("rope_table_dev", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_memset0(C, dc, (size_t)half * 4);  /* row 0 must be rewritten */
        if (st == LOOM_OK)
            st = loom_cuda_rope_table_dev(C, dc, ds, ld, dp, T, di, rot, scale, dstr, pld);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dc, N * 4);
        if (st == LOOM_OK) st = loom_cuda_download(C, got + N, ds, N * 4);
        if (st != LOOM_OK) api_fail("rope_table_dev", what, st);
        else ok = report("rope_table_dev", what, got, ref, NULL, 2 * N, 1e-7f, 1e-6f);
    }
    loom_cuda_release(C, dc);
    loom_cuda_release(C, ds);
    loom_cuda_release(C, dp);
    loom_cuda_release(C, di);
    loom_cuda_release(C, dstr);
    free(cs), free(sn), free(got), free(ref), free(inv), free(pos), free(pos32), free(str);
    return ok;
}

/* ---- gated activations -------------------------------------------------- */

static int test_act(int n, int gelu) {
    const char *k = gelu ? "gelu_tanh_mul" : "silu_mul";
    char what[96];
    snprintf(what, sizeof what, "n=%d", n);
    float *g = xmalloc((size_t)n * 4), *u = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)n * 4);
    float *got = xmalloc((size_t)n * 4);
    fill(g, (size_t)n, 8.0f);
    fill(u, (size_t)n, 2.0f);
    memcpy(ref, g, (size_t)n * 4);
    if (gelu) loom_kernels_ref.gelu_tanh_mul(ref, u, n);
    else loom_kernels_ref.silu_mul(ref, u, n);
    float *dg = up(g, (size_t)n * 4), *du = up(u, (size_t)n * 4);
    int ok = 0;
    if (!dg || !du) {
        api_fail(k, what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = gelu ? loom_cuda_gelu_tanh_mul(C, dg, du, (size_t)n)
                              : loom_cuda_silu_mul(C, dg, du, (size_t)n);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dg, (size_t)n * 4);
        if (st != LOOM_OK) api_fail(k, what, st);
        else ok = report(k, what, got, ref, NULL, (size_t)n, 1e-6f, 1e-5f);
    }
    loom_cuda_release(C, dg);
    loom_cuda_release(C, du);
    free(g), free(u), free(ref), free(got);
    return ok;
}

/* act_mul_split: the fused gate/up layout (T, 2n) against the reference
 * applied to the two halves. */
static int test_act_split(int T, int n, int gelu) {
    const char *k = gelu ? "act_split_gelu" : "act_split_silu";
    char what[96];
    snprintf(what, sizeof what, "T=%d n=%d", T, n);
    size_t N = (size_t)T * n;
    float *gu = xmalloc(2 * N * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    float *u = xmalloc((size_t)n * 4);
    fill(gu, 2 * N, 8.0f);
    for (int t = 0; t < T; t++) {
        memcpy(ref + (size_t)t * n, gu + (size_t)t * 2 * n, (size_t)n * 4);
        memcpy(u, gu + (size_t)t * 2 * n + n, (size_t)n * 4);
        if (gelu) loom_kernels_ref.gelu_tanh_mul(ref + (size_t)t * n, u, n);
        else loom_kernels_ref.silu_mul(ref + (size_t)t * n, u, n);
    }
    float *dgu = up(gu, 2 * N * 4), *dout = NULL;
    int ok = 0;
    if (!dgu || loom_cuda_alloc(C, (void **)&dout, N * 4) != LOOM_OK) {
        api_fail(k, what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_act_mul_split(C, dout, dgu, T, n, gelu);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dout, N * 4);
        if (st != LOOM_OK) api_fail(k, what, st);
        else ok = report(k, what, got, ref, NULL, N, 1e-6f, 1e-5f);
    }
    loom_cuda_release(C, dgu);
    loom_cuda_release(C, dout);
    free(gu), free(ref), free(got), free(u);
    return ok;
}

/* act_mul_ld: rows of g (T, n) gated by a slice of wider rows of u (T,
 * ld), as Gemma 4's per-layer inputs take one layer's columns; the
 * reference is applied to each row, and the columns of u beside the
 * slice must not be read into g. */
static int test_act_ld(int T, int n, int ld, int off, int gelu) {
    const char *k = gelu ? "act_ld_gelu" : "act_ld_silu";
    char what[96];
    snprintf(what, sizeof what, "T=%d n=%d ld=%d off=%d", T, n, ld, off);
    size_t N = (size_t)T * n, NU = (size_t)T * ld;
    float *g = xmalloc(N * 4), *u = xmalloc(NU * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    fill(g, N, 8.0f);
    fill(u, NU, 2.0f);
    memcpy(ref, g, N * 4);
    for (int t = 0; t < T; t++) {
        const float *ur = u + (size_t)t * ld + off;
        if (gelu) loom_kernels_ref.gelu_tanh_mul(ref + (size_t)t * n, ur, n);
        else loom_kernels_ref.silu_mul(ref + (size_t)t * n, ur, n);
    }
    float *dg = up(g, N * 4), *du = up(u, NU * 4);
    int ok = 0;
    if (!dg || !du) {
        api_fail(k, what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_act_mul_ld(C, dg, du + off, T, n, ld, gelu);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dg, N * 4);
        if (st != LOOM_OK) api_fail(k, what, st);
        else ok = report(k, what, got, ref, NULL, N, 1e-6f, 1e-5f);
    }
    loom_cuda_release(C, dg);
    loom_cuda_release(C, du);
    free(g), free(u), free(ref), free(got);
    return ok;
}

/* act_mul_ld refuses rows of u narrower than n. */
static int test_act_ld_limits(void) {
    loom_status st = loom_cuda_act_mul_ld(C, NULL, NULL, 2, 16, 8, 1);
    int ok = st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(), "narrower") != NULL;
    printf("%s  %-14s %-44s %s\n", ok ? "PASS" : "FAIL", "act_ld", "ld < n refused",
           ok ? "" : loom_last_error());
    loom_err_clear();
    ok ? n_pass++ : n_fail++;
    return ok;
}

/* scale and add_scale: x * s and (x + y) * s, each value one f32 multiply
 * (and add) as the CPU forward computes it: equal bits. */
static int test_scale(size_t n, int add) {
    const char *k = add ? "add_scale" : "scale";
    char what[96];
    float s = 0.70710678f + (float)n * 1e-7f;
    snprintf(what, sizeof what, "n=%zu s=%.9g", n, s);
    float *x = xmalloc(n * 4), *y = xmalloc(n * 4), *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
    fill(x, n, 8.0f);
    fill(y, n, 3.0f);
    for (size_t i = 0; i < n; i++) {
        volatile float v = add ? x[i] + y[i] : x[i]; /* no fused multiply-add */
        ref[i] = v * s;
    }
    float *dx = up(x, n * 4), *dy = up(y, n * 4);
    int ok = 0;
    if (!dx || !dy) {
        api_fail(k, what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = add ? loom_cuda_add_scale(C, dx, dy, n, s) : loom_cuda_scale(C, dx, n, s);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dx, n * 4);
        if (st != LOOM_OK) api_fail(k, what, st);
        else ok = report(k, what, got, ref, NULL, n, 0.0f, 0.0f);
    }
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    free(x), free(y), free(ref), free(got);
    return ok;
}

/* ---- 16-bit activations ------------------------------------------------ */

static const char *DT_NAME[] = {"f32", "f16", "bf16"};

/* Host copies of n 16-bit values as f32. */
static void from16(float *out, const uint16_t *h, size_t n, loom_cuda_dtype dt) {
    for (size_t i = 0; i < n; i++)
        out[i] = dt == LOOM_CUDA_F16 ? loom_f16_to_f32(h[i]) : loom_bf16_to_f32(h[i]);
}

static float round16(float v, loom_cuda_dtype dt) {
    return dt == LOOM_CUDA_F16 ? loom_f16_to_f32(loom_f32_to_f16(v))
                               : loom_bf16_to_f32(loom_f32_to_bf16(v));
}

/* add_rmsnorm16: x + r (exact), then the reference RMSNorm rounded to dt;
 * the GPU's sum order may move a value across a rounding boundary: one
 * unit in the last place allowed. */
static int test_add_rmsnorm16(int T, int n, int with_r, loom_cuda_dtype dt) {
    char what[96];
    snprintf(what, sizeof what, "%s T=%d n=%d add=%d", DT_NAME[dt], T, n, with_r);
    size_t N = (size_t)T * n;
    float *x = xmalloc(N * 4), *r = xmalloc(N * 4), *w = xmalloc((size_t)n * 4);
    float *ref = xmalloc(2 * N * 4), *got = xmalloc(2 * N * 4);
    uint16_t *h16 = xmalloc(N * 2);
    fill(x, N, 3.0f);
    fill(r, N, 2.0f);
    fill(w, (size_t)n, 1.0f);
    for (size_t i = 0; i < N; i++) ref[N + i] = with_r ? x[i] + r[i] : x[i];  /* new x */
    for (int t = 0; t < T; t++)
        loom_kernels_ref.rmsnorm(ref + (size_t)t * n, ref + N + (size_t)t * n, w, n, 1e-6f);
    for (size_t i = 0; i < N; i++) ref[i] = round16(ref[i], dt);
    float *dx = up(x, N * 4), *dr = up(r, N * 4), *dw = up(w, (size_t)n * 4);
    void *dy = NULL;
    int ok = 0;
    if (!dx || !dr || !dw || loom_cuda_alloc(C, &dy, N * 2) != LOOM_OK) {
        api_fail("add_rmsnorm16", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_add_rmsnorm16(C, dy, dx, with_r ? dr : NULL, dw, T, n, 1e-6f, dt);
        if (st == LOOM_OK) st = loom_cuda_download(C, h16, dy, N * 2);
        if (st == LOOM_OK) st = loom_cuda_download(C, got + N, dx, N * 4);
        if (st != LOOM_OK) {
            api_fail("add_rmsnorm16", what, st);
        } else {
            from16(got, h16, N, dt);
            float *bound = xmalloc(2 * N * 4);
            float ulp = dt == LOOM_CUDA_F16 ? 1.0f / 1024 : 1.0f / 128;
            for (size_t i = 0; i < N; i++) {
                bound[i] = ulp * fabsf(ref[i]) + 1e-6f;
                bound[N + i] = 0;  /* the sum x + r is one f32 add on both sides */
            }
            ok = report("add_rmsnorm16", what, got, ref, bound, 2 * N, 0, 0);
            free(bound);
        }
    }
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dr);
    loom_cuda_release(C, dw);
    loom_cuda_release(C, dy);
    free(x), free(r), free(w), free(ref), free(got), free(h16);
    return ok;
}

/* act_mul_split16: the f32 reference rounded to dt, one ulp allowed.
 * in16: gate/up given in bf16 (loom_cuda_act_mul_split_bf16; dt bf16), the
 * reference on the same rounded values. */
static int test_act_split16_in(int T, int n, int gelu, loom_cuda_dtype dt, int in16) {
    char what[96];
    snprintf(what, sizeof what, "%s T=%d n=%d %s%s", DT_NAME[dt], T, n, gelu ? "gelu" : "silu",
             in16 ? " bf16 in" : "");
    size_t N = (size_t)T * n;
    float *gu = xmalloc(2 * N * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    float *u = xmalloc((size_t)n * 4), *bound = xmalloc(N * 4);
    uint16_t *h16 = xmalloc(N * 2), *gu16 = xmalloc(2 * N * 2);
    fill(gu, 2 * N, 8.0f);
    for (size_t i = 0; in16 && i < 2 * N; i++) {
        gu16[i] = loom_f32_to_bf16(gu[i]);
        gu[i] = loom_bf16_to_f32(gu16[i]);
    }
    for (int t = 0; t < T; t++) {
        memcpy(ref + (size_t)t * n, gu + (size_t)t * 2 * n, (size_t)n * 4);
        memcpy(u, gu + (size_t)t * 2 * n + n, (size_t)n * 4);
        if (gelu) loom_kernels_ref.gelu_tanh_mul(ref + (size_t)t * n, u, n);
        else loom_kernels_ref.silu_mul(ref + (size_t)t * n, u, n);
    }
    float ulp = dt == LOOM_CUDA_F16 ? 1.0f / 1024 : 1.0f / 128;
    for (size_t i = 0; i < N; i++) {
        bound[i] = ulp * fabsf(ref[i]) + 1e-5f * (1 + fabsf(ref[i]));
        ref[i] = round16(ref[i], dt);
    }
    float *dgu = in16 ? up(gu16, 2 * N * 2) : up(gu, 2 * N * 4);
    void *dout = NULL;
    int ok = 0;
    if (!dgu || loom_cuda_alloc(C, &dout, N * 2) != LOOM_OK) {
        api_fail("act_split16", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = in16 ? loom_cuda_act_mul_split_bf16(C, dout, dgu, T, n, gelu)
                              : loom_cuda_act_mul_split16(C, dout, dgu, T, n, gelu, dt);
        if (st == LOOM_OK) st = loom_cuda_download(C, h16, dout, N * 2);
        if (st != LOOM_OK) {
            api_fail("act_split16", what, st);
        } else {
            from16(got, h16, N, dt);
            ok = report("act_split16", what, got, ref, bound, N, 0, 0);
        }
    }
    loom_cuda_release(C, dgu);
    loom_cuda_release(C, dout);
    free(gu), free(ref), free(got), free(u), free(bound), free(h16), free(gu16);
    return ok;
}

static int test_act_split16(int T, int n, int gelu, loom_cuda_dtype dt) {
    return test_act_split16_in(T, n, gelu, dt, 0);
}

/* ---- embedding ---------------------------------------------------------- */


/* Random table of dtype dt (vocab, cols) and its f32 values. */
static void *rand_table(loom_cuda_dtype dt, size_t n, float scale, float *as_f32) {
    if (dt == LOOM_CUDA_F32) {
        float *t = xmalloc(n * 4);
        fill(t, n, scale);
        memcpy(as_f32, t, n * 4);
        return t;
    }
    uint16_t *t = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        float v = rnd() * scale;
        t[i] = dt == LOOM_CUDA_F16 ? loom_f32_to_f16(v) : loom_f32_to_bf16(v);
        as_f32[i] = dt == LOOM_CUDA_F16 ? loom_f16_to_f32(t[i]) : loom_bf16_to_f32(t[i]);
    }
    return t;
}

static int test_embed(int cols, loom_cuda_dtype dt) {
    char what[96];
    int V = 37, T = 6;
    float scale = cols % 2 ? 1.0f : 5.5f;
    snprintf(what, sizeof what, "%s cols=%d T=%d scale=%g", DT_NAME[dt], cols, T, scale);
    size_t N = (size_t)V * cols;
    float *tf = xmalloc(N * 4), *ref = xmalloc((size_t)T * cols * 4), *got = xmalloc((size_t)T * cols * 4);
    void *tab = rand_table(dt, N, 3.0f, tf);
    int32_t ids[6];
    for (int t = 0; t < T; t++) ids[t] = t == 0 ? V - 1 : (int32_t)(test_rand_u32(&rng) % V);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cols; i++) ref[(size_t)t * cols + i] = tf[(size_t)ids[t] * cols + i] * scale;
    void *dtab = up(tab, N * (dt == LOOM_CUDA_F32 ? 4 : 2));
    int32_t *dids = up(ids, sizeof ids);
    float *dout = NULL;
    int ok = 0;
    if (!dtab || !dids || loom_cuda_alloc(C, (void **)&dout, (size_t)T * cols * 4) != LOOM_OK) {
        api_fail("embed", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_embed(C, dout, dtab, dt, cols, dids, T, scale);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dout, (size_t)T * cols * 4);
        if (st != LOOM_OK) api_fail("embed", what, st);
        else ok = report("embed", what, got, ref, NULL, (size_t)T * cols, 0, 0);
    }
    loom_cuda_release(C, dtab);
    loom_cuda_release(C, dids);
    loom_cuda_release(C, dout);
    free(tf), free(ref), free(got), free(tab);
    return ok;
}

/* ---- softmax and argmax ------------------------------------------------- */

static int test_softmax(int n, int T) {
    char what[96];
    snprintf(what, sizeof what, "T=%d n=%d", T, n);
    size_t N = (size_t)T * n;
    float *x = xmalloc(N * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    fill(x, N, 12.0f);
    if (n > 3) x[2] = -INFINITY;  /* a masked entry */
    memcpy(ref, x, N * 4);
    for (int t = 0; t < T; t++) loom_kernels_ref.softmax(ref + (size_t)t * n, n);
    float *dx = up(x, N * 4);
    int ok = 0;
    if (!dx) {
        api_fail("softmax", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_softmax(C, dx, T, n);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dx, N * 4);
        if (st != LOOM_OK) api_fail("softmax", what, st);
        else ok = report("softmax", what, got, ref, NULL, N, 1e-7f, 2e-5f);
    }
    loom_cuda_release(C, dx);
    free(x), free(ref), free(got);
    return ok;
}

static int test_argmax(int n, int T) {
    char what[96];
    snprintf(what, sizeof what, "T=%d n=%d (with ties)", T, n);
    size_t N = (size_t)T * n;
    float *x = xmalloc(N * 4), *ref = xmalloc((size_t)T * 4), *got = xmalloc((size_t)T * 4);
    int32_t *gi = xmalloc((size_t)T * 4);
    fill(x, N, 4.0f);
    for (int t = 0; t < T; t++) {
        float *r = x + (size_t)t * n;
        if (n > 2 && t % 2) {  /* the maximum twice: the first must win */
            int a = (int)(test_rand_u32(&rng) % n), b = (int)(test_rand_u32(&rng) % n);
            r[a] = r[b] = 9.0f;
        }
        if (t == 2) for (int i = 0; i < n; i++) r[i] = -1.0f;  /* all equal: index 0 */
        ref[t] = (float)loom_argmax(r, n);
    }
    float *dx = up(x, N * 4);
    int32_t *dout = NULL;
    int ok = 0;
    if (!dx || loom_cuda_alloc(C, (void **)&dout, (size_t)T * 4) != LOOM_OK) {
        api_fail("argmax", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_argmax(C, dout, dx, T, n);
        if (st == LOOM_OK) st = loom_cuda_download(C, gi, dout, (size_t)T * 4);
        if (st != LOOM_OK) {
            api_fail("argmax", what, st);
        } else {
            for (int t = 0; t < T; t++) got[t] = (float)gi[t];
            ok = report("argmax", what, got, ref, NULL, (size_t)T, 0, 0);
        }
    }
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dout);
    free(x), free(ref), free(got), free(gi);
    return ok;
}

/* ---- dense GEMM --------------------------------------------------------- */

static int test_gemm(loom_cuda_dtype dt, int T, int rows, int cols) {
    char what[96];
    snprintf(what, sizeof what, "%s T=%d rows=%d cols=%d", DT_NAME[dt], T, rows, cols);
    size_t NW = (size_t)rows * cols, NX = (size_t)T * cols, NY = (size_t)T * rows;
    float *wf = xmalloc(NW * 4), *x = xmalloc(NX * 4), *ref = xmalloc(NY * 4);
    float *got = xmalloc(NY * 4), *bound = xmalloc(NY * 4);
    void *w = rand_table(dt, NW, 0.5f, wf);
    fill(x, NX, 2.0f);
    if (dt == LOOM_CUDA_F32) loom_kernels_ref.matmul_f32(ref, rows, x, cols, w, cols, T, 0, rows);
    else if (dt == LOOM_CUDA_F16) loom_kernels_ref.matmul_f16(ref, rows, x, cols, w, cols, T, 0, rows);
    else loom_kernels_ref.matmul_bf16(ref, rows, x, cols, w, cols, T, 0, rows);
    /* x is rounded to the weight's type on the GPU: relative error 2^-11
     * (f16) or 2^-8 (bf16) per product, plus f32 summation in any order. */
    float rel = dt == LOOM_CUDA_F32 ? 5e-5f : dt == LOOM_CUDA_F16 ? 1.5e-3f : 6e-3f;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int k = 0; k < cols; k++)
                s += fabs((double)x[(size_t)t * cols + k] * wf[(size_t)r * cols + k]);
            bound[(size_t)t * rows + r] = (float)(rel * s + 1e-6);
        }
    void *dw = up(w, NW * (dt == LOOM_CUDA_F32 ? 4 : 2));
    float *dx = up(x, NX * 4), *dy = NULL;
    int ok = 0;
    if (!dw || !dx || loom_cuda_alloc(C, (void **)&dy, NY * 4) != LOOM_OK) {
        api_fail("gemm", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_gemm(C, dy, dx, dw, dt, T, rows, cols);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dy, NY * 4);
        if (st != LOOM_OK) api_fail("gemm", what, st);
        else ok = report("gemm", what, got, ref, bound, NY, 0, 0);
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    free(wf), free(x), free(ref), free(got), free(bound), free(w);
    return ok;
}

/* ---- skinny GEMM (GEMV) for a few tokens -------------------------------- */

static const char *GV_MODE[] = {"x16", "f32", "rmsnorm", "silu", "gelu"};

/* loom_cuda_gemv: the input rows made on the host as the mode says (the
 * reference RMSNorm / gated activation, rounded to dt), then the reference
 * matmul over them, + bias, + the old y when accumulating. The GPU sums in
 * another order (2e-5 of sum |x w|), and a computed input may land on the
 * other side of a 16-bit rounding boundary (its own norm sum, expf): two
 * such elements allowed. The output is poisoned (NaN) first so that every
 * element must be written. */
static int test_gemv(loom_cuda_dtype dt, int T, int rows, int cols, loom_cuda_gemv_mode mode,
                     int bias, int acc) {
    char what[96];
    snprintf(what, sizeof what, "%s %s T=%d rows=%d cols=%d%s%s", DT_NAME[dt], GV_MODE[mode], T,
             rows, cols, bias ? " +bias" : "", acc ? " +=" : "");
    size_t NW = (size_t)rows * cols, NX = (size_t)T * cols, NY = (size_t)T * rows;
    size_t nin = mode >= LOOM_CUDA_GEMV_SILU ? 2 * NX : NX;
    float *wf = xmalloc(NW * 4), *xin = xmalloc(nin * 4), *xr = xmalloc(NX * 4);
    float *nw = xmalloc((size_t)cols * 4), *b = xmalloc((size_t)rows * 4), *y0 = xmalloc(NY * 4);
    float *ref = xmalloc(NY * 4), *got = xmalloc(NY * 4), *bound = xmalloc(NY * 4);
    uint16_t *x16 = xmalloc(NX * 2);
    void *w = rand_table(dt, NW, 0.5f, wf);
    fill(xin, nin, mode >= LOOM_CUDA_GEMV_SILU ? 8.0f : 2.0f);
    fill(nw, (size_t)cols, 1.0f);
    fill(b, (size_t)rows, 1.0f);
    fill(y0, NY, 3.0f);
    for (int t = 0; t < T; t++) {
        float *r = xr + (size_t)t * cols;
        if (mode == LOOM_CUDA_GEMV_RMSNORM) {
            loom_kernels_ref.rmsnorm(r, xin + (size_t)t * cols, nw, cols, 1e-6f);
        } else if (mode >= LOOM_CUDA_GEMV_SILU) {
            memcpy(r, xin + (size_t)t * 2 * cols, (size_t)cols * 4);
            if (mode == LOOM_CUDA_GEMV_GELU)
                loom_kernels_ref.gelu_tanh_mul(r, xin + (size_t)t * 2 * cols + cols, cols);
            else
                loom_kernels_ref.silu_mul(r, xin + (size_t)t * 2 * cols + cols, cols);
        } else {
            memcpy(r, xin + (size_t)t * cols, (size_t)cols * 4);
        }
    }
    for (size_t i = 0; i < NX; i++) {
        x16[i] = dt == LOOM_CUDA_F16 ? loom_f32_to_f16(xr[i]) : loom_f32_to_bf16(xr[i]);
        xr[i] = dt == LOOM_CUDA_F16 ? loom_f16_to_f32(x16[i]) : loom_bf16_to_f32(x16[i]);
    }
    if (dt == LOOM_CUDA_F16) loom_kernels_ref.matmul_f16(ref, rows, xr, cols, w, cols, T, 0, rows);
    else loom_kernels_ref.matmul_bf16(ref, rows, xr, cols, w, cols, T, 0, rows);
    float ulp = dt == LOOM_CUDA_F16 ? 1.0f / 1024 : 1.0f / 128;
    int computed = mode == LOOM_CUDA_GEMV_RMSNORM || mode >= LOOM_CUDA_GEMV_SILU;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double sa = 0, mx = 0;
            for (int k = 0; k < cols; k++) {
                double p = fabs((double)xr[(size_t)t * cols + k] * wf[(size_t)r * cols + k]);
                sa += p;
                mx = p > mx ? p : mx;
            }
            size_t i = (size_t)t * rows + r;
            if (bias) ref[i] += b[r];
            if (acc) ref[i] += y0[i];
            bound[i] = (float)(2e-5 * sa + (computed ? 2 * ulp * mx : 0) + 1e-6 +
                               (acc ? 1e-7 * fabs(ref[i]) : 0));
        }
    if (!acc)
        for (size_t i = 0; i < NY; i++) y0[i] = NAN;
    void *dw = up(w, NW * 2);
    float *dx = mode == LOOM_CUDA_GEMV_X16 ? NULL : up(xin, nin * 4);
    void *dx16 = mode == LOOM_CUDA_GEMV_X16 ? up(x16, NX * 2) : NULL;
    float *dn = up(nw, (size_t)cols * 4), *db = up(b, (size_t)rows * 4), *dy = up(y0, NY * 4);
    int ok = 1;
    if (!dw || (!dx && !dx16) || !dn || !db || !dy) {
        ok = api_fail("gemv", what, LOOM_ERR_NOMEM);
    } else {
        /* both kernels: f32 FMAs and tensor cores; for 1-2 tokens also the
         * other variants of the first */
        for (int v = 0; v < 2 + (T <= 2 ? GV_VARIANTS : 0); v++) {
            loom_cuda *cx = v == 0 ? C_fma : v == 1 ? C_mma : C_gv[v - 2];
            char w2[128];
            snprintf(w2, sizeof w2, "%s %s", v == 0 ? "fma" : v == 1 ? "mma" : GV_VAR[v - 2][0],
                     what);
            loom_cuda_gemv_in in = {mode, dx16 ? dx16 : (const void *)dx, dn, 1e-6f};
            loom_status st = loom_cuda_upload(cx, dy, y0, NY * 4);  /* poisoned or old y */
            if (st == LOOM_OK)
                st = loom_cuda_gemv(cx, dy, &in, dw, dt, T, rows, cols, bias ? db : NULL, acc);
            if (st == LOOM_OK) st = loom_cuda_download(cx, got, dy, NY * 4);
            if (st != LOOM_OK) ok &= api_fail("gemv", w2, st);
            else ok &= report("gemv", w2, got, ref, bound, NY, 0, 0);
        }
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dx16);
    loom_cuda_release(C, dn);
    loom_cuda_release(C, db);
    loom_cuda_release(C, dy);
    free(wf), free(xin), free(xr), free(nw), free(b), free(y0), free(ref), free(got), free(bound);
    free(x16), free(w);
    return ok;
}

/* loom_cuda_gemv_argmax: the picks must be the argmax (first of the
 * largest) of the outputs the same call wrote, under the default and each
 * GEMV variant (those with column slices take loom_cuda_argmax after the
 * kernel). dup: the second half of the rows repeats the first, so the
 * largest value comes twice and the lower row must win; nan: one output
 * row is NaN (a NaN weight), which never wins. Each run starts from
 * picks set to -1. */
static int test_gemv_argmax(loom_cuda_dtype dt, int T, int rows, int cols,
                            loom_cuda_gemv_mode mode, int dup, int nan) {
    char what[128];
    snprintf(what, sizeof what, "%s %s T=%d rows=%d cols=%d%s%s", DT_NAME[dt], GV_MODE[mode], T,
             rows, cols, dup ? " dup" : "", nan ? " nan" : "");
    size_t NW = (size_t)rows * cols, NX = (size_t)T * cols, NY = (size_t)T * rows;
    float *wf = xmalloc(NW * 4), *xin = xmalloc(NX * 4), *nw = xmalloc((size_t)cols * 4);
    float *got = xmalloc(NY * 4);
    uint16_t *w = rand_table(dt, NW, 0.5f, wf);
    if (dup)
        memcpy(w + (size_t)(rows - rows / 2) * cols, w, (size_t)(rows / 2) * cols * 2);
    if (nan) w[(size_t)(rows / 3) * cols] = dt == LOOM_CUDA_F16 ? 0x7e00 : 0x7fc0;
    fill(xin, NX, 2.0f);
    fill(nw, (size_t)cols, 1.0f);
    uint16_t *x16 = xmalloc(NX * 2);
    for (size_t i = 0; i < NX; i++)
        x16[i] = dt == LOOM_CUDA_F16 ? loom_f32_to_f16(xin[i]) : loom_f32_to_bf16(xin[i]);
    void *dw = up(w, NW * 2);
    void *dx = mode == LOOM_CUDA_GEMV_X16 ? up(x16, NX * 2) : up(xin, NX * 4);
    float *dn = up(nw, (size_t)cols * 4), *dy = NULL;
    int32_t *dids = NULL, ids[8], init[8];
    for (int t = 0; t < 8; t++) init[t] = -1;
    int ok = 1;
    if (!dw || !dx || !dn || loom_cuda_alloc(C, (void **)&dy, NY * 4) != LOOM_OK ||
        loom_cuda_alloc(C, (void **)&dids, 8 * 4) != LOOM_OK) {
        ok = api_fail("gemv_argmax", what, LOOM_ERR_NOMEM);
    } else {
        for (int v = 0; v <= GV_VARIANTS; v++) {
            loom_cuda *cx = v == 0 ? C : C_gv[v - 1];
            char w2[160];
            snprintf(w2, sizeof w2, "%s %s", v == 0 ? "default" : GV_VAR[v - 1][0], what);
            loom_cuda_gemv_in in = {mode, dx, dn, 1e-6f};
            /* twice, the picks cleared before each: a tally not left at zero
             * finds no last block the second time and writes no picks */
            loom_status st = LOOM_OK;
            for (int rep = 0; rep < 2 && st == LOOM_OK; rep++) {
                st = loom_cuda_upload(cx, dids, init, 8 * 4);
                if (st == LOOM_OK)
                    st = loom_cuda_gemv_argmax(cx, dy, &in, dw, dt, T, rows, cols, NULL, 0, dids);
            }
            if (st == LOOM_OK) st = loom_cuda_download(cx, got, dy, NY * 4);
            if (st == LOOM_OK) st = loom_cuda_download(cx, ids, dids, (size_t)T * 4);
            if (st != LOOM_OK) {
                ok &= api_fail("gemv_argmax", w2, st);
                continue;
            }
            int bad = 0, ties = 0;
            for (int t = 0; t < T; t++) {
                const float *y = got + (size_t)t * rows;
                int want = -1;
                for (int r = 0; r < rows; r++)
                    if (y[r] == y[r] && (want < 0 || y[r] > y[want])) want = r;
                if (want < 0) want = 0;
                for (int r = want + 1; r < rows; r++) ties += y[r] == y[want];
                if (ids[t] != want) {
                    bad = 1;
                    printf("  token %d: pick %d (%.9g), want %d (%.9g)\n", t, ids[t],
                           ids[t] >= 0 && ids[t] < rows ? y[ids[t]] : 0.0, want, y[want]);
                }
            }
            printf("%s  %-14s %-44s ties past the pick %d\n", bad ? "FAIL" : "PASS", "gemv_argmax",
                   w2, ties);
            if (bad) n_fail++, ok = 0;
            else n_pass++;
        }
    }
    void *dev[] = {dw, dx, dn, dy, dids};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) loom_cuda_release(C, dev[i]);
    free(wf), free(xin), free(nw), free(got), free(w), free(x16);
    return ok;
}

/* What loom_cuda_gemv refuses: widths not a multiple of 8, f32 weights,
 * more tokens than its shared memory holds. */
static int test_gemv_limits(void) {
    int ok = loom_cuda_gemv_max_tokens(C, LOOM_CUDA_BF16, 13) == 0 &&
             loom_cuda_gemv_max_tokens(C, LOOM_CUDA_F32, 1024) == 0 &&
             loom_cuda_gemv_max_tokens(C, LOOM_CUDA_F16, 4096) == 8 &&
             loom_cuda_gemv_max_tokens(C, LOOM_CUDA_BF16, 14336) >= 1;
    loom_cuda_gemv_in in = {LOOM_CUDA_GEMV_F32, NULL, NULL, 0};
    ok &= loom_cuda_gemv(C, NULL, &in, NULL, LOOM_CUDA_BF16, 1, 5, 13, NULL, 0) ==
          LOOM_ERR_UNSUPPORTED;
    ok &= loom_cuda_gemv(C, NULL, &in, NULL, LOOM_CUDA_BF16, 9, 5, 16, NULL, 0) ==
          LOOM_ERR_UNSUPPORTED;
    printf("%s  %-14s %s\n", ok ? "PASS" : "FAIL", "gemv", "limits (odd width, f32, 9 tokens)");
    if (ok) n_pass++;
    else n_fail++;
    return ok;
}

/* ---- MLX affine-quantized GEMV ------------------------------------------ */

/* gemm16: x made 16-bit beforehand; the reference takes the same rounded
 * values, so only the summation order differs. */
/* out16: loom_cuda_gemm16_bf16out (bf16 only), the reference rounded. */
static int test_gemm16_out(loom_cuda_dtype dt, int T, int rows, int cols, int out16) {
    char what[96];
    snprintf(what, sizeof what, "%s T=%d rows=%d cols=%d%s", DT_NAME[dt], T, rows, cols,
             out16 ? " bf16 out" : "");
    size_t NW = (size_t)rows * cols, NX = (size_t)T * cols, NY = (size_t)T * rows;
    float *wf = xmalloc(NW * 4), *x = xmalloc(NX * 4), *ref = xmalloc(NY * 4);
    float *got = xmalloc(NY * 4), *bound = xmalloc(NY * 4);
    uint16_t *x16 = xmalloc(NX * 2);
    void *w = rand_table(dt, NW, 0.5f, wf);
    fill(x, NX, 2.0f);
    for (size_t i = 0; i < NX; i++) {
        x16[i] = dt == LOOM_CUDA_F16 ? loom_f32_to_f16(x[i]) : loom_f32_to_bf16(x[i]);
        x[i] = dt == LOOM_CUDA_F16 ? loom_f16_to_f32(x16[i]) : loom_bf16_to_f32(x16[i]);
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double acc = 0, sa = 0;
            for (int k = 0; k < cols; k++) {
                double p = (double)x[(size_t)t * cols + k] * wf[(size_t)r * cols + k];
                acc += p;
                sa += fabs(p);
            }
            ref[(size_t)t * rows + r] = out16 ? round16((float)acc, LOOM_CUDA_BF16) : (float)acc;
            /* bf16 out: one ulp (the f32 sum may sit across a rounding
             * boundary from the exact one) */
            bound[(size_t)t * rows + r] =
                (float)(2e-5 * sa + 1e-6 + (out16 ? fabs(acc) / 128 : 0));
        }
    void *dw = up(w, NW * 2), *dx = up(x16, NX * 2);
    float *dy = NULL;
    int ok = 0;
    if (!dw || !dx || loom_cuda_alloc(C, (void **)&dy, NY * 4) != LOOM_OK) {
        api_fail("gemm16", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = out16 ? loom_cuda_gemm16_bf16out(C, dy, dx, dw, T, rows, cols)
                               : loom_cuda_gemm16(C, dy, dx, dw, dt, T, rows, cols);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dy, NY * 4);
        if (st == LOOM_OK && out16) {
            uint16_t *h = xmalloc(NY * 2);
            memcpy(h, got, NY * 2);
            from16(got, h, NY, LOOM_CUDA_BF16);
            free(h);
        }
        if (st != LOOM_OK) api_fail("gemm16", what, st);
        else ok = report("gemm16", what, got, ref, bound, NY, 0, 0);
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    free(wf), free(x), free(ref), free(got), free(bound), free(w), free(x16);
    return ok;
}

static int test_gemm16(loom_cuda_dtype dt, int T, int rows, int cols) {
    return test_gemm16_out(dt, T, rows, cols, 0);
}

static int test_matmul_q(int bits, int group, int f16, int T, int rows, int cols) {
    char what[96];
    snprintf(what, sizeof what, "bits=%d group=%d %s T=%d rows=%d cols=%d", bits, group,
             f16 ? "f16" : "bf16", T, rows, cols);
    size_t words = (size_t)cols * bits / 32, ng = (size_t)cols / group;
    uint32_t *w = xmalloc((size_t)rows * words * 4);
    uint16_t *sc = xmalloc((size_t)rows * ng * 2), *bi = xmalloc((size_t)rows * ng * 2);
    float *x = xmalloc((size_t)T * cols * 4), *ref = xmalloc((size_t)T * rows * 4);
    float *got = xmalloc((size_t)T * rows * 4), *bound = xmalloc((size_t)T * rows * 4);
    for (size_t i = 0; i < (size_t)rows * words; i++) w[i] = test_rand_u32(&rng);
    for (size_t i = 0; i < (size_t)rows * ng; i++) {
        float s = rnd() * 0.05f, b = rnd() * 0.3f;
        sc[i] = f16 ? loom_f32_to_f16(s) : loom_f32_to_bf16(s);
        bi[i] = f16 ? loom_f32_to_f16(b) : loom_f32_to_bf16(b);
    }
    fill(x, (size_t)T * cols, 2.0f);
    loom_qmat q = {w, sc, bi, cols, bits, group, f16, 0};  /* plain row layout */
    loom_kernels_ref.matmul_q(ref, rows, x, cols, &q, T, 0, rows);
    float qmax = (float)((1u << bits) - 1);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (size_t g = 0; g < ng; g++) {
                size_t si = (size_t)r * ng + g;
                double a = f16 ? loom_f16_to_f32(sc[si]) : loom_bf16_to_f32(sc[si]);
                double b = f16 ? loom_f16_to_f32(bi[si]) : loom_bf16_to_f32(bi[si]);
                double xs = 0;
                for (int k = 0; k < group; k++) xs += fabs(x[(size_t)t * cols + g * group + k]);
                s += xs * (fabs(a) * qmax + fabs(b));
            }
            bound[(size_t)t * rows + r] = (float)(2e-5 * s + 1e-6);
        }
    uint32_t *dw = up(w, (size_t)rows * words * 4);
    uint16_t *dsc = up(sc, (size_t)rows * ng * 2), *dbi = up(bi, (size_t)rows * ng * 2);
    float *dx = up(x, (size_t)T * cols * 4), *dy = NULL;
    int ok = 0;
    if (!dw || !dsc || !dbi || !dx || loom_cuda_alloc(C, (void **)&dy, (size_t)T * rows * 4) != LOOM_OK) {
        api_fail("matmul_q", what, LOOM_ERR_NOMEM);
    } else {
        loom_cuda_qmat dq = {dw, dsc, dbi, rows, cols, bits, group, f16};
        loom_status st = loom_cuda_matmul_q(C, dy, dx, &dq, T);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dy, (size_t)T * rows * 4);
        if (st != LOOM_OK) api_fail("matmul_q", what, st);
        else ok = report("matmul_q", what, got, ref, bound, (size_t)T * rows, 0, 0);
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, dsc);
    loom_cuda_release(C, dbi);
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    free(w), free(sc), free(bi), free(x), free(ref), free(got), free(bound);
    return ok;
}

/* ---- FP8 (e4m3 with block scales) --------------------------------------- */

enum { F8_GEMV, F8_GEMM, F8_AUTO, F8_GEMM32 };
static const char *F8_NAME[] = {"f8_gemv", "f8_gemm", "matmul_f8", "f8_gemm f32"};

/* Random codes over the whole range (no NaN), positive scales of varied
 * size, against ops_ref's matmul_f8. The GEMV sums in f32 (2e-5 of the
 * sum of |terms|), and so does the GEMM in f32; in bf16 it rounds the
 * dequantized weights and x (6e-3, as test_gemm's bf16 bound). */
static int test_f8(int which, int T, int rows, int cols, int br, int bc) {
    char what[96];
    snprintf(what, sizeof what, "T=%d rows=%d cols=%d blocks %dx%d", T, rows, cols, br, bc);
    int sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    size_t NW = (size_t)rows * cols, NX = (size_t)T * cols, NY = (size_t)T * rows;
    uint8_t *w = xmalloc(NW);
    float *s = xmalloc((size_t)sr * sc * 4), *x = xmalloc(NX * 4), *ref = xmalloc(NY * 4);
    float *got = xmalloc(NY * 4), *bound = xmalloc(NY * 4);
    for (size_t i = 0; i < NW; i++) {
        unsigned b;
        do b = test_rand_u32(&rng) & 0xff; while ((b & 0x7f) == 0x7f);
        w[i] = (uint8_t)b;
    }
    for (int i = 0; i < sr * sc; i++) s[i] = ldexpf(1.0f + 0.5f * rnd(), -10 + i % 6);
    fill(x, NX, 2.0f);
    loom_f8mat q = {w, s, cols, br, bc};
    loom_kernels_ref.matmul_f8(ref, rows, x, cols, &q, T, 0, rows);
    int gemm = which == F8_GEMM || (which == F8_AUTO && T > LOOM_CUDA_F8_GEMV_T);
    double rel = gemm ? 6e-3 : which == F8_GEMM32 ? 5e-5 : 2e-5;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double a = 0;
            for (int k = 0; k < cols; k++)
                a += fabs((double)x[(size_t)t * cols + k] * loom_e4m3_to_f32(w[(size_t)r * cols + k]) *
                          s[(r / br) * sc + k / bc]);
            bound[(size_t)t * rows + r] = (float)(rel * a + 1e-6);
        }
    uint8_t *dw = up(w, NW);
    float *ds = up(s, (size_t)sr * sc * 4), *dx = up(x, NX * 4), *dy = NULL;
    int ok = 0;
    if (!dw || !ds || !dx || loom_cuda_alloc(C, (void **)&dy, NY * 4) != LOOM_OK) {
        api_fail(F8_NAME[which], what, LOOM_ERR_NOMEM);
    } else {
        loom_cuda_f8mat dm = {dw, ds, rows, cols, br, bc};
        loom_status st = which == F8_GEMV   ? loom_cuda_f8_gemv(C, dy, dx, &dm, T)
                         : which == F8_AUTO ? loom_cuda_matmul_f8(C, dy, dx, &dm, T, 0)
                                            : loom_cuda_f8_gemm(C, dy, dx, &dm, T, which == F8_GEMM32);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dy, NY * 4);
        if (st != LOOM_OK) api_fail(F8_NAME[which], what, st);
        else ok = report(F8_NAME[which], what, got, ref, bound, NY, 0, 0);
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, ds);
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    free(w), free(s), free(x), free(ref), free(got), free(bound);
    return ok;
}

/* Every code once (a column each, x one-hot per token): NaN codes stay
 * NaN and every other value is exact, through both kernels. */
static int test_f8_codes(int which) {
    int rows = 256, cols = 16, T = 2;
    uint8_t *w = xmalloc((size_t)rows * cols);
    float s = 0.375f, x[32] = {0}, got[2 * 256], ref[2 * 256];
    memset(w, 0, (size_t)rows * cols);
    for (int i = 0; i < rows; i++) w[i * cols] = (uint8_t)i;
    x[0] = 1, x[cols] = 1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < rows; i++) ref[t * rows + i] = loom_e4m3_to_f32((uint8_t)i) * s;
    uint8_t *dw = up(w, (size_t)rows * cols);
    float *ds = up(&s, 4), *dx = up(x, sizeof x), *dy = NULL;
    int ok = 0;
    if (!dw || !ds || !dx || loom_cuda_alloc(C, (void **)&dy, sizeof got) != LOOM_OK) {
        api_fail(F8_NAME[which], "every code", LOOM_ERR_NOMEM);
    } else {
        loom_cuda_f8mat dm = {dw, ds, rows, cols, rows, cols};
        loom_status st = which == F8_GEMV ? loom_cuda_f8_gemv(C, dy, dx, &dm, T)
                                          : loom_cuda_f8_gemm(C, dy, dx, &dm, T, which == F8_GEMM32);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dy, sizeof got);
        /* bf16 holds every e4m3 value times 0.375 (5 significant bits) exactly */
        if (st != LOOM_OK) api_fail(F8_NAME[which], "every code", st);
        else ok = report(F8_NAME[which], "every code (NaN stays NaN)", got, ref, NULL, 2 * 256, 0, 0);
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, ds);
    loom_cuda_release(C, dx);
    loom_cuda_release(C, dy);
    free(w);
    return ok;
}

/* ---- paged attention ---------------------------------------------------- */

typedef struct attn_case {
    int nh, nkv, hd, bs;
    loom_kv_type kv_type;
    int window;
    float softcap;
} attn_case;

/* A host pool of 2 layers holding n_seqs sequences of lens[s] positions in
 * shuffled blocks (random K/V written through the row codec), and each
 * sequence's block table. Layer 1 is the one tested. */
typedef struct paged {
    loom_kv_pool *pool;
    loom_kv_seq *seqs;
    int32_t *tables;   /* (n_seqs, tstride) */
    int tstride, n_seqs;
} paged;

static int paged_make(paged *P, const attn_case *a, const int *lens, int n_seqs) {
    memset(P, 0, sizeof *P);
    int kv_dim = a->nkv * a->hd, total = 0, maxb = 1;
    for (int s = 0; s < n_seqs; s++) {
        int nb = (lens[s] + a->bs - 1) / a->bs;
        total += nb;
        maxb = LOOM_MAX(maxb, nb);
    }
    int n_blocks = total + 5;  /* a few never used */
    if (loom_kv_pool_create(2, kv_dim, a->bs, n_blocks, a->kv_type, &P->pool) != LOOM_OK) return 0;
    int *perm = xmalloc((size_t)n_blocks * sizeof(int));
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(test_rand_u32(&rng) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    P->n_seqs = n_seqs;
    P->tstride = maxb + 1;
    P->seqs = calloc((size_t)n_seqs, sizeof *P->seqs);
    P->tables = xmalloc((size_t)n_seqs * P->tstride * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)n_seqs * P->tstride; i++) P->tables[i] = -1;
    float *row = xmalloc((size_t)kv_dim * 4);
    for (int s = 0, next = 0; s < n_seqs; s++) {
        loom_kv_seq *q = &P->seqs[s];
        q->n_blocks = (lens[s] + a->bs - 1) / a->bs;
        q->blocks = xmalloc((size_t)LOOM_MAX(q->n_blocks, 1) * sizeof(int));
        for (int b = 0; b < q->n_blocks; b++) {
            q->blocks[b] = perm[next++];
            P->tables[(size_t)s * P->tstride + b] = q->blocks[b];
        }
        q->n_tokens = lens[s];
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < lens[s]; p++) {
                fill(row, (size_t)kv_dim, 2.0f);
                loom_kv_store_row(&P->pool->lay, loom_kv_k_row(&P->pool->lay, q, l, p), row, kv_dim);
                fill(row, (size_t)kv_dim, 1.0f);
                loom_kv_store_row(&P->pool->lay, loom_kv_v_row(&P->pool->lay, q, l, p), row, kv_dim);
            }
    }
    free(row);
    free(perm);
    return 1;
}

static void paged_free(paged *P) {
    for (int s = 0; s < P->n_seqs && P->seqs; s++) free(P->seqs[s].blocks);
    free(P->seqs);
    free(P->tables);
    loom_kv_pool_free(P->pool);
}

/* Straightforward attention for one query token at position pos of
 * sequence seq (all heads), in double, reading rows as the CPU does. */
/* Keys [lo, hi] of sequence s (lo from the window, hi the query's own
 * position; a bidirectional span widens both to its ends first, last). */
static void attn_ref_span(const paged *P, const attn_case *a, int s, const float *q, int pos,
                          int first, int last, float scale, float *out) {
    const loom_kv_layout *p = &P->pool->lay;
    int group = a->nh / a->nkv, lo = a->window > 0 ? LOOM_MAX(0, pos - a->window + 1) : 0;
    lo = LOOM_MIN(lo, first);
    int n = LOOM_MAX(pos, last) - lo + 1;
    double *w = xmalloc((size_t)n * sizeof(double));
    float *tmp = xmalloc((size_t)a->hd * 4);
    for (int h = 0; h < a->nh; h++) {
        int kh = h / group;
        double m = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) {
            const float *k = loom_kv_load(p, loom_kv_k_row(p, &P->seqs[s], 1, lo + i), kh * a->hd,
                                          a->hd, tmp);
            double d = 0;
            for (int e = 0; e < a->hd; e++) d += (double)q[h * a->hd + e] * k[e];
            d *= scale;
            if (a->softcap > 0) d = tanh(d / a->softcap) * a->softcap;
            w[i] = d;
            if (d > m) m = d;
        }
        for (int i = 0; i < n; i++) sum += (w[i] = exp(w[i] - m));
        for (int e = 0; e < a->hd; e++) out[h * a->hd + e] = 0;
        double *o = xmalloc((size_t)a->hd * sizeof(double));
        for (int e = 0; e < a->hd; e++) o[e] = 0;
        for (int i = 0; i < n; i++) {
            const float *v = loom_kv_load(p, loom_kv_v_row(p, &P->seqs[s], 1, lo + i), kh * a->hd,
                                          a->hd, tmp);
            for (int e = 0; e < a->hd; e++) o[e] += w[i] / sum * v[e];
        }
        for (int e = 0; e < a->hd; e++) out[h * a->hd + e] = (float)o[e];
        free(o);
    }
    free(w);
    free(tmp);
}

static void attn_ref(const paged *P, const attn_case *a, int s, const float *q, int pos,
                     float scale, float *out) {
    attn_ref_span(P, a, s, q, pos, pos, pos, scale, out);
}

static loom_cuda_dtype kv_dt(loom_kv_type t) {
    return t == LOOM_KV_F16 ? LOOM_CUDA_F16 : t == LOOM_KV_BF16 ? LOOM_CUDA_BF16 : LOOM_CUDA_F32;
}

static const char *kv_name(loom_kv_type t) { return loom_kv_type_name(t); }

/* Uploads the pool; fills the device view of layer 1. */
static int paged_upload(const paged *P, loom_cuda_kv *kv, void **dk, void **dv, int32_t **dtab) {
    const loom_kv_layout *p = &P->pool->lay;
    size_t bytes = (size_t)p->n_layers * p->n_blocks * p->block_size * p->row_bytes;
    *dk = up(p->k, bytes);
    *dv = up(p->v, bytes);
    *dtab = up(P->tables, (size_t)P->n_seqs * P->tstride * sizeof(int32_t));
    if (!*dk || !*dv || !*dtab) return 0;
    size_t layer = (size_t)1 * p->n_blocks * p->block_size * p->row_bytes;
    kv->d_k = (const char *)*dk + layer;
    kv->d_v = (const char *)*dv + layer;
    kv->dt = kv_dt(p->type);
    kv->block_size = p->block_size;
    kv->row_stride = p->row_bytes / (p->type == LOOM_KV_F32 ? 4 : 2);
    return 1;
}

static int test_attn_decode(const attn_case *a, const int *lens, int n_seqs) {
    char what[128];
    int len_max = 0;
    for (int s = 0; s < n_seqs; s++) len_max = LOOM_MAX(len_max, lens[s]);
    snprintf(what, sizeof what, "%s h=%d/%d d=%d bs=%d win=%d cap=%g seqs=%d max_len=%d",
             kv_name(a->kv_type), a->nh, a->nkv, a->hd, a->bs, a->window, a->softcap, n_seqs,
             len_max);
    paged P;
    if (!paged_make(&P, a, lens, n_seqs)) return api_fail("attn_decode", what, LOOM_ERR_NOMEM);
    size_t qn = (size_t)n_seqs * a->nh * a->hd;
    float *q = xmalloc(qn * 4), *ref = xmalloc(qn * 4), *got = xmalloc(qn * 4);
    fill(q, qn, 1.0f);
    float scale = 1.0f / sqrtf((float)a->hd);
    for (int s = 0; s < n_seqs; s++)
        attn_ref(&P, a, s, q + (size_t)s * a->nh * a->hd, lens[s] - 1, scale,
                 ref + (size_t)s * a->nh * a->hd);
    loom_cuda_kv kv;
    void *dk = NULL, *dv = NULL;
    int32_t *dtab = NULL, *dlens = up(lens, (size_t)n_seqs * 4);
    float *dq = up(q, qn * 4), *dout = NULL;
    int ok = 0;
    if (!paged_upload(&P, &kv, &dk, &dv, &dtab) || !dlens || !dq ||
        loom_cuda_alloc(C, (void **)&dout, qn * 4) != LOOM_OK) {
        api_fail("attn_decode", what, LOOM_ERR_NOMEM);
    } else {
        loom_cuda_attn at = {a->nh, a->nkv, a->hd, scale, a->softcap, a->window, 0, NULL, NULL};
        /* the default, then each variant of C_att */
        ok = 1;
        for (int v = 0; v <= ATT_VARIANTS; v++) {
            loom_cuda *cx = v ? C_att[v - 1] : C;
            char w2[160];
            snprintf(w2, sizeof w2, "%s%s", what, v ? ATT_VAR[v - 1][0] : "");
            loom_status st = loom_cuda_memset0(cx, dout, qn * 4);
            if (st == LOOM_OK)
                st = loom_cuda_attn_decode(cx, dout, dq, &kv, &at, dtab, P.tstride, dlens,
                                           n_seqs, len_max);
            if (st == LOOM_OK) st = loom_cuda_download(cx, got, dout, qn * 4);
            if (st != LOOM_OK) ok &= api_fail("attn_decode", w2, st);
            else ok &= report("attn_decode", w2, got, ref, NULL, qn, 2e-5f, 1e-4f);
        }
    }
    loom_cuda_release(C, dk);
    loom_cuda_release(C, dv);
    loom_cuda_release(C, dtab);
    loom_cuda_release(C, dlens);
    loom_cuda_release(C, dq);
    loom_cuda_release(C, dout);
    paged_free(&P);
    free(q), free(ref), free(got);
    return ok;
}

/* What qkv_post makes of n fused q/k/v rows (nh + 2 nkv heads of hd):
 * + bias, the reference RMSNorm on q and k heads (qn NULL: none), rope
 * over the first 2 half dims from token t's cos/sin (ld apart), q into
 * qref (n, nh, hd) and K, V into kvref (n, 2, nkv, hd) in the KV type. */
static void qkv_post_ref(const float *qkv, int n, int nh, int nkv, int hd, int half,
                         const float *b, const float *qn, const float *kn, const float *cs,
                         const float *sn, int ld, loom_cuda_dtype dt, float *qref, float *kvref) {
    int nall = nh + 2 * nkv;
    size_t W = (size_t)nall * hd;
    float *row = xmalloc((size_t)hd * 4);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nall; h++) {
            const float *src = qkv + (size_t)t * W + (size_t)h * hd;
            int kind = h < nh ? 0 : h < nh + nkv ? 1 : 2;
            for (int i = 0; i < hd; i++) row[i] = src[i] + (b ? b[(size_t)h * hd + i] : 0.0f);
            if (qn && kind < 2) loom_kernels_ref.rmsnorm(row, row, kind ? kn : qn, hd, 1e-6f);
            if (kind < 2)
                for (int k = 0; k < half; k++) {
                    float c = cs[(size_t)t * ld + k], s = sn[(size_t)t * ld + k];
                    float x0 = row[k], x1 = row[k + half];
                    row[k] = x0 * c - x1 * s;
                    row[k + half] = x1 * c + x0 * s;
                }
            if (kind == 0) {
                memcpy(qref + ((size_t)t * nh + h) * hd, row, (size_t)hd * 4);
            } else {
                int kh = h - (kind == 1 ? nh : nh + nkv);
                float *dst = kvref + ((size_t)t * 2 + (kind - 1)) * nkv * hd + (size_t)kh * hd;
                for (int i = 0; i < hd; i++)
                    dst[i] = dt == LOOM_CUDA_F32 ? row[i] : round16(row[i], dt);
            }
        }
    free(row);
}

/* loom_cuda_attn_decode_qkv: each sequence's new token comes as a fused
 * q/k/v row; q, K and V are made as qkv_post_ref makes them, the K and V
 * rows the device stored at position len - 1 (garbage there before) must
 * be those within a rounding, and the attention output must match the
 * reference over the pool holding the device's rows. Under the default
 * and each attention variant (the split ones take the two-kernel path). */
static int test_attn_decode_qkv(const attn_case *a, const int *lens, int n_seqs, int rot,
                                int norms, int bias) {
    char what[160];
    int len_max = 0;
    for (int s = 0; s < n_seqs; s++) len_max = LOOM_MAX(len_max, lens[s]);
    snprintf(what, sizeof what, "%s h=%d/%d d=%d bs=%d win=%d cap=%g seqs=%d max_len=%d rot=%d "
             "norms=%d bias=%d", kv_name(a->kv_type), a->nh, a->nkv, a->hd, a->bs, a->window,
             a->softcap, n_seqs, len_max, rot, norms, bias);
    paged P;
    if (!paged_make(&P, a, lens, n_seqs)) return api_fail("attn_decode_qkv", what, LOOM_ERR_NOMEM);
    int nh = a->nh, nkv = a->nkv, hd = a->hd, nall = nh + 2 * nkv, half = rot / 2, ld = half + 2;
    size_t W = (size_t)nall * hd, qn_ = (size_t)n_seqs * nh * hd;
    loom_cuda_dtype dt = kv_dt(a->kv_type);
    const loom_kv_layout *pool = &P.pool->lay;
    size_t bytes = (size_t)pool->n_layers * pool->n_blocks * pool->block_size * pool->row_bytes;
    float *qkv = xmalloc((size_t)n_seqs * W * 4), *b = xmalloc(W * 4), *qnw = xmalloc((size_t)hd * 4);
    float *knw = xmalloc((size_t)hd * 4), *cs = xmalloc((size_t)n_seqs * ld * 4);
    float *sn = xmalloc((size_t)n_seqs * ld * 4);
    float *qref = xmalloc(qn_ * 4), *kvref = xmalloc((size_t)n_seqs * 2 * nkv * hd * 4);
    float *kvgot = xmalloc((size_t)n_seqs * 2 * nkv * hd * 4), *tmp = xmalloc((size_t)hd * 4);
    float *ref = xmalloc(qn_ * 4), *got = xmalloc(qn_ * 4);
    unsigned char *k0 = xmalloc(bytes), *v0 = xmalloc(bytes);
    double *inv = xmalloc((size_t)(half ? half : 1) * sizeof(double));
    int *pos = xmalloc((size_t)n_seqs * sizeof(int));
    int32_t *slot = xmalloc((size_t)n_seqs * 4);
    memcpy(k0, pool->k, bytes);  /* position len - 1 holds random rows: the kernel must store */
    memcpy(v0, pool->v, bytes);
    fill(qkv, (size_t)n_seqs * W, 2.0f);
    fill(b, W, 0.5f);
    fill(qnw, (size_t)hd, 1.0f);
    fill(knw, (size_t)hd, 1.0f);
    for (int i = 0; i < half; i++) inv[i] = pow(1000000.0, -2.0 * i / rot);
    for (int s = 0; s < n_seqs; s++) {
        pos[s] = lens[s] - 1;
        const loom_kv_seq *q = &P.seqs[s];
        slot[s] = q->blocks[pos[s] / a->bs] * a->bs + pos[s] % a->bs;
    }
    memset(cs, 0, (size_t)n_seqs * ld * 4);
    memset(sn, 0, (size_t)n_seqs * ld * 4);
    if (half) loom_cuda_rope_table(cs, sn, ld, pos, n_seqs, inv, rot, 1.0);
    qkv_post_ref(qkv, n_seqs, nh, nkv, hd, half, bias ? b : NULL, norms ? qnw : NULL, knw, cs, sn,
                 ld, dt, qref, kvref);
    loom_cuda_kv kv;
    void *dk = NULL, *dv = NULL;
    int32_t *dtab = NULL, *dlens = up(lens, (size_t)n_seqs * 4), *dslot = up(slot, (size_t)n_seqs * 4);
    float *dqkv = up(qkv, (size_t)n_seqs * W * 4), *db = up(b, W * 4);
    float *dqn = up(qnw, (size_t)hd * 4), *dkn = up(knw, (size_t)hd * 4);
    float *dcs = up(cs, (size_t)n_seqs * ld * 4), *dsn = up(sn, (size_t)n_seqs * ld * 4);
    float *dout = NULL, *dq = NULL;
    int ok = 0;
    if (!paged_upload(&P, &kv, &dk, &dv, &dtab) || !dlens || !dslot || !dqkv || !db || !dqn ||
        !dkn || !dcs || !dsn || loom_cuda_alloc(C, (void **)&dout, qn_ * 4) != LOOM_OK ||
        loom_cuda_alloc(C, (void **)&dq, qn_ * 4) != LOOM_OK) {
        api_fail("attn_decode_qkv", what, LOOM_ERR_NOMEM);
    } else {
        float scale = 1.0f / sqrtf((float)hd);
        loom_cuda_attn at = {nh, nkv, hd, scale, a->softcap, a->window, 0, NULL, NULL};
        ok = 1;
        /* the last pass: qkv_post then loom_cuda_attn_decode, the forward's
         * default (the pool row at len - 1 is garbage until qkv_post) */
        for (int v = 0; v <= ATT_VARIANTS + 1; v++) {
            int two = v == ATT_VARIANTS + 1;
            loom_cuda *cx = v && !two ? C_att[v - 1] : C;
            char w2[200];
            const char *vn = two ? " two kernels" : v ? ATT_VAR[v - 1][0] : "";
            snprintf(w2, sizeof w2, "%s%s%s", what, vn,
                     !two && loom_cuda_attn_decode_qkv_ok(cx, &kv, &at, rot, n_seqs, len_max)
                         ? " fused" : "");
            /* the pool as made (random rows at len - 1), a poisoned output */
            loom_status st = loom_cuda_upload(cx, dk, k0, bytes);
            if (st == LOOM_OK) st = loom_cuda_upload(cx, dv, v0, bytes);
            if (st == LOOM_OK) st = loom_cuda_memset0(cx, dout, qn_ * 4);
            if (st == LOOM_OK && two) {
                st = loom_cuda_qkv_post(cx, dq, &kv, dqkv, bias ? db : NULL, norms ? dqn : NULL,
                                        norms ? dkn : NULL, 1e-6f, dslot, n_seqs, nh, nkv, hd, rot,
                                        dcs, dsn, ld);
                if (st == LOOM_OK)
                    st = loom_cuda_attn_decode(cx, dout, dq, &kv, &at, dtab, P.tstride, dlens,
                                               n_seqs, len_max);
            } else if (st == LOOM_OK) {
                st = loom_cuda_attn_decode_qkv(cx, dout, dq, &kv, &at, dqkv, bias ? db : NULL,
                                               norms ? dqn : NULL, norms ? dkn : NULL, 1e-6f,
                                               dslot, rot, dcs, dsn, ld, dtab, P.tstride, dlens,
                                               n_seqs, len_max);
            }
            if (st == LOOM_OK) st = loom_cuda_download(cx, got, dout, qn_ * 4);
            /* the device's new rows into the host pool, for the reference */
            for (int s = 0; s < n_seqs && st == LOOM_OK; s++) {
                unsigned char *hk = loom_kv_k_row(pool, &P.seqs[s], 1, pos[s]);
                unsigned char *hv = loom_kv_v_row(pool, &P.seqs[s], 1, pos[s]);
                size_t rb = pool->layer[1].row_bytes;
                st = loom_cuda_download(cx, hk, (const char *)dk + (hk - pool->k), rb);
                if (st == LOOM_OK) st = loom_cuda_download(cx, hv, (const char *)dv + (hv - pool->v), rb);
                for (int kh = 0; kh < nkv && st == LOOM_OK; kh++) {
                    float *dk_ = kvgot + ((size_t)s * 2) * nkv * hd + (size_t)kh * hd;
                    float *dv_ = kvgot + ((size_t)s * 2 + 1) * nkv * hd + (size_t)kh * hd;
                    memcpy(dk_, loom_kv_load(pool, hk, kh * hd, hd, tmp), (size_t)hd * 4);
                    memcpy(dv_, loom_kv_load(pool, hv, kh * hd, hd, tmp), (size_t)hd * 4);
                }
            }
            if (st != LOOM_OK) {
                ok &= api_fail("attn_decode_qkv", w2, st);
                continue;
            }
            for (int s = 0; s < n_seqs; s++)
                attn_ref(&P, a, s, qref + (size_t)s * nh * hd, pos[s], scale,
                         ref + (size_t)s * nh * hd);
            float rel = dt == LOOM_CUDA_F32 ? 2e-5f : dt == LOOM_CUDA_F16 ? 1.5e-3f : 8e-3f;
            ok &= report("attn_decode_qkv", w2, got, ref, NULL, qn_, 2e-5f, 1e-4f);
            ok &= report("attn_decode_qkv_kv", w2, kvgot, kvref, NULL, (size_t)n_seqs * 2 * nkv * hd,
                         1e-5f, rel);
        }
    }
    void *dev[] = {dk, dv, dtab, dlens, dslot, dqkv, db, dqn, dkn, dcs, dsn, dout, dq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) loom_cuda_release(C, dev[i]);
    paged_free(&P);
    free(qkv), free(b), free(qnw), free(knw), free(cs), free(sn), free(qref);
    free(kvref), free(kvgot), free(tmp), free(ref), free(got), free(k0), free(v0), free(inv);
    free(pos), free(slot);
    return ok;
}

/* Rows: row r appends n_new[r] tokens after start[r] cached ones. */
/* tc = 1: the tensor-core kernel where it applies (bf16 KV), whose queries
 * and weights are rounded to bf16: checked to bf16 precision. out_dt: the
 * output type (loom_cuda_attn_prefill_to; 16-bit outputs are checked after
 * widening, at bf16 precision). span > 0: in each row of more than 2 new
 * tokens, tokens [1, 1 + span) of them (cut at the row's end) attend to
 * each other both ways. */
static int test_attn_prefill_sp(const attn_case *a, const int *start, const int *n_new,
                                int n_rows, int tc, loom_cuda_dtype out_dt, int span) {
    char what[128];
    int *lens = xmalloc((size_t)n_rows * sizeof(int));
    int32_t *row_tok = xmalloc((size_t)(n_rows + 1) * 4), *row_pos = xmalloc((size_t)n_rows * 4);
    int T = 0, max_new = 0;
    for (int r = 0; r < n_rows; r++) {
        lens[r] = start[r] + n_new[r];
        row_tok[r] = T;
        row_pos[r] = start[r];
        T += n_new[r];
        max_new = LOOM_MAX(max_new, n_new[r]);
    }
    row_tok[n_rows] = T;
    snprintf(what, sizeof what, "%s h=%d/%d d=%d bs=%d win=%d cap=%g rows=%d T=%d out=%s span=%d",
             kv_name(a->kv_type), a->nh, a->nkv, a->hd, a->bs, a->window, a->softcap, n_rows, T,
             DT_NAME[out_dt], span);
    const char *kname = tc ? "attn_prefill_tc" : "attn_prefill";
    paged P;
    if (!paged_make(&P, a, lens, n_rows)) return api_fail(kname, what, LOOM_ERR_NOMEM);
    size_t qn = (size_t)T * a->nh * a->hd, per = (size_t)a->nh * a->hd;
    float *q = xmalloc(qn * 4), *ref = xmalloc(qn * 4), *got = xmalloc(qn * 4);
    fill(q, qn, 1.0f);
    float scale = 1.0f / sqrtf((float)a->hd);
    int32_t *slo = xmalloc((size_t)(T ? T : 1) * 4), *shi = xmalloc((size_t)(T ? T : 1) * 4);
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < n_new[r]; i++) {
            int t = row_tok[r] + i, pos = start[r] + i, b = LOOM_MIN(1 + span, n_new[r]);
            int in = span > 0 && n_new[r] > 2 && i >= 1 && i < b;
            slo[t] = in ? start[r] + 1 : pos;
            shi[t] = in ? start[r] + b - 1 : pos;
            attn_ref_span(&P, a, r, q + (size_t)t * per, pos, slo[t], shi[t], scale,
                          ref + (size_t)t * per);
        }
    loom_cuda_kv kv;
    void *dk = NULL, *dv = NULL;
    int32_t *dtab = NULL, *drt = up(row_tok, (size_t)(n_rows + 1) * 4);
    int32_t *drp = up(row_pos, (size_t)n_rows * 4);
    int32_t *dslo = span ? up(slo, (size_t)T * 4) : NULL, *dshi = span ? up(shi, (size_t)T * 4) : NULL;
    float *dq = up(q, qn * 4), *dout = NULL;
    int ok = 0;
    if (!paged_upload(&P, &kv, &dk, &dv, &dtab) || !drt || !drp || !dq ||
        (span && (!dslo || !dshi)) || loom_cuda_alloc(C, (void **)&dout, qn * 4) != LOOM_OK) {
        api_fail(kname, what, LOOM_ERR_NOMEM);
    } else {
        loom_cuda_attn at = {a->nh, a->nkv, a->hd, scale, a->softcap, a->window, tc, dslo, dshi};
        /* the default, then (tensor cores) one m-tile a warp */
        ok = 1;
        for (int v = 0; v < (tc ? 2 : 1); v++) {
            loom_cuda *cx = v ? C_fa1 : C;
            char w2[160];
            snprintf(w2, sizeof w2, "%s%s", what, v ? " mt=1" : "");
            /* poisoned: every element must be written */
            float *nan = xmalloc(qn * 4);
            for (size_t i = 0; i < qn; i++) nan[i] = NAN;
            loom_status st = loom_cuda_upload(C, dout, nan, qn * 4);
            free(nan);
            if (st == LOOM_OK)
                st = out_dt == LOOM_CUDA_F32
                         ? loom_cuda_attn_prefill(cx, dout, dq, &kv, &at, dtab, P.tstride, drt,
                                                  drp, n_rows, max_new)
                         : loom_cuda_attn_prefill_to(cx, dout, out_dt, dq, &kv, &at, dtab,
                                                     P.tstride, drt, drp, n_rows, max_new, T);
            if (st == LOOM_OK) st = loom_cuda_download(cx, got, dout, qn * 4);
            if (st == LOOM_OK && out_dt != LOOM_CUDA_F32) {
                uint16_t *h = xmalloc(qn * 2);
                memcpy(h, got, qn * 2);
                from16(got, h, qn, out_dt);
                free(h);
            }
            if (st != LOOM_OK) ok &= api_fail(kname, w2, st);
            else if (tc || out_dt != LOOM_CUDA_F32)
                ok &= report(kname, w2, got, ref, NULL, qn, 1e-2f, 2e-2f);
            else ok &= report(kname, w2, got, ref, NULL, qn, 2e-5f, 1e-4f);
        }
    }
    loom_cuda_release(C, dk);
    loom_cuda_release(C, dv);
    loom_cuda_release(C, dtab);
    loom_cuda_release(C, drt);
    loom_cuda_release(C, drp);
    loom_cuda_release(C, dslo);
    loom_cuda_release(C, dshi);
    loom_cuda_release(C, dq);
    loom_cuda_release(C, dout);
    paged_free(&P);
    free(q), free(ref), free(got), free(lens), free(row_tok), free(row_pos), free(slo), free(shi);
    return ok;
}

static int test_attn_prefill_to(const attn_case *a, const int *start, const int *n_new,
                                int n_rows, int tc, loom_cuda_dtype out_dt) {
    return test_attn_prefill_sp(a, start, n_new, n_rows, tc, out_dt, 0);
}

static int test_attn_prefill(const attn_case *a, const int *start, const int *n_new, int n_rows,
                             int tc) {
    return test_attn_prefill_to(a, start, n_new, n_rows, tc, LOOM_CUDA_F32);
}

/* ---- fused q/k/v post-processing --------------------------------------- */

/* qkv_post against bias + the reference RMSNorm per head + the rope
 * formula + rows stored in the KV type, token by token. */
/* in16: the q/k/v rows come in bf16 (loom_cuda_qkv_post_bf16). */
static int test_qkv_post_in(int T, int nh, int nkv, int hd, int rot, int norms, int bias,
                            loom_kv_type kvt, int in16) {
    char what[128];
    snprintf(what, sizeof what, "%s T=%d heads=%d/%d d=%d rot=%d norms=%d bias=%d%s", kv_name(kvt),
             T, nh, nkv, hd, rot, norms, bias, in16 ? " bf16 in" : "");
    int nall = nh + 2 * nkv, half = rot / 2, ld = half + 2, n_slots = 2 * T + 5;
    size_t W = (size_t)nall * hd, stride = (size_t)nkv * hd + 8;  /* padded rows */
    loom_cuda_dtype dt = kv_dt(kvt);
    size_t es = dt == LOOM_CUDA_F32 ? 4 : 2;
    float *qkv = xmalloc((size_t)T * W * 4), *b = xmalloc(W * 4), *qn = xmalloc((size_t)hd * 4);
    float *kn = xmalloc((size_t)hd * 4), *cs = xmalloc((size_t)T * ld * 4);
    float *sn = xmalloc((size_t)T * ld * 4);
    float *qref = xmalloc((size_t)T * nh * hd * 4), *qgot = xmalloc((size_t)T * nh * hd * 4);
    size_t kvn = (size_t)T * 2 * nkv * hd;
    float *kvref = xmalloc(kvn * 4), *kvgot = xmalloc(kvn * 4);
    unsigned char *hk = xmalloc((size_t)n_slots * stride * es), *hv = xmalloc((size_t)n_slots * stride * es);
    double *inv = xmalloc((size_t)(half ? half : 1) * sizeof(double));
    int *pos = xmalloc((size_t)T * sizeof(int));
    int32_t *slot = xmalloc((size_t)T * 4);
    fill(qkv, (size_t)T * W, 2.0f);
    uint16_t *qkv16 = xmalloc((size_t)T * W * 2);
    for (size_t i = 0; in16 && i < (size_t)T * W; i++) {
        qkv16[i] = loom_f32_to_bf16(qkv[i]);
        qkv[i] = loom_bf16_to_f32(qkv16[i]);  /* the reference takes the rounded rows */
    }
    fill(b, W, 0.5f);
    fill(qn, (size_t)hd, 1.0f);
    fill(kn, (size_t)hd, 1.0f);
    for (int i = 0; i < half; i++) inv[i] = pow(10000.0, -2.0 * i / rot);
    for (int t = 0; t < T; t++) {
        pos[t] = (int)(test_rand_u32(&rng) % 5000);
        slot[t] = 2 * t + 1 + (int)(test_rand_u32(&rng) % 2);  /* distinct, scattered */
    }
    memset(cs, 0, (size_t)T * ld * 4);
    memset(sn, 0, (size_t)T * ld * 4);
    loom_cuda_rope_table(cs, sn, ld, pos, T, inv, rot, 1.0);
    qkv_post_ref(qkv, T, nh, nkv, hd, half, bias ? b : NULL, norms ? qn : NULL, kn, cs, sn, ld, dt,
                 qref, kvref);
    float *dqkv = in16 ? up(qkv16, (size_t)T * W * 2) : up(qkv, (size_t)T * W * 4);
    float *db = up(b, W * 4), *dqn = up(qn, (size_t)hd * 4);
    float *dkn = up(kn, (size_t)hd * 4), *dcs = up(cs, (size_t)T * ld * 4);
    float *dsn = up(sn, (size_t)T * ld * 4);
    int32_t *dslot = up(slot, (size_t)T * 4);
    float *dq = NULL;
    void *dk = NULL, *dv = NULL;
    int ok = 0;
    if (!dqkv || !db || !dqn || !dkn || !dcs || !dsn || !dslot ||
        loom_cuda_alloc(C, (void **)&dq, (size_t)T * nh * hd * 4) != LOOM_OK ||
        loom_cuda_alloc(C, &dk, (size_t)n_slots * stride * es) != LOOM_OK ||
        loom_cuda_alloc(C, &dv, (size_t)n_slots * stride * es) != LOOM_OK) {
        api_fail("qkv_post", what, LOOM_ERR_NOMEM);
    } else {
        loom_cuda_kv kv = {dk, dv, dt, 16, stride};
        loom_status st =
            in16 ? loom_cuda_qkv_post_bf16(C, dq, &kv, dqkv, bias ? db : NULL, norms ? dqn : NULL,
                                           norms ? dkn : NULL, 1e-6f, dslot, T, nh, nkv, hd, rot,
                                           dcs, dsn, ld)
                 : loom_cuda_qkv_post(C, dq, &kv, dqkv, bias ? db : NULL, norms ? dqn : NULL,
                                      norms ? dkn : NULL, 1e-6f, dslot, T, nh, nkv, hd, rot, dcs,
                                      dsn, ld);
        if (st == LOOM_OK) st = loom_cuda_download(C, qgot, dq, (size_t)T * nh * hd * 4);
        if (st == LOOM_OK) st = loom_cuda_download(C, hk, dk, (size_t)n_slots * stride * es);
        if (st == LOOM_OK) st = loom_cuda_download(C, hv, dv, (size_t)n_slots * stride * es);
        if (st != LOOM_OK) {
            api_fail("qkv_post", what, st);
        } else {
            for (int t = 0; t < T; t++)
                for (int side = 0; side < 2; side++) {
                    const unsigned char *base = (side ? hv : hk) + (size_t)slot[t] * stride * es;
                    float *dst = kvgot + ((size_t)t * 2 + side) * nkv * hd;
                    if (dt == LOOM_CUDA_F32) memcpy(dst, base, (size_t)nkv * hd * 4);
                    else from16(dst, (const uint16_t *)base, (size_t)nkv * hd, dt);
                }
            /* f32: summation order only; 16-bit rows: one ulp */
            float rel = dt == LOOM_CUDA_F32 ? 2e-5f : dt == LOOM_CUDA_F16 ? 1.5e-3f : 8e-3f;
            ok = report("qkv_post", what, qgot, qref, NULL, (size_t)T * nh * hd, 1e-5f, 2e-5f) &&
                 report("qkv_post_kv", what, kvgot, kvref, NULL, kvn, 1e-5f, rel);
        }
    }
    void *dev[] = {dqkv, db, dqn, dkn, dcs, dsn, dslot, dq, dk, dv};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) loom_cuda_release(C, dev[i]);
    free(qkv), free(b), free(qn), free(kn), free(cs), free(sn), free(qref);
    free(qgot), free(kvref), free(kvgot), free(hk), free(hv), free(inv), free(pos), free(slot);
    free(qkv16);
    return ok;
}

static int test_qkv_post(int T, int nh, int nkv, int hd, int rot, int norms, int bias,
                         loom_kv_type kvt) {
    return test_qkv_post_in(T, nh, nkv, hd, rot, norms, bias, kvt, 0);
}

/* ---- sampling ------------------------------------------------------------ */

/* The CPU sampler's steps for one row (src/sample/sample.c, no bias,
 * penalties or XTC), spelled out: the id drawn, and how far the draw fell
 * from the nearest boundary between candidates (relative to the mass). */
static int sample_ref(const float *l, int V, const loom_sample_pick *P, double *margin) {
    int32_t *idx = xmalloc((size_t)V * 4);
    float *p = xmalloc((size_t)V * 4);
    float mx = l[0];
    for (int i = 1; i < V; i++) mx = (float)test_max(mx, l[i]);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += (p[i] = expf((l[i] - mx) / P->temperature));
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < V; i++) p[i] *= inv;
    int K = P->top_k < V ? P->top_k : V, m = 0;
    for (int k = 0; k < K; k++) {  /* selection: (p desc, index asc) */
        int b = -1;
        for (int i = 0; i < V; i++) {
            int taken = 0;
            for (int j = 0; j < k && !taken; j++) taken = idx[j] == i;
            if (!taken && (b < 0 || p[i] > p[b])) b = i;
        }
        idx[k] = b;
    }
    double mass = 0;
    while (m < K) {
        mass += p[idx[m++]];
        if (P->top_p < 1 && mass >= P->top_p) break;
    }
    if (P->min_p > 0) {
        float top = p[idx[0]];
        int k = 0;
        for (int i = 0; i < m; i++)
            if (p[idx[i]] >= P->min_p * top) idx[k++] = idx[i];
        m = k;
    }
    double tot = 0, acc = 0;
    for (int i = 0; i < m; i++) tot += p[idx[i]];
    double u = P->u * tot;
    int id = idx[m - 1];
    *margin = 1;
    for (int i = 0; i < m; i++) {
        acc += p[idx[i]];
        *margin = fmin(*margin, fabs(u - acc) / tot);
        if (u < acc) {
            id = idx[i];
            break;
        }
    }
    free(idx), free(p);
    return id;
}

/* loom_cuda_sample against sample_ref, row by row; a draw within 1e-5 of
 * a boundary may go either way (the device's expf is not glibc's). */
static int test_sample(int T, int V, float temp, int top_k, float top_p, float min_p) {
    char what[128];
    snprintf(what, sizeof what, "T=%d V=%d temp=%g top_k=%d top_p=%g min_p=%g", T, V, temp, top_k,
             top_p, min_p);
    float *l = xmalloc((size_t)T * V * 4);
    fill(l, (size_t)T * V, 4.0f);
    loom_sample_pick *P = xmalloc((size_t)T * sizeof *P);
    int32_t *got = xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) {
        P[t] = (loom_sample_pick){.temperature = temp, .top_p = top_p, .min_p = min_p,
                                    .top_k = top_k,
                                    .u = (double)(test_rand_u32(&rng) >> 8) / 16777216.0};
        if (t == 0) l[(size_t)1 * V / 3] = l[(size_t)2 * V / 3] = 9.0f;  /* a tie at the top */
    }
    float *dl = up(l, (size_t)T * V * 4);
    loom_sample_pick *dp = up(P, (size_t)T * sizeof *P);
    int32_t *dout = NULL;
    int ok = 0;
    if (!dl || !dp || loom_cuda_alloc(C, (void **)&dout, (size_t)T * 4) != LOOM_OK) {
        api_fail("sample", what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_sample(C, dout, dl, T, V, dp);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dout, (size_t)T * 4);
        if (st != LOOM_OK) {
            api_fail("sample", what, st);
        } else {
            int bad = 0, near = 0;
            for (int t = 0; t < T; t++) {
                double margin;
                int want = sample_ref(l + (size_t)t * V, V, &P[t], &margin);
                if (got[t] != want) {
                    if (margin < 1e-5) near++;
                    else bad++;
                }
            }
            ok = !bad;
            printf("%s  %-14s %s  differ=%d (at a boundary %d) of %d\n", ok ? "PASS" : "FAIL",
                   "sample", what, bad, near, T);
            fflush(stdout);
            ok ? n_pass++ : n_fail++;
        }
    }
    loom_cuda_release(C, dl);
    loom_cuda_release(C, dp);
    loom_cuda_release(C, dout);
    free(l), free(P), free(got);
    return ok;
}

/* ---- routed experts ------------------------------------------------------ */

typedef struct moe_case {
    int T, E, K, H, I;
    loom_cuda_dtype dt;
    int renorm;
    int one;            /* every token's first choice is expert 3 % E (the rest idle
                           when k = 1) */
} moe_case;

/* moe.c's routing on one row of logits: softmax, strict-> top-k scan
 * (the lower index wins ties), renormalised in pick order. */
static void moe_route_ref(const float *logits, int E, int K, int renorm, int *sel, float *w) {
    float *p = xmalloc((size_t)E * 4);
    memcpy(p, logits, (size_t)E * 4);
    loom_kernels_ref.softmax(p, E);
    float sum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[k] = best;
        w[k] = p[best];
        sum += p[best];
    }
    if (renorm)
        for (int k = 0; k < K; k++) w[k] /= sum;
    free(p);
}

/* y (rows) = W (rows, cols) @ x in double. */
static void mv_ref(double *y, const float *w, const float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int k = 0; k < cols; k++) s += (double)w[(size_t)r * cols + k] * x[k];
        y[r] = s;
    }
}

static float silu_ref(double g) { return (float)(g / (1.0 + exp(-g))); }

/* moe_scale_weights: each routing weight times its expert's scale (one f32
 * multiply: equal bits), experts chosen at random, repeats included. */
static int test_moe_scale_weights(int T, int k, int E) {
    const char *kn = "moe_scale_w";
    char what[96];
    snprintf(what, sizeof what, "T=%d k=%d E=%d", T, k, E);
    size_t N = (size_t)T * k;
    float *w = xmalloc(N * 4), *sc = xmalloc((size_t)E * 4), *ref = xmalloc(N * 4);
    float *got = xmalloc(N * 4);
    int32_t *sel = xmalloc(N * 4);
    fill(w, N, 1.0f);
    fill(sc, (size_t)E, 2.0f);
    for (size_t i = 0; i < N; i++) {
        sel[i] = (int32_t)(test_rand_u32(&rng) % (unsigned)E);
        ref[i] = w[i] * sc[sel[i]];
    }
    float *dw = up(w, N * 4), *ds = up(sc, (size_t)E * 4);
    int32_t *dsel = up(sel, N * 4);
    int ok = 0;
    if (!dw || !ds || !dsel) {
        api_fail(kn, what, LOOM_ERR_NOMEM);
    } else {
        loom_status st = loom_cuda_moe_scale_weights(C, dw, dsel, ds, T, k);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dw, N * 4);
        if (st != LOOM_OK) api_fail(kn, what, st);
        else ok = report(kn, what, got, ref, NULL, N, 0.0f, 0.0f);
    }
    loom_cuda_release(C, dw);
    loom_cuda_release(C, ds);
    loom_cuda_release(C, dsel);
    free(w), free(sc), free(ref), free(got), free(sel);
    return ok;
}

/* v rounded to the 16-bit weight type dt (the tensor-core GEMM's input), or v. */
static float moe_round(float v, loom_cuda_dtype dt, int tc) {
    if (!tc) return v;
    return dt == LOOM_CUDA_F16 ? loom_f16_to_f32(loom_f32_to_f16(v))
                               : loom_bf16_to_f32(loom_f32_to_bf16(v));
}

/* One plan tile size: the plan checked entry by entry, the gate | up
 * grouped GEMM against a double reference of each pair (x rounded where
 * the tensor cores take it), then down + combine against a reference over
 * the device's own activations (rounded likewise). 1: all passed. */
static int moe_plan_path(const moe_case *mc, int tile, const char *what, const float *x,
                         const float *res, const float *wgu, const float *wd, const int32_t *sel,
                         const float *wt, int32_t *plan, void *dx, void *dwgu, void *dwd,
                         void *dsel, void *dwt, void *dplan, void *dhb, void *dab, void *dy,
                         void *dout, float *got) {
    int T = mc->T, E = mc->E, K = mc->K, H = mc->H, I = mc->I, N = T * K;
    int plan_n = loom_cuda_moe_plan_ints(T, K, E);
    loom_status st = loom_cuda_moe_sort(C, dplan, dsel, T, K, E, tile);
    if (st == LOOM_OK) st = loom_cuda_download(C, plan, dplan, (size_t)plan_n * 4);
    if (st != LOOM_OK) {
        api_fail("moe sort", what, st);
        return 0;
    }
    const int32_t *off = plan, *tiles = plan + E + 1, *row = plan + 2 * (E + 1), *src = row + N;
    {
        /* counts per expert, each pair's row inside its expert's range,
         * each row's token, rows a permutation */
        int bad = off[0] != 0 || tiles[0] != 0 || off[E] != N, empty = 0;
        char *seen = calloc((size_t)N, 1);
        for (int e = 0; e < E && !bad; e++) {
            int n = 0;
            for (int i = 0; i < N; i++) n += sel[i] == e;
            empty += n == 0;
            bad |= off[e + 1] - off[e] != n || tiles[e + 1] - tiles[e] != (n + tile - 1) / tile;
        }
        for (int i = 0; i < N && !bad; i++) {
            int r = row[i], e = sel[i];
            bad |= r < off[e] || r >= off[e + 1] || seen[r] || src[r] != i / K;
            if (!bad) seen[r] = 1;
        }
        free(seen);
        printf("%s  %-14s %-44s %d experts without pairs\n", bad ? "FAIL" : "PASS", "moe sort",
               what, empty);
        bad ? n_fail++ : n_pass++;
        if (bad) return 0;
    }
    int tcg = loom_cuda_moe_gemm_tc(mc->dt, H, 1), tcd = loom_cuda_moe_gemm_tc(mc->dt, I, 1);
    size_t ngu = (size_t)N * 2 * I;
    float *hb = xmalloc(ngu * 4), *hbr = xmalloc(ngu * 4), *ab = xmalloc((size_t)N * I * 4);
    float *xr = xmalloc((size_t)H * 4), *ar = xmalloc((size_t)I * 4), *ref = xmalloc((size_t)T * H * 4);
    double *gd = xmalloc((size_t)2 * I * 8), *yd = xmalloc((size_t)H * 8), *o = xmalloc((size_t)H * 8);
    int ok = 0;
    st = loom_cuda_memset0(C, dhb, ngu * 4);
    if (st == LOOM_OK) st = loom_cuda_moe_gemm(C, dhb, dx, 1, dwgu, mc->dt, 2 * I, H, dplan, E, N, tile);
    if (st == LOOM_OK) st = loom_cuda_download(C, hb, dhb, ngu * 4);
    if (st == LOOM_OK) st = loom_cuda_act_mul_split(C, dab, dhb, N, I, 0);
    if (st == LOOM_OK) st = loom_cuda_download(C, ab, dab, (size_t)N * I * 4);
    if (st == LOOM_OK) st = loom_cuda_upload(C, dout, res, (size_t)T * H * 4);
    if (st == LOOM_OK) st = loom_cuda_moe_gemm(C, dy, dab, 0, dwd, mc->dt, H, I, dplan, E, N, tile);
    if (st == LOOM_OK) st = loom_cuda_moe_combine(C, dout, 1, dy, dplan, dwt, T, K, H, E);
    if (st == LOOM_OK) st = loom_cuda_download(C, got, dout, (size_t)T * H * 4);
    if (st != LOOM_OK) {
        api_fail("moe gemm", what, st);
        goto done;
    }
    for (int a = 0; a < N; a++) {
        const float *xt = x + (size_t)(a / K) * H;
        for (int i = 0; i < H; i++) xr[i] = moe_round(xt[i], mc->dt, tcg);
        mv_ref(gd, wgu + (size_t)sel[a] * 2 * I * H, xr, 2 * I, H);
        for (int i = 0; i < 2 * I; i++) hbr[(size_t)row[a] * 2 * I + i] = (float)gd[i];
    }
    char w2[200];
    snprintf(w2, sizeof w2, "%s%s", what, tcg ? " tc" : "");
    ok = report("moe gemm gu", w2, hb, hbr, NULL, ngu, 2e-5f, 1e-4f);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < H; i++) o[i] = 0;
        for (int k = 0; k < K; k++) {
            int a = t * K + k;
            for (int i = 0; i < I; i++)
                ar[i] = moe_round(ab[(size_t)row[a] * I + i], mc->dt, tcd);
            mv_ref(yd, wd + (size_t)sel[a] * H * I, ar, H, I);
            for (int i = 0; i < H; i++) o[i] += (double)wt[a] * yd[i];
        }
        for (int i = 0; i < H; i++) ref[(size_t)t * H + i] = (float)(res[(size_t)t * H + i] + o[i]);
    }
    snprintf(w2, sizeof w2, "%s%s", what, tcd ? " tc" : "");
    ok &= report("moe gemm path", w2, got, ref, NULL, (size_t)T * H, 2e-5f, 1e-4f);
done:
    free(hb), free(hbr), free(ab), free(xr), free(ar), free(ref), free(gd), free(yd), free(o);
    return ok;
}

/* The whole feed-forward of one MoE layer against a double reference:
 * the router as a GEMV (sel NULL) and as a one-group GEMM, routing, the
 * bucketing plan (checked entry by entry), then the experts both ways:
 * decode's GEMV + act + summing GEMV, prefill's grouped GEMM + act +
 * grouped GEMM + combine; both add into a random residual. */
static int test_moe(const moe_case *mc) {
    int T = mc->T, E = mc->E, K = mc->K, H = mc->H, I = mc->I, N = T * K;
    char what[128];
    snprintf(what, sizeof what, "%s T=%d E=%d k=%d H=%d I=%d renorm=%d%s", DT_NAME[mc->dt], T, E,
             K, H, I, mc->renorm, mc->one ? " one-expert" : "");
    size_t nr = (size_t)E * H, ngu = (size_t)E * 2 * I * H, nd = (size_t)E * H * I;
    float *x = xmalloc((size_t)T * H * 4), *res = xmalloc((size_t)T * H * 4);
    float *wr = xmalloc(nr * 4), *wgu = xmalloc(ngu * 4), *wd = xmalloc(nd * 4);
    fill(x, (size_t)T * H, 2.0f);
    fill(res, (size_t)T * H, 1.0f);
    void *hr = rand_table(mc->dt, nr, 1.0f / sqrtf((float)H), wr);
    void *hgu = rand_table(mc->dt, ngu, 2.0f / sqrtf((float)H), wgu);
    void *hd = rand_table(mc->dt, nd, 2.0f / sqrtf((float)I), wd);
    size_t es = mc->dt == LOOM_CUDA_F32 ? 4 : 2;
    int plan_n = loom_cuda_moe_plan_ints(T, K, E);
    float *logits = xmalloc((size_t)T * E * 4), *lref = xmalloc((size_t)T * E * 4);
    float *lg2 = xmalloc((size_t)T * E * 4);
    int32_t *sel = xmalloc((size_t)N * 4), *rsel = xmalloc((size_t)N * 4);
    float *wt = xmalloc((size_t)N * 4), *rwt = xmalloc((size_t)N * 4);
    int32_t *plan = xmalloc((size_t)plan_n * 4);
    float *ref = xmalloc((size_t)T * H * 4), *got = xmalloc((size_t)T * H * 4);
    /* y holds a router row (E) as well as an expert's output (H) */
    double *g = xmalloc((size_t)2 * I * 8), *y = xmalloc((size_t)(H > E ? H : E) * 8);
    float *a = xmalloc((size_t)I * 4);
    void *dx = up(x, (size_t)T * H * 4), *dwr = up(hr, nr * es), *dwgu = up(hgu, ngu * es);
    void *dwd = up(hd, nd * es);
    void *dlog = NULL, *dsel = NULL, *dwt = NULL, *dplan = NULL, *dhb = NULL, *dab = NULL;
    void *dy = NULL, *dout = NULL;
    loom_cuda_alloc(C, &dlog, (size_t)T * E * 4);
    loom_cuda_alloc(C, &dsel, (size_t)N * 4);
    loom_cuda_alloc(C, &dwt, (size_t)N * 4);
    loom_cuda_alloc(C, &dplan, (size_t)plan_n * 4);
    loom_cuda_alloc(C, &dhb, (size_t)N * 2 * I * 4);
    loom_cuda_alloc(C, &dab, (size_t)N * I * 4);
    loom_cuda_alloc(C, &dy, (size_t)N * H * 4);
    loom_cuda_alloc(C, &dout, (size_t)T * H * 4);
    int ok = 0;
    loom_status st = LOOM_OK;
    if (!dx || !dwr || !dwgu || !dwd || !dlog || !dsel || !dwt || !dplan || !dhb || !dab || !dy ||
        !dout) {
        api_fail("moe", what, LOOM_ERR_NOMEM);
        goto out;
    }
    /* the router: a GEMV per token and a one-group GEMM */
    for (int t = 0; t < T; t++) {
        mv_ref(y, wr, x + (size_t)t * H, E, H);
        for (int e = 0; e < E; e++) lref[(size_t)t * E + e] = (float)y[e];
    }
    st = loom_cuda_moe_gemv(C, dlog, dx, 1, NULL, dwr, mc->dt, E, H, T);
    if (st == LOOM_OK) st = loom_cuda_download(C, logits, dlog, (size_t)T * E * 4);
    if (st == LOOM_OK) st = loom_cuda_moe_gemm(C, dlog, dx, 0, dwr, mc->dt, E, H, NULL, 1, T, 0);
    if (st == LOOM_OK) st = loom_cuda_download(C, lg2, dlog, (size_t)T * E * 4);
    if (st != LOOM_OK) {
        api_fail("moe", what, st);
        goto out;
    }
    report("moe router gemv", what, logits, lref, NULL, (size_t)T * E, 1e-5f, 1e-5f);
    report("moe router gemm", what, lg2, lref, NULL, (size_t)T * E, 1e-5f, 1e-5f);
    /* routing from the GPU's logits (biased when every token takes one expert) */
    if (mc->one)
        for (int t = 0; t < T; t++) logits[(size_t)t * E + 3 % E] += 30.0f;
    st = loom_cuda_upload(C, dlog, logits, (size_t)T * E * 4);
    if (st == LOOM_OK) st = loom_cuda_moe_route(C, dsel, dwt, dlog, T, E, K, mc->renorm);
    if (st == LOOM_OK) st = loom_cuda_download(C, sel, dsel, (size_t)N * 4);
    if (st == LOOM_OK) st = loom_cuda_download(C, wt, dwt, (size_t)N * 4);
    if (st != LOOM_OK) {
        api_fail("moe", what, st);
        goto out;
    }
    int same = 1;
    for (int t = 0; t < T; t++) {
        moe_route_ref(logits + (size_t)t * E, E, K, mc->renorm, rsel + (size_t)t * K,
                      rwt + (size_t)t * K);
        for (int k = 0; k < K; k++) same &= sel[t * K + k] == rsel[t * K + k];
    }
    {
        float *sf = xmalloc((size_t)N * 4), *rf = xmalloc((size_t)N * 4);
        for (int i = 0; i < N; i++) sf[i] = (float)sel[i], rf[i] = (float)rsel[i];
        report("moe route sel", what, sf, rf, NULL, (size_t)N, 0.0f, 0.0f);
        free(sf), free(rf);
    }
    report("moe route w", what, wt, rwt, NULL, (size_t)N, 1e-6f, 1e-5f);
    if (!same) goto out;  /* the experts below take the GPU's choices */
    /* reference: res + sum_k w_k * down_e(silu(gate_e x) * up_e x) */
    for (int t = 0; t < T; t++) {
        double *o = xmalloc((size_t)H * 8);
        for (int i = 0; i < H; i++) o[i] = 0;
        for (int k = 0; k < K; k++) {
            int e = sel[t * K + k];
            mv_ref(g, wgu + (size_t)e * 2 * I * H, x + (size_t)t * H, 2 * I, H);
            for (int i = 0; i < I; i++) a[i] = silu_ref(g[i]) * (float)g[I + i];
            mv_ref(y, wd + (size_t)e * H * I, a, H, I);
            for (int i = 0; i < H; i++) o[i] += (double)wt[t * K + k] * y[i];
        }
        for (int i = 0; i < H; i++) ref[(size_t)t * H + i] = (float)(res[(size_t)t * H + i] + o[i]);
        free(o);
    }
    /* decode: GEMV per pair, act, the summing GEMV into the residual */
    st = loom_cuda_upload(C, dout, res, (size_t)T * H * 4);
    if (st == LOOM_OK) st = loom_cuda_moe_gemv(C, dhb, dx, K, dsel, dwgu, mc->dt, 2 * I, H, N);
    if (st == LOOM_OK) st = loom_cuda_act_mul_split(C, dab, dhb, N, I, 0);
    if (st == LOOM_OK)
        st = loom_cuda_moe_gemv_sum(C, dout, 1, dab, dsel, dwt, dwd, mc->dt, T, K, H, I);
    if (st == LOOM_OK) st = loom_cuda_download(C, got, dout, (size_t)T * H * 4);
    if (st != LOOM_OK) {
        api_fail("moe gemv", what, st);
        goto out;
    }
    report("moe gemv path", what, got, ref, NULL, (size_t)T * H, 2e-5f, 1e-4f);
    /* prefill (and decode batches): the plan at both row tiles, grouped
     * GEMMs over it, act, combine into the residual */
    for (int ti = 0; ti < 2; ti++) {
        int tile = ti ? LOOM_CUDA_MOE_TILE_S : LOOM_CUDA_MOE_TILE;
        char wt_[160];
        snprintf(wt_, sizeof wt_, "%s tile=%d", what, tile);
        if (!moe_plan_path(mc, tile, wt_, x, res, wgu, wd, sel, wt, plan, dx, dwgu, dwd, dsel,
                           dwt, dplan, dhb, dab, dy, dout, got))
            goto out;
    }
    ok = 1;
    /* the shared expert's gate: out += sigmoid(g[t]) * y (y = x here) */
    {
        float *gg = xmalloc((size_t)T * 4);
        fill(gg, (size_t)T, 4.0f);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H; i++) {
                size_t o = (size_t)t * H + i;
                ref[o] = got[o] + x[o] / (1.0f + expf(-gg[t]));
            }
        st = loom_cuda_upload(C, dlog, gg, (size_t)T * 4);
        if (st == LOOM_OK) st = loom_cuda_moe_gate_add(C, dout, dx, dlog, T, H);
        if (st == LOOM_OK) st = loom_cuda_download(C, got, dout, (size_t)T * H * 4);
        if (st != LOOM_OK) api_fail("moe gate_add", what, st);
        else report("moe gate_add", what, got, ref, NULL, (size_t)T * H, 1e-6f, 1e-6f);
        free(gg);
    }
out:
    loom_cuda_release(C, dx), loom_cuda_release(C, dwr), loom_cuda_release(C, dwgu);
    loom_cuda_release(C, dwd), loom_cuda_release(C, dlog), loom_cuda_release(C, dsel);
    loom_cuda_release(C, dwt), loom_cuda_release(C, dplan), loom_cuda_release(C, dhb);
    loom_cuda_release(C, dab), loom_cuda_release(C, dy), loom_cuda_release(C, dout);
    free(x), free(res), free(wr), free(wgu), free(wd), free(hr), free(hgu), free(hd);
    free(logits), free(lref), free(lg2), free(sel), free(rsel), free(wt), free(rwt), free(plan);
    free(ref), free(got), free(g), free(y), free(a);
    return ok;
}

/* Bad arguments are refused, not run: top k above the experts or the limit. */
static void test_moe_limits(void) {
    int ok = loom_cuda_moe_route(C, NULL, NULL, NULL, 1, 4, 5, 1) == LOOM_ERR_UNSUPPORTED &&
             loom_cuda_moe_route(C, NULL, NULL, NULL, 1, 64, LOOM_CUDA_MOE_KMAX + 1, 1) ==
                 LOOM_ERR_UNSUPPORTED &&
             loom_cuda_moe_route(C, NULL, NULL, NULL, 0, 4, 2, 1) == LOOM_OK;
    loom_err_clear();
    printf("%s  %-14s %-44s\n", ok ? "PASS" : "FAIL", "moe limits", "k > E, k > KMAX refused");
    ok ? n_pass++ : n_fail++;
}

/* ---- Gated DeltaNet (kernels_lin.cu; reference linear_attn.c) ------------ */

static double lin_silu_ref(double x) { return x / (1.0 + exp(-x)); }

/* Device buffers of n_rows states of per floats each, from host h (n_rows,
 * per), plus a pad of `off` floats before each row's part; *dptr gets the
 * device array of their base pointers. */
static int lin_states_up(const float *h, int n_rows, size_t per, size_t off, float **dbuf,
                         float ***dptr) {
    size_t stride = off + per;
    float *tmp = xmalloc(sizeof(float) * stride * (size_t)n_rows);
    for (int r = 0; r < n_rows; r++) {
        for (size_t i = 0; i < off; i++) tmp[(size_t)r * stride + i] = -7.0f;
        memcpy(tmp + (size_t)r * stride + off, h + (size_t)r * per, sizeof(float) * per);
    }
    *dbuf = up(tmp, sizeof(float) * stride * (size_t)n_rows);
    free(tmp);
    if (!*dbuf) return 0;
    float **hp = xmalloc(sizeof(float *) * (size_t)n_rows);
    for (int r = 0; r < n_rows; r++) hp[r] = *dbuf + (size_t)r * stride;
    *dptr = up(hp, sizeof(float *) * (size_t)n_rows);
    free(hp);
    return *dptr != NULL;
}

static int lin_states_down(float *h, int n_rows, size_t per, size_t off, const float *dbuf) {
    size_t stride = off + per;
    float *tmp = xmalloc(sizeof(float) * stride * (size_t)n_rows);
    loom_status st = loom_cuda_download(C, tmp, dbuf, sizeof(float) * stride * (size_t)n_rows);
    for (int r = 0; r < n_rows; r++)
        memcpy(h + (size_t)r * per, tmp + (size_t)r * stride + off, sizeof(float) * per);
    free(tmp);
    return st == LOOM_OK;
}

static int32_t *lin_rtok(const int *lens, int n_rows, int *T) {
    int32_t *rt = xmalloc(sizeof(int32_t) * (size_t)(n_rows + 1));
    rt[0] = 0;
    for (int r = 0; r < n_rows; r++) rt[r + 1] = rt[r] + lens[r];
    *T = rt[n_rows];
    return rt;
}

/* Causal conv over rows of lens[] tokens with their conv states (K-1, D):
 * the outputs and the rolled states, against linear_attn.c's conv_row. */
static int test_lin_conv(int K, int D, const int *lens, int n_rows) {
    char what[96];
    int T;
    int32_t *rt = lin_rtok(lens, n_rows, &T);
    snprintf(what, sizeof what, "K=%d D=%d rows=%d T=%d%s", K, D, n_rows, T,
             n_rows > 1 || lens[0] > 1 ? "" : " (decode)");
    size_t per = (size_t)(K - 1) * D, off = 3 * (size_t)D + 5;
    float *in = xmalloc(sizeof(float) * (size_t)T * D), *w = xmalloc(sizeof(float) * (size_t)D * K);
    float *st = xmalloc(sizeof(float) * (per * n_rows + 1)), *st_ref = xmalloc(sizeof(float) * (per * n_rows + 1));
    float *st_got = xmalloc(sizeof(float) * (per * n_rows + 1));
    float *ref = xmalloc(sizeof(float) * (size_t)T * D), *got = xmalloc(sizeof(float) * (size_t)T * D);
    fill(in, (size_t)T * D, 2.0f);
    fill(w, (size_t)D * K, 0.7f);
    fill(st, per * n_rows, 2.0f);
    memcpy(st_ref, st, sizeof(float) * per * n_rows);
    for (int r = 0; r < n_rows; r++) {
        float *s = st_ref + per * r;
        const float *x = in + (size_t)rt[r] * D;
        int n = lens[r];
        for (int i = 0; i < n; i++)
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j < K; j++) {
                    int src = i - (K - 1) + j;
                    float v = src >= 0 ? x[(size_t)src * D + d] : s[(size_t)(K - 1 + src) * D + d];
                    acc += (double)w[(size_t)d * K + j] * v;
                }
                ref[((size_t)rt[r] + i) * D + d] = (float)lin_silu_ref(acc);
            }
        for (int j = 0; j < K - 1; j++) {
            int src = n - (K - 1) + j;
            if (src < 0) memmove(s + (size_t)j * D, s + (size_t)(j + n) * D, sizeof(float) * D);
            else memcpy(s + (size_t)j * D, x + (size_t)src * D, sizeof(float) * D);
        }
    }
    float *din = up(in, sizeof(float) * (size_t)T * D), *dw = up(w, sizeof(float) * (size_t)D * K);
    float *dout = NULL, *dst = NULL, **dptr = NULL;
    int32_t *drt = up(rt, sizeof(int32_t) * (size_t)(n_rows + 1));
    int ok = 0;
    loom_status s = loom_cuda_alloc(C, (void **)&dout, sizeof(float) * (size_t)T * D);
    if (s == LOOM_OK && (!din || !dw || !drt || !lin_states_up(st, n_rows, per, off, &dst, &dptr)))
        s = LOOM_ERR_NOMEM;
    if (s == LOOM_OK) s = loom_cuda_lin_conv(C, dout, din, dw, K, D, T, n_rows, drt, dptr, off);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dout, sizeof(float) * (size_t)T * D);
    if (s == LOOM_OK && !lin_states_down(st_got, n_rows, per, off, dst)) s = LOOM_ERR_INTERNAL;
    if (s != LOOM_OK) {
        api_fail("lin_conv", what, s);
    } else {
        ok = report("lin_conv", what, got, ref, NULL, (size_t)T * D, 1e-6f, 1e-5f);
        char w2[120];
        snprintf(w2, sizeof w2, "%s state", what);
        ok &= report("lin_conv", w2, st_got, st_ref, NULL, per * n_rows, 0, 0);
    }
    loom_cuda_release(C, din);
    loom_cuda_release(C, dw);
    loom_cuda_release(C, dout);
    loom_cuda_release(C, dst);
    loom_cuda_release(C, dptr);
    loom_cuda_release(C, drt);
    free(rt), free(in), free(w), free(st), free(st_ref), free(st_got), free(ref), free(got);
    return ok;
}

/* q/k L2 norms in place, beta and decay, against linear_attn.c's. */
static int test_lin_prep(int T, int nk, int dk, int nv, int dv) {
    char what[96];
    snprintf(what, sizeof what, "T=%d nk=%d dk=%d nv=%d dv=%d", T, nk, dk, nv, dv);
    int D = 2 * nk * dk + nv * dv;
    size_t N = (size_t)T * D, NV = (size_t)T * nv;
    float *x = xmalloc(N * 4), *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    float *b = xmalloc(NV * 4), *a = xmalloc(NV * 4), *na = xmalloc((size_t)nv * 4);
    float *dtb = xmalloc((size_t)nv * 4), *rb = xmalloc(NV * 4), *rg = xmalloc(NV * 4);
    float *gb = xmalloc(NV * 4), *gg = xmalloc(NV * 4);
    fill(x, N, 1.5f);
    fill(b, NV, 3.0f);
    fill(a, NV, 12.0f);  /* reaches softplus's x > 20 branch with dt_bias */
    fill(dtb, (size_t)nv, 10.0f);
    for (int h = 0; h < nv; h++) na[h] = -expf(rnd());
    memcpy(ref, x, N * 4);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < 2 * nk; h++) {
            float *v = ref + (size_t)t * D + (size_t)h * dk;
            double ss = 0;
            for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
            double inv = 1.0 / sqrt(ss + 1e-6);
            if (h < nk) inv *= 1.0 / sqrt((double)dk);
            for (int i = 0; i < dk; i++) v[i] = (float)(v[i] * inv);
        }
        for (int h = 0; h < nv; h++) {
            size_t i = (size_t)t * nv + h;
            double z = (double)a[i] + dtb[h];
            rb[i] = (float)(1.0 / (1.0 + exp(-(double)b[i])));
            rg[i] = (float)(na[h] * (z > 20.0 ? z : log1p(exp(z))));
        }
    }
    float *dx = up(x, N * 4), *db = up(b, NV * 4), *da = up(a, NV * 4), *dna = up(na, (size_t)nv * 4);
    float *ddt = up(dtb, (size_t)nv * 4), *dbeta = NULL, *dg = NULL;
    loom_status s = loom_cuda_alloc(C, (void **)&dbeta, NV * 4);
    if (s == LOOM_OK) s = loom_cuda_alloc(C, (void **)&dg, NV * 4);
    if (s == LOOM_OK && (!dx || !db || !da || !dna || !ddt)) s = LOOM_ERR_NOMEM;
    if (s == LOOM_OK) s = loom_cuda_lin_prep(C, dx, dbeta, dg, db, da, dna, ddt, T, D, nk, dk, nv);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dx, N * 4);
    if (s == LOOM_OK) s = loom_cuda_download(C, gb, dbeta, NV * 4);
    if (s == LOOM_OK) s = loom_cuda_download(C, gg, dg, NV * 4);
    int ok = 0;
    if (s != LOOM_OK) {
        api_fail("lin_prep", what, s);
    } else {
        ok = report("lin_prep", what, got, ref, NULL, N, 1e-7f, 1e-6f);
        char w2[120];
        snprintf(w2, sizeof w2, "%s beta", what);
        ok &= report("lin_prep", w2, gb, rb, NULL, NV, 1e-7f, 1e-6f);
        snprintf(w2, sizeof w2, "%s decay", what);
        ok &= report("lin_prep", w2, gg, rg, NULL, NV, 1e-7f, 1e-6f);
    }
    void *ds[] = {dx, db, da, dna, ddt, dbeta, dg};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) loom_cuda_release(C, ds[i]);
    free(x), free(ref), free(got), free(b), free(a), free(na), free(dtb), free(rb), free(rg);
    free(gb), free(gg);
    return ok;
}

/* Random inputs of the delta rule (qkv (T, D) with unit q and k heads, as
 * lin_prep leaves them; beta, g (T, nv); states (n_rows, per), zero
 * unless st_scale) and linear_attn.c's delta_step token by token (double)
 * over them: ref (T, nv, dv) and st_ref. */
static void lin_delta_case(int nk, int nv, int dk, int dv, const int32_t *rt, int n_rows, int D,
                           float st_scale, float *qkv, float *beta, float *g, float *st,
                           float *ref, float *st_ref) {
    int T = rt[n_rows], rep = nv / nk;
    size_t per = (size_t)nv * dk * dv;
    double *S = xmalloc(sizeof(double) * (size_t)dk * dv), *tmp = xmalloc(sizeof(double) * (size_t)dv);
    fill(qkv, (size_t)T * D, 1.0f);
    for (int t = 0; t < T; t++)  /* unit q and k, as lin_prep leaves them */
        for (int h = 0; h < 2 * nk; h++) {
            float *v = qkv + (size_t)t * D + (size_t)h * dk;
            double ss = 0;
            for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
            for (int i = 0; i < dk; i++) v[i] = (float)(v[i] / sqrt(ss + 1e-6));
        }
    for (size_t i = 0; i < (size_t)T * nv; i++) {
        beta[i] = 0.5f + 0.5f * rnd();
        g[i] = -0.3f * fabsf(rnd());
    }
    if (st_scale > 0) fill(st, per * n_rows, st_scale);
    else memset(st, 0, sizeof(float) * per * n_rows);
    for (int r = 0; r < n_rows; r++)
        for (int h = 0; h < nv; h++) {
            int kh = h / rep;
            for (int i = 0; i < dk * dv; i++) S[i] = st[per * r + (size_t)h * dk * dv + i];
            for (int t = rt[r]; t < rt[r + 1]; t++) {
                const float *x = qkv + (size_t)t * D;
                const float *q = x + (size_t)kh * dk, *k = x + (size_t)(nk + kh) * dk;
                const float *v = x + (size_t)2 * nk * dk + (size_t)h * dv;
                double decay = exp((double)g[(size_t)t * nv + h]), bt = beta[(size_t)t * nv + h];
                for (int i = 0; i < dk * dv; i++) S[i] *= decay;
                for (int bb = 0; bb < dv; bb++) tmp[bb] = 0;
                for (int aa = 0; aa < dk; aa++)
                    for (int bb = 0; bb < dv; bb++) tmp[bb] += S[aa * dv + bb] * k[aa];
                for (int bb = 0; bb < dv; bb++) tmp[bb] = (v[bb] - tmp[bb]) * bt;
                for (int aa = 0; aa < dk; aa++)
                    for (int bb = 0; bb < dv; bb++) S[aa * dv + bb] += k[aa] * tmp[bb];
                for (int bb = 0; bb < dv; bb++) {
                    double acc = 0;
                    for (int aa = 0; aa < dk; aa++) acc += S[aa * dv + bb] * q[aa];
                    ref[((size_t)t * nv + h) * dv + bb] = (float)acc;
                }
            }
            for (int i = 0; i < dk * dv; i++) st_ref[per * r + (size_t)h * dk * dv + i] = (float)S[i];
        }
    free(S), free(tmp);
}

/* The gated delta rule along rows of lens[] tokens from random states,
 * against linear_attn.c's delta_step token by token (double): outputs and
 * the states after. */
static int test_lin_delta(int nk, int nv, int dk, int dv, const int *lens, int n_rows) {
    char what[96];
    int T;
    int32_t *rt = lin_rtok(lens, n_rows, &T);
    snprintf(what, sizeof what, "nk=%d nv=%d dk=%d dv=%d rows=%d T=%d", nk, nv, dk, dv, n_rows, T);
    int D = 2 * nk * dk + nv * dv + 3;  /* 3: a wider row than q|k|v */
    size_t per = (size_t)nv * dk * dv, off = 11, NO = (size_t)T * nv * dv;
    float *qkv = xmalloc(sizeof(float) * (size_t)T * D), *beta = xmalloc(sizeof(float) * (size_t)T * nv);
    float *g = xmalloc(sizeof(float) * (size_t)T * nv), *st = xmalloc(sizeof(float) * per * n_rows);
    float *st_ref = xmalloc(sizeof(float) * per * n_rows), *st_got = xmalloc(sizeof(float) * per * n_rows);
    float *ref = xmalloc(sizeof(float) * NO), *got = xmalloc(sizeof(float) * NO);
    lin_delta_case(nk, nv, dk, dv, rt, n_rows, D, 0.5f, qkv, beta, g, st, ref, st_ref);
    float *dqkv = up(qkv, sizeof(float) * (size_t)T * D), *dbeta = up(beta, sizeof(float) * (size_t)T * nv);
    float *dg = up(g, sizeof(float) * (size_t)T * nv), *dout = NULL, *dst = NULL, **dptr = NULL;
    int32_t *drt = up(rt, sizeof(int32_t) * (size_t)(n_rows + 1));
    loom_status s = loom_cuda_alloc(C, (void **)&dout, sizeof(float) * NO);
    if (s == LOOM_OK && (!dqkv || !dbeta || !dg || !drt || !lin_states_up(st, n_rows, per, off, &dst, &dptr)))
        s = LOOM_ERR_NOMEM;
    if (s == LOOM_OK)
        s = loom_cuda_lin_delta(C, dout, dqkv, dbeta, dg, n_rows, drt, dptr, off, D, nk, nv, dk, dv);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dout, sizeof(float) * NO);
    if (s == LOOM_OK && !lin_states_down(st_got, n_rows, per, off, dst)) s = LOOM_ERR_INTERNAL;
    int ok = 0;
    if (s != LOOM_OK) {
        api_fail("lin_delta", what, s);
    } else {
        ok = report("lin_delta", what, got, ref, NULL, NO, 1e-6f, 1e-5f);
        char w2[120];
        snprintf(w2, sizeof w2, "%s state", what);
        ok &= report("lin_delta", w2, st_got, st_ref, NULL, per * n_rows, 1e-6f, 1e-5f);
    }
    void *ds[] = {dqkv, dbeta, dg, dout, dst, dptr, drt};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) loom_cuda_release(C, ds[i]);
    free(rt), free(qkv), free(beta), free(g), free(st), free(st_ref), free(st_got), free(ref);
    free(got);
    return ok;
}

/* The chunked delta rule (rows of chunk_min tokens or more; shorter ones
 * token by token) against the same reference, outputs and states after,
 * from random states or (st_scale 0) zero ones; then against the
 * token-by-token kernel on the same inputs. Both kernels compute in
 * double and round once to f32, so the tolerance is lin_delta's. The
 * state's padding before each row's part must come back untouched. */
static int test_lin_delta_chunked(int nk, int nv, int dk, int dv, const int *lens, int n_rows,
                                  float st_scale, int chunk_min) {
    char what[120];
    int T, max_n = 0;
    int32_t *rt = lin_rtok(lens, n_rows, &T);
    for (int r = 0; r < n_rows; r++) max_n = lens[r] > max_n ? lens[r] : max_n;
    snprintf(what, sizeof what, "nk=%d nv=%d dk=%d dv=%d T=%d max=%d%s min=%d", nk, nv, dk, dv,
             T, max_n, st_scale > 0 ? "" : " S0=0", chunk_min);
    int D = 2 * nk * dk + nv * dv + 5;
    size_t per = (size_t)nv * dk * dv, off = 7, NO = (size_t)T * nv * dv, NS = per * n_rows;
    float *qkv = xmalloc(sizeof(float) * (size_t)T * D), *beta = xmalloc(sizeof(float) * (size_t)T * nv);
    float *g = xmalloc(sizeof(float) * (size_t)T * nv), *st = xmalloc(sizeof(float) * NS);
    float *st_ref = xmalloc(sizeof(float) * NS), *st_got = xmalloc(sizeof(float) * NS);
    float *st_seq = xmalloc(sizeof(float) * NS), *ref = xmalloc(sizeof(float) * NO);
    float *got = xmalloc(sizeof(float) * NO), *seq = xmalloc(sizeof(float) * NO);
    float *pad = xmalloc(sizeof(float) * (off + per) * n_rows);
    lin_delta_case(nk, nv, dk, dv, rt, n_rows, D, st_scale, qkv, beta, g, st, ref, st_ref);
    float *dqkv = up(qkv, sizeof(float) * (size_t)T * D), *dbeta = up(beta, sizeof(float) * (size_t)T * nv);
    float *dg = up(g, sizeof(float) * (size_t)T * nv), *dout = NULL, *dst = NULL, **dptr = NULL;
    float *dst2 = NULL, **dptr2 = NULL;
    int32_t *drt = up(rt, sizeof(int32_t) * (size_t)(n_rows + 1));
    loom_status s = loom_cuda_alloc(C, (void **)&dout, sizeof(float) * NO);
    if (s == LOOM_OK && (!dqkv || !dbeta || !dg || !drt || !lin_states_up(st, n_rows, per, off, &dst, &dptr) ||
                         !lin_states_up(st, n_rows, per, off, &dst2, &dptr2)))
        s = LOOM_ERR_NOMEM;
    /* NaN outputs before: every one must be written */
    for (size_t i = 0; i < NO; i++) got[i] = NAN;
    if (s == LOOM_OK) s = loom_cuda_upload(C, dout, got, sizeof(float) * NO);
    if (s == LOOM_OK)
        s = loom_cuda_lin_delta_chunked(C, dout, dqkv, dbeta, dg, T, n_rows, max_n, drt, dptr, off,
                                        D, nk, nv, dk, dv, chunk_min);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dout, sizeof(float) * NO);
    if (s == LOOM_OK && !lin_states_down(st_got, n_rows, per, off, dst)) s = LOOM_ERR_INTERNAL;
    if (s == LOOM_OK)
        s = loom_cuda_download(C, pad, dst, sizeof(float) * (off + per) * n_rows);
    if (s == LOOM_OK)
        s = loom_cuda_lin_delta(C, dout, dqkv, dbeta, dg, n_rows, drt, dptr2, off, D, nk, nv, dk, dv);
    if (s == LOOM_OK) s = loom_cuda_download(C, seq, dout, sizeof(float) * NO);
    if (s == LOOM_OK && !lin_states_down(st_seq, n_rows, per, off, dst2)) s = LOOM_ERR_INTERNAL;
    int ok = 0;
    if (s != LOOM_OK) {
        api_fail("lin_chunked", what, s);
    } else {
        char w2[160];
        ok = report("lin_chunked", what, got, ref, NULL, NO, 1e-6f, 1e-5f);
        snprintf(w2, sizeof w2, "%s state", what);
        ok &= report("lin_chunked", w2, st_got, st_ref, NULL, NS, 1e-6f, 1e-5f);
        snprintf(w2, sizeof w2, "%s vs seq", what);
        ok &= report("lin_chunked", w2, got, seq, NULL, NO, 1e-6f, 1e-5f);
        snprintf(w2, sizeof w2, "%s vs seq state", what);
        ok &= report("lin_chunked", w2, st_got, st_seq, NULL, NS, 1e-6f, 1e-5f);
        int pad_ok = 1;
        for (int r = 0; r < n_rows; r++)
            for (size_t i = 0; i < off; i++) pad_ok &= pad[(size_t)r * (off + per) + i] == -7.0f;
        printf("%s  %-14s %-44s\n", pad_ok ? "PASS" : "FAIL", "lin_chunked", "state padding kept");
        pad_ok ? n_pass++ : n_fail++;
        ok &= pad_ok;
    }
    void *ds[] = {dqkv, dbeta, dg, dout, dst, dptr, dst2, dptr2, drt};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) loom_cuda_release(C, ds[i]);
    free(rt), free(qkv), free(beta), free(g), free(st), free(st_ref), free(st_got), free(st_seq);
    free(ref), free(got), free(seq), free(pad);
    return ok;
}

/* rmsnorm(o) * w * silu(z) per (token, value head). */
static int test_lin_gated_norm(int T, int nv, int dv) {
    char what[96];
    snprintf(what, sizeof what, "T=%d nv=%d dv=%d", T, nv, dv);
    size_t N = (size_t)T * nv * dv;
    float *o = xmalloc(N * 4), *z = xmalloc(N * 4), *w = xmalloc((size_t)dv * 4);
    float *ref = xmalloc(N * 4), *got = xmalloc(N * 4);
    fill(o, N, 0.01f);  /* small outputs: the norm scales them up */
    fill(z, N, 3.0f);
    fill(w, (size_t)dv, 1.0f);
    for (size_t r = 0; r < (size_t)T * nv; r++) {
        double ss = 0;
        for (int i = 0; i < dv; i++) ss += (double)o[r * dv + i] * o[r * dv + i];
        double inv = 1.0 / sqrt(ss / dv + 1e-6);
        for (int i = 0; i < dv; i++)
            ref[r * dv + i] = (float)(o[r * dv + i] * inv * w[i] * lin_silu_ref(z[r * dv + i]));
    }
    float *d_o = up(o, N * 4), *dz = up(z, N * 4), *dw = up(w, (size_t)dv * 4), *dy = NULL;
    loom_status s = loom_cuda_alloc(C, (void **)&dy, N * 4);
    if (s == LOOM_OK && (!d_o || !dz || !dw)) s = LOOM_ERR_NOMEM;
    if (s == LOOM_OK) s = loom_cuda_lin_gated_norm(C, dy, d_o, dz, dw, T, nv, dv, 1e-6f);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dy, N * 4);
    int ok = 0;
    if (s != LOOM_OK) api_fail("lin_gated_norm", what, s);
    else ok = report("lin_gated_norm", what, got, ref, NULL, N, 1e-6f, 1e-5f);
    void *ds[] = {d_o, dz, dw, dy};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) loom_cuda_release(C, ds[i]);
    free(o), free(z), free(w), free(ref), free(got);
    return ok;
}

/* Qwen3-Next's grouped projections into [q | k | v], z, b and a (exact). */
static int test_lin_split(int T, int nk, int dk, int rep, int dv) {
    char what[96];
    snprintf(what, sizeof what, "T=%d nk=%d dk=%d rep=%d dv=%d", T, nk, dk, rep, dv);
    int nv = nk * rep, D = 2 * nk * dk + nv * dv, gw = 2 * dk + 2 * rep * dv, W = nk * gw;
    size_t NQ = (size_t)T * D, NZ = (size_t)T * nv * dv, NB = (size_t)T * nv;
    float *raw = xmalloc(sizeof(float) * (size_t)T * W), *rba = xmalloc(sizeof(float) * NB * 2);
    float *ref = xmalloc(sizeof(float) * (NQ + NZ + 2 * NB)), *got = xmalloc(sizeof(float) * (NQ + NZ + 2 * NB));
    fill(raw, (size_t)T * W, 1.0f);
    fill(rba, NB * 2, 1.0f);
    float *rq = ref, *rz = ref + NQ, *rb = rz + NZ, *ra = rb + NB;
    for (int t = 0; t < T; t++)
        for (int g = 0; g < nk; g++) {
            const float *src = raw + (size_t)t * W + (size_t)g * gw;
            float *q = rq + (size_t)t * D;
            memcpy(q + (size_t)g * dk, src, sizeof(float) * dk);
            memcpy(q + (size_t)(nk + g) * dk, src + dk, sizeof(float) * dk);
            memcpy(q + (size_t)2 * nk * dk + (size_t)g * rep * dv, src + 2 * dk, sizeof(float) * rep * dv);
            memcpy(rz + (size_t)t * nv * dv + (size_t)g * rep * dv, src + 2 * dk + rep * dv,
                   sizeof(float) * rep * dv);
            for (int i = 0; i < rep; i++) {
                const float *sb = rba + (size_t)t * 2 * nv + (size_t)g * 2 * rep;
                rb[(size_t)t * nv + g * rep + i] = sb[i];
                ra[(size_t)t * nv + g * rep + i] = sb[rep + i];
            }
        }
    float *draw = up(raw, sizeof(float) * (size_t)T * W), *dba = up(rba, sizeof(float) * NB * 2);
    float *dout = NULL;
    loom_status s = loom_cuda_alloc(C, (void **)&dout, sizeof(float) * (NQ + NZ + 2 * NB));
    if (s == LOOM_OK && (!draw || !dba)) s = LOOM_ERR_NOMEM;
    if (s == LOOM_OK) s = loom_cuda_memset0(C, dout, sizeof(float) * (NQ + NZ + 2 * NB));
    if (s == LOOM_OK)
        s = loom_cuda_lin_split(C, dout, dout + NQ, dout + NQ + NZ, dout + NQ + NZ + NB, draw, dba,
                                T, nk, dk, rep, dv, D);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dout, sizeof(float) * (NQ + NZ + 2 * NB));
    int ok = 0;
    if (s != LOOM_OK) api_fail("lin_split", what, s);
    else ok = report("lin_split", what, got, ref, NULL, NQ + NZ + 2 * NB, 0, 0);
    loom_cuda_release(C, draw);
    loom_cuda_release(C, dba);
    loom_cuda_release(C, dout);
    free(raw), free(rba), free(ref), free(got);
    return ok;
}

/* Gated attention: [query | gate] per head split (exact), then
 * x *= sigmoid(gate) as forward.c does it in f32. */
static int test_attn_gate(int T, int nh, int hd) {
    char what[96];
    snprintf(what, sizeof what, "T=%d nh=%d hd=%d", T, nh, hd);
    size_t N = (size_t)T * nh * hd;
    float *raw = xmalloc(N * 8), *x = xmalloc(N * 4), *ref = xmalloc(N * 12), *got = xmalloc(N * 12);
    fill(raw, 2 * N, 4.0f);
    fill(x, N, 2.0f);
    for (size_t th = 0; th < (size_t)T * nh; th++)
        for (int k = 0; k < hd; k++) {
            ref[th * hd + k] = raw[th * 2 * hd + k];
            ref[N + th * hd + k] = raw[th * 2 * hd + hd + k];
        }
    for (size_t i = 0; i < N; i++) ref[2 * N + i] = x[i] * (1.0f / (1.0f + expf(-ref[N + i])));
    float *draw = up(raw, N * 8), *dout = NULL;
    loom_status s = loom_cuda_alloc(C, (void **)&dout, N * 12);
    if (s == LOOM_OK && !draw) s = LOOM_ERR_NOMEM;
    if (s == LOOM_OK) s = loom_cuda_upload(C, dout + 2 * N, x, N * 4);
    if (s == LOOM_OK) s = loom_cuda_attn_gate_split(C, dout, dout + N, draw, T, nh, hd);
    if (s == LOOM_OK) s = loom_cuda_attn_gate_mul(C, dout + 2 * N, dout + N, N);
    if (s == LOOM_OK) s = loom_cuda_download(C, got, dout, N * 12);
    int ok = 0;
    if (s != LOOM_OK) {
        api_fail("attn_gate", what, s);
    } else {
        ok = report("attn_gate", what, got, ref, NULL, 2 * N, 0, 0);
        char w2[120];
        snprintf(w2, sizeof w2, "%s mul", what);
        ok &= report("attn_gate", w2, got + 2 * N, ref + 2 * N, NULL, N, 1e-7f, 1e-6f);
    }
    loom_cuda_release(C, draw);
    loom_cuda_release(C, dout);
    free(raw), free(x), free(ref), free(got);
    return ok;
}

static void test_lin_all(void) {
    /* conv: decode (one token, fewer than K - 1), a batch of decode rows,
     * prefill rows shorter and longer than the kernel, kernel 1 and 2 */
    int l1[] = {1}, l3[] = {1, 1, 1}, l4[] = {5, 1, 2, 70}, l2[] = {3, 130};
    test_lin_conv(4, 37, l1, 1);
    test_lin_conv(4, 8192, l3, 3);
    test_lin_conv(4, 37, l4, 4);
    test_lin_conv(2, 300, l4, 4);
    test_lin_conv(1, 33, l2, 2);
    test_lin_conv(5, 1000, l2, 2);
    test_lin_prep(1, 2, 16, 4, 16);
    test_lin_prep(37, 3, 33, 6, 20);
    test_lin_prep(5, 16, 128, 32, 128);
    /* the fixtures' shape, Qwen3.5/Next's (dk = dv = 128, 16 key heads of
     * 32 value heads), odd dims (columns past a block, key entries not a
     * multiple of the lanes), decode batches and long rows */
    int d1[] = {1, 1}, d2[] = {40, 3}, d3[] = {17, 1, 9}, d4[] = {1}, d5[] = {300};
    int d6[] = {5, 0, 7, 0};  /* rows of no tokens keep their state (the last one at the end) */
    test_lin_delta(2, 4, 16, 16, d2, 2);
    test_lin_delta(2, 4, 16, 16, d1, 2);
    test_lin_delta(16, 32, 128, 128, d1, 2);
    test_lin_delta(2, 4, 128, 128, d2, 2);
    test_lin_delta(1, 3, 33, 45, d3, 3);
    test_lin_delta(3, 3, 100, 70, d4, 1);
    test_lin_delta(2, 8, 64, 33, d5, 1);
    test_lin_delta(2, 4, 16, 16, d6, 4);
    /* chunked: lengths around the chunk (1, 17, 63, 64, 65, 130, 257),
     * several heads, odd dims, mixed rows (short ones token by token),
     * zero and random initial states, the models' shape */
    static const int cl[] = {1, 17, 63, 64, 65, 130, 257};
    for (size_t i = 0; i < sizeof cl / sizeof cl[0]; i++) {
        test_lin_delta_chunked(2, 4, 16, 16, &cl[i], 1, 0.5f, 1);
        test_lin_delta_chunked(1, 3, 33, 45, &cl[i], 1, 0.0f, 1);
    }
    int c2[] = {130, 1, 65, 17}, c3[] = {257, 63}, c4[] = {200};
    test_lin_delta_chunked(2, 4, 128, 128, cl, 7, 0.5f, 1);
    test_lin_delta_chunked(3, 6, 100, 70, c2, 4, 0.5f, 64);
    test_lin_delta_chunked(3, 6, 100, 70, c2, 4, 0.0f, 64);
    test_lin_delta_chunked(2, 8, 64, 33, c3, 2, 0.5f, 100);
    test_lin_delta_chunked(16, 32, 128, 128, c4, 1, 0.5f, 64);
    test_lin_delta_chunked(16, 32, 128, 128, c3, 2, 0.0f, 64);
    test_lin_gated_norm(3, 4, 16);
    test_lin_gated_norm(17, 5, 45);
    test_lin_gated_norm(2, 32, 128);
    test_lin_gated_norm(1, 3, 300);
    test_lin_split(1, 2, 16, 2, 16);
    test_lin_split(7, 3, 33, 3, 20);
    test_lin_split(4, 16, 128, 2, 128);
    test_attn_gate(1, 4, 32);
    test_attn_gate(9, 3, 33);
    test_attn_gate(64, 16, 256);
}

int main(void) {
    loom_status st = loom_cuda_create(0, &C);
    if (st != LOOM_OK) {
        printf("FAIL  cuda_create  %s: %s\n", loom_status_str(st), loom_last_error());
        return 1;
    }
    setenv("LOOM_CUDA_GEMV_MMA", "9", 1);
    loom_status st2 = loom_cuda_create(0, &C_fma);
    setenv("LOOM_CUDA_GEMV_MMA", "1", 1);
    if (st2 == LOOM_OK) st2 = loom_cuda_create(0, &C_mma);
    unsetenv("LOOM_CUDA_GEMV_MMA");
    for (int v = 0; v < GV_VARIANTS && st2 == LOOM_OK; v++) {
        setenv("LOOM_CUDA_GEMV_MMA", "9", 1);
        setenv("LOOM_CUDA_GEMV_KS", GV_VAR[v][1], 1);
        setenv("LOOM_CUDA_GEMV_U", GV_VAR[v][2], 1);
        setenv("LOOM_CUDA_GEMV_BPS", GV_VAR[v][3], 1);
        setenv("LOOM_CUDA_GEMV_PRE2", GV_VAR[v][4], 1);
        setenv("LOOM_CUDA_GEMV_W", GV_VAR[v][5], 1);
        setenv("LOOM_CUDA_GEMV_NP", GV_VAR[v][6], 1);
        st2 = loom_cuda_create(0, &C_gv[v]);
    }
    unsetenv("LOOM_CUDA_GEMV_PRE2");
    unsetenv("LOOM_CUDA_GEMV_W");
    unsetenv("LOOM_CUDA_GEMV_NP");
    for (int v = 0; v < ATT_VARIANTS && st2 == LOOM_OK; v++) {
        setenv("LOOM_CUDA_ATTN_SPLIT", ATT_VAR[v][1], 1);
        setenv("LOOM_CUDA_ATTN_CLUSTER", ATT_VAR[v][2], 1);
        st2 = loom_cuda_create(0, &C_att[v]);
    }
    unsetenv("LOOM_CUDA_ATTN_SPLIT");
    unsetenv("LOOM_CUDA_ATTN_CLUSTER");
    if (st2 == LOOM_OK) {
        setenv("LOOM_CUDA_FA_MT", "1", 1);
        st2 = loom_cuda_create(0, &C_fa1);
        unsetenv("LOOM_CUDA_FA_MT");
    }
    unsetenv("LOOM_CUDA_GEMV_MMA");
    unsetenv("LOOM_CUDA_GEMV_KS");
    unsetenv("LOOM_CUDA_GEMV_U");
    unsetenv("LOOM_CUDA_GEMV_BPS");
    if (st2 != LOOM_OK) {
        printf("FAIL  cuda_create  %s: %s\n", loom_status_str(st2), loom_last_error());
        return 1;
    }
    printf("device: %s (compute capability %d.%d)\n", loom_cuda_device_name(C),
           loom_cuda_device_cc(C) / 10, loom_cuda_device_cc(C) % 10);
    fflush(stdout);

    for (int i = 0; i < N_SIZES; i++)
        for (int mode = 0; mode < 3; mode++) test_rmsnorm(SIZES[i], i == 0 ? 1 : 3, mode);
    test_rmsnorm(128, 7 * 40, 0);  /* per-head q norm shape */
    for (int i = 0; i < N_SIZES; i++) test_rmsnorm_add(SIZES[i], i == 0 ? 1 : 5, i % 2);
    test_rmsnorm_add(2304, 3, 1);  /* gemma2-2b hidden size */

    test_rope(1, 1, 2, 2, 10000.0);
    test_rope(7, 3, 64, 64, 10000.0);
    test_rope(5, 4, 128, 32, 1000000.0);  /* partial rotary */
    test_rope(33, 2, 10, 6, 500.0);
    test_rope(3, 8, 256, 64, 10000.0);
    test_rope_table(1, 128, 1000000.0, 1.0, 0);
    test_rope_table(37, 64, 10000.0, 1.0, 0);
    test_rope_table(300, 6, 500.0, 0.5, 0);
    test_rope_table(1, 128, 1000000.0, 1.0, 1);
    test_rope_table(45, 128, 1000000.0, 1.0, 1);
    test_rope_table(200, 22, 10000.0, 0.5, 1);
    test_qkv_post(1, 16, 8, 128, 128, 1, 0, LOOM_KV_BF16);   /* Qwen3-0.6B decode */
    test_qkv_post(7, 32, 8, 128, 128, 0, 0, LOOM_KV_BF16);   /* Llama-3-8B */
    test_qkv_post(33, 12, 4, 64, 32, 1, 1, LOOM_KV_F16);     /* partial rotary, biases */
    test_qkv_post(3, 4, 2, 256, 128, 1, 1, LOOM_KV_BF16);    /* 2 elements a thread */
    test_qkv_post(2, 6, 2, 80, 80, 1, 0, LOOM_KV_F32);       /* head_dim 80 over 64 threads */
    test_qkv_post(5, 4, 4, 80, 80, 0, 1, LOOM_KV_F32);
    test_qkv_post(300, 8, 2, 256, 64, 1, 0, LOOM_KV_F32);
    /* head_dim 128 a warp a head: head counts not a multiple of 4, biases
     * with norms, f16 / f32 KV, no rope */
    test_qkv_post(37, 14, 3, 128, 128, 1, 1, LOOM_KV_F16);
    test_qkv_post(5, 6, 1, 128, 128, 1, 1, LOOM_KV_F32);
    test_qkv_post(9, 4, 4, 128, 0, 1, 0, LOOM_KV_BF16);
    test_qkv_post(600, 32, 8, 128, 128, 0, 0, LOOM_KV_BF16);
    /* bf16 rows in (the q/k/v GEMM's bf16 output): warp and block kernels */
    test_qkv_post_in(600, 32, 8, 128, 128, 0, 0, LOOM_KV_BF16, 1);
    test_qkv_post_in(37, 14, 3, 128, 128, 1, 1, LOOM_KV_F16, 1);
    test_qkv_post_in(33, 12, 4, 64, 32, 1, 1, LOOM_KV_BF16, 1);
    test_qkv_post_in(3, 4, 2, 256, 128, 1, 0, LOOM_KV_F32, 1);
    test_qkv_post_in(5, 6, 2, 80, 80, 1, 1, LOOM_KV_BF16, 1);

    for (int i = 0; i < N_SIZES; i++) {
        test_act(SIZES[i], 0);
        test_act(SIZES[i], 1);
    }
    /* one layer's slice of Gemma 4's per-layer inputs (P 16 and 256 of 6 and 35 layers) */
    test_act_ld(7, 16, 96, 80, 1);
    test_act_ld(33, 256, 35 * 256, 17 * 256, 1);
    test_act_ld(1, 33, 100, 5, 0);
    test_act_ld_limits();
    for (int i = 0; i < N_SIZES; i++) {
        test_scale((size_t)SIZES[i], 0);
        test_scale((size_t)SIZES[i], 1);
    }
    test_act_split(1, 3072, 0);
    test_act_split(7, 33, 1);
    test_act_split(33, 1000, 0);
    test_act_split(5, 4097, 1);
    for (int dt = 1; dt < 3; dt++) {
        test_act_split16(1, 3072, 0, (loom_cuda_dtype)dt);
        test_act_split16(7, 33, 1, (loom_cuda_dtype)dt);
        test_act_split16(33, 1000, 0, (loom_cuda_dtype)dt);
        test_act_split16(5, 1024, 1, (loom_cuda_dtype)dt);  /* gelu, 4 a thread */
        if (dt == LOOM_CUDA_BF16) {  /* bf16 gate/up in */
            test_act_split16_in(33, 1000, 0, LOOM_CUDA_BF16, 1);
            test_act_split16_in(3, 3072, 1, LOOM_CUDA_BF16, 1);
        }
        test_add_rmsnorm16(1, 1024, 0, (loom_cuda_dtype)dt);
        test_add_rmsnorm16(7, 4096, 1, (loom_cuda_dtype)dt);
        test_add_rmsnorm16(33, 1000, 1, (loom_cuda_dtype)dt);
        test_add_rmsnorm16(3, 7, 1, (loom_cuda_dtype)dt);
    }

    for (int i = 0; i < N_SIZES; i++)
        for (int dt = 0; dt < 3; dt++) test_embed(SIZES[i], (loom_cuda_dtype)dt);

    for (int i = 0; i < N_SIZES; i++) test_softmax(SIZES[i], 3);
    test_softmax(151936, 2);  /* a vocabulary row */
    for (int i = 0; i < N_SIZES; i++) test_argmax(SIZES[i], 4);
    test_argmax(151936, 5);
    test_sample(33, 1000, 0.7f, 40, 0.9f, 0.0f);
    test_sample(5, 151936, 1.0f, 64, 1.0f, 0.05f);
    test_sample(17, 4097, 1.3f, 5, 0.5f, 0.0f);
    test_sample(9, 777, 0.5f, 1, 1.0f, 0.0f);
    test_sample(8, 128256, 0.8f, 20, 0.95f, 0.02f);
    test_sample(1, 151936, 0.8f, 40, 0.95f, 0.0f);  /* one row: every slice a block */
    test_sample(3, 8193, 1.0f, 64, 1.0f, 0.0f);     /* three uneven slices */
    test_sample(2, 3, 1.0f, 64, 1.0f, 0.0f);        /* top_k past the vocabulary */

    static const int shapes[][3] = {{1, 1, 1},    {1, 7, 33},    {7, 33, 1000},
                                    {5, 1000, 4097}, {33, 4097, 7}, {1, 4096, 1024},
                                    {64, 512, 640}};
    for (int dt = 0; dt < 3; dt++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            test_gemm((loom_cuda_dtype)dt, shapes[i][0], shapes[i][1], shapes[i][2]);
    for (int dt = 1; dt < 3; dt++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            test_gemm16((loom_cuda_dtype)dt, shapes[i][0], shapes[i][1], shapes[i][2]);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_gemm16_out(LOOM_CUDA_BF16, shapes[i][0], shapes[i][1], shapes[i][2], 1);

    /* the decode GEMV: odd row counts, every token count, each input mode,
     * the benchmark models' shapes and several row groups per warp */
    static const int gv_shapes[][3] = {{1, 1, 8},      {2, 7, 24},      {3, 33, 1000},
                                       {5, 1001, 256}, {8, 4097, 1024}, {3, 37, 14336},
                                       {6, 30001, 64}, {7, 129, 4096},  {1, 40001, 1024},
                                       {1, 1024, 3072}, {2, 1111, 4096}, {1, 333, 4104}};
    for (int dt = 1; dt < 3; dt++)
        for (size_t i = 0; i < sizeof gv_shapes / sizeof gv_shapes[0]; i++)
            for (int mode = 0; mode < 5; mode++)
                test_gemv((loom_cuda_dtype)dt, gv_shapes[i][0], gv_shapes[i][1], gv_shapes[i][2],
                          (loom_cuda_gemv_mode)mode, (int)(i + mode) % 3 == 1,
                          (int)(i + mode) % 2);
    test_gemv(LOOM_CUDA_BF16, 1, 1024, 14336, LOOM_CUDA_GEMV_SILU, 0, 1);  /* Llama-3-8B down */
    /* Qwen3-0.6B's layer at batch 1, shapes of one or two items a warp */
    test_gemv(LOOM_CUDA_BF16, 1, 4096, 1024, LOOM_CUDA_GEMV_RMSNORM, 0, 0);
    test_gemv(LOOM_CUDA_BF16, 1, 1024, 2048, LOOM_CUDA_GEMV_F32, 1, 1);
    test_gemv(LOOM_CUDA_BF16, 1, 6144, 1024, LOOM_CUDA_GEMV_RMSNORM, 0, 0);
    test_gemv(LOOM_CUDA_BF16, 2, 1024, 3072, LOOM_CUDA_GEMV_SILU, 0, 1);
    test_gemv(LOOM_CUDA_F16, 1, 5000, 520, LOOM_CUDA_GEMV_RMSNORM, 1, 0);
    test_gemv(LOOM_CUDA_BF16, 2, 777, 2056, LOOM_CUDA_GEMV_GELU, 1, 1);
    test_gemv(LOOM_CUDA_BF16, 1, 8000, 1000, LOOM_CUDA_GEMV_X16, 0, 1);
    test_gemv(LOOM_CUDA_F16, 2, 3, 8, LOOM_CUDA_GEMV_F32, 1, 0);
    test_gemv(LOOM_CUDA_BF16, 8, 3000, 4096, LOOM_CUDA_GEMV_RMSNORM, 0, 0);
    test_gemv_limits();
    /* the argmax inside the GEMV: Qwen3-0.6B's head, two tokens, ties,
     * a NaN row, small and odd shapes */
    test_gemv_argmax(LOOM_CUDA_BF16, 1, 151936, 1024, LOOM_CUDA_GEMV_RMSNORM, 0, 0);
    test_gemv_argmax(LOOM_CUDA_BF16, 2, 5003, 1024, LOOM_CUDA_GEMV_RMSNORM, 1, 1);
    test_gemv_argmax(LOOM_CUDA_F16, 1, 40001, 520, LOOM_CUDA_GEMV_X16, 1, 0);
    test_gemv_argmax(LOOM_CUDA_BF16, 2, 7, 64, LOOM_CUDA_GEMV_F32, 0, 1);
    test_gemv_argmax(LOOM_CUDA_BF16, 1, 1, 8, LOOM_CUDA_GEMV_RMSNORM, 0, 0);

    static const int qbits[] = {4, 8, 2, 3, 5, 6};
    for (size_t b = 0; b < sizeof qbits / sizeof qbits[0]; b++) {
        test_matmul_q(qbits[b], 64, 0, 1, 33, 1024);
        test_matmul_q(qbits[b], 32, 1, 5, 7, 96);
        test_matmul_q(qbits[b], 128, 0, 3, 1, 4096);
    }
    test_matmul_q(4, 64, 0, 1, 4097, 2048);
    test_matmul_q(8, 64, 1, 2, 1000, 1024);

    /* FP8: 128x128 blocks with partial edges (rows and columns), one
     * partial block, per-channel and per-tensor scales, columns that are
     * not a multiple of 16 (the scalar kernel), every token count of a
     * decode tile and a prompt's */
    static const int f8s[][5] = {{1, 192, 64, 128, 128},   {3, 64, 192, 128, 128},
                                 {8, 300, 1000, 128, 128}, {9, 4097, 1024, 128, 128},
                                 {2, 33, 520, 1, 520},     {5, 130, 72, 130, 72},
                                 {4, 77, 200, 8, 8},       {1, 1000, 40, 128, 128},
                                 {17, 1024, 3072, 128, 128}, {64, 2000, 1536, 128, 128},
                                 {2, 33, 512, 1, 512},     {3, 130, 256, 130, 256}};
    for (size_t i = 0; i < sizeof f8s / sizeof f8s[0]; i++)
        for (int which = 0; which < 4; which++)
            test_f8(which, f8s[i][0], f8s[i][1], f8s[i][2], f8s[i][3], f8s[i][4]);
    /* slices of the dequantized weight (64 MiB of it a GEMM) */
    test_f8(F8_AUTO, 17, 17000, 4096, 128, 128);
    test_f8(F8_GEMM32, 17, 9000, 4096, 128, 128);
    for (int which = 0; which < 4; which++)
        if (which != F8_AUTO) test_f8_codes(which);

    {
        attn_case a1 = {8, 2, 64, 16, LOOM_KV_F32, 0, 0};
        int l1[] = {1, 7, 33, 300, 1000, 16};
        test_attn_decode(&a1, l1, 6);
        attn_case a2 = {12, 4, 128, 16, LOOM_KV_F16, 100, 50.0f};
        int l2[] = {5, 257, 600, 99, 100, 101};
        test_attn_decode(&a2, l2, 6);
        attn_case a3 = {4, 4, 80, 7, LOOM_KV_BF16, 0, 0};
        int l3[] = {1, 2, 1030};
        test_attn_decode(&a3, l3, 3);
        attn_case a4 = {16, 1, 256, 16, LOOM_KV_F32, 0, 30.0f};
        int l4[] = {4097, 3};
        test_attn_decode(&a4, l4, 2);
        attn_case a5 = {32, 8, 128, 32, LOOM_KV_F16, 4096, 0};
        int l5[] = {5000, 1, 64};
        test_attn_decode(&a5, l5, 3);
        /* the vectorised decode kernel on bf16 rows: Qwen3-0.6B and
         * Llama-3-8B head layouts, short and long sequences */
        attn_case a7 = {16, 8, 128, 16, LOOM_KV_BF16, 0, 0};
        int l7[] = {1, 129, 700, 17, 4097};
        test_attn_decode(&a7, l7, 5);
        attn_case a8 = {32, 8, 128, 16, LOOM_KV_BF16, 0, 0};
        int l8[] = {200, 3};
        test_attn_decode(&a8, l8, 2);
        int l8b[] = {191};  /* batch 1: the most splits */
        test_attn_decode(&a8, l8b, 1);
        test_attn_decode(&a7, l8b, 1);
        int l8c[] = {700};  /* batch 1: several runs of the cluster */
        test_attn_decode(&a8, l8c, 1);
        attn_case a10 = {8, 8, 64, 16, LOOM_KV_F32, 40, 0};  /* group 1, window */
        int l10[] = {1, 41, 300};
        test_attn_decode(&a10, l10, 3);
        attn_case a9 = {6, 1, 64, 7, LOOM_KV_BF16, 33, 0};  /* group 6, window, odd block */
        int l9[] = {1, 50, 999};
        test_attn_decode(&a9, l9, 3);

        /* qkv_post folded into the cluster attention: the benchmark
         * models' layouts at batch 1 and 2 (first token, one run, several
         * runs), head_dim 64 with biases, a window and f16 rows, f32 rows
         * without rope and softcap, group 6 and 8, odd block size */
        int lq1[] = {130}, lq2[] = {1}, lq3[] = {300, 5}, lq4[] = {700}, lq5[] = {191};
        test_attn_decode_qkv(&a7, lq1, 1, 128, 1, 0);
        test_attn_decode_qkv(&a7, lq2, 1, 128, 1, 0);
        test_attn_decode_qkv(&a7, lq3, 2, 128, 1, 0);
        test_attn_decode_qkv(&a8, lq5, 1, 128, 0, 0);
        test_attn_decode_qkv(&a8, lq4, 1, 128, 0, 0);
        test_attn_decode_qkv(&a8, lq3, 2, 128, 0, 1);
        attn_case aq1 = {8, 2, 64, 16, LOOM_KV_F16, 40, 0};
        int lq6[] = {1, 41, 300};
        test_attn_decode_qkv(&aq1, lq6, 3, 64, 1, 1);
        attn_case aq2 = {8, 8, 64, 16, LOOM_KV_F32, 0, 30.0f};
        int lq7[] = {5, 77};
        test_attn_decode_qkv(&aq2, lq7, 2, 0, 1, 0);
        attn_case aq3 = {6, 1, 128, 7, LOOM_KV_BF16, 33, 0};
        int lq8[] = {1, 50, 999};
        test_attn_decode_qkv(&aq3, lq8, 3, 128, 1, 1);
        attn_case aq4 = {16, 2, 128, 16, LOOM_KV_BF16, 0, 0};
        int lq9[] = {2000};
        test_attn_decode_qkv(&aq4, lq9, 1, 128, 1, 0);
        attn_case aq5 = {4, 2, 80, 16, LOOM_KV_BF16, 0, 0};  /* not fused: two kernels */
        int lq10[] = {33};
        test_attn_decode_qkv(&aq5, lq10, 1, 80, 1, 0);

        int s1[] = {0, 100, 7, 0, 33}, n1[] = {37, 5, 1, 300, 64};
        test_attn_prefill(&a1, s1, n1, 5, 0);
        test_attn_prefill(&a2, s1, n1, 5, 0);
        test_attn_prefill(&a3, s1, n1, 5, 0);
        int s4[] = {0, 1000}, n4[] = {129, 33};
        test_attn_prefill(&a4, s4, n4, 2, 0);
        attn_case a6 = {8, 8, 64, 16, LOOM_KV_F32, 16, 0};  /* window < a tile */
        test_attn_prefill(&a6, s1, n1, 5, 0);
        int s7[] = {0}, n7[] = {1};
        test_attn_prefill(&a5, s7, n7, 1, 0);
        /* tensor cores: bf16 KV at the benchmark models' head layouts, a
         * prefix already in the pool, odd chunk lengths, a window, softcap,
         * head_dim 80 and 64 */
        int s10[] = {0, 100, 7, 0, 33, 1000}, n10[] = {37, 5, 1, 300, 64, 129};
        test_attn_prefill(&a7, s10, n10, 6, 1);
        test_attn_prefill(&a8, s10, n10, 6, 1);
        test_attn_prefill(&a3, s1, n1, 5, 1);
        attn_case a11 = {8, 2, 64, 16, LOOM_KV_BF16, 50, 30.0f};
        test_attn_prefill(&a11, s10, n10, 6, 1);
        int s12[] = {0}, n12[] = {1000};
        test_attn_prefill(&a7, s12, n12, 1, 1);
        /* 16-bit outputs (the o projection's input), group 6 (rows of a
         * tile left over), head_dim 96, a window across the tiles, one
         * long row with a prefix */
        test_attn_prefill_to(&a8, s10, n10, 6, 1, LOOM_CUDA_BF16);
        test_attn_prefill_to(&a7, s10, n10, 6, 1, LOOM_CUDA_F16);
        test_attn_prefill_to(&a1, s1, n1, 5, 0, LOOM_CUDA_BF16);
        test_attn_prefill(&a9, s10, n10, 6, 1);
        attn_case a12 = {12, 4, 96, 16, LOOM_KV_BF16, 100, 0};
        test_attn_prefill(&a12, s10, n10, 6, 1);
        int s13[] = {300}, n13[] = {777};
        test_attn_prefill(&a8, s13, n13, 1, 1);
        test_attn_prefill(&a12, s13, n13, 1, 1);
        /* head_dim 256 (Gemma 2/3/4's sliding layers), queries in shared
         * memory: group 4, and softcap with a window across the tiles */
        attn_case a13 = {4, 1, 256, 16, LOOM_KV_BF16, 0, 0};
        attn_case a14 = {8, 4, 256, 16, LOOM_KV_BF16, 100, 50.0f};
        test_attn_prefill(&a13, s10, n10, 6, 1);
        test_attn_prefill(&a14, s10, n10, 6, 1);
        test_attn_prefill_to(&a13, s13, n13, 1, 1, LOOM_CUDA_BF16);
        /* bidirectional spans (Gemma 3's images): longer than the window,
         * across query tiles, after a cached prefix */
        test_attn_prefill_sp(&a1, s1, n1, 5, 0, LOOM_CUDA_F32, 20);
        test_attn_prefill_sp(&a6, s1, n1, 5, 0, LOOM_CUDA_F32, 40);
        test_attn_prefill_sp(&a7, s10, n10, 6, 1, LOOM_CUDA_F32, 150);
        test_attn_prefill_sp(&a11, s10, n10, 6, 1, LOOM_CUDA_F32, 90);
        test_attn_prefill_sp(&a12, s13, n13, 1, 1, LOOM_CUDA_BF16, 256);
        test_attn_prefill_sp(&a14, s10, n10, 6, 1, LOOM_CUDA_F32, 120);
    }

    /* routed experts: the fixture's shape, Qwen3-30B-A3B-like and
     * Qwen3-Next-like expert counts, odd widths (scalar loads), top 1 and
     * top k = all experts, every token on one expert (the others idle),
     * row tiles that straddle experts */
    static const moe_case moes[] = {
        {1, 8, 2, 64, 64, LOOM_CUDA_F32, 1, 0},
        {2, 8, 2, 64, 64, LOOM_CUDA_F32, 1, 0},
        {65, 8, 2, 64, 64, LOOM_CUDA_F32, 1, 0},
        {3, 64, 8, 256, 256, LOOM_CUDA_BF16, 1, 0},
        {130, 64, 8, 256, 256, LOOM_CUDA_BF16, 1, 0},
        {37, 8, 2, 65, 33, LOOM_CUDA_F32, 0, 0},
        {70, 16, 1, 72, 40, LOOM_CUDA_F16, 1, 1},
        {5, 128, 4, 136, 24, LOOM_CUDA_BF16, 0, 1},
        {200, 512, 10, 64, 48, LOOM_CUDA_BF16, 1, 0},
        {9, 4, 4, 96, 17, LOOM_CUDA_F16, 1, 0},
        {300, 32, 3, 128, 64, LOOM_CUDA_BF16, 1, 1},
        {512, 128, 8, 256, 136, LOOM_CUDA_BF16, 1, 0},
        {33, 128, 8, 264, 40, LOOM_CUDA_F16, 1, 0},
    };
    for (size_t i = 0; i < sizeof moes / sizeof moes[0]; i++) test_moe(&moes[i]);
    test_moe_limits();
    test_moe_scale_weights(1, 8, 128);
    test_moe_scale_weights(37, 2, 4);
    test_moe_scale_weights(300, 8, 128);
    test_lin_all();

    st = loom_cuda_sync(C);
    if (st != LOOM_OK) api_fail("sync", "end of run", st);
    loom_cuda_free(C);
    loom_cuda_free(C_fma);
    loom_cuda_free(C_mma);
    for (int v = 0; v < GV_VARIANTS; v++) loom_cuda_free(C_gv[v]);
    for (int v = 0; v < ATT_VARIANTS; v++) loom_cuda_free(C_att[v]);
    loom_cuda_free(C_fa1);
    printf("cuda kernels: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
