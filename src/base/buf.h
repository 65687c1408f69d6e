/* buf: a growable, always NUL-terminated byte string for building text
 * (JSON bodies, template output). After an allocation fails, `oom` is set
 * and further writes are dropped, so callers check once at the end. */
#ifndef LOOM_BUF_H
#define LOOM_BUF_H

#include <stddef.h>

typedef struct loom_buf {
    char *p;      /* NULL until the first write */
    size_t len, cap;
    int oom;
} loom_buf;

void loom_buf_put(loom_buf *b, const char *s, size_t n);
void loom_buf_puts(loom_buf *b, const char *s);
void loom_buf_putc(loom_buf *b, char c);
void loom_buf_printf(loom_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void loom_buf_free(loom_buf *b);

#endif
