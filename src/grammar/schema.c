/* schema: JSON Schema and regexes translated to GBNF text, which
 * grammar.c compiles.
 *
 * JSON Schema: type (one or a list), object properties in their declared
 * order (required ones always, the others optional; a required key outside
 * properties takes any value), additionalProperties (absent or false: no
 * other keys once properties are listed; true or a schema: any other string
 * key after them), arrays with items, minItems, maxItems, strings with
 * minLength, maxLength, pattern (with a length: the pattern's automaton
 * times a character counter), format (date, time, date-time, uuid,
 * email, ipv4, hostname, uri; other formats are annotations), enum and
 * const of any JSON value, integers with minimum, maximum and their
 * exclusive forms, numbers with bounds (narrowed to integers: a subset of
 * the range), multipleOf (integers: exact, any divisor up to 1000 times a
 * power of ten; numbers: 10^-j as at most j decimals, others as integral
 * multiples), boolean, null, anyOf (each branch intersected with the
 * keywords around it), oneOf (exact where the branches cannot meet or
 * where loom can write "not" of the others; otherwise as anyOf, refused
 * under LOOM_SCHEMA_STRICT), not (of type, enum, const, required,
 * properties, anyOf, allOf, not), if/then/else (where "not if" can be
 * written), allOf of objects (merged), $ref into the document ($defs,
 * definitions, any JSON pointer) including recursion. Whitespace between tokens is bounded (one
 * space, or a newline and at most 20 spaces or tabs), numbers have at most
 * 16 digits: a model cannot loop forever in either. A pattern is matched as
 * the whole string (anchors implied). A keyword that constrains and is not
 * kept (contains, propertyNames, a length with a format, ...) is an error
 * naming it and its JSON pointer; annotations and unknown words are ignored. */
#include <cjson/cJSON.h>
#include <math.h>
#ifndef LOOM_NO_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

#define MAX_DEPTH 64
#define MAX_INT_DIGITS 16
#define MAX_COUNT LOOM_GRAMMAR_MAX_REPEAT

typedef struct sref {
    const cJSON *node;
    char name[16];
} sref;

typedef struct sconv {
    loom_buf out;           /* the rules written so far */
    loom_buf mod_out;       /* multipleOf rules (self-contained: kept when a branch is dropped) */
    const cJSON *doc;       /* the whole schema, for $ref */
    int n_names;
    sref refs[256];
    int n_refs;
    cJSON **owned;          /* schemas made here (merged allOf, rewritten objects) */
    int n_owned, cap_owned;
    struct modk *mods[8];   /* multipleOf tables, one per divisor */
    struct pmemo *pats;     /* [n_pats] patterns with a length written (pattern_len) */
    int n_pats;
    int n_mods;
    int strict;             /* refuse what is only approximated (oneOf taken as anyOf) */
    int approx;             /* approximations made (oneOf branches that may overlap) */
    int empty;              /* the failure is that nothing validates (a branch may be dropped) */
    char *err;
    size_t err_cap;
    int failed, depth;
    char at[512];           /* JSON pointer of the schema being translated */
    size_t at_len;
} sconv;

/* Errors end with where in the schema they are: "(at #/properties/x)". */
static int sfail(sconv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sfail(sconv *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    if (c->err && c->err_cap) {
        vsnprintf(c->err, c->err_cap, fmt, ap);
        size_t n = strlen(c->err);
        snprintf(c->err + n, c->err_cap - n, " (at #%.*s)", (int)c->at_len, c->at);
    }
    va_end(ap);
    return -1;
}

/* A failure saying that nothing validates: an alternative that ends so is
 * dropped (gen_alt). */
static int sempty(sconv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sempty(sconv *c, const char *fmt, ...) {
    if (c->failed) return -1;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sfail(c, "%s", msg);
    c->empty = 1;
    return -1;
}

/* Appends a JSON pointer segment to c->at; returns the length to restore. */
static size_t at_push(sconv *c, const char *seg) {
    size_t mark = c->at_len;
    if (c->at_len + 1 < sizeof c->at) c->at[c->at_len++] = '/';
    for (const char *q = seg; *q && c->at_len + 2 < sizeof c->at; q++) {
        if (*q == '~' || *q == '/') c->at[c->at_len++] = '~', c->at[c->at_len++] = *q == '~' ? '0' : '1';
        else c->at[c->at_len++] = *q;
    }
    return mark;
}

static size_t at_push_i(sconv *c, const char *seg, int i) {
    char n[16];
    snprintf(n, sizeof n, "%d", i);
    size_t mark = at_push(c, seg);
    at_push(c, n);
    return mark;
}

/* A GBNF literal for n bytes of s. */
static void put_lit(loom_buf *b, const char *s, size_t n) {
    loom_buf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') loom_buf_putc(b, '\\'), loom_buf_putc(b, (char)ch);
        else if (ch < 0x20 || ch == 0x7f) loom_buf_printf(b, "\\x%02X", ch);
        else loom_buf_putc(b, (char)ch);
    }
    loom_buf_putc(b, '"');
}

/* ---- regex -> GBNF ------------------------------------------------------ */

typedef struct rx {
    const char *s, *p;
    int json;               /* inside a JSON string: emit characters JSON-escaped */
    char *err;
    size_t err_cap;
    int failed;
} rx;

typedef struct rrange {
    uint32_t lo, hi;
} rrange;

static int rfail(rx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rfail(rx *x, const char *fmt, ...) {
    if (x->failed) return -1;
    x->failed = 1;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (x->err && x->err_cap) snprintf(x->err, x->err_cap, "regex '%s' at offset %d: %s", x->s, (int)(x->p - x->s), msg);
    return -1;
}

static int utf8_dec(const char *s, uint32_t *cp) {
    uint8_t c = (uint8_t)s[0];
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    uint32_t v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        if (((uint8_t)s[i] & 0xC0) != 0x80) return *cp = c, 1;
        v = v << 6 | ((uint8_t)s[i] & 63);
    }
    *cp = v;
    return n;
}

static void put_cp_raw(loom_buf *b, uint32_t cp) {
    char u[5];
    int n = cp < 0x80 ? (u[0] = (char)cp, 1)
          : cp < 0x800 ? (u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), 2)
          : cp < 0x10000 ? (u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)), u[2] = (char)(0x80 | (cp & 63)), 3)
                         : (u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)),
                            u[2] = (char)(0x80 | (cp >> 6 & 63)), u[3] = (char)(0x80 | (cp & 63)), 4);
    loom_buf_put(b, u, (size_t)n);
}

/* The literal for one code point, JSON-escaped inside a JSON string. */
static void put_char(const rx *x, loom_buf *b, uint32_t cp) {
    char s[8];
    if (x->json && (cp == '"' || cp == '\\')) s[0] = '\\', s[1] = (char)cp, put_lit(b, s, 2);
    else if (x->json && cp < 0x20) {
        const char *e = cp == '\n' ? "\\n" : cp == '\t' ? "\\t" : cp == '\r' ? "\\r" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : NULL;
        if (e) put_lit(b, e, 2);
        else snprintf(s, sizeof s, "\\u%04x", cp), put_lit(b, s, 6);
    } else if (cp < 0x80) {
        s[0] = (char)cp;
        put_lit(b, s, 1);
    } else {
        loom_buf_putc(b, '"');
        put_cp_raw(b, cp);
        loom_buf_putc(b, '"');
    }
}

static void put_class_cp(loom_buf *b, uint32_t cp) {
    if (cp < 0x80) loom_buf_printf(b, "\\x%02X", cp);
    else loom_buf_printf(b, "\\U%08X", cp);
}

static int cmp_rr(const void *a, const void *b) {
    const rrange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Emits a class of code point ranges (merged here), negated when neg. In a
 * JSON string, ", \ and control characters go as their escapes. */
static int put_class(rx *x, loom_buf *b, rrange *r, int n, int neg) {
    qsort(r, (size_t)n, sizeof *r, cmp_rr);
    rrange m[300];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && r[i].lo <= m[k - 1].hi + 1) m[k - 1].hi = LOOM_MAX(m[k - 1].hi, r[i].hi);
        else m[k++] = r[i];
    }
    if (neg) {
        rrange c[301];
        int w = 0;
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (m[i].lo > next) c[w++] = (rrange){next, m[i].lo - 1};
            next = m[i].hi + 1;
        }
        if (next <= 0x10FFFF) c[w++] = (rrange){next, 0x10FFFF};
        k = LOOM_MIN(w, 300);
        memcpy(m, c, sizeof *m * (size_t)k);
    }
    int has[0x60] = {0};
    rrange keep[300];
    int nk = 0;
    for (int i = 0; i < k; i++) {
        uint32_t lo = m[i].lo, hi = m[i].hi;
        if (x->json) {
            for (uint32_t c = lo; c <= hi && c < 0x60; c++) has[c] = 1;
            /* split out 0x00-0x1F, " and \ */
            if (lo < 0x20) lo = LOOM_MIN(hi + 1, 0x20u);
            if (lo > hi) continue;
            uint32_t cuts[2] = {'"', '\\'};
            for (int q = 0; q < 2; q++)
                if (lo <= cuts[q] && cuts[q] <= hi) {
                    if (lo < cuts[q] && nk < 300) keep[nk++] = (rrange){lo, cuts[q] - 1};
                    lo = cuts[q] + 1;
                }
            if (lo > hi) continue;
        }
        if (nk < 300) keep[nk++] = (rrange){lo, hi};
    }
    int alts = 0;
    loom_buf_puts(b, "(");
    if (nk) {
        loom_buf_puts(b, "[");
        for (int i = 0; i < nk; i++) {
            put_class_cp(b, keep[i].lo);
            if (keep[i].hi != keep[i].lo) loom_buf_putc(b, '-'), put_class_cp(b, keep[i].hi);
        }
        loom_buf_puts(b, "]");
        alts++;
    }
    for (uint32_t c = 0; x->json && c < 0x60; c++) {
        if (!has[c] || (c >= 0x20 && c != '"' && c != '\\')) continue;
        if (alts++) loom_buf_puts(b, " | ");
        put_char(x, b, c);
    }
    loom_buf_puts(b, ")");
    if (!alts) return rfail(x, "a character class that matches nothing");
    return 0;
}

/* The ranges of \d \w \s and their negations; returns the count or 0. */
static int shorthand(char c, rrange *r, int *neg) {
    *neg = c >= 'A' && c <= 'Z';
    switch (c | 0x20) {
    case 'd': r[0] = (rrange){'0', '9'}; return 1;
    case 'w': r[0] = (rrange){'0', '9'}, r[1] = (rrange){'A', 'Z'}, r[2] = (rrange){'_', '_'}, r[3] = (rrange){'a', 'z'}; return 4;
    case 's': r[0] = (rrange){'\t', '\r'}, r[1] = (rrange){' ', ' '}; return 2;
    }
    return 0;
}

/* An escaped literal character after '\' (x->p at the character). */
static int escape_char(rx *x, uint32_t *cp) {
    char c = *x->p;
    switch (c) {
    case 'n': *cp = '\n'; break;
    case 't': *cp = '\t'; break;
    case 'r': *cp = '\r'; break;
    case 'f': *cp = '\f'; break;
    case 'v': *cp = '\v'; break;
    case '0': *cp = 0; break;
    case 'x': case 'u': {
        int n = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 1; i <= n; i++) {
            char h = x->p[i];
            int d = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
            if (d < 0) return rfail(x, "expected %d hex digits after \\%c", n, c);
            v = v * 16 + (uint32_t)d;
        }
        x->p += n;
        *cp = v;
        break;
    }
    case 0: return rfail(x, "a pattern cannot end with '\\'");
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            return rfail(x, "the escape \\%c is not supported", c);
        *cp = (unsigned char)c;
    }
    x->p++;
    return 0;
}

static int rx_alt(rx *x, loom_buf *b, int depth);

static int rx_class(rx *x, loom_buf *b) {
    x->p++; /* [ */
    int neg = *x->p == '^';
    if (neg) x->p++;
    rrange r[256];
    int n = 0;
    for (int first = 1; *x->p != ']' || first; first = 0) {
        if (!*x->p) return rfail(x, "expected ']'");
        if (n > 250) return rfail(x, "too many ranges in one class");
        uint32_t lo;
        if (*x->p == '\\') {
            x->p++;
            int sneg, k = shorthand(*x->p, r + n, &sneg);
            if (k) {
                if (sneg) return rfail(x, "a negated shorthand (\\%c) inside a class is not supported", *x->p);
                x->p++;
                n += k;
                continue;
            }
            if (escape_char(x, &lo)) return -1;
        } else x->p += utf8_dec(x->p, &lo);
        uint32_t hi = lo;
        if (x->p[0] == '-' && x->p[1] && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                if (escape_char(x, &hi)) return -1;
            } else x->p += utf8_dec(x->p, &hi);
            if (hi < lo) return rfail(x, "a class range ends below its start");
        }
        r[n++] = (rrange){lo, hi};
    }
    x->p++;
    return put_class(x, b, r, n, neg);
}

static int rx_seq(rx *x, loom_buf *b, int depth) {
    int atoms = 0;
    loom_buf_puts(b, "(");
    for (;;) {
        char c = *x->p;
        if (!c || c == '|' || c == ')') break;
        if (atoms++) loom_buf_putc(b, ' ');
        if (c == '^' && x->p == x->s) {
            x->p++;
            loom_buf_puts(b, "\"\"");
            continue;
        }
        if (c == '$' && (!x->p[1] || (x->p[1] == ')' && 0))) {
            x->p++;
            loom_buf_puts(b, "\"\"");
            continue;
        }
        if (c == '^' || c == '$') return rfail(x, "anchors inside the pattern are not supported");
        if (c == '(') {
            x->p++;
            if (*x->p == '?') {
                if (x->p[1] == ':') x->p += 2;
                else if (x->p[1] == 'P' && x->p[2] == '<') x->p = strchr(x->p, '>') ? strchr(x->p, '>') + 1 : x->p + 3;
                else if (x->p[1] == '<' && x->p[2] != '=' && x->p[2] != '!') x->p = strchr(x->p, '>') ? strchr(x->p, '>') + 1 : x->p + 2;
                else return rfail(x, "lookaround and other (?...) groups are not supported");
            }
            if (depth > 64) return rfail(x, "groups nested deeper than 64");
            if (rx_alt(x, b, depth + 1)) return -1;
            if (*x->p != ')') return rfail(x, "expected ')'");
            x->p++;
        } else if (c == '[') {
            if (rx_class(x, b)) return -1;
        } else if (c == '.') {
            x->p++;
            rrange nl = {'\n', '\n'};
            if (put_class(x, b, &nl, 1, 1)) return -1;
        } else if (c == '\\') {
            x->p++;
            rrange r[4];
            int neg, k = shorthand(*x->p, r, &neg);
            if (k) {
                x->p++;
                if (put_class(x, b, r, k, neg)) return -1;
            } else {
                uint32_t cp;
                if (escape_char(x, &cp)) return -1;
                put_char(x, b, cp);
            }
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return rfail(x, "a quantifier with nothing to repeat");
        } else {
            uint32_t cp;
            x->p += utf8_dec(x->p, &cp);
            put_char(x, b, cp);
        }
        /* quantifier */
        c = *x->p;
        if (c == '*' || c == '+' || c == '?') {
            loom_buf_putc(b, c);
            x->p++;
        } else if (c == '{' && x->p[1] >= '0' && x->p[1] <= '9') {
            int m, n;
            char msg[64];
            x->p++;
            const char *e = loom_grammar_braces(&x->p, &m, &n, msg, sizeof msg);
            if (e) return rfail(x, "%s", e);
            if (n < 0) loom_buf_printf(b, "{%d,}", m);
            else loom_buf_printf(b, "{%d,%d}", m, n);
        } else continue;
        if (*x->p == '?' || *x->p == '+') x->p++; /* lazy / possessive: the same language */
        if (*x->p == '*' || *x->p == '+' || *x->p == '?' || (*x->p == '{' && x->p[1] >= '0' && x->p[1] <= '9'))
            return rfail(x, "a quantifier after a quantifier");
    }
    if (!atoms) loom_buf_puts(b, "\"\"");
    loom_buf_puts(b, ")");
    return 0;
}

static int rx_alt(rx *x, loom_buf *b, int depth) {
    loom_buf_puts(b, "(");
    for (;;) {
        if (rx_seq(x, b, depth)) return -1;
        if (*x->p != '|') break;
        x->p++;
        loom_buf_puts(b, " | ");
    }
    loom_buf_puts(b, ")");
    return 0;
}

static void new_name(sconv *c, char *name);

static int regex_expr(const char *re, int json, loom_buf *b, char *err, size_t cap);
/* ---- a pattern with a length: a DFA times a counter -----------------------
 *
 * minLength/maxLength beside a pattern need the intersection of two
 * languages, which GBNF cannot say directly: the pattern becomes an
 * automaton (syntax tree, Thompson NFA over code point ranges, subset
 * construction), and the rules are its product with a character counter,
 * only the states from which a whole string of a length in bounds can
 * still be reached. Sizes are bounded; a larger product is refused. */

enum { RN_SET, RN_CAT, RN_ALT, RN_REP, RN_EMPTY };

typedef struct rnode {
    int op, a, b, lo, hi; /* REP: a repeated lo..hi times (hi -1: unbounded) */
    int r0, nr;           /* SET: ranges rg[r0..r0+nr) */
} rnode;

#define RA_MAX_NODES 4096
#define RA_MAX_RANGES 16384
#define NFA_MAX 4000
#define DFA_MAX 600
#define PROD_MAX 2000 /* states times lengths: bounds the rules and the compile time */

