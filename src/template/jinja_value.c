/* template/jinja_value: the value model of the Jinja engine (Python-like
 * values living in an arena), their str()/repr() printing, JSON in and out.
 * Printing follows CPython exactly where chat templates can observe it:
 * repr of strings picks its quote like CPython, floats print as the shortest
 * round-trip repr, json.dumps uses ", " and ": " separators by default. */
#include "template/jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- arena --------------------------------------------------------------- */

struct jarena_block {
    jarena_block *next;
    size_t used, cap;
    max_align_t data[];
};

void *jar_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    jarena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 32768 ? n : 32768;
        b = a->limit && a->used + cap > a->limit ? NULL : malloc(sizeof *b + cap);
        if (!b) {
            a->failed = 1;
            return NULL;
        }
        a->used += cap;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *jar_strdup(jarena *a, const char *s, size_t n) {
    char *p = jar_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jar_free(jarena *a) {
    jarena_block *b = a->head;
    while (b) {
        jarena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ---- UTF-8 ------------------------------------------------------------------ */

/* Decodes one code point at s[i]; invalid bytes decode as themselves (U+FFFD
 * would change lengths Python never sees: inputs are valid UTF-8). */
size_t ju_decode(const char *s, size_t n, size_t i, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

void ju_encode(loom_buf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    loom_buf_put(b, (const char *)tmp, (size_t)k);
}

/* Code points as ju_decode steps through them (a stray byte counts as
 * one), so counts and offset tables built by decoding always agree. */
size_t ju_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; c++) {
        int32_t cp;
        i += ju_decode(s, n, i, &cp);
    }
    return c;
}

/* ---- constructors ------------------------------------------------------------ */

jv jv_undef_static = {.type = JV_UNDEF};
jv jv_none_static = {.type = JV_NONE};
jv jv_true_static = {.type = JV_BOOL, .u.b = 1};
jv jv_false_static = {.type = JV_BOOL, .u.b = 0};

/* On allocation failure constructors return this thread's scratch value, a
 * fresh None each time: callers may write to it harmlessly (the shared
 * statics are never written), and the arena's failed flag fails the render. */
static _Thread_local jv oom_scratch;

jv *jv_oom(void) {
    memset(&oom_scratch, 0, sizeof oom_scratch);
    oom_scratch.type = JV_NONE;
    return &oom_scratch;
}

jv *jv_new(jarena *a, int type) {
    jv *v = jar_alloc(a, sizeof *v);
    if (!v) return jv_oom();
    v->type = type;
    return v;
}

jv *jv_str_borrow(jarena *a, const char *p, size_t n) {
    jv *v = jv_new(a, JV_STR);
    if (v == &oom_scratch) return v;
    v->u.s.p = p;
    v->u.s.n = n;
    return v;
}

jv *jv_str(jarena *a, const char *p, size_t n) {
    char *c = jar_strdup(a, p, n);
    if (!c) return jv_oom();
    return jv_str_borrow(a, c, n);
}

jv *jv_strz(jarena *a, const char *p) { return jv_str(a, p, strlen(p)); }

jv *jv_int(jarena *a, int64_t i) {
    jv *v = jv_new(a, JV_INT);
    if (v != &oom_scratch) v->u.i = i;
    return v;
}

jv *jv_float(jarena *a, double f) {
    jv *v = jv_new(a, JV_FLOAT);
    if (v != &oom_scratch) v->u.f = f;
    return v;
}

jv *jv_bool(int b) { return b ? &jv_true_static : &jv_false_static; }

jv *jv_undef(jarena *a, const char *name) {
    if (!name) return &jv_undef_static;
    jv *v = jv_new(a, JV_UNDEF);
    if (v != &oom_scratch) v->uname = name;
    return v;
}

jv *jv_list(jarena *a, size_t cap) {
    jv *v = jv_new(a, JV_LIST);
    if (v == &oom_scratch) return v;
    if (cap) {
        v->u.l.v = jar_alloc(a, cap * sizeof(jv *));
        if (v->u.l.v) v->u.l.cap = cap;
    }
    return v;
}

jv *jv_dict(jarena *a) { return jv_new(a, JV_DICT); }

void jv_list_push(jarena *a, jv *l, jv *x) {
    if (l->type != JV_LIST) return;
    if (l->u.l.n == l->u.l.cap) {
        size_t cap = l->u.l.cap ? l->u.l.cap * 2 : 4;
        jv **nv = jar_alloc(a, cap * sizeof(jv *));
        if (!nv) return;
        if (l->u.l.n) memcpy(nv, l->u.l.v, l->u.l.n * sizeof(jv *));
        l->u.l.v = nv;
        l->u.l.cap = cap;
    }
    l->u.l.v[l->u.l.n++] = x;
}

jv *jv_dict_get(const jv *d, const jv *key) {
    if (d->type != JV_DICT) return NULL;
    for (size_t i = 0; i < d->u.d.n; i++)
        if (jv_equal(d->u.d.k[i], key)) return d->u.d.v[i];
    return NULL;
}

jv *jv_dict_gets(const jv *d, const char *key) {
    if (d->type != JV_DICT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < d->u.d.n; i++) {
        const jv *k = d->u.d.k[i];
        if (k->type == JV_STR && k->u.s.n == n && !memcmp(k->u.s.p, key, n))
            return d->u.d.v[i];
    }
    return NULL;
}

void jv_dict_set(jarena *a, jv *d, jv *key, jv *val) {
    if (d->type != JV_DICT) return;
    for (size_t i = 0; i < d->u.d.n; i++)
        if (jv_equal(d->u.d.k[i], key)) {
            d->u.d.v[i] = val;
            return;
        }
    if (d->u.d.n == d->u.d.cap) {
        size_t cap = d->u.d.cap ? d->u.d.cap * 2 : 4;
        jv **nk = jar_alloc(a, cap * sizeof(jv *));
        jv **nv = jar_alloc(a, cap * sizeof(jv *));
        if (!nk || !nv) return;
        if (d->u.d.n) {
            memcpy(nk, d->u.d.k, d->u.d.n * sizeof(jv *));
            memcpy(nv, d->u.d.v, d->u.d.n * sizeof(jv *));
        }
        d->u.d.k = nk;
        d->u.d.v = nv;
        d->u.d.cap = cap;
    }
    d->u.d.k[d->u.d.n] = key;
    d->u.d.v[d->u.d.n] = val;
    d->u.d.n++;
}

/* ---- truthiness, equality, ordering --------------------------------------------- */

int jv_truthy(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return (v->flags & JVF_ITER) || v->u.l.n != 0;
    case JV_DICT: return (v->flags & JVF_NS) || v->u.d.n != 0;
    default: return 1;
    }
}

/* Containers can hold themselves (list.append(list), ns.x = ns): recursion
 * below is capped at this depth instead of running off the stack. */
#define MAX_VALUE_DEPTH 200

static int equal_at(const jv *a, const jv *b, int depth);

int jv_equal(const jv *a, const jv *b) { return equal_at(a, b, 0); }

static int equal_at(const jv *a, const jv *b, int depth) {
    if (a == b) return 1;
    if (depth > MAX_VALUE_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) return numi(a) == numi(b);
        return numf(a) == numf(b);
    }
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR:
        return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_LIST:
        if ((a->flags & JVF_TUPLE) != (b->flags & JVF_TUPLE)) return 0;
        if ((a->flags | b->flags) & JVF_ITER) return 0;
        if (a->u.l.n != b->u.l.n) return 0;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!equal_at(a->u.l.v[i], b->u.l.v[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if ((a->flags & JVF_NS) || (b->flags & JVF_NS)) return 0;
        if (a->u.d.n != b->u.d.n) return 0;
        for (size_t i = 0; i < a->u.d.n; i++) {
            jv *o = jv_dict_get(b, a->u.d.k[i]);
            if (!o || !equal_at(a->u.d.v[i], o, depth + 1)) return 0;
        }
        return 1;
    default: return 0;
    }
}

static int compare_at(const jv *a, const jv *b, int *ok, int depth);

int jv_compare(const jv *a, const jv *b, int *ok) { return compare_at(a, b, ok, 0); }

static int compare_at(const jv *a, const jv *b, int *ok, int depth) {
    *ok = depth <= MAX_VALUE_DEPTH;
    if (!*ok) return 0;
    if (is_num(a) && is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) {
            int64_t x = numi(a), y = numi(b);
            return x < y ? -1 : x > y;
        }
        double x = numf(a), y = numf(b);
        return x < y ? -1 : x > y;
    }
    if (a->type == JV_STR && b->type == JV_STR) {
        size_t n = LOOM_MIN(a->u.s.n, b->u.s.n);
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (a->type == JV_LIST && b->type == JV_LIST &&
        (a->flags & JVF_TUPLE) == (b->flags & JVF_TUPLE) &&
        !((a->flags | b->flags) & JVF_ITER)) {
        size_t n = LOOM_MIN(a->u.l.n, b->u.l.n);
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a->u.l.v[i], b->u.l.v[i])) continue;
            return compare_at(a->u.l.v[i], b->u.l.v[i], ok, depth + 1);
        }
        return a->u.l.n < b->u.l.n ? -1 : a->u.l.n > b->u.l.n;
    }
    *ok = 0;
    return 0;
}

