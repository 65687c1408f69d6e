/* textstream: generated ids -> text that is safe to send. Wraps the
 * streaming detokenizer (complete UTF-8 only) and holds back any tail that
 * could still become a stop string, so a stop string never reaches the
 * client, not even in part. One per generated sequence. */
#ifndef LOOM_TEXTSTREAM_H
#define LOOM_TEXTSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "tokenize/tokenizer.h"

typedef struct loom_textstream loom_textstream;

/* stops: n_stops NUL-terminated UTF-8 strings (copied; empty ones ignored).
 * With no tokenizer (tok NULL) the stream takes ids and emits no text. */
loom_status loom_ts_create(const loom_tok *tok, const char *const *stops, int n_stops,
                           int skip_special, loom_textstream **out);
void loom_ts_free(loom_textstream *ts);

/* Special ids to emit even with skip_special (see loom_detok_keep). */
loom_status loom_ts_keep_special(loom_textstream *ts, const int32_t *ids, int n);

/* Decodes the stream as a continuation of context ids (e.g. the last few
 * prompt tokens) so the first generated token gets its leading space right;
 * nothing is emitted for them. Call before the first push. */
loom_status loom_ts_prime(loom_textstream *ts, const int32_t *ids, size_t n);

/* Feeds one generated id. *text and *len receive the text now safe to emit
 * (valid until the next call). When a stop string completes, *stopped is
 * set, the text before it is emitted and the stream ignores further ids. */
loom_status loom_ts_push(loom_textstream *ts, int32_t id, const char **text, size_t *len,
                         int *stopped);
/* The end of generation: emits what was held back (a stop string can still
 * complete here). */
loom_status loom_ts_finish(loom_textstream *ts, const char **text, size_t *len,
                           int *stopped);
/* The stop string that ended the stream (owned by ts), or NULL. */
const char *loom_ts_stop_hit(const loom_textstream *ts);
/* Everything emitted so far, as one string (valid until the next call). */
const char *loom_ts_text(const loom_textstream *ts, size_t *len);

#endif
