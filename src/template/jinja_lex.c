/* template/jinja_lex: the lexer of the Jinja engine: template source to the
 * tokens of jinja_lex.h.
 *
 * Whitespace follows Jinja's lexer with trim_blocks and lstrip_blocks on (as
 * transformers compiles chat templates):
 *   - the source has \r\n and \r turned into \n and one trailing \n dropped;
 *   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`,
 *     `-#}` strip all whitespace after it;
 *   - lstrip_blocks: before `{%` or `{#` (not `{{`), spaces and tabs back to
 *     the start of the line are removed when nothing else is on that line
 *     before the tag; `{%+` turns this off for one tag;
 *   - trim_blocks: one newline right after `%}` or `#}` is removed; `+%}`
 *     turns this off for one tag. */
#include "template/jinja_lex.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    jarena *a;
    tok *t;             /* heap; handed to the caller */
    size_t nt, cap;
    loom_status st;
} lexer;

#define perr(p, line, ...) jinja_syntax_err(&(p)->st, (line), __VA_ARGS__)

loom_status jinja_syntax_err(loom_status *st, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (*st == LOOM_OK)
        *st = loom_err(LOOM_ERR_FORMAT, "template line %d: %s", line, msg);
    return *st;
}

static tok *push_tok(lexer *p, int type, int line) {
    if (p->nt == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        tok *nt = realloc(p->t, cap * sizeof *nt);
        if (!nt) {
            p->st = loom_err(LOOM_ERR_NOMEM, "template: out of memory");
            return NULL;
        }
        p->t = nt;
        p->cap = cap;
    }
    tok *t = &p->t[p->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

/* ---- lexer --------------------------------------------------------------- */

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int is_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (unsigned char)c >= 0x80;
}
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int count_nl(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

static void emit_text(lexer *p, const char *s, size_t n, int line) {
    if (!n) return;
    tok *t = push_tok(p, T_TEXT, line);
    if (!t) return;
    t->s = s;
    t->n = n;
}

/* Decodes a string literal body the way Jinja does (Python unicode-escape
 * over the raw text): \n \t \r \\ \' \" \xNN \uNNNN \UNNNNNNNN, octal, and
 * unknown escapes keep their backslash. */
static const char *decode_string(lexer *p, const char *s, size_t n, size_t *outn) {
    loom_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            loom_buf_putc(&b, c);
            continue;
        }
        char e = s[++i];
        int hexlen = 0;
        switch (e) {
        case 'n': loom_buf_putc(&b, '\n'); break;
        case 't': loom_buf_putc(&b, '\t'); break;
        case 'r': loom_buf_putc(&b, '\r'); break;
        case 'a': loom_buf_putc(&b, '\a'); break;
        case 'b': loom_buf_putc(&b, '\b'); break;
        case 'f': loom_buf_putc(&b, '\f'); break;
        case 'v': loom_buf_putc(&b, '\v'); break;
        case '\\': loom_buf_putc(&b, '\\'); break;
        case '\'': loom_buf_putc(&b, '\''); break;
        case '"': loom_buf_putc(&b, '"'); break;
        case '\n': break; /* line continuation */
        case 'N': /* \N{NAME}: no name table here; a template never needs one */
            free(b.p);
            return NULL;
        case 'x': hexlen = 2; break;
        case 'u': hexlen = 4; break;
        case 'U': hexlen = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                int v = 0, k = 0;
                while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') {
                    v = v * 8 + (s[i] - '0');
                    i++;
                    k++;
                }
                i--;
                ju_encode(&b, v);
            } else {
                loom_buf_putc(&b, '\\');
                loom_buf_putc(&b, e);
            }
        }
        if (hexlen) {
            int32_t v = 0;
            int ok = i + (size_t)hexlen < n;
            for (int k = 1; ok && k <= hexlen; k++) {
                char h = s[i + (size_t)k];
                v <<= 4;
                if (h >= '0' && h <= '9') v |= h - '0';
                else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
                else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
                else ok = 0;
            }
            if (ok && v >= 0 && v <= 0x10ffff) {
                ju_encode(&b, v);
                i += (size_t)hexlen;
            } else {
                /* Python's unicode_escape rejects these */
                free(b.p);
                return NULL;
            }
        }
    }
    const char *r = jar_strdup(p->a, b.p ? b.p : "", b.len);
    *outn = b.len;
    free(b.p);
    return r;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-/*%~[](){}<>=.:|,;";

/* Lexes the inside of a {{ }} or {% %} tag starting at *pos; stops after the
 * end delimiter. Returns 0 on error. */
