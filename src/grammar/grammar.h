/* grammar: constrained decoding. A context-free grammar over bytes, built
 * from a GBNF text (llama.cpp's notation), a regex, a JSON Schema or "any
 * JSON object", and a matcher that says which tokens of a vocabulary may
 * come next.
 *
 * A grammar's rules are alternatives of sequences of elements; an element
 * is a byte set or a rule reference. Char classes over code points become
 * byte sets and small rules of UTF-8 sequences, so a token that ends inside
 * a character is matched byte by byte like any other.
 *
 * Matching (grammar.c, design notes there): the parse state is a set of
 * stacks of grammar positions (a pushdown automaton's configurations), the
 * stacks hash-consed so a state is a small sorted id list, itself interned
 * as a state id. Moving on a byte is memoised per (state, byte), which makes
 * the walk of the vocabulary's byte trie a lazy DFA walk, and a state's
 * token mask is cached. A matcher is then only a state id.
 *
 * Threads: a compiled grammar's caches change as it is used, so all
 * matchers of one grammar run on one thread at a time (the engine thread);
 * compiling happens anywhere. The vocabulary is immutable and shared. */
#ifndef LOOM_GRAMMAR_H
#define LOOM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

struct loom_tok;

/* The vocabulary as bytes: a trie over every token's bytes. Special tokens
 * have none and are never allowed as text (the end of the text is
 * loom_gmatcher_done). */
typedef struct loom_gvocab loom_gvocab;

/* From a tokenizer (loom_tok_token_bytes); n_vocab >= the tokenizer's ids
 * (a model's vocabulary may be larger; the extra ids are never allowed). */
loom_status loom_gvocab_from_tok(const struct loom_tok *t, int n_vocab, loom_gvocab **out);
/* From explicit token bytes: bytes[i] of lens[i] bytes, lens[i] < 0 for a
 * token with none. Copies what it needs. */
loom_status loom_gvocab_create(const char *const *bytes, const int *lens, int n_vocab,
                               loom_gvocab **out);
void loom_gvocab_free(loom_gvocab *v);
int loom_gvocab_size(const loom_gvocab *v);

typedef struct loom_grammar loom_grammar;

/* Compilers. vocab is borrowed (it must outlive the grammar) and may be NULL
 * for a grammar only matched against bytes. On failure *out is NULL and err
 * (cap bytes) says what was expected and found, or what is unsupported. */
loom_status loom_grammar_from_gbnf(const char *text, const loom_gvocab *vocab,
                                   loom_grammar **out, char *err, size_t cap);
/* The whole output must match the regex (anchors implied). */
loom_status loom_grammar_from_regex(const char *re, const loom_gvocab *vocab,
                                    loom_grammar **out, char *err, size_t cap);
/* schema is JSON Schema text. */
loom_status loom_grammar_from_schema(const char *schema, const loom_gvocab *vocab,
                                     loom_grammar **out, char *err, size_t cap);
/* loom_grammar_from_schema with flags: LOOM_SCHEMA_STRICT refuses what
 * would otherwise be approximated (oneOf branches that may overlap, which
 * are written as anyOf without it). */
#define LOOM_SCHEMA_STRICT 1
loom_status loom_grammar_from_schema_ex(const char *schema, int flags, const loom_gvocab *vocab,
                                        loom_grammar **out, char *err, size_t cap);
/* Any JSON object. */
loom_status loom_grammar_json_object(const loom_gvocab *vocab, loom_grammar **out, char *err,
                                     size_t cap);

/* A forced tool call as a model's chat template writes it: begin, then
 * 1..max_calls calls separated by sep, then end; each call is call_open,
 * {"name": NAME, "<args_key>": ARGUMENTS}, call_close, its arguments valid
 * for the tool's parameters schema. */
typedef struct loom_gtool_syntax {
    const char *begin, *end;            /* around all the calls ("" none) */
    const char *call_open, *call_close; /* around each call */
    const char *sep;                    /* between calls; NULL: one call */
    const char *args_key;               /* "arguments", or "parameters" (Llama 3) */
    int max_calls;
} loom_gtool_syntax;

/* tools_json: the request's tools (OpenAI's array of {"type": "function",
 * "function": {"name", "parameters"}}); only: the one tool that must be
 * called, or NULL for any of them. */
loom_status loom_grammar_from_tools(const char *tools_json, const char *only, const loom_gtool_syntax *syn,
                                    const loom_gvocab *vocab, loom_grammar **out, char *err, size_t cap);

/* Text translators behind the compilers: a malloc'd GBNF text (root rule
 * "root"), or NULL with err filled. */
char *loom_grammar_schema_to_gbnf(const char *schema, char *err, size_t cap);
char *loom_grammar_schema_to_gbnf_ex(const char *schema, int flags, char *err, size_t cap);
char *loom_grammar_regex_to_gbnf(const char *re, char *err, size_t cap);
char *loom_grammar_tools_to_gbnf(const char *tools_json, const char *only, const loom_gtool_syntax *syn, char *err,
                                 size_t cap);

/* Grammars are reference counted: the request that uses one retains it. */
loom_grammar *loom_grammar_retain(loom_grammar *g);
void loom_grammar_release(loom_grammar *g);
const loom_gvocab *loom_grammar_vocab(const loom_grammar *g);
/* Parse states met so far (they grow as the grammar is used). */
int loom_grammar_n_states(const loom_grammar *g);

/* 1 if the whole of s[0..n) is in the language. */
int loom_grammar_accepts(loom_grammar *g, const char *s, size_t n);

/* ---- matcher ---------------------------------------------------------- */

/* One sequence's parse state: the bytes accepted so far. Plain value; copy
 * it to keep a state. */
typedef struct loom_gmatcher {
    loom_grammar *g;    /* borrowed */
    int32_t state;      /* interned state id; 0 = dead (nothing can follow) */
} loom_gmatcher;

void loom_gmatcher_init(loom_gmatcher *m, loom_grammar *g);
/* Moves over bytes; returns 0, or -1 (state unchanged) when they leave the
 * language's prefixes. */
int loom_gmatcher_accept_bytes(loom_gmatcher *m, const char *s, size_t n);
/* Moves over a token's bytes (vocab's); -1 for a token that is not allowed. */
int loom_gmatcher_accept_token(loom_gmatcher *m, int32_t id);
/* 1 when the bytes so far are a whole sentence (the text may end here). */
int loom_gmatcher_done(const loom_gmatcher *m);
/* 1 when some byte may follow. */
int loom_gmatcher_can_continue(const loom_gmatcher *m);
/* Sets bit i of bits ([(n_vocab + 31) / 32] words) iff token i's bytes keep
 * the text a prefix of the language. No allocation once the state's mask is
 * cached. Returns the number of allowed tokens. */
int loom_gmatcher_mask(loom_gmatcher *m, uint32_t *bits);

/* loom_gmatcher_mask, then logits[i] = -INFINITY for every token i < n it
 * does not allow (bits is the mask's scratch). Returns the allowed count. */
int loom_gmatcher_mask_logits(loom_gmatcher *m, uint32_t *bits, float *logits, int n);

#endif
