/* template/jinja_render: what a render shares between the engine's files:
 * the render context, call arguments, and the operations on values that
 * both the evaluator (jinja_eval.c) and the filters and tests
 * (jinja_filters.c) use: access, iteration, membership, operators, string
 * helpers (jinja_ops.c). Not for use outside src/template.
 *
 * Layers, each calling only those below it:
 *   jinja_eval.c     scopes, statements, expressions, calls, methods, globals
 *   jinja_filters.c  the filter and test tables
 *   jinja_ops.c      the operations below
 *   jinja_value.c    values
 * (Compiling is jinja_parse.c over jinja_lex.c; the parser asks
 * jinja_filters.c only which names exist.) Every function here that can
 * fail sets c->st (through rerr) and returns NULL (or 0 / -1 where it
 * returns an int). */
#ifndef LOOM_TEMPLATE_JINJA_RENDER_H
#define LOOM_TEMPLATE_JINJA_RENDER_H

#include <string.h>

#include "template/jinja_int.h"

#define rerr loom_jinja_rerr
#define mk_func loom_jinja_mk_func
#define str_of loom_jinja_str_of
#define strbuf_take loom_jinja_strbuf_take
#define with_safe loom_jinja_with_safe
#define mk_tuple2 loom_jinja_mk_tuple2
#define py_space loom_jinja_py_space
#define cp_back loom_jinja_cp_back
#define memfind loom_jinja_memfind
#define do_strip loom_jinja_do_strip
#define do_case loom_jinja_do_case
#define is_cased loom_jinja_is_cased
#define capitalize loom_jinja_capitalize
#define do_replace loom_jinja_do_replace
#define html_escape loom_jinja_html_escape
#define printf_format loom_jinja_printf_format
#define to_list loom_jinja_to_list
#define dict_items loom_jinja_dict_items
#define contains loom_jinja_contains
#define undef_err loom_jinja_undef_err
#define get_attr loom_jinja_get_attr
#define get_item loom_jinja_get_item
#define do_slice loom_jinja_do_slice
#define num_add loom_jinja_num_add
#define binop loom_jinja_binop
#define cmp_test loom_jinja_cmp_test
#define apply_filter loom_jinja_apply_filter
#define apply_test loom_jinja_apply_test

#define MAX_OUTPUT (256u << 20)   /* bytes a render may produce */

/* The kinds of jfunc. */
enum { JF_BUILTIN, JF_METHOD, JF_MACRO, JF_CALLER, JF_CYCLE };

typedef struct ctx {
    jarena *a;
    loom_buf *out;              /* where output goes now (swapped for captures) */
    jframe *root;           /* render variables */
    loom_status st;
    int raised;
    long steps;
    int depth;
} ctx;

/* The evaluated arguments of a call, filter or test. */
typedef struct args {
    jv **pos;
    int npos;
    const char **kwn;
    jv **kwv;
    int nkw;
} args;

/* Positional i, else keyword name, else NULL. */
static inline jv *arg(const args *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    for (int k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return a->kwv[k];
    return NULL;
}

static inline int arg_bool(const args *a, int i, const char *name, int def) {
    jv *v = arg(a, i, name);
    return v ? jv_truthy(v) : def;
}

/* ---- small helpers --------------------------------------------------------- */

static inline jv *as_gen(jv *l) {
    if (l && l->type == JV_LIST) l->flags |= JVF_ITER;
    return l;
}

static inline int is_safe(const jv *v) { return v->type == JV_STR && (v->flags & JVF_SAFE); }

static inline int str_eq(const jv *v, const char *s) {
    return v->type == JV_STR && v->u.s.n == strlen(s) && !memcmp(v->u.s.p, s, v->u.s.n);
}

/* ---- jinja_ops.c ------------------------------------------------------------ */

/* Sets the render's error ("template line N: ...") unless one is set;
 * returns NULL. */
jv *rerr(ctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

jv *mk_func(ctx *c, int kind, const char *name, jv *self);
jv *str_of(ctx *c, const jv *v);                 /* str(v) */
jv *strbuf_take(ctx *c, loom_buf *b);            /* a string of b; frees b */
/* A string value marked as Markup when `safe` (a copy; values are shared). */
jv *with_safe(ctx *c, jv *v, int safe);
jv *mk_tuple2(ctx *c, jv *a, jv *b);

int py_space(int32_t cp);                        /* Python's str.isspace */
size_t cp_back(const char *s, size_t end);       /* start of the code point before end */
const char *memfind(const char *h, size_t hn, const char *n, size_t nn);
/* strip/lstrip/rstrip: which 1 = left, 2 = right, 3 = both. */
jv *do_strip(ctx *c, const jv *s, const jv *chars, int which);
jv *do_case(ctx *c, const jv *s, int mode);      /* mode: 0 lower, 1 upper */
int is_cased(int32_t cp);
jv *capitalize(ctx *c, const jv *s);
jv *do_replace(ctx *c, const jv *s, const jv *old, const jv *new, int64_t count);
jv *html_escape(ctx *c, const jv *s);
/* printf-style formatting (the `format` filter and str % args). */
jv *printf_format(ctx *c, int line, const jv *fmt, jv **vals, int nvals, int mapping_like);

/* An iterable as a list of items (dict: keys; str: characters). */
jv *to_list(ctx *c, int line, jv *v);
jv *dict_items(ctx *c, const jv *d);
/* `item in container` into *res; 0 on error. */
int contains(ctx *c, int line, const jv *container, const jv *item, int *res);

jv *undef_err(ctx *c, int line, const jv *obj);
jv *get_attr(ctx *c, int line, jv *obj, const char *name);   /* a.b */
jv *get_item(ctx *c, int line, jv *obj, jv *key);            /* a[b] */
jv *do_slice(ctx *c, int line, jv *obj, jv *lo, jv *hi, jv *st);

jv *num_add(ctx *c, int line, jv *x, jv *y);     /* x + y */
jv *binop(ctx *c, int line, int op, jv *x, jv *y);
/* A comparison (OP_EQ ... OP_GE) of v and other: 1, 0, or -1 on error. */
int cmp_test(ctx *c, int line, jv *v, jv *other, int op);

/* ---- jinja_filters.c ---------------------------------------------------------- */

/* `v | name(a)`; unknown names fail at render time too (map('name')). */
jv *apply_filter(ctx *c, int line, const char *name, jv *v, const args *a);
/* `v is name(a)`: 1, 0, or -1 on error. */
int apply_test(ctx *c, int line, const char *name, jv *v, const args *a);

#endif
