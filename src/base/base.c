/* base: thread-local error messages, logging, aligned allocation, files. */
#include "base/base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

static _Thread_local char err_buf[1024];

const char *loom_status_str(loom_status s) {
    switch (s) {
    case LOOM_OK: return "LOOM_OK";
    case LOOM_ERR_INVALID_ARG: return "LOOM_ERR_INVALID_ARG";
    case LOOM_ERR_IO: return "LOOM_ERR_IO";
    case LOOM_ERR_FORMAT: return "LOOM_ERR_FORMAT";
    case LOOM_ERR_UNSUPPORTED: return "LOOM_ERR_UNSUPPORTED";
    case LOOM_ERR_NOMEM: return "LOOM_ERR_NOMEM";
    case LOOM_ERR_RANGE: return "LOOM_ERR_RANGE";
    case LOOM_ERR_NO_KV: return "LOOM_ERR_NO_KV";
    case LOOM_ERR_ABORTED: return "LOOM_ERR_ABORTED";
    case LOOM_ERR_INTERNAL: return "LOOM_ERR_INTERNAL";
    case LOOM_ERR_TIMEOUT: return "LOOM_ERR_TIMEOUT";
    case LOOM_ERR_BUSY: return "LOOM_ERR_BUSY";
    }
    return "LOOM_ERR_UNKNOWN";
}

const char *loom_last_error(void) { return err_buf; }

void loom_err_clear(void) { err_buf[0] = 0; }

loom_status loom_err(loom_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return s;
}

loom_status loom_err_wrap(loom_status s, const char *fmt, ...) {
    char prefix[512], old[sizeof err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err_buf - 3) n = sizeof err_buf - 3;
    memcpy(err_buf, prefix, n);
    memcpy(err_buf + n, ": ", 2);
    size_t rest = sizeof err_buf - n - 3;
    size_t m = strlen(old);
    if (m > rest) m = rest;
    memcpy(err_buf + n + 2, old, m);
    err_buf[n + 2 + m] = 0;
    return s;
}

static int log_level(void) {
    static int level = -1;
    if (level < 0) {
        const char *e = getenv("LOOM_LOG");
        level = LOOM_LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) level = LOOM_LOG_ERROR;
            else if (!strcmp(e, "info")) level = LOOM_LOG_INFO;
            else if (!strcmp(e, "debug")) level = LOOM_LOG_DEBUG;
        }
    }
    return level;
}

void loom_log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > log_level()) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loom %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* What an allocation of n bytes takes: whole 64-byte lines, one at least. */
static size_t alloc_size(size_t n) { return n ? (n + 63) & ~(size_t)63 : 64; }

void *loom_alloc_raw(size_t n) {
    void *p = NULL;
    n = alloc_size(n);
    /* Large buffers (weights copied at load) are streamed: 2 MiB pages
     * spare the TLB misses of 4 KiB ones. */
    size_t huge = (size_t)2 << 20, align = n >= huge ? huge : 64;
    if (posix_memalign(&p, align, n) != 0) return NULL;
    if (align == huge) madvise(p, n & ~(huge - 1), MADV_HUGEPAGE);
    return p;
}

void *loom_alloc(size_t n) {
    void *p = loom_alloc_raw(n);
    if (p) memset(p, 0, alloc_size(n));
    return p;
}

void loom_free(void *p) { free(p); }

loom_status loom_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_err(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            size_t nc = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                fclose(f);
                return loom_err(LOOM_ERR_NOMEM, "%s: out of memory reading", path);
            }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return loom_err(LOOM_ERR_IO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return LOOM_OK;
}

double loom_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double loom_thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int loom_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

size_t loom_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

loom_status loom_path_join(char *buf, size_t n, const char *dir,
                           const char *name) {
    int w = snprintf(buf, n, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= n)
        return loom_err(LOOM_ERR_INVALID_ARG, "path too long: %s/%s", dir, name);
    return LOOM_OK;
}

float loom_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        if (man == 0) { v.u = sign; return v.f; }
        /* subnormal: value = man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) v.u = sign | 0x7f800000u | (man << 13);
    else v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t loom_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t sign = (v.u >> 16) & 0x8000;
    uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);           /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);          /* inf/overflow */
    if (a < 0x38800000u) {                                            /* subnormal */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;                                     /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u;                                     /* rebias */
    uint32_t lsb = (r >> 13) & 1;
    r += 0xfff + lsb;
    return (uint16_t)(sign | (r >> 13));
}

uint8_t loom_f32_to_e4m3(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    uint8_t sign = (uint8_t)((v.u >> 24) & 0x80);
    uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a >= 0x43e00000u) return sign | 0x7e;                        /* >= 448: saturate */
    if (a < 0x3c800000u) {                                            /* below 2^-6: subnormal */
        /* units of 2^-9, round half to even; 8 units is the smallest normal */
        v.u = a;
        float q = v.f * 512.0f;
        uint32_t r = (uint32_t)q;
        float rem = q - (float)r;
        if (rem > 0.5f || (rem == 0.5f && (r & 1))) r++;
        return sign | (uint8_t)r;
    }
    uint32_t r = a - (120u << 23);                                    /* rebias 127 -> 7 */
    uint32_t lsb = (r >> 20) & 1;
    r += 0x7ffff + lsb;
    r >>= 20;
    return sign | (uint8_t)(r > 0x7e ? 0x7e : r);
}

int loom_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}
