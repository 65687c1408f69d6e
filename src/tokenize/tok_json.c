/* tokenize JSON fast path: a small strict JSON lexer used to read the two
 * big members of tokenizer.json (model.vocab and model.merges, hundreds of
 * thousands of entries) straight from the text. A DOM for them would cost a
 * heap node per entry, which dominates load time (several seconds under
 * sanitizers for a 262k vocabulary). Everything else still goes through
 * cJSON, on a copy of the text with those two values blanked out. */
#include <stdlib.h>
#include <string.h>

#include "tokenize/tok_internal.h"

void tk_lex_ws(tk_lex *x) {
    while (x->p < x->e && (*x->p == ' ' || *x->p == '\n' || *x->p == '\r' || *x->p == '\t'))
        x->p++;
}

static int hexval(const char *p, const char *e, unsigned *v) {
    if (e - p < 4) return -1;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        r = r * 16 + (unsigned)d;
    }
    *v = r;
    return 0;
}

int tk_lex_string(tk_lex *x, tk_buf *out) {
    if (x->p >= x->e || *x->p != '"') return -1;
    x->p++;
    for (;;) {
        const char *run = x->p;
        while (x->p < x->e && *x->p != '"' && *x->p != '\\' && (unsigned char)*x->p >= 0x20)
            x->p++;
        if (out && tk_buf_put(out, run, (size_t)(x->p - run))) return -1;
        if (x->p >= x->e || (unsigned char)*x->p < 0x20) return -1;
        if (*x->p == '"') {
            x->p++;
            if (out && tk_buf_reserve(out, 0)) return -1;
            if (out) out->p[out->n] = 0;
            return 0;
        }
        /* escape */
        if (x->e - x->p < 2) return -1;
        char c = x->p[1];
        x->p += 2;
        char lit = 0;
        switch (c) {
        case '"': lit = '"'; break;
        case '\\': lit = '\\'; break;
        case '/': lit = '/'; break;
        case 'b': lit = '\b'; break;
        case 'f': lit = '\f'; break;
        case 'n': lit = '\n'; break;
        case 'r': lit = '\r'; break;
        case 't': lit = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (hexval(x->p, x->e, &cp)) return -1;
            x->p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;   /* lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (x->e - x->p < 6 || x->p[0] != '\\' || x->p[1] != 'u' ||
                    hexval(x->p + 2, x->e, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                x->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (out && tk_buf_put_cp(out, cp)) return -1;
            continue;
        }
        default:
            return -1;
        }
        if (out && tk_buf_putc(out, lit)) return -1;
    }
}

int tk_lex_int(tk_lex *x, long long *v) {
    const char *p = x->p;
    int neg = 0;
    if (p < x->e && *p == '-') { neg = 1; p++; }
    if (p >= x->e || *p < '0' || *p > '9') return -1;
    long long r = 0;
    while (p < x->e && *p >= '0' && *p <= '9') {
        if (r > (1LL << 40)) return -1;
        r = r * 10 + (*p - '0');
        p++;
    }
    /* a fraction or exponent is not an id */
    if (p < x->e && (*p == '.' || *p == 'e' || *p == 'E')) return -1;
    x->p = p;
    *v = neg ? -r : r;
    return 0;
}

static int lex_literal(tk_lex *x, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(x->e - x->p) < n || memcmp(x->p, w, n)) return -1;
    x->p += n;
    return 0;
}

static int lex_number(tk_lex *x) {
    const char *p = x->p;
    if (p < x->e && *p == '-') p++;
    if (p >= x->e || *p < '0' || *p > '9') return -1;
    while (p < x->e && *p >= '0' && *p <= '9') p++;
    if (p < x->e && *p == '.') {
        p++;
        if (p >= x->e || *p < '0' || *p > '9') return -1;
        while (p < x->e && *p >= '0' && *p <= '9') p++;
    }
    if (p < x->e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < x->e && (*p == '+' || *p == '-')) p++;
        if (p >= x->e || *p < '0' || *p > '9') return -1;
        while (p < x->e && *p >= '0' && *p <= '9') p++;
    }
    x->p = p;
    return 0;
}

