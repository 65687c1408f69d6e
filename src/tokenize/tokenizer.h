/* tokenize: Hugging Face tokenizer.json (BPE models: byte-level and
 * SentencePiece-style) and a streaming detokenizer.
 *
 * A loom_tok is immutable after loading; every function taking a const
 * loom_tok * may be called from several threads at once. A loom_detok is
 * one stream's state and belongs to one thread.
 *
 * Encoding matches the reference `tokenizers` library on tokenizer.json:
 * added/special tokens are found in the raw text first, the rest goes
 * through normalizer -> pre-tokenizer -> BPE, and add_special applies the
 * file's post-processor (e.g. a BOS id). tokenizer_config.json supplies the
 * bos/eos/pad ids, the chat template and add_bos_token/add_eos_token, which
 * only LOOM_TOK_ADD_SPECIAL_CONFIG applies (the reference library ignores
 * them; transformers applies them for some tokenizer classes). */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

typedef struct loom_tok loom_tok;

/* Loads dir/tokenizer.json and, when present, dir/tokenizer_config.json.
 * On failure *out is NULL and loom_last_error() names the problem. */
loom_status loom_tok_load_dir(const char *dir, loom_tok **out);
/* Loads from explicit paths; config_path may be NULL. */
loom_status loom_tok_load(const char *json_path, const char *config_path,
                          loom_tok **out);
/* Loads from in-memory JSON texts (config_json may be NULL). */
loom_status loom_tok_load_mem(const char *json, size_t json_len,
                              const char *config_json, size_t config_len,
                              loom_tok **out);
void loom_tok_free(loom_tok *t);

/* add_special modes for loom_tok_encode. */
enum {
    LOOM_TOK_NO_SPECIAL = 0,     /* text only (use for rendered chat prompts) */
    LOOM_TOK_ADD_SPECIAL = 1,    /* tokenizer.json's post-processor, as the
                                    reference `tokenizers` library does */
    LOOM_TOK_ADD_SPECIAL_CONFIG = 2, /* as transformers' Llama/Gemma classes:
                                    when tokenizer_config.json sets
                                    add_bos_token / add_eos_token, exactly
                                    those (bos_token, eos_token) wrap the
                                    text; otherwise as ADD_SPECIAL */
};

/* Encodes len bytes of UTF-8 text. *ids receives a malloc'd array the
 * caller releases with free() (NULL when *n_ids is 0). add_special is one
 * of the LOOM_TOK_* modes above. Returns LOOM_ERR_INVALID_ARG for text that
 * is not valid UTF-8 or an unknown mode. */
loom_status loom_tok_encode(const loom_tok *t, const char *text, size_t len,
                            int add_special, int32_t **ids, size_t *n_ids);

/* Decodes ids to UTF-8 text. *text receives a malloc'd NUL-terminated string
 * the caller releases with free(); *len (may be NULL) its length.
 * skip_special drops special added tokens. Ids with no token are skipped;
 * ids < 0 or >= loom_tok_vocab_size() give LOOM_ERR_RANGE. */
loom_status loom_tok_decode(const loom_tok *t, const int32_t *ids, size_t n,
                            int skip_special, char **text, size_t *len);

/* Max id + 1 over the model vocabulary and the added tokens. */
int loom_tok_vocab_size(const loom_tok *t);
/* Id of a token string (added tokens first, then the vocabulary), or -1. */
int32_t loom_tok_token_to_id(const loom_tok *t, const char *s, size_t len);
/* The token string of an id (not NUL-terminated in general: use *len), or
 * NULL for an unknown id. Borrowed; valid while t lives. */
const char *loom_tok_id_to_token(const loom_tok *t, int32_t id, size_t *len);
/* 1 if id is an added token marked special (skipped by skip_special). */
int loom_tok_is_special(const loom_tok *t, int32_t id);
/* The bytes token id stands for in the middle of decoded text (byte-level
 * tokens mapped back through the GPT-2 alphabet, <0xNN> byte tokens as their
 * byte, SentencePiece's U+2581 as a space): a piece of UTF-8 that may be
 * incomplete. Appends at most cap bytes to out and returns the full length,
 * or -1 for a special token or an unknown id (a grammar never allows those
 * as text). */