const char *jv_type_name(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return (v->flags & JVF_TUPLE) ? "tuple" : "list";
    case JV_DICT: return (v->flags & JVF_NS) ? "Namespace" : "dict";
    default: return "function";
    }
}

/* ---- printing ---------------------------------------------------------------------- */

/* CPython's float repr: the shortest digits that round-trip, fixed notation
 * for exponents in [-4, 16), scientific otherwise. */
void jv_fmt_float(loom_buf *b, double f) {
    if (isnan(f)) { loom_buf_puts(b, "nan"); return; }
    if (isinf(f)) { loom_buf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { loom_buf_puts(b, signbit(f) ? "-0.0" : "0.0"); return; }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp is [-]d[.ddd]e[+-]xx: pull out the digits and exponent */
    char digits[32];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) loom_buf_putc(b, '-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            loom_buf_puts(b, "0.");
            for (int i = -1; i > exp; i--) loom_buf_putc(b, '0');
            loom_buf_put(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= exp; i++) loom_buf_putc(b, i < nd ? digits[i] : '0');
            loom_buf_putc(b, '.');
            if (nd > exp + 1) loom_buf_put(b, digits + exp + 1, (size_t)(nd - exp - 1));
            else loom_buf_putc(b, '0');
        }
    } else {
        loom_buf_putc(b, digits[0]);
        if (nd > 1) {
            loom_buf_putc(b, '.');
            loom_buf_put(b, digits + 1, (size_t)(nd - 1));
        }
        loom_buf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static int py_printable(int32_t c) {
    if (c < 0x20 || c == 0x7f) return 0;
    if (c < 0x7f) return 1;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default: return 1;
    }
}

