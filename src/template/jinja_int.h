/* template/jinja_int: shared internals of the Jinja engine: the arena, the
 * value model, the AST. Not for use outside src/template.
 *
 * Design notes
 *   1. A compiled template owns one arena holding its AST and constants.
 *      Rendering never writes to it, so one template may be rendered by many
 *      threads at once.
 *   2. A render owns a second arena holding every value it makes (the parsed
 *      variables included); values are never freed one by one, the arena is
 *      dropped when the render returns. Only the output buffer outlives it.
 *   3. Values are shared by pointer, as Python objects are: a list appended
 *      to through one name is seen through every other. Strings, numbers and
 *      the None/True/False/Undefined statics are never written after
 *      creation; constructors hand out a thread-local scratch value on
 *      allocation failure so that nothing shared is ever written.
 *   4. Every limit that keeps hostile input from exhausting the stack or
 *      memory is enforced where the resource is spent: parser nesting
 *      (jinja_parse.c), value depth (jinja_value.c), steps, output, memory
 *      and macro depth (jinja_eval.c; the output limit also in jinja_ops.c). */
#ifndef LOOM_TEMPLATE_JINJA_INT_H
#define LOOM_TEMPLATE_JINJA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/buf.h"

/* Internal helpers shared between the engine's files; the macros give them
 * loom_jinja_ link names so the library exports nothing unprefixed. */
#define jar_alloc loom_jinja_jar_alloc
#define jar_strdup loom_jinja_jar_strdup
#define jar_free loom_jinja_jar_free
#define jv_undef_static loom_jinja_jv_undef_static
#define jv_none_static loom_jinja_jv_none_static
#define jv_true_static loom_jinja_jv_true_static
#define jv_false_static loom_jinja_jv_false_static
#define jv_new loom_jinja_jv_new
#define jv_oom loom_jinja_jv_oom
#define jv_str loom_jinja_jv_str
#define jv_strz loom_jinja_jv_strz
#define jv_str_borrow loom_jinja_jv_str_borrow
#define jv_int loom_jinja_jv_int
#define jv_float loom_jinja_jv_float
#define jv_bool loom_jinja_jv_bool
#define jv_undef loom_jinja_jv_undef
#define jv_list loom_jinja_jv_list
#define jv_dict loom_jinja_jv_dict
#define jv_list_push loom_jinja_jv_list_push
#define jv_dict_get loom_jinja_jv_dict_get
#define jv_dict_gets loom_jinja_jv_dict_gets
#define jv_dict_set loom_jinja_jv_dict_set
#define jv_truthy loom_jinja_jv_truthy
#define jv_equal loom_jinja_jv_equal
#define jv_compare loom_jinja_jv_compare
#define jv_type_name loom_jinja_jv_type_name
#define jv_to_str loom_jinja_jv_to_str
#define jv_repr loom_jinja_jv_repr
#define jv_fmt_float loom_jinja_jv_fmt_float
#define jv_to_json loom_jinja_jv_to_json
#define jv_parse_json loom_jinja_jv_parse_json
#define ju_decode loom_jinja_ju_decode
#define ju_encode loom_jinja_ju_encode
#define ju_count loom_jinja_ju_count
#define jinja_parse loom_jinja_jinja_parse
#define jinja_filter_known loom_jinja_jinja_filter_known
#define jinja_test_known loom_jinja_jinja_test_known


/* ---- arena: everything a compile or a render allocates lives in one ---- */

typedef struct jarena_block jarena_block;
typedef struct jarena {
    jarena_block *head;   /* owned chain of blocks, newest first */
    size_t used;          /* bytes held in blocks */
    size_t limit;         /* 0 = none; past it allocations fail */
    int failed;           /* set once an allocation failed */
} jarena;

void *jar_alloc(jarena *a, size_t n);            /* zeroed; NULL on OOM */
char *jar_strdup(jarena *a, const char *s, size_t n); /* NUL-terminated */
void jar_free(jarena *a);

/* Output and scratch strings are loom_bufs (heap, not arena: the render
 * output outlives the arena). */

/* ---- values -------------------------------------------------------------- */

enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_FUNC,
};
/* flags */
enum {
    JVF_TUPLE = 1,     /* a list that prints as (a, b) */
    JVF_NS = 2,        /* a namespace(): a dict whose attributes may be set */
    JVF_ITER = 4,      /* a list standing for a Python generator (what select,
                          map, unique... return): always truthy, no len(),
                          not JSON, emptied once iterated */
    JVF_SAFE = 8,      /* a string that is Markup (|safe, |e): `+` escapes the
                          plain-string side */
};

typedef struct jv jv;
typedef struct jnode jnode;
typedef struct jframe jframe;

