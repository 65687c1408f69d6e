/* tokenize pipeline: patterns (literal or PCRE2 regex), normalizers and
 * pre-tokenizers, parsed from tokenizer.json and applied with the same
 * splitting semantics as the reference library. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenize/tok_internal.h"

/* The GPT-2 split used by ByteLevel when use_regex is set. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

/* ---- JSON helpers ---------------------------------------------------------- */




/* First code point of a string, or dflt for NULL/empty. */

/* ---- patterns ---------------------------------------------------------------- */

/* The reference matches with Oniguruma, where \s is the Unicode White_Space
 * property; PCRE2's \s also takes U+180E. Spell \s (and \S outside a
 * class) out as White_Space so both engines split alike. */
static const char ws_class[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x85\\xA0\\x{1680}\\x{2000}-\\x{200A}"
    "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

static int rewrite_spaces(const char *src, size_t n, tk_buf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            i++;
            int bad = 0;
            if (e == 's')
                bad = in_class ? tk_buf_put(out, ws_class, sizeof ws_class - 1)
                               : (tk_buf_putc(out, '[') ||
                                  tk_buf_put(out, ws_class, sizeof ws_class - 1) ||
                                  tk_buf_putc(out, ']'));
            else if (e == 'S' && !in_class)
                bad = tk_buf_put(out, "[^", 2) ||
                      tk_buf_put(out, ws_class, sizeof ws_class - 1) ||
                      tk_buf_putc(out, ']');
            else
                bad = tk_buf_putc(out, c) || tk_buf_putc(out, e);
            if (bad) return -1;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            if (tk_buf_putc(out, c)) return -1;
            /* a ']' first in the class (after an optional '^') is literal */
            if (i + 1 < n && src[i + 1] == '^') {
                if (tk_buf_putc(out, '^')) return -1;
                i++;
            }
            if (i + 1 < n && src[i + 1] == ']') {
                if (tk_buf_putc(out, ']')) return -1;
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && src[i + 1] == ':') {
            /* POSIX class [:name:] inside a class */
            const char *end = strstr(src + i + 2, ":]");
            if (end && (size_t)(end - src) < n) {
                size_t l = (size_t)(end - (src + i)) + 2;
                if (tk_buf_put(out, src + i, l)) return -1;
                i += l - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        if (tk_buf_putc(out, c)) return -1;
    }
    return 0;
}

static loom_status regex_compile(tk_regex *re, const char *src0, size_t n0,
                                 const char *what) {
    int err;
    PCRE2_SIZE off;
    tk_buf rw = {0};
    if (rewrite_spaces(src0, n0, &rw) || tk_buf_reserve(&rw, 0)) {
        tk_buf_free(&rw);
        return loom_err(LOOM_ERR_NOMEM, "%s: out of memory", what);
    }
    const char *src = src0;
    re->code = pcre2_compile((PCRE2_SPTR)rw.p, rw.n, PCRE2_UTF | PCRE2_UCP, &err,
                             &off, NULL);
    tk_buf_free(&rw);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "%s: regex /%.200s/ does not compile at offset %zu: %s",
                        what, src, (size_t)off, (const char *)msg);
    }
    /* JIT is an optimisation; the interpreter is the fallback. */
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    return LOOM_OK;
}

loom_status tk_pattern_parse(const cJSON *j, tk_pattern *out,
                             const char *what) {
    memset(out, 0, sizeof *out);
    const char *s = tk_jstr(j, "String");
    if (s) {
        out->str = tk_dup_str(s, &out->str_len);
        if (!out->str) return loom_err(LOOM_ERR_NOMEM, "%s: out of memory", what);
        return LOOM_OK;
    }
    const char *r = tk_jstr(j, "Regex");
    if (r) return regex_compile(&out->re, r, strlen(r), what);
    return loom_err(LOOM_ERR_FORMAT,
                    "%s: expected pattern {\"String\": ...} or {\"Regex\": ...}",
                    what);
}