typedef struct rast {
    rx x;
    rnode n[RA_MAX_NODES];
    int nn;
    rrange rg[RA_MAX_RANGES];
    int nrg;
} rast;

static int ra_node(rast *a, int op, int l, int r) {
    if (a->nn == RA_MAX_NODES) return rfail(&a->x, "pattern too large for a length bound"), -1;
    a->n[a->nn] = (rnode){op, l, r, 0, 0, 0, 0};
    return a->nn++;
}

/* A SET node of the n ranges r, negated when neg (over all code points). */
static int ra_set(rast *a, rrange *r, int n, int neg) {
    qsort(r, (size_t)n, sizeof *r, cmp_rr);
    int id = ra_node(a, RN_SET, 0, 0);
    if (id < 0) return -1;
    a->n[id].r0 = a->nrg;
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
        if (a->nrg + 2 >= RA_MAX_RANGES) return rfail(&a->x, "pattern too large for a length bound"), -1;
        if (!neg) {
            if (a->n[id].nr && r[i].lo <= a->rg[a->nrg - 1].hi + 1) a->rg[a->nrg - 1].hi = LOOM_MAX(a->rg[a->nrg - 1].hi, r[i].hi);
            else a->rg[a->nrg++] = r[i], a->n[id].nr++;
        } else {
            if (r[i].lo > next) a->rg[a->nrg++] = (rrange){next, r[i].lo - 1}, a->n[id].nr++;
            next = LOOM_MAX(next, r[i].hi + 1);
        }
    }
    if (neg && next <= 0x10FFFF) a->rg[a->nrg++] = (rrange){next, 0x10FFFF}, a->n[id].nr++;
    if (!a->n[id].nr) return rfail(&a->x, "a character class that matches nothing"), -1;
    return id;
}

static int ra_alt(rast *a, int depth);

static int ra_class(rast *a) {
    rx *x = &a->x;
    x->p++;
    int neg = *x->p == '^';
    if (neg) x->p++;
    rrange r[256];
    int n = 0;
    for (int first = 1; *x->p != ']' || first; first = 0) {
        if (!*x->p) return rfail(x, "expected ']'"), -1;
        if (n > 250) return rfail(x, "too many ranges in one class"), -1;
        uint32_t lo;
        if (*x->p == '\\') {
            x->p++;
            int sneg, k = shorthand(*x->p, r + n, &sneg);
            if (k) {
                if (sneg) return rfail(x, "a negated shorthand (\\%c) inside a class is not supported", *x->p), -1;
                x->p++;
                n += k;
                continue;
            }
            if (escape_char(x, &lo)) return -1;
        } else x->p += utf8_dec(x->p, &lo);
        uint32_t hi = lo;
        if (x->p[0] == '-' && x->p[1] && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                if (escape_char(x, &hi)) return -1;
            } else x->p += utf8_dec(x->p, &hi);
            if (hi < lo) return rfail(x, "a class range ends below its start"), -1;
        }
        r[n++] = (rrange){lo, hi};
    }
    x->p++;
    return ra_set(a, r, n, neg);
}

static int ra_seq(rast *a, int depth) {
    rx *x = &a->x;
    int seq = ra_node(a, RN_EMPTY, 0, 0);
    for (;;) {
        char c = *x->p;
        int atom = -1;
        if (seq < 0 || !c || c == '|' || c == ')') break;
        if ((c == '^' && x->p == x->s) || (c == '$' && !x->p[1])) {
            x->p++;
            continue;
        }
        if (c == '^' || c == '$') return rfail(x, "anchors inside the pattern are not supported"), -1;
        if (c == '(') {
            x->p++;
            if (*x->p == '?') {
                if (x->p[1] == ':') x->p += 2;
                else if (x->p[1] == 'P' && x->p[2] == '<') x->p = strchr(x->p, '>') ? strchr(x->p, '>') + 1 : x->p + 3;
                else if (x->p[1] == '<' && x->p[2] != '=' && x->p[2] != '!') x->p = strchr(x->p, '>') ? strchr(x->p, '>') + 1 : x->p + 2;
                else return rfail(x, "lookaround and other (?...) groups are not supported"), -1;
            }
            if (depth > 64) return rfail(x, "groups nested deeper than 64"), -1;
            atom = ra_alt(a, depth + 1);
            if (atom < 0) return -1;
            if (*x->p != ')') return rfail(x, "expected ')'"), -1;
            x->p++;
        } else if (c == '[') {
            atom = ra_class(a);
        } else if (c == '.') {
            x->p++;
            rrange nl = {'\n', '\n'};
            atom = ra_set(a, &nl, 1, 1);
        } else if (c == '\\') {
            x->p++;
            rrange r[4];
            int neg, k = shorthand(*x->p, r, &neg);
            if (k) x->p++, atom = ra_set(a, r, k, neg);
            else {
                uint32_t cp;
                if (escape_char(x, &cp)) return -1;
                rrange one = {cp, cp};
                atom = ra_set(a, &one, 1, 0);
            }
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return rfail(x, "a quantifier with nothing to repeat"), -1;
        } else {
            uint32_t cp;
            x->p += utf8_dec(x->p, &cp);
            rrange one = {cp, cp};
            atom = ra_set(a, &one, 1, 0);
        }
        if (atom < 0) return -1;
        c = *x->p;
        int lo = 1, hi = 1;
        if (c == '*' || c == '+' || c == '?') {
            lo = c == '+', hi = c == '?' ? 1 : -1;
            x->p++;
        } else if (c == '{' && x->p[1] >= '0' && x->p[1] <= '9') {
            x->p++;
            char msg[64];
            const char *e = loom_grammar_braces(&x->p, &lo, &hi, msg, sizeof msg);
            if (e) return rfail(x, "%s", e), -1;
        }
        if (lo != 1 || hi != 1) {
            if (*x->p == '?' || *x->p == '+') x->p++;
            int rep = ra_node(a, RN_REP, atom, 0);
            if (rep < 0) return -1;
            a->n[rep].lo = lo, a->n[rep].hi = hi;
            atom = rep;
        }
        seq = ra_node(a, RN_CAT, seq, atom);
    }
    return seq;
}

static int ra_alt(rast *a, int depth) {
    int l = ra_seq(a, depth);
    while (l >= 0 && *a->x.p == '|') {
        a->x.p++;
        int r = ra_seq(a, depth);
        if (r < 0) return -1;
        l = ra_node(a, RN_ALT, l, r);
    }
    return l;
}

typedef struct nfa {
    int n;
    int eps[NFA_MAX][2], n_eps[NFA_MAX];
    int set[NFA_MAX], to[NFA_MAX]; /* one character edge: AST set node (or -1) */
} nfa;

static int nfa_new(nfa *f) {
    if (f->n == NFA_MAX) return -1;
    f->n_eps[f->n] = 0, f->set[f->n] = -1;
    return f->n++;
}

static int nfa_eps(nfa *f, int s, int t) {
    if (f->n_eps[s] == 2) { /* a third edge goes through a fresh state */
        int u = nfa_new(f);
        if (u < 0) return -1;
        f->eps[u][0] = f->eps[s][1], f->n_eps[u] = 1;
        f->eps[s][1] = u;
        s = u;
    }
    f->eps[s][f->n_eps[s]++] = t;
    return 0;
}

/* Builds node id from state s; returns the end state (-1: too large). */
static int nfa_build(nfa *f, const rast *a, int id, int s) {
    const rnode *n = &a->n[id];
    if (s < 0) return -1;
    switch (n->op) {
    case RN_EMPTY: return s;
    case RN_SET: {
        int t = nfa_new(f), u = t >= 0 ? nfa_new(f) : -1;
        if (u < 0 || nfa_eps(f, s, t)) return -1;
        f->set[t] = id, f->to[t] = u;
        return u;
    }
    case RN_CAT: return nfa_build(f, a, n->b, nfa_build(f, a, n->a, s));
    case RN_ALT: {
        int x = nfa_new(f), y = x >= 0 ? nfa_new(f) : -1, e = y >= 0 ? nfa_new(f) : -1;
        if (e < 0 || nfa_eps(f, s, x) || nfa_eps(f, s, y)) return -1;
        int ex = nfa_build(f, a, n->a, x), ey = nfa_build(f, a, n->b, y);
        if (ex < 0 || ey < 0 || nfa_eps(f, ex, e) || nfa_eps(f, ey, e)) return -1;
        return e;
    }
    default: { /* REP */
        for (int i = 0; i < n->lo && s >= 0; i++) s = nfa_build(f, a, n->a, s);
        if (s < 0) return -1;
        int e = nfa_new(f);
        if (e < 0) return -1;
        if (n->hi < 0) {
            int x = nfa_new(f);
            if (x < 0 || nfa_eps(f, s, x) || nfa_eps(f, s, e)) return -1;
            int ex = nfa_build(f, a, n->a, x);
            if (ex < 0 || nfa_eps(f, ex, s)) return -1;
            return e;
        }
        for (int i = n->lo; i < n->hi; i++) {
            int x = nfa_new(f);
            if (x < 0 || nfa_eps(f, s, x) || nfa_eps(f, s, e)) return -1;
            s = nfa_build(f, a, n->a, x);
            if (s < 0) return -1;
        }
        return nfa_eps(f, s, e) ? -1 : e;
    }
    }
}

#define NW ((NFA_MAX + 63) / 64)

typedef struct dtrans {
    int to, r0, nr; /* ranges in the dfa's pool */
} dtrans;

typedef struct dfa {
    int n;
    uint64_t sets[DFA_MAX][NW];
    int accept[DFA_MAX];
    int t0[DFA_MAX], nt[DFA_MAX]; /* transitions tr[t0..t0+nt) */
    dtrans tr[DFA_MAX * 16];
    int ntr;
    rrange rg[DFA_MAX * 64];
    int nrg;
    uint32_t pts[RA_MAX_RANGES * 2]; /* scratch: range boundaries */
} dfa;

static void closure(const nfa *f, uint64_t *set) {
    int stack[NFA_MAX], sp = 0;
    for (int i = 0; i < f->n; i++)
        if (set[i / 64] >> (i % 64) & 1) stack[sp++] = i;
    while (sp) {
        int s = stack[--sp];
        for (int k = 0; k < f->n_eps[s]; k++) {
            int t = f->eps[s][k];
            if (!(set[t / 64] >> (t % 64) & 1)) set[t / 64] |= 1ull << (t % 64), stack[sp++] = t;
        }
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Subset construction; -1 when the DFA would be too large. */
static int dfa_build(dfa *d, const nfa *f, const rast *a, int start, int final) {
    memset(d->sets[0], 0, sizeof d->sets[0]);
    d->sets[0][start / 64] |= 1ull << (start % 64);
    closure(f, d->sets[0]);
    d->n = 1, d->ntr = 0, d->nrg = 0;
    uint32_t *pts = d->pts;
    for (int q = 0; q < d->n; q++) {
        d->accept[q] = d->sets[q][final / 64] >> (final % 64) & 1;
        int np = 0;
        for (int s = 0; s < f->n; s++) {
            if (!(d->sets[q][s / 64] >> (s % 64) & 1) || f->set[s] < 0) continue;
            const rnode *n = &a->n[f->set[s]];
            for (int i = 0; i < n->nr && np + 8 <= (int)LOOM_ARRAY_LEN(d->pts); i++)
                pts[np++] = a->rg[n->r0 + i].lo, pts[np++] = a->rg[n->r0 + i].hi + 1;
        }
        /* control characters other than \t \n \r are left out (a subset:
           each would be a \u escape of its own, and none is wanted) */
        static const uint32_t cuts[] = {9, 11, 13, 14, 0x20};
        for (size_t i = 0; i < LOOM_ARRAY_LEN(cuts); i++) pts[np++] = cuts[i];
        qsort(pts, (size_t)np, sizeof *pts, cmp_u32);
        d->t0[q] = d->ntr, d->nt[q] = 0;
        for (int i = 0; i + 1 < np; i++) {
            if (pts[i] == pts[i + 1]) continue;
            uint32_t lo = pts[i], hi = pts[i + 1] - 1;
            if (lo < 0x20 && lo != 9 && lo != 10 && lo != 13) continue;
            uint64_t tgt[NW] = {0};
            int any = 0;
            for (int s = 0; s < f->n; s++) {
                if (!(d->sets[q][s / 64] >> (s % 64) & 1) || f->set[s] < 0) continue;
                const rnode *n = &a->n[f->set[s]];
                for (int k = 0; k < n->nr; k++)
                    if (a->rg[n->r0 + k].lo <= lo && hi <= a->rg[n->r0 + k].hi) {
                        tgt[f->to[s] / 64] |= 1ull << (f->to[s] % 64), any = 1;
                        break;
                    }
            }
            if (!any) continue;
            closure(f, tgt);
            int to = -1;
            for (int p = 0; p < d->n && to < 0; p++)
                if (!memcmp(d->sets[p], tgt, sizeof tgt)) to = p;
            if (to < 0) {
                if (d->n == DFA_MAX) return -1;
                memcpy(d->sets[d->n], tgt, sizeof tgt);
                to = d->n++;
            }
            /* one transition per target: ranges appended (they come in order) */
            dtrans *t = NULL;
            for (int k = d->t0[q]; k < d->ntr; k++)
                if (d->tr[k].to == to) t = &d->tr[k];
            if (d->nrg + 1 >= (int)LOOM_ARRAY_LEN(d->rg)) return -1;
            if (!t) {
                if (d->ntr == (int)LOOM_ARRAY_LEN(d->tr)) return -1;
                t = &d->tr[d->ntr++];
                *t = (dtrans){to, -1, 0};
                d->nt[q]++;
            }
            /* a transition's ranges must be contiguous in rg: copy them on */
            if (t->nr && t->r0 + t->nr != d->nrg) {
                if (d->nrg + t->nr + 1 >= (int)LOOM_ARRAY_LEN(d->rg)) return -1;
                memmove(d->rg + d->nrg, d->rg + t->r0, sizeof *d->rg * (size_t)t->nr);
                t->r0 = d->nrg, d->nrg += t->nr;
            }
            if (!t->nr) t->r0 = d->nrg;
            if (t->nr && d->rg[d->nrg - 1].hi + 1 == lo) d->rg[d->nrg - 1].hi = hi;
            else d->rg[d->nrg++] = (rrange){lo, hi}, t->nr++;
        }
    }
    return 0;
}

/* Longest string from q to an accepting state over states in co (which
 * can reach one); -1 when unbounded (a cycle). mark: 0 new, 1 on the
 * path, 2 done with len[q]. */
static int dfa_longest(const dfa *d, const unsigned char *co, int q, unsigned char *mark, int *len) {
    if (mark[q] == 2) return len[q];
    if (mark[q] == 1) return -1;
    mark[q] = 1;
    int best = d->accept[q] ? 0 : -2;
    for (int t = 0; t < d->nt[q]; t++) {
        int to = d->tr[d->t0[q] + t].to;
        if (!co[to]) continue;
        int l = dfa_longest(d, co, to, mark, len);
        if (l == -1) return -1;
        best = LOOM_MAX(best, l + 1);
    }
    mark[q] = 2;
    return len[q] = best;
}

/* Drops the bounds the pattern's own strings always meet (the shortest
 * string is long enough, the longest short enough). */
static void dfa_trim_bounds(const dfa *d, int *mn, int *mx) {
    unsigned char co[DFA_MAX] = {0}, mark[DFA_MAX] = {0};
    int len[DFA_MAX], dist[DFA_MAX], queue[DFA_MAX], qh = 0, qt = 0;
    for (int q = 0; q < d->n; q++) co[q] = (unsigned char)d->accept[q];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int q = 0; q < d->n; q++)
            for (int t = 0; t < d->nt[q] && !co[q]; t++)
                if (co[d->tr[d->t0[q] + t].to]) co[q] = 1, changed = 1;
    }
    for (int q = 0; q < d->n; q++) dist[q] = -1;
    dist[0] = 0, queue[qt++] = 0;
    int shortest = -1;
    while (qh < qt && shortest < 0) {
        int q = queue[qh++];
        if (d->accept[q]) shortest = dist[q];
        for (int t = 0; t < d->nt[q]; t++) {
            int to = d->tr[d->t0[q] + t].to;
            if (dist[to] < 0) dist[to] = dist[q] + 1, queue[qt++] = to;
        }
    }
    if (shortest >= *mn) *mn = 0;
    int longest = co[0] ? dfa_longest(d, co, 0, mark, len) : -1;
    if (*mx >= 0 && longest >= 0 && longest <= *mx) *mx = -1;
}

/* A pattern with a length already written: its rules start at base-0-0.
 * Tool schemas repeat one pattern on many properties, and its product
 * with the counter is the costliest part of their compile. */
typedef struct pmemo {
    char *p;
    int mn, mx;
    char base[16];
} pmemo;

static const pmemo *pattern_seen(const sconv *c, const char *p, int mn, int mx) {
    for (int i = 0; i < c->n_pats; i++)
        if (c->pats[i].mn == mn && c->pats[i].mx == mx && !strcmp(c->pats[i].p, p)) return &c->pats[i];
    return NULL;
}

static void pattern_remember(sconv *c, const char *p, int mn, int mx, const char *base) {
    pmemo *np = realloc(c->pats, sizeof *np * (size_t)(c->n_pats + 1));
    if (!np) return; /* not remembered: written again next time */
    c->pats = np;
    pmemo *m = &np[c->n_pats];
    if (!(m->p = strdup(p))) return;
    m->mn = mn, m->mx = mx;
    snprintf(m->base, sizeof m->base, "%s", base);
    c->n_pats++;
}

/* The JSON string (quotes included) matching pattern p whole, of mn..mx
 * characters (mx < 0: no maximum). The product's rules go to mod_out
 * (they refer only to each other: kept when a branch is dropped, so a
 * remembered pattern stays defined). */
