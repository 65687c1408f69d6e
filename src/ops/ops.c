/* ops: picks the kernel table for this CPU. A SIMD table may leave entries
 * NULL; those fall back to the next table below it (AVX-512, AVX2, ref). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

loom_kernels loom_kernels_over(loom_kernels base, const loom_kernels *t) {
#define OVER(f) if (t->f) base.f = t->f
    OVER(matmul_f32); OVER(matmul_f16); OVER(matmul_bf16); OVER(dot);
    OVER(axpy); OVER(rmsnorm); OVER(softmax); OVER(silu_mul);
    OVER(matmul_q); OVER(gelu_tanh_mul);
    OVER(f16_to_f32); OVER(bf16_to_f32);
#undef OVER
    return base;
}

static loom_kernels best, best_fast;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* --fast only changes the entries a SIMD table has a faster rounded
 * variant for; elsewhere best_fast is best. */
static void pick(void) {
    best = loom_kernels_ref;
    best_fast = best;
#if defined(__x86_64__)
    const char *force = getenv("LOOM_KERNELS");
    if (force && !strcmp(force, "ref")) return;
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
          __builtin_cpu_supports("f16c")))
        return;
    best = loom_kernels_over(best, &loom_kernels_avx2);
    best_fast = best;
    /* LOOM_KERNELS=avx2 keeps AVX-512 machines on the AVX2 kernels (for
     * comparisons and tests of both). */
    if (!(force && !strcmp(force, "avx2")) && loom_cpu_has_avx512()) {
        best = loom_kernels_over(loom_kernels_over(best, &loom_kernels_avx512_dense),
                                 &loom_kernels_avx512_q);
        best_fast = loom_kernels_over(loom_kernels_over(best, &loom_kernels_avx512_dense_fast),
                                      &loom_kernels_avx512_q_fast);
        best.name = "avx512";
        best_fast.name = "avx512-fast";
    }
#endif
}

int loom_cpu_has_avx512(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

const loom_kernels *loom_kernels_get(void) {
    pthread_once(&once, pick);
    return &best;
}

const loom_kernels *loom_kernels_get_fast(void) {
    pthread_once(&once, pick);
    return &best_fast;
}
