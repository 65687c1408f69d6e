/* template/jinja_ops: the operations on values that a render's evaluator and
 * its filters and tests share (jinja_render.h): errors, string helpers,
 * iteration and membership, attribute and item access, slicing,
 * printf-style formatting and the operators. Semantics follow Python and
 * Jinja2 3.x as jinja_eval.c describes them. */
#include "template/jinja_render.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

jv *rerr(ctx *c, int line, const char *fmt, ...) {
    if (c->st != LOOM_OK) return NULL;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = loom_err(LOOM_ERR_INVALID_ARG, "template line %d: %s", line, msg);
    return NULL;
}

jv *mk_func(ctx *c, int kind, const char *name, jv *self) {
    jv *v = jv_new(c->a, JV_FUNC);
    jfunc *f = jar_alloc(c->a, sizeof *f);
    if (!f || v->type != JV_FUNC) return jv_oom();
    f->kind = kind;
    f->name = name;
    f->self = self;
    v->u.fn = f;
    return v;
}

/* ---- small helpers ------------------------------------------------------------ */

jv *str_of(ctx *c, const jv *v) {
    if (v->type == JV_STR) return (jv *)v;
    loom_buf b = {0};
    jv_to_str(&b, v);
    jv *r = jv_str(c->a, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

jv *strbuf_take(ctx *c, loom_buf *b) {
    if (b->oom) {
        free(b->p);
        return rerr(c, 0, "out of memory");
    }
    jv *r = jv_str(c->a, b->p ? b->p : "", b->len);
    free(b->p);
    return r;
}

/* A string value marked as Markup when `safe` (a copy; values are shared). */
jv *with_safe(ctx *c, jv *v, int safe) {
    if (!v || v->type != JV_STR || !safe == !(v->flags & JVF_SAFE)) return v;
    jv *r = jv_str_borrow(c->a, v->u.s.p, v->u.s.n);
    if (safe) r->flags |= JVF_SAFE;
    else r->flags &= ~JVF_SAFE;
    return r;
}

jv *mk_tuple2(ctx *c, jv *a, jv *b) {
    jv *t = jv_list(c->a, 2);
    t->flags |= JVF_TUPLE;
    jv_list_push(c->a, t, a);
    jv_list_push(c->a, t, b);
    return t;
}

/* Python's str.isspace for one code point. */
int py_space(int32_t cp) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) ||
           cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Start of the code point ending at s[end-1]. */
size_t cp_back(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    return i;
}

static int cp_in(int32_t cp, const jv *chars) {
    const char *s = chars->u.s.p;
    size_t n = chars->u.s.n;
    for (size_t i = 0; i < n;) {
        int32_t x;
        i += ju_decode(s, n, i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

/* strip/lstrip/rstrip: which 1 = left, 2 = right, 3 = both. */
jv *do_strip(ctx *c, const jv *s, const jv *chars, int which) {
    const char *p = s->u.s.p;
    size_t b = 0, e = s->u.s.n;
    int use_chars = chars && chars->type == JV_STR;
    if (which & 1)
        while (b < e) {
            int32_t cp;
            size_t k = ju_decode(p, e, b, &cp);
            if (use_chars ? !cp_in(cp, chars) : !py_space(cp)) break;
            b += k;
        }
    if (which & 2)
        while (e > b) {
            size_t st = cp_back(p, e);
            int32_t cp;
            ju_decode(p, e, st, &cp);
            if (use_chars ? !cp_in(cp, chars) : !py_space(cp)) break;
            e = st;
        }
    return jv_str_borrow(c->a, p + b, e - b);
}

/* mode: 0 lower, 1 upper */
jv *do_case(ctx *c, const jv *s, int mode) {
    loom_buf b = {0};
    for (size_t i = 0; i < s->u.s.n;) {
        int32_t cp;
        i += ju_decode(s->u.s.p, s->u.s.n, i, &cp);
        ju_encode(&b, mode ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
    }
    return strbuf_take(c, &b);
}

int is_cased(int32_t cp) {
    return utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp;
}

jv *capitalize(ctx *c, const jv *s) {
    loom_buf b = {0};
    int first = 1;
    for (size_t i = 0; i < s->u.s.n;) {
        int32_t cp;
        i += ju_decode(s->u.s.p, s->u.s.n, i, &cp);
        ju_encode(&b, first ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
        first = 0;
    }
    return strbuf_take(c, &b);
}

const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

jv *do_replace(ctx *c, const jv *s, const jv *old, const jv *new, int64_t count) {
    loom_buf b = {0};
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    if (old->u.s.n == 0) {
        /* Python inserts `new` around every code point */
        int64_t done = 0;
        for (size_t i = 0; i <= s->u.s.n;) {
            if (count < 0 || done < count) {
                loom_buf_put(&b, new->u.s.p, new->u.s.n);
                done++;
            }
            if (i == s->u.s.n) break;
            int32_t cp;
            size_t k = ju_decode(s->u.s.p, s->u.s.n, i, &cp);
            loom_buf_put(&b, s->u.s.p + i, k);
            i += k;
        }
        return strbuf_take(c, &b);
    }
    int64_t done = 0;
    while (p < end) {
        const char *f = (count < 0 || done < count)
                            ? memfind(p, (size_t)(end - p), old->u.s.p, old->u.s.n) : NULL;
        if (!f) break;
        loom_buf_put(&b, p, (size_t)(f - p));
        loom_buf_put(&b, new->u.s.p, new->u.s.n);
        p = f + old->u.s.n;
        done++;
    }
    loom_buf_put(&b, p, (size_t)(end - p));
    return strbuf_take(c, &b);
}

/* Converts an iterable to a list of items (dict: keys; str: characters). */
jv *to_list(ctx *c, int line, jv *v) {
    switch (v->type) {
    case JV_LIST:
        if (v->flags & JVF_ITER) {
            /* iterating a generator uses it up */
            jv *l = jv_list(c->a, v->u.l.n);
            for (size_t i = 0; i < v->u.l.n; i++) jv_list_push(c->a, l, v->u.l.v[i]);
            v->u.l.n = 0;
            return l;
        }
        return v;
    case JV_UNDEF: return jv_list(c->a, 0);
    case JV_DICT: {
        jv *l = jv_list(c->a, v->u.d.n);
        for (size_t i = 0; i < v->u.d.n; i++) jv_list_push(c->a, l, v->u.d.k[i]);
        return l;
    }
    case JV_STR: {
        jv *l = jv_list(c->a, v->u.s.n);
        for (size_t i = 0; i < v->u.s.n;) {
            int32_t cp;
            size_t k = ju_decode(v->u.s.p, v->u.s.n, i, &cp);
            jv_list_push(c->a, l, jv_str_borrow(c->a, v->u.s.p + i, k));
            i += k;
        }
        return l;
    }
    default:
        return rerr(c, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

jv *dict_items(ctx *c, const jv *d) {
    jv *l = jv_list(c->a, d->u.d.n);
    for (size_t i = 0; i < d->u.d.n; i++)
        jv_list_push(c->a, l, mk_tuple2(c, d->u.d.k[i], d->u.d.v[i]));
    return l;
}

int contains(ctx *c, int line, const jv *container, const jv *item, int *res) {
    switch (container->type) {
    case JV_STR:
        if (item->type != JV_STR) {
            rerr(c, line, "'in <string>' requires string as left operand, not %s",
                 jv_type_name(item));
            return 0;
        }
        *res = memfind(container->u.s.p, container->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return 1;
    case JV_LIST:
        *res = 0;
        for (size_t i = 0; i < container->u.l.n; i++)
            if (jv_equal(container->u.l.v[i], item)) {
                *res = 1;
                break;
            }
        return 1;
    case JV_DICT:
        if (item->type == JV_LIST && !(item->flags & JVF_TUPLE)) {
            rerr(c, line, "unhashable type: 'list'");
            return 0;
        }
        if (item->type == JV_DICT) {
            rerr(c, line, "unhashable type: 'dict'");
            return 0;
        }
        *res = jv_dict_get(container, item) != NULL;
        return 1;
    case JV_UNDEF:
        *res = 0;
        return 1;
    default:
        rerr(c, line, "argument of type '%s' is not iterable", jv_type_name(container));
        return 0;
    }
}

/* ---- attribute and item access ----------------------------------------------------- */

static const char *const STR_METHODS[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "upper",
    "lower", "title", "capitalize", "replace", "format", "find", "rfind", "count",
    "join", "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower",
    "isupper", "index", "removeprefix", "removesuffix", NULL,
};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", NULL};
static const char *const LIST_METHODS[] = {"append", "index", "count", "pop", "extend", NULL};

static const char *find_name(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], name)) return list[i];
    return NULL;
}

jv *undef_err(ctx *c, int line, const jv *obj) {
    if (obj->uname) return rerr(c, line, "'%s' is undefined", obj->uname);
    return rerr(c, line, "undefined value has no attributes");
}

jv *get_attr(ctx *c, int line, jv *obj, const char *name) {
    const char *m;
    switch (obj->type) {
    case JV_UNDEF: return undef_err(c, line, obj);
    case JV_DICT: {
        if (!(obj->flags & JVF_NS) && (m = find_name(DICT_METHODS, name)))
            return mk_func(c, JF_METHOD, m, obj);
        jv *v = jv_dict_gets(obj, name);
        return v ? v : jv_undef(c->a, name);
    }
    case JV_STR:
        if ((m = find_name(STR_METHODS, name))) return mk_func(c, JF_METHOD, m, obj);
        return jv_undef(c->a, name);
    case JV_LIST:
        if ((m = find_name(LIST_METHODS, name))) return mk_func(c, JF_METHOD, m, obj);
        return jv_undef(c->a, name);
    default: return jv_undef(c->a, name);
    }
}

jv *get_item(ctx *c, int line, jv *obj, jv *key) {
    switch (obj->type) {
    case JV_UNDEF: return undef_err(c, line, obj);
    case JV_DICT: {
        jv *v = (obj->flags & JVF_NS) ? NULL : jv_dict_get(obj, key);
        if (!v && (obj->flags & JVF_NS) && key->type == JV_STR)
            v = jv_dict_gets(obj, key->u.s.p);
        if (v) return v;
        if (key->type == JV_STR) return get_attr(c, line, obj, key->u.s.p);
        return jv_undef(c->a, NULL);
    }
    case JV_LIST:
        if (obj->flags & JVF_ITER) return jv_undef(c->a, NULL);
        if (is_intlike(key)) {
            int64_t i = numi(key), n = (int64_t)obj->u.l.n;
            if (i < 0) i += n;
            if (i < 0 || i >= n) return jv_undef(c->a, NULL);
            return obj->u.l.v[i];
        }
        if (key->type == JV_STR) return get_attr(c, line, obj, key->u.s.p);
        return jv_undef(c->a, NULL);
    case JV_STR:
        if (is_intlike(key)) {
            int64_t i = numi(key), n = (int64_t)ju_count(obj->u.s.p, obj->u.s.n);
            if (i < 0) i += n;
            if (i < 0 || i >= n) return jv_undef(c->a, NULL);
            size_t off = 0;
            for (int64_t k = 0; k < i; k++) {
                int32_t cp;
                off += ju_decode(obj->u.s.p, obj->u.s.n, off, &cp);
            }
            int32_t cp;
            size_t len = ju_decode(obj->u.s.p, obj->u.s.n, off, &cp);
            return jv_str_borrow(c->a, obj->u.s.p + off, len);
        }
        if (key->type == JV_STR) return get_attr(c, line, obj, key->u.s.p);
        return jv_undef(c->a, NULL);
    default: return jv_undef(c->a, NULL);
    }
}

/* Python slice index normalisation. */
static void slice_bounds(int64_t n, const jv *lo, const jv *hi, int64_t step,
                         int64_t *start, int64_t *stop) {
    int has_lo = lo && lo->type != JV_NONE && lo->type != JV_UNDEF;
    int has_hi = hi && hi->type != JV_NONE && hi->type != JV_UNDEF;
    if (step > 0) {
        *start = has_lo ? numi(lo) : 0;
        *stop = has_hi ? numi(hi) : n;
        if (*start < 0) *start = *start + n < 0 ? 0 : *start + n;
        if (*start > n) *start = n;
        if (*stop < 0) *stop = *stop + n < 0 ? 0 : *stop + n;
        if (*stop > n) *stop = n;
    } else {
        *start = has_lo ? numi(lo) : n - 1;
        *stop = has_hi ? numi(hi) : -1 - n; /* sentinel: before the first */
        if (has_lo) {
            if (*start < 0) *start = *start + n < 0 ? -1 : *start + n;
            if (*start >= n) *start = n - 1;
        }
        if (has_hi) {
            if (*stop < 0) *stop = *stop + n < 0 ? -1 : *stop + n;
            if (*stop >= n) *stop = n - 1;
        } else {
            *stop = -1;
        }
    }
}

jv *do_slice(ctx *c, int line, jv *obj, jv *lo, jv *hi, jv *st) {
    int64_t step = 1;
    if (st && st->type != JV_NONE && st->type != JV_UNDEF) { /* undefined: below */
        if (!is_intlike(st)) return rerr(c, line, "slice step must be an integer");
        step = numi(st);
        if (step == 0) return rerr(c, line, "slice step cannot be zero");
    }
    if ((lo && lo->type != JV_NONE && !is_intlike(lo)) ||
        (hi && hi->type != JV_NONE && !is_intlike(hi)) ||
        (st && st->type == JV_UNDEF))
        return rerr(c, line, "slice indices must be integers or None");
    if (obj->type == JV_LIST) {
        int64_t start, stop;
        slice_bounds((int64_t)obj->u.l.n, lo, hi, step, &start, &stop);
        jv *r = jv_list(c->a, 0);
        r->flags = obj->flags & JVF_TUPLE;
        if (step > 0)
            for (int64_t i = start; i < stop; i += step) jv_list_push(c->a, r, obj->u.l.v[i]);
        else
            for (int64_t i = start; i > stop; i += step) jv_list_push(c->a, r, obj->u.l.v[i]);
        return r;
    }
    if (obj->type == JV_STR) {
        /* slice over code points (ju_count steps like ju_decode) */
        size_t n = ju_count(obj->u.s.p, obj->u.s.n);
        size_t *off = malloc((n + 1) * sizeof *off);
        if (!off) return rerr(c, line, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < obj->u.s.n && k < n;) {
            int32_t cp;
            off[k++] = i;
            i += ju_decode(obj->u.s.p, obj->u.s.n, i, &cp);
        }
        off[n] = obj->u.s.n;
        int64_t start, stop;
        slice_bounds((int64_t)n, lo, hi, step, &start, &stop);
        jv *r;
        if (step == 1) {
            r = start < stop ? jv_str_borrow(c->a, obj->u.s.p + off[start],
                                             off[stop] - off[start])
                             : jv_str_borrow(c->a, "", 0);
        } else {
            loom_buf b = {0};
            if (step > 0)
                for (int64_t i = start; i < stop; i += step)
                    loom_buf_put(&b, obj->u.s.p + off[i], off[i + 1] - off[i]);
            else
                for (int64_t i = start; i > stop; i += step)
                    loom_buf_put(&b, obj->u.s.p + off[i], off[i + 1] - off[i]);
            r = strbuf_take(c, &b);
        }
        free(off);
        return r;
    }
    if (obj->type == JV_UNDEF) return undef_err(c, line, obj);
    return rerr(c, line, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ---- printf-style formatting (the `format` filter and str % args) -------------------- */

jv *printf_format(ctx *c, int line, const jv *fmt, jv **vals, int nvals,
                  int mapping_like) {
    loom_buf b = {0};
    int k = 0;
    const char *p = fmt->u.s.p, *end = p + fmt->u.s.n;
    while (p < end) {
        if (*p != '%') {
            loom_buf_putc(&b, *p++);
            continue;
        }
        p++;
        if (p < end && *p == '%') {
            loom_buf_putc(&b, '%');
            p++;
            continue;
        }
        char spec[32] = "%";
        size_t sl = 1;
        while (p < end && strchr("-+ #0123456789.", *p) && sl < sizeof spec - 4)
            spec[sl++] = *p++;
        if (p >= end) {
            free(b.p);
            return rerr(c, line, "format: incomplete format");
        }
        char conv = *p++;
        if (k >= nvals) {
            free(b.p);
            return rerr(c, line, "format: not enough arguments for format string");
        }
        jv *v = vals[k++];
        if (conv == 's' || conv == 'r') {
            loom_buf t = {0};
            if (conv == 's') jv_to_str(&t, v);
            else jv_repr(&t, v);
            spec[sl++] = 's';
            spec[sl] = 0;
            loom_buf_printf(&b, spec, t.p ? t.p : "");
            free(t.p);
        } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
            if (!is_num(v)) {
                free(b.p);
                return rerr(c, line, "format: %%%c format: a number is required", conv);
            }
            spec[sl++] = 'l';
            spec[sl++] = 'l';
            spec[sl++] = conv == 'i' ? 'd' : conv;
            spec[sl] = 0;
            loom_buf_printf(&b, spec, (long long)numi(v));
        } else if (strchr("eEfFgG", conv)) {
            if (!is_num(v)) {
                free(b.p);
                return rerr(c, line, "format: %%%c format: a number is required", conv);
            }
            spec[sl++] = conv;
            spec[sl] = 0;
            loom_buf_printf(&b, spec, numf(v));
        } else {
            free(b.p);
            return rerr(c, line, "format: unsupported format character '%c'", conv);
        }
    }
    if (k < nvals && !mapping_like) {
        /* a list or dict operand counts as a mapping: unused is fine */
        free(b.p);
        return rerr(c, line, "not all arguments converted during string formatting");
    }
    return strbuf_take(c, &b);
}

/* ---- HTML escaping (|e, and Markup + str) ----------------------------------------- */

jv *html_escape(ctx *c, const jv *s) {
    loom_buf b = {0};
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        switch (ch) {
        case '&': loom_buf_puts(&b, "&amp;"); break;
        case '<': loom_buf_puts(&b, "&lt;"); break;
        case '>': loom_buf_puts(&b, "&gt;"); break;
        case '"': loom_buf_puts(&b, "&#34;"); break;
        case '\'': loom_buf_puts(&b, "&#39;"); break;
        default: loom_buf_putc(&b, ch);
        }
    }
    return with_safe(c, strbuf_take(c, &b), 1);
}

/* ---- comparison and operators ------------------------------------------------------------ */

int cmp_test(ctx *c, int line, jv *v, jv *other, int op) {
    if (!other) {
        rerr(c, line, "comparison test needs an argument");
        return -1;
    }
    if (op == OP_EQ) return jv_equal(v, other);
    if (op == OP_NE) return !jv_equal(v, other);
    int ok;
    int r = jv_compare(v, other, &ok);
    if (!ok) {
        rerr(c, line, "'%s' not supported between instances of '%s' and '%s'",
             op == OP_LT ? "<" : op == OP_LE ? "<=" : op == OP_GT ? ">" : ">=",
             jv_type_name(v), jv_type_name(other));
        return -1;
    }
    switch (op) {
    case OP_LT: return r < 0;
    case OP_LE: return r <= 0;
    case OP_GT: return r > 0;
    default: return r >= 0;
    }
}

static jv *op_err(ctx *c, int line, const char *op, jv *x, jv *y) {
    if (x->type == JV_UNDEF) return undef_err(c, line, x);
    if (y->type == JV_UNDEF) return undef_err(c, line, y);
    return rerr(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                jv_type_name(x), jv_type_name(y));
}

jv *num_add(ctx *c, int line, jv *x, jv *y) {
    if (is_num(x) && is_num(y)) {
        if (x->type == JV_FLOAT || y->type == JV_FLOAT) return jv_float(c->a, numf(x) + numf(y));
        return jv_int(c->a, numi(x) + numi(y));
    }
    if (x->type == JV_STR && y->type == JV_STR) {
        /* Markup + str escapes the plain side (the sides stay Markup) */
        int safe = is_safe(x) || is_safe(y);
        if (safe && !is_safe(x)) x = html_escape(c, x);
        if (safe && !is_safe(y)) y = html_escape(c, y);
        if (!x || !y) return NULL;
        char *p = jar_alloc(c->a, x->u.s.n + y->u.s.n + 1);
        if (!p) return rerr(c, line, "out of memory");
        memcpy(p, x->u.s.p, x->u.s.n);
        memcpy(p + x->u.s.n, y->u.s.p, y->u.s.n);
        return with_safe(c, jv_str_borrow(c->a, p, x->u.s.n + y->u.s.n), safe);
    }
    if (x->type == JV_LIST && y->type == JV_LIST &&
        !((x->flags | y->flags) & JVF_ITER) &&
        (x->flags & JVF_TUPLE) == (y->flags & JVF_TUPLE)) {
        jv *l = jv_list(c->a, x->u.l.n + y->u.l.n);
        l->flags = x->flags & JVF_TUPLE;
        for (size_t i = 0; i < x->u.l.n; i++) jv_list_push(c->a, l, x->u.l.v[i]);
        for (size_t i = 0; i < y->u.l.n; i++) jv_list_push(c->a, l, y->u.l.v[i]);
        return l;
    }
    return op_err(c, line, "+", x, y);
}

static jv *repeat(ctx *c, int line, jv *seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq->type == JV_STR) {
        if (seq->u.s.n && (uint64_t)k > MAX_OUTPUT / seq->u.s.n)
            return rerr(c, line, "string repetition too large");
        loom_buf b = {0};
        for (int64_t i = 0; i < k; i++) loom_buf_put(&b, seq->u.s.p, seq->u.s.n);
        return with_safe(c, strbuf_take(c, &b), is_safe(seq));
    }
    if (seq->u.l.n && (uint64_t)k > 10000000 / seq->u.l.n)
        return rerr(c, line, "list repetition too large");
    jv *l = jv_list(c->a, 0);
    l->flags = seq->flags & JVF_TUPLE;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq->u.l.n; j++) jv_list_push(c->a, l, seq->u.l.v[j]);
    return l;
}

jv *binop(ctx *c, int line, int op, jv *x, jv *y) {
    if (op == OP_CAT) {
        loom_buf b = {0};
        jv_to_str(&b, x);
        jv_to_str(&b, y);
        return strbuf_take(c, &b);
    }
    if (op == OP_ADD) return num_add(c, line, x, y);
    if (op == OP_MUL) {
        if ((x->type == JV_STR || x->type == JV_LIST) && is_intlike(y))
            return repeat(c, line, x, numi(y));
        if ((y->type == JV_STR || y->type == JV_LIST) && is_intlike(x))
            return repeat(c, line, y, numi(x));
    }
    if (op == OP_MOD && x->type == JV_STR) {
        if (y->type == JV_LIST && (y->flags & JVF_TUPLE))
            return printf_format(c, line, x, y->u.l.v, (int)y->u.l.n, 0);
        return printf_format(c, line, x, &y, 1, y->type == JV_LIST || y->type == JV_DICT);
    }
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (!is_num(x) || !is_num(y)) return op_err(c, line, names[op], x, y);
    int ints = x->type != JV_FLOAT && y->type != JV_FLOAT;
    switch (op) {
    case OP_SUB:
        return ints ? jv_int(c->a, numi(x) - numi(y)) : jv_float(c->a, numf(x) - numf(y));
    case OP_MUL:
        return ints ? jv_int(c->a, numi(x) * numi(y)) : jv_float(c->a, numf(x) * numf(y));
    case OP_DIV:
        if (numf(y) == 0) return rerr(c, line, "division by zero");
        return jv_float(c->a, numf(x) / numf(y));
    case OP_FDIV:
        if (numf(y) == 0) return rerr(c, line, "integer division or modulo by zero");
        if (ints) {
            int64_t q = numi(x) / numi(y);
            if ((numi(x) % numi(y) != 0) && ((numi(x) < 0) != (numi(y) < 0))) q--;
            return jv_int(c->a, q);
        }
        return jv_float(c->a, floor(numf(x) / numf(y)));
    case OP_MOD:
        if (numf(y) == 0) return rerr(c, line, "integer division or modulo by zero");
        if (ints) {
            int64_t r = numi(x) % numi(y);
            if (r != 0 && ((r < 0) != (numi(y) < 0))) r += numi(y);
            return jv_int(c->a, r);
        } else {
            double r = fmod(numf(x), numf(y));
            if (r != 0 && ((r < 0) != (numf(y) < 0))) r += numf(y);
            return jv_float(c->a, r);
        }
    case OP_POW:
        if (ints && numi(y) >= 0) {
            int64_t r = 1, b = numi(x);
            for (int64_t e = numi(y); e > 0 && e < 64; e--) r *= b;
            return jv_int(c->a, r);
        }
        return jv_float(c->a, pow(numf(x), numf(y)));
    default: return rerr(c, line, "bad operator");
    }
}