static int pattern_len(sconv *c, loom_buf *e, const char *p, int mn, int mx) {
    const pmemo *seen = pattern_seen(c, p, mn, mx);
    if (seen) {
        loom_buf_printf(e, "\"\\\"\" %s-0-0", seen->base);
        return 0;
    }
    int mn0 = mn, mx0 = mx;
    rast *a = calloc(1, sizeof *a);
    nfa *f = calloc(1, sizeof *f);
    dfa *d = calloc(1, sizeof *d);
    int rc = -1, L = mx < 0 ? mn : mx, root = -1, start = -1, end = -1, np = 0;
    unsigned char *live = NULL;
    char **cls = NULL, **body = NULL; /* [d->ntr] (pattern_len's class table) */
    if (!a || !f || !d) {
        sfail(c, "out of memory");
        goto done;
    }
    a->x = (rx){.s = p, .p = p, .json = 1, .err = c->err, .err_cap = c->err_cap};
    root = ra_alt(a, 0);
    if (root >= 0 && *a->x.p == ')') root = rfail(&a->x, "unbalanced ')'");
    if (root < 0) {
        size_t n = c->err ? strlen(c->err) : 0;
        if (c->err && n < c->err_cap) snprintf(c->err + n, c->err_cap - n, " (at #%.*s/pattern)", (int)c->at_len, c->at);
        c->failed = 1;
        goto done;
    }
    start = nfa_new(f);
    end = nfa_build(f, a, root, start);
    if (end < 0 || dfa_build(d, f, a, start, end)) {
        sfail(c, "'pattern' with a length bound: the pattern's automaton is too large (at most %d states)", DFA_MAX);
        goto done;
    }
    dfa_trim_bounds(d, &mn, &mx);
    if (!mn && mx < 0) { /* the bounds hold for every string of the pattern */
        free(a), free(f), free(d);
        loom_buf_puts(e, "\"\\\"\" ");
        if (regex_expr(p, 1, e, c->err, c->err_cap)) return c->failed = 1, -1;
        loom_buf_puts(e, " \"\\\"\"");
        return 0;
    }
    /* a maximum beyond what fits is lowered (shorter strings: a subset) */
    if (mx >= 0 && d->n * (mx + 1) > PROD_MAX) mx = LOOM_MAX(mn, PROD_MAX / d->n - 1);
    L = mx < 0 ? mn : mx;
    np = d->n * (L + 1);
    if (np > PROD_MAX) {
        sfail(c, "'pattern' with minLength %d: %d states times %d lengths is too large (at most %d)", mn, d->n, L + 1, PROD_MAX);
        goto done;
    }
    /* live[q * (L + 1) + k]: a string of a length in bounds can end from here */
    live = calloc((size_t)np, 1);
    if (!live) {
        sfail(c, "out of memory");
        goto done;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int q = 0; q < d->n; q++)
            for (int k = L; k >= 0; k--) {
                int id = q * (L + 1) + k;
                if (live[id]) continue;
                int ok = d->accept[q] && k >= mn;
                int k2 = mx < 0 ? LOOM_MIN(k + 1, mn) : k + 1;
                for (int t = 0; !ok && t < d->nt[q] && k2 <= L; t++) ok = live[d->tr[d->t0[q] + t].to * (L + 1) + k2];
                if (ok) live[id] = 1, changed = 1;
            }
    }
    if (!live[0]) {
        sempty(c, "no string of the length bounds matches 'pattern'");
        goto done;
    }
    char base[16];
    new_name(c, base);
    rx jx = {.s = p, .p = p, .json = 1, .err = c->err, .err_cap = c->err_cap};
    /* each transition's class, written once: a long one (\S is every
     * non-space code point, dozens of UTF-8 alternatives) becomes a rule
     * shared by all the lengths and states that take it */
    cls = calloc((size_t)d->ntr, sizeof *cls), body = calloc((size_t)d->ntr, sizeof *body);
    if (!cls || !body) {
        sfail(c, "out of memory");
        goto done;
    }
    int n_long = 0;
    for (int i = 0; i < d->ntr; i++) {
        loom_buf cb = {0};
        rrange r[300];
        int n = LOOM_MIN(d->tr[i].nr, 300);
        memcpy(r, d->rg + d->tr[i].r0, sizeof *r * (size_t)n);
        if (put_class(&jx, &cb, r, n, 0) || cb.oom) {
            loom_buf_free(&cb);
            c->failed = 1;
            goto done;
        }
        int same = -1;
        for (int k = 0; k < i && same < 0 && cb.len > 40; k++)
            if (body[k] && !strcmp(body[k], cb.p)) same = k;
        if (same >= 0) cls[i] = strdup(cls[same]), loom_buf_free(&cb);
        else if (cb.len > 40) {
            char name[40];
            snprintf(name, sizeof name, "%s-c%d", base, n_long++);
            loom_buf_printf(&c->mod_out, "%s ::= %s\n", name, cb.p);
            cls[i] = strdup(name), body[i] = cb.p;
        } else cls[i] = cb.p;
        if (!cls[i]) {
            sfail(c, "out of memory");
            goto done;
        }
    }
    for (int q = 0; q < d->n; q++)
        for (int k = 0; k <= L; k++) {
            if (!live[q * (L + 1) + k]) continue;
            loom_buf_printf(&c->mod_out, "%s-%d-%d ::= ", base, q, k);
            int alts = 0, k2 = mx < 0 ? LOOM_MIN(k + 1, mn) : k + 1;
            if (d->accept[q] && k >= mn) loom_buf_puts(&c->mod_out, "\"\\\"\""), alts++;
            for (int t = 0; t < d->nt[q] && k2 <= L; t++) {
                const dtrans *tr = &d->tr[d->t0[q] + t];
                if (!live[tr->to * (L + 1) + k2]) continue;
                if (alts++) loom_buf_puts(&c->mod_out, " | ");
                loom_buf_printf(&c->mod_out, "%s %s-%d-%d", cls[tr - d->tr], base, tr->to, k2);
            }
            loom_buf_putc(&c->mod_out, '\n');
        }
    loom_buf_printf(e, "\"\\\"\" %s-0-0", base);
    pattern_remember(c, p, mn0, mx0, base);
    rc = 0;
done:
    for (int i = 0; d && i < d->ntr; i++) {
        if (cls) free(cls[i]);
        if (body) free(body[i]);
    }
    free(cls), free(body);
    free(live), free(a), free(f), free(d);
    return rc;
}

/* The GBNF expression for regex re (json: inside a JSON string). */
static int regex_expr(const char *re, int json, loom_buf *b, char *err, size_t cap) {
    rx x = {.s = re, .p = re, .json = json, .err = err, .err_cap = cap};
    if (rx_alt(&x, b, 0)) return -1;
    if (*x.p == ')') return rfail(&x, "unbalanced ')'");
    return 0;
}

char *loom_grammar_regex_to_gbnf(const char *re, char *err, size_t cap) {
    loom_buf b = {0};
    loom_buf_puts(&b, "root ::= ");
    if (regex_expr(re, 0, &b, err, cap)) {
        loom_buf_free(&b);
        return NULL;
    }
    loom_buf_putc(&b, '\n');
    if (b.oom) {
        loom_buf_free(&b);
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    return b.p;
}

/* ---- JSON Schema -> GBNF --------------------------------------------------- */

static const char PRELUDE[] =
    "ws ::= (\" \" | \"\\n\" [ \\t]{0,20})?\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-cchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\\x22\\x5Cbfnrt]\n"
    "json-int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "json-bool ::= \"true\" | \"false\"\n"
    "json-null ::= \"null\"\n"
    "json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value (ws \",\" ws json-string ws \":\" ws json-value)*)? ws \"}\"\n"
    "json-array ::= \"[\" ws (json-value (ws \",\" ws json-value)*)? ws \"]\"\n"
    "json-digit2 ::= [0-9] [0-9]\n"
    "json-date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "json-time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
    "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "json-hex ::= [0-9a-fA-F]\n"
    "json-uuid ::= json-hex{8} \"-\" json-hex{4} \"-\" json-hex{4} \"-\" json-hex{4} \"-\" json-hex{12}\n"
    "json-email ::= [a-zA-Z0-9_+-] ([a-zA-Z0-9._+-]{0,62} [a-zA-Z0-9_+-])? \"@\" "
    "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])? (\".\" [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?){1,4}\n"
    "json-octet ::= [0-9] | [1-9] [0-9] | \"1\" [0-9] [0-9] | \"2\" [0-4] [0-9] | \"25\" [0-5]\n"
    "json-ipv4 ::= json-octet \".\" json-octet \".\" json-octet \".\" json-octet\n"
    "json-label ::= [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?\n"
    "json-hostname ::= json-label (\".\" json-label){0,7}\n"
    "json-uri ::= [a-z] [a-z0-9+.-]{0,15} \"://\" json-hostname (\"/\" [a-zA-Z0-9._~!$&'()*+,;=:@-]{0,64}){0,8}\n";

static int gen(sconv *c, const cJSON *s, loom_buf *e);

/* A fresh rule name into name (16 bytes). */
static void new_name(sconv *c, char *name) { snprintf(name, 16, "s%d", c->n_names++); }

/* Keeps a schema made here until the conversion ends; NULL (failed) for
 * NULL. */
static cJSON *own(sconv *c, cJSON *m) {
    if (!m) return sfail(c, "out of memory"), NULL;
    if (c->n_owned == c->cap_owned) {
        int cap = c->cap_owned ? 2 * c->cap_owned : 64;
        cJSON **o = realloc(c->owned, sizeof *o * (size_t)cap);
        if (!o) return cJSON_Delete(m), sfail(c, "out of memory"), NULL;
        c->owned = o, c->cap_owned = cap;
    }
    return c->owned[c->n_owned++] = m;
}

static void sconv_free(sconv *c) {
    for (int i = 0; i < c->n_owned; i++) cJSON_Delete(c->owned[i]);
    free(c->owned);
    for (int i = 0; i < c->n_mods; i++) free(c->mods[i]);
    for (int i = 0; i < c->n_pats; i++) free(c->pats[i].p);
    free(c->pats);
}

static void put_rule(sconv *c, const char *name, const loom_buf *body) {
    loom_buf_printf(&c->out, "%s ::= %s\n", name, body->p ? body->p : "\"\"");
}

static const cJSON *resolve_ref(sconv *c, const char *ref) {
    if (ref[0] != '#') return sfail(c, "$ref '%s': only references inside the schema (#...) are supported", ref), NULL;
    const cJSON *n = c->doc;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char key[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof key) {
            if (p[0] == '~' && p[1] == '1') key[k++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') key[k++] = '~', p += 2;
            else key[k++] = *p++;
        }
        key[k] = 0;
        if (cJSON_IsArray(n)) n = cJSON_GetArrayItem(n, atoi(key));
        else n = cJSON_GetObjectItemCaseSensitive(n, key);
        if (!n) return sfail(c, "$ref '%s': no such place in the schema", ref), NULL;
    }
    if (*p) return sfail(c, "$ref '%s': expected a JSON pointer (#/...)", ref), NULL;
    return n;
}

/* 1 when schema s has only annotation keywords (besides `except`). */
static int annotations_only(const cJSON *s, const char *except) {
    static const char *const notes[] = {"title", "description", "$comment", "default", "examples", "deprecated",
                                        "readOnly", "writeOnly", "$schema", "$id", "id", "markdownDescription"};
    if (cJSON_IsTrue(s)) return 1;
    if (!cJSON_IsObject(s)) return 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        int note = except && !strcmp(k->string, except);
        for (size_t i = 0; i < LOOM_ARRAY_LEN(notes) && !note; i++) note = !strcmp(k->string, notes[i]);
        if (!note) return 0;
    }
    return 1;
}

static int is_required(const cJSON *req, const char *key) {
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, key)) return 1;
    return 0;
}

/* ---- types, intersection and negation ---------------------------------------
 *
 * anyOf/oneOf branches, if/then/else and not are rewritten into schemas gen
 * writes directly: a branch is intersected with the keywords around it
 * (merge_into: types and values intersect, bounds take the stricter, the
 * same property's schemas intersect), and a negation is pushed into the
 * schema it applies to (negate_into): types are removed, values excluded
 * (K_NOTVALS, written by the typed generators), keys forbidden (K_FORBID),
 * a conjunction becomes alternatives (K_OR). Where the result cannot be
 * written exactly the conversion fails, naming the keyword. */

/* Keywords of schemas made here (never in a schema from a request: a key
 * starting with \x01). */
#define K_NOTVALS "\001notvals" /* values the instance is not equal to */
#define K_FORBID "\001forbid"   /* object keys that are absent */
#define K_FRAC "\001frac"       /* a number that is not an integer */
#define K_OR "\001or"           /* alternatives, each a whole schema */
#define K_VALS "\001vals"       /* values_rewrite was applied (dropped by any change) */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_FRAC = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ALL = 127 };

static const cJSON *get(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

static int is_note(const char *k) {
    static const char *const notes[] = {"title", "description", "$comment", "default", "examples", "deprecated",
                                        "readOnly", "writeOnly", "$schema", "$id", "id", "markdownDescription",
                                        "$defs", "definitions"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(notes); i++)
        if (!strcmp(k, notes[i])) return 1;
    return 0;
}

static int type_bit(const char *t) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    static const int bits[] = {T_NULL, T_BOOL, T_INT, T_INT | T_FRAC, T_STR, T_ARR, T_OBJ};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return bits[i];
    return 0;
}

static int value_bits(const cJSON *v) {
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsNumber(v)) return v->valuedouble == floor(v->valuedouble) ? T_INT : T_FRAC;
    if (cJSON_IsString(v)) return T_STR;
    return cJSON_IsArray(v) ? T_ARR : T_OBJ;
}

static int list_has_str(const cJSON *arr, const char *k) {
    for (const cJSON *x = arr ? arr->child : NULL; x; x = x->next)
        if (cJSON_IsString(x) && !strcmp(x->valuestring, k)) return 1;
    return 0;
}

/* The types a "type" value names (all when NULL). */
static int tbits(const cJSON *t) {
    int bits = 0;
    if (!t) bits = T_ALL;
    else if (cJSON_IsString(t)) bits = type_bit(t->valuestring);
    else
        for (const cJSON *v = cJSON_IsArray(t) ? t->child : NULL; v; v = v->next)
            bits |= cJSON_IsString(v) ? type_bit(v->valuestring) : 0;
    return bits;
}

/* The types s's "type" allows (all when absent). */
static int type_bits(const cJSON *s) {
    int bits = tbits(get(s, "type"));
    if (cJSON_IsTrue(get(s, K_FRAC))) bits &= ~T_INT;
    return bits;
}

/* The types of the values that validate against s (a superset). */
static int valid_bits(const cJSON *s) {
    if (!cJSON_IsObject(s)) return cJSON_IsFalse(s) ? 0 : T_ALL;
    const cJSON *or = get(s, K_OR), *v;
    if (or) {
        int bits = 0;
        for (const cJSON *b = or->child; b; b = b->next) bits |= valid_bits(b);
        return bits;
    }
    int bits = type_bits(s);
    if ((v = get(s, "const"))) return bits & value_bits(v);
    if ((v = get(s, "enum"))) {
        int vb = 0;
        for (const cJSON *x = v->child; x; x = x->next) vb |= value_bits(x);
        bits &= vb;
    }
    return bits;
}

/* The types of the values gen writes for s: valid_bits, narrowed where gen
 * picks a type from the keywords of an untyped schema. */
static int gen_bits(const cJSON *s) {
    int bits = valid_bits(s);
    if (!cJSON_IsObject(s) || get(s, "type") || get(s, "const") || get(s, "enum") || get(s, K_OR)) return bits;
    if (get(s, "properties") || get(s, "required") || get(s, "additionalProperties") || get(s, K_FORBID)) return T_OBJ;
    if (get(s, "items") || get(s, "minItems")) return T_ARR;
    if (get(s, "pattern") || get(s, "minLength") || get(s, "maxLength") || get(s, "format")) return T_STR;
    return bits;
}

/* "type" for the types in bits (a number that is not an integer is
 * "number" with K_FRAC). */
static void set_type(cJSON *m, int bits) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    static const int tb[] = {T_NULL, T_BOOL, T_INT, T_FRAC, T_STR, T_ARR, T_OBJ};
    cJSON_DeleteItemFromObjectCaseSensitive(m, "type");
    cJSON_DeleteItemFromObjectCaseSensitive(m, K_FRAC);
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; i < 7; i++) {
        if (!(bits & tb[i])) continue;
        if (tb[i] == T_INT && (bits & T_FRAC)) continue; /* "number" below holds both */
        cJSON_AddItemToArray(list, cJSON_CreateString(tb[i] == T_FRAC ? "number" : names[i]));
    }
    if ((bits & T_FRAC) && !(bits & T_INT)) cJSON_AddTrueToObject(m, K_FRAC);
    if (cJSON_GetArraySize(list) == 1) {
        cJSON *one = cJSON_DetachItemFromArray(list, 0);
        cJSON_Delete(list);
        cJSON_AddItemToObject(m, "type", one);
    } else cJSON_AddItemToObject(m, "type", list);
}

static int has_value(const cJSON *arr, const cJSON *v) {
    for (const cJSON *x = arr ? arr->child : NULL; x; x = x->next)
        if (cJSON_Compare(x, v, 1)) return 1;
    return 0;
}

/* s's const or enum as a new array, or NULL when it has neither. */
static cJSON *values_of(const cJSON *s) {
    const cJSON *v;
    if ((v = get(s, "const"))) {
        cJSON *a = cJSON_CreateArray();
        cJSON_AddItemToArray(a, cJSON_Duplicate(v, 1));
        return a;
    }
    return (v = get(s, "enum")) && cJSON_IsArray(v) ? cJSON_Duplicate(v, 1) : NULL;
}

