/* loom: LLM inference engine. Public C API.
 *
 * Conventions: handles are opaque; every *_create has a matching *_free
 * (which accepts NULL); parameter structs come from *_default_params() by
 * value. Functions that can fail return loom_status; on failure
 * loom_last_error() returns a message for the calling thread naming what was
 * expected and what was found. The library never prints to stdout and never
 * exits the process. */
#ifndef LOOM_H
#define LOOM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_ERR_INVALID_ARG = 1,  /* a caller mistake: bad parameter or input */
    LOOM_ERR_IO = 2,           /* a file could not be opened, read or mapped */
    LOOM_ERR_FORMAT = 3,       /* a file is malformed (corrupt, truncated) */
    LOOM_ERR_UNSUPPORTED = 4,  /* valid input loom does not handle (arch, dtype) */
    LOOM_ERR_NOMEM = 5,        /* allocation failed or a memory budget is spent */
    LOOM_ERR_RANGE = 6,        /* an index out of range (token id, position) */
    LOOM_ERR_NO_KV = 7,        /* no free KV blocks for the request */
    LOOM_ERR_ABORTED = 8,      /* the caller cancelled the operation */
    LOOM_ERR_INTERNAL = 9,     /* a bug in loom */
} loom_status;

/* Static name of a status ("LOOM_ERR_FORMAT"). */
const char *loom_status_str(loom_status s);

/* The last error message set on this thread ("" if none). Valid until the
 * next loom call on this thread. */
const char *loom_last_error(void);

/* ---- model ------------------------------------------------------------ */

typedef struct loom_model loom_model;

typedef struct loom_model_params {
    int n_threads;        /* worker threads for the CPU backend; 0 = all cores */
} loom_model_params;

loom_model_params loom_model_default_params(void);

/* Loads a Hugging Face model directory (config.json + safetensors). Weights
 * are mapped, not copied. On failure *out is NULL. */
loom_status loom_model_load(const char *dir, const loom_model_params *params,
                            loom_model **out);
void loom_model_free(loom_model *m);

int loom_model_vocab_size(const loom_model *m);
int loom_model_max_positions(const loom_model *m);
/* Architecture name from config.json ("Qwen3ForCausalLM"). */
const char *loom_model_arch(const loom_model *m);
/* End-of-sequence ids (config.json and generation_config.json). Writes up
 * to cap ids and returns how many there are. */
int loom_model_eos_ids(const loom_model *m, int32_t *out, int cap);

/* ---- session: one sequence with its own KV cache ------------------------ */

/* A context holds the KV cache for one token sequence. It is the simplest
 * way to run a model: feed tokens, read logits. (The engine batches many
 * sequences over a shared paged KV pool; a context is a pool of one.) */
typedef struct loom_context loom_context;

typedef struct loom_context_params {
    int n_ctx;            /* max tokens the sequence may hold; 0 = model max */
    int n_batch;          /* max tokens per forward; 0 = 512 */
} loom_context_params;

loom_context_params loom_context_default_params(void);
loom_status loom_context_create(loom_model *m, const loom_context_params *p,
                                loom_context **out);
void loom_context_free(loom_context *c);

/* Appends n tokens to the sequence and runs the model over them. When
 * logits is non-NULL it receives [n, vocab] floats (all positions) if
 * all_logits, else [vocab] for the last token only.
 * Returns LOOM_ERR_RANGE for a token id outside the vocabulary or when the
 * sequence would exceed n_ctx (nothing is appended then). */
loom_status loom_context_eval(loom_context *c, const int32_t *tokens, int n,
                              int all_logits, float *logits);
/* Number of tokens held. */
int loom_context_length(const loom_context *c);
/* Drops every token from position pos on (pos <= length). */
loom_status loom_context_truncate(loom_context *c, int pos);

/* Greedy (temperature 0) generation helper: evaluates the prompt, then
 * produces up to max_tokens ids into out (stopping early at any of the
 * n_stop stop ids, which is included). Returns the count in *n_out. */
loom_status loom_generate_greedy(loom_context *c, const int32_t *prompt,
                                 int n_prompt, int max_tokens,
                                 const int32_t *stop_ids, int n_stop,
                                 int32_t *out, int *n_out);

/* ---- sampling ---------------------------------------------------------- */

typedef struct loom_logit_bias {
    int32_t token;
    float bias;          /* added to the logit; -INFINITY bans the token */
} loom_logit_bias;

/* How a request picks tokens. The steps run in this order: logit bias,
 * repetition penalty (HF style: divide positive logits, multiply negative
 * ones, for every token in the last penalty_last_n tokens of prompt and
 * output), presence and frequency penalties (OpenAI style, over output
 * tokens in the same window), temperature, top-k, top-p, min-p, XTC, then a
 * draw with the request's own random state. Temperature 0 is greedy (argmax
 * after bias and penalties). The same seed gives the same tokens whatever
 * else is running. */
typedef struct loom_sampling {
    float temperature;          /* 0 = greedy */
    int top_k;                  /* 0 = off */
    float top_p;                /* 1 = off */
    float min_p;                /* 0 = off */
    float xtc_probability;      /* 0 = off */
    float xtc_threshold;        /* tokens at or above this probability are cut */
    float repetition_penalty;   /* 1 = off */
    float presence_penalty;     /* 0 = off */
    float frequency_penalty;    /* 0 = off */
    int penalty_last_n;         /* window in tokens; -1 = whole sequence */
    uint64_t seed;
    const loom_logit_bias *logit_bias;  /* [n_logit_bias], copied at submit */
    int n_logit_bias;
} loom_sampling;

loom_sampling loom_sampling_default(void);

#ifdef __cplusplus
}
#endif
#endif
