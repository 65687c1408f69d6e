/* tokenize internals: the in-memory form of a Hugging Face tokenizer.json
 * shared by the loader, the encoder pipeline and the decoders. Not part of
 * the public surface (that is tokenizer.h).
 *
 * Encode pipeline (mirrors the reference library, in this order):
 *   1. added tokens with normalized=false are cut out of the raw text
 *      (leftmost-longest match, honouring lstrip/rstrip/single_word);
 *   2. every remaining segment is normalized on its own, then added tokens
 *      with normalized=true are cut out of the normalized text;
 *   3. the pre-tokenizer splits each remaining segment into words;
 *   4. the model (BPE) turns each word into ids;
 *   5. with add_special, the post-processor adds BOS/EOS ids.
 * Decode maps ids to token strings and runs the decoder chain over the list.
 */
#ifndef LOOM_TOK_INTERNAL_H
#define LOOM_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/base.h"
#include "tokenize/tokenizer.h"

/* ---- growable buffers ---------------------------------------------------- */

typedef struct tk_buf {
    char *p;        /* owned, NUL-terminated when n > 0 after tk_buf_put */
    size_t n, cap;
} tk_buf;

int tk_buf_reserve(tk_buf *b, size_t extra);   /* 0 ok, -1 out of memory */
int tk_buf_put(tk_buf *b, const void *s, size_t n);
int tk_buf_putc(tk_buf *b, int c);
int tk_buf_put_cp(tk_buf *b, uint32_t cp);     /* appends UTF-8 of cp */
void tk_buf_free(tk_buf *b);

typedef struct tk_ids {
    int32_t *v;     /* owned */
    size_t n, cap;
} tk_ids;
int tk_ids_push(tk_ids *a, int32_t id);

/* A list of text pieces carved out of one buffer. id >= 0 marks a piece that
 * is already a token (an added token); origin marks a piece that starts at
 * offset 0 of the caller's original text (Metaspace prepend_scheme=first). */
typedef struct tk_piece {
    size_t off, len;  /* byte range in the list's text */
    int32_t id;
    int origin;
} tk_piece;

typedef struct tk_pieces {
    tk_buf text;
    tk_piece *v;      /* owned */
    size_t n, cap;
} tk_pieces;

int tk_pieces_add(tk_pieces *l, const char *s, size_t n, int32_t id, int origin);
void tk_pieces_free(tk_pieces *l);

/* ---- JSON fast path (tok_json.c) ------------------------------------------ */

typedef struct tk_span_t {
    size_t s, e;      /* byte range of a JSON value in the text; e == 0: none */
} tk_span_t;

typedef struct tk_lex {
    const char *p, *e, *base;   /* cursor, end, start of the whole text */
} tk_lex;

void tk_lex_ws(tk_lex *x);
/* Reads a string at x (appending its UTF-8 to out when out != NULL). */
int tk_lex_string(tk_lex *x, tk_buf *out);
int tk_lex_int(tk_lex *x, long long *v);
/* Skips one value of any kind. */
int tk_lex_skip(tk_lex *x, int depth);
/* Finds the values of model.vocab (an object) and model.merges (an array)
 * in a tokenizer.json text. -1 if the text is not valid JSON as far as the
 * lexer can tell. */
int tk_json_locate_model(const char *js, size_t n, tk_span_t *vocab,
                         tk_span_t *merges);

/* ---- UTF-8 ------------------------------------------------------------------ */

/* Decodes one code point of valid UTF-8 at s (n bytes left); returns its
 * length in bytes (1..4) and the code point in *cp. Invalid input yields
 * length 1 and cp 0xFFFD. */
int tk_utf8_next(const char *s, size_t n, uint32_t *cp);
/* 1 if s[0..n) is valid UTF-8. */
int tk_utf8_valid(const char *s, size_t n);
/* Length of the valid-but-incomplete UTF-8 sequence that ends s[0..n), as the
 * lossy decoder would see it (0 if the text ends on a character boundary or
 * in an invalid sequence). */