static int lex_tag(lexer *p, const char *src, size_t n, size_t *pos, int *line,
                   int block, int *line_starting) {
    size_t i = *pos;
    int depth = 0;
    for (;;) {
        while (i < n && is_ws(src[i])) {
            if (src[i] == '\n') (*line)++;
            i++;
        }
        if (i >= n)
            return perr(p, *line, "unexpected end of template: tag not closed, expected '%s'",
                        block ? "%}" : "}}"), 0;
        char c = src[i];
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            int mod = 0;
            /* `-}}`, `-%}` and `+%}`: Jinja has no `+}}` */
            if ((c == '-' || (c == '+' && block)) && i + 2 < n && src[i + 1] == end[0] &&
                src[i + 2] == end[1])
                mod = c;
            if (mod || (c == end[0] && i + 1 < n && src[i + 1] == end[1])) {
                tok *t = push_tok(p, block ? T_BLOCK_END : T_VAR_END, *line);
                if (!t) return 0;
                i += mod ? 3 : 2;
                char last = 0;
                if (mod == '-') {
                    while (i < n && is_ws(src[i])) {
                        if (src[i] == '\n') (*line)++;
                        last = src[i++];
                    }
                } else if (mod == 0 && block && i < n && src[i] == '\n') {
                    (*line)++;
                    last = src[i++];
                }
                *line_starting = last == '\n';
                *pos = i;
                return 1;
            }
        }
        if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && src[j] != c) {
                if (src[j] == '\\' && j + 1 < n) j++;
                j++;
            }
            if (j >= n) return perr(p, *line, "unterminated string literal"), 0;
            tok *t = push_tok(p, T_STRING, *line);
            if (!t) return 0;
            t->s = decode_string(p, src + i + 1, j - i - 1, &t->n);
            if (!t->s) return perr(p, *line, "malformed or unsupported \\x, \\u, \\U or \\N escape"), 0;
            *line += count_nl(src + i, j - i);
            i = j + 1;
            continue;
        }
        if (c == '0' && i + 2 < n && strchr("xXoObB", src[i + 1]) && src[i + 1] &&
            (is_digit(src[i + 2]) || (src[i + 2] | 32) >= 'a')) {
            /* 0x1f, 0o17, 0b101 (underscores allowed), as Jinja lexes them */
            int base = (src[i + 1] | 32) == 'x' ? 16 : (src[i + 1] | 32) == 'o' ? 8 : 2;
            size_t j = i + 2;
            int64_t v = 0;
            int digits = 0;
            for (; j < n; j++) {
                char d = src[j];
                int dv = d >= '0' && d <= '9' ? d - '0' : (d | 32) >= 'a' && (d | 32) <= 'f'
                         ? (d | 32) - 'a' + 10 : d == '_' ? -2 : -1;
                if (dv == -2) continue;
                if (dv < 0 || dv >= base) break;
                if (v > (INT64_MAX - dv) / base)
                    return perr(p, *line, "integer literal too large"), 0;
                v = v * base + dv;
                digits++;
            }
            if (digits) {
                tok *t = push_tok(p, T_INT, *line);
                if (!t) return 0;
                t->i = v;
                i = j;
                continue;
            }
        }
        if (is_digit(c)) {
            size_t j = i;
            char tmp[128];
            size_t k = 0;
            int isf = 0;
            while (j < n && (is_digit(src[j]) || src[j] == '_')) {
                if (src[j] != '_' && k < sizeof tmp - 1) tmp[k++] = src[j];
                j++;
            }
            if (j + 1 < n && src[j] == '.' && is_digit(src[j + 1])) {
                isf = 1;
                if (k < sizeof tmp - 1) tmp[k++] = src[j];
                j++;
                while (j < n && (is_digit(src[j]) || src[j] == '_')) {
                    if (src[j] != '_' && k < sizeof tmp - 1) tmp[k++] = src[j];
                    j++;
                }
            }
            if (j < n && (src[j] == 'e' || src[j] == 'E')) {
                size_t e = j + 1;
                if (e < n && (src[e] == '+' || src[e] == '-')) e++;
                if (e < n && is_digit(src[e])) {
                    isf = 1;
                    while (j < e && k < sizeof tmp - 1) tmp[k++] = src[j++];
                    while (j < n && is_digit(src[j])) {
                        if (k < sizeof tmp - 1) tmp[k++] = src[j];
                        j++;
                    }
                }
            }
            if (!isf && c == '0') {
                /* an integer never starts with 0 in Jinja: "01" is 0 then 1 */
                j = i + 1;
                while (j + 1 < n && src[j] == '_' && src[j + 1] == '0') j += 2;
                while (j < n && src[j] == '0') j++;
                tmp[0] = '0';
                k = 1;
            }
            tmp[k] = 0;
            /* digits past the buffer would change the value silently */
            size_t digits = 0;
            for (size_t q = i; q < j; q++) digits += src[q] != '_';
            if (digits > sizeof tmp - 1 && !(!isf && c == '0'))
                return perr(p, *line, "numeric literal longer than %zu characters", sizeof tmp - 1), 0;
            tok *t = push_tok(p, isf ? T_FLOAT : T_INT, *line);
            if (!t) return 0;
            if (isf) t->f = strtod(tmp, NULL);
            else {
                errno = 0;
                t->i = strtoll(tmp, NULL, 10);
                if (errno) return perr(p, *line, "integer literal too large: %s", tmp), 0;
            }
            i = j;
            continue;
        }
        if (is_alpha(c)) {
            size_t j = i;
            while (j < n && (is_alpha(src[j]) || is_digit(src[j]))) j++;
            tok *t = push_tok(p, T_NAME, *line);
            if (!t) return 0;
            t->s = src + i;
            t->n = j - i;
            i = j;
            continue;
        }
        size_t len = 0;
        for (int k = 0; ops2[k]; k++)
            if (i + 1 < n && src[i] == ops2[k][0] && src[i + 1] == ops2[k][1]) len = 2;
        if (!len && strchr(ops1, c) && c) len = 1;
        if (!len) return perr(p, *line, "unexpected character '%c'", c), 0;
        if (len == 1) {
            if (c == '(' || c == '[' || c == '{') depth++;
            else if (c == ')' || c == ']' || c == '}') {
                if (depth == 0) return perr(p, *line, "unexpected '%c'", c), 0;
                depth--;
            }
        }
        tok *t = push_tok(p, T_OP, *line);
        if (!t) return 0;
        t->s = src + i;
        t->n = len;
        i += len;
    }
}

