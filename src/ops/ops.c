/* ops: picks the kernel table for this CPU. A SIMD table may leave entries
 * NULL; those fall back to the reference. */
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#define FILL(f) if (!t.f) t.f = loom_kernels_ref.f

static loom_kernels complete(loom_kernels t) {
    FILL(matmul_f32); FILL(matmul_f16); FILL(matmul_bf16); FILL(dot);
    FILL(axpy); FILL(rmsnorm); FILL(softmax); FILL(silu_mul);
    FILL(matmul_q); FILL(gelu_tanh_mul);
    FILL(f16_to_f32); FILL(bf16_to_f32);
    return t;
}

const loom_kernels *loom_kernels_get(void) {
    static loom_kernels best;
    static int ready;
    if (ready) return &best;
    best = loom_kernels_ref;
#if defined(__x86_64__)
    const char *force = getenv("LOOM_KERNELS");
    if (!(force && !strcmp(force, "ref"))) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c"))
            best = complete(loom_kernels_avx2);
    }
#endif
    ready = 1;
    return &best;
}