void tk_pattern_free(tk_pattern *p) {
    free(p->str);
    if (p->re.code) pcre2_code_free(p->re.code);
    memset(p, 0, sizeof *p);
}

int tk_pattern_find(const tk_pattern *p, pcre2_match_data *md, const char *s,
                    size_t n, size_t from, size_t *ms, size_t *me) {
    if (p->str) {
        if (p->str_len == 0 || from >= n) return 0;
        const char *f = memmem(s + from, n - from, p->str, p->str_len);
        if (!f) return 0;
        *ms = (size_t)(f - s);
        *me = *ms + p->str_len;
        return 1;
    }
    if (from > n) return 0;
    int rc = pcre2_match(p->re.code, (PCRE2_SPTR)s, n, from,
                         PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: interpreter */
        rc = pcre2_match(p->re.code, (PCRE2_SPTR)s, n, from,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0 && rc != 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* ---- spans: a cover of a string by match / non-match ranges ------------------ */

typedef struct span {
    size_t s, e;
    int m;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static int spans_add(spans *l, size_t s, size_t e, int m) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (span){s, e, m};
    return 0;
}

/* Covers s[0..n) with pattern matches and the gaps between them. Empty
 * matches are skipped (they would only produce empty pieces). */
static int spans_from_pattern(const tk_pattern *p, pcre2_match_data *md,
                              const char *s, size_t n, spans *out) {
    size_t prev = 0, pos = 0;
    out->n = 0;
    while (pos <= n) {
        size_t ms, me;
        int r = tk_pattern_find(p, md, s, n, pos, &ms, &me);
        if (r < 0) return -1;
        if (r == 0) break;
        if (me == ms) {
            /* step over one character */
            if (ms >= n) break;
            uint32_t cp;
            pos = ms + (size_t)tk_utf8_next(s + ms, n - ms, &cp);
            continue;
        }
        if (ms > prev && spans_add(out, prev, ms, 0)) return -1;
        if (spans_add(out, ms, me, 1)) return -1;
        prev = pos = me;
    }
    if (prev < n && spans_add(out, prev, n, 0)) return -1;
    return 0;
}

/* Each character satisfying pred is its own match. */
static int spans_from_pred(int (*pred)(uint32_t, uint32_t), uint32_t arg,
                           const char *s, size_t n, spans *out) {
    size_t prev = 0, i = 0;
    out->n = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = (size_t)tk_utf8_next(s + i, n - i, &cp);
        if (pred(cp, arg)) {
            if (i > prev && spans_add(out, prev, i, 0)) return -1;
            if (spans_add(out, i, i + l, 1)) return -1;
            prev = i + l;
        }
        i += l;
    }
    if (prev < n && spans_add(out, prev, n, 0)) return -1;
    return 0;
}

/* Turns match spans into kept pieces per the split behaviour; on return
 * each span's m means "remove". */
static void spans_behave(spans *l, int behavior, int invert) {
    if (invert)
        for (size_t i = 0; i < l->n; i++) l->v[i].m = !l->v[i].m;
    size_t k = 0;
    int prev_match = 0;
    switch (behavior) {
    case TK_SPLIT_REMOVED:
        return;
    case TK_SPLIT_ISOLATED:
        for (size_t i = 0; i < l->n; i++) l->v[i].m = 0;
        return;
    case TK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < l->n; i++) {
            span c = l->v[i];
            if (k > 0 && c.m == prev_match) l->v[k - 1].e = c.e;
            else l->v[k++] = (span){c.s, c.e, 0};
            prev_match = c.m;
        }
        l->n = k;
        return;
    case TK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < l->n; i++) {
            span c = l->v[i];
            if (c.m && !prev_match && k > 0) l->v[k - 1].e = c.e;
            else l->v[k++] = (span){c.s, c.e, 0};
            prev_match = c.m;
        }
        l->n = k;
        return;
    case TK_SPLIT_MERGED_NEXT: {
        /* walk backwards, merging a match into the piece after it */
        size_t w = l->n;
        for (size_t i = l->n; i-- > 0;) {
            span c = l->v[i];
            if (c.m && !prev_match && w < l->n) l->v[w].s = c.s;
            else l->v[--w] = (span){c.s, c.e, 0};
            prev_match = c.m;
        }
        memmove(l->v, l->v + w, (l->n - w) * sizeof *l->v);
        l->n -= w;
        return;
    }
    }
}

