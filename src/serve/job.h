/* job: one generation request from its parsed body to its answer, apart
 * from HTTP so that the server and batch mode run the same code: the
 * prompt (chat template, tokenize), n engine requests (choices) each with
 * a text stream, and the loop that turns engine events into text. What the
 * answer looks like is the endpoint's (api_endpoint, fmt_*.c). */
#ifndef LOOM_SERVE_JOB_H
#define LOOM_SERVE_JOB_H

#include <pthread.h>
#include <stdatomic.h>

#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/server.h"
#include "serve/toolcall.h"
#include "stream/textstream.h"
#include "vision/imgproc.h"
#include "vision/imgprompt.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"

struct conn_watch;

/* The loaded model and running engine that jobs share. */
typedef struct server {
    loom_serve_params p;
    char model_id[256];            /* reported in responses: the first served name */
    char name_list[1024];          /* the served names, NUL-separated */
    const char *names[16];         /* into name_list, or model_id alone */
    int n_names;
    loom_model *model;
    loom_model *draft;             /* --draft-model's, or NULL */
    loom_tok *tok;
    loom_chat_template *chat;      /* NULL when the model has none */
    loom_engine *engine;
    pthread_rwlock_t engine_lock;  /* read: submit; write: shutdown */
    atomic_int shutting_down;
    atomic_int inflight;
    atomic_int active;             /* HTTP requests begun and not yet completed */
    atomic_int draining;           /* SIGTERM seen: new generations get 503 */
    atomic_ullong next_id;
    int vocab;
    int think;                     /* the vocabulary has </think>: split reasoning */
    int stateful;                  /* the model keeps recurrent state (snapshots) */
    int32_t turn_end[8];           /* end-of-turn ids chat requests stop at */
    int n_turn_end;
    loom_tc_syntax tc_syntax;      /* how the model writes tool calls */
    struct loom_gvocab *gvocab;    /* the vocabulary as bytes, for grammars; made
                                      at the first one (job_grammar) */
    loom_sampling sampling;        /* what a request leaves out (resolve_sampling) */
    loom_imgproc *imgproc;         /* owned image processor, or NULL: no images */
    loom_imgprompt imgprompt;      /* its image markers' expansion, with imgproc */
    loom_metrics metrics;
    pthread_mutex_t watch_lock;    /* guards watched and every entry's deadline */
    struct conn_watch *watched;    /* open connections (HTTP only) */
    atomic_int watch_stop;
    struct resp_store *responses;  /* /v1/responses kept for previous_response_id */
} server;

typedef struct choice {
    loom_request *rq;
    loom_textstream *ts;
    loom_buf text;                  /* content so far (non-streaming, tools) */
    loom_buf lp;                    /* logprobs entries as JSON, comma-separated */
    loom_buf plp;                   /* completions echo: the prompt's entries, likewise */
    int n_plp;                      /* prompt tokens in plp */
    int32_t *ids;               /* generated ids */
    int n_ids, cap_ids;
    int done;
    const char *finish;         /* "stop", "length", "tool_calls" */
    size_t text_offset;         /* completions logprobs text_offset */
    loom_toolscan scan;         /* tool-call / reasoning splitter */
    int n_cached;               /* prompt tokens served from the prefix cache */
    int final_seen;             /* its final event (with n_cached) is in */
} choice;

/* Text a choice produced in one step, split by the tool scanner. */
typedef struct emitted {
    loom_buf content, reasoning;
} emitted;

typedef struct job job;

/* Answers "model" of a request: 0, or -1 with err filled. */
typedef int (*api_model_check)(server *s, const char *model, api_error *err);

/* One endpoint's answer format: the job calls these where the OpenAI
 * shapes of its endpoints differ. Streaming chunks go to j->out. */
typedef struct api_endpoint {
    api_kind kind;              /* the request it parses: chat messages or a prompt */
    const char *id_prefix;      /* response ids are "<prefix>-<n>" */
    const char *object;         /* "object" of a blocking answer */
    const char *chunk_object;   /* and of a stream chunk */
    /* one logprobs entry for a generated token, appended to c->lp */
    void (*logprob)(job *j, choice *c, const loom_event *ev);
    /* a prompt token's logprobs (echo; ev NULL: the first token, which has
     * none), or NULL: the endpoint has no prompt logprobs */
    void (*prompt_logprob)(job *j, choice *c, const loom_event *ev);
    /* a blocking answer's choice: its fields between "index" and "finish_reason" */
    void (*put_choice)(job *j, choice *c, loom_buf *b);
    /* the chunks a stream opens with, before any token */
    void (*sse_open)(job *j);
    /* one step's text of choice index, with its new logprobs entries or NULL */
    void (*sse_delta)(job *j, int index, const emitted *em, const loom_buf *lp_new);
    /* after a delta and before the final chunk: what else the choice
     * parsed (tool calls), or NULL */
    void (*sse_extra)(job *j, int index);
    const char *final_delta;    /* the last chunk's empty delta, with its comma */
    /* An endpoint answered with one body and no job (route_run; embeddings):
     * makes the body, or an error body, and its HTTP status; check NULL
     * takes any model (batch mode). The fields above are then unused. */
    char *(*run)(server *s, const char *body, size_t len, api_model_check check, int *status);
    /* Endpoints whose shapes are not OpenAI's chat or completions set
     * these (NULL: the shapes above). parse fills j->req from the body,
     * translating it into what api_parse takes; put_answer writes the whole
     * blocking answer; sse_finish the stream's closing events, in place of
     * the final chunks and [DONE]; sse_error a failure (j->err) mid-stream. */
    int (*parse)(job *j, const char *body, size_t len, api_error *err);
    void (*put_answer)(job *j, loom_buf *b);
    void (*sse_finish)(job *j);
    void (*sse_error)(job *j);
    api_dialect dialect;        /* the shape of its errors (OpenAI's unless set) */
} api_endpoint;

