/* tokenize decoding: the decoder chain over a list of token strings, and
 * the streaming detokenizer built on it.
 *
 * Streaming design: the detokenizer keeps a window of ids whose text is not
 * yet emitted. Each push decodes the window with a tk_dec_ctx describing
 * where the window sits in the stream (at the start or not, how much of a
 * leading Strip is still owed). Decoders report through ctx->unsafe when the
 * window's end could still change with more tokens (an incomplete UTF-8
 * sequence from byte-level tokens, an open run of <0xNN> byte tokens, a
 * trailing character a final Strip may remove). A safe window is emitted
 * whole and the window restarts empty; an unsafe one is kept and decoded
 * again with the next id. Because every decoder's output for a window that
 * ends on a safe boundary equals that stretch of the whole-stream output,
 * the pieces concatenate to exactly loom_tok_decode() of all ids. */
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
static int bytelevel_bytes(const char *s, size_t n, tk_buf *b) {
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
            if (bytelevel_bytes(TOK(in, i), in->v[i].len, bp)) st = tk_nomem();
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

loom_status tk_decode_tokens(const loom_tok *t, const tk_pieces *toks,
                             tk_dec_ctx *ctx, tk_buf *out,
                             tk_dec_scratch *scratch) {
    if (!t->dec) {
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
    if (!st) st = dec_step(t->dec, &ds, ctx);
    for (size_t i = 0; i < ds.s->cur.n && !st; i++)
        if (tk_buf_put(out, TOK(&ds.s->cur, i), ds.s->cur.v[i].len)) st = tk_nomem();
    tk_dec_scratch_free(&local);
    return st;
}

/* ---- streaming detokenizer -------------------------------------------------------- */

struct loom_detok {
    const loom_tok *t;    /* borrowed */
    int skip_special;
    int32_t keep[LOOM_DETOK_MAX_KEEP]; /* special ids decoded all the same */
    int n_keep;
    tk_ids window;        /* ids not yet emitted */
    size_t n_seen;        /* tokens in the stream so far (after skipping) */
    size_t win_start;     /* stream index of window[0] */
    int strip_left;       /* committed Strip budget */
    tk_pieces toks;       /* scratch: window token strings */
    tk_buf text;          /* scratch: decoded window */
    tk_dec_scratch dec;   /* scratch for the decoder chain */
    /* The common byte-level case streams bytes instead of windows: the
     * output is the lossy UTF-8 of all token bytes, so everything up to an
     * incomplete final sequence is final. */
    int bytelevel;        /* the decoder is ByteLevel alone */
    tk_buf pend;          /* bytelevel: held bytes (an incomplete sequence) */
    size_t pend_ids;      /* bytelevel: ids (at most) behind the held bytes */
};

loom_status loom_detok_create(const loom_tok *t, int skip_special,
                              loom_detok **out) {
    *out = NULL;
    if (!t) return loom_err(LOOM_ERR_INVALID_ARG, "detok: expected a tokenizer, found NULL");
    loom_detok *d = calloc(1, sizeof *d);
    if (!d) return tk_nomem();
    d->t = t;
    d->skip_special = skip_special;
    d->strip_left = tk_dec_initial_strip(t->dec);
    d->bytelevel = t->dec && t->dec->type == TK_DEC_BYTELEVEL;
    *out = d;
    return LOOM_OK;
}

void loom_detok_free(loom_detok *d) {
    if (!d) return;
    free(d->window.v);
    tk_pieces_free(&d->toks);
    tk_buf_free(&d->text);
    tk_dec_scratch_free(&d->dec);
    tk_buf_free(&d->pend);
    free(d);
}

void loom_detok_reset(loom_detok *d) {
    d->window.n = 0;
    d->n_seen = 0;
    d->win_start = 0;
    d->strip_left = tk_dec_initial_strip(d->t->dec);
    d->pend.n = 0;
    d->pend_ids = 0;
}

size_t loom_detok_pending(const loom_detok *d) {
    return d->bytelevel ? d->pend_ids : d->window.n;
}

/* Byte-level streaming: emits the held bytes up to any incomplete final
 * sequence (all of them when final). */
static loom_status bytelevel_emit(loom_detok *d, int final, const char **piece,
                                  size_t *len) {
    size_t keep = final ? 0 : tk_utf8_incomplete_tail(d->pend.p, d->pend.n);
    d->text.n = 0;
    if (tk_utf8_lossy(&d->text, d->pend.p ? d->pend.p : "", d->pend.n - keep))
        return tk_nomem();
    if (keep) memmove(d->pend.p, d->pend.p + d->pend.n - keep, keep);
    d->pend.n = keep;
    d->pend_ids = LOOM_MIN(d->pend_ids, keep);
    *piece = d->text.p ? d->text.p : "";
    *len = d->text.n;
    return LOOM_OK;
}

/* Decodes the window; on a safe end (or final) emits it and clears it. */
static loom_status detok_run(loom_detok *d, int final, const char **piece,
                             size_t *len) {
    d->toks.n = 0;
    d->toks.text.n = 0;
    for (size_t i = 0; i < d->window.n; i++) {
        size_t n;
        const char *s = loom_tok_id_to_token(d->t, d->window.v[i], &n);
        if (tk_pieces_add(&d->toks, s, n, -1, 0)) return tk_nomem();
    }
    tk_dec_ctx ctx = {.at_start = d->win_start == 0,
                      .strip_left = d->strip_left,
                      .final = final};
    d->text.n = 0;
    if (d->window.n) {
        loom_status st = tk_decode_tokens(d->t, &d->toks, &ctx, &d->text, &d->dec);
        if (st) return st;
    }
    if (ctx.unsafe && !final) {
        *piece = "";
        *len = 0;
        return LOOM_OK;
    }
    d->strip_left = ctx.strip_left;
    d->win_start = d->n_seen;
    d->window.n = 0;
    *piece = d->text.p ? d->text.p : "";
    *len = d->text.n;
    return LOOM_OK;
}

loom_status loom_detok_keep(loom_detok *d, const int32_t *ids, int n) {
    if (n < 0 || n > LOOM_DETOK_MAX_KEEP || (n && !ids))
        return loom_err(LOOM_ERR_INVALID_ARG, "detok_keep: expected 0..%d ids, found %d",
                        LOOM_DETOK_MAX_KEEP, n);
    if (n) memcpy(d->keep, ids, sizeof *ids * (size_t)n);
    d->n_keep = n;
    return LOOM_OK;
}

static int kept(const loom_detok *d, int32_t id) {
    for (int i = 0; i < d->n_keep; i++)
        if (d->keep[i] == id) return 1;
    return 0;
}

loom_status loom_detok_push(loom_detok *d, int32_t id, const char **piece,
                            size_t *len) {
    *piece = "";
    *len = 0;
    if (id < 0 || id >= d->t->n_ids)
        return loom_err(LOOM_ERR_RANGE, "detok: expected a token id in [0, %d), found %d",
                        d->t->n_ids, (int)id);
    size_t n;
    if (!loom_tok_id_to_token(d->t, id, &n)) return LOOM_OK; /* a hole: skipped */
    if (d->skip_special && loom_tok_is_special(d->t, id) && !kept(d, id)) return LOOM_OK;
    if (d->bytelevel) {
        const char *s = loom_tok_id_to_token(d->t, id, &n);
        if (bytelevel_bytes(s, n, &d->pend)) return tk_nomem();
        d->pend_ids++;
        return bytelevel_emit(d, 0, piece, len);
    }
    if (tk_ids_push(&d->window, id)) return tk_nomem();
    d->n_seen++;
    return detok_run(d, 0, piece, len);
}

loom_status loom_detok_flush(loom_detok *d, const char **piece, size_t *len) {
    loom_status st = d->bytelevel ? bytelevel_emit(d, 1, piece, len)
                                  : detok_run(d, 1, piece, len);
    d->n_seen = 0;
    d->win_start = 0;
    d->strip_left = tk_dec_initial_strip(d->t->dec);
    return st;
}

loom_status loom_detok_prime(loom_detok *d, const int32_t *ids, size_t n) {
    loom_detok_reset(d);
    const char *p;
    size_t l;
    for (size_t i = 0; i < n; i++) {
        loom_status st = loom_detok_push(d, ids[i], &p, &l);
        if (st) {
            loom_detok_reset(d);
            return st;
        }
    }
    /* whatever is still held belongs to the context: drop it as emitted */
    if (d->bytelevel) {
        d->pend.n = 0;
        d->pend_ids = 0;
        return LOOM_OK;
    }
    return detok_run(d, 1, &p, &l);
}
