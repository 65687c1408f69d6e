/* template/jinja_eval: the evaluator of the Jinja engine: scopes, statements,
 * expressions, calls, and the methods and globals chat templates use (the
 * filters and tests are jinja_filters.c). Semantics follow Jinja2 3.x in
 * transformers' sandboxed environment:
 *   - undefined values print as "", are falsy and iterate as empty; reading
 *     an attribute or item of an undefined value is an error, of None it
 *     gives undefined;
 *   - `a.b` tries the attribute (a method) first, then the item; `a['b']`
 *     tries the item first;
 *   - for loops and macros open a scope: `set` inside them does not leak out
 *     (templates use namespace() for that); if blocks do not.
 * Every value of a render lives in the render's arena, freed at the end. */
#include "template/jinja.h"
#include "template/jinja_render.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define MAX_STEPS 50000000L       /* statements + loop iterations */
#define MAX_DEPTH 200             /* macro call nesting */
#define MAX_RANGE 100000          /* as Jinja's sandbox */
#define MAX_MEMORY (512u << 20)   /* bytes of values a render may hold */

typedef struct jvar {
    const char *name;
    jv *val;
} jvar;

struct jframe {
    jframe *parent;
    jvar *v;
    int n, cap;
};

static _Thread_local int last_raised;

int loom_jinja_last_error_raised(void) { return last_raised; }

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

static jv *lookup(ctx *c, jframe *f, const char *name) {
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->v[i].name, name)) return f->v[i].val;
    for (int i = 0; BUILTINS[i]; i++)
        if (!strcmp(BUILTINS[i], name)) return mk_func(c, JF_BUILTIN, BUILTINS[i], NULL);
    return jv_undef(c->a, name);
}

/* ---- string methods ------------------------------------------------------------ */

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

/* ---- forward declarations ------------------------------------------------------------ */

static jv *eval(ctx *c, const jnode *n, jframe *f);
static int exec(ctx *c, const jnode *n, jframe *f);
static jv *call_value(ctx *c, int line, jv *fn, const args *a);

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
