/* ops: picks the kernel table for this CPU. A SIMD table may leave entries
 * NULL; those fall back to the next table below it (AVX-512, AVX2, ref). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#include "base/base.h"

loom_kernels loom_kernels_over(loom_kernels base, const loom_kernels *t) {
#define OVER(f) if (t->f) base.f = t->f
    OVER(matmul_f32); OVER(matmul_f16); OVER(matmul_bf16); OVER(dot);
    OVER(axpy); OVER(attn_pv); OVER(rmsnorm); OVER(softmax); OVER(silu_mul);
    OVER(matmul_q); OVER(matmul_f8); OVER(gelu_tanh_mul);
    OVER(f16_to_f32); OVER(bf16_to_f32); OVER(q_il16); OVER(q8_prompt_fast);
    OVER(q_prep_bytes); OVER(q_prep); OVER(matmul_q_prep);
    OVER(bf16_prep_bytes); OVER(bf16_prep); OVER(matmul_bf16_prep);
#undef OVER
    return base;
}

static loom_kernels best, best_fast;
static pthread_once_t once = PTHREAD_ONCE_INIT, fast_once = PTHREAD_ONCE_INIT;
static int fast_bf16_avail; /* the AVX-512 --fast bf16 entries run here */

/* --fast only changes the entries a SIMD table has a faster rounded
 * variant for (AVX2: the 4-/8-bit matmuls; AVX-512: those, and bf16
 * where it pays); elsewhere best_fast is best. */
static void pick_table(const char *force) {
    best = loom_kernels_ref;
    best_fast = best;
#if defined(__x86_64__)
    if (force && !strcmp(force, "ref")) return;
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
          __builtin_cpu_supports("f16c")))
        return;
    best = loom_kernels_over(best, &loom_kernels_avx2);
    best.name = "avx2";
    best_fast = loom_kernels_over(best, &loom_kernels_avx2_q_fast);
    best_fast.name = "avx2-fast";
    /* LOOM_KERNELS=avx2 keeps AVX-512 machines on the AVX2 kernels (for
     * comparisons and tests of both). */
    if (!(force && !strcmp(force, "avx2")) && loom_cpu_has_avx512()) {
        best = loom_kernels_over(loom_kernels_over(best, &loom_kernels_avx512_dense),
                                 &loom_kernels_avx512_q);
        best_fast = loom_kernels_over(best, &loom_kernels_avx512_q_fast);
        fast_bf16_avail = 1; /* added by pick_fast where they pay */
        best.name = "avx512";
        best_fast.name = "avx512-fast";
    }
#else
    (void)force;
#endif
}

/* LOOM_KERNELS names the table to use (tests run the suite on each); one
 * this CPU cannot run, or an unknown name, says so instead of passing
 * silently on another table. */
