/* tokenize/tok_detok: the streaming detokenizer (loom_detok_*), built on the
 * decoder chain of tok_decode.c and the vocabulary of tokenizer.c.
 *
 * Design: the detokenizer keeps a window of ids whose text is not yet
 * emitted. Each push decodes the window with a tk_dec_ctx describing where
 * the window sits in the stream (at the start or not, how much of a leading
 * Strip is still owed). Decoders report through ctx->unsafe when the
 * window's end could still change with more tokens (an incomplete UTF-8
 * sequence from byte-level tokens, an open run of <0xNN> byte tokens, a
 * trailing character a final Strip may remove). A safe window is emitted
 * whole and the window restarts empty; an unsafe one is kept and decoded
 * again with the next id. Because every decoder's output for a window that
 * ends on a safe boundary equals that stretch of the whole-stream output,
 * the pieces concatenate to exactly loom_tok_decode() of all ids. */
#include <stdlib.h>
#include <string.h>

#include "tokenize/tok_internal.h"

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
        loom_status st = tk_decode_tokens(d->t->dec, &d->toks, &ctx, &d->text, &d->dec);
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
        if (tk_bytelevel_bytes(s, n, &d->pend)) return tk_nomem();
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
