/* api: the OpenAI request format. Parses and validates a request body into
 * what the engine needs, naming the offending field on error, and formats
 * responses. No HTTP and no engine here, so the parser can be fuzzed and
 * tested alone. */
#ifndef LOOM_API_H
#define LOOM_API_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "loom.h"

/* The error shape a client expects: OpenAI's {"error": {...}}, or
 * Anthropic's {"type": "error", "error": {"type", "message"}}. */
typedef enum api_dialect { API_DIALECT_OPENAI, API_DIALECT_ANTHROPIC } api_dialect;

/* An error destined for the client, in the shape of its dialect. */
typedef struct api_error {
    int status;                 /* HTTP status */
    char message[512];
    char param[64];             /* offending field, or "" */
    const char *type;           /* "invalid_request_error", ... */
    const char *code;           /* optional machine code, or NULL */
    api_dialect dialect;        /* kept by api_fail; set where the route is known */
} api_error;

typedef enum api_kind { API_CHAT, API_COMPLETION } api_kind;

/* What the output must match (response_format and the grammar, regex and
 * guided_* extensions): one at most, as source text the server compiles
 * over the model's vocabulary (job.c) into loom_request_params.grammar. */
typedef enum api_grammar {
    API_GRAMMAR_NONE = 0,
    API_GRAMMAR_JSON_OBJECT,    /* response_format {"type": "json_object"} */
    API_GRAMMAR_JSON_SCHEMA,    /* grammar_src: JSON Schema text */
    API_GRAMMAR_GBNF,           /* grammar_src: GBNF text */
    API_GRAMMAR_REGEX,          /* grammar_src: a regex over the whole output */
} api_grammar;

#define API_MAX_N 16
#define API_MAX_STOPS 16
#define API_MAX_IMAGES 16 /* image content parts in one request */

typedef struct api_req {
    api_kind kind;
    cJSON *body;                /* owned: the parsed request */
    const char *model;          /* borrowed from body, may be NULL */
    int stream, include_usage;
    int n;
    int max_tokens;             /* -1: not given; 0: none (completions with echo) */
    loom_sampling sampling;     /* logit_bias points at bias */
    unsigned sampling_given;    /* LOOM_SAMPLING_* bits of the fields the body gives */
    loom_logit_bias *bias;      /* owned */
    int seed_given;
    const char *stops[API_MAX_STOPS]; /* borrowed from body */
    int n_stops;
    int logprobs;               /* -1 none; else top n (chat: top_logprobs) */
    int echo, return_token_ids;
    api_grammar grammar;        /* constrained output, or API_GRAMMAR_NONE */
    char *grammar_src;          /* owned: its source text (NULL for json_object) */
    const char *grammar_param;  /* the field it came from, for errors */
    int ignore_eos;
    int trace;                  /* loom_trace: the engine's spans go in the response */
    /* chat */
    char *messages_json;        /* owned, normalised for the template */
    char *tools_json;           /* owned, NULL without tools */
    char *kwargs_json;          /* owned, chat_template_kwargs, or NULL */
    const char *tool_choice;    /* "none", "auto", "required" or a name */
    const char *cache_session_id; /* isolates prefix-cache reuse and names a
                                     conversation to continue, or NULL */
    const char *previous_response_id; /* a response to continue from, or NULL */
    /* images: each image_url part's URL (media.h), in prompt order; the
     * template sees such a part as {"type": "image"} */
    char *image_urls[API_MAX_IMAGES]; /* owned */
    char image_params[API_MAX_IMAGES][48]; /* "messages[i].content[k]" */
    int n_images;
    /* completions: text or ids */
    const char *prompt_text;    /* borrowed */
    int32_t *prompt_ids;        /* owned, when the prompt is token ids */
    int n_prompt_ids;
} api_req;

/* The checks every body gets (UTF-8, no NUL, one JSON object and nothing
 * after it); the parsed object, or NULL with err filled. */
cJSON *api_parse_object(const char *body, size_t len, api_error *err);

/* Parses body (len bytes). vocab bounds token ids and logit_bias keys.
 * Returns 0 on success; on failure fills err and returns -1 (req is then
 * released). */
int api_parse(api_kind kind, const char *body, size_t len, int vocab, api_req *req,
              api_error *err);
void api_req_free(api_req *req);

/* What a request that gives no sampling field gets (OpenAI's temperature
 * 1), before the server's and the model's defaults. */
loom_sampling api_sampling_default(void);

/* Fills err and returns -1. */
int api_fail(api_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The error in its dialect's shape, as a heap string. */
char *api_error_json(const api_error *err);


/* s as a JSON string literal (quotes included), n bytes of UTF-8. */
void api_put_json_str(loom_buf *b, const char *s, size_t n);

#endif