static int emit_spans(const spans *l, const char *s, int origin,
                      tk_pieces *out) {
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].m || l->v[i].e == l->v[i].s) continue;
        if (tk_pieces_add(out, s + l->v[i].s, l->v[i].e - l->v[i].s, -1,
                          origin && l->v[i].s == 0))
            return -1;
    }
    return 0;
}

/* ---- normalizers ------------------------------------------------------------- */

static void norm_init_fields(tk_norm *n) { memset(n, 0, sizeof *n); }

loom_status tk_norm_parse(const cJSON *j, tk_norm *out) {
    norm_init_fields(out);
    const char *type = tk_jstr(j, "type");
    if (!type)
        return loom_err(LOOM_ERR_FORMAT, "normalizer: expected a \"type\" string");
    if (!strcmp(type, "NFC")) out->type = TK_NORM_NFC;
    else if (!strcmp(type, "NFD")) out->type = TK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) out->type = TK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) out->type = TK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) out->type = TK_NORM_LOWER;
    else if (!strcmp(type, "StripAccents")) out->type = TK_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Strip")) {
        out->type = TK_NORM_STRIP;
        out->left = tk_jbool(j, "strip_left", 1);
        out->right = tk_jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend") || !strcmp(type, "Append")) {
        out->type = type[0] == 'P' ? TK_NORM_PREPEND : TK_NORM_APPEND;
        const char *c = tk_jstr(j, type[0] == 'P' ? "prepend" : "append");
        if (!c)
            return loom_err(LOOM_ERR_FORMAT, "normalizer %s: expected a string field", type);
        if (!(out->content = tk_dup_str(c, &out->content_len)))
            return loom_err(LOOM_ERR_NOMEM, "normalizer: out of memory");
    } else if (!strcmp(type, "Replace")) {
        out->type = TK_NORM_REPLACE;
        const char *c = tk_jstr(j, "content");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        if (!c || !pat)
            return loom_err(LOOM_ERR_FORMAT, "normalizer Replace: expected \"pattern\" and \"content\"");
        loom_status st = tk_pattern_parse(pat, &out->pat, "normalizer Replace");
        if (st) return st;
        if (!(out->content = tk_dup_str(c, &out->content_len)))
            return loom_err(LOOM_ERR_NOMEM, "normalizer: out of memory");
    } else if (!strcmp(type, "BertNormalizer")) {
        out->type = TK_NORM_BERT;
        out->clean_text = tk_jbool(j, "clean_text", 1);
        out->chinese = tk_jbool(j, "handle_chinese_chars", 1);
        out->lowercase = tk_jbool(j, "lowercase", 1);
        out->strip_accents = tk_jbool(j, "strip_accents", out->lowercase);
    } else if (!strcmp(type, "Sequence")) {
        out->type = TK_NORM_SEQUENCE;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(a))
            return loom_err(LOOM_ERR_FORMAT, "normalizer Sequence: expected a \"normalizers\" array");
        int n = cJSON_GetArraySize(a);
        out->sub = calloc((size_t)(n ? n : 1), sizeof *out->sub);
        if (!out->sub) return loom_err(LOOM_ERR_NOMEM, "normalizer: out of memory");
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            loom_status st = tk_norm_parse(e, &out->sub[out->n_sub]);
            out->n_sub++;
            if (st) return st;
        }
    } else {
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "normalizer: expected one of NFC, NFD, NFKC, NFKD, Lowercase, "
                        "Replace, Prepend, Append, Strip, StripAccents, BertNormalizer, "
                        "Sequence, found type \"%s\"", type);
    }
    return LOOM_OK;
}

