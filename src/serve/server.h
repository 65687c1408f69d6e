/* server: the OpenAI-compatible HTTP server. HTTP threads parse and
 * validate, render the chat template, tokenize, submit to the engine and
 * stream its events back; they never touch the model. */
#ifndef LOOM_SERVER_H
#define LOOM_SERVER_H

#include <stddef.h>

#include "loom.h"

typedef struct loom_serve_params {
    const char *model_dir;
    const char *model_name;     /* served names, comma-separated: the first is the id
                                   reported by /v1/models, any of them may be asked
                                   for in "model"; NULL = dir name */
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* default 8080; 0 = any free port */
    const char *api_key;        /* Bearer token required on every route but /health, or NULL */
    int cors;                   /* add permissive CORS headers */
    size_t max_body;            /* bytes; larger bodies get 413 */
    int timeout_s;              /* idle connection timeout */
    int header_timeout_s;       /* request line and headers must arrive within this */
    int body_timeout_s;         /* the body must arrive within this of the headers */
    int grace_s;                /* shutdown grace period for in-flight requests */
    int max_connections;        /* open connections at once (one thread each) */
    int max_connections_per_ip; /* of them from one client address; 0 = no limit */
    int n_threads;              /* model threads; 0 = all cores */
    int device;                 /* -1 CPU, n = CUDA device n */
    int fast_matmul;            /* loom_model_params.fast_matmul */
    int quantize_bits;          /* loom_model_params.quantize_bits */
    int tensor_parallel;        /* loom_model_params.tensor_parallel */
    const int *tp_devices;      /* loom_model_params.tp_devices (borrowed) */
    int default_max_tokens;     /* when a request gives none */
    int tokenizer_optional;     /* a model directory without tokenizer.json loads;
                                   only token-id completions run, their text is "" */
    loom_sampling sampling;     /* defaults of requests, the fields in sampling_set only */
    unsigned sampling_set;      /* LOOM_SAMPLING_* bits (--temperature etc.): over the
                                   model's generation_config.json, under a request's own */
    loom_engine_params engine;
    const char *draft_model_dir; /* a draft model for speculative decoding (loaded on the
                                   CPU; engine.speculative then LOOM_SPEC_DRAFT), or NULL */
    const char *port_file;      /* write the bound port here when ready */
    const char *allowed_media_dir; /* file:// image URLs may name files under it; NULL: none */
} loom_serve_params;

loom_serve_params loom_serve_default_params(void);

/* Loads the model, serves until SIGINT/SIGTERM, then shuts down gracefully.
 * Returns a process exit code. */
int loom_serve_run(const loom_serve_params *p);

/* The same request handling without HTTP, for batch mode: a loaded model,
 * tokenizer, template and running engine. loom_service_complete may be
 * called from many threads at once; each call blocks until its request is
 * done and returns the response body (or an OpenAI error body), with the
 * HTTP status it would have had in *status. */
typedef struct loom_service loom_service;
loom_status loom_service_open(const loom_serve_params *p, loom_service **out);
void loom_service_close(loom_service *s);
char *loom_service_complete(loom_service *s, int chat, const char *body, size_t len, int *status);
/* The same through the server's route table: body POSTed to url, one of
 * the generation routes' paths (loom_service_has_route); any other gets
 * a 404 body. loom_service_paths writes those paths as "a, b or c". */
char *loom_service_request(loom_service *s, const char *url, const char *body, size_t len,
                           int *status);
int loom_service_has_route(const char *url);
void loom_service_paths(char *buf, size_t cap);

#endif