size_t tk_utf8_incomplete_tail(const char *s, size_t n);
/* Appends s[0..n) to out with every ill-formed subsequence replaced by one
 * U+FFFD (maximal-subpart rule, as Rust's String::from_utf8_lossy does). */
int tk_utf8_lossy(tk_buf *out, const char *s, size_t n);

/* Character classes as the reference uses them (Rust char methods). */
int tk_is_whitespace(uint32_t cp);   /* char::is_whitespace */
int tk_is_alnum_word(uint32_t cp);   /* regex \w */
int tk_is_numeric(uint32_t cp);      /* char::is_numeric */
int tk_is_punct(uint32_t cp);        /* ascii punctuation or Unicode P* */

/* ---- string -> id hash (ids index into a string table) --------------------- */

typedef struct tk_strtab {
    const char **s;     /* [n] borrowed pointers into an arena; NULL = hole */
    uint32_t *len;      /* [n] */
    int32_t n;
} tk_strtab;

typedef struct tk_strmap {
    uint32_t *hash;     /* [cap] */
    int32_t *id;        /* [cap], -1 = empty */
    size_t cap;         /* power of two */
} tk_strmap;

uint32_t tk_hash(const char *s, size_t n);
int tk_strmap_init(tk_strmap *m, size_t n_keys);
/* Inserts s -> id (overwriting an equal key). The key text is read back
 * through tab when comparing. */
void tk_strmap_put(tk_strmap *m, const tk_strtab *tab, const char *s,
                   size_t n, int32_t id);
int32_t tk_strmap_get(const tk_strmap *m, const tk_strtab *tab, const char *s,
                      size_t n);
void tk_strmap_free(tk_strmap *m);

/* ---- small shared helpers ------------------------------------------------ */

struct cJSON;
loom_status tk_nomem(void);                  /* sets and returns LOOM_ERR_NOMEM */
const char *tk_jstr(const struct cJSON *o, const char *k);  /* NULL if absent */
int tk_jbool(const struct cJSON *o, const char *k, int dflt);
int tk_jint(const struct cJSON *o, const char *k, int dflt);
char *tk_dup_str(const char *s, size_t *len);
uint32_t tk_first_cp(const char *s, uint32_t dflt); /* first code point */

/* ---- components -------------------------------------------------------- */

typedef struct tk_regex {
    pcre2_code *code;          /* owned */
} tk_regex;

/* A pattern is a literal string or a regex; literal strings are matched
 * directly. */
typedef struct tk_pattern {
    char *str;                 /* owned literal, or NULL */
    size_t str_len;
    tk_regex re;               /* when str == NULL */
} tk_pattern;

enum tk_norm_type {
    TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD, TK_NORM_LOWER,
    TK_NORM_REPLACE, TK_NORM_PREPEND, TK_NORM_APPEND, TK_NORM_STRIP,
    TK_NORM_STRIP_ACCENTS, TK_NORM_SEQUENCE, TK_NORM_BERT,
};

typedef struct tk_norm {
    int type;
    tk_pattern pat;            /* REPLACE */
    char *content;             /* REPLACE, PREPEND, APPEND: owned */
    size_t content_len;
    int left, right;           /* STRIP */
    int clean_text, chinese, strip_accents, lowercase; /* BERT */
    struct tk_norm *sub;       /* SEQUENCE: owned [n_sub] */
    int n_sub;
} tk_norm;

enum tk_behavior {
    TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_MERGED_PREV,
    TK_SPLIT_MERGED_NEXT, TK_SPLIT_CONTIGUOUS,
};

enum tk_pre_type {
    TK_PRE_SPLIT, TK_PRE_BYTELEVEL, TK_PRE_METASPACE, TK_PRE_DIGITS,
    TK_PRE_PUNCT, TK_PRE_WHITESPACE, TK_PRE_WSSPLIT, TK_PRE_BERT,
    TK_PRE_CHARDELIM, TK_PRE_SEQUENCE,
};

enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER };

typedef struct tk_pre {
    int type;
    tk_pattern pat;            /* SPLIT */
    int behavior, invert;      /* SPLIT, PUNCT */
    int add_prefix_space;      /* BYTELEVEL */
    int use_regex;             /* BYTELEVEL */
    uint32_t replacement;      /* METASPACE, CHARDELIM (delimiter) */
    int prepend_scheme, split; /* METASPACE */
    int individual_digits;     /* DIGITS */
    struct tk_pre *sub;        /* SEQUENCE: owned [n_sub] */
    int n_sub;
} tk_pre;

enum tk_dec_type {
    TK_DEC_BYTELEVEL, TK_DEC_METASPACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE,
    TK_DEC_STRIP, TK_DEC_REPLACE, TK_DEC_WORDPIECE, TK_DEC_BPE,
    TK_DEC_SEQUENCE,
};

typedef struct tk_dec {
    int type;
    tk_pattern pat;            /* REPLACE */
    char *content;             /* REPLACE (replacement text), BPE suffix,
                                  WORDPIECE prefix: owned */
    size_t content_len;
    uint32_t ch;               /* STRIP content, METASPACE replacement */
    int start, stop;           /* STRIP */
    int prepend;               /* METASPACE: strips on the first token */
    int cleanup;               /* WORDPIECE */
    struct tk_dec *sub;        /* SEQUENCE: owned [n_sub] */
    int n_sub;
} tk_dec;