void tk_norm_free(tk_norm *n) {
    if (!n) return;
    for (int i = 0; i < n->n_sub; i++) tk_norm_free(&n->sub[i]);
    free(n->sub);
    free(n->content);
    tk_pattern_free(&n->pat);
    memset(n, 0, sizeof *n);
}


static int is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int is_mark(uint32_t c) {
    int k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC ||
           k == UTF8PROC_CATEGORY_ME;
}

static loom_status put_lower(tk_buf *out, uint32_t cp) {
    /* char::to_lowercase has one multi-character mapping */
    if (cp == 0x130) return tk_buf_put(out, "i\xCC\x87", 3) ? tk_nomem() : LOOM_OK;
    return tk_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp))
               ? tk_nomem() : LOOM_OK;
}

static loom_status unicode_norm(int type, const char *s, size_t n,
                                tk_buf *out) {
    int opt = UTF8PROC_STABLE;
    if (type == TK_NORM_NFC || type == TK_NORM_NFKC) opt |= UTF8PROC_COMPOSE;
    else opt |= UTF8PROC_DECOMPOSE;
    if (type == TK_NORM_NFKC || type == TK_NORM_NFKD) opt |= UTF8PROC_COMPAT;
    if (n == 0) return LOOM_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s,
                                      (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opt);
    if (r < 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "normalizer: %s",
                        utf8proc_errmsg(r));
    int bad = tk_buf_put(out, dst, (size_t)r);
    free(dst);
    return bad ? tk_nomem() : LOOM_OK;
}

