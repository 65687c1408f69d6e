/* tokenize decoding: the decoder chain (tokenizer.json's "decoder") over a
 * list of token strings. Decoding a window of a token stream reports, for
 * the streaming detokenizer (tok_detok.c), whether the window's end is a
 * stable boundary; see tk_dec_ctx. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/tok_internal.h"

loom_status tk_dec_parse(const cJSON *j, tk_dec *out) {
    memset(out, 0, sizeof *out);
    const char *type = tk_jstr(j, "type");
    if (!type) return loom_err(LOOM_ERR_FORMAT, "decoder: expected a \"type\" string");
    if (!strcmp(type, "ByteLevel")) {
        out->type = TK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        out->type = TK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        out->type = TK_DEC_FUSE;
    } else if (!strcmp(type, "Metaspace")) {
        out->type = TK_DEC_METASPACE;
        out->ch = tk_first_cp(tk_jstr(j, "replacement"), 0x2581);
        const char *ps = tk_jstr(j, "prepend_scheme");
        out->prepend = ps ? strcmp(ps, "never") != 0 : tk_jbool(j, "add_prefix_space", 1);
    } else if (!strcmp(type, "Strip")) {
        out->type = TK_DEC_STRIP;
        out->ch = tk_first_cp(tk_jstr(j, "content"), ' ');
        out->start = tk_jint(j, "start", 0);
        out->stop = tk_jint(j, "stop", 0);
        if (out->start < 0 || out->stop < 0)
            return loom_err(LOOM_ERR_FORMAT, "decoder Strip: expected start, stop >= 0");
    } else if (!strcmp(type, "Replace")) {
        out->type = TK_DEC_REPLACE;
        const char *c = tk_jstr(j, "content");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        if (!c || !pat)
            return loom_err(LOOM_ERR_FORMAT, "decoder Replace: expected \"pattern\" and \"content\"");
        loom_status st = tk_pattern_parse(pat, &out->pat, "decoder Replace");
        if (st) return st;
        if (!(out->content = tk_dup_str(c, &out->content_len))) return tk_nomem();
    } else if (!strcmp(type, "WordPiece")) {
        out->type = TK_DEC_WORDPIECE;
        const char *p = tk_jstr(j, "prefix");
        if (!(out->content = tk_dup_str(p ? p : "##", &out->content_len))) return tk_nomem();
        out->cleanup = tk_jbool(j, "cleanup", 1);
    } else if (!strcmp(type, "BPEDecoder")) {
        out->type = TK_DEC_BPE;
        const char *p = tk_jstr(j, "suffix");
        if (!(out->content = tk_dup_str(p ? p : "</w>", &out->content_len))) return tk_nomem();
    } else if (!strcmp(type, "Sequence")) {
        out->type = TK_DEC_SEQUENCE;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(a))
            return loom_err(LOOM_ERR_FORMAT, "decoder Sequence: expected a \"decoders\" array");
        int n = cJSON_GetArraySize(a);
        out->sub = calloc((size_t)(n ? n : 1), sizeof *out->sub);
        if (!out->sub) return tk_nomem();
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            loom_status st = tk_dec_parse(e, &out->sub[out->n_sub]);
            out->n_sub++;
            if (st) return st;
        }
    } else {
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "decoder: expected one of ByteLevel, ByteFallback, Fuse, Metaspace, "
                        "Strip, Replace, WordPiece, BPEDecoder, Sequence, found type \"%s\"",
                        type);
    }
    return LOOM_OK;
}

void tk_dec_free(tk_dec *d) {
    if (!d) return;
    for (int i = 0; i < d->n_sub; i++) tk_dec_free(&d->sub[i]);
    free(d->sub);
    free(d->content);
    tk_pattern_free(&d->pat);
    memset(d, 0, sizeof *d);
}

int tk_dec_initial_strip(const tk_dec *d) {
    if (!d) return 0;
    if (d->type == TK_DEC_STRIP) return d->start;
    int m = 0;
    for (int i = 0; i < d->n_sub; i++) {
        int s = tk_dec_initial_strip(&d->sub[i]);
        if (s > m) m = s;
    }
    return m;
}

/* ---- decoders over token lists ------------------------------------------------ */