/* Built-in callables and bound methods. */
typedef struct jfunc {
    int kind;              /* JF_* in jinja_render.h */
    const char *name;      /* builtin / method name */
    jv *self;              /* bound object for methods */
    const jnode *macro;    /* macro or caller definition */
    jframe *closure;       /* scope a macro/caller was defined in */
} jfunc;

struct jv {
    int type;
    int flags;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;   /* UTF-8, NUL-terminated */
        struct { jv **v; size_t n, cap; } l;
        struct { jv **k; jv **v; size_t n, cap; } d;
        jfunc *fn;
    } u;
    const char *uname;     /* for undefined: the name that was missing */
};

extern jv jv_undef_static, jv_none_static, jv_true_static, jv_false_static;

/* Numbers: bool, int and float all count, as in Python. */
static inline int is_num(const jv *v) {
    return v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT;
}
static inline int is_intlike(const jv *v) { return v->type == JV_BOOL || v->type == JV_INT; }
static inline double numf(const jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : v->u.b;
}
static inline int64_t numi(const jv *v) {
    return v->type == JV_INT ? v->u.i : v->type == JV_BOOL ? v->u.b : (int64_t)v->u.f;
}

jv *jv_new(jarena *a, int type);
jv *jv_oom(void);   /* scratch None handed out when an allocation fails */
jv *jv_str(jarena *a, const char *p, size_t n);   /* copies */
jv *jv_strz(jarena *a, const char *p);
jv *jv_str_borrow(jarena *a, const char *p, size_t n); /* p must outlive */
jv *jv_int(jarena *a, int64_t i);
jv *jv_float(jarena *a, double f);
jv *jv_bool(int b);
jv *jv_undef(jarena *a, const char *name);
jv *jv_list(jarena *a, size_t cap);
jv *jv_dict(jarena *a);
void jv_list_push(jarena *a, jv *l, jv *x);
jv *jv_dict_get(const jv *d, const jv *key);
jv *jv_dict_gets(const jv *d, const char *key);
void jv_dict_set(jarena *a, jv *d, jv *key, jv *val);

int jv_truthy(const jv *v);
int jv_equal(const jv *a, const jv *b);
/* Three-way compare; sets *ok = 0 when Python would raise TypeError. */
int jv_compare(const jv *a, const jv *b, int *ok);
const char *jv_type_name(const jv *v);

/* str(v) and repr(v) as Python prints them. */
void jv_to_str(loom_buf *b, const jv *v);
void jv_repr(loom_buf *b, const jv *v);
void jv_fmt_float(loom_buf *b, double f);
/* json.dumps; returns 0 if a value is not serialisable (undefined, func). */
typedef struct jjson_opts {
    const char *indent;      /* NULL: single line */
    const char *item_sep;    /* ", " or "," */
    const char *key_sep;     /* ": " */
    int sort_keys;
    int ensure_ascii;
} jjson_opts;
int jv_to_json(loom_buf *b, const jv *v, const jjson_opts *o, int depth);

/* Parses JSON text into values; NULL with *err set on bad input. */
jv *jv_parse_json(jarena *a, const char *s, size_t n, const char **err);

/* UTF-8 helpers. */
size_t ju_decode(const char *s, size_t n, size_t i, int32_t *cp);
void ju_encode(loom_buf *b, int32_t cp);
size_t ju_count(const char *s, size_t n);

/* ---- AST ----------------------------------------------------------------- */

enum {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO,
    N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_WITH, N_DO,
    /* expressions */
    E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND, E_LIST, E_TUPLE,
    E_DICT, E_BODYVAL,
};

struct jnode {
    int kind;
    int line;
    int op;                 /* operator code (E_BIN/E_CMP), negation (E_TEST) */
    const char *name;       /* E_NAME, E_ATTR attribute, filter/test/macro */
    jv *val;                /* E_CONST, N_TEXT */
    jnode *a, *b, *c, *d;   /* children, meaning per kind */
    jnode **items;          /* body statements, args, list items */
    int n;
    const char **kwn;       /* keyword argument names */
    jnode **kwv;            /* keyword argument values (or param defaults) */
    int nkw;
    int height;             /* operator-chain height (parser's depth bound) */
};

/* N_MACRO op bits: the body reads varargs / kwargs, so extra positional /
 * keyword arguments are accepted. */
enum { MACRO_VARARGS = 1, MACRO_KWARGS = 2 };

/* Binary operator codes for E_BIN and E_CMP. */
enum {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
};

struct loom_jinja_template {
    jarena arena;           /* owns every node and constant */
    jnode *root;            /* N_BODY */
};

/* Parser entry (jinja_parse.c). */
loom_status jinja_parse(jarena *a, const char *src, size_t len, jnode **out);

/* Whether a filter / test name exists in Jinja (jinja_filters.c); the parser
 * rejects unknown names at compile time, as Jinja does. */
int jinja_filter_known(const char *name);
int jinja_test_known(const char *name);

#endif
