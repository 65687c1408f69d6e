/* template/jinja_filters: the filters and tests of the Jinja engine, each a
 * function of one signature named by one row of a table: FILTERS and TESTS
 * below are the only lists of their names. The parser asks them which
 * names exist (Jinja rejects unknown ones at compile time); a row without a
 * function is a Jinja name loom does not implement, which fails only when a
 * render reaches it. Semantics follow Jinja2 3.x. */
#include "template/jinja_render.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Every filter and test has the tables' signature; not all of them use
 * every argument. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

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

static jv *f_tojson(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_map(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_safe(ctx *c, int line, jv *v, const args *a) { return with_safe(c, str_of(c, v), 1); }

static jv *f_default(ctx *c, int line, jv *v, const args *a) {
    jv *def = arg(a, 0, "default_value");
    int boolean = arg_bool(a, 1, "boolean", 0);
    if (v->type == JV_UNDEF || (boolean && !jv_truthy(v)))
        return def ? def : jv_str_borrow(c->a, "", 0);
    return v;
}

static jv *f_length(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_string(ctx *c, int line, jv *v, const args *a) { return str_of(c, v); }

static jv *f_list(ctx *c, int line, jv *v, const args *a) { return to_list(c, line, v); }

static jv *f_items(ctx *c, int line, jv *v, const args *a) {
    if (v->type == JV_UNDEF) return as_gen(jv_list(c->a, 0));
    if (v->type != JV_DICT) return rerr(c, line, "items: expected a mapping, found %s",
                                         jv_type_name(v));
    return as_gen(dict_items(c, v));
}

static jv *f_dictsort(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_join(ctx *c, int line, jv *v, const args *a) {
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

static jv *first_last(ctx *c, int line, jv *v, int last) {
    if (v->type == JV_STR) {
        if (!v->u.s.n) return jv_undef(c->a, NULL);
        size_t st = !last ? 0 : cp_back(v->u.s.p, v->u.s.n);
        int32_t cp;
        size_t k = ju_decode(v->u.s.p, v->u.s.n, st, &cp);
        return jv_str_borrow(c->a, v->u.s.p + st, k);
    }
    if (last && v->type == JV_LIST && (v->flags & JVF_ITER))
        return rerr(c, line, "'generator' object is not reversible");
    jv *l = to_list(c, line, v);
    if (!l) return NULL;
    if (!l->u.l.n) return jv_undef(c->a, NULL);
    return !last ? l->u.l.v[0] : l->u.l.v[l->u.l.n - 1];
}

static jv *f_first(ctx *c, int line, jv *v, const args *a) { return first_last(c, line, v, 0); }
static jv *f_last(ctx *c, int line, jv *v, const args *a) { return first_last(c, line, v, 1); }

static jv *f_upper(ctx *c, int line, jv *v, const args *a) {
    return with_safe(c, do_case(c, str_of(c, v), 1), is_safe(v));
}

static jv *f_lower(ctx *c, int line, jv *v, const args *a) {
    return with_safe(c, do_case(c, str_of(c, v), 0), is_safe(v));
}

static jv *f_title(ctx *c, int line, jv *v, const args *a) { return jinja_title(c, str_of(c, v)); }

static jv *f_capitalize(ctx *c, int line, jv *v, const args *a) {
    return with_safe(c, capitalize(c, str_of(c, v)), is_safe(v));
}

static jv *f_trim(ctx *c, int line, jv *v, const args *a) {
    return with_safe(c, do_strip(c, str_of(c, v), arg(a, 0, "chars"), 3), is_safe(v));
}

static jv *f_replace(ctx *c, int line, jv *v, const args *a) {
    jv *old = arg(a, 0, "old"), *new = arg(a, 1, "new"), *cnt = arg(a, 2, "count");
    if (!old || !new) return rerr(c, line, "replace: expected old and new strings");
    return do_replace(c, str_of(c, v), str_of(c, old), str_of(c, new),
                      cnt && is_num(cnt) ? numi(cnt) : -1);
}

static jv *f_escape(ctx *c, int line, jv *v, const args *a) {
    return is_safe(v) ? v : html_escape(c, str_of(c, v));
}

static jv *f_forceescape(ctx *c, int line, jv *v, const args *a) {
    return html_escape(c, str_of(c, v));
}

static jv *f_int(ctx *c, int line, jv *v, const args *a) {
    if (v->type == JV_UNDEF) return undef_err(c, line, v);
    jv *def = arg(a, 0, "default");
    jv *base = arg(a, 1, "base");
    if (is_num(v)) return jv_int(c->a, v->type == JV_FLOAT ? (int64_t)v->u.f : numi(v));
    if (v->type == JV_STR) {
        char *end;
        const char *s = v->u.s.p;
        int64_t b = base && is_intlike(base) ? numi(base) : 10;
        /* Python's int() takes base 0 or 2..36 (strtoll leaves end unset
         * for another); Jinja answers its ValueError with int(float(v)) */
        if (b == 0 || (b >= 2 && b <= 36)) {
            long long x = strtoll(s, &end, (int)b);
            while (*end && py_space((unsigned char)*end)) end++;
            if (end != s && !*end) return jv_int(c->a, x);
        }
        double d = strtod(s, &end);
        while (*end && py_space((unsigned char)*end)) end++;
        if (end != s && !*end && isfinite(d)) return jv_int(c->a, (int64_t)d);
    }
    return def ? def : jv_int(c->a, 0);
}

static jv *f_float(ctx *c, int line, jv *v, const args *a) {
    if (v->type == JV_UNDEF) return undef_err(c, line, v);
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

static jv *f_abs(ctx *c, int line, jv *v, const args *a) {
    if (v->type == JV_FLOAT) return jv_float(c->a, fabs(v->u.f));
    if (is_intlike(v)) return jv_int(c->a, numi(v) < 0 ? -numi(v) : numi(v));
    return rerr(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static jv *f_round(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_unique(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_sort(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_reverse(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_select(ctx *c, int line, jv *v, const args *a) {
    return do_select(c, line, v, a, 0, 1);
}

static jv *f_reject(ctx *c, int line, jv *v, const args *a) {
    return do_select(c, line, v, a, 0, 0);
}

static jv *f_selectattr(ctx *c, int line, jv *v, const args *a) {
    return do_select(c, line, v, a, 1, 1);
}

static jv *f_rejectattr(ctx *c, int line, jv *v, const args *a) {
    return do_select(c, line, v, a, 1, 0);
}

static jv *f_min(ctx *c, int line, jv *v, const args *a) { return do_minmax(c, line, v, a, 0); }

static jv *f_max(ctx *c, int line, jv *v, const args *a) { return do_minmax(c, line, v, a, 1); }

static jv *f_sum(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_indent(ctx *c, int line, jv *v, const args *a) {
    if (v->type != JV_STR) return rerr(c, line, "indent: expected a string, found %s", jv_type_name(v));
    return with_safe(c, do_indent(c, v, a), is_safe(v));
}

static jv *f_wordcount(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_batch(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_format(ctx *c, int line, jv *v, const args *a) {
    jv *s = str_of(c, v);
    return printf_format(c, line, s, a->pos, a->npos, 0);
}

static jv *f_attr(ctx *c, int line, jv *v, const args *a) {
    jv *nm = arg(a, 0, "name");
    if (!nm || nm->type != JV_STR) return rerr(c, line, "attr: expected a name");
    return get_attr(c, line, v, nm->u.s.p);
}

static jv *f_center(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_truncate(ctx *c, int line, jv *v, const args *a) {
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

static jv *f_pprint(ctx *c, int line, jv *v, const args *a) {
    loom_buf b = {0};
    jv_repr(&b, v);
    return strbuf_take(c, &b);
}

/* ---- the filter table -------------------------------------------------------------------------- */

typedef jv *jfilter_fn(ctx *c, int line, jv *v, const args *a);

typedef struct jfilter {
    const char *name;
    jfilter_fn *fn;         /* NULL: a Jinja filter loom does not implement */
    int pass_kwargs;        /* takes any keyword arguments (passes them on) */
    const char *kwargs[5];  /* else the keyword arguments it takes (Python
                               rejects others); NULL-terminated */
} jfilter;

/* The filters Jinja defines, by name; an alias is a row of its own. */
static const jfilter FILTERS[] = {
    {"abs", f_abs, 0, {0}},
    {"attr", f_attr, 0, {"name"}},
    {"batch", f_batch, 0, {"linecount", "fill_with"}},
    {"capitalize", f_capitalize, 0, {0}},
    {"center", f_center, 0, {"width"}},
    {"count", f_length, 0, {0}},
    {"d", f_default, 0, {"default_value", "boolean"}},
    {"default", f_default, 0, {"default_value", "boolean"}},
    {"dictsort", f_dictsort, 0, {"case_sensitive", "by", "reverse"}},
    {"e", f_escape, 0, {0}},
    {"escape", f_escape, 0, {0}},
    {"filesizeformat", NULL, 0, {0}},
    {"first", f_first, 0, {0}},
    {"float", f_float, 0, {"default"}},
    {"forceescape", f_forceescape, 0, {0}},
    {"format", f_format, 1, {0}},
    {"groupby", NULL, 0, {0}},
    {"indent", f_indent, 0, {"width", "first", "blank"}},
    {"int", f_int, 0, {"default", "base"}},
    {"items", f_items, 0, {0}},
    {"join", f_join, 0, {"d", "attribute"}},
    {"last", f_last, 0, {0}},
    {"length", f_length, 0, {0}},
    {"list", f_list, 0, {0}},
    {"lower", f_lower, 0, {0}},
    {"map", f_map, 1, {0}},
    {"max", f_max, 0, {"case_sensitive", "attribute"}},
    {"min", f_min, 0, {"case_sensitive", "attribute"}},
    {"pprint", f_pprint, 0, {0}},
    {"random", NULL, 0, {0}},
    {"reject", f_reject, 1, {0}},
    {"rejectattr", f_rejectattr, 1, {0}},
    {"replace", f_replace, 0, {"old", "new", "count"}},
    {"reverse", f_reverse, 0, {0}},
    {"round", f_round, 0, {"precision", "method"}},
    {"safe", f_safe, 0, {0}},
    {"select", f_select, 1, {0}},
    {"selectattr", f_selectattr, 1, {0}},
    {"slice", NULL, 0, {0}},
    {"sort", f_sort, 0, {"reverse", "case_sensitive", "attribute"}},
    {"string", f_string, 0, {0}},
    {"striptags", NULL, 0, {0}},
    {"sum", f_sum, 0, {"attribute", "start"}},
    {"title", f_title, 0, {0}},
    {"tojson", f_tojson, 0, {"indent", "ensure_ascii", "separators", "sort_keys"}},
    {"trim", f_trim, 0, {"chars"}},
    {"truncate", f_truncate, 0, {"length", "killwords", "end", "leeway"}},
    {"unique", f_unique, 0, {"case_sensitive", "attribute"}},
    {"upper", f_upper, 0, {0}},
    {"urlencode", NULL, 0, {0}},
    {"urlize", NULL, 0, {0}},
    {"wordcount", f_wordcount, 0, {0}},
    {"wordwrap", NULL, 0, {0}},
    {"xmlattr", NULL, 0, {0}},
};

static const jfilter *find_filter(const char *name) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(FILTERS); i++)
        if (!strcmp(FILTERS[i].name, name)) return &FILTERS[i];
    return NULL;
}

int jinja_filter_known(const char *name) { return find_filter(name) != NULL; }

static int check_kwargs(ctx *c, int line, const char *name, const jfilter *f, const args *a) {
    if (!a->nkw || (f && f->pass_kwargs)) return 1;
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int j = 0; f && f->kwargs[j]; j++) ok |= !strcmp(f->kwargs[j], a->kwn[k]);
        if (!ok) {
            rerr(c, line, "%s() got an unexpected keyword argument '%s'", name, a->kwn[k]);
            return 0;
        }
    }
    return 1;
}

jv *apply_filter(ctx *c, int line, const char *name, jv *v, const args *a) {
    const jfilter *f = find_filter(name);
    if (!check_kwargs(c, line, name, f, a)) return NULL;
    if (f && f->fn) return f->fn(c, line, v, a);
    if (f) return rerr(c, line, "filter '%s' is not supported", name);
    return rerr(c, line, "unknown filter '%s'", name);
}

/* ---- tests ---------------------------------------------------------------------------------------- */

/* Each returns 1 or 0, or -1 after an error. */
static int t_defined(ctx *c, int line, jv *v, const args *a) { return v->type != JV_UNDEF; }
static int t_undefined(ctx *c, int line, jv *v, const args *a) { return v->type == JV_UNDEF; }
static int t_none(ctx *c, int line, jv *v, const args *a) { return v->type == JV_NONE; }
static int t_boolean(ctx *c, int line, jv *v, const args *a) { return v->type == JV_BOOL; }
static int t_true(ctx *c, int line, jv *v, const args *a) { return v->type == JV_BOOL && v->u.b; }
static int t_false(ctx *c, int line, jv *v, const args *a) { return v->type == JV_BOOL && !v->u.b; }
static int t_integer(ctx *c, int line, jv *v, const args *a) { return v->type == JV_INT; }
static int t_float(ctx *c, int line, jv *v, const args *a) { return v->type == JV_FLOAT; }
static int t_number(ctx *c, int line, jv *v, const args *a) { return is_num(v); }
static int t_string(ctx *c, int line, jv *v, const args *a) { return v->type == JV_STR; }

static int t_mapping(ctx *c, int line, jv *v, const args *a) {
    return v->type == JV_DICT && !(v->flags & JVF_NS);
}

static int t_iterable(ctx *c, int line, jv *v, const args *a) {
    return v->type == JV_STR || v->type == JV_LIST || v->type == JV_DICT ||
           v->type == JV_UNDEF;
}

static int t_sequence(ctx *c, int line, jv *v, const args *a) {
    return v->type == JV_STR || (v->type == JV_LIST && !(v->flags & JVF_ITER)) ||
           (v->type == JV_DICT && !(v->flags & JVF_NS)) || v->type == JV_UNDEF;
}

static int t_callable(ctx *c, int line, jv *v, const args *a) {
    return v->type == JV_FUNC || v->type == JV_UNDEF; /* Undefined has __call__ */
}

static int t_escaped(ctx *c, int line, jv *v, const args *a) { return 0; }

static int t_sameas(ctx *c, int line, jv *v, const args *a) {
    jv *x = arg(a, 0, NULL);
    if (!x) return rerr(c, line, "sameas needs an argument"), -1;
    if (v->type != x->type) return 0;
    if (v->type == JV_NONE || v->type == JV_UNDEF) return 1;
    if (v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT ||
        v->type == JV_STR)
        return jv_equal(v, x); /* CPython caches small ints and interns strings */
    return v == x;
}

static int t_in(ctx *c, int line, jv *v, const args *a) {
    jv *x = arg(a, 0, NULL);
    if (!x) return rerr(c, line, "'in' test needs an argument"), -1;
    int r;
    return contains(c, line, x, v, &r) ? r : -1;
}

/* A comparison with the test's argument (eq, lt, ==, ...). */
static int cmp_arg(ctx *c, int line, jv *v, const args *a, int op) {
    return cmp_test(c, line, v, arg(a, 0, NULL), op);
}

static int t_eq(ctx *c, int line, jv *v, const args *a) { return cmp_arg(c, line, v, a, OP_EQ); }
static int t_ne(ctx *c, int line, jv *v, const args *a) { return cmp_arg(c, line, v, a, OP_NE); }
static int t_lt(ctx *c, int line, jv *v, const args *a) { return cmp_arg(c, line, v, a, OP_LT); }
static int t_le(ctx *c, int line, jv *v, const args *a) { return cmp_arg(c, line, v, a, OP_LE); }
static int t_gt(ctx *c, int line, jv *v, const args *a) { return cmp_arg(c, line, v, a, OP_GT); }
static int t_ge(ctx *c, int line, jv *v, const args *a) { return cmp_arg(c, line, v, a, OP_GE); }

static int odd_even(ctx *c, int line, jv *v, int odd) {
    if (!is_num(v)) return rerr(c, line, "'%s' test needs a number", odd ? "odd" : "even"), -1;
    if (v->type == JV_FLOAT) { /* Python: value % 2 == 1 */
        double r = fmod(v->u.f, 2.0);
        if (r < 0) r += 2.0;
        return odd ? r == 1.0 : r == 0.0;
    }
    int64_t r = numi(v) % 2;
    return odd ? r != 0 : r == 0;
}

static int t_odd(ctx *c, int line, jv *v, const args *a) { return odd_even(c, line, v, 1); }
static int t_even(ctx *c, int line, jv *v, const args *a) { return odd_even(c, line, v, 0); }

static int t_divisibleby(ctx *c, int line, jv *v, const args *a) {
    jv *x = arg(a, 0, NULL);
    if (!x || !is_num(v) || !is_num(x) || numf(x) == 0)
        return rerr(c, line, "divisibleby needs numbers and a non-zero divisor"), -1;
    if (v->type == JV_FLOAT || x->type == JV_FLOAT) return fmod(numf(v), numf(x)) == 0;
    return numi(v) % numi(x) == 0;
}

/* lower / upper: str(value) has cased characters and equals its own case. */
static int case_test(ctx *c, jv *v, int upper) {
    v = str_of(c, v); /* Jinja tests str(value) */
    jv *t = do_case(c, v, upper);
    int cased = 0;
    for (size_t i = 0; i < v->u.s.n;) {
        int32_t cp;
        i += ju_decode(v->u.s.p, v->u.s.n, i, &cp);
        cased |= is_cased(cp);
    }
    return cased && jv_equal(t, v);
}

static int t_lower(ctx *c, int line, jv *v, const args *a) { return case_test(c, v, 0); }
static int t_upper(ctx *c, int line, jv *v, const args *a) { return case_test(c, v, 1); }

/* ---- the test table ------------------------------------------------------------------------------- */

typedef int jtest_fn(ctx *c, int line, jv *v, const args *a);

typedef struct jtest {
    const char *name;
    jtest_fn *fn;           /* NULL: a Jinja test loom does not implement */
    int no_args;            /* takes no arguments */
} jtest;

/* The tests Jinja defines, by name; an alias is a row of its own. */
static const jtest TESTS[] = {
    {"boolean", t_boolean, 1},
    {"callable", t_callable, 1},
    {"defined", t_defined, 1},
    {"divisibleby", t_divisibleby, 0},
    {"eq", t_eq, 0},
    {"equalto", t_eq, 0},
    {"escaped", t_escaped, 1},
    {"even", t_even, 1},
    {"false", t_false, 1},
    {"filter", NULL, 0},
    {"float", t_float, 1},
    {"ge", t_ge, 0},
    {"gt", t_gt, 0},
    {"greaterthan", t_gt, 0},
    {"in", t_in, 0},
    {"integer", t_integer, 1},
    {"iterable", t_iterable, 1},
    {"le", t_le, 0},
    {"lower", t_lower, 1},
    {"lessthan", t_lt, 0},
    {"lt", t_lt, 0},
    {"mapping", t_mapping, 1},
    {"ne", t_ne, 0},
    {"none", t_none, 1},
    {"number", t_number, 1},
    {"odd", t_odd, 1},
    {"sameas", t_sameas, 0},
    {"sequence", t_sequence, 1},
    {"string", t_string, 1},
    {"test", NULL, 0},
    {"true", t_true, 1},
    {"undefined", t_undefined, 1},
    {"upper", t_upper, 1},
    {"==", t_eq, 0},
    {"!=", t_ne, 0},
    {"<", t_lt, 0},
    {"<=", t_le, 0},
    {">", t_gt, 0},
    {">=", t_ge, 0},
};

static const jtest *find_test(const char *name) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(TESTS); i++)
        if (!strcmp(TESTS[i].name, name)) return &TESTS[i];
    return NULL;
}

int jinja_test_known(const char *name) { return find_test(name) != NULL; }

int apply_test(ctx *c, int line, const char *name, jv *v, const args *a) {
    const jtest *t = find_test(name);
    if (t && t->no_args && (a->npos || a->nkw))
        return rerr(c, line, "test '%s' takes no arguments", name), -1;
    if (t && t->fn) return t->fn(c, line, v, a);
    rerr(c, line, "%s test '%s'", t ? "unsupported" : "unknown", name);
    return -1;
}