static void repr_str(loom_buf *b, const char *s, size_t n) {
    char q = '\'';
    if (memchr(s, '\'', n) && !memchr(s, '"', n)) q = '"';
    loom_buf_putc(b, q);
    for (size_t i = 0; i < n;) {
        int32_t c;
        size_t k = ju_decode(s, n, i, &c);
        if (c == q || c == '\\') { loom_buf_putc(b, '\\'); loom_buf_putc(b, (char)c); }
        else if (c == '\n') loom_buf_puts(b, "\\n");
        else if (c == '\r') loom_buf_puts(b, "\\r");
        else if (c == '\t') loom_buf_puts(b, "\\t");
        else if (py_printable(c)) loom_buf_put(b, s + i, k);
        else if (c < 0x100) loom_buf_printf(b, "\\x%02x", (unsigned)c);
        else if (c < 0x10000) loom_buf_printf(b, "\\u%04x", (unsigned)c);
        else loom_buf_printf(b, "\\U%08x", (unsigned)c);
        i += k;
    }
    loom_buf_putc(b, q);
}

static void repr_at(loom_buf *b, const jv *v, int depth);

void jv_repr(loom_buf *b, const jv *v) { repr_at(b, v, 0); }

static void repr_at(loom_buf *b, const jv *v, int depth) {
    if (depth > MAX_VALUE_DEPTH && (v->type == JV_LIST || v->type == JV_DICT)) {
        loom_buf_puts(b, "...");
        return;
    }
    switch (v->type) {
    case JV_STR: repr_str(b, v->u.s.p, v->u.s.n); return;
    case JV_LIST: {
        if (v->flags & JVF_ITER) {
            loom_buf_puts(b, "<generator object>");
            return;
        }
        int tup = v->flags & JVF_TUPLE;
        loom_buf_putc(b, tup ? '(' : '[');
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i) loom_buf_puts(b, ", ");
            repr_at(b, v->u.l.v[i], depth + 1);
        }
        if (tup && v->u.l.n == 1) loom_buf_putc(b, ',');
        loom_buf_putc(b, tup ? ')' : ']');
        return;
    }
    case JV_DICT:
        if (v->flags & JVF_NS) loom_buf_puts(b, "<Namespace ");
        loom_buf_putc(b, '{');
        for (size_t i = 0; i < v->u.d.n; i++) {
            if (i) loom_buf_puts(b, ", ");
            repr_at(b, v->u.d.k[i], depth + 1);
            loom_buf_puts(b, ": ");
            repr_at(b, v->u.d.v[i], depth + 1);
        }
        loom_buf_putc(b, '}');
        if (v->flags & JVF_NS) loom_buf_putc(b, '>');
        return;
    case JV_UNDEF: loom_buf_puts(b, "Undefined"); return;
    default: jv_to_str(b, v); return;
    }
}