typedef struct dstate {
    tk_dec_scratch *s;   /* s->cur is the current list of strings */
    int fused;           /* the list is one string standing for the window */
} dstate;

void tk_dec_scratch_free(tk_dec_scratch *s) {
    tk_pieces_free(&s->cur);
    tk_pieces_free(&s->spare);
    tk_buf_free(&s->b);
    tk_buf_free(&s->b2);
    if (s->md) pcre2_match_data_free(s->md);
    memset(s, 0, sizeof *s);
}

#define TOK(l, i) ((l)->text.p + (l)->v[i].off)

static int byte_token(const char *s, size_t n, uint8_t *b) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return 1;
}

static loom_status replace_in(const tk_pattern *p, const char *with,
                              size_t wl, const char *s, size_t n, tk_buf *o,
                              pcre2_match_data *md) {
    size_t pos = 0, prev = 0, ms, me;
    for (;;) {
        int r = tk_pattern_find(p, md, s, n, pos, &ms, &me);
        if (r < 0) return loom_err(LOOM_ERR_INTERNAL, "decoder Replace: regex match failed");
        if (r == 0 || me == ms) break;
        if (tk_buf_put(o, s + prev, ms - prev) || tk_buf_put(o, with, wl)) return tk_nomem();
        prev = pos = me;
    }
    return tk_buf_put(o, s + prev, n - prev) ? tk_nomem() : LOOM_OK;
}

static int ends_with(const char *s, size_t n, const char *x, size_t xn) {
    return n >= xn && memcmp(s + n - xn, x, xn) == 0;
}

/* Appends the bytes a byte-level token stands for: each character mapped
 * back through the GPT-2 alphabet, or the token's own UTF-8 when it holds a
 * character outside the alphabet (added tokens). */
int tk_bytelevel_bytes(const char *s, size_t n, tk_buf *b) {
    size_t k, mark = b->n;
    for (k = 0; k < n;) {
        uint32_t cp;
        k += (size_t)tk_utf8_next(s + k, n - k, &cp);
        int by = tk_cp_to_byte(cp);
        if (by < 0) break;
        if (tk_buf_putc(b, by)) return -1;
    }
    if (k < n) {
        b->n = mark;
        return tk_buf_put(b, s, n);
    }
    return 0;
}

