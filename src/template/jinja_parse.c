/* template/jinja_parse: the parser of the Jinja engine: the tokens of
 * jinja_lex.c to the AST of jinja_int.h, in the template's arena. */
#include "template/jinja_lex.h"

#include <stdlib.h>
#include <string.h>

typedef struct parser {
    jarena *a;
    tok *t;             /* the lexer's tokens, the last one T_EOF */
    size_t nt, pos;
    int loop_depth;
    int depth;          /* nesting of expressions and blocks, bounded so that
                           hostile input cannot exhaust the stack */
    loom_status st;
} parser;

#define MAX_NESTING 256

#define perr(p, line, ...) jinja_syntax_err(&(p)->st, (line), __VA_ARGS__)

/* ---- parser helpers ---------------------------------------------------------- */

static tok *cur(parser *p) { return &p->t[p->pos]; }
static tok *peek_at(parser *p, size_t k) {
    return p->pos + k < p->nt ? &p->t[p->pos + k] : &p->t[p->nt - 1];
}
static void adv(parser *p) {
    if (p->pos + 1 < p->nt) p->pos++;
}

static int tok_is_op(const tok *t, const char *op) {
    return t->type == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int tok_is_name(const tok *t, const char *name) {
    return t->type == T_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}

static const char *tok_desc(parser *p, const tok *t) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_TEXT: return "template text";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_STRING: return "string literal";
    case T_INT: return "integer literal";
    case T_FLOAT: return "float literal";
    default: {
        char *s = jar_alloc(p->a, t->n + 3);
        if (!s) return "token";
        s[0] = '\'';
        memcpy(s + 1, t->s, t->n);
        s[t->n + 1] = '\'';
        return s;
    }
    }
}

static int expect_op(parser *p, const char *op) {
    if (tok_is_op(cur(p), op)) {
        adv(p);
        return 1;
    }
    perr(p, cur(p)->line, "expected '%s', found %s", op, tok_desc(p, cur(p)));
    return 0;
}

static int expect_type(parser *p, int type, const char *what) {
    if (cur(p)->type == type) {
        adv(p);
        return 1;
    }
    perr(p, cur(p)->line, "expected %s, found %s", what, tok_desc(p, cur(p)));
    return 0;
}

static const char *tok_name(parser *p, const tok *t) {
    return jar_strdup(p->a, t->s, t->n);
}

static jnode *mk(parser *p, int kind, int line) {
    jnode *n = jar_alloc(p->a, sizeof *n);
    if (!n) {
        p->st = loom_err(LOOM_ERR_NOMEM, "template: out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    return n;
}

/* Growable node list used while parsing. */
typedef struct nlist {
    jnode **v;
    int n, cap;
} nlist;

static void nl_push(parser *p, nlist *l, jnode *x) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        jnode **nv = jar_alloc(p->a, (size_t)cap * sizeof *nv);
        if (!nv) {
            p->st = loom_err(LOOM_ERR_NOMEM, "template: out of memory");
            return;
        }
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

/* ---- expressions ------------------------------------------------------------------- */

static jnode *parse_expr(parser *p);
static jnode *parse_or(parser *p);
static jnode *parse_unary(parser *p, int with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *n);
static jnode *parse_filter_expr(parser *p, jnode *n);

/* Parses call arguments after '(' up to and including ')'. */
static int parse_args(parser *p, jnode *call) {
    nlist args = {0}, kwv = {0};
    const char **kwn = NULL;
    int nkwn = 0, capkw = 0;
    while (!tok_is_op(cur(p), ")")) {
        if (args.n || nkwn) {
            if (!expect_op(p, ",")) return 0;
            if (tok_is_op(cur(p), ")")) break;
        }
        if (cur(p)->type == T_NAME && tok_is_op(peek_at(p, 1), "=")) {
            if (nkwn == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                const char **nk = jar_alloc(p->a, (size_t)capkw * sizeof *nk);
                if (!nk) return 0;
                if (nkwn) memcpy(nk, kwn, (size_t)nkwn * sizeof *nk);
                kwn = nk;
            }
            kwn[nkwn++] = tok_name(p, cur(p));
            adv(p);
            adv(p);
            jnode *v = parse_expr(p);
            if (!v) return 0;
            nl_push(p, &kwv, v);
        } else {
            if (tok_is_op(cur(p), "*") || tok_is_op(cur(p), "**"))
                return perr(p, cur(p)->line, "*args and **kwargs in calls are not supported"), 0;
            jnode *v = parse_expr(p);
            if (!v) return 0;
            if (nkwn)
                return perr(p, v->line, "positional argument follows keyword argument"), 0;
            nl_push(p, &args, v);
        }
        if (p->st) return 0;
    }
    adv(p);
    call->items = args.v;
    call->n = args.n;
    call->kwn = kwn;
    call->kwv = kwv.v;
    call->nkw = nkwn;
    return 1;
}

/* Parses a possibly dotted name (filters and tests may be "a.b"). */
static const char *parse_dotted(parser *p) {
    if (cur(p)->type != T_NAME) {
        perr(p, cur(p)->line, "expected a name, found %s", tok_desc(p, cur(p)));
        return NULL;
    }
    loom_buf b = {0};
    loom_buf_put(&b, cur(p)->s, cur(p)->n);
    adv(p);
    while (tok_is_op(cur(p), ".") && peek_at(p, 1)->type == T_NAME) {
        adv(p);
        loom_buf_putc(&b, '.');
        loom_buf_put(&b, cur(p)->s, cur(p)->n);
        adv(p);
    }
    const char *r = jar_strdup(p->a, b.p ? b.p : "", b.len);
    free(b.p);
    return r;
}

/* Parses a comma-separated sequence; a bare comma makes a tuple. */
static jnode *parse_tuple(parser *p, int with_condexpr, int explicit_parens) {
    int line = cur(p)->line;
    nlist items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) {
            if (!tok_is_op(cur(p), ",")) break;
            adv(p);
            is_tuple = 1;
        }
        tok *t = cur(p);
        /* end of the sequence after a trailing comma */
        if (items.n && (t->type == T_BLOCK_END || t->type == T_VAR_END ||
                        tok_is_op(t, ")") || tok_is_name(t, "in") ||
                        tok_is_op(t, "=")))
            break;
        jnode *e = with_condexpr ? parse_expr(p) : parse_or(p);
        if (!e) return NULL;
        nl_push(p, &items, e);
        if (p->st) return NULL;
    }
    if (!is_tuple) {
        if (!items.n) {
            if (explicit_parens) {
                jnode *n = mk(p, E_TUPLE, line);
                return n;
            }
            perr(p, line, "expected an expression, found %s", tok_desc(p, cur(p)));
            return NULL;
        }
        return items.v[0];
    }
    jnode *n = mk(p, E_TUPLE, line);
    if (!n) return NULL;
    n->items = items.v;
    n->n = items.n;
    return n;
}

