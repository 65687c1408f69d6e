/* Stand-in for <utf8proc.h> used only by tools/cuda_check.sh's minimal
 * build, when the library's packages are not installed on the GPU machine:
 * src/base/base.c needs utf8proc_iterate alone (UTF-8 validation). Decodes
 * one code point the way utf8proc does for valid input and returns -1 for
 * malformed, overlong, surrogate or out-of-range sequences. Not for the
 * real build. */
#ifndef LOOM_TEST_UTF8PROC_SHIM_H
#define LOOM_TEST_UTF8PROC_SHIM_H

#include <stdint.h>
#include <sys/types.h>

typedef int32_t utf8proc_int32_t;
typedef ssize_t utf8proc_ssize_t;
typedef uint8_t utf8proc_uint8_t;

static inline utf8proc_ssize_t utf8proc_iterate(const utf8proc_uint8_t *s, utf8proc_ssize_t n,
                                                utf8proc_int32_t *cp) {
    *cp = -1;
    if (n == 0) return 0;
    uint8_t b = s[0];
    int len = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || (n >= 0 && n < len)) return -1;
    int32_t c = len == 1 ? b : len == 2 ? (b & 0x1f) : len == 3 ? (b & 0x0f) : (b & 0x07);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return -1;
        c = (c << 6) | (s[i] & 0x3f);
    }
    static const int32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_cp[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return -1;
    *cp = c;
    return len;
}

#endif