static loom_status dec_step(const tk_dec *d, dstate *ds, tk_dec_ctx *ctx) {
    if (d->type == TK_DEC_SEQUENCE) {
        for (int i = 0; i < d->n_sub; i++) {
            loom_status st = dec_step(&d->sub[i], ds, ctx);
            if (st) return st;
        }
        return LOOM_OK;
    }
    /* ping-pong between two scratch lists: no allocation once warm */
    tk_pieces *in = &ds->s->cur, *outp = &ds->s->spare;
    outp->n = 0;
    outp->text.n = 0;
    tk_buf *bp = &ds->s->b;
    bp->n = 0;
    loom_status st = LOOM_OK;
    switch (d->type) {
    case TK_DEC_BYTELEVEL:
        for (size_t i = 0; i < in->n && !st; i++)
            if (tk_bytelevel_bytes(TOK(in, i), in->v[i].len, bp)) st = tk_nomem();
        if (!st) {
            tk_buf *o = &ds->s->b2;
            o->n = 0;
            if (!ctx->final && tk_utf8_incomplete_tail(bp->p, bp->n)) ctx->unsafe = 1;
            if (tk_utf8_lossy(o, bp->p ? bp->p : "", bp->n) ||
                tk_pieces_add(outp, o->p ? o->p : "", o->n, -1, 0))
                st = tk_nomem();
        }
        ds->fused = 1;
        break;
    case TK_DEC_BYTEFALLBACK: {
        size_t run = 0;  /* bytes pending in b */
        for (size_t i = 0; i <= in->n && !st; i++) {
            uint8_t by;
            if (i < in->n && byte_token(TOK(in, i), in->v[i].len, &by)) {
                if (tk_buf_putc(bp, by)) st = tk_nomem();
                run++;
                continue;
            }
            if (run) {
                if (i == in->n && !ctx->final) ctx->unsafe = 1;
                if (tk_utf8_valid(bp->p, bp->n)) {
                    if (tk_pieces_add(outp, bp->p, bp->n, -1, 0)) st = tk_nomem();
                } else {
                    for (size_t k = 0; k < run && !st; k++)
                        if (tk_pieces_add(outp, "\xEF\xBF\xBD", 3, -1, 0)) st = tk_nomem();
                }
                bp->n = 0;
                run = 0;
            }
            if (i < in->n && !st && tk_pieces_add(outp, TOK(in, i), in->v[i].len, -1, 0))
                st = tk_nomem();
        }
        break;
    }
    case TK_DEC_FUSE:
        for (size_t i = 0; i < in->n && !st; i++)
            if (tk_buf_put(bp, TOK(in, i), in->v[i].len)) st = tk_nomem();
        if (!st && tk_pieces_add(outp, bp->p ? bp->p : "", bp->n, -1, 0)) st = tk_nomem();
        ds->fused = 1;
        break;
    case TK_DEC_REPLACE:
        for (size_t i = 0; i < in->n && !st; i++) {
            bp->n = 0;
            st = replace_in(&d->pat, d->content, d->content_len, TOK(in, i),
                            in->v[i].len, bp, ds->s->md);
            if (!st && tk_pieces_add(outp, bp->p ? bp->p : "", bp->n, -1, 0)) st = tk_nomem();
        }
        break;
    case TK_DEC_STRIP:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = TOK(in, i);
            size_t n = in->v[i].len, a = 0, z = n;
            int budget = ds->fused ? ctx->strip_left : d->start;
            for (int k = 0; k < budget && a < z; k++) {
                uint32_t cp;
                size_t l = (size_t)tk_utf8_next(s + a, z - a, &cp);
                if (cp != d->ch) break;
                a += l;
                if (ds->fused) ctx->strip_left--;
            }
            if (ds->fused && a < z) ctx->strip_left = 0;
            if (d->stop > 0 && (!ds->fused || ctx->final)) {
                for (int k = 0; k < d->stop && z > a; k++) {
                    size_t q = z - 1;
                    while (q > a && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                    uint32_t cp;
                    tk_utf8_next(s + q, z - q, &cp);
                    if (cp != d->ch) break;
                    z = q;
                }
            } else if (d->stop > 0 && z > a) {
                /* a trailing strip character may be the stream's last */
                size_t q = z - 1;
                while (q > a && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                uint32_t cp;
                tk_utf8_next(s + q, z - q, &cp);
                if (cp == d->ch) ctx->unsafe = 1;
            }
            if (tk_pieces_add(outp, s + a, z - a, -1, 0)) st = tk_nomem();
        }
        break;
    case TK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = TOK(in, i);
            size_t n = in->v[i].len;
            int first = i == 0 && ctx->at_start;
            bp->n = 0;
            for (size_t k = 0; k < n && !st;) {
                uint32_t cp;
                size_t l = (size_t)tk_utf8_next(s + k, n - k, &cp);
                if (cp == d->ch) {
                    if (!(first && d->prepend) && tk_buf_putc(bp, ' ')) st = tk_nomem();
                } else if (tk_buf_put(bp, s + k, l)) {
                    st = tk_nomem();
                }
                k += l;
            }
            if (!st && tk_pieces_add(outp, bp->p ? bp->p : "", bp->n, -1, 0)) st = tk_nomem();
        }
        break;
    case TK_DEC_WORDPIECE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = TOK(in, i);
            size_t n = in->v[i].len;
            int first = i == 0 && (ctx->at_start || ds->fused);
            tk_buf t = {0};
            if (!first) {
                if (n >= d->content_len && memcmp(s, d->content, d->content_len) == 0) {
                    s += d->content_len;
                    n -= d->content_len;
                } else if (tk_buf_putc(&t, ' ')) {
                    st = tk_nomem();
                }
            }
            if (!st && tk_buf_put(&t, s, n)) st = tk_nomem();
            if (!st && d->cleanup) {
                static const char *from[] = {" .", " ?", " !", " ,", " ' ", " n't",
                                             " 'm", " do not", " 's", " 've", " 're"};
                static const char *to[] = {".", "?", "!", ",", "'", "n't",
                                           "'m", " don't", "'s", "'ve", "'re"};
                for (size_t r = 0; r < LOOM_ARRAY_LEN(from) && !st; r++) {
                    tk_buf u = {0};
                    tk_pattern p = {.str = (char *)from[r], .str_len = strlen(from[r])};
                    st = replace_in(&p, to[r], strlen(to[r]), t.p ? t.p : "", t.n, &u, NULL);
                    tk_buf_free(&t);
                    t = u;
                }
            }
            if (!st && tk_pieces_add(outp, t.p ? t.p : "", t.n, -1, 0)) st = tk_nomem();
            tk_buf_free(&t);
        }
        break;
    case TK_DEC_BPE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = TOK(in, i);
            size_t n = in->v[i].len;
            int last = i + 1 == in->n;
            bp->n = 0;
            if (ends_with(s, n, d->content, d->content_len)) {
                if (last && !ctx->final) ctx->unsafe = 1;
                if (tk_buf_put(bp, s, n - d->content_len) ||
                    (!(last && ctx->final) && tk_buf_putc(bp, ' ')))
                    st = tk_nomem();
            } else if (tk_buf_put(bp, s, n)) {
                st = tk_nomem();
            }
            if (!st && tk_pieces_add(outp, bp->p ? bp->p : "", bp->n, -1, 0)) st = tk_nomem();
        }
        break;
    }
    if (st) return st;
    tk_pieces t = *in;
    *in = *outp;
    *outp = t;
    return LOOM_OK;
}

