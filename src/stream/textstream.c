/* textstream: detokenize, then hold back possible stop-string prefixes. */
#include "stream/textstream.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct loom_textstream {
    loom_detok *detok;       /* owned */
    char **stops;            /* owned [n_stops] */
    size_t *stop_len;        /* owned [n_stops] */
    int n_stops;
    char *all;               /* owned: every emitted byte, then the held tail */
    size_t emitted, len, cap;
    int stopped;
    int hit;                 /* the stop string that stopped it, index into stops */
};

static loom_status reserve(loom_textstream *ts, size_t extra) {
    if (ts->len + extra + 1 <= ts->cap) return LOOM_OK;
    size_t cap = LOOM_MAX(ts->cap * 2, ts->len + extra + 64);
    char *n = realloc(ts->all, cap);
    if (!n) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    ts->all = n;
    ts->cap = cap;
    return LOOM_OK;
}

loom_status loom_ts_create(const loom_tok *tok, const char *const *stops, int n_stops,
                           int skip_special, loom_textstream **out) {
    *out = NULL;
    loom_textstream *ts = calloc(1, sizeof *ts);
    if (!ts) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    loom_status s = tok ? loom_detok_create(tok, skip_special, &ts->detok) : LOOM_OK;
    if (!s && n_stops > 0) {
        ts->stops = calloc((size_t)n_stops, sizeof *ts->stops);
        ts->stop_len = calloc((size_t)n_stops, sizeof *ts->stop_len);
        if (!ts->stops || !ts->stop_len) s = loom_err(LOOM_ERR_NOMEM, "out of memory");
        for (int i = 0; !s && i < n_stops; i++) {
            if (!stops[i] || !stops[i][0]) continue;
            ts->stops[ts->n_stops] = strdup(stops[i]);
            if (!ts->stops[ts->n_stops]) s = loom_err(LOOM_ERR_NOMEM, "out of memory");
            else ts->stop_len[ts->n_stops] = strlen(stops[i]), ts->n_stops++;
        }
    }
    if (!s) s = reserve(ts, 64);
    if (s) {
        loom_ts_free(ts);
        return s;
    }
    *out = ts;
    return LOOM_OK;
}

loom_status loom_ts_keep_special(loom_textstream *ts, const int32_t *ids, int n) {
    return ts->detok ? loom_detok_keep(ts->detok, ids, n) : LOOM_OK; /* no tokenizer: no text */
}

void loom_ts_free(loom_textstream *ts) {
    if (!ts) return;
    loom_detok_free(ts->detok);
    for (int i = 0; i < ts->n_stops; i++) free(ts->stops[i]);
    free(ts->stops);
    free(ts->stop_len);
    free(ts->all);
    free(ts);
}

/* Decides what of the held tail [emitted, len) can go out. With final set
 * nothing is held for possible prefixes. */
static void release(loom_textstream *ts, int final, const char **text, size_t *len,
                    int *stopped) {
    const char *tail = ts->all + ts->emitted;
    size_t n = ts->len - ts->emitted;
    /* A stop string may straddle the old emitted text only if it began in
     * the held tail, which is exactly what the hold-back guarantees. */
    size_t cut = n;
    for (int i = 0; i < ts->n_stops; i++) {
        const char *hit = memmem(tail, n, ts->stops[i], ts->stop_len[i]);
        if (hit && (size_t)(hit - tail) < cut) cut = (size_t)(hit - tail), ts->hit = i;
    }
    size_t out = n;
    if (cut < n) {
        out = cut;
        ts->stopped = 1;
    } else if (!final) {
        size_t hold = 0;
        for (int i = 0; i < ts->n_stops; i++)
            for (size_t k = LOOM_MIN(ts->stop_len[i] - 1, n); k > hold; k--)
                if (!memcmp(tail + n - k, ts->stops[i], k)) {
                    hold = k;
                    break;
                }
        out = n - hold;
    }
    *text = tail;
    *len = out;
    ts->emitted += out;
    if (ts->stopped) ts->len = ts->emitted;
    ts->all[ts->len] = 0;
    *stopped = ts->stopped;
}

loom_status loom_ts_prime(loom_textstream *ts, const int32_t *ids, size_t n) {
    return ts->detok ? loom_detok_prime(ts->detok, ids, n) : LOOM_OK;
}

loom_status loom_ts_push(loom_textstream *ts, int32_t id, const char **text, size_t *len,
                         int *stopped) {
    *text = "";
    *len = 0;
    *stopped = ts->stopped;
    if (ts->stopped || !ts->detok) return LOOM_OK;
    const char *piece;
    size_t n;
    loom_status s = loom_detok_push(ts->detok, id, &piece, &n);
    if (!s) s = reserve(ts, n);
    if (s) return s;
    memcpy(ts->all + ts->len, piece, n);
    ts->len += n;
    release(ts, 0, text, len, stopped);
    return LOOM_OK;
}

loom_status loom_ts_finish(loom_textstream *ts, const char **text, size_t *len, int *stopped) {
    *text = "";
    *len = 0;
    *stopped = ts->stopped;
    if (ts->stopped || !ts->detok) return LOOM_OK;
    const char *piece;
    size_t n;
    loom_status s = loom_detok_flush(ts->detok, &piece, &n);
    if (!s) s = reserve(ts, n);
    if (s) return s;
    memcpy(ts->all + ts->len, piece, n);
    ts->len += n;
    release(ts, 1, text, len, stopped);
    return LOOM_OK;
}

const char *loom_ts_stop_hit(const loom_textstream *ts) {
    return ts->stopped ? ts->stops[ts->hit] : NULL;
}

const char *loom_ts_text(const loom_textstream *ts, size_t *len) {
    if (len) *len = ts->emitted;
    return ts->all;
}