typedef struct tk_added {
    const char *content;       /* borrowed from the arena */
    uint32_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tk_added;

/* Byte trie over added-token contents: leftmost-longest matching. */
typedef struct tk_trie_node {
    int32_t child;             /* first child node, -1 none */
    int32_t sibling;           /* next sibling, -1 none */
    int32_t token;             /* index into added[], -1 if not terminal */
    uint8_t byte;
} tk_trie_node;

typedef struct tk_trie {
    tk_trie_node *nodes;       /* owned; node 0 is the root */
    int32_t n, cap;
    int32_t root_child[256];   /* fast first step */
} tk_trie;

typedef struct tk_merge_map {
    uint64_t *key;             /* [cap] (left << 32 | right), UINT64_MAX empty */
    uint32_t *rank;            /* [cap] */
    int32_t *new_id;           /* [cap] */
    size_t cap;
} tk_merge_map;

struct loom_tok {
    char *arena;               /* owned: every token string, NUL-separated */
    size_t arena_len, arena_cap;

    /* model vocabulary (BPE) */
    tk_strtab vocab;           /* id -> string, [vocab.n] */
    tk_strmap vocab_map;       /* string -> id */
    tk_merge_map merges;
    int32_t unk_id;            /* -1 if none */
    int fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix; /* owned or NULL */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_ids[256];     /* <0xNN> ids for byte_fallback, -1 absent */

    /* added tokens */
    tk_added *added;           /* owned [n_added] */
    int n_added;
    int32_t *added_of_id;      /* owned [n_ids]: index into added or -1 */
    tk_strtab added_tab;       /* id -> content, for the lookup map */
    tk_strmap added_map;       /* content -> id */
    tk_trie trie_raw;          /* normalized=false tokens */
    tk_trie trie_norm;         /* normalized=true tokens, normalized form */
    int has_norm_added;

    int n_ids;                 /* max id + 1 over vocab and added tokens */

    tk_norm *norm;             /* owned or NULL */
    tk_pre *pre;               /* owned or NULL */
    tk_dec *dec;               /* owned or NULL */

    /* post-processor, single sequence: prefix ids + text + suffix ids */
    int32_t *post_prefix, *post_suffix; /* owned */
    int n_post_prefix, n_post_suffix;

    /* tokenizer_config.json */
    int32_t bos_id, eos_id, pad_id;
    int add_bos_cfg, add_eos_cfg;   /* -1 unset */
    char *chat_template;            /* owned or NULL */
};

/* Byte-level (GPT-2) alphabet: byte -> code point and back. */
uint32_t tk_byte_to_cp(uint8_t b);
int tk_cp_to_byte(uint32_t cp);     /* -1 if cp is not in the alphabet */

/* components: build from JSON (cJSON items) and free */
struct cJSON;
loom_status tk_norm_parse(const struct cJSON *j, tk_norm *out);
void tk_norm_free(tk_norm *n);
loom_status tk_pre_parse(const struct cJSON *j, tk_pre *out);
void tk_pre_free(tk_pre *p);
loom_status tk_dec_parse(const struct cJSON *j, tk_dec *out);
void tk_dec_free(tk_dec *d);
loom_status tk_pattern_parse(const struct cJSON *j, tk_pattern *out,
                             const char *what);
void tk_pattern_free(tk_pattern *p);

/* Finds the next match of p in s[0..n) at or after from. Returns 1 and the
 * range, 0 if none, -1 on a regex engine error. */
int tk_pattern_find(const tk_pattern *p, pcre2_match_data *md, const char *s,
                    size_t n, size_t from, size_t *ms, size_t *me);

/* Applies a normalizer to s[0..n), appending the result to out. */
loom_status tk_norm_apply(const tk_norm *nm, const char *s, size_t n,
                          tk_buf *out, pcre2_match_data *md);
/* Runs a pre-tokenizer over a list of pieces (pieces with id >= 0 pass
 * through). Replaces *l with the result. */
loom_status tk_pre_apply(const tk_pre *p, tk_pieces *l, pcre2_match_data *md);

/* BPE: appends the ids of one word. scratch is reused between calls. */
typedef struct tk_bpe_scratch {
    void *sym; size_t sym_cap;
    void *heap; size_t heap_cap;
} tk_bpe_scratch;
loom_status tk_bpe_word(const loom_tok *t, const char *w, size_t n,
                        tk_ids *out, tk_bpe_scratch *sc);
void tk_bpe_scratch_free(tk_bpe_scratch *sc);
/* Builds the merge table from the model.merges array at span of js
 * (span.e == 0: no merges). Needs the vocabulary loaded. */
loom_status tk_merges_build(loom_tok *t, const char *js, tk_span_t span);
void tk_merge_map_free(tk_merge_map *m);

/* Decoding context for the streaming detokenizer: decoding a window of the
 * token stream must give exactly the same text as the whole stream does for
 * that stretch. */
typedef struct tk_dec_ctx {
    int at_start;      /* the window starts at token 0 of the stream */
    int strip_left;    /* leading Strip budget still unused (fused output) */
    int final;         /* no more tokens will follow */
    int unsafe;        /* out: the window's end is not a stable boundary */
} tk_dec_ctx;

/* Reusable buffers for the decoder chain (a streaming detokenizer keeps
 * one so that decoding a token allocates nothing once warm). */
typedef struct tk_dec_scratch {
    tk_pieces cur, spare;
    tk_buf b, b2;
    pcre2_match_data *md;
} tk_dec_scratch;
void tk_dec_scratch_free(tk_dec_scratch *s);

/* Decodes a list of token strings through the decoder chain dec (NULL:
 * tokens joined by single spaces), appending to out. scratch may be NULL. */
loom_status tk_decode_tokens(const tk_dec *dec, const tk_pieces *toks,
                             tk_dec_ctx *ctx, tk_buf *out,
                             tk_dec_scratch *scratch);
/* Strip budget a fresh stream starts with. */
int tk_dec_initial_strip(const tk_dec *d);
/* Appends the bytes a byte-level token stands for; -1 when out of memory. */
int tk_bytelevel_bytes(const char *s, size_t n, tk_buf *b);

#endif