int loom_tok_token_bytes(const loom_tok *t, int32_t id, char *out, size_t cap);
/* 1 if id is an added token (special or not). */
int loom_tok_is_added(const loom_tok *t, int32_t id);
/* Ids from tokenizer_config.json's bos_token / eos_token / pad_token, or -1. */
int32_t loom_tok_bos_id(const loom_tok *t);
int32_t loom_tok_eos_id(const loom_tok *t);
int32_t loom_tok_pad_id(const loom_tok *t);
/* Ids of the tokens that end a chat turn in this vocabulary (<|im_end|>,
 * <|eot_id|>, <end_of_turn>, ...) and then the eos id, at most cap; returns
 * the count. A chat reply stops at any of them: the template's end-of-turn
 * token is often not the model's EOS (ChatML on a base model). */
int loom_tok_turn_end_ids(const loom_tok *t, int32_t *out, int cap);

/* tokenizer_config.json add_bos_token / add_eos_token: 1, 0, or -1 unset. */
int loom_tok_config_add_bos(const loom_tok *t);
int loom_tok_config_add_eos(const loom_tok *t);
/* tokenizer_config.json chat_template when it is a string, else NULL. */
const char *loom_tok_chat_template(const loom_tok *t);

/* ---- streaming detokenizer ------------------------------------------------

 * Fed one id at a time, returns the text that became final. Holds back
 * incomplete UTF-8 and anything the decoder chain could still change; what
 * it emits is always valid UTF-8. The concatenation of every piece from
 * loom_detok_push plus the piece from loom_detok_flush equals
 * loom_tok_decode() of all the ids pushed (skip_special as given here).
 * Byte-level tokenizers (Qwen, Llama 3, gpt-oss, DeepSeek) emit each
 * character as soon as its last byte arrives. With <0xNN> byte-fallback
 * tokens (Llama 2, Gemma) a run of them is held until the first non-byte
 * token, because decode turns a whole run into U+FFFDs if any byte of it is
 * invalid. No allocation per push once the buffers have grown. */
typedef struct loom_detok loom_detok;

loom_status loom_detok_create(const loom_tok *t, int skip_special,
                              loom_detok **out);
void loom_detok_free(loom_detok *d);
/* Pushes one id. *piece and *len receive the newly final text (len may be 0);
 * the pointer is valid until the next call on d. LOOM_ERR_RANGE for an id
 * outside the vocabulary (nothing changes then). */
loom_status loom_detok_push(loom_detok *d, int32_t id, const char **piece,
                            size_t *len);
/* Ends the stream: returns whatever was held back (an incomplete UTF-8 tail
 * becomes U+FFFD, as decode does) and resets d for a new stream. */
loom_status loom_detok_flush(loom_detok *d, const char **piece, size_t *len);
/* Starts a stream after context whose text the caller already has (e.g.
 * the prompt, or its last few tokens): the ids are decoded as the stream's
 * beginning but nothing is emitted for them, so the first pushed token gets
 * the spacing it has in decode(context + generated) (a SentencePiece "▁Hi"
 * then yields " Hi", not "Hi"). Resets d first. */
loom_status loom_detok_prime(loom_detok *d, const int32_t *ids, size_t n);
/* Forgets the stream without emitting anything. */
void loom_detok_reset(loom_detok *d);
/* Number of pushed ids whose text is still held back. */
size_t loom_detok_pending(const loom_detok *d);
/* Special ids decoded even with skip_special: the markers a tool-call or
 * channel parser reads (gpt-oss <|channel|>, Gemma 4 <|tool_call>). At most
 * LOOM_DETOK_MAX_KEEP ids (copied); replaces the previous set. */
#define LOOM_DETOK_MAX_KEEP 16
loom_status loom_detok_keep(loom_detok *d, const int32_t *ids, int n);

#endif
