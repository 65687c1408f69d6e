/* ops: the CPU kernels the model code calls, behind one table.
 *
 * Every kernel exists as a plain-C reference (ops_ref.c) that defines the
 * semantics; SIMD versions (ops_avx2.c) must agree with it on random data
 * and odd sizes (tests/test_ops.c). loom_kernels_get() returns the best
 * table for this CPU; LOOM_KERNELS=ref forces the reference. */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

#include <stdint.h>

#include "load/safetensors.h"

typedef struct loom_kernels {
    const char *name;
    /* y[t*ldy + r] = sum_k x[t*ldx + k] * w[r*n + k] for t in [0, T),
     * r in [r0, r1). w rows are f32 / f16 / bf16 (by entry). This is where
     * most of the time goes. */
    void (*matmul_f32)(float *y, int ldy, const float *x, int ldx,
                       const float *w, int n, int T, int r0, int r1);
    void (*matmul_f16)(float *y, int ldy, const float *x, int ldx,
                       const uint16_t *w, int n, int T, int r0, int r1);
    void (*matmul_bf16)(float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int n, int T, int r0, int r1);
    float (*dot)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int n);
    /* y = x / sqrt(mean(x^2) + eps) * w  (y may alias x) */
    void (*rmsnorm)(float *y, const float *x, const float *w, int n, float eps);
    /* x = softmax(x) in place */
    void (*softmax)(float *x, int n);
    /* g = silu(g) * u */
    void (*silu_mul)(float *g, const float *u, int n);
    /* Row conversions to f32. */
    void (*f16_to_f32)(float *y, const uint16_t *x, int n);
    void (*bf16_to_f32)(float *y, const uint16_t *x, int n);
} loom_kernels;

extern const loom_kernels loom_kernels_ref;
#if defined(__x86_64__)
extern const loom_kernels loom_kernels_avx2;
#endif

/* Best table for this CPU (cached after the first call). */
const loom_kernels *loom_kernels_get(void);

/* Index of the largest element (first on ties). */
int loom_argmax(const float *x, int n);

#endif
