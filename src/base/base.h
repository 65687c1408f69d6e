/* base: error reporting, allocation and small helpers shared by every
 * module. Internal; the public surface is include/loom.h. */
#ifndef LOOM_BASE_H
#define LOOM_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define LOOM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Records a formatted message as this thread's last error and returns s, so
 * callers write `return loom_err(LOOM_ERR_FORMAT, "...", ...)`. */
loom_status loom_err(loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to the current error message (adds context on the way
 * up) and returns s. */
loom_status loom_err_wrap(loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void loom_err_clear(void);

/* Logging to stderr; level from LOOM_LOG (error, warn, info, debug). */
enum { LOOM_LOG_ERROR, LOOM_LOG_WARN, LOOM_LOG_INFO, LOOM_LOG_DEBUG };
void loom_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Zeroed, 64-byte aligned allocation; NULL on failure (or n == 0 gives a
 * valid minimal block). Free with loom_free. */
void *loom_alloc(size_t n);
/* The same, not zeroed: for buffers the caller writes before reading. */
void *loom_alloc_raw(size_t n);
void loom_free(void *p);

/* Reads a whole file into a NUL-terminated heap buffer. */
loom_status loom_read_file(const char *path, char **out, size_t *len);

/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or stray bytes). */
int loom_utf8_valid(const char *s, size_t n);

/* Monotonic time in seconds. */
double loom_now(void);

/* CPU seconds the calling thread has used. */
double loom_thread_cpu(void);

/* Number of online CPUs (at least 1). */
int loom_cpu_count(void);

/* Bytes of memory available to allocate without swapping (MemAvailable of
 * /proc/meminfo); 0 when unknown. */
size_t loom_mem_available(void);

/* Joins dir and name into buf (size n). Returns LOOM_ERR_INVALID_ARG if it
 * does not fit. */
loom_status loom_path_join(char *buf, size_t n, const char *dir,
                           const char *name);

/* bf16 / f16 conversions (round-to-nearest-even on the way down). */
static inline float loom_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t loom_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t r = 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)((v.u + r) >> 16);
}
float loom_f16_to_f32(uint16_t h);
uint16_t loom_f32_to_f16(float f);

/* float8 e4m3fn (the FP8 checkpoints' weights): sign, 4 exponent bits
 * (bias 7), 3 mantissa bits, exponent 0 subnormal, no infinities, S.1111.111
 * NaN; largest finite 448. Decoding is exact. Encoding rounds to nearest
 * even and saturates at +-448 (as the checkpoints' quantizers clamp before
 * they cast); NaN gives 0x7f. */
static inline float loom_e4m3_to_f32(uint8_t b) {
    unsigned e = (b >> 3) & 15u, m = b & 7u;
    union { uint32_t u; float f; } v;
    if (e == 15 && m == 7) v.u = 0x7fc00000u;
    else if (e == 0) v.f = (float)m * 0x1p-9f;
    else v.u = (e + 120u) << 23 | m << 20;
    if (b & 0x80) v.u ^= 0x80000000u;
    return v.f;
}
uint8_t loom_f32_to_e4m3(float f);

#endif