loom_status tk_norm_apply(const tk_norm *nm, const char *s, size_t n,
                          tk_buf *out, pcre2_match_data *md) {
    size_t i;
    uint32_t cp;
    switch (nm->type) {
    case TK_NORM_NFC: case TK_NORM_NFD: case TK_NORM_NFKC: case TK_NORM_NFKD:
        return unicode_norm(nm->type, s, n, out);
    case TK_NORM_LOWER:
        for (i = 0; i < n;) {
            i += (size_t)tk_utf8_next(s + i, n - i, &cp);
            if (put_lower(out, cp)) return LOOM_ERR_NOMEM;
        }
        return LOOM_OK;
    case TK_NORM_STRIP_ACCENTS:
        for (i = 0; i < n;) {
            size_t l = (size_t)tk_utf8_next(s + i, n - i, &cp);
            if (!is_mark(cp) && tk_buf_put(out, s + i, l)) return tk_nomem();
            i += l;
        }
        return LOOM_OK;
    case TK_NORM_STRIP: {
        size_t a = 0, b = n;
        if (nm->left)
            while (a < b) {
                size_t l = (size_t)tk_utf8_next(s + a, b - a, &cp);
                if (!tk_is_whitespace(cp)) break;
                a += l;
            }
        if (nm->right)
            while (b > a) {
                size_t k = b - 1;
                while (k > a && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
                tk_utf8_next(s + k, b - k, &cp);
                if (!tk_is_whitespace(cp)) break;
                b = k;
            }
        return tk_buf_put(out, s + a, b - a) ? tk_nomem() : LOOM_OK;
    }
    case TK_NORM_PREPEND:
        if (n && tk_buf_put(out, nm->content, nm->content_len)) return tk_nomem();
        return tk_buf_put(out, s, n) ? tk_nomem() : LOOM_OK;
    case TK_NORM_APPEND:
        if (tk_buf_put(out, s, n)) return tk_nomem();
        if (n && tk_buf_put(out, nm->content, nm->content_len)) return tk_nomem();
        return LOOM_OK;
    case TK_NORM_REPLACE: {
        size_t pos = 0, prev = 0, ms, me;
        for (;;) {
            int r = tk_pattern_find(&nm->pat, md, s, n, pos, &ms, &me);
            if (r < 0) return loom_err(LOOM_ERR_INTERNAL, "normalizer Replace: regex match failed");
            if (r == 0) break;
            if (tk_buf_put(out, s + prev, ms - prev) ||
                tk_buf_put(out, nm->content, nm->content_len))
                return tk_nomem();
            prev = me;
            if (me == ms) {
                if (ms >= n) break;
                size_t l = (size_t)tk_utf8_next(s + ms, n - ms, &cp);
                if (tk_buf_put(out, s + ms, l)) return tk_nomem();
                prev = pos = ms + l;
            } else {
                pos = me;
            }
        }
        return tk_buf_put(out, s + prev, n - prev) ? tk_nomem() : LOOM_OK;
    }
    case TK_NORM_BERT: {
        tk_buf a = {0};
        loom_status st = LOOM_OK;
        for (i = 0; i < n && !st;) {
            size_t l = (size_t)tk_utf8_next(s + i, n - i, &cp);
            const char *c = s + i;
            i += l;
            if (nm->clean_text) {
                int cat = utf8proc_category((utf8proc_int32_t)cp);
                int ws = cp == '\t' || cp == '\n' || cp == '\r' || tk_is_whitespace(cp);
                if (cp == 0 || cp == 0xFFFD ||
                    (!ws && (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF)))
                    continue;
                if (ws) { if (tk_buf_putc(&a, ' ')) st = tk_nomem(); continue; }
            }
            if (nm->chinese && is_cjk(cp)) {
                if (tk_buf_putc(&a, ' ') || tk_buf_put(&a, c, l) || tk_buf_putc(&a, ' '))
                    st = tk_nomem();
                continue;
            }
            if (tk_buf_put(&a, c, l)) st = tk_nomem();
        }
        if (!st && nm->strip_accents) {
            tk_buf d = {0};
            st = unicode_norm(TK_NORM_NFD, a.p ? a.p : "", a.n, &d);
            tk_buf_free(&a);
            a = (tk_buf){0};
            for (i = 0; !st && i < d.n;) {
                size_t l = (size_t)tk_utf8_next(d.p + i, d.n - i, &cp);
                if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN &&
                    tk_buf_put(&a, d.p + i, l))
                    st = tk_nomem();
                i += l;
            }
            tk_buf_free(&d);
        }
        for (i = 0; !st && i < a.n;) {
            i += (size_t)tk_utf8_next(a.p + i, a.n - i, &cp);
            st = nm->lowercase ? put_lower(out, cp)
                               : (tk_buf_put_cp(out, cp) ? tk_nomem() : LOOM_OK);
        }
        tk_buf_free(&a);
        return st;
    }
    case TK_NORM_SEQUENCE: {
        tk_buf cur = {0}, next = {0};
        if (tk_buf_put(&cur, s, n)) return tk_nomem();
        for (int k = 0; k < nm->n_sub; k++) {
            next.n = 0;
            loom_status st = tk_norm_apply(&nm->sub[k], cur.p, cur.n, &next, md);
            if (st) {
                tk_buf_free(&cur);
                tk_buf_free(&next);
                return st;
            }
            tk_buf t = cur;
            cur = next;
            next = t;
        }
        int bad = tk_buf_put(out, cur.p, cur.n);
        tk_buf_free(&cur);
        tk_buf_free(&next);
        return bad ? tk_nomem() : LOOM_OK;
    }
    }
    return loom_err(LOOM_ERR_INTERNAL, "normalizer: bad type %d", nm->type);
}

/* ---- pre-tokenizers ----------------------------------------------------------- */

static int parse_behavior(const char *b) {
    if (!b) return -1;
    if (!strcmp(b, "Removed")) return TK_SPLIT_REMOVED;
    if (!strcmp(b, "Isolated")) return TK_SPLIT_ISOLATED;
    if (!strcmp(b, "MergedWithPrevious")) return TK_SPLIT_MERGED_PREV;
    if (!strcmp(b, "MergedWithNext")) return TK_SPLIT_MERGED_NEXT;
    if (!strcmp(b, "Contiguous")) return TK_SPLIT_CONTIGUOUS;
    return -1;
}

