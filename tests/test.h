/* Minimal test harness: CHECK macros count failures; main returns
 * test_report(). Fixtures are found relative to the repo root (tests run
 * from there). */
#ifndef LOOM_TEST_H
#define LOOM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static int test_checks;

#define CHECK(cond)                                                        \
    do {                                                                   \
        test_checks++;                                                     \
        if (!(cond)) {                                                     \
            test_failures++;                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                      \
        }                                                                  \
    } while (0)

#define CHECKF(cond, ...)                                                  \
    do {                                                                   \
        test_checks++;                                                     \
        if (!(cond)) {                                                     \
            test_failures++;                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__,         \
                    __LINE__, #cond);                                      \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define CHECK_EQ_INT(a, b) CHECKF((long long)(a) == (long long)(b), \
                                  "%lld != %lld", (long long)(a), (long long)(b))
#define CHECK_STR(a, b) CHECKF(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))

/* The larger of a and b, NaN if either is: fmax(NaN, x) is x, so an
 * error maximum built with fmax passes over a NaN, and every `err < tol`
 * check on this one fails. Use it for every maximum a check reads. */
static inline double test_max(double a, double b) {
    return a != a || b != b ? NAN : a > b ? a : b;
}

/* max |a - ref| over n values; a NaN in either counts as infinitely far. */
static inline double test_max_abs_err(const float *a, const float *ref, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (d != d) return INFINITY;
        if (d > e) e = d;
    }
    return e;
}

/* max |a - ref| / max |ref|; a NaN in either counts as infinitely far. */
static inline double test_rel_err(const float *a, const float *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = test_max(m, fabs(ref[i]));
    return test_max_abs_err(a, ref, n) / m;
}

static inline int test_report(const char *name) {
    fprintf(stderr, "%s: %d checks, %d failed\n", name, test_checks,
            test_failures);
    return test_failures ? 1 : 0;
}

/* Deterministic xorshift random numbers for kernel tests. */
static inline unsigned test_rand_u32(unsigned long long *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return (unsigned)(*s >> 32);
}
/* Uniform in [-1, 1). */
static inline float test_rand_f(unsigned long long *s) {
    return (float)((double)test_rand_u32(s) / 2147483648.0 - 1.0);
}

#endif