void jv_to_str(loom_buf *b, const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return;
    case JV_NONE: loom_buf_puts(b, "None"); return;
    case JV_BOOL: loom_buf_puts(b, v->u.b ? "True" : "False"); return;
    case JV_INT: loom_buf_printf(b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: jv_fmt_float(b, v->u.f); return;
    case JV_STR: loom_buf_put(b, v->u.s.p, v->u.s.n); return;
    case JV_FUNC:
        loom_buf_printf(b, "<function %s>", v->u.fn->name ? v->u.fn->name : "macro");
        return;
    default: jv_repr(b, v); return;
    }
}

/* ---- JSON out ----------------------------------------------------------------------- */

static void json_str(loom_buf *b, const char *s, size_t n, int ensure_ascii) {
    loom_buf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        int32_t c;
        size_t k = ju_decode(s, n, i, &c);
        switch (c) {
        case '"': loom_buf_puts(b, "\\\""); break;
        case '\\': loom_buf_puts(b, "\\\\"); break;
        case '\n': loom_buf_puts(b, "\\n"); break;
        case '\r': loom_buf_puts(b, "\\r"); break;
        case '\t': loom_buf_puts(b, "\\t"); break;
        case '\b': loom_buf_puts(b, "\\b"); break;
        case '\f': loom_buf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) loom_buf_printf(b, "\\u%04x", (unsigned)c);
            else if (ensure_ascii && c > 0x7e) {
                if (c >= 0x10000) {
                    int32_t v = c - 0x10000;
                    loom_buf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xd800 + (v >> 10)),
                              (unsigned)(0xdc00 + (v & 0x3ff)));
                } else loom_buf_printf(b, "\\u%04x", (unsigned)c);
            } else loom_buf_put(b, s + i, k);
        }
        i += k;
    }
    loom_buf_putc(b, '"');
}

static void json_indent(loom_buf *b, const jjson_opts *o, int depth) {
    loom_buf_putc(b, '\n');
    for (int i = 0; i < depth; i++) loom_buf_puts(b, o->indent);
}

static int json_key(loom_buf *b, const jv *k, const jjson_opts *o) {
    switch (k->type) {
    case JV_STR: json_str(b, k->u.s.p, k->u.s.n, o->ensure_ascii); return 1;
    case JV_INT: loom_buf_printf(b, "\"%lld\"", (long long)k->u.i); return 1;
    case JV_BOOL: loom_buf_puts(b, k->u.b ? "\"true\"" : "\"false\""); return 1;
    case JV_NONE: loom_buf_puts(b, "\"null\""); return 1;
    case JV_FLOAT: loom_buf_putc(b, '"'); jv_fmt_float(b, k->u.f); loom_buf_putc(b, '"'); return 1;
    default: return 0;
    }
}

