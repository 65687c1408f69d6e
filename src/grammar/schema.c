/* schema: JSON Schema and regexes translated to GBNF text, which
 * grammar.c compiles.
 *
 * JSON Schema: type (one or a list), object properties in their declared
 * order (required ones always, the others optional; a required key outside
 * properties takes any value), additionalProperties (absent or false: no
 * other keys once properties are listed; true or a schema: any other string
 * key after them), arrays with items, minItems, maxItems, strings with
 * minLength, maxLength, pattern, format (date, time, date-time, uuid,
 * email, ipv4, hostname, uri; other formats are annotations), enum and
 * const of any JSON value, integers with minimum, maximum and their
 * exclusive forms, numbers with bounds (narrowed to integers: a subset of
 * the range), boolean, null, anyOf and oneOf (oneOf as anyOf), allOf of
 * objects (merged), $ref into the document ($defs, definitions, any JSON
 * pointer) including recursion. Whitespace between tokens is bounded (one
 * space, or a newline and at most 20 spaces or tabs), numbers have at most
 * 16 digits: a model cannot loop forever in either. A pattern is matched as
 * the whole string (anchors implied). A keyword that constrains and is not
 * kept (not, if, uniqueItems, multipleOf, ...) is an error naming it and
 * its JSON pointer; annotations and unknown words are ignored. */
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
    const cJSON *doc;       /* the whole schema, for $ref */
    int n_names;
    sref refs[256];
    int n_refs;
    cJSON *owned[1024];     /* schemas made here (merged allOf, rewritten objects) */
    int n_owned;
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

/* minimum/maximum and their exclusive forms as integer bounds; 1 if any. */
static int int_bounds(sconv *c, const cJSON *s, long long *lo, long long *hi) {
    const double LIM = (double)(pow10ll(MAX_INT_DIGITS) - 1);
    double l = -LIM, h = LIM;
    int any = 0;
    const char *keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, keys[k]);
        if (!v) continue;
        if (!cJSON_IsNumber(v)) return sfail(c, "'%s' must be a number", keys[k]);
        double x = v->valuedouble;
        if (k == 0) l = LOOM_MAX(l, ceil(x));
        if (k == 1) l = LOOM_MAX(l, floor(x) + 1);
        if (k == 2) h = LOOM_MIN(h, floor(x));
        if (k == 3) h = LOOM_MIN(h, ceil(x) - 1);
        any = 1;
    }
    if (l > h) return sfail(c, "an integer range [%g, %g] that holds no integer", l, h);
    *lo = (long long)LOOM_MAX(l, -LIM);
    *hi = (long long)LOOM_MIN(h, LIM);
    return any;
}

static int gen_integer(sconv *c, const cJSON *s, loom_buf *e) {
    long long lo = 0, hi = 0;
    int any = int_bounds(c, s, &lo, &hi);
    if (any < 0) return -1;
    if (!any) loom_buf_puts(e, "json-int");
    else int_range(e, lo, hi);
    return 0;
}

/* Non-negative numbers in [lo, hi] (integers; hi < 0: unbounded): the
 * integer part in [lo, hi - 1] with any fraction, or hi itself. */
static void nonneg_number(loom_buf *e, long long lo, long long hi, long long lim) {
    loom_buf_puts(e, "(");
    if (hi < 0 || hi > lo) {
        nonneg_range(e, lo, hi < 0 ? lim : hi - 1);
        loom_buf_puts(e, " (\".\" [0-9]{1,16})?");
    }
    if (hi >= 0) {
        if (hi > lo) loom_buf_puts(e, " | ");
        loom_buf_printf(e, "\"%lld\" (\".\" \"0\"{1,16})?", hi);
    }
    loom_buf_puts(e, ")");
}

/* Bounds narrow to integers (ceil of a minimum, floor of a maximum, past
 * an exclusive one): the numbers written are a subset of the range. */