loom_status tk_pre_parse(const cJSON *j, tk_pre *out) {
    memset(out, 0, sizeof *out);
    const char *type = tk_jstr(j, "type");
    if (!type)
        return loom_err(LOOM_ERR_FORMAT, "pre_tokenizer: expected a \"type\" string");
    if (!strcmp(type, "Split")) {
        out->type = TK_PRE_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        if (!pat) return loom_err(LOOM_ERR_FORMAT, "pre_tokenizer Split: expected \"pattern\"");
        loom_status st = tk_pattern_parse(pat, &out->pat, "pre_tokenizer Split");
        if (st) return st;
        const char *b = tk_jstr(j, "behavior");
        out->behavior = parse_behavior(b);
        if (out->behavior < 0)
            return loom_err(LOOM_ERR_FORMAT,
                            "pre_tokenizer Split: expected behavior Removed, Isolated, "
                            "MergedWithPrevious, MergedWithNext or Contiguous, found \"%s\"",
                            b ? b : "(none)");
        out->invert = tk_jbool(j, "invert", 0);
    } else if (!strcmp(type, "ByteLevel")) {
        out->type = TK_PRE_BYTELEVEL;
        out->add_prefix_space = tk_jbool(j, "add_prefix_space", 1);
        out->use_regex = tk_jbool(j, "use_regex", 1);
        if (out->use_regex) {
            loom_status st = regex_compile(&out->pat.re, gpt2_regex,
                                           strlen(gpt2_regex), "pre_tokenizer ByteLevel");
            if (st) return st;
        }
    } else if (!strcmp(type, "Metaspace")) {
        out->type = TK_PRE_METASPACE;
        out->replacement = tk_first_cp(tk_jstr(j, "replacement"), 0x2581);
        out->split = tk_jbool(j, "split", 1);
        const char *ps = tk_jstr(j, "prepend_scheme");
        if (ps) {
            if (!strcmp(ps, "always")) out->prepend_scheme = TK_PREPEND_ALWAYS;
            else if (!strcmp(ps, "first")) out->prepend_scheme = TK_PREPEND_FIRST;
            else if (!strcmp(ps, "never")) out->prepend_scheme = TK_PREPEND_NEVER;
            else
                return loom_err(LOOM_ERR_FORMAT,
                                "pre_tokenizer Metaspace: expected prepend_scheme always, "
                                "first or never, found \"%s\"", ps);
        } else {
            out->prepend_scheme = tk_jbool(j, "add_prefix_space", 1)
                                      ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        }
    } else if (!strcmp(type, "Digits")) {
        out->type = TK_PRE_DIGITS;
        out->individual_digits = tk_jbool(j, "individual_digits", 0);
    } else if (!strcmp(type, "Punctuation")) {
        out->type = TK_PRE_PUNCT;
        const char *b = tk_jstr(j, "behavior");
        out->behavior = b ? parse_behavior(b) : TK_SPLIT_ISOLATED;
        if (out->behavior < 0)
            return loom_err(LOOM_ERR_FORMAT, "pre_tokenizer Punctuation: bad behavior \"%s\"", b);
    } else if (!strcmp(type, "Whitespace")) {
        out->type = TK_PRE_WHITESPACE;
        static const char ws_re[] = "\\w+|[^\\w\\s]+";
        return regex_compile(&out->pat.re, ws_re, strlen(ws_re), "pre_tokenizer Whitespace");
    } else if (!strcmp(type, "WhitespaceSplit")) {
        out->type = TK_PRE_WSSPLIT;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        out->type = TK_PRE_BERT;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        out->type = TK_PRE_CHARDELIM;
        const char *d = tk_jstr(j, "delimiter");
        if (!d || !*d)
            return loom_err(LOOM_ERR_FORMAT, "pre_tokenizer CharDelimiterSplit: expected \"delimiter\"");
        out->replacement = tk_first_cp(d, ' ');
    } else if (!strcmp(type, "Sequence")) {
        out->type = TK_PRE_SEQUENCE;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(a))
            return loom_err(LOOM_ERR_FORMAT, "pre_tokenizer Sequence: expected a \"pretokenizers\" array");
        int n = cJSON_GetArraySize(a);
        out->sub = calloc((size_t)(n ? n : 1), sizeof *out->sub);
        if (!out->sub) return tk_nomem();
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            loom_status st = tk_pre_parse(e, &out->sub[out->n_sub]);
            out->n_sub++;
            if (st) return st;
        }
    } else {
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "pre_tokenizer: expected one of Split, ByteLevel, Metaspace, Digits, "
                        "Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, "
                        "CharDelimiterSplit, Sequence, found type \"%s\"", type);
    }
    return LOOM_OK;
}