int jv_to_json(loom_buf *b, const jv *v, const jjson_opts *o, int depth) {
    if (depth > 200) return 0;
    switch (v->type) {
    case JV_NONE: loom_buf_puts(b, "null"); return 1;
    case JV_BOOL: loom_buf_puts(b, v->u.b ? "true" : "false"); return 1;
    case JV_INT: loom_buf_printf(b, "%lld", (long long)v->u.i); return 1;
    case JV_FLOAT:
        if (isnan(v->u.f)) loom_buf_puts(b, "NaN");
        else if (isinf(v->u.f)) loom_buf_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else jv_fmt_float(b, v->u.f);
        return 1;
    case JV_STR: json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii); return 1;
    case JV_LIST:
        if (v->flags & JVF_ITER) return 0;
        if (!v->u.l.n) { loom_buf_puts(b, "[]"); return 1; }
        loom_buf_putc(b, '[');
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i) loom_buf_puts(b, o->item_sep);
            if (o->indent) json_indent(b, o, depth + 1);
            if (!jv_to_json(b, v->u.l.v[i], o, depth + 1)) return 0;
        }
        if (o->indent) json_indent(b, o, depth);
        loom_buf_putc(b, ']');
        return 1;
    case JV_DICT: {
        if (v->flags & JVF_NS) return 0;
        if (!v->u.d.n) { loom_buf_puts(b, "{}"); return 1; }
        size_t n = v->u.d.n;
        size_t order_buf[64];
        size_t *order = n <= 64 ? order_buf : malloc(n * sizeof *order);
        if (!order) return 0;
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) /* insertion sort: stable, dicts are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0; j--) {
                    int ok;
                    if (jv_compare(v->u.d.k[order[j - 1]], v->u.d.k[order[j]], &ok) <= 0)
                        break;
                    size_t t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
                }
        loom_buf_putc(b, '{');
        int good = 1;
        for (size_t i = 0; i < n && good; i++) {
            if (i) loom_buf_puts(b, o->item_sep);
            if (o->indent) json_indent(b, o, depth + 1);
            good = json_key(b, v->u.d.k[order[i]], o);
            if (!good) break;
            loom_buf_puts(b, o->key_sep);
            good = jv_to_json(b, v->u.d.v[order[i]], o, depth + 1);
        }
        if (order != order_buf) free(order);
        if (!good) return 0;
        if (o->indent) json_indent(b, o, depth);
        loom_buf_putc(b, '}');
        return 1;
    }
    default: return 0;
    }
}

/* ---- JSON in ---------------------------------------------------------------------------- */

typedef struct jp {
    jarena *a;
    const char *s;
    size_t n, i;
    const char *err;
    int depth;
} jp;

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int hex4(const char *s, int32_t *out) {
    int32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

static jv *jp_string(jp *p) {
    loom_buf b = {0};
    p->i++; /* opening quote */
    while (p->i < p->n && p->s[p->i] != '"') {
        char c = p->s[p->i];
        if ((unsigned char)c < 0x20) { p->err = "control character in string"; break; }
        if (c != '\\') {
            size_t j = p->i;
            while (j < p->n && p->s[j] != '"' && p->s[j] != '\\' &&
                   (unsigned char)p->s[j] >= 0x20)
                j++;
            loom_buf_put(&b, p->s + p->i, j - p->i);
            p->i = j;
            continue;
        }
        if (p->i + 1 >= p->n) { p->err = "truncated escape"; break; }
        char e = p->s[p->i + 1];
        p->i += 2;
        switch (e) {
        case '"': loom_buf_putc(&b, '"'); break;
        case '\\': loom_buf_putc(&b, '\\'); break;
        case '/': loom_buf_putc(&b, '/'); break;
        case 'b': loom_buf_putc(&b, '\b'); break;
        case 'f': loom_buf_putc(&b, '\f'); break;
        case 'n': loom_buf_putc(&b, '\n'); break;
        case 'r': loom_buf_putc(&b, '\r'); break;
        case 't': loom_buf_putc(&b, '\t'); break;
        case 'u': {
            int32_t cp;
            if (p->i + 4 > p->n || !hex4(p->s + p->i, &cp)) { p->err = "bad \\u escape"; break; }
            p->i += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p->i + 6 <= p->n &&
                p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                int32_t lo;
                if (hex4(p->s + p->i + 2, &lo) && lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p->i += 6;
                }
            }
            if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; /* lone surrogate */
            ju_encode(&b, cp);
            break;
        }
        default: p->err = "bad escape"; break;
        }
        if (p->err) break;
    }
    if (!p->err && p->i >= p->n) p->err = "unterminated string";
    jv *v = NULL;
    if (!p->err) {
        p->i++;
        v = jv_str(p->a, b.p ? b.p : "", b.len);
    }
    free(b.p);
    return v;
}