loom_status tk_decode_tokens(const tk_dec *dec, const tk_pieces *toks,
                             tk_dec_ctx *ctx, tk_buf *out,
                             tk_dec_scratch *scratch) {
    if (!dec) {
        /* no decoder: tokens joined by single spaces */
        for (size_t i = 0; i < toks->n; i++) {
            if ((i > 0 || !ctx->at_start) && tk_buf_putc(out, ' ')) return tk_nomem();
            if (tk_buf_put(out, TOK(toks, i), toks->v[i].len)) return tk_nomem();
        }
        return LOOM_OK;
    }
    tk_dec_scratch local = {0};
    dstate ds = {.s = scratch ? scratch : &local, .fused = 0};
    loom_status st = LOOM_OK;
    if (!ds.s->md && !(ds.s->md = pcre2_match_data_create(1, NULL))) st = tk_nomem();
    ds.s->cur.n = 0;
    ds.s->cur.text.n = 0;
    for (size_t i = 0; i < toks->n && !st; i++)
        if (tk_pieces_add(&ds.s->cur, TOK(toks, i), toks->v[i].len, -1, 0)) st = tk_nomem();
    if (!st) st = dec_step(dec, &ds, ctx);
    for (size_t i = 0; i < ds.s->cur.n && !st; i++)
        if (tk_buf_put(out, TOK(&ds.s->cur, i), ds.s->cur.v[i].len)) st = tk_nomem();
    tk_dec_scratch_free(&local);
    return st;
}