/* Keeps the values of m's const/enum for which keep(v, arg) holds, as
 * "enum"; 1 when none is left. */
static int filter_values(cJSON *m, int (*keep)(const cJSON *, const void *), const void *arg) {
    cJSON *vals = values_of(m), *kept = cJSON_CreateArray();
    for (const cJSON *x = vals ? vals->child : NULL; x; x = x->next)
        if (keep(x, arg)) cJSON_AddItemToArray(kept, cJSON_Duplicate(x, 1));
    cJSON_Delete(vals);
    cJSON_DeleteItemFromObjectCaseSensitive(m, "const");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "enum");
    int empty = !cJSON_GetArraySize(kept);
    cJSON_AddItemToObject(m, "enum", kept);
    return empty;
}

static int keep_in(const cJSON *v, const void *arr) { return has_value(arr, v); }
static int keep_out(const cJSON *v, const void *arr) { return !has_value(arr, v); }
static int keep_bits(const cJSON *v, const void *bits) { return (value_bits(v) & *(const int *)bits) != 0; }
static int keep_no_key(const cJSON *v, const void *key) { return !cJSON_IsObject(v) || !get(v, key); }

static void add_to_list(cJSON *m, const char *k, const cJSON *v) {
    cJSON *l = cJSON_GetObjectItemCaseSensitive(m, k);
    if (!l) l = cJSON_AddArrayToObject(m, k);
    if (!has_value(l, v)) cJSON_AddItemToArray(l, cJSON_Duplicate(v, 1));
}

static const cJSON *deref(sconv *c, const cJSON *s) {
    for (int hops = 0; cJSON_IsObject(s) && get(s, "$ref"); hops++) {
        const cJSON *r = get(s, "$ref");
        if (hops == 16) return sfail(c, "$ref chain longer than 16"), NULL;
        if (!cJSON_IsString(r)) return sfail(c, "'$ref' must be a string"), NULL;
        if (!(s = resolve_ref(c, r->valuestring))) return NULL;
    }
    return s;
}

/* Replaces m's members by {K_OR: alts}; 1 (nothing validates) when alts is
 * empty. Takes alts. */
static int become_or(cJSON *m, cJSON *alts) {
    if (!cJSON_GetArraySize(alts)) return cJSON_Delete(alts), 1;
    while (m->child) cJSON_Delete(cJSON_DetachItemViaPointer(m, m->child));
    if (cJSON_GetArraySize(alts) == 1) {
        cJSON *one = cJSON_DetachItemFromArray(alts, 0);
        cJSON_Delete(alts);
        for (cJSON *q = one->child; q;) {
            cJSON *next = q->next;
            cJSON_AddItemToObject(m, q->string, cJSON_DetachItemViaPointer(one, q));
            q = next;
        }
        cJSON_Delete(one);
        return 0;
    }
    cJSON_AddItemToObject(m, K_OR, alts);
    return 0;
}

typedef int (*rewrite_fn)(sconv *c, cJSON *m, const cJSON *arg);

/* Applies f to each alternative of an m that has K_OR, dropping those
 * that end empty: -1 error, 1 all empty, 0 done; 2 when m has no K_OR. */
static int each_alt(sconv *c, cJSON *m, rewrite_fn f, const cJSON *arg) {
    cJSON *or = cJSON_GetObjectItemCaseSensitive(m, K_OR);
    if (!or) return 2;
    for (cJSON *x = or->child; x;) {
        cJSON *next = x->next;
        int r = f(c, x, arg);
        if (r < 0) return -1;
        if (r) cJSON_Delete(cJSON_DetachItemViaPointer(or, x));
        x = next;
    }
    return cJSON_GetArraySize(or) ? 0 : 1;
}

static int merge_into(sconv *c, cJSON *m, const cJSON *b);
static int negate_into(sconv *c, cJSON *m, const cJSON *n);

/* a AND b as a new schema (the caller owns it); *empty when nothing
 * validates. NULL on failure. */
static cJSON *intersect(sconv *c, const cJSON *a0, const cJSON *b0, int *empty) {
    *empty = 0;
    const cJSON *a = deref(c, a0), *b = a ? deref(c, b0) : NULL;
    if (!a || !b) return NULL;
    if (annotations_only(b, NULL)) return cJSON_Duplicate(a0, 1);
    if (annotations_only(a, NULL)) return cJSON_Duplicate(b0, 1);
    if (cJSON_IsFalse(a) || cJSON_IsFalse(b)) return *empty = 1, cJSON_CreateFalse();
    if (!cJSON_IsObject(a)) return sfail(c, "a schema must be an object or a boolean"), NULL;
    cJSON *m = cJSON_Duplicate(a, 1);
    int r = merge_into(c, m, b);
    if (r < 0) return cJSON_Delete(m), NULL;
    *empty = r;
    return m;
}

/* m's key k must be absent; 1 when m requires it. */
static int forbid(cJSON *m, const char *k) {
    if (is_required(get(m, "required"), k)) return 1;
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "properties"), k);
    if (get(m, "const") || get(m, "enum")) return filter_values(m, keep_no_key, k);
    cJSON *s = cJSON_CreateString(k);
    add_to_list(m, K_FORBID, s);
    cJSON_Delete(s);
    return 0;
}

/* The schema of m's property k (its additionalProperties' when unlisted):
 * a new schema, or NULL when k cannot appear. */
static cJSON *prop_schema(const cJSON *m, const char *k) {
    const cJSON *p = get(get(m, "properties"), k), *ap = get(m, "additionalProperties");
    if (p) return cJSON_Duplicate(p, 1);
    if (list_has_str(get(m, K_FORBID), k) || cJSON_IsFalse(ap)) return NULL;
    return cJSON_IsObject(ap) ? cJSON_Duplicate(ap, 1) : cJSON_CreateObject();
}

static void set_prop(cJSON *m, const char *k, cJSON *v) {
    cJSON *props = cJSON_GetObjectItemCaseSensitive(m, "properties");
    if (!props) props = cJSON_AddObjectToObject(m, "properties");
    if (get(props, k)) cJSON_ReplaceItemInObjectCaseSensitive(props, k, v);
    else cJSON_AddItemToObject(props, k, v);
}

static int is_min_key(const char *k) {
    return !strcmp(k, "minimum") || !strcmp(k, "exclusiveMinimum") || !strcmp(k, "minLength") ||
           !strcmp(k, "minItems") || !strcmp(k, "minProperties");
}
static int is_max_key(const char *k) {
    return !strcmp(k, "maximum") || !strcmp(k, "exclusiveMaximum") || !strcmp(k, "maxLength") ||
           !strcmp(k, "maxItems") || !strcmp(k, "maxProperties");
}

/* m := m AND b. 0 done, 1 nothing validates, -1 failed. */
static int merge_into(sconv *c, cJSON *m, const cJSON *b) {
    if (!(b = deref(c, b))) return -1;
    if (cJSON_IsTrue(b)) return 0;
    if (cJSON_IsFalse(b)) return 1;
    if (!cJSON_IsObject(b)) return sfail(c, "a schema must be an object or a boolean");
    cJSON_DeleteItemFromObjectCaseSensitive(m, K_VALS);
    int r = each_alt(c, m, merge_into, b);
    if (r != 2) return r;
    const cJSON *bor = get(b, K_OR);
    if (bor) { /* m AND (b1 OR b2) = (m AND b1) OR (m AND b2) */
        cJSON *alts = cJSON_CreateArray();
        for (const cJSON *x = bor->child; x; x = x->next) {
            cJSON *y = cJSON_Duplicate(m, 1);
            int rr = merge_into(c, y, x);
            if (rr < 0) return cJSON_Delete(y), cJSON_Delete(alts), -1;
            if (rr) cJSON_Delete(y);
            else cJSON_AddItemToArray(alts, y);
        }
        return become_or(m, alts);
    }
    /* properties first: b's are checked against m's own additionalProperties */
    for (int pass = 0; pass < 2; pass++)
    for (const cJSON *q = b->child; q; q = q->next) {
        const char *k = q->string;
        cJSON *have = cJSON_GetObjectItemCaseSensitive(m, k);
        if ((!strcmp(k, "properties")) != !pass) continue;
        if (is_note(k) || !strcmp(k, K_VALS) || (have && cJSON_Compare(have, q, 1))) continue;
        if (!strcmp(k, "const") || !strcmp(k, "enum")) {
            if (!get(m, "const") && !get(m, "enum")) {
                cJSON_AddItemToObject(m, k, cJSON_Duplicate(q, 1));
                continue;
            }
            cJSON *vals = values_of(b);
            int e = filter_values(m, keep_in, vals);
            cJSON_Delete(vals);
            if (e) return 1;
            continue;
        }
        if (!strcmp(k, "type")) {
            int bits = type_bits(m) & type_bits(b);
            if (!bits) return 1;
            set_type(m, bits);
            continue;
        }
        if (!strcmp(k, "properties") && cJSON_IsObject(q) && (!have || cJSON_IsObject(have))) {
            for (const cJSON *p = q->child; p; p = p->next) {
                cJSON *mine = prop_schema(m, p->string);
                if (!mine) continue; /* the key cannot appear: nothing to constrain */
                int e;
                cJSON *x = intersect(c, mine, p, &e);
                cJSON_Delete(mine);
                if (!x) return -1;
                if (e) {
                    cJSON_Delete(x);
                    if (forbid(m, p->string)) return 1;
                } else set_prop(m, p->string, x);
            }
            continue;
        }
        if (!have) {
            cJSON_AddItemToObject(m, k, cJSON_Duplicate(q, 1));
            continue;
        }
        if (!strcmp(k, "required") || !strcmp(k, K_NOTVALS) || !strcmp(k, K_FORBID) || !strcmp(k, "allOf")) {
            for (const cJSON *x = cJSON_IsArray(q) ? q->child : NULL; x; x = x->next) add_to_list(m, k, x);
            continue;
        }
        if ((is_min_key(k) || is_max_key(k)) && cJSON_IsNumber(have) && cJSON_IsNumber(q)) {
            double v = is_min_key(k) ? LOOM_MAX(have->valuedouble, q->valuedouble) : LOOM_MIN(have->valuedouble, q->valuedouble);
            cJSON_SetNumberValue(have, v);
            continue;
        }
        if (!strcmp(k, "not")) { /* not A and not B = not (A or B) */
            cJSON *both = cJSON_CreateObject(), *any = cJSON_AddArrayToObject(both, "anyOf");
            cJSON_AddItemToArray(any, cJSON_Duplicate(have, 1));
            cJSON_AddItemToArray(any, cJSON_Duplicate(q, 1));
            cJSON_ReplaceItemInObjectCaseSensitive(m, k, both);
            continue;
        }
        if (!strcmp(k, "additionalProperties") || !strcmp(k, "items")) {
            int e;
            cJSON *x = cJSON_IsFalse(have) || cJSON_IsFalse(q) ? cJSON_CreateFalse() : intersect(c, have, q, &e);
            if (!x) return -1;
            cJSON_ReplaceItemInObjectCaseSensitive(m, k, x);
            continue;
        }
        if (!strcmp(k, "multipleOf") && cJSON_IsNumber(have) && cJSON_IsNumber(q)) {
            double hi = LOOM_MAX(have->valuedouble, q->valuedouble), lo = LOOM_MIN(have->valuedouble, q->valuedouble);
            if (lo > 0 && hi / lo == floor(hi / lo)) {
                cJSON_SetNumberValue(have, hi);
                continue;
            }
        }
        return sfail(c, "'%s' with two different values (on a schema and on its branch) is not supported", k);
    }
    /* b's additionalProperties false: m's other listed keys are gone */
    if (cJSON_IsFalse(get(b, "additionalProperties"))) {
        cJSON *props = cJSON_GetObjectItemCaseSensitive(m, "properties");
        for (cJSON *p = props ? props->child : NULL; p;) {
            cJSON *next = p->next;
            if (!get(get(b, "properties"), p->string)) {
                if (is_required(get(m, "required"), p->string)) return 1;
                cJSON_Delete(cJSON_DetachItemViaPointer(props, p));
            }
            p = next;
        }
    }
    for (const cJSON *r2 = get(m, "required") ? get(m, "required")->child : NULL; r2; r2 = r2->next)
        if (cJSON_IsString(r2) && list_has_str(get(m, K_FORBID), r2->valuestring)) return 1;
    static const char *const lohi[][2] = {{"minimum", "maximum"}, {"minLength", "maxLength"}, {"minItems", "maxItems"}};
    for (int i = 0; i < 3; i++) {
        const cJSON *lo = get(m, lohi[i][0]), *hi = get(m, lohi[i][1]);
        if (cJSON_IsNumber(lo) && cJSON_IsNumber(hi) && lo->valuedouble > hi->valuedouble) return 1;
    }
    return 0;
}

/* 1 when negate_into can write "not n". */
static int negatable(sconv *c, const cJSON *n, int depth) {
    if (depth > 8 || !(n = deref(c, n))) return 0;
    if (cJSON_IsFalse(n)) return 1;
    if (!cJSON_IsObject(n)) return 0;
    int parts = 0;
    for (const cJSON *q = n->child; q; q = q->next) {
        const char *k = q->string;
        if (is_note(k)) continue;
        parts++;
        if (!strcmp(k, "type") || !strcmp(k, "enum") || !strcmp(k, "const") || !strcmp(k, "required")) continue;
        if (!strcmp(k, "not")) continue;
        if (!strcmp(k, "properties") || !strcmp(k, "anyOf") || !strcmp(k, "allOf") || !strcmp(k, "oneOf")) {
            if (!strcmp(k, "oneOf") && cJSON_GetArraySize(q) > 1) return 0;
            for (const cJSON *x = q->child; x; x = x->next)
                if (!negatable(c, x, depth + 1)) return 0;
            continue;
        }
        return 0;
    }
    return parts > 0;
}

/* m := m AND NOT (n's one keyword k: v). */
static int negate_part(sconv *c, cJSON *m, const char *k, const cJSON *v) {
    if (!strcmp(k, "type")) {
        int bits = gen_bits(m) & ~tbits(v);
        if (!bits) return 1;
        if (get(m, "const") || get(m, "enum")) return filter_values(m, keep_bits, &bits);
        set_type(m, bits);
        return 0;
    }
    if (!strcmp(k, "const") || !strcmp(k, "enum")) {
        cJSON *vals = cJSON_CreateArray();
        if (!strcmp(k, "const")) cJSON_AddItemToArray(vals, cJSON_Duplicate(v, 1));
        else
            for (const cJSON *x = v->child; x; x = x->next) cJSON_AddItemToArray(vals, cJSON_Duplicate(x, 1));
        int r = 0;
        if (get(m, "const") || get(m, "enum")) r = filter_values(m, keep_out, vals);
        else
            for (const cJSON *x = vals->child; x; x = x->next) add_to_list(m, K_NOTVALS, x);
        cJSON_Delete(vals);
        return r;
    }
    if (!strcmp(k, "required")) { /* objects without one of the keys (other types pass) */
        int n = cJSON_GetArraySize(v);
        if (!n) return 1;
        if (n == 1) return cJSON_IsString(v->child) ? forbid(m, v->child->valuestring) : 1;
        cJSON *alts = cJSON_CreateArray();
        for (const cJSON *x = v->child; x; x = x->next) {
            cJSON *y = cJSON_Duplicate(m, 1);
            if (!cJSON_IsString(x) || forbid(y, x->valuestring)) cJSON_Delete(y);
            else cJSON_AddItemToArray(alts, y);
        }
        return become_or(m, alts);
    }
    if (!strcmp(k, "properties")) { /* an object with one listed key present and not matching */
        cJSON *alts = cJSON_CreateArray();
        for (const cJSON *p = v->child; p; p = p->next) {
            cJSON *mine = prop_schema(m, p->string);
            if (!mine) continue;
            int r = negate_into(c, mine, p);
            if (r < 0) return cJSON_Delete(mine), cJSON_Delete(alts), -1;
            if (r) {
                cJSON_Delete(mine);
                continue;
            }
            cJSON *y = cJSON_Duplicate(m, 1);
            int bits = T_OBJ;
            if (get(y, "const") || get(y, "enum")) {
                cJSON_Delete(y), cJSON_Delete(mine), cJSON_Delete(alts);
                return sfail(c, "'not' over 'properties' on a schema with const or enum is not supported");
            }
            set_type(y, gen_bits(y) & bits);
            set_prop(y, p->string, mine);
            cJSON *s = cJSON_CreateString(p->string);
            add_to_list(y, "required", s);
            cJSON_Delete(s);
            if (!(gen_bits(y) & T_OBJ)) cJSON_Delete(y);
            else cJSON_AddItemToArray(alts, y);
        }
        return become_or(m, alts);
    }
    if (!strcmp(k, "anyOf") || (!strcmp(k, "oneOf") && cJSON_GetArraySize(v) == 1)) { /* none of them */
        for (const cJSON *x = v->child; x; x = x->next) {
            int r = negate_into(c, m, x);
            if (r) return r;
        }
        return 0;
    }
    if (!strcmp(k, "allOf")) { /* not one of them */
        cJSON *alts = cJSON_CreateArray();
        for (const cJSON *x = v->child; x; x = x->next) {
            cJSON *y = cJSON_Duplicate(m, 1);
            int r = negate_into(c, y, x);
            if (r < 0) return cJSON_Delete(y), cJSON_Delete(alts), -1;
            if (r) cJSON_Delete(y);
            else cJSON_AddItemToArray(alts, y);
        }
        return become_or(m, alts);
    }
    if (!strcmp(k, "not")) return merge_into(c, m, v);
    size_t mark = at_push(c, k);
    sfail(c, "'not' over '%s' is not supported (loom writes the negation of type, enum, const, required, properties, "
             "anyOf, allOf and not)", k);
    c->at_len = mark;
    return -1;
}