static jv *jp_value(jp *p) {
    jp_ws(p);
    if (p->i >= p->n) { p->err = "unexpected end of input"; return NULL; }
    if (++p->depth > 512) { p->err = "nesting too deep"; return NULL; }
    char c = p->s[p->i];
    jv *r = NULL;
    if (c == '{') {
        r = jv_dict(p->a);
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') { p->i++; goto done; }
        for (;;) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') { p->err = "expected string key"; return NULL; }
            jv *k = jp_string(p);
            if (!k) return NULL;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') { p->err = "expected ':'"; return NULL; }
            p->i++;
            jv *v = jp_value(p);
            if (!v) return NULL;
            jv_dict_set(p->a, r, k, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == '}') { p->i++; break; }
            p->err = "expected ',' or '}'";
            return NULL;
        }
    } else if (c == '[') {
        r = jv_list(p->a, 0);
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') { p->i++; goto done; }
        for (;;) {
            jv *v = jp_value(p);
            if (!v) return NULL;
            jv_list_push(p->a, r, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == ']') { p->i++; break; }
            p->err = "expected ',' or ']'";
            return NULL;
        }
    } else if (c == '"') {
        r = jp_string(p);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        size_t j = p->i;
        int isf = 0;
        if (p->s[j] == '-') j++;
        while (j < p->n && ((p->s[j] >= '0' && p->s[j] <= '9') || p->s[j] == '.' ||
                            p->s[j] == 'e' || p->s[j] == 'E' ||
                            ((p->s[j] == '+' || p->s[j] == '-') &&
                             (p->s[j - 1] == 'e' || p->s[j - 1] == 'E')))) {
            if (p->s[j] == '.' || p->s[j] == 'e' || p->s[j] == 'E') isf = 1;
            j++;
        }
        char tmp[64];
        size_t len = j - p->i;
        if (len == 0 || len >= sizeof tmp) { p->err = "bad number"; return NULL; }
        memcpy(tmp, p->s + p->i, len);
        tmp[len] = 0;
        char *end;
        if (!isf) {
            errno = 0;
            long long x = strtoll(tmp, &end, 10);
            if (*end || errno) isf = 1;
            else r = jv_int(p->a, x);
        }
        if (isf) {
            double d = strtod(tmp, &end);
            if (*end) { p->err = "bad number"; return NULL; }
            r = jv_float(p->a, d);
        }
        p->i = j;
    } else if (p->n - p->i >= 4 && !memcmp(p->s + p->i, "true", 4)) {
        r = jv_bool(1); p->i += 4;
    } else if (p->n - p->i >= 5 && !memcmp(p->s + p->i, "false", 5)) {
        r = jv_bool(0); p->i += 5;
    } else if (p->n - p->i >= 4 && !memcmp(p->s + p->i, "null", 4)) {
        r = &jv_none_static; p->i += 4;
    } else {
        p->err = "unexpected character";
    }
done:
    p->depth--;
    return r;
}

jv *jv_parse_json(jarena *a, const char *s, size_t n, const char **err) {
    jp p = {.a = a, .s = s, .n = n};
    jv *v = jp_value(&p);
    if (v) {
        jp_ws(&p);
        if (p.i < p.n) { p.err = "trailing characters"; v = NULL; }
    }
    if (!v && err) *err = p.err ? p.err : "bad JSON";
    return v;
}