static int gen_number(sconv *c, const cJSON *s, loom_buf *e) {
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
        loom_buf_puts(e, "json-number");
        return 0;
    }
    if (l > h) return sfail(c, "a number range holding no integer (loom writes bounded numbers from integral bounds), found [%g, %g]", l, h);
    if (l > LIM || h < -LIM) return sfail(c, "number bounds beyond %d digits", MAX_INT_DIGITS);
    long long lo = isinf(l) ? -(long long)LIM : (long long)LOOM_MAX(l, -LIM);
    long long hi = isinf(h) ? -1 : (long long)LOOM_MIN(h, LIM);
    int unbounded_hi = isinf(h) || h > LIM, alts = 0;
    loom_buf_puts(e, "(");
    if (unbounded_hi || hi >= 0) { /* the part >= 0 */
        nonneg_number(e, LOOM_MAX(lo, 0), unbounded_hi ? -1 : hi, (long long)LIM);
        alts++;
    }
    if (lo < 0) { /* -y for y in [max(0, -hi), -lo] */
        if (alts++) loom_buf_puts(e, " | ");
        loom_buf_puts(e, "\"-\" ");
        long long ylo = !unbounded_hi && hi < 0 ? -hi : 0;
        nonneg_number(e, ylo, isinf(l) ? -1 : -lo, (long long)LIM);
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

static int gen_string(sconv *c, const cJSON *s, loom_buf *e) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format"), *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
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
    if (mx >= 0 && mx < mn) return sfail(c, "maxLength %d below minLength %d", mx, mn);
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
    if (mx >= 0 && mx < mn) return sfail(c, "maxItems %d below minItems %d", mx, mn);
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

static int is_required(const cJSON *req, const char *key) {
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, key)) return 1;
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
    if (c->n_owned == (int)LOOM_ARRAY_LEN(c->owned)) return sfail(c, "too many objects to rewrite"), NULL;
    cJSON *m = cJSON_Duplicate(s, 1);
    if (!m) return sfail(c, "out of memory"), NULL;
    c->owned[c->n_owned++] = m;
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
        if (c->n_owned == (int)LOOM_ARRAY_LEN(c->owned)) return sfail(c, "too many required properties outside 'properties'");
        cJSON *m = cJSON_Duplicate(s, 1), *mp = cJSON_GetObjectItemCaseSensitive(m, "properties");
        if (!m) return sfail(c, "out of memory");
        c->owned[c->n_owned++] = m;
        if (!mp) mp = cJSON_AddObjectToObject(m, "properties");
        for (const cJSON *q = req->child; q; q = q->next)
            if (cJSON_IsString(q) && !cJSON_GetObjectItemCaseSensitive(mp, q->valuestring))
                cJSON_AddItemToObject(mp, q->valuestring, cJSON_IsObject(ap) ? cJSON_Duplicate(ap, 1) : cJSON_CreateTrue());
        return gen_object(c, m, e);
    }
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
    if (pp && pattern_props(c, props, pp)) return -1;
    int n = cJSON_GetArraySize(props);
    if (!n && !pp && !cJSON_IsFalse(ap) && !cJSON_IsObject(ap)) {
        loom_buf_puts(e, "json-object");
        return 0;
    }
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
    } else if (!pp && (cJSON_IsTrue(ap) || cJSON_IsObject(ap))) {
        loom_buf v = {0};
        size_t mark = at_push(c, "additionalProperties");
        int arc = cJSON_IsObject(ap) ? gen(c, ap, &v) : (loom_buf_puts(&v, "json-value"), 0);
        c->at_len = mark;
        if (arc) return loom_buf_free(&v), -1;
        new_name(c, extra);
        loom_buf_printf(&c->out, "%s ::= json-string ws \":\" ws %s\n", extra, v.p);
        loom_buf_free(&v);
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
    if (!strcmp(t, "boolean")) return loom_buf_puts(e, "json-bool"), 0;
    if (!strcmp(t, "null")) return loom_buf_puts(e, "json-null"), 0;
    if (!strcmp(t, "object")) return gen_object(c, s, e);
    if (!strcmp(t, "array")) return gen_array(c, s, e);
    return sfail(c, "unknown type '%s' (expected string, integer, number, boolean, null, object or array)", t);
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

/* A branch of s's anyOf / oneOf (key) with s's other keywords, which hold
 * for every branch: properties and required merge, the branch's other
 * keywords win. A $ref branch is resolved first. */
static const cJSON *with_siblings(sconv *c, const cJSON *s, const char *key, const cJSON *branch) {
    for (int hops = 0; cJSON_IsObject(branch) && cJSON_GetObjectItemCaseSensitive(branch, "$ref") && hops < 16; hops++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(branch, "$ref");
        if (!cJSON_IsString(r) || !(branch = resolve_ref(c, r->valuestring))) return NULL;
    }
    if (cJSON_IsTrue(branch)) branch = NULL;
    else if (!cJSON_IsObject(branch)) return sfail(c, "a schema must be an object or true"), NULL;
    if (c->n_owned == (int)LOOM_ARRAY_LEN(c->owned)) return sfail(c, "too many anyOf/oneOf branches"), NULL;
    cJSON *m = cJSON_Duplicate(s, 1);
    if (!m) return sfail(c, "out of memory"), NULL;
    c->owned[c->n_owned++] = m;
    cJSON_DeleteItemFromObjectCaseSensitive(m, key);
    for (const cJSON *q = branch ? branch->child : NULL; q; q = q->next) {
        cJSON *have = cJSON_GetObjectItemCaseSensitive(m, q->string);
        if (have && !strcmp(q->string, "properties") && cJSON_IsObject(have)) {
            for (const cJSON *p = q->child; p; p = p->next) {
                cJSON_DeleteItemFromObjectCaseSensitive(have, p->string);
                cJSON_AddItemToObject(have, p->string, cJSON_Duplicate(p, 1));
            }
        } else if (have && !strcmp(q->string, "required") && cJSON_IsArray(have)) {
            for (const cJSON *p = q->child; p; p = p->next)
                if (cJSON_IsString(p) && !is_required(have, p->valuestring))
                    cJSON_AddItemToArray(have, cJSON_CreateString(p->valuestring));
        } else {
            cJSON_DeleteItemFromObjectCaseSensitive(m, q->string);
            cJSON_AddItemToObject(m, q->string, cJSON_Duplicate(q, 1));
        }
    }
    return m;
}

/* allOf: one schema, or objects merged (properties, required). */
static const cJSON *merge_all_of(sconv *c, const cJSON *s, const cJSON *all) {
    if (!cJSON_IsArray(all) || !cJSON_GetArraySize(all)) return sfail(c, "'allOf' must be a non-empty array"), NULL;
    if (c->n_owned == (int)(sizeof c->owned / sizeof *c->owned)) return sfail(c, "too many allOf"), NULL;
    cJSON *m = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    c->owned[c->n_owned++] = m;
    if (!m || !props || !req) return cJSON_Delete(props), cJSON_Delete(req), sfail(c, "out of memory"), NULL;
    cJSON_AddItemToObject(m, "properties", props);
    cJSON_AddItemToObject(m, "required", req);
    cJSON_AddStringToObject(m, "type", "object");
    const cJSON *parts[65];
    int n = 0;
    parts[n++] = s;
    for (const cJSON *a = all->child; a && n < 65; a = a->next) parts[n++] = a;
    for (int i = 0; i < n; i++) {
        const cJSON *p = parts[i];
        for (int hops = 0; cJSON_GetObjectItemCaseSensitive(p, "$ref") && hops < 16; hops++) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "$ref");
            if (!cJSON_IsString(r) || !(p = resolve_ref(c, r->valuestring))) return NULL;
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (i && ((t && (!cJSON_IsString(t) || strcmp(t->valuestring, "object"))) || cJSON_GetObjectItemCaseSensitive(p, "allOf") ||
                  cJSON_GetObjectItemCaseSensitive(p, "anyOf") || cJSON_GetObjectItemCaseSensitive(p, "oneOf")))
            return sfail(c, "'allOf' is supported for object schemas only"), NULL;
        const cJSON *pp = cJSON_GetObjectItemCaseSensitive(p, "properties");
        for (const cJSON *q = pp ? pp->child : NULL; q; q = q->next)
            if (!cJSON_GetObjectItemCaseSensitive(props, q->string)) cJSON_AddItemToObject(props, q->string, cJSON_Duplicate(q, 1));
        const cJSON *rq = cJSON_GetObjectItemCaseSensitive(p, "required");
        for (const cJSON *q = rq ? rq->child : NULL; q; q = q->next)
            if (cJSON_IsString(q) && !is_required(req, q->valuestring)) cJSON_AddItemToArray(req, cJSON_CreateString(q->valuestring));
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(p, "additionalProperties");
        if (ap && !cJSON_GetObjectItemCaseSensitive(m, "additionalProperties"))
            cJSON_AddItemToObject(m, "additionalProperties", cJSON_Duplicate(ap, 1));
    }
    return m;
}