/* m := m AND NOT n: one keyword at a time; several are a conjunction,
 * whose negation is the alternatives of each one's. */
static int negate_into(sconv *c, cJSON *m, const cJSON *n) {
    if (!(n = deref(c, n))) return -1;
    if (cJSON_IsFalse(n)) return 0;
    if (cJSON_IsTrue(n)) return 1;
    if (!cJSON_IsObject(n)) return sfail(c, "a schema must be an object or a boolean");
    cJSON_DeleteItemFromObjectCaseSensitive(m, K_VALS);
    int r = each_alt(c, m, negate_into, n);
    if (r != 2) return r;
    int parts = 0;
    const cJSON *one = NULL;
    for (const cJSON *q = n->child; q; q = q->next)
        if (!is_note(q->string)) parts++, one = q;
    if (!parts) return 1;
    if (parts == 1) return negate_part(c, m, one->string, one);
    cJSON *alts = cJSON_CreateArray();
    for (const cJSON *q = n->child; q; q = q->next) {
        if (is_note(q->string)) continue;
        cJSON *y = cJSON_Duplicate(m, 1);
        int rr = negate_part(c, y, q->string, q);
        if (rr < 0) return cJSON_Delete(y), cJSON_Delete(alts), -1;
        if (rr) cJSON_Delete(y);
        else cJSON_AddItemToArray(alts, y);
    }
    return become_or(m, alts);
}

/* A branch of s's anyOf / oneOf (key) intersected with s's other keywords,
 * which hold for every branch. NULL with *empty set when nothing can
 * validate both; NULL with c->failed on failure. */
static const cJSON *with_siblings(sconv *c, const cJSON *s, const char *key, const cJSON *branch, int *empty) {
    *empty = 0;
    cJSON *m = own(c, cJSON_Duplicate(s, 1));
    if (!m) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(m, key);
    int r = merge_into(c, m, branch);
    if (r) return *empty = r > 0, NULL;
    return m;
}

/* if/then/else: (s AND if AND then) OR (s AND NOT if AND else). */
static const cJSON *rewrite_if(sconv *c, const cJSON *s) {
    const cJSON *cond = get(s, "if"), *then = get(s, "then"), *els = get(s, "else");
    cJSON *base = own(c, cJSON_Duplicate(s, 1));
    if (!base) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(base, "if");
    cJSON_DeleteItemFromObjectCaseSensitive(base, "then");
    cJSON_DeleteItemFromObjectCaseSensitive(base, "else");
    if (!cond) return base; /* then and else without if do nothing */
    const cJSON *d = deref(c, cond);
    if (!d) return NULL;
    if (annotations_only(d, NULL) || cJSON_IsFalse(d)) { /* always or never: one side */
        const cJSON *side = cJSON_IsFalse(d) ? els : then;
        size_t mark = at_push(c, cJSON_IsFalse(d) ? "else" : "then");
        int r = side ? merge_into(c, base, side) : 0;
        if (r > 0) sempty(c, "nothing validates against this and the schema around it");
        c->at_len = mark;
        return r ? NULL : base;
    }
    size_t mark = at_push(c, "if");
    if (!negatable(c, cond, 0)) {
        if (!c->failed)
            sfail(c, "'if' is supported when loom can write its negation (type, enum, const, required, properties, "
                     "anyOf, allOf and not)");
        return NULL;
    }
    c->at_len = mark;
    cJSON *yes = cJSON_Duplicate(base, 1), *no = cJSON_Duplicate(base, 1), *alts = cJSON_CreateArray();
    int ry = merge_into(c, yes, cond);
    if (!ry && then) mark = at_push(c, "then"), ry = merge_into(c, yes, then), c->at_len = mark;
    int rn = ry < 0 ? -1 : (mark = at_push(c, "if"), negate_into(c, no, cond));
    c->at_len = mark;
    if (!rn && els) mark = at_push(c, "else"), rn = merge_into(c, no, els), c->at_len = mark;
    if (ry < 0 || rn < 0) return cJSON_Delete(yes), cJSON_Delete(no), cJSON_Delete(alts), NULL;
    if (!ry) cJSON_AddItemToArray(alts, yes);
    else cJSON_Delete(yes);
    if (!rn) cJSON_AddItemToArray(alts, no);
    else cJSON_Delete(no);
    cJSON *m = own(c, cJSON_CreateObject());
    if (!m) return cJSON_Delete(alts), NULL;
    if (become_or(m, alts)) return sempty(c, "neither 'then' nor 'else' can hold alongside the schema around them"), NULL;
    return m;
}

/* s with "not" pushed into it. */
static const cJSON *apply_not(sconv *c, const cJSON *s) {
    cJSON *m = own(c, cJSON_Duplicate(s, 1));
    if (!m) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(m, "not");
    size_t mark = at_push(c, "not");
    int r = negate_into(c, m, get(s, "not"));
    if (r > 0) sempty(c, "nothing validates against this schema and its 'not'");
    c->at_len = mark;
    return r ? NULL : m;
}

/* 1 when no value gen writes for a validates against b (both merged with
 * their siblings): their types differ, their values do, or a key a always
 * writes has values b's does not take, or that b does not allow. */
static int excludes(sconv *c, const cJSON *a, const cJSON *b) {
    int ab = gen_bits(a), bb = valid_bits(b);
    if (!(ab & bb)) return 1;
    cJSON *va = values_of(a), *vb = values_of(b);
    int disjoint = va && vb;
    for (const cJSON *x = va && vb ? va->child : NULL; x && disjoint; x = x->next) disjoint = !has_value(vb, x);
    cJSON_Delete(va), cJSON_Delete(vb);
    if (disjoint) return 1;
    if (ab != T_OBJ || get(a, K_OR)) return 0;
    const cJSON *req = get(a, "required"), *bap = get(b, "additionalProperties");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) continue;
        const cJSON *pb = get(get(b, "properties"), r->valuestring);
        if (!pb && cJSON_IsFalse(bap)) return 1;
        if (list_has_str(get(b, K_FORBID), r->valuestring)) return 1;
        const cJSON *pa = get(get(a, "properties"), r->valuestring);
        if (!pa || !pb || !(pa = deref(c, pa)) || !(pb = deref(c, pb))) continue;
        if (excludes(c, pa, pb)) return 1;
    }
    for (const cJSON *r = get(b, "required") ? get(b, "required")->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r)) continue;
        else if (list_has_str(get(a, K_FORBID), r->valuestring) || (cJSON_IsFalse(get(a, "additionalProperties")) && !get(get(a, "properties"), r->valuestring)))
            return 1;
    return 0;
}

/* Non-negative integers [lo, hi] written with the same number of digits n
 * (a and z their digits): an expression without leading-zero checks. */
static void same_len(loom_buf *e, const char *a, const char *z, int n) {
    if (!n) {
        loom_buf_puts(e, "\"\"");
        return;
    }
    if (!memcmp(a, z, (size_t)n)) {
        put_lit(e, a, (size_t)n);
        return;
    }
    if (a[0] == z[0]) {
        loom_buf_printf(e, "\"%c\" ", a[0]);
        same_len(e, a + 1, z + 1, n - 1);
        return;
    }
    int all0 = 1, all9 = 1;
    for (int i = 1; i < n; i++) all0 &= a[i] == '0', all9 &= z[i] == '9';
    char nines[MAX_INT_DIGITS + 2], zeros[MAX_INT_DIGITS + 2];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int first = all0 ? a[0] : a[0] + 1, last = all9 ? z[0] : z[0] - 1, alts = 0;
    loom_buf_puts(e, "(");
    if (!all0) {
        loom_buf_printf(e, "\"%c\" (", a[0]);
        same_len(e, a + 1, nines, n - 1);
        loom_buf_puts(e, ")");
        alts++;
    }
    if (first <= last) {
        if (alts++) loom_buf_puts(e, " | ");
        loom_buf_printf(e, "[%c-%c]", first, last);
        if (n > 1) loom_buf_printf(e, " [0-9]{%d}", n - 1);
    }
    if (!all9) {
        if (alts++) loom_buf_puts(e, " | ");
        loom_buf_printf(e, "\"%c\" (", z[0]);
        same_len(e, zeros, z + 1, n - 1);
        loom_buf_puts(e, ")");
    }
    loom_buf_puts(e, ")");
}

static long long pow10ll(int n) {
    long long v = 1;
    while (n-- > 0) v *= 10;
    return v;
}

/* 0 <= lo <= hi: the integers in between, without leading zeros. */
static void nonneg_range(loom_buf *e, long long lo, long long hi) {
    char a[32], z[32];
    int la = snprintf(a, sizeof a, "%lld", lo), lz = snprintf(z, sizeof z, "%lld", hi), alts = 0;
    loom_buf_puts(e, "(");
    for (int L = la; L <= lz; L++) {
        long long from = LOOM_MAX(lo, L == 1 ? 0 : pow10ll(L - 1)), to = LOOM_MIN(hi, pow10ll(L) - 1);
        if (from > to) continue;
        snprintf(a, sizeof a, "%0*lld", L, from);
        snprintf(z, sizeof z, "%0*lld", L, to);
        if (alts++) loom_buf_puts(e, " | ");
        loom_buf_puts(e, "(");
        same_len(e, a, z, L);
        loom_buf_puts(e, ")");
    }
    loom_buf_puts(e, ")");
}

static void int_range(loom_buf *e, long long lo, long long hi) {
    if (lo >= 0) {
        nonneg_range(e, lo, hi);
        return;
    }
    loom_buf_puts(e, "(\"-\" ");
    nonneg_range(e, hi < 0 ? -hi : 1, -lo);
    if (hi >= 0) {
        loom_buf_puts(e, " | ");
        nonneg_range(e, 0, hi);
    }
    loom_buf_puts(e, ")");
}

/* ---- values left out, multiples ------------------------------------------ */

/* Excluded strings: a JSON string equal to none of them, each character
 * written one way (json-cchar: no \u or \/ escapes), so no other spelling
 * of an excluded value gets through. A trie over the excluded values'
 * code points: at each node the string may end (unless a value ends
 * there), go on along a value, or leave every value with another
 * character and continue freely. Lengths count characters. */