static jnode *parse_primary(parser *p) {
    tok *t = cur(p);
    jnode *n;
    switch (t->type) {
    case T_NAME:
        if (tok_is_name(t, "true") || tok_is_name(t, "True") ||
            tok_is_name(t, "false") || tok_is_name(t, "False")) {
            n = mk(p, E_CONST, t->line);
            if (n) n->val = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            n = mk(p, E_CONST, t->line);
            if (n) n->val = &jv_none_static;
        } else {
            n = mk(p, E_NAME, t->line);
            if (n) n->name = tok_name(p, t);
        }
        adv(p);
        return n;
    case T_STRING: {
        loom_buf b = {0};
        int line = t->line;
        while (cur(p)->type == T_STRING) {
            loom_buf_put(&b, cur(p)->s, cur(p)->n);
            adv(p);
        }
        n = mk(p, E_CONST, line);
        if (n) n->val = jv_str(p->a, b.p ? b.p : "", b.len);
        free(b.p);
        return n;
    }
    case T_INT:
        n = mk(p, E_CONST, t->line);
        if (n) n->val = jv_int(p->a, t->i);
        adv(p);
        return n;
    case T_FLOAT:
        n = mk(p, E_CONST, t->line);
        if (n) n->val = jv_float(p->a, t->f);
        adv(p);
        return n;
    case T_OP:
        if (tok_is_op(t, "(")) {
            adv(p);
            if (tok_is_op(cur(p), ")")) {
                adv(p);
                return mk(p, E_TUPLE, t->line);
            }
            n = parse_tuple(p, 1, 1);
            if (!n || !expect_op(p, ")")) return NULL;
            return n;
        }
        if (tok_is_op(t, "[")) {
            int line = t->line;
            adv(p);
            nlist items = {0};
            while (!tok_is_op(cur(p), "]")) {
                if (items.n && !expect_op(p, ",")) return NULL;
                if (tok_is_op(cur(p), "]")) break;
                jnode *e = parse_expr(p);
                if (!e) return NULL;
                nl_push(p, &items, e);
            }
            adv(p);
            n = mk(p, E_LIST, line);
            if (n) {
                n->items = items.v;
                n->n = items.n;
            }
            return n;
        }
        if (tok_is_op(t, "{")) {
            int line = t->line;
            adv(p);
            nlist keys = {0}, vals = {0};
            while (!tok_is_op(cur(p), "}")) {
                if (keys.n && !expect_op(p, ",")) return NULL;
                if (tok_is_op(cur(p), "}")) break;
                jnode *k = parse_expr(p);
                if (!k || !expect_op(p, ":")) return NULL;
                jnode *v = parse_expr(p);
                if (!v) return NULL;
                nl_push(p, &keys, k);
                nl_push(p, &vals, v);
            }
            adv(p);
            n = mk(p, E_DICT, line);
            if (n) {
                n->items = keys.v;
                n->kwv = vals.v;
                n->n = keys.n;
            }
            return n;
        }
        break;
    default: break;
    }
    perr(p, t->line, "unexpected %s", tok_desc(p, t));
    return NULL;
}

