/* buf: see buf.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

/* Room for `extra` more bytes and the NUL; 0 once an allocation failed. */
static int grow(loom_buf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

void loom_buf_put(loom_buf *b, const char *s, size_t n) {
    if (!grow(b, n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void loom_buf_puts(loom_buf *b, const char *s) { loom_buf_put(b, s, strlen(s)); }
void loom_buf_putc(loom_buf *b, char c) { loom_buf_put(b, &c, 1); }

void loom_buf_printf(loom_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !grow(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void loom_buf_free(loom_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
