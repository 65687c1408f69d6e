/* server: libmicrohttpd with one thread per connection, so a connection
 * may block on its job (job.c): a non-streaming one runs to the end in
 * the connection thread, a streaming one is pumped by the response's
 * content reader. One route table answers every path. */
#include "serve/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "serve/embed.h"
#include "serve/http.h"
#include "grammar/grammar.h"
#include "serve/job.h"
#include "model/forward.h"

/* ---- one request ---------------------------------------------------------------- */

typedef struct route route;

typedef struct conn_ctx {
    loom_buf body;
    int too_big;
    int is_post;
    const route *rt;            /* the row answering, NULL when rejected */
    const char *label;          /* metrics endpoint label */
    api_error reject;           /* 401/404/405 decided on the headers (status 0: none) */
    api_dialect dialect;        /* the shape of its errors: its path's endpoint's */
    const char *url;            /* MHD's, valid for the request */
} conn_ctx;

/* A request may name any served name, or none; any other is answered as
 * OpenAI and vLLM do, 404 model_not_found, rather than served by a model
 * the client did not ask for. */
static int check_model(server *s, const char *model, api_error *err) {
    if (!model) return 0;
    for (int i = 0; i < s->n_names; i++)
        if (!strcmp(model, s->names[i])) return 0;
    loom_buf b = {0};
    for (int i = 0; i < s->n_names; i++) loom_buf_printf(&b, "%s'%s'", i ? ", " : "", s->names[i]);
    api_fail(err, 404, "model", "the model '%s' does not exist; this server serves %s", model,
             b.p ? b.p : "");
    loom_buf_free(&b);
    err->type = "invalid_request_error";
    err->code = "model_not_found";
    return -1;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    int r = job_stream_fill(j);
    if (r <= 0) return r == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = LOOM_MIN(max, j->out.len - j->out_pos);
    memcpy(buf, j->out.p + j->out_pos, n);
    j->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { job_stream_close(cls); }

static char *models_json(server *s) {
    loom_buf b = {0};
    loom_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    api_put_json_str(&b, s->model_id, strlen(s->model_id));
    loom_buf_printf(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"loom\",\"max_model_len\":%d}]}",
              (long)time(NULL), loom_model_max_positions(s->model));
    return b.oom ? (loom_buf_free(&b), NULL) : b.p;
}

/* ---- routes ------------------------------------------------------------------ */

typedef enum MHD_Result (*route_fn)(server *s, struct MHD_Connection *conn, conn_ctx *cc);

/* One row per endpoint, read by the HTTP router, /metrics (its endpoint
 * labels, in this order) and batch mode (the rows with an ep). A new
 * endpoint is one row plus one file: for one that generates, a
 * fmt_<name>.c filling an api_endpoint (which of api_parse's request
 * kinds it takes, its object names, a choice's body, its stream chunks
 * and logprobs entries), with fn route_generate and ep naming it; for
 * any other, its route_fn. Nothing else changes. A /v1/ path is also answered without the prefix
 * (clients whose base URL is the bare host), through the same row, so
 * both spellings share its method, metrics label and key check. Every
 * row with auth set needs the --api-key bearer token when one is given:
 * /metrics too (Prometheus sends one with a scrape config's
 * authorization), only /health stays open for load-balancer probes. */
struct route {
    const char *method;
    const char *path;
    route_fn fn;
    const char *label; /* endpoint label of loom_requests_total */
    int auth;
    const api_endpoint *ep; /* generation rows (route_generate): the answer's format */
};

static enum MHD_Result route_health(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    metrics_count_request(&s->metrics, cc->label, 200);
    return http_send_text(s, conn, 200, "application/json", strdup("{\"status\":\"ok\"}"));
}

static enum MHD_Result route_metrics(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    loom_engine_stats st = {0};
    pthread_rwlock_rdlock(&s->engine_lock);
    if (s->engine) loom_engine_get_stats(s->engine, &st);
    pthread_rwlock_unlock(&s->engine_lock);
    metrics_count_request(&s->metrics, cc->label, 200);
    return http_send_text(s, conn, 200, "text/plain; version=0.0.4",
                     metrics_render(&s->metrics, &st, atomic_load(&s->inflight)));
}

static enum MHD_Result route_models(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    metrics_count_request(&s->metrics, cc->label, 200);
    return http_send_text(s, conn, 200, "application/json", models_json(s));
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *conn, conn_ctx *cc, api_error *err) {
    err->dialect = cc->dialect;
    return http_send_error(s, conn, cc->label, err);
}

/* A generation row: its endpoint parses the body and shapes the answer. */
static enum MHD_Result route_generate(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    const char *endpoint = cc->label;
    api_error err;
    if (atomic_load(&s->draining)) {
        api_fail(&err, 503, NULL, "the server is shutting down");
        return send_error(s, conn, cc, &err);
    }
    job *j = job_create(s, cc->rt->ep, cc->body.p ? cc->body.p : "", cc->body.len, &err);
    if (!j && !err.status) return http_send_text(s, conn, 500, "application/json", NULL);
    if (!j || check_model(s, j->req.model, &err) < 0) {
        job_free(j);
        return send_error(s, conn, cc, &err);
    }
    const char *tr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Loom-Trace");
    if (tr && (!strcmp(tr, "1") || !strcmp(tr, "true"))) j->req.trace = 1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    if (!j->req.stream) {
        int status = 0;
        char *body = job_complete(j, &status);
        if (!body && !status) return MHD_NO; /* client gone: drop the connection */
        metrics_count_request(&s->metrics, endpoint, status);
        return http_send_text(s, conn, status, "application/json", body);
    }
    if (job_start(j, &err) < 0) {
        job_cancel(j);
        job_free(j);
        return send_error(s, conn, cc, &err);
    }
    job_stream_open(j);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader,
                                                               j, stream_free);
    if (!r) {
        job_free(j);
        return http_send_text(s, conn, 500, "application/json", NULL);
    }
    http_add_common_headers(s, r, "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    metrics_count_request(&s->metrics, endpoint, 200);
    return ret;
}

/* A route whose answer comes whole from a formatter's function. */
static enum MHD_Result send_answer(server *s, struct MHD_Connection *conn, conn_ctx *cc, char *body,
                                   int status) {
    if (!body) return http_send_text(s, conn, 500, "application/json", NULL);
    metrics_count_request(&s->metrics, cc->label, status);
    return http_send_text(s, conn, status, "application/json", body);
}

/* A row whose endpoint answers with one body (its run), not a job. */
static enum MHD_Result route_run(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    api_error err;
    if (atomic_load(&s->draining)) {
        api_fail(&err, 503, NULL, "the server is shutting down");
        return http_send_error(s, conn, cc->label, &err);
    }
    int status = 500;
    char *body = cc->rt->ep->run(s, cc->body.p ? cc->body.p : "", cc->body.len, check_model, &status);
    return send_answer(s, conn, cc, body, status);
}

static enum MHD_Result route_count_tokens(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    int status = 0;
    char *body = fmt_messages_count_tokens(s, cc->body.p ? cc->body.p : "", cc->body.len, &status);
    return send_answer(s, conn, cc, body, status);
}

static enum MHD_Result route_response(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    int status = 0;
    char *body = fmt_responses_get(s, strrchr(cc->url, '/') + 1, !strcmp(cc->rt->method, "DELETE"), &status);
    return send_answer(s, conn, cc, body, status);
}

static const route routes[] = {
    {"POST", "/v1/chat/completions", route_generate, "chat", 1, &fmt_chat},
    {"POST", "/v1/completions", route_generate, "completions", 1, &fmt_completions},
    {"POST", "/v1/embeddings", route_run, "embeddings", 1, &fmt_embeddings},
    {"POST", "/v1/messages", route_generate, "messages", 1, &fmt_messages},
    {"POST", "/v1/messages/count_tokens", route_count_tokens, "count_tokens", 1, NULL},
    {"POST", "/v1/responses", route_generate, "responses", 1, &fmt_responses},
    {"GET", "/v1/responses/*", route_response, "responses", 1, NULL},
    {"DELETE", "/v1/responses/*", route_response, "responses", 1, NULL},
    {"GET", "/v1/models", route_models, "models", 1, NULL},
    {"GET", "/health", route_health, "health", 0, NULL},
    {"GET", "/metrics", route_metrics, "metrics", 1, NULL},
};

/* A path ending in a "*" segment takes one more segment there (an id). */
static int path_match(const char *path, const char *url) {
    size_t n = strlen(path);
    if (n < 2 || strcmp(path + n - 2, "/*")) return !strcmp(url, path);
    return !strncmp(url, path, n - 1) && url[n - 1] && !strchr(url + n - 1, '/');
}

static int route_has_path(const route *rt, const char *url) {
    return path_match(rt->path, url) || (!strncmp(rt->path, "/v1/", 4) && path_match(rt->path + 3, url));
}

/* Picks the row for the request from its headers, the one place that
 * checks the key. A rejected request (404, 401, 405, in that order: an
 * unknown path says nothing a client without the key may not know) keeps
 * its answer in cc->reject, and its body is not kept. */
static void route_request(server *s, struct MHD_Connection *conn, const char *method,
                          const char *url, conn_ctx *cc) {
    const route *path_row = NULL;
    cc->label = "other";
    for (size_t i = 0; i < LOOM_ARRAY_LEN(routes); i++) {
        if (!route_has_path(&routes[i], url)) continue;
        if (!path_row) path_row = &routes[i];
        if (!strcmp(method, routes[i].method)) {
            cc->rt = &routes[i];
            break;
        }
    }
    if (!path_row) {
        api_fail(&cc->reject, 404, NULL, "no route for %s %s", method, url);
        return;
    }
    cc->label = path_row->label;
    /* Anthropic's API is the one under /v1/messages; its clients read its error shape */
    cc->dialect = !strncmp(path_row->path, "/v1/messages", 12) ? API_DIALECT_ANTHROPIC : API_DIALECT_OPENAI;
    if (path_row->auth && !http_authorized(s, conn)) {
        cc->rt = NULL;
        api_fail(&cc->reject, 401, NULL, "missing or invalid API key (send 'Authorization: Bearer <key>' or "
                 "'x-api-key: <key>')");
    } else if (!cc->rt) {
        api_fail(&cc->reject, 405, NULL, "%s needs %s, not %s", url, path_row->method, method);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        cc->is_post = !strcmp(method, "POST");
        cc->url = url;
        *con_cls = cc;
        atomic_fetch_add(&s->active, 1);
        http_watch_headers_done(s, conn);
        route_request(s, conn, method, url, cc);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (!cl || strtoull(cl, NULL, 10) <= s->p.max_body) return MHD_YES;
        cc->too_big = 1;
        /* Answering before the body is read makes the daemon close with
         * unread data, and the kernel then resets the connection, which
         * can destroy the 413 before the client reads it. So a body that
         * is not much larger is read and dropped first; a client that
         * waits for "100 Continue" gets its answer at once. */
        const char *expect = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Expect");
        unsigned long long drain = LOOM_MAX((unsigned long long)s->p.max_body * 4, 64ull << 20);
        if (!expect && strtoull(cl, NULL, 10) <= drain) return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && !cc->reject.status) {
            if (cc->body.len + *upload_size > s->p.max_body) {
                cc->too_big = 1;
                loom_buf_free(&cc->body);
            } else {
                loom_buf_put(&cc->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    http_watch_received(s, conn);
    api_error err;
    if (!strcmp(method, "OPTIONS") && s->p.cors) {
        char *empty = strdup("");
        return http_send_text(s, conn, 204, "text/plain", empty);
    }
    if (cc->reject.status) return send_error(s, conn, cc, &cc->reject);
    if (cc->too_big) {
        api_fail(&err, 413, NULL, "the request body exceeds %zu bytes", s->p.max_body);
        return send_error(s, conn, cc, &err);
    }
    return cc->rt->fn(s, conn, cc);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    (void)toe;
    http_watch_idle(s, conn); /* a kept-alive connection waits for its next request line */
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    atomic_fetch_sub(&s->active, 1);
    loom_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ---- lifecycle -------------------------------------------------------------------- */

loom_serve_params loom_serve_default_params(void) {
    return (loom_serve_params){
        .host = "127.0.0.1", .port = 8080, .max_body = 8u << 20, .timeout_s = 60, .grace_s = 10,
        .header_timeout_s = 10, .body_timeout_s = 60, .max_connections = 512,
        .max_connections_per_ip = 64, .default_max_tokens = 512, .engine = loom_engine_default_params(), .device = -1,
    };
}

static void free_server(server *s) {
    loom_engine_free(s->engine);
    fmt_responses_store_free(s->responses);
    loom_model_free(s->draft);
    job_images_close(s);
    loom_chat_template_free(s->chat);
    loom_tok_free(s->tok);
    loom_gvocab_free(s->gvocab);
    loom_model_free(s->model);
    pthread_rwlock_destroy(&s->engine_lock);
    metrics_free(&s->metrics);
}

static void load_progress(void *ctx, double done) {
    (void)ctx;
    int w = 30, fill = (int)(done * w);
    fprintf(stderr, "\rloom: loading weights [%.*s%*s] %3.0f%%", fill, "==============================",
            w - fill, "", done * 100);
    if (done >= 1) fputc('\n', stderr);
}

static const char *human_bytes(double n, char *buf, size_t cap) {
    if (n >= 1 << 30) snprintf(buf, cap, "%.1f GiB", n / (1 << 30));
    else if (n >= 1 << 20) snprintf(buf, cap, "%.1f MiB", n / (1 << 20));
    else snprintf(buf, cap, "%.0f KiB", n / 1024);
    return buf;
}

/* One line on the KV budget: the pool fills with cached blocks up to the
 * reuse cap by design, so a large resident size should not surprise. */
static void print_kv_budget(loom_engine *e) {
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    char a[32], b[32];
    double bb = (double)st.kv_block_bytes;
    fprintf(stderr, "loom: KV pool %s (--kv-memory): %d blocks of %d tokens, %s a block, "
                    "%.1f KiB a token, %lld tokens of context in all; kept for reuse: ",
            human_bytes(bb * st.kv_blocks_total, a, sizeof a), st.kv_blocks_total, st.kv_block_size,
            human_bytes(bb, b, sizeof b), bb / 1024 / st.kv_block_size,
            (long long)st.kv_blocks_total * st.kv_block_size);
    if (st.kv_cache_cap_blocks)
        fprintf(stderr, "up to %s (--prefix-cache-bytes); pages are taken as blocks are first used\n",
                human_bytes(bb * st.kv_cache_cap_blocks, a, sizeof a));
    else
        fprintf(stderr, "nothing (no prefix cache)\n");
}

/* Appends "<head>name, name" for the LOOM_SAMPLING_* bits in set (names in
 * the order of the bits). */
static void put_fields(char *buf, size_t cap, const char *head, unsigned set) {
    static const char *names[] = {"temperature", "top_p", "top_k", "min_p",
                                  "repetition_penalty"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(names); i++) {
        if (!(set & (1u << i))) continue;
        size_t w = strlen(buf);
        snprintf(buf + w, cap - w, "%s%s", head, names[i]);
        head = ", ";
    }
}

/* The sampling a request gets for each field it leaves out: the server's
 * flag, else the model's generation_config.json, else the API's default.
 * Says which on stderr. */
static void resolve_sampling(server *s) {
    loom_sampling gen;
    unsigned from_gen = loom_model_sampling_defaults(s->model, &gen) & ~s->p.sampling_set;
    s->sampling = api_sampling_default();
    loom_sampling_apply(&s->sampling, &gen, from_gen);
    loom_sampling_apply(&s->sampling, &s->p.sampling, s->p.sampling_set);
    char src[256] = "";
    put_fields(src, sizeof src, " (generation_config.json: ", from_gen);
    put_fields(src, sizeof src, src[0] ? "; flags: " : " (flags: ", s->p.sampling_set);
    const loom_sampling *d = &s->sampling;
    fprintf(stderr, "loom: request sampling defaults: temperature %g, top_p %g, top_k %d, min_p %g, "
            "repetition_penalty %g%s%s\n", d->temperature, d->top_p, d->top_k, d->min_p,
            d->repetition_penalty, src, src[0] ? ")" : "");
}

/* Loads the model, tokenizer and template and starts the engine. */
static int server_open(server *s, const loom_serve_params *params) {
    memset(s, 0, sizeof *s);
    s->p = *params;
    pthread_rwlock_init(&s->engine_lock, NULL);
    metrics_init(&s->metrics);
    s->responses = fmt_responses_store_create();
    for (size_t i = 0; i < LOOM_ARRAY_LEN(routes); i++) metrics_add_endpoint(&s->metrics, routes[i].label);
    const char *dir = s->p.model_dir;
    const char *base = strrchr(dir, '/');
    while (base && base[1] == 0 && base > dir) { /* trailing slash */
        const char *b = base - 1;
        while (b > dir && *b != '/') b--;
        base = b;
    }
    snprintf(s->model_id, sizeof s->model_id, "%s",
             s->p.model_name ? s->p.model_name : base && base[1] ? base + 1 : dir);
    char *slash = strchr(s->model_id, '/');
    if (slash && !s->p.model_name) *slash = 0;
    s->names[s->n_names++] = s->model_id;
    if (s->p.model_name) { /* "a,b,c": a is the id, all are accepted */
        snprintf(s->name_list, sizeof s->name_list, "%s", s->p.model_name);
        char *save = NULL;
        s->n_names = 0;
        for (char *t = strtok_r(s->name_list, ",", &save); t && s->n_names < (int)LOOM_ARRAY_LEN(s->names);
             t = strtok_r(NULL, ",", &save))
            s->names[s->n_names++] = t;
        if (s->n_names) snprintf(s->model_id, sizeof s->model_id, "%s", s->names[0]);
        else s->names[s->n_names++] = s->model_id;
    }

    fprintf(stderr, "loom: loading %s ...\n", dir);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = s->p.n_threads;
    mp.device = s->p.device;
    mp.fast_matmul = s->p.fast_matmul;
    mp.quantize_bits = s->p.quantize_bits;
    mp.tensor_parallel = s->p.tensor_parallel;
    mp.tp_devices = s->p.tp_devices;
    loom_status st = loom_model_load(dir, &mp, &s->model);
    char tj[4096];
    int no_tok = s->p.tokenizer_optional && loom_path_join(tj, sizeof tj, dir, "tokenizer.json") == LOOM_OK &&
                 access(tj, F_OK) != 0;
    if (no_tok)
        fprintf(stderr, "loom: warning: %s has no tokenizer.json; only token-id prompts run, "
                        "and answers carry token ids with empty text\n", dir);
    if (!st && !no_tok) st = loom_tok_load_dir(dir, &s->tok);
    if (st) {
        fprintf(stderr, "loom: error: %s (%s)\n", loom_last_error(), loom_status_str(st));
        free_server(s);
        return 1;
    }
    loom_model_warm(s->model, isatty(2) ? load_progress : NULL, NULL);
    if (loom_chat_template_load(dir, &s->chat) != LOOM_OK) {
        fprintf(stderr, "loom: warning: no chat template (%s); chat completions are disabled\n",
                loom_last_error());
        s->chat = NULL;
    }
    s->vocab = loom_model_vocab_size(s->model);
    s->think = s->tok && loom_tok_token_to_id(s->tok, "</think>", 8) >= 0;
    s->stateful = loom_seq_state_bytes(s->model) > 0;
    /* Chat turns end at the template's end-of-turn token, which is often
     * not the model's EOS (ChatML's <|im_end|> on a base model). */
    s->tc_syntax = loom_toolcall_detect(s->chat, s->tok);
    s->n_turn_end = s->tok ? loom_toolcall_turn_end_ids(s->tc_syntax, s->tok, s->turn_end, 8) : 0;
    resolve_sampling(s);
    if (s->p.draft_model_dir) {
        if ((st = loom_draft_model_load(s->p.draft_model_dir, s->p.engine.draft_exact, &s->draft))) {
            fprintf(stderr, "loom: error: draft model: %s (%s)\n", loom_last_error(), loom_status_str(st));
            free_server(s);
            return 1;
        }
        s->p.engine.speculative = LOOM_SPEC_DRAFT;
        s->p.engine.draft_model = s->draft;
    }
    s->p.engine.model_dir = dir; /* its vision tower, if any */
    job_images_open(s);
    if ((st = loom_engine_create(s->model, &s->p.engine, &s->engine))) {
        fprintf(stderr, "loom: error: %s (%s)\n", loom_last_error(), loom_status_str(st));
        free_server(s);
        return 1;
    }
    print_kv_budget(s->engine);
    return 0;
}

/* ---- service: the same request handling without HTTP (batch mode) ------- */

loom_status loom_service_open(const loom_serve_params *p, loom_service **out) {
    *out = NULL;
    server *s = malloc(sizeof *s);
    if (!s) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    if (server_open(s, p) != 0) {
        free(s);
        return loom_err(LOOM_ERR_INVALID_ARG, "cannot open %s", p->model_dir);
    }
    *out = (loom_service *)s;
    return LOOM_OK;
}

void loom_service_close(loom_service *svc) {
    if (!svc) return;
    free_server((server *)svc);
    free(svc);
}

/* Batch mode runs the generation rows by their path as written: a batch
 * line names the /v1/ path, and the bare spelling is for HTTP clients. */
static const route *batch_route(const char *url) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(routes); i++)
        if (routes[i].ep && !strcmp(url, routes[i].path)) return &routes[i];
    return NULL;
}

int loom_service_has_route(const char *url) { return batch_route(url) != NULL; }

void loom_service_paths(char *buf, size_t cap) {
    size_t n = 0, k = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(routes); i++) n += routes[i].ep != NULL;
    buf[0] = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(routes); i++) {
        if (!routes[i].ep) continue;
        size_t w = strlen(buf);
        snprintf(buf + w, cap - w, "%s%s", k == 0 ? "" : k + 1 < n ? ", " : " or ", routes[i].path);
        k++;
    }
}

/* Batch mode checks no "model" (a batch file runs on the model it is
 * given) and has no stream to write chunks to. */
static char *service_run(server *s, const api_endpoint *ep, const char *body, size_t len, int *status) {
    api_error err;
    job *j = job_create(s, ep, body, len, &err);
    if (!j && !err.status) {
        *status = 500;
        return NULL;
    }
    if (!j || (j->req.stream && api_fail(&err, 400, "stream", "streaming is not available in batch mode") < 0)) {
        job_free(j);
        *status = err.status;
        return api_error_json(&err);
    }
    return job_complete(j, status);
}

char *loom_service_request(loom_service *svc, const char *url, const char *body, size_t len,
                           int *status) {
    const route *rt = batch_route(url);
    if (!rt) {
        api_error err;
        api_fail(&err, 404, NULL, "no route for POST %s", url);
        *status = err.status;
        return api_error_json(&err);
    }
    if (rt->ep->run) return rt->ep->run((server *)svc, body, len, NULL, status);
    return service_run((server *)svc, rt->ep, body, len, status);
}

char *loom_service_complete(loom_service *svc, int chat, const char *body, size_t len, int *status) {
    return service_run((server *)svc, chat ? &fmt_chat : &fmt_completions, body, len, status);
}

int loom_serve_run(const loom_serve_params *params) {
    server srv;
    server *s = &srv;
    /* Signals go to the main thread only, which waits for them below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (server_open(s, params) != 0) return 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->p.port)};
    if (inet_pton(AF_INET, s->p.host, &addr.sin_addr) != 1) {
        fprintf(stderr, "loom: error: --host: expected an IPv4 address, found \"%s\"\n", s->p.host);
        free_server(s);
        return 2;
    }
    pthread_mutex_init(&s->watch_lock, NULL);
    pthread_t dog;
    if (pthread_create(&dog, NULL, http_watchdog, s) != 0) {
        fprintf(stderr, "loom: error: cannot start the connection watchdog: %s\n", strerror(errno));
        free_server(s);
        return 1;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
            MHD_USE_ERROR_LOG,
        (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, http_on_connection, s,
        MHD_OPTION_URI_LOG_CALLBACK, http_on_request_line, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->p.timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->p.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->p.max_connections_per_ip, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "loom: error: cannot listen on %s:%d: %s\n", s->p.host, s->p.port,
                strerror(errno));
        atomic_store(&s->watch_stop, 1);
        pthread_join(dog, NULL);
        free_server(s);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : s->p.port;
    if (s->p.port_file) {
        FILE *f = fopen(s->p.port_file, "w");
        if (f) {
            fprintf(f, "%d\n", port);
            fclose(f);
        }
    }
    fprintf(stderr, "loom: %s (%s, vocab %d, context %d) serving at http://%s:%d/v1\n",
            s->model_id, loom_model_arch(s->model), s->vocab, loom_model_max_positions(s->model),
            s->p.host, port);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "loom: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    atomic_store(&s->draining, 1);
    MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    double until = loom_now() + s->p.grace_s;
    while (atomic_load(&s->inflight) > 0 && loom_now() < until) usleep(10000);
    atomic_store(&s->shutting_down, 1);
    /* Cancels whatever still runs; connection threads see final events. */
    pthread_rwlock_wrlock(&s->engine_lock);
    loom_engine *e = s->engine;
    s->engine = NULL;
    pthread_rwlock_unlock(&s->engine_lock);
    loom_engine_free(e);
    /* The cancelled jobs still answer (an error chunk, a 503): let their
     * connection threads hand the last bytes to the socket before the
     * daemon closes every connection. */
    until = loom_now() + 2;
    while (atomic_load(&s->active) > 0 && loom_now() < until) usleep(10000);
    MHD_stop_daemon(d);
    atomic_store(&s->watch_stop, 1);
    pthread_join(dog, NULL);
    pthread_mutex_destroy(&s->watch_lock);
    free_server(s);
    fprintf(stderr, "loom: stopped\n");
    return 0;
}