static int enc_cp(uint32_t cp, char *out) {
    const char *e = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : cp == '\n' ? "\\n"
                  : cp == '\r' ? "\\r" : cp == '\t' ? "\\t" : NULL;
    if (e) return memcpy(out, e, 2), 2;
    if (cp < 0x20) return 0; /* no one-way spelling: never written */
    loom_buf b = {0};
    put_cp_raw(&b, cp);
    int n = (int)b.len;
    memcpy(out, b.p, b.len);
    loom_buf_free(&b);
    return n;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void put_tail(loom_buf *e, int d, int mn, int mx) {
    int lo = LOOM_MAX(0, mn - d);
    if (mx < 0) loom_buf_printf(e, "json-cchar{%d,} \"\\\"\"", lo);
    else loom_buf_printf(e, "json-cchar{%d,%d} \"\\\"\"", lo, mx - d);
}

static void sni_node(sconv *c, char *name, const char **v, int lo, int hi, size_t off, int d, int mn, int mx) {
    loom_buf body = {0};
    int alts = 0, ends = 0;
    uint32_t seen[256];
    int n_seen = 0;
    for (int i = lo; i < hi; i++) ends |= strlen(v[i]) == off;
    if (!ends && d >= mn) loom_buf_puts(&body, "\"\\\"\""), alts++;
    for (int i = lo; i < hi;) {
        if (strlen(v[i]) == off) {
            i++;
            continue;
        }
        uint32_t cp;
        int len = utf8_dec(v[i] + off, &cp), j = i + 1;
        while (j < hi && strlen(v[j]) > off && !strncmp(v[j] + off, v[i] + off, (size_t)len)) j++;
        char enc[8];
        int n = enc_cp(cp, enc);
        if (n && n_seen < 256 && (mx < 0 || d + 1 <= mx)) {
            seen[n_seen++] = cp;
            char child[16];
            new_name(c, child);
            sni_node(c, child, v, i, j, off + (size_t)len, d + 1, mn, mx);
            if (alts++) loom_buf_puts(&body, " | ");
            put_lit(&body, enc, (size_t)n);
            loom_buf_printf(&body, " %s", child);
        }
        i = j;
    }
    if (mx < 0 || d + 1 <= mx) { /* any other character, then anything */
        if (alts++) loom_buf_puts(&body, " | ");
        loom_buf_puts(&body, "([^\\x22\\x5C\\x00-\\x1F");
        static const char esc_cp[] = {'"', '\\', '\b', '\f', '\n', '\r', '\t'}, esc_ch[] = "\"\\bfnrt";
        for (int i = 0; i < n_seen; i++)
            if (seen[i] >= 0x20 && seen[i] != '"' && seen[i] != '\\') put_class_cp(&body, seen[i]);
        loom_buf_puts(&body, "]");
        int first = 1;
        for (int k = 0; k < 7; k++) {
            int excl = 0;
            for (int i = 0; i < n_seen; i++) excl |= seen[i] == (uint32_t)(unsigned char)esc_cp[k];
            if (excl) continue;
            loom_buf_puts(&body, first ? " | \"\\\\\" [" : "");
            put_class_cp(&body, (unsigned char)esc_ch[k]);
            first = 0;
        }
        loom_buf_puts(&body, first ? ") " : "]) ");
        put_tail(&body, d + 1, mn, mx);
    }
    if (!alts) loom_buf_puts(&body, "[^\\x00-\\U0010FFFF]"); /* nothing */
    put_rule(c, name, &body);
    loom_buf_free(&body);
}

/* A JSON string of mn..mx characters (mx < 0: unbounded) other than the
 * n strings in v (sorted here). */
static void str_not_in(sconv *c, loom_buf *e, const char **v, int n, int mn, int mx) {
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    char name[16];
    new_name(c, name);
    sni_node(c, name, v, 0, n, 0, 0, mn, mx);
    loom_buf_printf(e, "\"\\\"\" %s", name);
}

/* multipleOf k on integers: the decimal strings of multiples of k form a
 * regular language; reading digits left to right the state is the value
 * so far mod k. Rule m<k>-<r>-<n> is the n-digit strings D with
 * (r * 10^n + D) = 0 (mod k); ok[n][r] says whether there is one. A
 * factor 10^j of k is j trailing zeros, written as such. */
#define MOD_MAX 1000

typedef struct modk {
    int k;
    unsigned char ok[MAX_INT_DIGITS + 1][MOD_MAX];
    unsigned char made[MAX_INT_DIGITS + 1][MOD_MAX];
} modk;

static modk *mod_table(sconv *c, int k) {
    for (int i = 0; i < c->n_mods; i++)
        if (c->mods[i]->k == k) return c->mods[i];
    if (c->n_mods == (int)LOOM_ARRAY_LEN(c->mods)) return sfail(c, "more than 8 different 'multipleOf' values"), NULL;
    modk *t = calloc(1, sizeof *t);
    if (!t) return sfail(c, "out of memory"), NULL;
    t->k = k;
    t->ok[0][0] = 1;
    for (int n = 1; n <= MAX_INT_DIGITS; n++)
        for (int r = 0; r < k; r++)
            for (int d = 0; d < 10 && !t->ok[n][r]; d++) t->ok[n][r] = t->ok[n - 1][(10 * r + d) % k];
    return c->mods[c->n_mods++] = t;
}

static void mod_rule(sconv *c, modk *t, int r, int n, loom_buf *e) {
    char name[40];
    snprintf(name, sizeof name, "m%d-%d-%d", t->k, r, n);
    loom_buf_puts(e, name);
    if (t->made[n][r]) return;
    t->made[n][r] = 1;
    loom_buf body = {0};
    if (!n) loom_buf_puts(&body, "\"\"");
    int done[10] = {0}, alts = 0;
    for (int d = 0; n && d < 10; d++) {
        int to = (10 * r + d) % t->k;
        if (done[d] || !t->ok[n - 1][to]) continue;
        if (alts++) loom_buf_puts(&body, " | ");
        loom_buf_puts(&body, "[");
        for (int d2 = d; d2 < 10; d2++)
            if ((10 * r + d2) % t->k == to) loom_buf_printf(&body, "%d", d2), done[d2] = 1;
        loom_buf_puts(&body, "] ");
        mod_rule(c, t, to, n - 1, &body);
    }
    loom_buf_printf(&c->mod_out, "%s ::= %s\n", name, body.p);
    loom_buf_free(&body);
}

/* same_len over multiples: the n-digit strings in [a, z] that continue a
 * prefix of residue r to a multiple. Returns 0 (nothing appended) when
 * there is none. */
static int same_len_mod(sconv *c, modk *t, loom_buf *e, int r, const char *a, const char *z, int n) {
    int k = t->k;
    if (!n) return r ? 0 : (loom_buf_puts(e, "\"\""), 1);
    if (!memcmp(a, z, (size_t)n)) {
        int rr = r;
        for (int i = 0; i < n; i++) rr = (rr * 10 + a[i] - '0') % k;
        return rr ? 0 : (put_lit(e, a, (size_t)n), 1);
    }
    loom_buf alt = {0}, sub = {0};
    int alts = 0;
    if (a[0] == z[0]) {
        int ok = same_len_mod(c, t, &sub, (10 * r + a[0] - '0') % k, a + 1, z + 1, n - 1);
        if (ok) loom_buf_printf(e, "\"%c\" %s", a[0], sub.p);
        loom_buf_free(&sub);
        return ok;
    }
    int all0 = 1, all9 = 1;
    for (int i = 1; i < n; i++) all0 &= a[i] == '0', all9 &= z[i] == '9';
    char nines[MAX_INT_DIGITS + 2], zeros[MAX_INT_DIGITS + 2];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int first = all0 ? a[0] - '0' : a[0] - '0' + 1, last = all9 ? z[0] - '0' : z[0] - '0' - 1;
    if (!all0 && same_len_mod(c, t, &sub, (10 * r + a[0] - '0') % k, a + 1, nines, n - 1))
        loom_buf_printf(&alt, "%s\"%c\" (%s)", alts++ ? " | " : "", a[0], sub.p);
    loom_buf_free(&sub);
    int done[10] = {0};
    for (int d = first; d <= last; d++) {
        int to = (10 * r + d) % k;
        if (done[d] || !t->ok[n - 1][to]) continue;
        loom_buf_puts(&alt, alts++ ? " | [" : "[");
        for (int d2 = d; d2 <= last; d2++)
            if ((10 * r + d2) % k == to) loom_buf_printf(&alt, "%d", d2), done[d2] = 1;
        loom_buf_puts(&alt, "] ");
        mod_rule(c, t, to, n - 1, &alt);
    }
    if (!all9 && same_len_mod(c, t, &sub, (10 * r + z[0] - '0') % k, zeros, z + 1, n - 1))
        loom_buf_printf(&alt, "%s\"%c\" (%s)", alts++ ? " | " : "", z[0], sub.p);
    loom_buf_free(&sub);
    if (alts) loom_buf_printf(e, "(%s)", alt.p);
    loom_buf_free(&alt);
    return alts > 0;
}

/* 1 <= lo <= hi: the multiples of k (k == 1: all) in between, each
 * followed by `zeros` zeros. 0 when there is none. */
static int pos_mod(sconv *c, loom_buf *e, long long lo, long long hi, int k, int zeros) {
    if (lo > hi) return 0;
    loom_buf b = {0};
    int any = 0;
    if (k == 1) nonneg_range(&b, lo, hi), any = 1;
    else {
        modk *t = mod_table(c, k);
        if (!t) return loom_buf_free(&b), -1;
        char a[32], z[32];
        int la = snprintf(a, sizeof a, "%lld", lo), lz = snprintf(z, sizeof z, "%lld", hi);
        for (int L = la; L <= lz; L++) {
            long long from = LOOM_MAX(lo, pow10ll(L - 1)), to = LOOM_MIN(hi, pow10ll(L) - 1);
            if (from > to) continue;
            snprintf(a, sizeof a, "%0*lld", L, from);
            snprintf(z, sizeof z, "%0*lld", L, to);
            loom_buf one = {0};
            if (same_len_mod(c, t, &one, 0, a, z, L)) loom_buf_printf(&b, "%s(%s)", any++ ? " | " : "", one.p);
            loom_buf_free(&one);
        }
    }
    if (any) {
        loom_buf_printf(e, "(%s)", b.p);
        if (zeros) loom_buf_printf(e, " \"0\"{%d}", zeros);
    }
    loom_buf_free(&b);
    return any;
}

static long long floor_div(long long a, long long b) { return a / b - (a % b && (a < 0) != (b < 0)); }
static long long ceil_div(long long a, long long b) { return -floor_div(-a, b); }

/* The integers in [lo, hi] that are multiples of k, as alternatives
 * appended to e (each starting with " | " once any was); the count. */
static int int_range_mod(sconv *c, loom_buf *e, long long lo, long long hi, long long k, int *alts) {
    int j = 0;
    long long p = 1;
    while (k % 10 == 0) k /= 10, p *= 10, j++;
    if (k > MOD_MAX) return sfail(c, "'multipleOf' %lld: loom writes multiples of at most %d times a power of ten", k * p, MOD_MAX);
    long long xl = ceil_div(lo, p), xh = floor_div(hi, p); /* the multiple is x * 10^j */
    loom_buf b = {0};
    if (xl <= 0 && xh >= 0) loom_buf_printf(e, "%s\"0\"", (*alts)++ ? " | " : "");
    if (xh < 0 || xl < 0) {
        int r = pos_mod(c, &b, LOOM_MAX(1, -xh), -xl, (int)k, j);
        if (r < 0) return loom_buf_free(&b), -1;
        if (r) loom_buf_printf(e, "%s\"-\" %s", (*alts)++ ? " | " : "", b.p);
        loom_buf_free(&b);
    }
    int r = pos_mod(c, &b, LOOM_MAX(1, xl), xh, (int)k, j);
    if (r < 0) return loom_buf_free(&b), -1;
    if (r) loom_buf_printf(e, "%s%s", (*alts)++ ? " | " : "", b.p);
    loom_buf_free(&b);
    return 0;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* Integers in [lo, hi], multiples of k, none of the integral values of
 * K_NOTVALS. */
static int gen_int_core(sconv *c, const cJSON *s, loom_buf *e, long long lo, long long hi, long long k) {
    /* multiples stay within 15 digits, which a double holds exactly (a
       validator reading 16 digits as a double may land off the multiple) */
    if (k > 1) lo = LOOM_MAX(lo, -(pow10ll(15) - 1)), hi = LOOM_MIN(hi, pow10ll(15) - 1);
    long long pts[256];
    int n = 0;
    for (const cJSON *v = get(s, K_NOTVALS) ? get(s, K_NOTVALS)->child : NULL; v; v = v->next)
        if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= (double)lo &&
            v->valuedouble <= (double)hi) {
            if (n == (int)LOOM_ARRAY_LEN(pts)) return sfail(c, "more than %d integers left out", n);
            pts[n++] = (long long)v->valuedouble;
        }
    qsort(pts, (size_t)n, sizeof *pts, cmp_ll);
    loom_buf b = {0};
    int alts = 0;
    long long from = lo;
    for (int i = 0; i <= n; i++) {
        long long to = i < n ? pts[i] - 1 : hi;
        if (from <= to) {
            if (k == 1) {
                loom_buf_puts(&b, alts++ ? " | " : "");
                int_range(&b, from, to);
            } else if (int_range_mod(c, &b, from, to, k, &alts)) return loom_buf_free(&b), -1;
        }
        if (i < n) from = pts[i] + 1;
    }
    if (!alts) {
        loom_buf_free(&b);
        return sempty(c, "no integer in [%lld, %lld] is left by 'multipleOf' and 'not'", lo, hi);
    }
    loom_buf_printf(e, "(%s)", b.p);
    loom_buf_free(&b);
    return 0;
}

/* multipleOf as c / 10^j with c a positive integer (0: none given). */
static int multiple_of(sconv *c, const cJSON *s, long long *num, int *j) {
    const cJSON *m = get(s, "multipleOf");
    *num = 0, *j = 0;
    if (!m) return 0;
    if (!cJSON_IsNumber(m) || !(m->valuedouble > 0)) return sfail(c, "'multipleOf' must be a number above 0");
    for (int d = 0; d <= 12; d++) {
        double x = m->valuedouble * (double)pow10ll(d), r = round(x);
        if (fabs(x - r) <= 1e-9 * LOOM_MAX(1.0, x) && r >= 1) {
            if (r > 1e15) break;
            *num = (long long)r, *j = d;
            return 0;
        }
    }
    size_t mark = at_push(c, "multipleOf");
    sfail(c, "'multipleOf' %g: loom writes multiples of decimals with at most 12 digits after the point below 10^15", m->valuedouble);
    c->at_len = mark;
    return -1;
}

static long long gcd_ll(long long a, long long b) {
    while (b) {
        long long t = a % b;
        a = b, b = t;
    }
    return a;
}

/* The integers that are multiples of num / 10^j: multiples of
 * num / gcd(num, 10^j). */
static long long int_step(long long num, int j) { return num / gcd_ll(num, pow10ll(j)); }

/* minimum/maximum and their exclusive forms as integer bounds; 1 if any.
 * Draft 4's boolean exclusive* make the bound beside them exclusive. */
static int int_bounds(sconv *c, const cJSON *s, long long *lo, long long *hi) {
    const double LIM = (double)(pow10ll(MAX_INT_DIGITS) - 1);
    double l = -LIM, h = LIM;
    int any = 0;
    const char *keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, keys[k]);
        if (!v || cJSON_IsBool(v)) continue;
        if (!cJSON_IsNumber(v)) return sfail(c, "'%s' must be a number", keys[k]);
        double x = v->valuedouble;
        int excl = (k == 0 || k == 2) && cJSON_IsTrue(get(s, keys[k + 1]));
        if (k == 0) l = LOOM_MAX(l, excl ? floor(x) + 1 : ceil(x));
        if (k == 1) l = LOOM_MAX(l, floor(x) + 1);
        if (k == 2) h = LOOM_MIN(h, excl ? ceil(x) - 1 : floor(x));
        if (k == 3) h = LOOM_MIN(h, ceil(x) - 1);
        any = 1;
    }
    if (l > h) return sempty(c, "an integer range [%g, %g] that holds no integer", l, h);
    *lo = (long long)LOOM_MAX(l, -LIM);
    *hi = (long long)LOOM_MIN(h, LIM);
    return any;
}

static int gen_integer(sconv *c, const cJSON *s, loom_buf *e) {
    long long lo = 0, hi = 0, num;
    int j, any = int_bounds(c, s, &lo, &hi);
    if (any < 0 || multiple_of(c, s, &num, &j)) return -1;
    long long k = num ? int_step(num, j) : 1;
    if (!any && k == 1 && !get(s, K_NOTVALS)) loom_buf_puts(e, "json-int");
    else return gen_int_core(c, s, e, lo, hi, k);
    return 0;
}

/* Non-negative numbers in [lo, hi] (integers; hi < 0: unbounded): the
 * integer part in [lo, hi - 1] with any fraction, or hi itself. */
static void nonneg_number(loom_buf *e, long long lo, long long hi, long long lim, int frac) {
    loom_buf_puts(e, "(");
    if (hi < 0 || hi > lo) {
        nonneg_range(e, lo, hi < 0 ? lim : hi - 1);
        loom_buf_printf(e, " (\".\" [0-9]{1,%d})?", frac);
    }
    if (hi >= 0) {
        if (hi > lo) loom_buf_puts(e, " | ");
        loom_buf_printf(e, "\"%lld\" (\".\" \"0\"{1,%d})?", hi, frac);
    }
    loom_buf_puts(e, ")");
}

/* Bounds narrow to integers (ceil of a minimum, floor of a maximum, past
 * an exclusive one): the numbers written are a subset of the range.
 * multipleOf 10^-j: at most j digits after the point, no exponent; an
 * integral multipleOf: its integral multiples (all there are); another
 * decimal c / 10^j: integral multiples of c / gcd(c, 10^j), a subset.
 * Values left out: integers without them (a subset). Not an integer: a
 * fraction ending in a non-zero digit. */
static int gen_number(sconv *c, const cJSON *s, loom_buf *e) {
    long long num;
    int j, ints = 0;
    if (multiple_of(c, s, &num, &j)) return -1;
    for (const cJSON *v = get(s, K_NOTVALS) ? get(s, K_NOTVALS)->child : NULL; v; v = v->next) ints |= cJSON_IsNumber(v);
    int bounded = get(s, "minimum") || get(s, "maximum") || get(s, "exclusiveMinimum") || get(s, "exclusiveMaximum");
    if (cJSON_IsTrue(get(s, K_FRAC))) {
        if (bounded || num || ints) return sfail(c, "a number that is not an integer, with bounds, multipleOf or values left out, is not supported");
        /* at most 15 significant digits: a double keeps the fraction */
        loom_buf_puts(e, "(\"-\"? (\"0\" | [1-9] [0-9]{0,8}) \".\" [0-9]{0,5} [1-9])");
        return 0;
    }
    if (ints || (num && (num != 1 || !j))) {
        long long lo, hi;
        if (int_bounds(c, s, &lo, &hi) < 0) return -1;
        return gen_int_core(c, s, e, lo, hi, num ? int_step(num, j) : 1);
    }
    int frac = num ? j : 16;
    const double LIM = (double)(pow10ll(MAX_INT_DIGITS) - 1);
    double l = -INFINITY, h = INFINITY;
    const char *keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    int any = 0;
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, keys[k]);
        if (!v || cJSON_IsBool(v)) continue; /* draft 4's boolean exclusive* modify the bound below */
        if (!cJSON_IsNumber(v)) return sfail(c, "'%s' must be a number", keys[k]);
        const cJSON *ex = cJSON_GetObjectItemCaseSensitive(s, k == 0 ? "exclusiveMinimum" : "exclusiveMaximum");
        int excl = k == 1 || k == 3 || ((k == 0 || k == 2) && cJSON_IsTrue(ex));
        double x = v->valuedouble;
        if (k < 2) l = LOOM_MAX(l, excl ? floor(x) + 1 : ceil(x));
        else h = LOOM_MIN(h, excl ? ceil(x) - 1 : floor(x));
        any = 1;
    }
    if (!any) {
        if (frac < 16) loom_buf_printf(e, "(json-int (\".\" [0-9]{1,%d})?)", frac);
        else loom_buf_puts(e, "json-number");
        return 0;
    }
    if (l > h) return sempty(c, "a number range holding no integer (loom writes bounded numbers from integral bounds), found [%g, %g]", l, h);
    if (l > LIM || h < -LIM) return sfail(c, "number bounds beyond %d digits", MAX_INT_DIGITS);
    long long lo = isinf(l) ? -(long long)LIM : (long long)LOOM_MAX(l, -LIM);
    long long hi = isinf(h) ? -1 : (long long)LOOM_MIN(h, LIM);
    int unbounded_hi = isinf(h) || h > LIM, alts = 0;
    loom_buf_puts(e, "(");
    if (unbounded_hi || hi >= 0) { /* the part >= 0 */
        nonneg_number(e, LOOM_MAX(lo, 0), unbounded_hi ? -1 : hi, (long long)LIM, frac);
        alts++;
    }
    if (lo < 0) { /* -y for y in [max(0, -hi), -lo] */
        if (alts++) loom_buf_puts(e, " | ");
        loom_buf_puts(e, "\"-\" ");
        long long ylo = !unbounded_hi && hi < 0 ? -hi : 0;
        nonneg_number(e, ylo, isinf(l) ? -1 : -lo, (long long)LIM, frac);
    }
    loom_buf_puts(e, ")");
    return 0;
}

/* Formats kept by the grammar (a subset of each where the full one is
 * too loose to write: uri is scheme://host/path). */
static const char *const FORMATS[] = {"date", "time", "date-time", "uuid", "email", "ipv4", "uri", "hostname"};
static const char *const FORMAT_RULES[] = {"json-date", "json-time", "json-date \"T\" json-time", "json-uuid",
                                           "json-email", "json-ipv4", "json-uri", "json-hostname"};

/* 1 + the index of a format loom keeps, 0 for an annotation. */
static int known_format(const char *f) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(FORMATS); i++)
        if (!strcmp(f, FORMATS[i])) return (int)i + 1;
    return 0;
}

static int get_count(sconv *c, const cJSON *s, const char *key, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return sfail(c, "'%s' must be a non-negative integer", key);
    /* a maximum above the repetition limit writes at most the limit (a subset) */
    if (v->valuedouble > MAX_COUNT && !strncmp(key, "max", 3)) return *out = MAX_COUNT, 0;
    if (v->valuedouble > MAX_COUNT) return sfail(c, "'%s' above %d is not supported, found %g", key, MAX_COUNT, v->valuedouble);
    *out = (int)v->valuedouble;
    return 0;
}

/* 1 when string v may match pattern p (whole), 0 when it cannot. */
static int may_match(const char *p, const char *v) {
#ifdef LOOM_NO_PCRE2
    (void)p, (void)v;
    return 1;
#else
    int ec, hit = 1;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ec, &eo, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    if (md) hit = pcre2_match(re, (PCRE2_SPTR)v, strlen(v), 0, 0, md, NULL) >= 0;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return hit;
#endif
}

static int gen_string(sconv *c, const cJSON *s, loom_buf *e) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format"), *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const char *out[256];
    int n_out = 0;
    for (const cJSON *v = get(s, K_NOTVALS) ? get(s, K_NOTVALS)->child : NULL; v; v = v->next) {
        if (!cJSON_IsString(v)) continue;
        if (n_out == (int)LOOM_ARRAY_LEN(out)) return sfail(c, "more than %d strings left out", n_out);
        /* a value the pattern cannot match is left out already */
        if (!cJSON_IsString(pat) || may_match(pat->valuestring, v->valuestring)) out[n_out++] = v->valuestring;
    }
    int f0 = cJSON_IsString(fmt) ? known_format(fmt->valuestring) : 0;
    if (n_out && (pat || f0))
        return sfail(c, "'not' of the string \"%s\" with '%s' is not supported", out[0], pat ? "pattern" : "format");
    if (n_out) {
        int mn, mx;
        if (get_count(c, s, "minLength", 0, &mn) || get_count(c, s, "maxLength", -1, &mx)) return -1;
        if (mx >= 0 && mx < mn) return sempty(c, "maxLength %d below minLength %d", mx, mn);
        str_not_in(c, e, out, n_out, mn, mx);
        return 0;
    }
    if (pat && cJSON_IsString(fmt) && known_format(fmt->valuestring))
        return sfail(c, "'pattern' together with 'format' %s is not supported", fmt->valuestring);
    if (pat && (get(s, "minLength") || get(s, "maxLength"))) {
        int mn, mx;
        if (!cJSON_IsString(pat)) return sfail(c, "'pattern' must be a string");
        if (get_count(c, s, "minLength", 0, &mn) || get_count(c, s, "maxLength", -1, &mx)) return -1;
        if (mx >= 0 && mx < mn) return sempty(c, "maxLength %d below minLength %d", mx, mn);
        if (mn || mx >= 0) return pattern_len(c, e, pat->valuestring, mn, mx);
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return sfail(c, "'pattern' must be a string");
        loom_buf_puts(e, "\"\\\"\" ");
        if (regex_expr(pat->valuestring, 1, e, c->err, c->err_cap)) {
            size_t n = c->err ? strlen(c->err) : 0;
            if (c->err && n < c->err_cap) snprintf(c->err + n, c->err_cap - n, " (at #%.*s/pattern)", (int)c->at_len, c->at);
            return c->failed = 1, -1;
        }
        loom_buf_puts(e, " \"\\\"\"");
        return 0;
    }
    int f = cJSON_IsString(fmt) ? known_format(fmt->valuestring) : 0;
    if (f) {
        loom_buf_printf(e, "\"\\\"\" %s \"\\\"\"", FORMAT_RULES[f - 1]);
        return 0;
    }
    int mn, mx;
    if (get_count(c, s, "minLength", 0, &mn) || get_count(c, s, "maxLength", -1, &mx)) return -1;
    if (mx >= 0 && mx < mn) return sempty(c, "maxLength %d below minLength %d", mx, mn);
    if (!mn && mx < 0) loom_buf_puts(e, "json-string");
    else if (mx < 0) loom_buf_printf(e, "\"\\\"\" json-char{%d,} \"\\\"\"", mn);
    else loom_buf_printf(e, "\"\\\"\" json-char{%d,%d} \"\\\"\"", mn, mx);
    return 0;
}

