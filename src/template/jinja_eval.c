/* template/jinja_eval: the evaluator of the Jinja engine: scopes, statements,
 * expressions, and the filters, tests, methods and globals chat templates
 * use. Semantics follow Jinja2 3.x in transformers' sandboxed environment:
 *   - undefined values print as "", are falsy and iterate as empty; reading
 *     an attribute or item of an undefined value is an error, of None it
 *     gives undefined;
 *   - `a.b` tries the attribute (a method) first, then the item; `a['b']`
 *     tries the item first;
 *   - for loops and macros open a scope: `set` inside them does not leak out
 *     (templates use namespace() for that); if blocks do not.
 * Every value of a render lives in the render's arena, freed at the end. */
#include "template/jinja.h"
#include "template/jinja_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define MAX_OUTPUT (256u << 20)   /* bytes a render may produce */
#define MAX_STEPS 50000000L       /* statements + loop iterations */
#define MAX_DEPTH 200             /* macro call nesting */
#define MAX_RANGE 100000          /* as Jinja's sandbox */
#define MAX_MEMORY (512u << 20)   /* bytes of values a render may hold */

enum { JF_BUILTIN, JF_METHOD, JF_MACRO, JF_CALLER, JF_CYCLE };

typedef struct jvar {
    const char *name;
    jv *val;
} jvar;

struct jframe {
    jframe *parent;
    jvar *v;
    int n, cap;
};

typedef struct ctx {
    jarena *a;
    loom_buf *out;              /* where output goes now (swapped for captures) */
    jframe *root;           /* render variables */
    loom_status st;
    int raised;
    long steps;
    int depth;
} ctx;

static _Thread_local int last_raised;

int loom_jinja_last_error_raised(void) { return last_raised; }

static jv *rerr(ctx *c, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static jv *rerr(ctx *c, int line, const char *fmt, ...) {
    if (c->st != LOOM_OK) return NULL;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = loom_err(LOOM_ERR_INVALID_ARG, "template line %d: %s", line, msg);
    return NULL;
}

/* ---- scopes --------------------------------------------------------------- */

static jframe *frame_new(ctx *c, jframe *parent) {
    jframe *f = jar_alloc(c->a, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static void frame_set(ctx *c, jframe *f, const char *name, jv *val) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->v[i].name, name)) {
            f->v[i].val = val;
            return;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        jvar *nv = jar_alloc(c->a, (size_t)cap * sizeof *nv);
        if (!nv) return;
        if (f->n) memcpy(nv, f->v, (size_t)f->n * sizeof *nv);
        f->v = nv;
        f->cap = cap;
    }
    f->v[f->n].name = name;
    f->v[f->n].val = val;
    f->n++;
}

static const char *const BUILTINS[] = {
    "range", "namespace", "dict", "raise_exception", "strftime_now", "joiner",
    "cycler", NULL,
};

static jv *mk_func(ctx *c, int kind, const char *name, jv *self) {
    jv *v = jv_new(c->a, JV_FUNC);
    jfunc *f = jar_alloc(c->a, sizeof *f);
    if (!f || v->type != JV_FUNC) return jv_oom();
    f->kind = kind;
    f->name = name;
    f->self = self;
    v->u.fn = f;
    return v;
}

static jv *lookup(ctx *c, jframe *f, const char *name) {
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->v[i].name, name)) return f->v[i].val;
    for (int i = 0; BUILTINS[i]; i++)
        if (!strcmp(BUILTINS[i], name)) return mk_func(c, JF_BUILTIN, BUILTINS[i], NULL);
    return jv_undef(c->a, name);
}

/* ---- small helpers ------------------------------------------------------------ */

static int is_num(const jv *v) {
    return v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT;
}
static int is_intlike(const jv *v) { return v->type == JV_BOOL || v->type == JV_INT; }
static double numf(const jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : v->u.b;
}
static int64_t numi(const jv *v) {
    return v->type == JV_INT ? v->u.i : v->type == JV_BOOL ? v->u.b : (int64_t)v->u.f;
}