void tk_pre_free(tk_pre *p) {
    if (!p) return;
    for (int i = 0; i < p->n_sub; i++) tk_pre_free(&p->sub[i]);
    free(p->sub);
    tk_pattern_free(&p->pat);
    memset(p, 0, sizeof *p);
}

static int pred_digit(uint32_t c, uint32_t a) { (void)a; return tk_is_numeric(c); }
static int pred_punct(uint32_t c, uint32_t a) { (void)a; return tk_is_punct(c); }
static int pred_ws(uint32_t c, uint32_t a) { (void)a; return tk_is_whitespace(c); }
static int pred_eq(uint32_t c, uint32_t a) { return c == a; }

/* Splits one piece by a predicate and behaviour, appending to out. */
static loom_status split_pred(int (*pred)(uint32_t, uint32_t), uint32_t arg,
                              int behavior, const char *s, size_t n,
                              int origin, spans *sp, tk_pieces *out) {
    if (spans_from_pred(pred, arg, s, n, sp)) return tk_nomem();
    spans_behave(sp, behavior, 0);
    return emit_spans(sp, s, origin, out) ? tk_nomem() : LOOM_OK;
}

static loom_status split_pattern(const tk_pattern *p, int behavior, int invert,
                                 const char *s, size_t n, int origin,
                                 spans *sp, tk_pieces *out,
                                 pcre2_match_data *md) {
    if (spans_from_pattern(p, md, s, n, sp))
        return loom_err(LOOM_ERR_INTERNAL, "pre_tokenizer: regex match failed");
    spans_behave(sp, behavior, invert);
    return emit_spans(sp, s, origin, out) ? tk_nomem() : LOOM_OK;
}

