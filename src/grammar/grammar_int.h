/* grammar_int: what the GBNF parser (grammar.c) and the regex translator
 * (schema.c) share. */
#ifndef LOOM_GRAMMAR_INT_H
#define LOOM_GRAMMAR_INT_H

#include <stdio.h>

#define LOOM_GRAMMAR_MAX_REPEAT 4096 /* the largest count of a {m,n} repetition */

/* A repetition count at *p, 0..LOOM_GRAMMAR_MAX_REPEAT: 0, or -1 when *p
 * is no digit, -2 when the count is too large. */
static inline int loom_grammar_count(const char **p, int *v) {
    if (**p < '0' || **p > '9') return -1;
    long x = 0;
    while (**p >= '0' && **p <= '9') {
        x = x * 10 + (*(*p)++ - '0');
        if (x > LOOM_GRAMMAR_MAX_REPEAT) return -2;
    }
    *v = (int)x;
    return 0;
}

/* The rest of a counted repetition after its '{': "m}", "m,}" or "m,n}".
 * On success *p is past the '}', *min and *max are set (max -1:
 * unbounded) and NULL is returned; else *p is where it went wrong and the
 * message (in msg, of cap bytes) says what was expected. */
static inline const char *loom_grammar_braces(const char **p, int *min, int *max, char *msg, size_t cap) {
    int rc = loom_grammar_count(p, min);
    if (!rc) {
        *max = *min;
        if (**p == ',') {
            (*p)++;
            *max = -1;
            if (**p != '}') rc = loom_grammar_count(p, max);
        }
    }
    if (rc == -1) return "expected a number in {m,n}";
    if (rc == -2) {
        snprintf(msg, cap, "a repetition count above %d", LOOM_GRAMMAR_MAX_REPEAT);
        return msg;
    }
    if (**p != '}') return "expected '}' closing the repetition";
    (*p)++;
    if (*max >= 0 && *max < *min) {
        snprintf(msg, cap, "a repetition {%d,%d} with max below min", *min, *max);
        return msg;
    }
    return NULL;
}

#endif