/* Keywords that constrain what validates and that the grammar cannot keep
 * are errors naming them; the others (annotations, unknown words) are
 * ignored as JSON Schema says. A keyword that holds for every output the
 * grammar makes is let through. */
static int check_keywords(sconv *c, const cJSON *s) {
    static const char *const unsupported[] = {
        "not", "if", "then", "else", "dependentSchemas", "contains",
        "minContains", "maxContains", "propertyNames", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
    for (const cJSON *k = s->child; k; k = k->next) {
        const char *key = k->string;
        int bad = 0;
        for (size_t i = 0; i < LOOM_ARRAY_LEN(unsupported) && !bad; i++) bad = !strcmp(key, unsupported[i]);
        if (!strcmp(key, "multipleOf")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
            bad = !(cJSON_IsNumber(k) && k->valuedouble == 1 && cJSON_IsString(t) && !strcmp(t->valuestring, "integer"));
        }
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
            /* a length bound on a format loom does not know is kept (the format is not) */
            bad = cJSON_GetObjectItemCaseSensitive(s, "pattern") || (cJSON_IsString(f) && known_format(f->valuestring));
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

/* Appends the expression matching schema s to e (a rule name, mostly). */
static int gen(sconv *c, const cJSON *s, loom_buf *e) {
    if (c->failed) return -1;
    if (cJSON_IsTrue(s)) return loom_buf_puts(e, "json-value"), 0;
    if (!cJSON_IsObject(s)) return sfail(c, "a schema must be an object or true, found %s", cJSON_IsFalse(s) ? "false (matches nothing)" : "another value");
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
    if (check_keywords(c, s)) return -1;
    loom_buf body = {0};
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        rc = gen_literal(c, k, &body);
    } else if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(k) || !cJSON_GetArraySize(k)) rc = sfail(c, "'enum' must be a non-empty array");
        for (const cJSON *v = k->child; v && !rc; v = v->next) {
            if (v != k->child) loom_buf_puts(&body, " | ");
            rc = gen_literal(c, v, &body);
        }
    } else if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) || (k = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        if (!cJSON_IsArray(k) || !cJSON_GetArraySize(k)) rc = sfail(c, "'%s' must be a non-empty array", k->string);
        int i = 0;
        for (const cJSON *v = k->child; v && !rc; v = v->next, i++) {
            if (v != k->child) loom_buf_puts(&body, " | ");
            size_t mark = at_push_i(c, k->string, i);
            const cJSON *b = annotations_only(s, k->string) ? v : with_siblings(c, s, k->string, v);
            rc = b ? gen(c, b, &body) : -1;
            c->at_len = mark;
        }
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
    if (err && cap) err[0] = 0;
    cJSON *doc = cJSON_Parse(schema);
    if (!doc) {
        snprintf(err, cap, "the JSON schema is not valid JSON");
        return NULL;
    }
    sconv c = {.doc = doc, .err = err, .err_cap = cap};
    loom_buf_puts(&c.out, PRELUDE);
    loom_buf root = {0};
    int rc = gen(&c, doc, &root);
    if (!rc) loom_buf_printf(&c.out, "root ::= %s\n", root.p);
    loom_buf_free(&root);
    for (int i = 0; i < c.n_owned; i++) cJSON_Delete(c.owned[i]);
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
    for (int i = 0; i < c.n_owned; i++) cJSON_Delete(c.owned[i]);
    cJSON_Delete(tools);
    if (!rc && c.out.oom) rc = sfail(&c, "out of memory");
    if (rc) {
        loom_buf_free(&c.out);
        return NULL;
    }
    return c.out.p;
}