static int gen_array(sconv *c, const cJSON *s, loom_buf *e) {
    if (cJSON_GetObjectItemCaseSensitive(s, "prefixItems")) return sfail(c, "'prefixItems' is not supported");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int mn, mx;
    if (get_count(c, s, "minItems", 0, &mn) || get_count(c, s, "maxItems", -1, &mx)) return -1;
    if (mx >= 0 && mx < mn) return sempty(c, "maxItems %d below minItems %d", mx, mn);
    /* uniqueItems: the grammar cannot compare items; arrays of at most one
       item are unique (a subset) */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "uniqueItems"))) {
        if (mn > 1) return sfail(c, "'uniqueItems' with minItems %d is not supported", mn);
        mx = mx < 0 ? 1 : LOOM_MIN(mx, 1);
    }
    loom_buf item = {0};
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items)) return sfail(c, "'items' must be a schema");
    size_t mark = at_push(c, "items");
    int irc = items ? gen(c, items, &item) : (loom_buf_puts(&item, "json-value"), 0);
    c->at_len = mark;
    if (irc) {
        loom_buf_free(&item);
        return -1;
    }
    if (mx == 0) loom_buf_puts(e, "\"[\" ws \"]\"");
    else {
        loom_buf_printf(e, "\"[\" ws %s(%s", mn ? "" : "(", item.p);
        int lo = mn ? mn - 1 : 0;
        if (mx < 0) loom_buf_printf(e, " (ws \",\" ws %s){%d,}", item.p, lo);
        else if (mx > 1) loom_buf_printf(e, " (ws \",\" ws %s){%d,%d}", item.p, lo, mx - 1);
        loom_buf_printf(e, ")%s ws \"]\"", mn ? "" : ")?");
    }
    loom_buf_free(&item);
    return 0;
}


/* patternProperties: a listed property whose name a pattern matches would
 * need both schemas, which is refused; other keys are only written from a
 * single pattern (any key matching the whole pattern also contains a
 * match), never from additionalProperties. */
static int pattern_props(sconv *c, const cJSON *props, const cJSON *pp) {
    if (!cJSON_IsObject(pp)) return sfail(c, "'patternProperties' must be an object");
    for (const cJSON *q = pp->child; q; q = q->next) {
        const char *hit = NULL;
#ifdef LOOM_NO_PCRE2
        /* the minimal GPU-test build links no PCRE2: any listed key might match */
        hit = props && props->child ? props->child->string : NULL;
#else
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)q->string, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
        if (!re) {
            size_t mark = at_push(c, "patternProperties");
            sfail(c, "pattern '%s' does not compile", q->string);
            c->at_len = mark;
            return -1;
        }
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        for (const cJSON *p = props ? props->child : NULL; p && md && !hit; p = p->next)
            if (pcre2_match(re, (PCRE2_SPTR)p->string, strlen(p->string), 0, 0, md, NULL) >= 0) hit = p->string;
        pcre2_match_data_free(md);
        pcre2_code_free(re);
#endif
        if (hit) {
            size_t mark = at_push(c, "patternProperties");
            sfail(c, "property '%s' also matches the patternProperties pattern '%s' (both schemas at once are not "
                     "supported)", hit, q->string);
            c->at_len = mark;
            return -1;
        }
    }
    return 0;
}

/* Properties in order, required ones always: rule R(i, comma) is what may
 * follow after properties 0..i-1, comma saying whether one was written. */
/* minProperties and dependencies (lists of keys) rewritten as required
 * keys, on a copy: the first optional properties become required until
 * there are enough; a key with dependencies that is required makes them
 * required, one that is not is left out (a subset either way). Returns s
 * itself when there is nothing to do, NULL on failure. */
static const cJSON *object_rewrite(sconv *c, const cJSON *s) {
    const cJSON *minp = cJSON_GetObjectItemCaseSensitive(s, "minProperties");
    const cJSON *deps = cJSON_GetObjectItemCaseSensitive(s, "dependencies");
    if (!deps) deps = cJSON_GetObjectItemCaseSensitive(s, "dependentRequired");
    const cJSON *req0 = cJSON_GetObjectItemCaseSensitive(s, "required");
    if ((!cJSON_IsNumber(minp) || minp->valuedouble <= cJSON_GetArraySize(req0)) && !deps) return s;
    cJSON *m = own(c, cJSON_Duplicate(s, 1));
    if (!m) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(m, "minProperties");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "dependencies");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "dependentRequired");
    cJSON *req = cJSON_GetObjectItemCaseSensitive(m, "required"), *props = cJSON_GetObjectItemCaseSensitive(m, "properties");
    if (!req) req = cJSON_AddArrayToObject(m, "required");
    for (const cJSON *d = deps ? deps->child : NULL; d; d = d->next) {
        if (is_required(req, d->string)) {
            for (const cJSON *q = d->child; q; q = q->next)
                if (cJSON_IsString(q) && !is_required(req, q->valuestring)) cJSON_AddItemToArray(req, cJSON_CreateString(q->valuestring));
        } else cJSON_DeleteItemFromObjectCaseSensitive(props, d->string);
    }
    /* dependencies again for the keys just made required */
    for (const cJSON *d = deps ? deps->child : NULL; d; d = d->next)
        if (is_required(req, d->string))
            for (const cJSON *q = d->child; q; q = q->next)
                if (cJSON_IsString(q) && !is_required(req, q->valuestring)) cJSON_AddItemToArray(req, cJSON_CreateString(q->valuestring));
    int want = cJSON_IsNumber(minp) ? (int)ceil(minp->valuedouble) : 0;
    for (const cJSON *p = props ? props->child : NULL; p && cJSON_GetArraySize(req) < want; p = p->next)
        if (!is_required(req, p->string)) {
            int dep_free = 1; /* not one that was left out above */
            for (const cJSON *d = deps ? deps->child : NULL; d && dep_free; d = d->next) dep_free = strcmp(d->string, p->string) != 0;
            if (dep_free) cJSON_AddItemToArray(req, cJSON_CreateString(p->string));
        }
    if (cJSON_GetArraySize(req) < want) return sfail(c, "'minProperties' %d: not enough properties to require", want), NULL;
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(m, "additionalProperties");
    if (deps && ap && !cJSON_IsFalse(ap)) return sfail(c, "'dependencies' with additionalProperties is not supported"), NULL;
    return m;
}

static int gen_object(sconv *c, const cJSON *s, loom_buf *e) {
    if (!(s = object_rewrite(c, s))) return -1;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return sfail(c, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return sfail(c, "'required' must be an array of strings");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return sfail(c, "'required' must be an array of strings");
        if (cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) continue;
        if (cJSON_IsFalse(ap))
            return sfail(c, "required property '%s' is not among 'properties' and additionalProperties is false",
                         r->valuestring);
        /* any value for it, as additionalProperties allows (or its schema) */
        cJSON *m = own(c, cJSON_Duplicate(s, 1)), *mp = cJSON_GetObjectItemCaseSensitive(m, "properties");
        if (!m) return -1;
        if (!mp) mp = cJSON_AddObjectToObject(m, "properties");
        for (const cJSON *q = req->child; q; q = q->next)
            if (cJSON_IsString(q) && !cJSON_GetObjectItemCaseSensitive(mp, q->valuestring))
                cJSON_AddItemToObject(mp, q->valuestring, cJSON_IsObject(ap) ? cJSON_Duplicate(ap, 1) : cJSON_CreateTrue());
        return gen_object(c, m, e);
    }
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
    if (pp && pattern_props(c, props, pp)) return -1;
    int n = cJSON_GetArraySize(props);
    const cJSON *forbid_keys = get(s, K_FORBID);
    if (!n && !pp && !cJSON_IsFalse(ap) && !cJSON_IsObject(ap) && !forbid_keys) {
        loom_buf_puts(e, "json-object");
        return 0;
    }
    if (pp && forbid_keys) return sfail(c, "'patternProperties' with a key left out by 'not' is not supported");
    /* extra keys: any string key with the additionalProperties schema; with
       patternProperties, only keys matching its one pattern (whole) */
    char extra[16] = "";
    if (pp && cJSON_GetArraySize(pp) == 1) {
        loom_buf v = {0}, k = {0};
        size_t mark = at_push(c, "patternProperties");
        at_push(c, pp->child->string);
        int arc = gen(c, pp->child, &v);
        if (!arc) {
            loom_buf_puts(&k, "\"\\\"\" ");
            if (regex_expr(pp->child->string, 1, &k, c->err, c->err_cap)) {
                size_t n = c->err ? strlen(c->err) : 0;
                if (c->err && n < c->err_cap) snprintf(c->err + n, c->err_cap - n, " (at #%.*s)", (int)c->at_len, c->at);
                c->failed = 1, arc = -1;
            } else loom_buf_puts(&k, " \"\\\"\"");
        }
        c->at_len = mark;
        if (arc) return loom_buf_free(&v), loom_buf_free(&k), -1;
        new_name(c, extra);
        loom_buf_printf(&c->out, "%s ::= %s ws \":\" ws %s\n", extra, k.p, v.p);
        loom_buf_free(&v), loom_buf_free(&k);
    } else if (!pp && (cJSON_IsTrue(ap) || cJSON_IsObject(ap) || (!ap && !n))) {
        loom_buf v = {0}, k = {0};
        size_t mark = at_push(c, "additionalProperties");
        int arc = cJSON_IsObject(ap) ? gen(c, ap, &v) : (loom_buf_puts(&v, "json-value"), 0);
        c->at_len = mark;
        if (arc) return loom_buf_free(&v), -1;
        /* an extra key is none of the listed ones either: else a listed
           key could come twice, once listed and once as an extra */
        const char **keys = malloc(sizeof *keys * (size_t)(cJSON_GetArraySize(forbid_keys) + n + 1));
        int nk = 0;
        if (!keys) return loom_buf_free(&v), sfail(c, "out of memory");
        for (const cJSON *q = forbid_keys ? forbid_keys->child : NULL; q; q = q->next)
            if (cJSON_IsString(q)) keys[nk++] = q->valuestring;
        for (const cJSON *q = props ? props->child : NULL; q; q = q->next) keys[nk++] = q->string;
        qsort(keys, (size_t)nk, sizeof *keys, cmp_str);
        int nu = 0; /* a key both listed and left out by 'not' once */
        for (int j = 0; j < nk; j++)
            if (!nu || strcmp(keys[nu - 1], keys[j])) keys[nu++] = keys[j];
        nk = nu;
        if (nk) str_not_in(c, &k, keys, nk, 0, -1);
        else loom_buf_puts(&k, "json-string");
        free(keys);
        new_name(c, extra);
        loom_buf_printf(&c->out, "%s ::= %s ws \":\" ws %s\n", extra, k.p, v.p);
        loom_buf_free(&v), loom_buf_free(&k);
    }
    char base[16];
    new_name(c, base);
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        loom_buf v = {0}, kv = {0};
        size_t mark = at_push(c, "properties");
        at_push(c, p->string);
        int prc = gen(c, p, &v);
        c->at_len = mark;
        if (prc) return loom_buf_free(&v), -1;
        char key[600];
        cJSON *ks = cJSON_CreateString(p->string);
        char *kj = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!kj || strlen(kj) >= sizeof key) {
            free(kj);
            loom_buf_free(&v);
            return sfail(c, "property name too long (at most 500 bytes)");
        }
        snprintf(key, sizeof key, "%s", kj);
        free(kj);
        put_lit(&kv, key, strlen(key));
        loom_buf_printf(&kv, " ws \":\" ws %s", v.p);
        int req_i = is_required(req, p->string);
        for (int comma = 0; comma < 2; comma++) {
            loom_buf_printf(&c->out, "%s-%d-%d ::= %s%s %s-%d-1", base, i, comma, comma ? "ws \",\" ws " : "", kv.p, base, i + 1);
            if (!req_i) loom_buf_printf(&c->out, " | %s-%d-%d", base, i + 1, comma);
            loom_buf_putc(&c->out, '\n');
        }
        loom_buf_free(&v);
        loom_buf_free(&kv);
    }
    for (int comma = 0; comma < 2; comma++) {
        if (extra[0])
            loom_buf_printf(&c->out, "%s-%d-%d ::= (%s%s (ws \",\" ws %s)*)?\n", base, n, comma,
                            comma ? "ws \",\" ws " : "", extra, extra);
        else loom_buf_printf(&c->out, "%s-%d-%d ::= \"\"\n", base, n, comma);
    }
    loom_buf_printf(e, "\"{\" ws %s-0-0 ws \"}\"", base);
    return 0;
}

static int gen_literal(sconv *c, const cJSON *v, loom_buf *e) {
    char *j = cJSON_PrintUnformatted(v);
    if (!j) return sfail(c, "out of memory");
    put_lit(e, j, strlen(j));
    free(j);
    return 0;
}

static int gen_typed(sconv *c, const cJSON *s, const char *t, loom_buf *e) {
    if (!strcmp(t, "string")) return gen_string(c, s, e);
    if (!strcmp(t, "integer")) return gen_integer(c, s, e);
    if (!strcmp(t, "number")) return gen_number(c, s, e);
    if (!strcmp(t, "boolean")) {
        const cJSON *nv = get(s, K_NOTVALS);
        cJSON *tr = cJSON_CreateTrue(), *fa = cJSON_CreateFalse();
        int no_t = has_value(nv, tr), no_f = has_value(nv, fa);
        cJSON_Delete(tr), cJSON_Delete(fa);
        loom_buf_puts(e, no_t ? "\"false\"" : no_f ? "\"true\"" : "json-bool");
        return 0;
    }
    if (!strcmp(t, "null")) return loom_buf_puts(e, "json-null"), 0;
    if (!strcmp(t, "object")) return gen_object(c, s, e);
    if (!strcmp(t, "array")) return gen_array(c, s, e);
    return sfail(c, "unknown type '%s' (expected string, integer, number, boolean, null, object or array)", t);
}

/* allOf: the schema intersected with each part in turn (merge_into). */
static const cJSON *merge_all_of(sconv *c, const cJSON *s, const cJSON *all) {
    if (!cJSON_IsArray(all) || !cJSON_GetArraySize(all)) return sfail(c, "'allOf' must be a non-empty array"), NULL;
    cJSON *m = own(c, cJSON_Duplicate(s, 1));
    if (!m) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(m, "allOf");
    int i = 0;
    for (const cJSON *a = all->child; a; a = a->next, i++) {
        size_t mark = at_push_i(c, "allOf", i);
        int r = merge_into(c, m, a);
        if (r > 0) sempty(c, "nothing validates against every part of 'allOf'");
        c->at_len = mark;
        if (r) return NULL;
    }
    return m;
}

/* Keywords that constrain what validates and that the grammar cannot keep
 * are errors naming them; the others (annotations, unknown words) are
 * ignored as JSON Schema says. A keyword that holds for every output the
 * grammar makes is let through. */
static int check_keywords(sconv *c, const cJSON *s) {
    static const char *const unsupported[] = {
        "dependentSchemas", "contains",
        "minContains", "maxContains", "propertyNames", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
    for (const cJSON *k = s->child; k; k = k->next) {
        const char *key = k->string;
        int bad = 0;
        for (size_t i = 0; i < LOOM_ARRAY_LEN(unsupported) && !bad; i++) bad = !strcmp(key, unsupported[i]);
        if (!strcmp(key, "unevaluatedProperties")) {
            const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
            bad = !cJSON_IsTrue(k) && ap && !cJSON_IsFalse(ap);
        }
        if (!strcmp(key, "minProperties")) {
            /* gen_object requires more of the listed properties */
            bad = !cJSON_IsNumber(k) || k->valuedouble > cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "properties"));
        }
        if (!strcmp(key, "dependencies") || !strcmp(key, "dependentRequired")) {
            /* gen_object keeps them when each names a list of keys */
            for (const cJSON *d = cJSON_IsObject(k) ? k->child : NULL; d && !bad; d = d->next) bad = !cJSON_IsArray(d);
            bad |= !cJSON_IsObject(k);
        }
        if (!strcmp(key, "maxProperties")) {
            const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
            bad = !cJSON_IsNumber(k) ||
                  k->valuedouble < cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "properties")) ||
                  (ap && !cJSON_IsFalse(ap)) || !cJSON_GetObjectItemCaseSensitive(s, "properties");
        }
        if (!strcmp(key, "additionalItems")) {
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
            bad = cJSON_IsArray(it);
        }
        if ((!strcmp(key, "minLength") || !strcmp(key, "maxLength")) &&
            (cJSON_GetObjectItemCaseSensitive(s, "pattern") || cJSON_GetObjectItemCaseSensitive(s, "format")) &&
            !cJSON_GetObjectItemCaseSensitive(s, "enum") && !cJSON_GetObjectItemCaseSensitive(s, "const")) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
            /* a length bound on a format loom does not know is kept (the format is not);
               one beside a pattern is the pattern's automaton times a counter */
            bad = !cJSON_GetObjectItemCaseSensitive(s, "pattern") && cJSON_IsString(f) && known_format(f->valuestring);
            if (bad) {
                size_t mark = at_push(c, key);
                sfail(c, "'%s' together with '%s' is not supported", key,
                      cJSON_GetObjectItemCaseSensitive(s, "pattern") ? "pattern" : "format");
                c->at_len = mark;
                return -1;
            }
        }
        if (bad) {
            size_t mark = at_push(c, key);
            sfail(c, "'%s' is not supported", key);
            c->at_len = mark;
            return -1;
        }
    }
    return 0;
}