int tk_lex_skip(tk_lex *x, int depth) {
    if (depth > 200) return -1;
    tk_lex_ws(x);
    if (x->p >= x->e) return -1;
    char c = *x->p;
    if (c == '"') return tk_lex_string(x, NULL);
    if (c == 't') return lex_literal(x, "true");
    if (c == 'f') return lex_literal(x, "false");
    if (c == 'n') return lex_literal(x, "null");
    if (c != '{' && c != '[') return lex_number(x);
    char close = c == '{' ? '}' : ']';
    x->p++;
    tk_lex_ws(x);
    if (x->p < x->e && *x->p == close) {
        x->p++;
        return 0;
    }
    for (;;) {
        if (c == '{') {
            tk_lex_ws(x);
            if (tk_lex_string(x, NULL)) return -1;
            tk_lex_ws(x);
            if (x->p >= x->e || *x->p != ':') return -1;
            x->p++;
        }
        if (tk_lex_skip(x, depth + 1)) return -1;
        tk_lex_ws(x);
        if (x->p >= x->e) return -1;
        if (*x->p == close) {
            x->p++;
            return 0;
        }
        if (*x->p != ',') return -1;
        x->p++;
    }
}

/* Walks an object at x, calling on_member for each key with the lexer at
 * the value; on_member must consume the value. */
static int lex_object(tk_lex *x, int (*on_member)(void *, const char *, tk_lex *),
                      void *ctx) {
    tk_buf key = {0};
    tk_lex_ws(x);
    if (x->p >= x->e || *x->p != '{') return -1;
    x->p++;
    tk_lex_ws(x);
    int rc = 0;
    if (x->p < x->e && *x->p == '}') {
        x->p++;
        return 0;
    }
    for (;;) {
        tk_lex_ws(x);
        key.n = 0;
        if (tk_lex_string(x, &key)) { rc = -1; break; }
        tk_lex_ws(x);
        if (x->p >= x->e || *x->p != ':') { rc = -1; break; }
        x->p++;
        tk_lex_ws(x);
        if (on_member(ctx, key.p ? key.p : "", x)) { rc = -1; break; }
        tk_lex_ws(x);
        if (x->p >= x->e) { rc = -1; break; }
        if (*x->p == '}') { x->p++; break; }
        if (*x->p != ',') { rc = -1; break; }
        x->p++;
    }
    tk_buf_free(&key);
    return rc;
}

typedef struct locate_ctx {
    tk_span_t *vocab, *merges;
    int found_model;
} locate_ctx;

static int on_model_member(void *c, const char *key, tk_lex *x) {
    locate_ctx *l = c;
    const char *start = x->p;
    if (tk_lex_skip(x, 1)) return -1;
    if (!strcmp(key, "vocab") && *start == '{') {
        l->vocab->s = (size_t)(start - x->base);
        l->vocab->e = (size_t)(x->p - x->base);
    } else if (!strcmp(key, "merges") && *start == '[') {
        l->merges->s = (size_t)(start - x->base);
        l->merges->e = (size_t)(x->p - x->base);
    }
    return 0;
}

static int on_root_member(void *c, const char *key, tk_lex *x) {
    locate_ctx *l = c;
    if (!strcmp(key, "model") && x->p < x->e && *x->p == '{') {
        l->found_model = 1;
        return lex_object(x, on_model_member, l);
    }
    return tk_lex_skip(x, 0);
}

int tk_json_locate_model(const char *js, size_t n, tk_span_t *vocab,
                         tk_span_t *merges) {
    tk_lex x = {.p = js, .e = js + n, .base = js};
    *vocab = (tk_span_t){0, 0};
    *merges = (tk_span_t){0, 0};
    locate_ctx l = {.vocab = vocab, .merges = merges};
    if (lex_object(&x, on_root_member, &l)) return -1;
    tk_lex_ws(&x);
    if (x.p != x.e) return -1;
    return 0;
}