static void pick(void) {
    const char *force = getenv("LOOM_KERNELS");
    if (force && !*force) force = NULL;
    pick_table(force);
    if (force && strcmp(force, "ref") && strcmp(force, "avx2") && strcmp(force, "avx512"))
        loom_log(LOOM_LOG_WARN, "LOOM_KERNELS=%s: expected ref, avx2 or avx512; using %s", force, best.name);
    else if (force && strcmp(force, best.name))
        loom_log(LOOM_LOG_WARN, "LOOM_KERNELS=%s: this CPU cannot run the %s kernels (%s); using %s", force,
                 force, !strcmp(force, "avx2") ? "they need AVX2, FMA and F16C"
                                               : "they need AVX-512 F/BW/DQ/VL/VNNI/BF16", best.name);
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

int loom_fast_bf16_pick(double gain, const char *env) {
    if (env && !strcmp(env, "1")) return 1;
    if (env && !strcmp(env, "0")) return 0;
    return gain >= LOOM_FAST_BF16_MIN_GAIN;
}

/* --fast bf16 rounds activations to multiply them with VDPBF16PS: a loss
 * of precision that only buys speed where that instruction outruns the
 * exact f32 FMAs, which it does not on every CPU that has it. Measured on
 * the first --fast request (a few ms), so exact-only users never pay. */
static void pick_fast(void) {
#if defined(__x86_64__)
    if (!fast_bf16_avail) return;
    const char *env = getenv("LOOM_FAST_BF16");
    if (env && !*env) env = NULL;
    if (env && strcmp(env, "0") && strcmp(env, "1"))
        loom_log(LOOM_LOG_WARN, "LOOM_FAST_BF16=%s: expected 0 or 1; measuring", env);
    int forced = env && (!strcmp(env, "0") || !strcmp(env, "1"));
    double gain = forced ? 0 : loom_avx512_bf16_gain();
    int use = loom_fast_bf16_pick(gain, env);
    if (forced)
        loom_log(LOOM_LOG_INFO, "--fast bf16 matmuls: %s (LOOM_FAST_BF16)", use ? "VDPBF16PS" : "exact");
    else
        loom_log(LOOM_LOG_INFO, "--fast bf16 matmuls: %s (VDPBF16PS gives %.2fx the multiply-adds of "
                 "f32 FMAs here, %.2f needed)", use ? "VDPBF16PS" : "exact", gain,
                 LOOM_FAST_BF16_MIN_GAIN);
    if (use) best_fast = loom_kernels_over(best_fast, &loom_kernels_avx512_dense_fast);
#endif
}

const loom_kernels *loom_kernels_get_fast(void) {
    pthread_once(&once, pick);
    pthread_once(&fast_once, pick_fast);
    return &best_fast;
}

/* ---- 16-row interleaved quantized matrices ------------------------------- */

int loom_q_il16_ok(const loom_qmat *w, int rows) {
    int m = w->group / 64;
    return (w->bits == 4 || w->bits == 8) && w->group % 64 == 0 && (m & (m - 1)) == 0 &&
           m <= 16 && w->n > 0 && w->n % w->group == 0 && w->n <= LOOM_Q_IL_MAXN && rows > 0 &&
           rows % 16 == 0 && !w->il16;
}

static unsigned q_value(const loom_qmat *w, int r, int k) {
    const uint8_t *row = (const uint8_t *)w->w + (size_t)r * ((size_t)w->n * w->bits / 8);
    return w->bits == 8 ? row[k] : (row[k / 2] >> (4 * (k & 1))) & 15u;
}

size_t loom_q_il16_bytes(const loom_qmat *w, int rows) {
    return (size_t)rows * w->n * w->bits / 8 + (size_t)rows * (w->n / w->group) * 2 * sizeof(uint16_t);
}

loom_status loom_q_interleave(const loom_qmat *w, int rows, loom_qmat *dst, void **mem) {
    *mem = NULL;
    if (!loom_q_il16_ok(w, rows)) return loom_q_interleave_into(w, rows, dst, NULL);
    void *buf = loom_alloc(loom_q_il16_bytes(w, rows));
    if (!buf) return loom_err(LOOM_ERR_NOMEM, "interleave: out of memory for %zu bytes",
                              loom_q_il16_bytes(w, rows));
    *mem = buf;
    return loom_q_interleave_into(w, rows, dst, buf);
}

loom_status loom_q_interleave_into(const loom_qmat *w, int rows, loom_qmat *dst, void *out) {
    if (!loom_q_il16_ok(w, rows))
        return loom_err(LOOM_ERR_INVALID_ARG, "interleave: %d-bit, group %d, %d x %d (expected "
                        "4 or 8 bits, group 64 << s, rows a multiple of 16, at most %d columns)",
                        w->bits, w->group, rows, w->n, LOOM_Q_IL_MAXN);
    uint8_t *buf = out;
    int n = w->n, ng = n / w->group, per = w->bits == 8 ? 4 : 8;
    uint8_t *o = buf;
    for (int rb = 0; rb < rows / 16; rb++)
        for (int g = 0; g < ng; g++) {
            uint16_t p[32]; /* the group's 16 scales, then its 16 biases, before its columns */
            for (int i = 0; i < 16; i++) {
                p[i] = w->scales[(size_t)(rb * 16 + i) * ng + g];
                p[16 + i] = w->biases[(size_t)(rb * 16 + i) * ng + g];
            }
            memcpy(o, p, sizeof p);
            o += sizeof p;
            for (int j = g * (w->group / 64); j < (g + 1) * (w->group / 64); j++)
                for (int c = 0; c < 64 / per; c++) /* one vector: 16 rows x per columns */
                    for (int i = 0; i < 16; i++)
                        for (int b = 0; b < 4; b++) {
                            int r = rb * 16 + i, k = j * 64 + c * per + b;
                            *o++ = (uint8_t)(w->bits == 8 ? q_value(w, r, k)
                                                          : q_value(w, r, k) | q_value(w, r, k + 4) << 4);
                        }
        }
    *dst = *w;
    dst->w = (const uint32_t *)buf;
    dst->scales = dst->biases = NULL; /* in the stream */
    dst->il16 = 1;
    return LOOM_OK;
}