/* Values left out (K_NOTVALS) and const/enum beside a type: const/enum
 * keep the values of the type and not left out; without them, a null
 * left out removes the type, so do both booleans, and an object or array
 * left out removes objects or arrays (a subset); the typed generators
 * leave out the rest. */
static const cJSON *values_rewrite(sconv *c, const cJSON *s) {
    const cJSON *nv = get(s, K_NOTVALS);
    cJSON *m = own(c, cJSON_Duplicate(s, 1));
    if (!m) return NULL;
    cJSON_AddTrueToObject(m, K_VALS);
    if (get(s, "const") || get(s, "enum")) {
        int bits = type_bits(m);
        cJSON_DeleteItemFromObjectCaseSensitive(m, K_NOTVALS);
        if (filter_values(m, keep_bits, &bits) || (nv && filter_values(m, keep_out, nv)))
            return sempty(c, "no value of 'enum' or 'const' is of the schema's type and not left out by 'not'"), NULL;
        return m;
    }
    int bits0 = gen_bits(s), bits = bits0, t = 0, f = 0;
    for (const cJSON *v = nv->child; v; v = v->next) {
        if (cJSON_IsNull(v)) bits &= ~T_NULL;
        if (cJSON_IsObject(v)) bits &= ~T_OBJ;
        if (cJSON_IsArray(v)) bits &= ~T_ARR;
        t |= cJSON_IsTrue(v), f |= cJSON_IsFalse(v);
    }
    if (t && f) bits &= ~T_BOOL;
    if (!bits) return sempty(c, "nothing validates: 'not' leaves out every value of the schema's types"), NULL;
    if (bits != bits0 || (!get(s, "type") && bits0 == T_ALL)) set_type(m, bits);
    return m;
}

/* One alternative of anyOf, oneOf or K_OR, appended to body after " | "
 * once there is one; an alternative in which nothing validates is
 * dropped, and what it wrote with it. */
static int gen_alt(sconv *c, const cJSON *b, loom_buf *body, int *alts) {
    size_t out_len = c->out.len, at_len = c->at_len;
    int n_refs = c->n_refs, depth = c->depth;
    loom_buf one = {0};
    int rc = gen(c, b, &one);
    if (rc && c->empty) {
        c->failed = c->empty = 0;
        if (c->err && c->err_cap) c->err[0] = 0;
        c->out.len = out_len;
        if (c->out.p) c->out.p[out_len] = 0;
        c->n_refs = n_refs, c->depth = depth, c->at_len = at_len;
        loom_buf_free(&one);
        return 0;
    }
    if (!rc) {
        if ((*alts)++) loom_buf_puts(body, " | ");
        loom_buf_puts(body, one.p ? one.p : "\"\"");
    }
    loom_buf_free(&one);
    return rc;
}

/* anyOf, and oneOf: each branch with the keywords around it; for oneOf a
 * branch also leaves out every other branch it may overlap (an output
 * must validate against exactly one): nothing to do when the two cannot
 * meet (types, values, a key one always writes and the other refuses),
 * else "not" of the other branch where loom can write it. Otherwise the
 * branch is written as for anyOf (an output might match two branches),
 * which strict output refuses. */
static int gen_any_of(sconv *c, const cJSON *s, const cJSON *k, loom_buf *body) {
    int n = cJSON_GetArraySize(k), one = !strcmp(k->string, "oneOf"), rc = 0, alts = 0;
    if (!cJSON_IsArray(k) || !n) return sfail(c, "'%s' must be a non-empty array", k->string);
    /* br: each branch merged; out: what is written for it (NULL: nothing) */
    const cJSON **br = calloc((size_t)n, sizeof *br), **raw = calloc((size_t)n, sizeof *raw),
                **out = calloc((size_t)n, sizeof *out);
    if (!br || !raw || !out) return free(br), free(raw), free(out), sfail(c, "out of memory");
    int plain = annotations_only(s, k->string), i = 0;
    for (const cJSON *v = k->child; v && !rc; v = v->next, i++) {
        size_t mark = at_push_i(c, k->string, i);
        int empty = 0;
        raw[i] = v;
        br[i] = plain ? v : with_siblings(c, s, k->string, v, &empty);
        if (!br[i] && !empty) rc = -1;
        out[i] = br[i];
        c->at_len = mark;
    }
    for (i = 0; one && i < n && !rc; i++) {
        cJSON *m = NULL;
        for (int j = 0; j < n && out[i] && !rc; j++) {
            if (j == i || !br[j]) continue;
            const cJSON *bi = m ? m : deref(c, br[i]), *bj = deref(c, br[j]);
            if (!bi || !bj) rc = -1;
            else if (excludes(c, bi, bj)) continue;
            else if (negatable(c, raw[j], 0)) {
                if (!m && !(m = own(c, cJSON_Duplicate(bi, 1)))) rc = -1;
                size_t mark = at_push_i(c, k->string, j);
                int r = rc ? -1 : negate_into(c, m, raw[j]);
                c->at_len = mark;
                if (r < 0) rc = -1;
                if (r > 0) out[i] = NULL, m = NULL; /* it holds only where another does */
            } else if (c->strict) {
                size_t mark = at_push(c, k->string);
                rc = sfail(c, "'oneOf' branches %d and %d may both match one value, and strict output needs exactly one "
                              "(loom cannot write branch %d without branch %d)", i, j, i, j);
                c->at_len = mark;
            } else c->approx++;
        }
        if (m && out[i]) out[i] = m;
    }
    for (i = 0; i < n && !rc; i++) {
        if (!out[i]) continue;
        size_t mark = at_push_i(c, k->string, i);
        rc = gen_alt(c, out[i], body, &alts);
        c->at_len = mark;
    }
    if (!rc && !alts) rc = sempty(c, "no branch of '%s' can hold alongside the keywords around it", k->string);
    free(br), free(raw), free(out);
    return rc;
}

/* Appends the expression matching schema s to e (a rule name, mostly). */
static int gen(sconv *c, const cJSON *s, loom_buf *e) {
    if (c->failed) return -1;
    if (cJSON_IsTrue(s)) return loom_buf_puts(e, "json-value"), 0;
    if (cJSON_IsFalse(s)) return sempty(c, "a schema must be an object or true, found false (matches nothing)");
    if (!cJSON_IsObject(s)) return sfail(c, "a schema must be an object or true, found another value");
    if (++c->depth > MAX_DEPTH) return sfail(c, "schema nested deeper than %d", MAX_DEPTH);
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    int rc = 0;
    if (ref) {
        if (!cJSON_IsString(ref)) return sfail(c, "'$ref' must be a string");
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (!t) return -1;
        for (int i = 0; i < c->n_refs; i++)
            if (c->refs[i].node == t) {
                loom_buf_puts(e, c->refs[i].name);
                c->depth--;
                return 0;
            }
        if (c->n_refs == (int)(sizeof c->refs / sizeof *c->refs)) return sfail(c, "more than 256 $ref targets");
        sref *r = &c->refs[c->n_refs++];
        r->node = t;
        new_name(c, r->name);
        char name[16];
        memcpy(name, r->name, sizeof name);
        loom_buf body = {0};
        int depth = c->depth;
        c->depth = 0; /* a named rule: recursion goes through its name */
        char at[sizeof c->at];
        size_t at_len = c->at_len;
        memcpy(at, c->at, at_len);
        /* errors inside name the target's own pointer */
        c->at_len = ref->valuestring[0] == '#' ? LOOM_MIN(strlen(ref->valuestring + 1), sizeof c->at - 1) : 0;
        memcpy(c->at, ref->valuestring + 1, c->at_len);
        rc = gen(c, t, &body);
        memcpy(c->at, at, at_len);
        c->at_len = at_len;
        c->depth = depth - 1;
        if (!rc) put_rule(c, name, &body);
        loom_buf_free(&body);
        loom_buf_puts(e, name);
        return rc;
    }
    const cJSON *m = NULL;
    if (get(s, "if") || get(s, "then") || get(s, "else")) m = rewrite_if(c, s);
    else if (get(s, "not")) m = apply_not(c, s);
    else if (!get(s, K_VALS) && (get(s, K_NOTVALS) || (get(s, "type") && (get(s, "const") || get(s, "enum")))))
        m = values_rewrite(c, s);
    if (m || c->failed) {
        rc = m && m != s ? gen(c, m, e) : m ? 0 : -1;
        if (m != s) {
            c->depth--;
            return rc;
        }
    }
    if (check_keywords(c, s)) return -1;
    loom_buf body = {0};
    const cJSON *k;
    if ((k = get(s, K_OR))) {
        int alts = 0;
        for (const cJSON *v = k->child; v && !rc; v = v->next) rc = gen_alt(c, v, &body, &alts);
        if (!rc && !alts) rc = sempty(c, "nothing validates against any of the alternatives written for this schema");
    } else if ((k = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        rc = gen_literal(c, k, &body);
    } else if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(k) || !cJSON_GetArraySize(k)) rc = sfail(c, "'enum' must be a non-empty array");
        for (const cJSON *v = k->child; v && !rc; v = v->next) {
            if (v != k->child) loom_buf_puts(&body, " | ");
            rc = gen_literal(c, v, &body);
        }
    } else if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) || (k = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        rc = gen_any_of(c, s, k, &body);
    } else if ((k = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        /* one part that constrains (the others and s itself annotations
           only) is that part; else objects merged */
        const cJSON *only = NULL;
        int n_real = 0, pos = 0, at = 0;
        for (const cJSON *q = cJSON_IsArray(k) ? k->child : NULL; q; q = q->next, pos++)
            if (!annotations_only(q, NULL)) only = q, n_real++, at = pos;
        const cJSON *m;
        size_t mark = c->at_len;
        if (n_real == 1 && annotations_only(s, "allOf")) m = only, at_push_i(c, "allOf", at);
        else m = merge_all_of(c, s, k);
        rc = m ? gen(c, m, &body) : -1;
        c->at_len = mark;
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
        if (cJSON_IsString(t)) rc = gen_typed(c, s, t->valuestring, &body);
        else if (cJSON_IsArray(t) && cJSON_GetArraySize(t)) {
            for (const cJSON *v = t->child; v && !rc; v = v->next) {
                if (v != t->child) loom_buf_puts(&body, " | ");
                rc = cJSON_IsString(v) ? gen_typed(c, s, v->valuestring, &body) : sfail(c, "'type' entries must be strings");
            }
        } else if (t) rc = sfail(c, "'type' must be a string or an array of strings");
        else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
                 cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            rc = gen_object(c, s, &body);
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems"))
            rc = gen_array(c, s, &body);
        else if (cJSON_GetObjectItemCaseSensitive(s, "pattern") || cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxLength") || cJSON_GetObjectItemCaseSensitive(s, "format"))
            rc = gen_string(c, s, &body);
        else if (get(s, K_FORBID)) rc = gen_object(c, s, &body);
        else if (get(s, "minimum") || get(s, "maximum") || get(s, "exclusiveMinimum") || get(s, "exclusiveMaximum") ||
                 get(s, "multipleOf"))
            rc = gen_number(c, s, &body);
        else loom_buf_puts(&body, "json-value");
    }
    if (!rc && body.oom) rc = sfail(c, "out of memory");
    if (!rc) {
        char name[16];
        new_name(c, name);
        put_rule(c, name, &body);
        loom_buf_puts(e, name);
    }
    loom_buf_free(&body);
    c->depth--;
    return rc;
}

char *loom_grammar_schema_to_gbnf(const char *schema, char *err, size_t cap) {
    return loom_grammar_schema_to_gbnf_ex(schema, 0, err, cap);
}

loom_status loom_grammar_from_schema_ex(const char *schema, int flags, const loom_gvocab *vocab,
                                        loom_grammar **out, char *err, size_t cap) {
    *out = NULL;
    char *text = loom_grammar_schema_to_gbnf_ex(schema, flags, err, cap);
    if (!text) return LOOM_ERR_INVALID_ARG;
    loom_status st = loom_grammar_from_gbnf(text, vocab, out, err, cap);
    free(text);
    return st;
}

char *loom_grammar_schema_to_gbnf_ex(const char *schema, int flags, char *err, size_t cap) {
    if (err && cap) err[0] = 0;
    cJSON *doc = cJSON_Parse(schema);
    if (!doc) {
        snprintf(err, cap, "the JSON schema is not valid JSON");
        return NULL;
    }
    sconv c = {.doc = doc, .err = err, .err_cap = cap, .strict = (flags & LOOM_SCHEMA_STRICT) != 0};
    loom_buf_puts(&c.out, PRELUDE);
    loom_buf root = {0};
    int rc = gen(&c, doc, &root);
    if (!rc) loom_buf_printf(&c.out, "root ::= %s\n", root.p);
    loom_buf_free(&root);
    loom_buf_put(&c.out, c.mod_out.p ? c.mod_out.p : "", c.mod_out.len);
    loom_buf_free(&c.mod_out);
    sconv_free(&c);
    cJSON_Delete(doc);
    if (!rc && c.out.oom) rc = sfail(&c, "out of memory");
    if (rc) {
        loom_buf_free(&c.out);
        return NULL;
    }
    return c.out.p;
}

/* ---- tool calls -------------------------------------------------------------- */

char *loom_grammar_tools_to_gbnf(const char *tools_json, const char *only, const loom_gtool_syntax *syn, char *err,
                                 size_t cap) {
    if (err && cap) err[0] = 0;
    cJSON *tools = cJSON_Parse(tools_json);
    if (!cJSON_IsArray(tools)) {
        cJSON_Delete(tools);
        snprintf(err, cap, "the tools are not a JSON array");
        return NULL;
    }
    sconv c = {.err = err, .err_cap = cap};
    loom_buf_puts(&c.out, PRELUDE);
    loom_buf calls = {0};
    int rc = 0, n = 0;
    for (const cJSON *t = tools->child; t && !rc; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name) || (only && strcmp(name->valuestring, only))) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        loom_buf args = {0};
        c.doc = params; /* $ref inside a tool's parameters points into them */
        c.strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
        c.at_len = 0;
        if (!params || (cJSON_IsObject(params) && !cJSON_GetArraySize(params))) loom_buf_puts(&args, "json-object");
        else rc = gen(&c, params, &args);
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", err ? err : "");
            snprintf(err, cap, "tool '%s' parameters: %s", name->valuestring, msg);
        } else {
            cJSON *ns = cJSON_CreateString(name->valuestring);
            char *nj = ns ? cJSON_PrintUnformatted(ns) : NULL;
            cJSON_Delete(ns);
            loom_buf head = {0};
            loom_buf_printf(&head, "{\"name\": %s, \"%s\": ", nj ? nj : "\"\"", syn->args_key);
            free(nj);
            if (n++) loom_buf_puts(&calls, " | ");
            loom_buf_puts(&calls, "(");
            put_lit(&calls, head.p, head.len);
            loom_buf_printf(&calls, " %s \"}\")", args.p);
            loom_buf_free(&head);
        }
        loom_buf_free(&args);
    }
    if (!rc && !n) rc = sfail(&c, "no tool named '%s'", only ? only : "(any)");
    if (!rc) {
        loom_buf_printf(&c.out, "tool-call ::= %s\n", calls.p);
        loom_buf_puts(&c.out, "tool-one ::= ");
        put_lit(&c.out, syn->call_open, strlen(syn->call_open));
        loom_buf_puts(&c.out, " tool-call ");
        put_lit(&c.out, syn->call_close, strlen(syn->call_close));
        loom_buf_puts(&c.out, "\nroot ::= ");
        put_lit(&c.out, syn->begin, strlen(syn->begin));
        loom_buf_puts(&c.out, " tool-one");
        if (syn->sep && syn->max_calls > 1) {
            loom_buf_puts(&c.out, " (");
            put_lit(&c.out, syn->sep, strlen(syn->sep));
            loom_buf_printf(&c.out, " tool-one){0,%d}", syn->max_calls - 1);
        }
        loom_buf_puts(&c.out, " ");
        put_lit(&c.out, syn->end, strlen(syn->end));
        loom_buf_puts(&c.out, "\n");
    }
    loom_buf_free(&calls);
    loom_buf_put(&c.out, c.mod_out.p ? c.mod_out.p : "", c.mod_out.len);
    loom_buf_free(&c.mod_out);
    sconv_free(&c);
    cJSON_Delete(tools);
    if (!rc && c.out.oom) rc = sfail(&c, "out of memory");
    if (rc) {
        loom_buf_free(&c.out);
        return NULL;
    }
    return c.out.p;
}