static jnode *parse_subscript(parser *p, jnode *obj) {
    int line = cur(p)->line;
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0, slice = 0;
    for (;;) {
        if (tok_is_op(cur(p), ":")) {
            slice = 1;
            if (++k > 2) return perr(p, line, "bad slice"), NULL;
            adv(p);
            continue;
        }
        if (tok_is_op(cur(p), "]")) break;
        if (parts[k]) return perr(p, line, "expected ']', found %s", tok_desc(p, cur(p))), NULL;
        parts[k] = parse_expr(p);
        if (!parts[k]) return NULL;
    }
    adv(p);
    jnode *n;
    if (slice) {
        n = mk(p, E_SLICE, line);
        if (!n) return NULL;
        n->a = obj;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    } else {
        /* x[] is x[()] in Jinja */
        if (!parts[0] && !(parts[0] = mk(p, E_TUPLE, line))) return NULL;
        n = mk(p, E_ITEM, line);
        if (!n) return NULL;
        n->a = obj;
        n->b = parts[0];
    }
    return n;
}

static jnode *parse_postfix(parser *p, jnode *n) {
    for (int links = 0; n && p->st == LOOM_OK; links++) {
        if (links > MAX_NESTING)
            return perr(p, cur(p)->line, "expression nested too deeply"), NULL;
        tok *t = cur(p);
        if (tok_is_op(t, ".")) {
            adv(p);
            tok *a = cur(p);
            if (a->type == T_NAME) {
                jnode *x = mk(p, E_ATTR, a->line);
                if (!x) return NULL;
                x->a = n;
                x->name = tok_name(p, a);
                adv(p);
                n = x;
            } else if (a->type == T_INT) {
                jnode *x = mk(p, E_ITEM, a->line);
                jnode *k = mk(p, E_CONST, a->line);
                if (!x || !k) return NULL;
                k->val = jv_int(p->a, a->i);
                x->a = n;
                x->b = k;
                adv(p);
                n = x;
            } else {
                return perr(p, a->line, "expected attribute name after '.', found %s",
                            tok_desc(p, a)), NULL;
            }
        } else if (tok_is_op(t, "[")) {
            adv(p);
            n = parse_subscript(p, n);
        } else if (tok_is_op(t, "(")) {
            adv(p);
            jnode *c = mk(p, E_CALL, t->line);
            if (!c) return NULL;
            c->a = n;
            if (!parse_args(p, c)) return NULL;
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static int starts_primary(const tok *t) {
    if (t->type == T_NAME)
        return !tok_is_name(t, "else") && !tok_is_name(t, "or") && !tok_is_name(t, "and");
    return t->type == T_STRING || t->type == T_INT || t->type == T_FLOAT ||
           tok_is_op(t, "(") || tok_is_op(t, "[") || tok_is_op(t, "{");
}

static jnode *parse_filter_expr(parser *p, jnode *n) {
    for (int links = 0; n && p->st == LOOM_OK; links++) {
        if (links > MAX_NESTING)
            return perr(p, cur(p)->line, "expression nested too deeply"), NULL;
        tok *t = cur(p);
        if (tok_is_op(t, "|")) {
            adv(p);
            jnode *f = mk(p, E_FILTER, cur(p)->line);
            if (!f) return NULL;
            f->name = parse_dotted(p);
            if (!f->name) return NULL;
            f->a = n;
            if (tok_is_op(cur(p), "(")) {
                adv(p);
                if (!parse_args(p, f)) return NULL;
            }
            n = f;
        } else if (tok_is_name(t, "is")) {
            adv(p);
            jnode *x = mk(p, E_TEST, t->line);
            if (!x) return NULL;
            if (tok_is_name(cur(p), "not")) {
                x->op = 1;
                adv(p);
            }
            x->name = parse_dotted(p);
            if (!x->name) return NULL;
            x->a = n;
            if (tok_is_op(cur(p), "(")) {
                adv(p);
                if (!parse_args(p, x)) return NULL;
            } else if (starts_primary(cur(p))) {
                if (tok_is_name(cur(p), "is"))
                    return perr(p, cur(p)->line, "cannot chain tests with 'is'"), NULL;
                jnode *arg = parse_postfix(p, parse_primary(p));
                if (!arg) return NULL;
                x->items = jar_alloc(p->a, sizeof(jnode *));
                if (!x->items) return NULL;
                x->items[0] = arg;
                x->n = 1;
            }
            n = x;
        } else {
            break;
        }
    }
    return n;
}

/* Enters one more level of nesting; past MAX_NESTING reports and fails
 * (the recursion must stay well inside the stack). */
static int nest(parser *p, int line, const char *what) {
    if (++p->depth <= MAX_NESTING) return 1;
    perr(p, line, "%s nested too deeply", what);
    return 0;
}

static jnode *parse_unary_inner(parser *p, int with_filter);

static jnode *parse_unary(parser *p, int with_filter) {
    if (!nest(p, cur(p)->line, "expression")) return NULL;
    jnode *n = parse_unary_inner(p, with_filter);
    p->depth--;
    return n;
}

static jnode *parse_unary_inner(parser *p, int with_filter) {
    tok *t = cur(p);
    jnode *n;
    if (tok_is_op(t, "-") || tok_is_op(t, "+")) {
        adv(p);
        n = mk(p, t->s[0] == '-' ? E_NEG : E_POS, t->line);
        if (!n) return NULL;
        n->a = parse_unary(p, 0);
        if (!n->a) return NULL;
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    return n;
}

/* Height of an operator chain, so that `1 + 1 + ... + 1` cannot build a
 * tree too deep to evaluate. */
static int chain_height(const jnode *n) { return n->height; }

static jnode *mk_bin(parser *p, int kind, int op, jnode *a, jnode *b, int line) {
    if (!a || !b) return NULL;
    int h = 1 + LOOM_MAX(chain_height(a), chain_height(b));
    if (h > 4 * MAX_NESTING) {
        perr(p, line, "expression too long: more than %d operators in a chain", 4 * MAX_NESTING);
        return NULL;
    }
    jnode *n = mk(p, kind, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    n->height = h;
    return n;
}

static jnode *parse_pow(parser *p) {
    jnode *l = parse_unary(p, 1);
    while (l && tok_is_op(cur(p), "**")) {
        int line = cur(p)->line;
        adv(p);
        l = mk_bin(p, E_BIN, OP_POW, l, parse_unary(p, 1), line);
    }
    return l;
}

static jnode *parse_math2(parser *p) {
    jnode *l = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = tok_is_op(t, "*") ? OP_MUL : tok_is_op(t, "/") ? OP_DIV
               : tok_is_op(t, "//") ? OP_FDIV : tok_is_op(t, "%") ? OP_MOD : 0;
        if (!op || !l) return l;
        adv(p);
        l = mk_bin(p, E_BIN, op, l, parse_pow(p), t->line);
    }
}

static jnode *parse_concat(parser *p) {
    jnode *l = parse_math2(p);
    while (l && tok_is_op(cur(p), "~")) {
        int line = cur(p)->line;
        adv(p);
        l = mk_bin(p, E_BIN, OP_CAT, l, parse_math2(p), line);
    }
    return l;
}

static jnode *parse_math1(parser *p) {
    jnode *l = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = tok_is_op(t, "+") ? OP_ADD : tok_is_op(t, "-") ? OP_SUB : 0;
        if (!op || !l) return l;
        adv(p);
        l = mk_bin(p, E_BIN, op, l, parse_concat(p), t->line);
    }
}

static jnode *parse_compare(parser *p) {
    jnode *l = parse_math1(p);
    int chained = 0;
    for (;;) {
        tok *t = cur(p);
        int op = 0;
        if (tok_is_op(t, "==")) op = OP_EQ;
        else if (tok_is_op(t, "!=")) op = OP_NE;
        else if (tok_is_op(t, "<")) op = OP_LT;
        else if (tok_is_op(t, "<=")) op = OP_LE;
        else if (tok_is_op(t, ">")) op = OP_GT;
        else if (tok_is_op(t, ">=")) op = OP_GE;
        else if (tok_is_name(t, "in")) op = OP_IN;
        else if (tok_is_name(t, "not") && tok_is_name(peek_at(p, 1), "in")) {
            op = OP_NOTIN;
            adv(p);
        }
        if (!op || !l) return l;
        adv(p);
        jnode *r = parse_math1(p);
        if (l->kind == E_CMP && chained) {
            /* a < b < c means (a < b) and (b < c), as in Python */
            jnode *rhs = mk_bin(p, E_CMP, op, l->b, r, t->line);
            l = mk_bin(p, E_AND, 0, l, rhs, t->line);
        } else if (l->kind == E_AND && chained) {
            jnode *rhs = mk_bin(p, E_CMP, op, l->b->b, r, t->line);
            l = mk_bin(p, E_AND, 0, l, rhs, t->line);
        } else {
            l = mk_bin(p, E_CMP, op, l, r, t->line);
        }
        chained = 1;
    }
}

static jnode *parse_not(parser *p) {
    if (tok_is_name(cur(p), "not")) {
        int line = cur(p)->line;
        adv(p);
        jnode *n = mk(p, E_NOT, line);
        if (!n) return NULL;
        if (!nest(p, line, "expression")) return NULL;
        n->a = parse_not(p);
        p->depth--;
        return n->a ? n : NULL;
    }
    return parse_compare(p);
}

static jnode *parse_and(parser *p) {
    jnode *l = parse_not(p);
    while (l && tok_is_name(cur(p), "and")) {
        int line = cur(p)->line;
        adv(p);
        l = mk_bin(p, E_AND, 0, l, parse_not(p), line);
    }
    return l;
}

static jnode *parse_or(parser *p) {
    jnode *l = parse_and(p);
    while (l && tok_is_name(cur(p), "or")) {
        int line = cur(p)->line;
        adv(p);
        l = mk_bin(p, E_OR, 0, l, parse_and(p), line);
    }
    return l;
}

static jnode *parse_expr_inner(parser *p);

static jnode *parse_expr(parser *p) {
    if (!nest(p, cur(p)->line, "expression")) return NULL;
    jnode *n = parse_expr_inner(p);
    p->depth--;
    return n;
}

static jnode *parse_expr_inner(parser *p) {
    jnode *e = parse_or(p);
    while (e && tok_is_name(cur(p), "if")) {
        int line = cur(p)->line;
        adv(p);
        jnode *c = mk(p, E_COND, line);
        if (!c) return NULL;
        c->a = parse_or(p);           /* condition */
        c->b = e;                     /* value if true */
        if (!c->a) return NULL;
        if (tok_is_name(cur(p), "else")) {
            adv(p);
            c->c = parse_expr(p);
            if (!c->c) return NULL;
        }
        e = c;
    }
    return e;
}

/* ---- statements ------------------------------------------------------------------------ */

static jnode *parse_body(parser *p, const char *const *ends, const char *opener,
                         int open_line);

/* Assignment target: name, ns.attr, or a tuple of names. */
static jnode *parse_target(parser *p, int allow_attr) {
    int line = cur(p)->line;
    int paren = 0;
    if (tok_is_op(cur(p), "(")) {
        paren = 1;
        adv(p);
    }
    nlist names = {0};
    for (;;) {
        tok *t = cur(p);
        if (t->type != T_NAME)
            return perr(p, t->line, "expected a variable name, found %s", tok_desc(p, t)), NULL;
        jnode *n = mk(p, E_NAME, t->line);
        if (!n) return NULL;
        n->name = tok_name(p, t);
        adv(p);
        if (allow_attr && !paren && !names.n && tok_is_op(cur(p), ".")) {
            adv(p);
            if (cur(p)->type != T_NAME)
                return perr(p, cur(p)->line, "expected attribute name, found %s",
                            tok_desc(p, cur(p))), NULL;
            jnode *x = mk(p, E_ATTR, line);
            if (!x) return NULL;
            x->a = n;
            x->name = tok_name(p, cur(p));
            adv(p);
            return x;
        }
        nl_push(p, &names, n);
        if (!tok_is_op(cur(p), ",")) break;
        adv(p);
        if (paren && tok_is_op(cur(p), ")")) break;
    }
    if (paren && !expect_op(p, ")")) return NULL;
    if (names.n == 1 && !paren) return names.v[0];
    jnode *tu = mk(p, E_TUPLE, line);
    if (!tu) return NULL;
    tu->items = names.v;
    tu->n = names.n;
    return tu;
}

static int end_block(parser *p) { return expect_type(p, T_BLOCK_END, "'%}'"); }

/* After parse_body stopped at an end keyword: consume "{% endX %}". */
static int close_block(parser *p) {
    adv(p); /* keyword */
    return end_block(p);
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};

static jnode *parse_if(parser *p, int line) {
    jnode *n = mk(p, N_IF, line);
    if (!n) return NULL;
    n->a = parse_tuple(p, 0, 0);
    if (!n->a || !end_block(p)) return NULL;
    n->b = parse_body(p, END_IF, "if", line);
    if (!n->b) return NULL;
    tok *t = cur(p);
    if (tok_is_name(t, "elif")) {
        adv(p);
        n->c = parse_if(p, t->line);
        return n->c ? n : NULL;
    }
    if (tok_is_name(t, "else")) {
        adv(p);
        if (!end_block(p)) return NULL;
        static const char *const e[] = {"endif", NULL};
        n->c = parse_body(p, e, "if", line);
        if (!n->c) return NULL;
    }
    return close_block(p) ? n : NULL;
}

static jnode *parse_for(parser *p, int line) {
    jnode *n = mk(p, N_FOR, line);
    if (!n) return NULL;
    n->d = parse_target(p, 0);
    if (!n->d) return NULL;
    if (!tok_is_name(cur(p), "in"))
        return perr(p, cur(p)->line, "expected 'in', found %s", tok_desc(p, cur(p))), NULL;
    adv(p);
    n->a = parse_tuple(p, 0, 0);
    if (!n->a) return NULL;
    if (tok_is_name(cur(p), "if")) {
        adv(p);
        n->c = parse_expr(p);
        if (!n->c) return NULL;
    }
    if (tok_is_name(cur(p), "recursive"))
        return perr(p, cur(p)->line, "recursive for loops are not supported"), NULL;
    if (!end_block(p)) return NULL;
    p->loop_depth++;
    n->b = parse_body(p, END_FOR, "for", line);
    p->loop_depth--;
    if (!n->b) return NULL;
    if (tok_is_name(cur(p), "else")) {
        adv(p);
        if (!end_block(p)) return NULL;
        static const char *const e[] = {"endfor", NULL};
        /* the else body runs outside the loop */
        int saved = p->loop_depth;
        p->loop_depth = 0;
        jnode *els = parse_body(p, e, "for", line);
        p->loop_depth = saved;
        if (!els) return NULL;
        n->items = jar_alloc(p->a, sizeof(jnode *));
        if (!n->items) return NULL;
        n->items[0] = els;
        n->n = 1;
    }
    return close_block(p) ? n : NULL;
}

/* Filter chain for {% filter %} and {% set x | f %}: input is E_BODYVAL. */
static jnode *parse_filter_chain(parser *p, int line) {
    jnode *n = mk(p, E_BODYVAL, line);
    if (!n) return NULL;
    do {
        jnode *f = mk(p, E_FILTER, cur(p)->line);
        if (!f) return NULL;
        f->name = parse_dotted(p);
        if (!f->name) return NULL;
        f->a = n;
        if (tok_is_op(cur(p), "(")) {
            adv(p);
            if (!parse_args(p, f)) return NULL;
        }
        n = f;
    } while (tok_is_op(cur(p), "|") && (adv(p), 1));
    return n;
}

static jnode *parse_set(parser *p, int line) {
    jnode *target = parse_target(p, 1);
    if (!target) return NULL;
    if (tok_is_op(cur(p), "=")) {
        adv(p);
        jnode *n = mk(p, N_SET, line);
        if (!n) return NULL;
        n->a = target;
        n->b = parse_tuple(p, 1, 0);
        if (!n->b || !end_block(p)) return NULL;
        return n;
    }
    if (target->kind != E_NAME)
        return perr(p, line, "block set needs a plain variable name"), NULL;
    jnode *n = mk(p, N_SETBLOCK, line);
    if (!n) return NULL;
    n->a = target;
    if (tok_is_op(cur(p), "|")) {
        adv(p);
        n->c = parse_filter_chain(p, line);
        if (!n->c) return NULL;
    }
    if (!end_block(p)) return NULL;
    static const char *const e[] = {"endset", NULL};
    n->b = parse_body(p, e, "set", line);
    if (!n->b) return NULL;
    return close_block(p) ? n : NULL;
}

/* Macro / caller parameter list after '(' through ')'. Names in name list,
 * defaults in kwv (NULL where none). */
static int parse_params(parser *p, jnode *n) {
    nlist names = {0}, defs = {0};
    while (!tok_is_op(cur(p), ")")) {
        if (names.n && !expect_op(p, ",")) return 0;
        if (tok_is_op(cur(p), ")")) break;
        tok *t = cur(p);
        if (t->type != T_NAME)
            return perr(p, t->line, "expected parameter name, found %s", tok_desc(p, t)), 0;
        jnode *nm = mk(p, E_NAME, t->line);
        if (!nm) return 0;
        nm->name = tok_name(p, t);
        adv(p);
        jnode *d = NULL;
        if (tok_is_op(cur(p), "=")) {
            adv(p);
            d = parse_expr(p);
            if (!d) return 0;
        } else if (defs.n && defs.v[defs.n - 1]) {
            return perr(p, t->line, "non-default parameter follows default parameter"), 0;
        }
        nl_push(p, &names, nm);
        nl_push(p, &defs, d);
        if (p->st) return 0;
    }
    adv(p);
    n->items = names.v;
    n->kwv = defs.v;
    n->n = names.n;
    return 1;
}

/* Whether the subtree reads variable `name` (Jinja lets a macro take extra
 * positional or keyword arguments only when its body uses varargs/kwargs). */
static int mentions(const jnode *n, const char *name) {
    if (!n) return 0;
    if (n->kind == E_NAME && !strcmp(n->name, name)) return 1;
    if (mentions(n->a, name) || mentions(n->b, name) || mentions(n->c, name) ||
        mentions(n->d, name))
        return 1;
    for (int i = 0; n->items && i < n->n; i++)
        if (mentions(n->items[i], name)) return 1;
    int nk = n->kind == E_DICT || n->kind == N_MACRO || n->kind == N_WITH ||
                     n->kind == N_CALLBLOCK ? n->n : n->nkw;
    for (int i = 0; n->kwv && i < nk; i++)
        if (mentions(n->kwv[i], name)) return 1;
    return 0;
}

static jnode *parse_macro(parser *p, int line) {
    tok *t = cur(p);
    if (t->type != T_NAME)
        return perr(p, t->line, "expected macro name, found %s", tok_desc(p, t)), NULL;
    jnode *n = mk(p, N_MACRO, line);
    if (!n) return NULL;
    n->name = tok_name(p, t);
    adv(p);
    if (!expect_op(p, "(") || !parse_params(p, n) || !end_block(p)) return NULL;
    static const char *const e[] = {"endmacro", NULL};
    int saved = p->loop_depth;
    p->loop_depth = 0;
    n->a = parse_body(p, e, "macro", line);
    p->loop_depth = saved;
    if (!n->a) return NULL;
    n->op = (mentions(n->a, "varargs") ? MACRO_VARARGS : 0) |
            (mentions(n->a, "kwargs") ? MACRO_KWARGS : 0);
    return close_block(p) ? n : NULL;
}

static jnode *parse_call(parser *p, int line) {
    jnode *n = mk(p, N_CALLBLOCK, line);
    if (!n) return NULL;
    if (tok_is_op(cur(p), "(")) {
        adv(p);
        if (!parse_params(p, n)) return NULL;
    }
    n->b = parse_expr(p);
    if (!n->b) return NULL;
    if (n->b->kind != E_CALL) return perr(p, line, "expected a macro call after 'call'"), NULL;
    if (!end_block(p)) return NULL;
    static const char *const e[] = {"endcall", NULL};
    n->a = parse_body(p, e, "call", line);
    if (!n->a) return NULL;
    return close_block(p) ? n : NULL;
}

static jnode *parse_statement_inner(parser *p);

static jnode *parse_statement(parser *p) {
    if (!nest(p, cur(p)->line, "blocks")) return NULL;
    jnode *n = parse_statement_inner(p);
    p->depth--;
    return n;
}

static jnode *parse_statement_inner(parser *p) {
    tok *t = cur(p);
    int line = t->line;
    if (t->type != T_NAME) {
        perr(p, line, "expected a statement name, found %s", tok_desc(p, t));
        return NULL;
    }
    adv(p);
    if (tok_is_name(t, "if")) return parse_if(p, line);
    if (tok_is_name(t, "for")) return parse_for(p, line);
    if (tok_is_name(t, "set")) return parse_set(p, line);
    if (tok_is_name(t, "macro")) return parse_macro(p, line);
    if (tok_is_name(t, "call")) return parse_call(p, line);
    if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (!p->loop_depth)
            return perr(p, line, "'%s' outside of a loop", t->s[0] == 'b' ? "break" : "continue"),
                   NULL;
        jnode *n = mk(p, t->s[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        return n && end_block(p) ? n : NULL;
    }
    if (tok_is_name(t, "filter")) {
        jnode *n = mk(p, N_FILTERBLOCK, line);
        if (!n) return NULL;
        n->c = parse_filter_chain(p, line);
        if (!n->c || !end_block(p)) return NULL;
        static const char *const e[] = {"endfilter", NULL};
        n->a = parse_body(p, e, "filter", line);
        if (!n->a) return NULL;
        return close_block(p) ? n : NULL;
    }
    if (tok_is_name(t, "generation")) {
        /* transformers' AssistantTracker: the body renders as-is */
        if (!end_block(p)) return NULL;
        static const char *const e[] = {"endgeneration", NULL};
        jnode *b = parse_body(p, e, "generation", line);
        if (!b) return NULL;
        return close_block(p) ? b : NULL;
    }
    if (tok_is_name(t, "with")) {
        jnode *n = mk(p, N_WITH, line);
        if (!n) return NULL;
        nlist targets = {0}, vals = {0};
        while (cur(p)->type != T_BLOCK_END) {
            if (targets.n && !expect_op(p, ",")) return NULL;
            jnode *tg = parse_target(p, 0);
            if (!tg || !expect_op(p, "=")) return NULL;
            jnode *v = parse_expr(p);
            if (!v) return NULL;
            nl_push(p, &targets, tg);
            nl_push(p, &vals, v);
        }
        adv(p);
        n->items = targets.v;
        n->kwv = vals.v;
        n->n = targets.n;
        static const char *const e[] = {"endwith", NULL};
        n->a = parse_body(p, e, "with", line);
        if (!n->a) return NULL;
        return close_block(p) ? n : NULL;
    }
    if (tok_is_name(t, "do")) {
        jnode *n = mk(p, N_DO, line);
        if (!n) return NULL;
        n->a = parse_tuple(p, 1, 0);
        return n->a && end_block(p) ? n : NULL;
    }
    perr(p, line, "unknown tag '%.*s'", (int)t->n, t->s);
    return NULL;
}

static jnode *parse_body(parser *p, const char *const *ends, const char *opener,
                         int open_line) {
    nlist body = {0};
    int line = cur(p)->line;
    for (;;) {
        if (p->st) return NULL;
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (int i = 0; ends[i]; i++) want = ends[i];
                perr(p, t->line, "unexpected end of template: '%s' opened at line %d "
                     "is never closed, expected '%s'", opener, open_line, want);
                return NULL;
            }
            break;
        }
        if (t->type == T_TEXT) {
            jnode *n = mk(p, N_TEXT, t->line);
            if (!n) return NULL;
            n->val = jv_str_borrow(p->a, t->s, t->n);
            nl_push(p, &body, n);
            adv(p);
            continue;
        }
        if (t->type == T_VAR_BEGIN) {
            adv(p);
            jnode *n = mk(p, N_OUTPUT, t->line);
            if (!n) return NULL;
            n->a = parse_tuple(p, 1, 0);
            if (!n->a || !expect_type(p, T_VAR_END, "'}}'")) return NULL;
            nl_push(p, &body, n);
            continue;
        }
        if (t->type == T_BLOCK_BEGIN) {
            tok *kw = peek_at(p, 1);
            int is_end = 0;
            for (int i = 0; ends && ends[i]; i++)
                if (tok_is_name(kw, ends[i])) is_end = 1;
            if (is_end) {
                adv(p); /* now at the keyword */
                break;
            }
            if (kw->type == T_NAME && kw->n > 3 && !memcmp(kw->s, "end", 3)) {
                const char *want = NULL;
                for (int i = 0; ends && ends[i]; i++) want = ends[i];
                perr(p, kw->line, "unexpected '%.*s'%s%s%s", (int)kw->n, kw->s,
                     want ? ", expected '" : "", want ? want : "", want ? "'" : "");
                return NULL;
            }
            if (ends == NULL && (tok_is_name(kw, "else") || tok_is_name(kw, "elif"))) {
                perr(p, kw->line, "unexpected '%.*s'", (int)kw->n, kw->s);
                return NULL;
            }
            adv(p);
            jnode *s = parse_statement(p);
            if (!s) return NULL;
            nl_push(p, &body, s);
            continue;
        }
        perr(p, t->line, "unexpected %s", tok_desc(p, t));
        return NULL;
    }
    jnode *n = mk(p, N_BODY, line);
    if (!n) return NULL;
    n->items = body.v;
    n->n = body.n;
    return n;
}

/* Unknown filter and test names are compile errors in Jinja, except where
 * its compiler uses a "soft" frame: inside an if statement and inside a
 * conditional expression (not crossing into a for, macro, call, set or filter
 * block, which open frames of their own). There they fail only if run. */
static int check_names(parser *p, const jnode *n, int soft) {
    if (!n || p->st) return p->st == LOOM_OK;
    if (!soft && n->kind == E_FILTER && !jinja_filter_known(n->name))
        return perr(p, n->line, "no filter named '%s'", n->name), 0;
    if (!soft && n->kind == E_TEST && !jinja_test_known(n->name))
        return perr(p, n->line, "no test named '%s'", n->name), 0;
    int inner = soft;     /* softness for children */
    switch (n->kind) {
    case N_IF: case E_COND: inner = 1; break;
    case N_FOR:
        /* the iterable and the else body belong to the outer frame */
        if (!check_names(p, n->a, soft)) return 0;
        if (n->n && !check_names(p, n->items[0], soft)) return 0;
        return check_names(p, n->b, 0) && check_names(p, n->c, 0) && check_names(p, n->d, 0);
    case N_CALLBLOCK:
        if (!check_names(p, n->b, soft)) return 0;
        inner = 0;
        for (int i = 0; i < n->n; i++)
            if (n->kwv && !check_names(p, n->kwv[i], 0)) return 0;
        return check_names(p, n->a, 0);
    case N_MACRO: case N_SETBLOCK: case N_FILTERBLOCK: case N_WITH: inner = 0; break;
    default: break;
    }
    if (!check_names(p, n->a, inner) || !check_names(p, n->b, inner) ||
        !check_names(p, n->c, inner) || !check_names(p, n->d, inner))
        return 0;
    for (int i = 0; n->items && i < n->n; i++)
        if (!check_names(p, n->items[i], inner)) return 0;
    /* kwv holds dict values, parameter defaults or with-values (n of them),
     * else keyword arguments (nkw) */
    int nk = n->kind == E_DICT || n->kind == N_MACRO || n->kind == N_WITH ? n->n : n->nkw;
    for (int i = 0; n->kwv && i < nk; i++)
        if (!check_names(p, n->kwv[i], inner)) return 0;
    return 1;
}

loom_status jinja_parse(jarena *a, const char *src, size_t len, jnode **out) {
    *out = NULL;
    parser p = {.a = a};
    p.st = jinja_lex(a, src, len, &p.t, &p.nt);
    if (p.st == LOOM_OK) {
        jnode *root = parse_body(&p, NULL, NULL, 0);
        if (root && p.st == LOOM_OK && check_names(&p, root, 0)) *out = root;
    }
    free(p.t);
    if (p.st == LOOM_OK && !*out) p.st = loom_err(LOOM_ERR_FORMAT, "template: parse failed");
    return p.st;
}