static jv *str_of(ctx *c, const jv *v) {
    if (v->type == JV_STR) return (jv *)v;
    loom_buf b = {0};
    jv_to_str(&b, v);
    jv *r = jv_str(c->a, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

static jv *strbuf_take(ctx *c, loom_buf *b) {
    if (b->oom) {
        free(b->p);
        return rerr(c, 0, "out of memory");
    }
    jv *r = jv_str(c->a, b->p ? b->p : "", b->len);
    free(b->p);
    return r;
}

static jv *html_escape(ctx *c, const jv *s);

static jv *as_gen(jv *l) {
    if (l && l->type == JV_LIST) l->flags |= JVF_ITER;
    return l;
}

/* A string value marked as Markup when `safe` (a copy; values are shared). */
static jv *with_safe(ctx *c, jv *v, int safe) {
    if (!v || v->type != JV_STR || !safe == !(v->flags & JVF_SAFE)) return v;
    jv *r = jv_str_borrow(c->a, v->u.s.p, v->u.s.n);
    if (safe) r->flags |= JVF_SAFE;
    else r->flags &= ~JVF_SAFE;
    return r;
}

static int is_safe(const jv *v) { return v->type == JV_STR && (v->flags & JVF_SAFE); }

static int str_eq(const jv *v, const char *s) {
    return v->type == JV_STR && v->u.s.n == strlen(s) && !memcmp(v->u.s.p, s, v->u.s.n);
}

static jv *mk_tuple2(ctx *c, jv *a, jv *b) {
    jv *t = jv_list(c->a, 2);
    t->flags |= JVF_TUPLE;
    jv_list_push(c->a, t, a);
    jv_list_push(c->a, t, b);
    return t;
}

/* Python's str.isspace for one code point. */
static int py_space(int32_t cp) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) ||
           cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Start of the code point ending at s[end-1]. */
static size_t cp_back(const char *s, size_t end) {
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
static jv *do_strip(ctx *c, const jv *s, const jv *chars, int which) {
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
static jv *do_case(ctx *c, const jv *s, int mode) {
    loom_buf b = {0};
    for (size_t i = 0; i < s->u.s.n;) {
        int32_t cp;
        i += ju_decode(s->u.s.p, s->u.s.n, i, &cp);
        ju_encode(&b, mode ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
    }
    return strbuf_take(c, &b);
}

static int is_cased(int32_t cp) {
    return utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp;
}

/* Python's str.title(). */
static jv *py_title(ctx *c, const jv *s) {
    loom_buf b = {0};
    int prev_cased = 0;
    for (size_t i = 0; i < s->u.s.n;) {
        int32_t cp;
        i += ju_decode(s->u.s.p, s->u.s.n, i, &cp);
        ju_encode(&b, prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp));
        prev_cased = is_cased(cp);
    }
    return strbuf_take(c, &b);
}

/* Jinja's title filter: words start after runs of [-\s({\[<]. */
static jv *jinja_title(ctx *c, const jv *s) {
    loom_buf b = {0};
    int start = 1;
    for (size_t i = 0; i < s->u.s.n;) {
        int32_t cp;
        i += ju_decode(s->u.s.p, s->u.s.n, i, &cp);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_space(cp);
        if (sep) {
            ju_encode(&b, cp);
            start = 1;
        } else {
            ju_encode(&b, start ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
            start = 0;
        }
    }
    return strbuf_take(c, &b);
}

static jv *capitalize(ctx *c, const jv *s) {
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

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

static jv *do_replace(ctx *c, const jv *s, const jv *old, const jv *new, int64_t count) {
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

/* Python str.split / rsplit (rsplit only matters with maxsplit). */
static jv *do_split(ctx *c, int line, const jv *s, const jv *sep, int64_t maxsplit) {
    jv *out = jv_list(c->a, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep || sep->type == JV_NONE || sep->type == JV_UNDEF) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            while (i < n) {
                int32_t cp;
                size_t k = ju_decode(p, n, i, &cp);
                if (!py_space(cp)) break;
                i += k;
            }
            if (i >= n) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t e = n;
                while (e > i) {
                    size_t st = cp_back(p, e);
                    int32_t cp;
                    ju_decode(p, e, st, &cp);
                    if (!py_space(cp)) break;
                    e = st;
                }
                jv_list_push(c->a, out, jv_str(c->a, p + i, e - i));
                break;
            }
            size_t j = i;
            while (j < n) {
                int32_t cp;
                size_t k = ju_decode(p, n, j, &cp);
                if (py_space(cp)) break;
                j += k;
            }
            jv_list_push(c->a, out, jv_str(c->a, p + i, j - i));
            splits++;
            i = j;
        }
        return out;
    }
    if (sep->type != JV_STR) return rerr(c, line, "split: separator must be a string");
    if (!sep->u.s.n) return rerr(c, line, "split: empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
        const char *f = (maxsplit < 0 || splits < maxsplit)
                            ? memfind(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
        if (!f) {
            jv_list_push(c->a, out, jv_str(c->a, p + i, n - i));
            break;
        }
        jv_list_push(c->a, out, jv_str(c->a, p + i, (size_t)(f - (p + i))));
        i = (size_t)(f - p) + sep->u.s.n;
        splits++;
    }
    return out;
}

/* Converts an iterable to a list of items (dict: keys; str: characters). */
static jv *to_list(ctx *c, int line, jv *v) {
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

static jv *dict_items(ctx *c, const jv *d) {
    jv *l = jv_list(c->a, d->u.d.n);
    for (size_t i = 0; i < d->u.d.n; i++)
        jv_list_push(c->a, l, mk_tuple2(c, d->u.d.k[i], d->u.d.v[i]));
    return l;
}

static int contains(ctx *c, int line, const jv *container, const jv *item, int *res) {
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

static jv *undef_err(ctx *c, int line, const jv *obj) {
    if (obj->uname) return rerr(c, line, "'%s' is undefined", obj->uname);
    return rerr(c, line, "undefined value has no attributes");
}

static jv *get_attr(ctx *c, int line, jv *obj, const char *name) {
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

static jv *get_item(ctx *c, int line, jv *obj, jv *key) {
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

static jv *do_slice(ctx *c, int line, jv *obj, jv *lo, jv *hi, jv *st) {
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

/* ---- arguments -------------------------------------------------------------------------- */

typedef struct args {
    jv **pos;
    int npos;
    const char **kwn;
    jv **kwv;
    int nkw;
} args;

/* Positional i, else keyword name, else NULL. */
static jv *arg(const args *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    for (int k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return a->kwv[k];
    return NULL;
}

static int arg_bool(const args *a, int i, const char *name, int def) {
    jv *v = arg(a, i, name);
    return v ? jv_truthy(v) : def;
}

/* ---- forward declarations ------------------------------------------------------------ */

static jv *eval(ctx *c, const jnode *n, jframe *f);
static int exec(ctx *c, const jnode *n, jframe *f);
static jv *apply_filter(ctx *c, int line, const char *name, jv *v, const args *a);
static int apply_test(ctx *c, int line, const char *name, jv *v, const args *a);
static jv *call_value(ctx *c, int line, jv *fn, const args *a);

/* ---- JSON filter ---------------------------------------------------------------------- */

static jv *do_tojson(ctx *c, int line, jv *v, const args *a) {
    jjson_opts o = {.indent = NULL, .item_sep = ", ", .key_sep = ": "};
    char ind[64];
    jv *indent = arg(a, 0, "indent");
    if (indent && indent->type != JV_NONE && indent->type != JV_UNDEF) {
        if (is_intlike(indent)) {
            int64_t k = numi(indent);
            if (k < 0) k = 0;
            if (k > 32) k = 32;
            memset(ind, ' ', (size_t)k);
            ind[k] = 0;
            o.indent = jar_strdup(c->a, ind, (size_t)k);
        } else if (indent->type == JV_STR) {
            o.indent = indent->u.s.p;
        } else {
            return rerr(c, line, "tojson: indent must be an integer or string");
        }
        o.item_sep = ",";
    }
    jv *seps = arg(a, -1, "separators");
    if (seps && seps->type == JV_LIST && seps->u.l.n == 2 &&
        seps->u.l.v[0]->type == JV_STR && seps->u.l.v[1]->type == JV_STR) {
        o.item_sep = seps->u.l.v[0]->u.s.p;
        o.key_sep = seps->u.l.v[1]->u.s.p;
    }
    o.sort_keys = arg_bool(a, -1, "sort_keys", 0);
    o.ensure_ascii = arg_bool(a, -1, "ensure_ascii", 0);
    loom_buf b = {0};
    if (!jv_to_json(&b, v, &o, 0)) {
        free(b.p);
        return rerr(c, line, "tojson: object of type '%s' is not JSON serializable",
                    jv_type_name(v));
    }
    return strbuf_take(c, &b);
}

/* ---- printf-style formatting (the `format` filter and str % args) -------------------- */

static jv *printf_format(ctx *c, int line, const jv *fmt, jv **vals, int nvals,
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

/* Python str.format with {} / {0} / {name} fields (format specs ignored
 * except that they are skipped). */
static jv *py_format(ctx *c, int line, const jv *fmt, const args *a) {
    loom_buf b = {0};
    int auto_i = 0;
    const char *p = fmt->u.s.p, *end = p + fmt->u.s.n;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { loom_buf_putc(&b, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { loom_buf_putc(&b, '}'); p += 2; continue; }
        if (*p != '{') { loom_buf_putc(&b, *p++); continue; }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) {
            free(b.p);
            return rerr(c, line, "format: single '{' encountered in format string");
        }
        const char *field = p + 1;
        size_t fl = (size_t)(q - field);
        const char *colon = memchr(field, ':', fl);
        const char *bang = memchr(field, '!', fl);
        size_t nl = colon ? (size_t)(colon - field) : fl;
        if (bang && (size_t)(bang - field) < nl) nl = (size_t)(bang - field);
        jv *v = NULL;
        if (nl == 0) v = arg(a, auto_i++, NULL);
        else if (field[0] >= '0' && field[0] <= '9') v = arg(a, atoi(field), NULL);
        else {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)nl, field);
            v = arg(a, -1, name);
        }
        if (!v) {
            free(b.p);
            return rerr(c, line, "format: missing argument for field '%.*s'", (int)fl, field);
        }
        if (bang && bang[1] == 'r') jv_repr(&b, v);
        else jv_to_str(&b, v);
        p = q + 1;
    }
    return strbuf_take(c, &b);
}

/* ---- sorting ------------------------------------------------------------------------------- */

typedef struct sort_item {
    jv *key;
    jv *val;
    size_t idx;
} sort_item;

static jv *fold_case(ctx *c, jv *v, int case_sensitive) {
    if (!case_sensitive && v->type == JV_STR) return do_case(c, v, 0);
    return v;
}

/* Resolves "a.b.0" the way Jinja's attribute getters do (item first). */
static jv *attr_path(ctx *c, int line, jv *v, const jv *path) {
    if (path->type != JV_STR) return get_item(c, line, v, (jv *)path);
    const char *p = path->u.s.p;
    const char *end = p + path->u.s.n;
    while (v && p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t len = dot ? (size_t)(dot - p) : (size_t)(end - p);
        int digits = len > 0;
        for (size_t i = 0; i < len; i++) digits &= p[i] >= '0' && p[i] <= '9';
        jv *key = digits ? jv_int(c->a, strtoll(p, NULL, 10)) : jv_str(c->a, p, len);
        if (v->type == JV_UNDEF) return v;
        v = get_item(c, line, v, key);
        if (!dot) break;
        p = dot + 1;
    }
    return v;
}

static _Thread_local int sort_err; /* set by the comparator of one sort */

static int sort_cmp_asc(sort_item *x, sort_item *y) {
    int ok;
    int r = jv_compare(x->key, y->key, &ok);
    if (!ok) sort_err = 1;
    return r;
}

/* Stable merge sort (Python's sort is stable). */
static void merge_sort(sort_item *v, sort_item *tmp, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(v, tmp, h, reverse);
    merge_sort(v + h, tmp, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = sort_cmp_asc(&v[j], &v[i]);
        if (reverse) r = -r;
        if (r < 0) tmp[k++] = v[j++];
        else tmp[k++] = v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static int sort_items(ctx *c, int line, sort_item *items, size_t n, int reverse) {
    sort_item *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!tmp) {
        rerr(c, line, "out of memory");
        return 0;
    }
    sort_err = 0;
    merge_sort(items, tmp, n, reverse);
    free(tmp);
    if (sort_err) {
        rerr(c, line, "sort: values cannot be compared");
        return 0;
    }
    return 1;
}

/* ---- filters ---------------------------------------------------------------------------------- */

static jv *html_escape(ctx *c, const jv *s) {
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

static jv *do_indent(ctx *c, jv *s, const args *a) {
    jv *w = arg(a, 0, "width");
    int first = arg_bool(a, 1, "first", 0);
    int blank = arg_bool(a, 2, "blank", 0);
    loom_buf ind = {0};
    if (w && w->type == JV_STR) loom_buf_put(&ind, w->u.s.p, w->u.s.n);
    else {
        int64_t k = w && is_num(w) ? numi(w) : 4;
        for (int64_t i = 0; i < k && i < 1024; i++) loom_buf_putc(&ind, ' ');
    }
    const char *in = ind.p ? ind.p : "";
    /* Jinja splits (s + "\n").splitlines(): every terminator ends a line and
     * the text after the last one is a line too, even when empty */
    loom_buf b = {0};
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    for (int lineno = 0;; lineno++) {
        const char *e = p;
        while (e < end && *e != '\n' && *e != '\r') e++;
        size_t len = (size_t)(e - p);
        if (lineno == 0) {
            if (first) loom_buf_puts(&b, in);
        } else {
            loom_buf_putc(&b, '\n');
            if (blank || len) loom_buf_puts(&b, in);
        }
        loom_buf_put(&b, p, len);
        if (e == end) break;
        if (*e == '\r' && e + 1 < end && e[1] == '\n') e++;
        p = e + 1;
    }
    free(ind.p);
    return strbuf_take(c, &b);
}

/* Applies a filter/test/attribute selection for select/reject/map. */
static jv *do_select(ctx *c, int line, jv *v, const args *a, int attr_mode, int keep) {
    /* Jinja iterates only a truthy input: select over None is empty */
    jv *l = jv_truthy(v) ? to_list(c, line, v) : jv_list(c->a, 0);
    if (!l) return NULL;
    jv *out = jv_list(c->a, 0);
    int skip = attr_mode ? 1 : 0;
    jv *attr = attr_mode ? arg(a, 0, "attribute") : NULL;
    jv *test = arg(a, skip, NULL);
    args rest = {a->pos + (a->npos > skip + 1 ? skip + 1 : a->npos),
                 a->npos > skip + 1 ? a->npos - skip - 1 : 0, a->kwn, a->kwv, a->nkw};
    for (size_t i = 0; i < l->u.l.n; i++) {
        jv *item = l->u.l.v[i];
        jv *x = attr ? attr_path(c, line, item, attr) : item;
        if (!x) return NULL;
        int r;
        if (test) {
            if (test->type != JV_STR) return rerr(c, line, "select: test name must be a string");
            r = apply_test(c, line, test->u.s.p, x, &rest);
            if (r < 0) return NULL;
        } else {
            r = jv_truthy(x);
        }
        if (r == keep) jv_list_push(c->a, out, item);
    }
    return as_gen(out);
}

static jv *do_map(ctx *c, int line, jv *v, const args *a) {
    jv *l = jv_truthy(v) ? to_list(c, line, v) : jv_list(c->a, 0);
    if (!l) return NULL;
    jv *out = jv_list(c->a, l->u.l.n);
    jv *attr = arg(a, -1, "attribute");
    if (attr) {
        jv *def = arg(a, -1, "default");
        for (size_t i = 0; i < l->u.l.n; i++) {
            jv *x = attr_path(c, line, l->u.l.v[i], attr);
            if (!x) return NULL;
            if (x->type == JV_UNDEF && def) x = def;
            jv_list_push(c->a, out, x);
        }
        return as_gen(out);
    }
    jv *fname = arg(a, 0, NULL);
    if (!fname || fname->type != JV_STR) return rerr(c, line, "map: expected a filter name or attribute=");
    args rest = {a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw};
    for (size_t i = 0; i < l->u.l.n; i++) {
        jv *x = apply_filter(c, line, fname->u.s.p, l->u.l.v[i], &rest);
        if (!x) return NULL;
        jv_list_push(c->a, out, x);
    }
    return as_gen(out);
}

static jv *do_minmax(ctx *c, int line, jv *v, const args *a, int want_max) {
    jv *l = to_list(c, line, v);
    if (!l) return NULL;
    if (!l->u.l.n) return jv_undef(c->a, NULL);
    int cs = arg_bool(a, 0, "case_sensitive", 0);
    jv *attr = arg(a, 1, "attribute");
    jv *best = NULL, *bestk = NULL;
    for (size_t i = 0; i < l->u.l.n; i++) {
        jv *x = l->u.l.v[i];
        jv *k = attr ? attr_path(c, line, x, attr) : x;
        if (!k) return NULL;
        k = fold_case(c, k, cs);
        if (!best) { best = x; bestk = k; continue; }
        int ok;
        int r = jv_compare(k, bestk, &ok);
        if (!ok) return rerr(c, line, "%s: values cannot be compared", want_max ? "max" : "min");
        if (want_max ? r > 0 : r < 0) { best = x; bestk = k; }
    }
    return best;
}

static jv *num_add(ctx *c, int line, jv *x, jv *y);

/* Keyword arguments each filter takes (Python rejects others). Filters not
 * listed take none; map/select/reject pass theirs on and are not checked. */
static const char *const FILTER_KWARGS[][6] = {
    {"tojson", "indent", "ensure_ascii", "separators", "sort_keys", NULL},
    {"default", "default_value", "boolean", NULL},
    {"d", "default_value", "boolean", NULL},
    {"join", "d", "attribute", NULL},
    {"sort", "reverse", "case_sensitive", "attribute", NULL},
    {"unique", "case_sensitive", "attribute", NULL},
    {"min", "case_sensitive", "attribute", NULL},
    {"max", "case_sensitive", "attribute", NULL},
    {"sum", "attribute", "start", NULL},
    {"round", "precision", "method", NULL},
    {"indent", "width", "first", "blank", NULL},
    {"int", "default", "base", NULL},
    {"float", "default", NULL},
    {"replace", "old", "new", "count", NULL},
    {"trim", "chars", NULL},
    {"batch", "linecount", "fill_with", NULL},
    {"dictsort", "case_sensitive", "by", "reverse", NULL},
    {"center", "width", NULL},
    {"attr", "name", NULL},
    {"truncate", "length", "killwords", "end", "leeway", NULL},
};

static int check_kwargs(ctx *c, int line, const char *name, const args *a) {
    if (!a->nkw || !strcmp(name, "map") || !strcmp(name, "select") || !strcmp(name, "reject") ||
        !strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "format"))
        return 1;
    const char *const *allowed = NULL;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(FILTER_KWARGS); i++)
        if (!strcmp(FILTER_KWARGS[i][0], name)) allowed = FILTER_KWARGS[i] + 1;
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int j = 0; allowed && allowed[j]; j++) ok |= !strcmp(allowed[j], a->kwn[k]);
        if (!ok) {
            rerr(c, line, "%s() got an unexpected keyword argument '%s'", name, a->kwn[k]);
            return 0;
        }
    }
    return 1;
}

static jv *apply_filter(ctx *c, int line, const char *name, jv *v, const args *a) {
#define IS(s) (!strcmp(name, s))
    if (!check_kwargs(c, line, name, a)) return NULL;
    if (IS("safe")) return with_safe(c, str_of(c, v), 1);
    if (IS("default") || IS("d")) {
        jv *def = arg(a, 0, "default_value");
        int boolean = arg_bool(a, 1, "boolean", 0);
        if (v->type == JV_UNDEF || (boolean && !jv_truthy(v)))
            return def ? def : jv_str_borrow(c->a, "", 0);
        return v;
    }
    if (IS("length") || IS("count")) {
        switch (v->type) {
        case JV_STR: return jv_int(c->a, (int64_t)ju_count(v->u.s.p, v->u.s.n));
        case JV_LIST:
            if (v->flags & JVF_ITER) return rerr(c, line, "object of type 'generator' has no len()");
            return jv_int(c->a, (int64_t)v->u.l.n);
        case JV_DICT: return jv_int(c->a, (int64_t)v->u.d.n);
        case JV_UNDEF: return jv_int(c->a, 0);
        default: return rerr(c, line, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (IS("tojson")) return do_tojson(c, line, v, a);
    if (IS("string")) return str_of(c, v);
    if (IS("list")) return to_list(c, line, v);
    if (IS("items")) {
        if (v->type == JV_UNDEF) return as_gen(jv_list(c->a, 0));
        if (v->type != JV_DICT) return rerr(c, line, "items: expected a mapping, found %s",
                                             jv_type_name(v));
        return as_gen(dict_items(c, v));
    }
    if (IS("dictsort")) {
        if (v->type != JV_DICT) return rerr(c, line, "dictsort: expected a mapping");
        int cs = arg_bool(a, 0, "case_sensitive", 0);
        jv *by = arg(a, 1, "by");
        int by_value = by && str_eq(by, "value");
        int rev = arg_bool(a, 2, "reverse", 0);
        size_t n = v->u.d.n;
        sort_item *it = malloc((n ? n : 1) * sizeof *it);
        if (!it) return rerr(c, line, "out of memory");
        for (size_t i = 0; i < n; i++) {
            it[i].val = mk_tuple2(c, v->u.d.k[i], v->u.d.v[i]);
            it[i].key = fold_case(c, by_value ? v->u.d.v[i] : v->u.d.k[i], cs);
            it[i].idx = i;
        }
        int ok = sort_items(c, line, it, n, rev);
        jv *out = jv_list(c->a, n);
        for (size_t i = 0; ok && i < n; i++) jv_list_push(c->a, out, it[i].val);
        free(it);
        return ok ? out : NULL;
    }
    if (IS("join")) {
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        jv *sep = arg(a, 0, "d");
        jv *attr = arg(a, 1, "attribute");
        loom_buf b = {0};
        for (size_t i = 0; i < l->u.l.n; i++) {
            if (i && sep) jv_to_str(&b, sep);
            jv *x = attr ? attr_path(c, line, l->u.l.v[i], attr) : l->u.l.v[i];
            if (!x) { free(b.p); return NULL; }
            jv_to_str(&b, x);
        }
        return strbuf_take(c, &b);
    }
    if (IS("first") || IS("last")) {
        if (v->type == JV_STR) {
            if (!v->u.s.n) return jv_undef(c->a, NULL);
            size_t st = IS("first") ? 0 : cp_back(v->u.s.p, v->u.s.n);
            int32_t cp;
            size_t k = ju_decode(v->u.s.p, v->u.s.n, st, &cp);
            return jv_str_borrow(c->a, v->u.s.p + st, k);
        }
        if (IS("last") && v->type == JV_LIST && (v->flags & JVF_ITER))
            return rerr(c, line, "'generator' object is not reversible");
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        if (!l->u.l.n) return jv_undef(c->a, NULL);
        return IS("first") ? l->u.l.v[0] : l->u.l.v[l->u.l.n - 1];
    }
    if (IS("upper") || IS("lower"))
        return with_safe(c, do_case(c, str_of(c, v), IS("upper")), is_safe(v));
    if (IS("title")) return jinja_title(c, str_of(c, v));
    if (IS("capitalize")) return with_safe(c, capitalize(c, str_of(c, v)), is_safe(v));
    if (IS("trim"))
        return with_safe(c, do_strip(c, str_of(c, v), arg(a, 0, "chars"), 3), is_safe(v));
    if (IS("replace")) {
        jv *old = arg(a, 0, "old"), *new = arg(a, 1, "new"), *cnt = arg(a, 2, "count");
        if (!old || !new) return rerr(c, line, "replace: expected old and new strings");
        return do_replace(c, str_of(c, v), str_of(c, old), str_of(c, new),
                          cnt && is_num(cnt) ? numi(cnt) : -1);
    }
    if (IS("escape") || IS("e")) return is_safe(v) ? v : html_escape(c, str_of(c, v));
    if (IS("forceescape")) return html_escape(c, str_of(c, v));
    if ((IS("int") || IS("float")) && v->type == JV_UNDEF) return undef_err(c, line, v);
    if (IS("int")) {
        jv *def = arg(a, 0, "default");
        jv *base = arg(a, 1, "base");
        if (is_num(v)) return jv_int(c->a, v->type == JV_FLOAT ? (int64_t)v->u.f : numi(v));
        if (v->type == JV_STR) {
            char *end;
            const char *s = v->u.s.p;
            long long x = strtoll(s, &end, base && is_intlike(base) ? (int)numi(base) : 10);
            while (*end && py_space((unsigned char)*end)) end++;
            if (end != s && !*end) return jv_int(c->a, x);
            double d = strtod(s, &end);
            while (*end && py_space((unsigned char)*end)) end++;
            if (end != s && !*end && isfinite(d)) return jv_int(c->a, (int64_t)d);
        }
        return def ? def : jv_int(c->a, 0);
    }
    if (IS("float")) {
        jv *def = arg(a, 0, "default");
        if (is_num(v)) return jv_float(c->a, numf(v));
        if (v->type == JV_STR) {
            char *end;
            double d = strtod(v->u.s.p, &end);
            while (*end && py_space((unsigned char)*end)) end++;
            if (end != v->u.s.p && !*end) return jv_float(c->a, d);
        }
        return def ? def : jv_float(c->a, 0.0);
    }
    if (IS("abs")) {
        if (v->type == JV_FLOAT) return jv_float(c->a, fabs(v->u.f));
        if (is_intlike(v)) return jv_int(c->a, numi(v) < 0 ? -numi(v) : numi(v));
        return rerr(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (IS("round")) {
        if (!is_num(v)) return rerr(c, line, "round: expected a number, found %s", jv_type_name(v));
        jv *pr = arg(a, 0, "precision");
        jv *method = arg(a, 1, "method");
        int64_t prec = pr && is_num(pr) ? numi(pr) : 0;
        double x = numf(v), m = pow(10.0, (double)prec);
        int common = !method || str_eq(method, "common");
        if (common && is_intlike(v)) {
            /* round(int, n) stays an int */
            if (prec >= 0) return jv_int(c->a, numi(v));
            return jv_int(c->a, (int64_t)(nearbyint((double)numi(v) * m) / m));
        }
        if (method && str_eq(method, "ceil")) return jv_float(c->a, ceil(x * m) / m);
        if (method && str_eq(method, "floor")) return jv_float(c->a, floor(x * m) / m);
        if (prec < 0 || prec > 30) return jv_float(c->a, round(x * m) / m);
        char tmp[400];
        snprintf(tmp, sizeof tmp, "%.*f", (int)prec, x);
        return jv_float(c->a, strtod(tmp, NULL));
    }
    if (IS("unique")) {
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        int cs = arg_bool(a, 0, "case_sensitive", 0);
        jv *attr = arg(a, 1, "attribute");
        jv *out = jv_list(c->a, 0), *seen = jv_list(c->a, 0);
        for (size_t i = 0; i < l->u.l.n; i++) {
            jv *k = attr ? attr_path(c, line, l->u.l.v[i], attr) : l->u.l.v[i];
            if (!k) return NULL;
            k = fold_case(c, k, cs);
            int dup;
            contains(c, line, seen, k, &dup);
            if (dup) continue;
            jv_list_push(c->a, seen, k);
            jv_list_push(c->a, out, l->u.l.v[i]);
        }
        return as_gen(out);
    }
    if (IS("sort")) {
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        int rev = arg_bool(a, 0, "reverse", 0);
        int cs = arg_bool(a, 1, "case_sensitive", 0);
        jv *attr = arg(a, 2, "attribute");
        size_t n = l->u.l.n;
        sort_item *it = malloc((n ? n : 1) * sizeof *it);
        if (!it) return rerr(c, line, "out of memory");
        for (size_t i = 0; i < n; i++) {
            jv *k = attr ? attr_path(c, line, l->u.l.v[i], attr) : l->u.l.v[i];
            if (!k) { free(it); return NULL; }
            it[i].key = fold_case(c, k, cs);
            it[i].val = l->u.l.v[i];
            it[i].idx = i;
        }
        int ok = sort_items(c, line, it, n, rev);
        jv *out = jv_list(c->a, n);
        for (size_t i = 0; ok && i < n; i++) jv_list_push(c->a, out, it[i].val);
        free(it);
        return ok ? out : NULL;
    }
    if (IS("reverse")) {
        if (v->type == JV_STR) {
            jv *m1 = jv_int(c->a, -1);
            return do_slice(c, line, v, NULL, NULL, m1);
        }
        int was_gen = v->type == JV_LIST && (v->flags & JVF_ITER);
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        jv *out = jv_list(c->a, l->u.l.n);
        for (size_t i = l->u.l.n; i > 0; i--) jv_list_push(c->a, out, l->u.l.v[i - 1]);
        /* reversed(list) is an iterator; a generator is listed first */
        return v->type == JV_LIST && !was_gen ? as_gen(out) : out;
    }
    if (IS("select")) return do_select(c, line, v, a, 0, 1);
    if (IS("reject")) return do_select(c, line, v, a, 0, 0);
    if (IS("selectattr")) return do_select(c, line, v, a, 1, 1);
    if (IS("rejectattr")) return do_select(c, line, v, a, 1, 0);
    if (IS("map")) return do_map(c, line, v, a);
    if (IS("min")) return do_minmax(c, line, v, a, 0);
    if (IS("max")) return do_minmax(c, line, v, a, 1);
    if (IS("sum")) {
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        jv *attr = arg(a, 0, "attribute");
        jv *acc = arg(a, 1, "start");
        if (!acc) acc = jv_int(c->a, 0);
        for (size_t i = 0; i < l->u.l.n && acc; i++) {
            jv *x = attr ? attr_path(c, line, l->u.l.v[i], attr) : l->u.l.v[i];
            if (!x) return NULL;
            acc = num_add(c, line, acc, x);
        }
        return acc;
    }
    if (IS("indent")) {
        if (v->type != JV_STR) return rerr(c, line, "indent: expected a string, found %s", jv_type_name(v));
        return with_safe(c, do_indent(c, v, a), is_safe(v));
    }
    if (IS("wordcount")) {
        jv *s = str_of(c, v);
        int64_t words = 0;
        int in = 0;
        for (size_t i = 0; i < s->u.s.n;) {
            int32_t cp;
            i += ju_decode(s->u.s.p, s->u.s.n, i, &cp);
            utf8proc_category_t cat = utf8proc_category(cp);
            int w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                    (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
            if (w && !in) words++;
            in = w;
        }
        return jv_int(c->a, words);
    }
    if (IS("batch")) {
        jv *l = to_list(c, line, v);
        if (!l) return NULL;
        jv *cnt = arg(a, 0, "linecount");
        jv *fill = arg(a, 1, "fill_with");
        if (!cnt || !is_intlike(cnt) || numi(cnt) <= 0)
            return rerr(c, line, "batch: expected a positive count");
        int64_t k = numi(cnt);
        jv *out = jv_list(c->a, 0), *cur = NULL;
        for (size_t i = 0; i < l->u.l.n; i++) {
            if (!cur || (int64_t)cur->u.l.n == k) {
                cur = jv_list(c->a, (size_t)k);
                jv_list_push(c->a, out, cur);
            }
            jv_list_push(c->a, cur, l->u.l.v[i]);
        }
        if (cur && fill && fill->type != JV_NONE)
            while ((int64_t)cur->u.l.n < k) jv_list_push(c->a, cur, fill);
        return as_gen(out);
    }
    if (IS("format")) {
        jv *s = str_of(c, v);
        return printf_format(c, line, s, a->pos, a->npos, 0);
    }
    if (IS("attr")) {
        jv *nm = arg(a, 0, "name");
        if (!nm || nm->type != JV_STR) return rerr(c, line, "attr: expected a name");
        return get_attr(c, line, v, nm->u.s.p);
    }
    if (IS("center")) {
        jv *s = str_of(c, v);
        jv *w = arg(a, 0, "width");
        int64_t width = w && is_num(w) ? numi(w) : 80;
        int64_t len = (int64_t)ju_count(s->u.s.p, s->u.s.n);
        if (len >= width) return s;
        int64_t total = width - len, left = total / 2 + (total & width & 1);
        loom_buf b = {0};
        for (int64_t i = 0; i < left; i++) loom_buf_putc(&b, ' ');
        loom_buf_put(&b, s->u.s.p, s->u.s.n);
        for (int64_t i = 0; i < total - left; i++) loom_buf_putc(&b, ' ');
        return strbuf_take(c, &b);
    }
    if (IS("truncate")) {
        jv *str = str_of(c, v);
        jv *lv = arg(a, 0, "length"), *kw = arg(a, 1, "killwords"), *endv = arg(a, 2, "end"),
           *lw = arg(a, 3, "leeway");
        int64_t length = lv && is_intlike(lv) ? numi(lv) : 255;
        int64_t leeway = lw && is_intlike(lw) ? numi(lw) : 5;
        jv *end = endv ? str_of(c, endv) : jv_str_borrow(c->a, "...", 3);
        int64_t n = (int64_t)ju_count(str->u.s.p, str->u.s.n);
        int64_t endn = (int64_t)ju_count(end->u.s.p, end->u.s.n);
        if (length < endn) return rerr(c, line, "truncate: expected length >= %lld, got %lld",
                                       (long long)endn, (long long)length);
        if (n <= length + leeway) return str;
        jv *head = do_slice(c, line, str, NULL, jv_int(c->a, length - endn), NULL);
        if (!head) return NULL;
        if (!(kw && jv_truthy(kw))) {
            /* drop the last partial word: rsplit(" ", 1)[0] */
            const char *sp = NULL;
            for (size_t i = head->u.s.n; i-- > 0;)
                if (head->u.s.p[i] == ' ') {
                    sp = head->u.s.p + i;
                    break;
                }
            if (sp) head = jv_str_borrow(c->a, head->u.s.p, (size_t)(sp - head->u.s.p));
        }
        return num_add(c, line, head, end);
    }
    if (IS("pprint")) {
        loom_buf b = {0};
        jv_repr(&b, v);
        return strbuf_take(c, &b);
    }
    if (jinja_filter_known(name))
        return rerr(c, line, "filter '%s' is not supported", name);
    return rerr(c, line, "unknown filter '%s'", name);
#undef IS
}

static const char *const JINJA_FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort",
    "e", "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
    "min", "pprint", "random", "reject", "rejectattr", "replace", "reverse", "round",
    "safe", "select", "selectattr", "slice", "sort", "string", "striptags", "sum",
    "title", "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize",
    "wordcount", "wordwrap", "xmlattr", NULL,
};
static const char *const JINJA_TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
    "false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable",
    "le", "lower", "lessthan", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
    "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=",
    ">", ">=", NULL,
};

int jinja_filter_known(const char *name) { return find_name(JINJA_FILTERS, name) != NULL; }
int jinja_test_known(const char *name) { return find_name(JINJA_TESTS, name) != NULL; }

/* ---- tests ---------------------------------------------------------------------------------------- */

static int cmp_test(ctx *c, int line, jv *v, jv *other, int op) {
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

static int apply_test(ctx *c, int line, const char *name, jv *v, const args *a) {
#define IS(s) (!strcmp(name, s))
    jv *x = arg(a, 0, NULL);
    static const char *const NO_ARGS[] = {
        "defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
        "number", "string", "mapping", "iterable", "sequence", "callable", "escaped",
        "odd", "even", "lower", "upper", NULL,
    };
    if ((a->npos || a->nkw) && find_name(NO_ARGS, name))
        return rerr(c, line, "test '%s' takes no arguments", name), -1;
    if (IS("defined")) return v->type != JV_UNDEF;
    if (IS("undefined")) return v->type == JV_UNDEF;
    if (IS("none")) return v->type == JV_NONE;
    if (IS("boolean")) return v->type == JV_BOOL;
    if (IS("true")) return v->type == JV_BOOL && v->u.b;
    if (IS("false")) return v->type == JV_BOOL && !v->u.b;
    if (IS("integer")) return v->type == JV_INT;
    if (IS("float")) return v->type == JV_FLOAT;
    if (IS("number")) return is_num(v);
    if (IS("string")) return v->type == JV_STR;
    if (IS("mapping")) return v->type == JV_DICT && !(v->flags & JVF_NS);
    if (IS("iterable"))
        return v->type == JV_STR || v->type == JV_LIST || v->type == JV_DICT ||
               v->type == JV_UNDEF;
    if (IS("sequence"))
        return v->type == JV_STR || (v->type == JV_LIST && !(v->flags & JVF_ITER)) ||
               (v->type == JV_DICT && !(v->flags & JVF_NS)) || v->type == JV_UNDEF;
    if (IS("callable")) return v->type == JV_FUNC || v->type == JV_UNDEF; /* Undefined has __call__ */
    if (IS("escaped")) return 0;
    if (IS("sameas")) {
        if (!x) return rerr(c, line, "sameas needs an argument"), -1;
        if (v->type != x->type) return 0;
        if (v->type == JV_NONE || v->type == JV_UNDEF) return 1;
        if (v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT ||
            v->type == JV_STR)
            return jv_equal(v, x); /* CPython caches small ints and interns strings */
        return v == x;
    }
    if (IS("in")) {
        if (!x) return rerr(c, line, "'in' test needs an argument"), -1;
        int r;
        return contains(c, line, x, v, &r) ? r : -1;
    }
    if (IS("eq") || IS("equalto") || IS("==")) return cmp_test(c, line, v, x, OP_EQ);
    if (IS("ne") || IS("!=")) return cmp_test(c, line, v, x, OP_NE);
    if (IS("lt") || IS("lessthan") || IS("<")) return cmp_test(c, line, v, x, OP_LT);
    if (IS("le") || IS("<=")) return cmp_test(c, line, v, x, OP_LE);
    if (IS("gt") || IS("greaterthan") || IS(">")) return cmp_test(c, line, v, x, OP_GT);
    if (IS("ge") || IS(">=")) return cmp_test(c, line, v, x, OP_GE);
    if (IS("odd") || IS("even")) {
        if (!is_num(v)) return rerr(c, line, "'%s' test needs a number", name), -1;
        if (v->type == JV_FLOAT) { /* Python: value % 2 == 1 */
            double r = fmod(v->u.f, 2.0);
            if (r < 0) r += 2.0;
            return IS("odd") ? r == 1.0 : r == 0.0;
        }
        int64_t r = numi(v) % 2;
        return IS("odd") ? r != 0 : r == 0;
    }
    if (IS("divisibleby")) {
        if (!x || !is_num(v) || !is_num(x) || numf(x) == 0)
            return rerr(c, line, "divisibleby needs numbers and a non-zero divisor"), -1;
        if (v->type == JV_FLOAT || x->type == JV_FLOAT) return fmod(numf(v), numf(x)) == 0;
        return numi(v) % numi(x) == 0;
    }
    if (IS("lower") || IS("upper")) {
        v = str_of(c, v); /* Jinja tests str(value) */
        jv *t = do_case(c, v, IS("upper"));
        int cased = 0;
        for (size_t i = 0; i < v->u.s.n;) {
            int32_t cp;
            i += ju_decode(v->u.s.p, v->u.s.n, i, &cp);
            cased |= is_cased(cp);
        }
        return cased && jv_equal(t, v);
    }
    rerr(c, line, "%s test '%s'", jinja_test_known(name) ? "unsupported" : "unknown", name);
    return -1;
#undef IS
}

/* ---- operators ---------------------------------------------------------------------------------- */

static jv *op_err(ctx *c, int line, const char *op, jv *x, jv *y) {
    if (x->type == JV_UNDEF) return undef_err(c, line, x);
    if (y->type == JV_UNDEF) return undef_err(c, line, y);
    return rerr(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                jv_type_name(x), jv_type_name(y));
}

static jv *num_add(ctx *c, int line, jv *x, jv *y) {
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

static jv *binop(ctx *c, int line, int op, jv *x, jv *y) {
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

/* ---- calls ------------------------------------------------------------------------------------------ */

static jv *render_capture(ctx *c, const jnode *body, jframe *f, int *flow);

static jv *call_macro(ctx *c, int line, const jnode *m, jframe *closure, const args *a,
                      jv *caller) {
    if (c->depth >= MAX_DEPTH) return rerr(c, line, "macro recursion too deep");
    jframe *f = frame_new(c, closure);
    if (!f) return rerr(c, line, "out of memory");
    int np = m->n;
    if (m->kind == N_MACRO) { /* argument checks as Jinja's Macro does them */
        if (a->npos > np && !(m->op & MACRO_VARARGS))
            return rerr(c, line, "macro '%s' takes not more than %d argument(s)", m->name, np);
        for (int k = 0; k < a->nkw; k++) {
            int at = -1;
            for (int i = 0; i < np; i++)
                if (!strcmp(a->kwn[k], m->items[i]->name)) at = i;
            if (at >= 0 && at < a->npos)
                return rerr(c, line, "macro '%s' got multiple values for argument '%s'",
                            m->name, a->kwn[k]);
            if (at < 0 && !(m->op & MACRO_KWARGS) && strcmp(a->kwn[k], "caller"))
                return rerr(c, line, "macro '%s' takes no keyword argument '%s'", m->name,
                            a->kwn[k]);
        }
    }
    for (int i = 0; i < np; i++) {
        const char *pname = m->items[i]->name;
        jv *v = i < a->npos ? a->pos[i] : NULL;
        if (!v)
            for (int k = 0; k < a->nkw; k++)
                if (!strcmp(a->kwn[k], pname)) v = a->kwv[k];
        if (!v && m->kwv[i]) {
            v = eval(c, m->kwv[i], f);
            if (!v) return NULL;
        }
        frame_set(c, f, pname, v ? v : jv_undef(c->a, pname));
    }
    jv *varargs = jv_list(c->a, 0);
    varargs->flags |= JVF_TUPLE;
    for (int i = np; i < a->npos; i++) jv_list_push(c->a, varargs, a->pos[i]);
    jv *kwargs = jv_dict(c->a);
    for (int k = 0; k < a->nkw; k++) {
        int known = 0;
        for (int i = 0; i < np; i++) known |= !strcmp(a->kwn[k], m->items[i]->name);
        if (!known) jv_dict_set(c->a, kwargs, jv_strz(c->a, a->kwn[k]), a->kwv[k]);
    }
    frame_set(c, f, "varargs", varargs);
    frame_set(c, f, "kwargs", kwargs);
    if (caller) frame_set(c, f, "caller", caller);
    c->depth++;
    int flow;
    jv *r = render_capture(c, m->a, f, &flow); /* macro and caller bodies are in a */
    c->depth--;
    return r;
}

static jv *call_method(ctx *c, int line, jfunc *fn, const args *a) {
    jv *self = fn->self;
    const char *m = fn->name;
#define IS(s) (!strcmp(m, s))
    if (self->type == JV_STR) {
        jv *x = arg(a, 0, NULL);
        if (IS("startswith") || IS("endswith")) {
            if (!x) return rerr(c, line, "%s: expected an argument", m);
            int end = IS("endswith");
            jv **cands = &x;
            size_t nc = 1;
            if (x->type == JV_LIST) {
                cands = x->u.l.v;
                nc = x->u.l.n;
            }
            for (size_t i = 0; i < nc; i++) {
                jv *p = cands[i];
                if (p->type != JV_STR)
                    return rerr(c, line, "%s: argument must be str, not %s", m, jv_type_name(p));
                if (p->u.s.n > self->u.s.n) continue;
                const char *at = end ? self->u.s.p + self->u.s.n - p->u.s.n : self->u.s.p;
                if (!memcmp(at, p->u.s.p, p->u.s.n)) return jv_bool(1);
            }
            return jv_bool(0);
        }
        if (IS("strip") || IS("lstrip") || IS("rstrip"))
            return do_strip(c, self, x, IS("strip") ? 3 : IS("lstrip") ? 1 : 2);
        if (IS("upper") || IS("lower")) return do_case(c, self, IS("upper"));
        if (IS("title")) return py_title(c, self);
        if (IS("capitalize")) return capitalize(c, self);
        if (IS("split") || IS("rsplit")) {
            jv *sep = arg(a, 0, "sep");
            jv *ms = arg(a, 1, "maxsplit");
            int64_t maxsplit = ms && is_intlike(ms) ? numi(ms) : -1;
            if (IS("rsplit") && maxsplit >= 0) {
                /* split from the right: split all, then rejoin the head */
                jv *all = do_split(c, line, self, sep, -1);
                if (!all) return NULL;
                if ((int64_t)all->u.l.n <= maxsplit + 1) return all;
                if (!sep || sep->type != JV_STR)
                    return rerr(c, line, "rsplit with maxsplit needs a separator");
                size_t head = all->u.l.n - (size_t)maxsplit;
                loom_buf b = {0};
                for (size_t i = 0; i < head; i++) {
                    if (i) loom_buf_put(&b, sep->u.s.p, sep->u.s.n);
                    loom_buf_put(&b, all->u.l.v[i]->u.s.p, all->u.l.v[i]->u.s.n);
                }
                jv *out = jv_list(c->a, 0);
                jv_list_push(c->a, out, strbuf_take(c, &b));
                for (size_t i = head; i < all->u.l.n; i++) jv_list_push(c->a, out, all->u.l.v[i]);
                return out;
            }
            return do_split(c, line, self, sep, maxsplit);
        }
        if (IS("splitlines")) {
            jv *out = jv_list(c->a, 0);
            const char *p = self->u.s.p, *end = p + self->u.s.n;
            while (p < end) {
                const char *e = p;
                while (e < end && *e != '\n' && *e != '\r') e++;
                jv_list_push(c->a, out, jv_str(c->a, p, (size_t)(e - p)));
                if (e < end && *e == '\r' && e + 1 < end && e[1] == '\n') e++;
                p = e < end ? e + 1 : e;
            }
            return out;
        }
        if (IS("replace")) {
            jv *old = arg(a, 0, NULL), *new = arg(a, 1, NULL), *cnt = arg(a, 2, "count");
            if (!old || !new || old->type != JV_STR || new->type != JV_STR)
                return rerr(c, line, "replace: expected two strings");
            return do_replace(c, self, old, new, cnt && is_intlike(cnt) ? numi(cnt) : -1);
        }
        if (IS("format")) return py_format(c, line, self, a);
        if (IS("find") || IS("rfind") || IS("index") || IS("count")) {
            if (!x || x->type != JV_STR) return rerr(c, line, "%s: expected a string", m);
            if (IS("count")) {
                int64_t k = 0;
                if (!x->u.s.n) return jv_int(c->a, (int64_t)ju_count(self->u.s.p, self->u.s.n) + 1);
                const char *p = self->u.s.p, *end = p + self->u.s.n, *f;
                while ((f = memfind(p, (size_t)(end - p), x->u.s.p, x->u.s.n))) {
                    k++;
                    p = f + x->u.s.n;
                }
                return jv_int(c->a, k);
            }
            const char *f = NULL;
            if (IS("rfind")) {
                for (size_t i = self->u.s.n + 1; i-- > 0;)
                    if (i + x->u.s.n <= self->u.s.n && !memcmp(self->u.s.p + i, x->u.s.p, x->u.s.n)) {
                        f = self->u.s.p + i;
                        break;
                    }
            } else {
                f = memfind(self->u.s.p, self->u.s.n, x->u.s.p, x->u.s.n);
            }
            if (!f && IS("index")) return rerr(c, line, "substring not found");
            return jv_int(c->a, f ? (int64_t)ju_count(self->u.s.p, (size_t)(f - self->u.s.p)) : -1);
        }
        if (IS("join")) {
            if (!x) return rerr(c, line, "join: expected an iterable");
            jv *l = to_list(c, line, x);
            if (!l) return NULL;
            loom_buf b = {0};
            for (size_t i = 0; i < l->u.l.n; i++) {
                if (i) loom_buf_put(&b, self->u.s.p, self->u.s.n);
                if (l->u.l.v[i]->type != JV_STR) {
                    free(b.p);
                    return rerr(c, line, "join: sequence item %zu: expected str instance, %s found",
                                i, jv_type_name(l->u.l.v[i]));
                }
                loom_buf_put(&b, l->u.l.v[i]->u.s.p, l->u.l.v[i]->u.s.n);
            }
            return strbuf_take(c, &b);
        }
        if (IS("removeprefix") || IS("removesuffix")) {
            if (!x || x->type != JV_STR) return rerr(c, line, "%s: expected a string", m);
            if (x->u.s.n > self->u.s.n) return self;
            if (IS("removeprefix"))
                return memcmp(self->u.s.p, x->u.s.p, x->u.s.n) ? self
                       : jv_str_borrow(c->a, self->u.s.p + x->u.s.n, self->u.s.n - x->u.s.n);
            return memcmp(self->u.s.p + self->u.s.n - x->u.s.n, x->u.s.p, x->u.s.n) ? self
                   : jv_str_borrow(c->a, self->u.s.p, self->u.s.n - x->u.s.n);
        }
        if (IS("isdigit") || IS("isalpha") || IS("isalnum") || IS("isspace") ||
            IS("islower") || IS("isupper")) {
            if (!self->u.s.n) return jv_bool(0);
            if (IS("islower") || IS("isupper")) {
                args none = {0};
                return jv_bool(apply_test(c, line, IS("islower") ? "lower" : "upper", self, &none));
            }
            for (size_t i = 0; i < self->u.s.n;) {
                int32_t cp;
                i += ju_decode(self->u.s.p, self->u.s.n, i, &cp);
                utf8proc_category_t cat = utf8proc_category(cp);
                int alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
                int digit = cat == UTF8PROC_CATEGORY_ND;
                int ok = IS("isdigit") ? digit : IS("isalpha") ? alpha
                       : IS("isalnum") ? (alpha || digit) : py_space(cp);
                if (!ok) return jv_bool(0);
            }
            return jv_bool(1);
        }
    } else if (self->type == JV_DICT) {
        if (IS("get")) {
            jv *k = arg(a, 0, NULL);
            if (!k) return rerr(c, line, "get: expected a key");
            jv *v = jv_dict_get(self, k);
            if (v) return v;
            jv *d = arg(a, 1, "default");
            return d ? d : &jv_none_static;
        }
        if (IS("items")) return dict_items(c, self);
        if (IS("keys")) return to_list(c, line, self);
        if (IS("values")) {
            jv *l = jv_list(c->a, self->u.d.n);
            for (size_t i = 0; i < self->u.d.n; i++) jv_list_push(c->a, l, self->u.d.v[i]);
            return l;
        }
    } else if (self->type == JV_LIST) {
        jv *x = arg(a, 0, NULL);
        if (IS("append")) {
            if (self->flags & JVF_TUPLE) return rerr(c, line, "tuple has no append");
            if (!x) return rerr(c, line, "append: expected an argument");
            jv_list_push(c->a, self, x);
            return &jv_none_static;
        }
        if (IS("extend")) {
            jv *l = x ? to_list(c, line, x) : NULL;
            if (!l) return rerr(c, line, "extend: expected an iterable");
            for (size_t i = 0; i < l->u.l.n; i++) jv_list_push(c->a, self, l->u.l.v[i]);
            return &jv_none_static;
        }
        if (IS("pop")) {
            if (!self->u.l.n) return rerr(c, line, "pop from empty list");
            int64_t i = x && is_intlike(x) ? numi(x) : -1, n = (int64_t)self->u.l.n;
            if (i < 0) i += n;
            if (i < 0 || i >= n) return rerr(c, line, "pop index out of range");
            jv *r = self->u.l.v[i];
            memmove(self->u.l.v + i, self->u.l.v + i + 1, (size_t)(n - i - 1) * sizeof(jv *));
            self->u.l.n--;
            return r;
        }
        if (IS("index") || IS("count")) {
            if (!x) return rerr(c, line, "%s: expected an argument", m);
            int64_t k = 0;
            for (size_t i = 0; i < self->u.l.n; i++)
                if (jv_equal(self->u.l.v[i], x)) {
                    if (IS("index")) return jv_int(c->a, (int64_t)i);
                    k++;
                }
            if (IS("index")) return rerr(c, line, "value is not in list");
            return jv_int(c->a, k);
        }
    }
    return rerr(c, line, "'%s' object has no method '%s'", jv_type_name(self), m);
#undef IS
}

static jv *call_builtin(ctx *c, int line, jfunc *fn, const args *a) {
    const char *m = fn->name;
#define IS(s) (!strcmp(m, s))
    if (IS("raise_exception")) {
        jv *msg = arg(a, 0, NULL);
        loom_buf b = {0};
        if (msg) jv_to_str(&b, msg);
        if (c->st == LOOM_OK) {
            c->st = loom_err(LOOM_ERR_INVALID_ARG, "%s", b.p ? b.p : "");
            c->raised = 1;
        }
        free(b.p);
        return NULL;
    }
    if (IS("range")) {
        int64_t start = 0, stop, step = 1;
        for (int i = 0; i < a->npos; i++)
            if (!is_intlike(a->pos[i]))
                return rerr(c, line, "range: '%s' object cannot be interpreted as an integer",
                            jv_type_name(a->pos[i]));
        if (a->npos == 1) stop = numi(a->pos[0]);
        else if (a->npos == 2 || a->npos == 3) {
            start = numi(a->pos[0]);
            stop = numi(a->pos[1]);
            if (a->npos == 3) step = numi(a->pos[2]);
        } else return rerr(c, line, "range expected 1 to 3 arguments, got %d", a->npos);
        if (step == 0) return rerr(c, line, "range() arg 3 must not be zero");
        jv *l = jv_list(c->a, 0);
        int64_t k = 0;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (++k > MAX_RANGE) return rerr(c, line, "range too big (limit %d)", MAX_RANGE);
            jv_list_push(c->a, l, jv_int(c->a, i));
        }
        return l;
    }
    if (IS("namespace") || IS("dict")) {
        jv *d = jv_dict(c->a);
        if (IS("namespace")) d->flags |= JVF_NS;
        for (int i = 0; i < a->npos; i++) {
            jv *src = a->pos[i];
            if (src->type == JV_DICT) {
                for (size_t k = 0; k < src->u.d.n; k++)
                    jv_dict_set(c->a, d, src->u.d.k[k], src->u.d.v[k]);
            } else if (src->type == JV_LIST) {
                for (size_t k = 0; k < src->u.l.n; k++) {
                    jv *p = src->u.l.v[k];
                    if (p->type != JV_LIST || p->u.l.n != 2)
                        return rerr(c, line, "%s: sequence elements must be pairs", m);
                    jv_dict_set(c->a, d, p->u.l.v[0], p->u.l.v[1]);
                }
            } else {
                return rerr(c, line, "%s: expected a mapping, found %s", m, jv_type_name(src));
            }
        }
        for (int k = 0; k < a->nkw; k++) jv_dict_set(c->a, d, jv_strz(c->a, a->kwn[k]), a->kwv[k]);
        return d;
    }
    if (IS("strftime_now")) {
        jv *fmt = arg(a, 0, NULL);
        if (!fmt || fmt->type != JV_STR) return rerr(c, line, "strftime_now: expected a format string");
        time_t t = time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        char buf[512];
        size_t n = fmt->u.s.n ? strftime(buf, sizeof buf, fmt->u.s.p, &tm) : 0;
        return jv_str(c->a, buf, n);
    }
    return rerr(c, line, "'%s' is not supported", m);
#undef IS
}

static jv *call_value(ctx *c, int line, jv *fn, const args *a) {
    if (fn->type == JV_UNDEF) {
        if (fn->uname) return rerr(c, line, "'%s' is undefined", fn->uname);
        return rerr(c, line, "undefined value is not callable");
    }
    if (fn->type != JV_FUNC) return rerr(c, line, "'%s' object is not callable", jv_type_name(fn));
    jfunc *f = fn->u.fn;
    switch (f->kind) {
    case JF_BUILTIN: return call_builtin(c, line, f, a);
    case JF_METHOD: return call_method(c, line, f, a);
    case JF_MACRO: {
        jv *caller = arg(a, -1, "caller");
        return call_macro(c, line, f->macro, f->closure, a, caller);
    }
    case JF_CALLER: return call_macro(c, line, f->macro, f->closure, a, NULL);
    case JF_CYCLE: {
        if (!a->npos) return rerr(c, line, "cycle: no items given");
        return a->pos[numi(f->self) % a->npos];
    }
    }
    return rerr(c, line, "not callable");
}

static int eval_args(ctx *c, const jnode *n, jframe *f, args *out) {
    memset(out, 0, sizeof *out);
    if (n->n) {
        out->pos = jar_alloc(c->a, (size_t)n->n * sizeof(jv *));
        if (!out->pos) return 0;
    }
    for (int i = 0; i < n->n; i++) {
        out->pos[i] = eval(c, n->items[i], f);
        if (!out->pos[i]) return 0;
    }
    out->npos = n->n;
    if (n->nkw) {
        out->kwv = jar_alloc(c->a, (size_t)n->nkw * sizeof(jv *));
        if (!out->kwv) return 0;
        for (int i = 0; i < n->nkw; i++) {
            out->kwv[i] = eval(c, n->kwv[i], f);
            if (!out->kwv[i]) return 0;
        }
    }
    out->kwn = n->kwn;
    out->nkw = n->nkw;
    return 1;
}

/* ---- expressions ------------------------------------------------------------------------------------- */

static jv *eval_filter_chain(ctx *c, const jnode *n, jframe *f, jv *input) {
    /* E_FILTER nodes whose innermost input is E_BODYVAL */
    if (n->kind == E_BODYVAL) return input;
    jv *v = eval_filter_chain(c, n->a, f, input);
    if (!v) return NULL;
    args a;
    if (!eval_args(c, n, f, &a)) return NULL;
    return apply_filter(c, n->line, n->name, v, &a);
}

static jv *eval(ctx *c, const jnode *n, jframe *f) {
    if (c->st) return NULL;
    switch (n->kind) {
    case E_CONST: return n->val;
    case E_NAME: return lookup(c, f, n->name);
    case E_ATTR: {
        jv *o = eval(c, n->a, f);
        return o ? get_attr(c, n->line, o, n->name) : NULL;
    }
    case E_ITEM: {
        jv *o = eval(c, n->a, f);
        jv *k = o ? eval(c, n->b, f) : NULL;
        return k ? get_item(c, n->line, o, k) : NULL;
    }
    case E_SLICE: {
        jv *o = eval(c, n->a, f);
        if (!o) return NULL;
        jv *lo = n->b ? eval(c, n->b, f) : NULL;
        jv *hi = n->c ? eval(c, n->c, f) : NULL;
        jv *st = n->d ? eval(c, n->d, f) : NULL;
        if (c->st) return NULL;
        return do_slice(c, n->line, o, lo, hi, st);
    }
    case E_CALL: {
        jv *fn = eval(c, n->a, f);
        if (!fn) return NULL;
        args a;
        if (!eval_args(c, n, f, &a)) return NULL;
        return call_value(c, n->line, fn, &a);
    }
    case E_FILTER: {
        jv *v = eval(c, n->a, f);
        if (!v) return NULL;
        args a;
        if (!eval_args(c, n, f, &a)) return NULL;
        return apply_filter(c, n->line, n->name, v, &a);
    }
    case E_TEST: {
        jv *v = eval(c, n->a, f);
        if (!v) return NULL;
        args a;
        if (!eval_args(c, n, f, &a)) return NULL;
        int r = apply_test(c, n->line, n->name, v, &a);
        if (r < 0) return NULL;
        return jv_bool(n->op ? !r : r);
    }
    case E_NEG: case E_POS: {
        jv *v = eval(c, n->a, f);
        if (!v) return NULL;
        if (!is_num(v)) return rerr(c, n->line, "bad operand type for unary %c: '%s'",
                                    n->kind == E_NEG ? '-' : '+', jv_type_name(v));
        if (n->kind == E_POS) return v;
        return v->type == JV_FLOAT ? jv_float(c->a, -v->u.f) : jv_int(c->a, -numi(v));
    }
    case E_NOT: {
        jv *v = eval(c, n->a, f);
        return v ? jv_bool(!jv_truthy(v)) : NULL;
    }
    case E_AND: {
        jv *x = eval(c, n->a, f);
        if (!x || !jv_truthy(x)) return x;
        return eval(c, n->b, f);
    }
    case E_OR: {
        jv *x = eval(c, n->a, f);
        if (!x || jv_truthy(x)) return x;
        return eval(c, n->b, f);
    }
    case E_BIN: {
        jv *x = eval(c, n->a, f);
        jv *y = x ? eval(c, n->b, f) : NULL;
        return y ? binop(c, n->line, n->op, x, y) : NULL;
    }
    case E_CMP: {
        jv *x = eval(c, n->a, f);
        jv *y = x ? eval(c, n->b, f) : NULL;
        if (!y) return NULL;
        if (n->op == OP_IN || n->op == OP_NOTIN) {
            int r;
            if (!contains(c, n->line, y, x, &r)) return NULL;
            return jv_bool(n->op == OP_IN ? r : !r);
        }
        if (n->op == OP_EQ) return jv_bool(jv_equal(x, y));
        if (n->op == OP_NE) return jv_bool(!jv_equal(x, y));
        if (x->type == JV_UNDEF) return undef_err(c, n->line, x);
        if (y->type == JV_UNDEF) return undef_err(c, n->line, y);
        int r = cmp_test(c, n->line, x, y, n->op);
        return r < 0 ? NULL : jv_bool(r);
    }
    case E_COND: {
        jv *cond = eval(c, n->a, f);
        if (!cond) return NULL;
        if (jv_truthy(cond)) return eval(c, n->b, f);
        return n->c ? eval(c, n->c, f) : jv_undef(c->a, NULL);
    }
    case E_LIST: case E_TUPLE: {
        jv *l = jv_list(c->a, (size_t)n->n);
        if (n->kind == E_TUPLE) l->flags |= JVF_TUPLE;
        for (int i = 0; i < n->n; i++) {
            jv *x = eval(c, n->items[i], f);
            if (!x) return NULL;
            jv_list_push(c->a, l, x);
        }
        return l;
    }
    case E_DICT: {
        jv *d = jv_dict(c->a);
        for (int i = 0; i < n->n; i++) {
            jv *k = eval(c, n->items[i], f);
            jv *v = k ? eval(c, n->kwv[i], f) : NULL;
            if (!v) return NULL;
            jv_dict_set(c->a, d, k, v);
        }
        return d;
    }
    default: return rerr(c, n->line, "cannot evaluate this expression");
    }
}

/* ---- statements ------------------------------------------------------------------------------------- */

enum { FLOW_OK = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2, FLOW_ERR = -1 };

static jv *render_capture(ctx *c, const jnode *body, jframe *f, int *flow) {
    loom_buf b = {0};
    loom_buf *saved = c->out;
    c->out = &b;
    *flow = exec(c, body, f);
    c->out = saved;
    if (*flow == FLOW_ERR || c->st) {
        free(b.p);
        return NULL;
    }
    return strbuf_take(c, &b);
}

static int assign(ctx *c, int line, const jnode *target, jv *v, jframe *f) {
    if (target->kind == E_NAME) {
        frame_set(c, f, target->name, v);
        return 1;
    }
    if (target->kind == E_TUPLE) {
        jv *l = to_list(c, line, v);
        if (!l) return 0;
        if ((int)l->u.l.n != target->n) {
            rerr(c, line, "cannot unpack %zu values into %d names", l->u.l.n, target->n);
            return 0;
        }
        for (int i = 0; i < target->n; i++) frame_set(c, f, target->items[i]->name, l->u.l.v[i]);
        return 1;
    }
    if (target->kind == E_ATTR) {
        jv *ns = lookup(c, f, target->a->name);
        if (ns->type != JV_DICT || !(ns->flags & JVF_NS)) {
            rerr(c, line, "cannot assign attribute on non-namespace object '%s'", target->a->name);
            return 0;
        }
        jv_dict_set(c->a, ns, jv_strz(c->a, target->name), v);
        return 1;
    }
    rerr(c, line, "bad assignment target");
    return 0;
}

static jv *loop_obj(ctx *c, jv *items, size_t i) {
    size_t n = items->u.l.n;
    jv *d = jv_dict(c->a);
    d->flags |= JVF_NS; /* attribute-only object: no dict methods */
#define SET(k, v) jv_dict_set(c->a, d, jv_str_borrow(c->a, k, strlen(k)), v)
    SET("index", jv_int(c->a, (int64_t)i + 1));
    SET("index0", jv_int(c->a, (int64_t)i));
    SET("revindex", jv_int(c->a, (int64_t)(n - i)));
    SET("revindex0", jv_int(c->a, (int64_t)(n - i - 1)));
    SET("first", jv_bool(i == 0));
    SET("last", jv_bool(i + 1 == n));
    SET("length", jv_int(c->a, (int64_t)n));
    SET("depth", jv_int(c->a, 1));
    SET("depth0", jv_int(c->a, 0));
    SET("previtem", i > 0 ? items->u.l.v[i - 1] : jv_undef(c->a, "previtem"));
    SET("nextitem", i + 1 < n ? items->u.l.v[i + 1] : jv_undef(c->a, "nextitem"));
    SET("cycle", mk_func(c, JF_CYCLE, "cycle", jv_int(c->a, (int64_t)i)));
#undef SET
    return d;
}

static int exec_for(ctx *c, const jnode *n, jframe *f) {
    jv *it = eval(c, n->a, f);
    if (!it) return FLOW_ERR;
    jv *items = to_list(c, n->line, it);
    if (!items) return FLOW_ERR;
    jframe *lf = frame_new(c, f);
    if (!lf) return FLOW_ERR;
    if (n->c) { /* for x in xs if cond: filter first so loop.* counts what runs */
        jv *kept = jv_list(c->a, 0);
        for (size_t i = 0; i < items->u.l.n; i++) {
            if (!assign(c, n->line, n->d, items->u.l.v[i], lf)) return FLOW_ERR;
            jv *cond = eval(c, n->c, lf);
            if (!cond) return FLOW_ERR;
            if (jv_truthy(cond)) jv_list_push(c->a, kept, items->u.l.v[i]);
        }
        items = kept;
    }
    size_t count = items->u.l.n;
    for (size_t i = 0; i < count; i++) {
        if (++c->steps > MAX_STEPS) {
            rerr(c, n->line, "template exceeded its step limit");
            return FLOW_ERR;
        }
        /* each iteration gets a fresh scope: a `set` in the body is not seen
         * by the next iteration */
        if (i && !(lf = frame_new(c, f))) return FLOW_ERR;
        if (!assign(c, n->line, n->d, items->u.l.v[i], lf)) return FLOW_ERR;
        frame_set(c, lf, "loop", loop_obj(c, items, i));
        int r = exec(c, n->b, lf);
        if (r == FLOW_ERR) return r;
        if (r == FLOW_BREAK) break;
    }
    if (!count && n->n) return exec(c, n->items[0], f);
    return FLOW_OK;
}

static int exec(ctx *c, const jnode *n, jframe *f) {
    if (c->st) return FLOW_ERR;
    if (++c->steps > MAX_STEPS) {
        rerr(c, n->line, "template exceeded its step limit");
        return FLOW_ERR;
    }
    if (c->out->len > MAX_OUTPUT) {
        rerr(c, n->line, "template output exceeds %u bytes", MAX_OUTPUT);
        return FLOW_ERR;
    }
    if (c->a->failed) {
        c->st = loom_err(LOOM_ERR_NOMEM, "template line %d: render memory limit (%zu MiB) "
                         "exceeded", n->line, c->a->limit >> 20);
        return FLOW_ERR;
    }
    switch (n->kind) {
    case N_BODY:
        for (int i = 0; i < n->n; i++) {
            int r = exec(c, n->items[i], f);
            if (r != FLOW_OK) return r;
        }
        return FLOW_OK;
    case N_TEXT:
        loom_buf_put(c->out, n->val->u.s.p, n->val->u.s.n);
        return FLOW_OK;
    case N_OUTPUT: {
        jv *v = eval(c, n->a, f);
        if (!v) return FLOW_ERR;
        jv_to_str(c->out, v);
        return FLOW_OK;
    }
    case N_IF: {
        jv *cond = eval(c, n->a, f);
        if (!cond) return FLOW_ERR;
        if (jv_truthy(cond)) return exec(c, n->b, f);
        return n->c ? exec(c, n->c, f) : FLOW_OK;
    }
    case N_FOR: return exec_for(c, n, f);
    case N_SET: {
        jv *v = eval(c, n->b, f);
        if (!v) return FLOW_ERR;
        return assign(c, n->line, n->a, v, f) ? FLOW_OK : FLOW_ERR;
    }
    case N_SETBLOCK: {
        int flow;
        jv *v = render_capture(c, n->b, f, &flow);
        if (!v) return FLOW_ERR;
        if (n->c) {
            v = eval_filter_chain(c, n->c, f, v);
            if (!v) return FLOW_ERR;
        }
        return assign(c, n->line, n->a, v, f) ? FLOW_OK : FLOW_ERR;
    }
    case N_FILTERBLOCK: {
        int flow;
        jv *v = render_capture(c, n->a, f, &flow);
        if (!v) return FLOW_ERR;
        v = eval_filter_chain(c, n->c, f, v);
        if (!v) return FLOW_ERR;
        jv_to_str(c->out, v);
        return flow;
    }
    case N_MACRO: {
        jv *m = mk_func(c, JF_MACRO, n->name, NULL);
        if (m->type != JV_FUNC) return FLOW_ERR;
        m->u.fn->macro = n;
        m->u.fn->closure = f;
        frame_set(c, f, n->name, m);
        return FLOW_OK;
    }
    case N_CALLBLOCK: {
        const jnode *call = n->b;
        jv *fn = eval(c, call->a, f);
        if (!fn) return FLOW_ERR;
        args a;
        if (!eval_args(c, call, f, &a)) return FLOW_ERR;
        jv *caller = mk_func(c, JF_CALLER, "caller", NULL);
        if (caller->type != JV_FUNC) return FLOW_ERR;
        caller->u.fn->macro = n;   /* params in items/kwv, body in a */
        caller->u.fn->closure = f;
        jv *r;
        if (fn->type == JV_FUNC && fn->u.fn->kind == JF_MACRO)
            r = call_macro(c, call->line, fn->u.fn->macro, fn->u.fn->closure, &a, caller);
        else
            r = call_value(c, call->line, fn, &a);
        if (!r) return FLOW_ERR;
        jv_to_str(c->out, r);
        return FLOW_OK;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_WITH: {
        jframe *wf = frame_new(c, f);
        if (!wf) return FLOW_ERR;
        for (int i = 0; i < n->n; i++) {
            jv *v = eval(c, n->kwv[i], f);
            if (!v || !assign(c, n->line, n->items[i], v, wf)) return FLOW_ERR;
        }
        return exec(c, n->a, wf);
    }
    case N_DO:
        return eval(c, n->a, f) ? FLOW_OK : FLOW_ERR;
    default:
        rerr(c, n->line, "cannot execute this statement");
        return FLOW_ERR;
    }
}

/* ---- public API ------------------------------------------------------------------------------------- */

loom_status loom_jinja_compile(const char *src, size_t len, loom_jinja_template **out) {
    *out = NULL;
    if (!src) return loom_err(LOOM_ERR_INVALID_ARG, "template: source is NULL");
    loom_jinja_template *t = calloc(1, sizeof *t);
    if (!t) return loom_err(LOOM_ERR_NOMEM, "template: out of memory");
    loom_status st = jinja_parse(&t->arena, src, len, &t->root);
    if (st == LOOM_OK && t->arena.failed) st = loom_err(LOOM_ERR_NOMEM, "template: out of memory");
    if (st != LOOM_OK) {
        loom_jinja_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

void loom_jinja_free(loom_jinja_template *t) {
    if (!t) return;
    jar_free(&t->arena);
    free(t);
}

loom_status loom_jinja_render(const loom_jinja_template *t, const char *vars_json, char **out,
                              size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    last_raised = 0;
    if (!t) return loom_err(LOOM_ERR_INVALID_ARG, "template: NULL template");
    jarena arena = {.limit = MAX_MEMORY};
    loom_buf buf = {0};
    ctx c = {.a = &arena, .out = &buf};
    c.root = frame_new(&c, NULL);
    jframe *top = frame_new(&c, c.root);
    loom_status st = LOOM_OK;
    if (!c.root || !top) {
        st = loom_err(LOOM_ERR_NOMEM, "template: out of memory");
        goto done;
    }
    if (vars_json && *vars_json) {
        const char *err = NULL;
        jv *vars = jv_parse_json(&arena, vars_json, strlen(vars_json), &err);
        if (!vars) {
            st = loom_err(LOOM_ERR_INVALID_ARG, "template variables: bad JSON: %s", err);
            goto done;
        }
        if (vars->type != JV_DICT) {
            st = loom_err(LOOM_ERR_INVALID_ARG, "template variables: expected a JSON object, found %s",
                          jv_type_name(vars));
            goto done;
        }
        for (size_t i = 0; i < vars->u.d.n; i++)
            frame_set(&c, c.root, vars->u.d.k[i]->u.s.p, vars->u.d.v[i]);
    }
    exec(&c, t->root, top);
    if (c.st == LOOM_OK && (arena.failed || buf.oom))
        c.st = loom_err(LOOM_ERR_NOMEM, "template: out of memory while rendering");
    st = c.st;
    last_raised = c.raised;
done:
    jar_free(&arena);
    if (st != LOOM_OK) {
        free(buf.p);
        return st;
    }
    if (!buf.p) {
        buf.p = malloc(1);
        if (!buf.p) return loom_err(LOOM_ERR_NOMEM, "template: out of memory");
        buf.p[0] = 0;
    }
    *out = buf.p;
    if (out_len) *out_len = buf.len;
    return LOOM_OK;
}