static loom_status pre_one(const tk_pre *p, const char *s, size_t n,
                           int origin, tk_pieces *out, spans *sp,
                           tk_buf *tmp, pcre2_match_data *md) {
    switch (p->type) {
    case TK_PRE_SPLIT:
        return split_pattern(&p->pat, p->behavior, p->invert, s, n, origin, sp,
                             out, md);
    case TK_PRE_DIGITS:
        return split_pred(pred_digit, 0,
                          p->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS,
                          s, n, origin, sp, out);
    case TK_PRE_PUNCT:
        return split_pred(pred_punct, 0, p->behavior, s, n, origin, sp, out);
    case TK_PRE_WSSPLIT:
        return split_pred(pred_ws, 0, TK_SPLIT_REMOVED, s, n, origin, sp, out);
    case TK_PRE_CHARDELIM:
        return split_pred(pred_eq, p->replacement, TK_SPLIT_REMOVED, s, n,
                          origin, sp, out);
    case TK_PRE_WHITESPACE:
        return split_pattern(&p->pat, TK_SPLIT_REMOVED, 1, s, n, origin, sp,
                             out, md);
    case TK_PRE_BERT: {
        tk_pieces mid = {0};
        loom_status st = split_pred(pred_ws, 0, TK_SPLIT_REMOVED, s, n, origin,
                                    sp, &mid);
        for (size_t i = 0; !st && i < mid.n; i++)
            st = split_pred(pred_punct, 0, TK_SPLIT_ISOLATED,
                            mid.text.p + mid.v[i].off, mid.v[i].len,
                            mid.v[i].origin, sp, out);
        tk_pieces_free(&mid);
        return st;
    }
    case TK_PRE_BYTELEVEL: {
        tmp->n = 0;
        if (p->add_prefix_space && (n == 0 || s[0] != ' ') && tk_buf_putc(tmp, ' '))
            return tk_nomem();
        if (tk_buf_put(tmp, s, n)) return tk_nomem();
        tk_pieces parts = {0};
        loom_status st = LOOM_OK;
        if (p->use_regex)
            st = split_pattern(&p->pat, TK_SPLIT_ISOLATED, 0, tmp->p, tmp->n,
                               origin, sp, &parts, md);
        else if (tk_pieces_add(&parts, tmp->p, tmp->n, -1, origin))
            st = tk_nomem();
        tk_buf m = {0};
        for (size_t i = 0; !st && i < parts.n; i++) {
            m.n = 0;
            const uint8_t *u = (const uint8_t *)parts.text.p + parts.v[i].off;
            for (size_t k = 0; k < parts.v[i].len; k++)
                if (tk_buf_put_cp(&m, tk_byte_to_cp(u[k]))) { st = tk_nomem(); break; }
            if (!st && tk_pieces_add(out, m.p, m.n, -1, parts.v[i].origin))
                st = tk_nomem();
        }
        tk_buf_free(&m);
        tk_pieces_free(&parts);
        return st;
    }
    case TK_PRE_METASPACE: {
        tmp->n = 0;
        uint8_t rep[4];
        size_t rl = (size_t)utf8proc_encode_char((utf8proc_int32_t)p->replacement, rep);
        uint32_t cp0 = 0;
        if (n) tk_utf8_next(s, n, &cp0);
        int starts = n && (cp0 == p->replacement || cp0 == ' ');
        if (!starts && (p->prepend_scheme == TK_PREPEND_ALWAYS ||
                        (p->prepend_scheme == TK_PREPEND_FIRST && origin)))
            if (tk_buf_put(tmp, rep, rl)) return tk_nomem();
        for (size_t i = 0; i < n; i++) {
            int bad = s[i] == ' ' ? tk_buf_put(tmp, rep, rl) : tk_buf_putc(tmp, s[i]);
            if (bad) return tk_nomem();
        }
        if (!p->split)
            return tk_pieces_add(out, tmp->p, tmp->n, -1, origin) ? tk_nomem() : LOOM_OK;
        /* split may not alias tmp with out; copy through a local list */
        tk_buf own = {0};
        if (tk_buf_put(&own, tmp->p, tmp->n)) return tk_nomem();
        loom_status st = split_pred(pred_eq, p->replacement, TK_SPLIT_MERGED_NEXT,
                                    own.p, own.n, origin, sp, out);
        tk_buf_free(&own);
        return st;
    }
    }
    return loom_err(LOOM_ERR_INTERNAL, "pre_tokenizer: bad type %d", p->type);
}

loom_status tk_pre_apply(const tk_pre *p, tk_pieces *l, pcre2_match_data *md) {
    if (p->type == TK_PRE_SEQUENCE) {
        for (int i = 0; i < p->n_sub; i++) {
            loom_status st = tk_pre_apply(&p->sub[i], l, md);
            if (st) return st;
        }
        return LOOM_OK;
    }
    tk_pieces out = {0};
    spans sp = {0};
    tk_buf tmp = {0};
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < l->n && !st; i++) {
        const tk_piece *pc = &l->v[i];
        const char *s = l->text.p + pc->off;
        if (pc->id >= 0) {
            if (tk_pieces_add(&out, s, pc->len, pc->id, pc->origin)) st = tk_nomem();
            continue;
        }
        st = pre_one(p, s, pc->len, pc->origin, &out, &sp, &tmp, md);
    }
    free(sp.v);
    tk_buf_free(&tmp);
    if (st) {
        tk_pieces_free(&out);
        return st;
    }
    tk_pieces_free(l);
    *l = out;
    return LOOM_OK;
}