extern const api_endpoint fmt_chat, fmt_completions, fmt_messages, fmt_responses;

struct job {
    server *srv;
    const api_endpoint *ep;     /* borrowed: the answer's format */
    api_req req;
    int32_t *prompt;            /* owned */
    int n_prompt;
    loom_request_image *images; /* owned [n_images]: the chat's images, pixels in px */
    loom_imgproc_out *px;       /* owned [n_images] */
    int n_images;
    struct loom_grammar *grammar; /* a reference, or NULL (job_grammar) */
    int snapshot_at;            /* conversation boundary, for recurrent-state snapshots */
    char *prompt_text;          /* owned, rendered chat or the completion prompt */
    size_t *prompt_off;         /* owned [n_prompt]: each prompt token's offset in
                                   prompt_text (completions echo with logprobs) */
    choice ch[API_MAX_N];
    int n;
    char id[48];                /* "<prefix>-<n>", or "<prefix><n>" for a prefix ending in '_' */
    long created;
    int fd;                     /* client socket, for disconnect checks; -1: none */
    double t_start, t_last;
    double t_checked;           /* last client_gone() poll */
    int first_token_seen;
    /* streaming */
    loom_buf out;
    size_t out_pos;
    int phase;                  /* 0 tokens, 1 final chunks queued, 2 done */
    int failed;                 /* error status already decided */
    int gone;                   /* the client went away (counted) */
    int next_choice;            /* pump() looks at this choice first */
    api_error err;
    /* endpoints with their own shapes (parse set) */
    cJSON *client;              /* owned: the body as the client sent it */
    int part, part_open;        /* stream: the parts begun (the open one is part - 1)
                                   and the open one's kind (0: none), for formatters
                                   that number them */
    size_t part_from;           /* where the open part's text begins in the scan's text */
    int seq;                    /* stream: the next event's sequence number */
};

/* A job of endpoint ep with body (len bytes) parsed into j->req, counted
 * in s->inflight until job_free. NULL with err->status 0 when out of
 * memory; NULL with err filled when the body is invalid. */
job *job_create(server *s, const api_endpoint *ep, const char *body, size_t len, api_error *err);
void job_free(job *j);
/* Cancels the job's engine requests (they end at the next step). */
void job_cancel(job *j);
/* Names the job, builds the prompt and submits the choices. */
int job_start(job *j, api_error *err);
/* Compiles what a request's output must match (api_req.grammar) over the
 * model's vocabulary into *out (NULL for none); a grammar that does not
 * compile is a 400 naming the field and what is unsupported. */
int job_grammar(server *s, const api_req *r, struct loom_grammar **out, api_error *err);
/* Starts a non-streaming job, runs it to the end and frees it. Returns the
 * response body (or an error body) with *status set; NULL with status 0
 * when the client went away. */
char *job_complete(job *j, int *status);
/* Streaming, once started: job_stream_open queues the opening chunks;
 * job_stream_fill leaves unread bytes in j->out from j->out_pos
 * and returns 1, or returns 0 at the end of the stream, -1 when the
 * connection must drop (client gone, out of memory). job_stream_close
 * cancels what still runs and frees the job. */
void job_stream_open(job *j);
int job_stream_fill(job *j);
void job_stream_close(job *j);

/* Renders and tokenizes the prompt into j->prompt (job_start does it
 * first; count_tokens needs it alone). */
int job_build_prompt(job *j, api_error *err);

/* Answers of the routes beside those endpoints that do not generate
 * (POST /v1/messages/count_tokens, GET and DELETE /v1/responses/{id}:
 * del), with *status. */
char *fmt_messages_count_tokens(server *s, const char *body, size_t len, int *status);
char *fmt_responses_get(server *s, const char *id, int del, int *status);
/* The responses kept for GET and previous_response_id (LRU, bounded). */
struct resp_store *fmt_responses_store_create(void);
void fmt_responses_store_free(struct resp_store *st);
/* job_images.c. The model's image processor into s (nothing for a model
 * without preprocessor_config.json); its release. */
void job_images_open(server *s);
void job_images_close(server *s);
/* The request's images (api_req.image_urls) read, decoded and
 * preprocessed on the calling (HTTP) thread (before the template: a model
 * without images refuses them first). */
int job_images_prepare(job *j, api_error *err);
/* Then, once the template has rendered j->prompt_text (len bytes), each
 * image's marker in it expanded to the image's tokens, as the Hugging Face
 * processor does before tokenizing (vision/imgprompt.h). */
int job_images_expand(job *j, size_t *len, api_error *err);
void job_images_free(job *j);

/* For the formatters. */
void job_put_token_text(server *s, loom_buf *b, int32_t id);
/* Tokens generated over the choices, and the most any choice took from
 * the prefix cache or a continued session. */
void job_usage(const job *j, int *generated, int *cached);
void job_sse_chunk_begin(job *j, int index);

#endif