/* Matches `{%[-+]? raw [-]?%}` at src[i]; returns the length or 0. */
static size_t match_tag_word(const char *src, size_t n, size_t i, const char *word,
                             int *strip_before, int *strip_after) {
    size_t j = i + 2;
    *strip_before = 0;
    *strip_after = 0;
    if (j < n && (src[j] == '-' || src[j] == '+')) {
        *strip_before = src[j] == '-';
        j++;
    }
    while (j < n && is_ws(src[j])) j++;
    size_t wl = strlen(word);
    if (j + wl > n || memcmp(src + j, word, wl)) return 0;
    j += wl;
    if (j < n && (is_alpha(src[j]) || is_digit(src[j]))) return 0;
    while (j < n && is_ws(src[j])) j++;
    if (j < n && src[j] == '-') {
        *strip_after = 1;
        j++;
    }
    if (j + 1 < n && src[j] == '%' && src[j + 1] == '}') return j + 2 - i;
    return 0;
}

static void lex(lexer *p, const char *src, size_t n) {
    size_t pos = 0;
    int line = 1, line_starting = 1;
    while (pos < n && p->st == LOOM_OK) {
        size_t start = pos;
        while (start + 1 < n && !(src[start] == '{' && (src[start + 1] == '{' ||
                                                         src[start + 1] == '%' ||
                                                         src[start + 1] == '#')))
            start++;
        if (start + 1 >= n) {
            emit_text(p, src + pos, n - pos, line);
            return;
        }
        char kind = src[start + 1];
        char mod = start + 2 < n && (src[start + 2] == '-' || src[start + 2] == '+')
                       ? src[start + 2] : 0;
        size_t tlen = start - pos;
        const char *text = src + pos;
        int text_line = line;
        line += count_nl(text, tlen);
        if (mod == '-') {
            while (tlen && is_ws(text[tlen - 1])) tlen--;
        } else if (mod != '+' && kind != '{') {
            size_t l = tlen;
            while (l && text[l - 1] != '\n') l--;
            if (l > 0 || line_starting) {
                size_t k = l;
                while (k < tlen && is_ws(text[k])) k++;
                if (k == tlen) tlen = l;
            }
        }
        emit_text(p, text, tlen, text_line);
        if (kind == '#') {
            size_t e = start + 2;
            while (e + 1 < n && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= n) {
                perr(p, line, "unclosed comment: expected '#}'");
                return;
            }
            line += count_nl(src + start, e - start);
            char before = e > start + 2 ? src[e - 1] : 0;
            pos = e + 2;
            char last = '}';
            if (before == '-') {
                while (pos < n && is_ws(src[pos])) {
                    if (src[pos] == '\n') line++;
                    last = src[pos++];
                }
            } else if (before != '+' && pos < n && src[pos] == '\n') {
                line++;
                last = src[pos++];
            }
            line_starting = last == '\n';
            continue;
        }
        int sb, sa;
        size_t rl;
        if (kind == '%' && (rl = match_tag_word(src, n, start, "raw", &sb, &sa))) {
            /* raw: everything up to {% endraw %} is text */
            size_t body = start + rl;
            if (sa) while (body < n && is_ws(src[body])) body++;
            size_t e = body;
            size_t el = 0;
            int esb = 0, esa = 0;
            for (; e + 1 < n; e++)
                if (src[e] == '{' && src[e + 1] == '%' &&
                    (el = match_tag_word(src, n, e, "endraw", &esb, &esa)))
                    break;
            if (!el) {
                perr(p, line, "unclosed raw block: expected '{%% endraw %%}'");
                return;
            }
            size_t bl = e - body;
            if (esb) while (bl && is_ws(src[body + bl - 1])) bl--;
            emit_text(p, src + body, bl, line);
            line += count_nl(src + start, e + el - start);
            pos = e + el;
            char last = '}';
            if (esa) {
                while (pos < n && is_ws(src[pos])) {
                    if (src[pos] == '\n') line++;
                    last = src[pos++];
                }
            } else if (pos < n && src[pos] == '\n') {
                line++;
                last = src[pos++];
            }
            line_starting = last == '\n';
            continue;
        }
        int block = kind == '%';
        if (!push_tok(p, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, line)) return;
        pos = start + 2 + (mod ? 1 : 0);
        if (!lex_tag(p, src, n, &pos, &line, block, &line_starting)) return;
    }
}

loom_status jinja_lex(jarena *a, const char *src, size_t len, tok **toks, size_t *n_toks) {
    *toks = NULL;
    *n_toks = 0;
    /* normalise newlines and drop one trailing newline (keep_trailing_newline
     * is off in transformers' environment) */
    char *s = jar_alloc(a, len + 1);
    if (!s) return loom_err(LOOM_ERR_NOMEM, "template: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lexer p = {.a = a};
    lex(&p, s, n);
    if (p.st == LOOM_OK) push_tok(&p, T_EOF, 1 + count_nl(s, n));
    *toks = p.t;
    *n_toks = p.nt;
    return p.st;
}
