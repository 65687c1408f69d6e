/* server: libmicrohttpd with one thread per connection. A generation
 * request becomes a job: n engine requests (choices), each with a text
 * stream that detokenizes and holds back stop strings. Non-streaming jobs
 * run to completion in the connection thread; streaming jobs are pumped by
 * the response's content reader, which turns engine events into SSE
 * chunks. A client that goes away is noticed while waiting for events (the
 * socket is polled) or when a write fails, and its requests are cancelled
 * in the engine at once. */
#include "serve/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
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
#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/toolcall.h"
#include "model/forward.h"
#include "stream/textstream.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"

typedef struct server {
    loom_serve_params p;
    char model_id[256];            /* reported in responses: the first served name */
    char name_list[1024];          /* the served names, NUL-separated */
    const char *names[16];         /* into name_list, or model_id alone */
    int n_names;
    loom_model *model;
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
    loom_sampling sampling;        /* what a request leaves out (resolve_sampling) */
    loom_metrics metrics;
    pthread_mutex_t watch_lock;    /* guards watched and every entry's deadline */
    struct conn_watch *watched;    /* open connections (HTTP only) */
    atomic_int watch_stop;
} server;

/* ---- one generation job --------------------------------------------------- */

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
} choice;

typedef struct job {
    server *srv;
    api_req req;
    int32_t *prompt;            /* owned */
    int n_prompt;
    int snapshot_at;            /* conversation boundary, for recurrent-state snapshots */
    char *prompt_text;          /* owned, rendered chat or the completion prompt */
    size_t *prompt_off;         /* owned [n_prompt]: each prompt token's offset in
                                   prompt_text (completions echo with logprobs) */
    choice ch[API_MAX_N];
    int n;
    char id[48];
    long created;
    int fd;                     /* client socket, for disconnect checks */
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
} job;

static const char *kind_name(const job *j) {
    return j->req.kind == API_CHAT ? "chat" : "completions";
}

static void job_free(job *j) {
    if (!j) return;
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        loom_request_free(c->rq);
        loom_ts_free(c->ts);
        loom_buf_free(&c->text);
        loom_buf_free(&c->lp);
        loom_buf_free(&c->plp);
        free(c->ids);
        loom_toolscan_free(&c->scan);
    }
    loom_buf_free(&j->out);
    free(j->prompt);
    free(j->prompt_text);
    free(j->prompt_off);
    api_req_free(&j->req);
    atomic_fetch_sub(&j->srv->inflight, 1);
    free(j);
}

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return 0;
    if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

static void cancel_all(job *j) {
    for (int i = 0; i < j->n; i++) loom_request_cancel(j->ch[i].rq);
}

/* ---- prompt ---------------------------------------------------------------- */

static int conversation_boundary(job *j);

static int build_prompt(job *j, api_error *err) {
    server *s = j->srv;
    api_req *r = &j->req;
    if (!s->tok && (r->kind == API_CHAT || !r->prompt_ids))
        return api_fail(err, 400, r->kind == API_CHAT ? "messages" : "prompt",
                        "this model directory has no tokenizer (tokenizer.json); send token ids%s",
                        r->kind == API_CHAT ? " to /v1/completions" : "");
    if (!s->tok && r->n_stops)
        return api_fail(err, 400, "stop", "stop strings need a tokenizer (tokenizer.json), "
                                          "and this model directory has none");
    if (r->kind == API_CHAT) {
        if (!s->chat)
            return api_fail(err, 400, "messages",
                            "this model has no chat template; use /v1/completions");
        loom_chat_params cp = loom_chat_default_params();
        cp.messages_json = r->messages_json;
        cp.tools_json = r->tools_json;
        cp.add_generation_prompt = 1;
        cp.kwargs_json = r->kwargs_json;
        size_t len;
        loom_status st = loom_chat_apply(s->chat, &cp, &j->prompt_text, &len);
        if (st != LOOM_OK)
            return api_fail(err, 400, "messages", "chat template: %s", loom_last_error());
        size_t n = 0;
        st = loom_tok_encode(s->tok, j->prompt_text, len, LOOM_TOK_NO_SPECIAL, &j->prompt, &n);
        if (st != LOOM_OK) return api_fail(err, 400, "messages", "%s", loom_last_error());
        j->n_prompt = (int)n;
        j->snapshot_at = conversation_boundary(j);
    } else if (r->prompt_ids) {
        j->prompt = r->prompt_ids;
        j->n_prompt = r->n_prompt_ids;
        r->prompt_ids = NULL;
        size_t len;
        /* without a tokenizer the text is unknown: answers carry the ids */
        if (!s->tok) r->return_token_ids = 1;
        else if (loom_tok_decode(s->tok, j->prompt, (size_t)j->n_prompt, 0, &j->prompt_text, &len))
            return api_fail(err, 400, "prompt", "%s", loom_last_error());
    } else {
        size_t n = 0;
        loom_status st = loom_tok_encode(s->tok, r->prompt_text, strlen(r->prompt_text),
                                         LOOM_TOK_ADD_SPECIAL, &j->prompt, &n);
        if (st != LOOM_OK) return api_fail(err, 400, "prompt", "%s", loom_last_error());
        j->n_prompt = (int)n;
        j->prompt_text = strdup(r->prompt_text);
    }
    if (j->n_prompt == 0) return api_fail(err, 400, r->kind == API_CHAT ? "messages" : "prompt",
                                          "the prompt encodes to no tokens");
    return 0;
}

/* Tokens of the conversation before its newest user turn, when they are a
 * prefix of the prompt: the point the next turn of this conversation will
 * share, where models with recurrent state save it (0 when unknown). */
static int conversation_boundary(job *j) {
    server *s = j->srv;
    if (!s->stateful) return 0;
    cJSON *msgs = cJSON_Parse(j->req.messages_json);
    int last_user = -1, i = 0;
    for (cJSON *m = msgs ? msgs->child : NULL; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "user")) last_user = i;
    }
    int at = 0;
    if (last_user > 0) {
        while (cJSON_GetArraySize(msgs) > last_user) cJSON_DeleteItemFromArray(msgs, last_user);
        char *head = cJSON_PrintUnformatted(msgs);
        loom_chat_params cp = loom_chat_default_params();
        cp.messages_json = head;
        cp.tools_json = j->req.tools_json;
        cp.kwargs_json = j->req.kwargs_json;
        char *text = NULL;
        size_t len = 0, n = 0;
        int32_t *ids = NULL;
        if (head && loom_chat_apply(s->chat, &cp, &text, &len) == LOOM_OK &&
            loom_tok_encode(s->tok, text, len, LOOM_TOK_NO_SPECIAL, &ids, &n) == LOOM_OK) {
            while (at < (int)n && at < j->n_prompt && ids[at] == j->prompt[at]) at++;
        }
        loom_err_clear();
        free(ids);
        free(text);
        free(head);
    }
    cJSON_Delete(msgs);
    return at;
}

/* Where each prompt token starts in the echoed text: the detokenized
 * length before it. Special tokens count when the echoed text holds them
 * (token ids, or a text that spells them), not when the tokenizer added
 * them to a text prompt (a BOS). */
static int prompt_offsets(job *j, api_error *err) {
    if (!j->srv->tok) { /* no tokenizer, no text: every offset is 0 */
        j->prompt_off = calloc((size_t)j->n_prompt, sizeof *j->prompt_off);
        return j->prompt_off ? 0 : api_fail(err, 500, NULL, "out of memory");
    }
    loom_detok *d = NULL;
    char *all = NULL;
    size_t n_all = 0;
    int skip = loom_tok_decode(j->srv->tok, j->prompt, (size_t)j->n_prompt, 0, &all, &n_all) != LOOM_OK ||
               strcmp(all, j->prompt_text) != 0;
    free(all);
    j->prompt_off = malloc(sizeof *j->prompt_off * (size_t)j->n_prompt);
    if (!j->prompt_off || loom_detok_create(j->srv->tok, skip, &d) != LOOM_OK) {
        loom_detok_free(d);
        return api_fail(err, 500, NULL, "out of memory");
    }
    size_t off = 0, max = strlen(j->prompt_text);
    for (int i = 0; i < j->n_prompt; i++) {
        const char *piece;
        size_t len = 0;
        j->prompt_off[i] = LOOM_MIN(off, max);
        if (loom_detok_push(d, j->prompt[i], &piece, &len) == LOOM_OK) off += len;
    }
    loom_detok_free(d);
    return 0;
}

/* Submits the n choices. */
static int start_job(job *j, api_error *err) {
    server *s = j->srv;
    api_req *r = &j->req;
    loom_request_params rp = loom_request_default_params();
    rp.prompt = j->prompt;
    rp.n_prompt = j->n_prompt;
    rp.max_tokens = r->max_tokens > 0 ? r->max_tokens : s->p.default_max_tokens;
    /* max_tokens 0 (echo): the prompt alone; the one token made is dropped */
    if (r->max_tokens == 0) rp.max_tokens = 1;
    /* echo with logprobs: the prompt tokens' too (the first has none) */
    int echo_lp = r->kind == API_COMPLETION && r->echo && r->logprobs >= 0;
    if (echo_lp) {
        rp.prompt_logprobs = r->logprobs;
        if (prompt_offsets(j, err) < 0) return -1;
    }
    rp.sampling = r->sampling;
    loom_sampling_apply(&rp.sampling, &s->sampling, LOOM_SAMPLING_ALL & ~r->sampling_given);
    rp.logprobs = r->logprobs;
    rp.ignore_eos = r->ignore_eos;
    rp.trace = r->trace || s->p.engine.trace_file != NULL; /* --trace-file: every request */
    rp.snapshot_at = j->snapshot_at;
    rp.cache_session_id = r->cache_session_id;
    /* An unknown or evicted previous_response_id is not an error (OpenAI's
     * Responses API answers 404): the prompt carries the whole
     * conversation, so the prefix cache serves it instead. */
    rp.resume_id = r->previous_response_id;
    if (r->kind == API_CHAT && !r->ignore_eos) {
        rp.stop_ids = s->turn_end;
        rp.n_stop_ids = s->n_turn_end;
    }
    j->n = r->n;
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        /* the first choice's state is kept under the response id */
        rp.save_id = i == 0 ? j->id : NULL;
        if (r->seed_given) rp.sampling.seed = r->sampling.seed + (uint64_t)i;
        else rp.sampling.seed = atomic_fetch_add(&s->next_id, 1) * 7919u + (uint64_t)time(NULL);
        if (loom_ts_create(s->tok, r->stops, r->n_stops, 1, &c->ts))
            return api_fail(err, 500, NULL, "%s", loom_last_error());
        int ctx = LOOM_MIN(j->n_prompt, 4);
        loom_ts_prime(c->ts, j->prompt + j->n_prompt - ctx, (size_t)ctx);
        loom_toolscan_init(&c->scan, r->kind == API_CHAT && r->tools_json != NULL,
                           r->kind == API_CHAT && s->think, j->prompt_text);
        if (r->kind == API_CHAT) {
            /* the markers the scanner reads may be special tokens */
            int32_t keep[LOOM_DETOK_MAX_KEEP];
            int n_keep = loom_toolcall_keep_ids(s->tc_syntax, s->tok, c->scan.tools, keep,
                                                LOOM_DETOK_MAX_KEEP);
            loom_toolscan_set_syntax(&c->scan, s->tc_syntax, r->tools_json, j->prompt_text);
            if (loom_ts_keep_special(c->ts, keep, n_keep))
                return api_fail(err, 500, NULL, "%s", loom_last_error());
        }
        /* with echo the generated text starts after the prompt */
        if (r->echo && j->prompt_text) c->text_offset = strlen(j->prompt_text);
        if (echo_lp) {
            loom_buf_printf(&c->plp, "{\"t\":%d,\"lp\":null,\"off\":0,\"top\":null}", j->prompt[0]);
            c->n_plp = 1;
        }
        pthread_rwlock_rdlock(&s->engine_lock);
        loom_status st = atomic_load(&s->shutting_down)
                             ? LOOM_ERR_BUSY
                             : loom_engine_submit(s->engine, &rp, &c->rq);
        pthread_rwlock_unlock(&s->engine_lock);
        if (st == LOOM_ERR_BUSY)
            return api_fail(err, atomic_load(&s->shutting_down) ? 503 : 429, NULL,
                            "the server is busy: %s", atomic_load(&s->shutting_down)
                                                          ? "shutting down" : loom_last_error());
        if (st == LOOM_ERR_RANGE || st == LOOM_ERR_INVALID_ARG)
            return api_fail(err, 400, r->kind == API_CHAT ? "messages" : "prompt", "%s",
                            loom_last_error());
        if (st != LOOM_OK) return api_fail(err, 500, NULL, "%s", loom_last_error());
    }
    metrics_add_tokens(&s->metrics, (uint64_t)j->n_prompt * (uint64_t)j->n, 0);
    return 0;
}

/* ---- formatting ------------------------------------------------------------ */

static void put_token_text(server *s, loom_buf *b, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    if (loom_tok_decode(s->tok, &id, 1, 0, &t, &n) != LOOM_OK) {
        loom_buf_puts(b, "\"\"");
        return;
    }
    api_put_json_str(b, t, n);
    free(t);
}

static void put_token_bytes(server *s, loom_buf *b, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    loom_buf_puts(b, "[");
    if (loom_tok_decode(s->tok, &id, 1, 0, &t, &n) == LOOM_OK)
        for (size_t i = 0; i < n; i++) loom_buf_printf(b, "%s%u", i ? "," : "", (unsigned char)t[i]);
    free(t);
    loom_buf_puts(b, "]");
}

/* A completions logprobs entry: parallel arrays, assembled at the end. */
static void put_completion_entry(server *s, loom_buf *b, const loom_event *ev, size_t off) {
    loom_buf_printf(b, "{\"t\":%d,\"lp\":%.6g,\"off\":%zu,\"top\":{", ev->token, ev->logprob, off);
    for (int k = 0; k < ev->n_top; k++) {
        if (k) loom_buf_puts(b, ",");
        put_token_text(s, b, ev->top_ids[k]);
        loom_buf_printf(b, ":%.6g", ev->top_logprobs[k]);
    }
    loom_buf_puts(b, "}}");
}

/* One logprobs entry for a generated token, appended to c->lp. */
static void add_logprob(job *j, choice *c, const loom_event *ev, size_t piece_len) {
    server *s = j->srv;
    loom_buf *b = &c->lp;
    if (b->len) loom_buf_puts(b, ",");
    if (j->req.kind == API_CHAT) {
        loom_buf_puts(b, "{\"token\":");
        put_token_text(s, b, ev->token);
        loom_buf_printf(b, ",\"logprob\":%.6g,\"bytes\":", ev->logprob);
        put_token_bytes(s, b, ev->token);
        loom_buf_puts(b, ",\"top_logprobs\":[");
        for (int k = 0; k < ev->n_top; k++) {
            loom_buf_puts(b, k ? ",{\"token\":" : "{\"token\":");
            put_token_text(s, b, ev->top_ids[k]);
            loom_buf_printf(b, ",\"logprob\":%.6g,\"bytes\":", ev->top_logprobs[k]);
            put_token_bytes(s, b, ev->top_ids[k]);
            loom_buf_puts(b, "}");
        }
        loom_buf_puts(b, "]}");
    } else {
        put_completion_entry(s, b, ev, c->text_offset);
    }
    c->text_offset += piece_len;
}

/* Completions logprobs object from the entries in c->plp (the prompt's,
 * with echo) and c->lp. */
static void put_completion_logprobs(job *j, choice *c, loom_buf *b) {
    cJSON *arr = NULL;
    loom_buf tmp = {0};
    loom_buf_puts(&tmp, "[");
    if (c->plp.len) loom_buf_put(&tmp, c->plp.p, c->plp.len);
    if (c->plp.len && c->lp.len) loom_buf_puts(&tmp, ",");
    if (c->lp.p) loom_buf_put(&tmp, c->lp.p, c->lp.len);
    loom_buf_puts(&tmp, "]");
    arr = tmp.p ? cJSON_Parse(tmp.p) : NULL;
    loom_buf_free(&tmp);
    loom_buf_puts(b, "{\"tokens\":[");
    int i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++) {
        if (i) loom_buf_puts(b, ",");
        put_token_text(j->srv, b, (int32_t)cJSON_GetObjectItem(e, "t")->valueint);
    }
    loom_buf_puts(b, "],\"token_logprobs\":[");
    i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++) {
        const cJSON *lp = cJSON_GetObjectItem(e, "lp"); /* null: the first prompt token */
        if (cJSON_IsNumber(lp)) loom_buf_printf(b, "%s%.6g", i ? "," : "", lp->valuedouble);
        else loom_buf_puts(b, i ? ",null" : "null");
    }
    loom_buf_puts(b, "],\"top_logprobs\":[");
    i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++) {
        char *t = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "top"));
        loom_buf_printf(b, "%s%s", i ? "," : "", t ? t : "{}");
        free(t);
    }
    loom_buf_puts(b, "],\"text_offset\":[");
    i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++)
        loom_buf_printf(b, "%s%.0f", i ? "," : "", cJSON_GetObjectItem(e, "off")->valuedouble);
    loom_buf_puts(b, "]}");
    cJSON_Delete(arr);
}

static void put_usage(job *j, loom_buf *b) {
    int gen = 0, cached = 0;
    for (int i = 0; i < j->n; i++) {
        gen += j->ch[i].n_ids;
        cached = LOOM_MAX(cached, j->ch[i].n_cached);
    }
    loom_buf_printf(b, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
              "\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
              j->n_prompt, gen, j->n_prompt + gen, cached);
}

/* ,"trace":[...]: every choice's spans (with its "index" when n > 1). A
 * choice a stop string ended was cancelled in the engine: its spans are
 * complete only once its final event is in, so wait for that (the cancel
 * takes effect at the next step). */
static void put_trace(job *j, loom_buf *b) {
    cJSON *all = cJSON_CreateArray();
    for (int i = 0; i < j->n && all; i++) {
        loom_event ev = {0};
        for (int k = 0; k < 100; k++)
            if (loom_request_next(j->ch[i].rq, &ev, 100) == LOOM_OK && ev.finish != LOOM_FINISH_NONE) break;
        if (ev.finish == LOOM_FINISH_NONE) continue; /* still running: spans are being written */
        char *text = loom_request_trace_json(j->ch[i].rq);
        cJSON *spans = text ? cJSON_Parse(text) : NULL;
        free(text);
        cJSON *sp;
        while (spans && (sp = cJSON_DetachItemFromArray(spans, 0)) != NULL) {
            if (j->n > 1) cJSON_AddNumberToObject(sp, "index", i);
            cJSON_AddItemToArray(all, sp);
        }
        cJSON_Delete(spans);
    }
    char *text = all ? cJSON_PrintUnformatted(all) : NULL;
    cJSON_Delete(all);
    loom_buf_puts(b, ",\"trace\":");
    loom_buf_puts(b, text ? text : "[]");
    free(text);
}

static void put_head(job *j, loom_buf *b, int chunk) {
    const char *obj = j->req.kind == API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                               : "text_completion";
    loom_buf_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", j->id, obj,
              j->created);
    api_put_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
    loom_buf_puts(b, ",");
}

/* ---- event processing -------------------------------------------------------- */

/* Text a choice produced in one step, split by the tool scanner. */
typedef struct emitted {
    loom_buf content, reasoning;
} emitted;

static void take_text(job *j, choice *c, const char *text, size_t len, int final, emitted *em) {
    loom_toolscan_feed(&c->scan, text, len, final, &em->content, &em->reasoning);
    if (!j->req.stream || c->scan.tools) loom_buf_put(&c->text, text, len);
}

static void finish_choice(job *j, choice *c, loom_finish why, emitted *em) {
    const char *text;
    size_t len;
    int stopped = 0;
    loom_ts_finish(c->ts, &text, &len, &stopped);
    take_text(j, c, text, len, 1, em);
    c->done = 1;
    c->finish = why == LOOM_FINISH_LENGTH && !stopped ? "length" : "stop";
    if (c->scan.n_calls > 0) c->finish = "tool_calls";
}

static void sse_echo(job *j, int index);

/* Handles one event of choice c. Returns -1 on a failure (j->err set). */
static int on_event(job *j, choice *c, const loom_event *ev, emitted *em) {
    server *s = j->srv;
    if (ev->finish != LOOM_FINISH_NONE) {
        c->n_cached = ev->n_cached;
        if (c->done) return 0;
        if (ev->finish == LOOM_FINISH_ERROR) {
            j->failed = 1;
            api_fail(&j->err, ev->status == LOOM_ERR_NO_KV ? 503 : 500, NULL, "generation failed: %s",
                     loom_request_error(c->rq));
            c->done = 1;
            return -1;
        }
        if (ev->finish == LOOM_FINISH_CANCELLED) {
            /* Not cancelled by this job (it stops reading after its own
             * cancels): the engine stopped under it, at shutdown. A
             * truncated answer must not look like a normal "stop". */
            j->failed = 1;
            api_fail(&j->err, 503, NULL, "the request was cancelled: %s",
                     atomic_load(&s->shutting_down) ? "the server is shutting down"
                                                    : loom_request_error(c->rq));
            c->done = 1;
            return -1;
        }
        finish_choice(j, c, ev->finish, em);
        return 0;
    }
    if (c->done) return 0;
    if (ev->prompt) {
        if (c->n_plp == 0 || c->n_plp >= j->n_prompt) return 0; /* not asked for */
        loom_buf_puts(&c->plp, ",");
        put_completion_entry(s, &c->plp, ev, j->prompt_off[c->n_plp]);
        if (++c->n_plp == j->n_prompt && j->req.stream) sse_echo(j, (int)(c - j->ch));
        return 0;
    }
    if (j->req.max_tokens == 0) { /* the prompt alone: drop the one token */
        loom_request_cancel(c->rq);
        c->done = 1;
        c->finish = "length";
        return 0;
    }
    double now = loom_now();
    if (!j->first_token_seen) {
        j->first_token_seen = 1;
        metrics_observe_ttft(&s->metrics, now - j->t_start);
    } else {
        metrics_observe_itl(&s->metrics, now - j->t_last);
    }
    j->t_last = now;
    metrics_add_tokens(&s->metrics, 0, 1);
    if (c->n_ids == c->cap_ids) {
        int cap = c->cap_ids ? c->cap_ids * 2 : 64;
        int32_t *ni = realloc(c->ids, sizeof *ni * (size_t)cap);
        if (!ni) {
            j->failed = 1;
            api_fail(&j->err, 500, NULL, "out of memory");
            return -1;
        }
        c->ids = ni;
        c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = ev->token;
    const char *text;
    size_t len;
    int stopped = 0;
    if (loom_ts_push(c->ts, ev->token, &text, &len, &stopped) != LOOM_OK) {
        j->failed = 1;
        api_fail(&j->err, 500, NULL, "%s", loom_last_error());
        return -1;
    }
    if (j->req.logprobs >= 0) add_logprob(j, c, ev, len);
    take_text(j, c, text, len, 0, em);
    if (stopped) {
        loom_request_cancel(c->rq);
        c->done = 1;
        /* the flush may close a call, which decides the finish reason */
        loom_toolscan_feed(&c->scan, "", 0, 1, &em->content, &em->reasoning);
        c->finish = c->scan.n_calls > 0 ? "tool_calls" : "stop";
    }
    return 0;
}

/* Waits for the next event of any unfinished choice and handles it.
 * Returns 1 if an event was handled, 0 on timeout, -1 when the job must end
 * (failure or client gone). */
static int pump(job *j, int *which, emitted *em) {
    int pending = 0;
    for (int i = 0; i < j->n; i++) pending += !j->ch[i].done;
    if (!pending) return 0;
    /* Events may keep coming for a client that is long gone (a blocking
     * request writes nothing until the end), so poll the socket on a
     * clock, not only when the engine is quiet. */
    double now = loom_now();
    if (now - j->t_checked >= 0.05) {
        j->t_checked = now;
        if (client_gone(j->fd)) {
            cancel_all(j);
            metrics_count_disconnect(&j->srv->metrics);
            j->gone = 1;
            return -1;
        }
    }
    /* The engine emits one event per choice per step, all at once: first
     * take whatever is ready (in turn, from the choice after the last one
     * served), and only then wait, briefly per choice when there are
     * several. Waiting on one choice while another's event sits ready
     * cost up to 5 ms per choice per token. */
    for (int pass = 0; pass < 2; pass++) {
        int wait_ms = pass == 0 ? 0 : pending == 1 ? 100 : 2;
        for (int k = 0; k < j->n; k++) {
            int i = (j->next_choice + k) % j->n;
            choice *c = &j->ch[i];
            if (c->done) continue;
            loom_event ev;
            if (loom_request_next(c->rq, &ev, wait_ms) != LOOM_OK) continue;
            j->next_choice = (i + 1) % j->n;
            *which = i;
            return on_event(j, c, &ev, em) < 0 ? -1 : 1;
        }
    }
    if (client_gone(j->fd)) {
        cancel_all(j);
        metrics_count_disconnect(&j->srv->metrics);
        j->gone = 1;
        return -1;
    }
    return 0;
}

static int all_done(const job *j) {
    for (int i = 0; i < j->n; i++)
        if (!j->ch[i].done) return 0;
    return 1;
}

/* ---- non-streaming ----------------------------------------------------------- */

static char *run_blocking(job *j) {
    while (!all_done(j)) {
        emitted em = {0};
        int which = 0;
        int r = pump(j, &which, &em);
        loom_buf_free(&em.content);
        loom_buf_free(&em.reasoning);
        if (r < 0) return NULL;
    }
    loom_buf b = {0};
    put_head(j, &b, 0);
    loom_buf_puts(&b, "\"choices\":[");
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        loom_buf_printf(&b, "%s{\"index\":%d,", i ? "," : "", i);
        if (j->req.kind == API_CHAT) {
            loom_buf_puts(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
            const loom_buf *content = &c->scan.content;
            if (c->scan.n_calls > 0 && content->len == 0) loom_buf_puts(&b, "null");
            else api_put_json_str(&b, content->p ? content->p : "", content->len);
            if (c->scan.reasoning.len) {
                loom_buf_puts(&b, ",\"reasoning_content\":");
                api_put_json_str(&b, c->scan.reasoning.p, c->scan.reasoning.len);
            }
            if (c->scan.n_calls > 0) {
                loom_buf_puts(&b, ",\"tool_calls\":");
                loom_toolscan_put_calls(&c->scan, &b, 0);
            }
            loom_buf_puts(&b, "},\"logprobs\":");
            if (j->req.logprobs >= 0) {
                loom_buf_puts(&b, "{\"content\":[");
                if (c->lp.p) loom_buf_put(&b, c->lp.p, c->lp.len);
                loom_buf_puts(&b, "]}");
            } else {
                loom_buf_puts(&b, "null");
            }
        } else {
            loom_buf_puts(&b, "\"text\":");
            size_t tl;
            const char *t = loom_ts_text(c->ts, &tl);
            if (j->req.echo) {
                loom_buf e = {0};
                loom_buf_puts(&e, j->prompt_text ? j->prompt_text : "");
                loom_buf_put(&e, t, tl);
                api_put_json_str(&b, e.p ? e.p : "", e.len);
                loom_buf_free(&e);
            } else {
                api_put_json_str(&b, t, tl);
            }
            loom_buf_puts(&b, ",\"logprobs\":");
            if (j->req.logprobs >= 0) put_completion_logprobs(j, c, &b);
            else loom_buf_puts(&b, "null");
            if (j->req.return_token_ids) {
                loom_buf_puts(&b, ",\"prompt_token_ids\":[");
                for (int k = 0; k < j->n_prompt; k++) loom_buf_printf(&b, "%s%d", k ? "," : "", j->prompt[k]);
                loom_buf_puts(&b, "],\"token_ids\":[");
                for (int k = 0; k < c->n_ids; k++) loom_buf_printf(&b, "%s%d", k ? "," : "", c->ids[k]);
                loom_buf_puts(&b, "]");
            }
        }
        loom_buf_printf(&b, ",\"finish_reason\":\"%s\"}", c->finish ? c->finish : "stop");
    }
    loom_buf_puts(&b, "],");
    put_usage(j, &b);
    if (j->req.trace) put_trace(j, &b);
    loom_buf_puts(&b, "}");
    if (b.oom) {
        loom_buf_free(&b);
        return NULL;
    }
    return b.p;
}

/* ---- streaming ------------------------------------------------------------------ */

static void sse_chunk_begin(job *j, int index) {
    loom_buf_puts(&j->out, "data: ");
    put_head(j, &j->out, 1);
    loom_buf_printf(&j->out, "\"choices\":[{\"index\":%d,", index);
}

static void sse_delta(job *j, int index, const emitted *em, const loom_buf *lp_new) {
    choice *c = &j->ch[index];
    if (j->req.kind == API_CHAT) {
        if (!em->content.len && !em->reasoning.len && !lp_new) return;
        sse_chunk_begin(j, index);
        loom_buf_puts(&j->out, "\"delta\":{");
        int comma = 0;
        if (em->reasoning.len) {
            loom_buf_puts(&j->out, "\"reasoning_content\":");
            api_put_json_str(&j->out, em->reasoning.p, em->reasoning.len);
            comma = 1;
        }
        if (em->content.len || !em->reasoning.len) {
            loom_buf_puts(&j->out, comma ? ",\"content\":" : "\"content\":");
            api_put_json_str(&j->out, em->content.p ? em->content.p : "", em->content.len);
        }
        loom_buf_puts(&j->out, "},\"logprobs\":");
        if (lp_new && lp_new->len) {
            loom_buf_puts(&j->out, "{\"content\":[");
            loom_buf_put(&j->out, lp_new->p, lp_new->len);
            loom_buf_puts(&j->out, "]}");
        } else {
            loom_buf_puts(&j->out, "null");
        }
        loom_buf_puts(&j->out, ",\"finish_reason\":null}]}\n\n");
    } else {
        if (!em->content.len && !lp_new) return;
        sse_chunk_begin(j, index);
        loom_buf_puts(&j->out, "\"text\":");
        api_put_json_str(&j->out, em->content.p ? em->content.p : "", em->content.len);
        loom_buf_puts(&j->out, ",\"logprobs\":");
        if (lp_new && lp_new->len) {
            choice tmp = *c;
            tmp.lp = *lp_new;
            put_completion_logprobs(j, &tmp, &j->out);
        } else {
            loom_buf_puts(&j->out, "null");
        }
        loom_buf_puts(&j->out, ",\"finish_reason\":null}]}\n\n");
    }
}

/* The tool calls choice index parsed since the last chunk: for each, a
 * delta with its id and name, then one with its arguments. */
static void sse_tool_deltas(job *j, int index) {
    loom_buf d = {0};
    while (j->req.kind == API_CHAT && loom_toolscan_next_delta(&j->ch[index].scan, &d)) {
        sse_chunk_begin(j, index);
        loom_buf_puts(&j->out, "\"delta\":{\"tool_calls\":");
        loom_buf_put(&j->out, d.p, d.len);
        loom_buf_puts(&j->out, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        d.len = 0;
    }
    loom_buf_free(&d);
}

/* echo: the prompt opens the choice's text, as in a blocking answer, with
 * the prompt's logprobs when asked for (then sent once they are all in). */
static void sse_echo(job *j, int index) {
    choice *c = &j->ch[index];
    sse_chunk_begin(j, index);
    loom_buf_puts(&j->out, "\"text\":");
    api_put_json_str(&j->out, j->prompt_text ? j->prompt_text : "",
                     j->prompt_text ? strlen(j->prompt_text) : 0);
    loom_buf_puts(&j->out, ",\"logprobs\":");
    if (c->plp.len) {
        choice tmp = *c;
        tmp.lp = (loom_buf){0};
        put_completion_logprobs(j, &tmp, &j->out);
    } else {
        loom_buf_puts(&j->out, "null");
    }
    loom_buf_puts(&j->out, ",\"finish_reason\":null}]}\n\n");
    loom_buf_free(&c->plp); /* later chunks carry only their own tokens */
}

static void sse_finish(job *j) {
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        sse_tool_deltas(j, i);
        sse_chunk_begin(j, i);
        if (j->req.kind == API_CHAT) loom_buf_puts(&j->out, "\"delta\":{},");
        else loom_buf_puts(&j->out, "\"text\":\"\",");
        loom_buf_printf(&j->out, "\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
                  c->finish ? c->finish : "stop");
    }
    if (j->req.include_usage || j->req.trace) { /* the last chunk: usage, spans */
        loom_buf_puts(&j->out, "data: ");
        put_head(j, &j->out, 1);
        loom_buf_puts(&j->out, "\"choices\":[]");
        if (j->req.include_usage) {
            loom_buf_puts(&j->out, ",");
            put_usage(j, &j->out);
        }
        if (j->req.trace) put_trace(j, &j->out);
        loom_buf_puts(&j->out, "}\n\n");
    }
    loom_buf_puts(&j->out, "data: [DONE]\n\n");
}

static void sse_error(job *j) {
    char *e = api_error_json(&j->err);
    loom_buf_puts(&j->out, "data: ");
    loom_buf_puts(&j->out, e ? e : "{\"error\":{\"message\":\"error\"}}");
    loom_buf_puts(&j->out, "\n\ndata: [DONE]\n\n");
    free(e);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    while (j->out_pos == j->out.len) {
        j->out.len = j->out_pos = 0;
        if (j->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (j->phase == 1 || all_done(j)) {
            if (j->phase == 0) sse_finish(j);
            j->phase = 2;
            continue;
        }
        emitted em = {0};
        int which = 0;
        size_t lp_before = 0;
        for (int i = 0; i < j->n; i++) j->ch[i].lp.len = 0; /* stream sends lp per chunk */
        (void)lp_before;
        int r = pump(j, &which, &em);
        if (r < 0) {
            loom_buf_free(&em.content);
            loom_buf_free(&em.reasoning);
            if (!j->failed) return MHD_CONTENT_READER_END_WITH_ERROR; /* client gone */
            sse_error(j);
            j->phase = 2;
            continue;
        }
        if (r > 0) {
            choice *c = &j->ch[which];
            sse_delta(j, which, &em, c->lp.len ? &c->lp : NULL);
            sse_tool_deltas(j, which);
        }
        loom_buf_free(&em.content);
        loom_buf_free(&em.reasoning);
        if (j->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = LOOM_MIN(max, j->out.len - j->out_pos);
    memcpy(buf, j->out.p + j->out_pos, n);
    j->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    job *j = cls;
    /* A stream MHD drops before its end: the client went away (a failed
     * write) or the server is stopping. */
    if (j->phase != 2 && !j->gone) metrics_count_disconnect(&j->srv->metrics);
    cancel_all(j);
    job_free(j);
}

/* ---- HTTP plumbing -------------------------------------------------------------- */

typedef struct route route;

typedef struct conn_ctx {
    loom_buf body;
    int too_big;
    int is_post;
    const route *rt;            /* the row answering, NULL when rejected */
    const char *label;          /* metrics endpoint label */
    api_error reject;           /* 401/404/405 decided on the headers (status 0: none) */
} conn_ctx;

static void add_common_headers(server *s, struct MHD_Response *resp, const char *type) {
    MHD_add_response_header(resp, "Content-Type", type);
    if (s->p.cors) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type, X-Loom-Trace");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    }
}

static enum MHD_Result send_text(server *s, struct MHD_Connection *conn, int status,
                                 const char *type, char *text) {
    if (!text) {
        static char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(oom), oom, MHD_RESPMEM_PERSISTENT);
        add_common_headers(s, r, "application/json");
        enum MHD_Result ret = MHD_queue_response(conn, 500, r);
        MHD_destroy_response(r);
        return ret;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    add_common_headers(s, r, type);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *conn, const char *endpoint,
                                  const api_error *err) {
    metrics_count_request(&s->metrics, endpoint, err->status);
    return send_text(s, conn, err->status, "application/json", api_error_json(err));
}

/* Runs a parsed non-streaming job to the end and frees it. Returns the
 * response body (or an error body) with *status set; NULL with status 0
 * when the client went away. */
static char *complete_job(job *j, int *status) {
    api_error err;
    char *body = NULL;
    if (build_prompt(j, &err) < 0 || start_job(j, &err) < 0) {
        *status = err.status;
        body = api_error_json(&err);
    } else if ((body = run_blocking(j)) != NULL) {
        *status = 200;
    } else if (j->failed) {
        *status = j->err.status;
        body = api_error_json(&j->err);
    } else {
        *status = 0;
    }
    cancel_all(j);
    job_free(j);
    return body;
}

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

static enum MHD_Result handle_generate(server *s, struct MHD_Connection *conn, api_kind kind,
                                       conn_ctx *cc) {
    const char *endpoint = kind == API_CHAT ? "chat" : "completions";
    api_error err;
    if (atomic_load(&s->draining)) {
        api_fail(&err, 503, NULL, "the server is shutting down");
        return send_error(s, conn, endpoint, &err);
    }
    job *j = calloc(1, sizeof *j);
    if (!j) return send_text(s, conn, 500, "application/json", NULL);
    j->srv = s;
    atomic_fetch_add(&s->inflight, 1);
    if (api_parse(kind, cc->body.p ? cc->body.p : "", cc->body.len, s->vocab, &j->req, &err) < 0 ||
        check_model(s, j->req.model, &err) < 0) {
        job_free(j);
        return send_error(s, conn, endpoint, &err);
    }
    const char *tr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Loom-Trace");
    if (tr && (!strcmp(tr, "1") || !strcmp(tr, "true"))) j->req.trace = 1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->t_start = loom_now();
    j->created = (long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%llu", kind == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    if (!j->req.stream) {
        int status = 0;
        char *body = complete_job(j, &status);
        if (!body && !status) return MHD_NO; /* client gone: drop the connection */
        metrics_count_request(&s->metrics, endpoint, status);
        return send_text(s, conn, status, "application/json", body);
    }
    if (build_prompt(j, &err) < 0 || start_job(j, &err) < 0) {
        cancel_all(j);
        job_free(j);
        return send_error(s, conn, endpoint, &err);
    }
    /* role first, so clients see the stream open at once */
    if (kind == API_CHAT)
        for (int i = 0; i < j->n; i++) {
            sse_chunk_begin(j, i);
            loom_buf_puts(&j->out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                             "\"finish_reason\":null}]}\n\n");
        }
    /* echo: at once, or once the prompt's logprobs are all in */
    if (kind == API_COMPLETION && j->req.echo)
        for (int i = 0; i < j->n; i++)
            if (j->ch[i].n_plp == (j->req.logprobs >= 0 ? j->n_prompt : 0)) sse_echo(j, i);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader,
                                                               j, stream_free);
    if (!r) {
        job_free(j);
        return send_text(s, conn, 500, "application/json", NULL);
    }
    add_common_headers(s, r, "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    metrics_count_request(&s->metrics, endpoint, 200);
    (void)kind_name;
    return ret;
}

static char *models_json(server *s) {
    loom_buf b = {0};
    loom_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    api_put_json_str(&b, s->model_id, strlen(s->model_id));
    loom_buf_printf(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"loom\",\"max_model_len\":%d}]}",
              (long)time(NULL), loom_model_max_positions(s->model));
    return b.oom ? (loom_buf_free(&b), NULL) : b.p;
}

static int authorized(server *s, struct MHD_Connection *conn) {
    if (!s->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->p.api_key;
    size_t a = strlen(k), b = strlen(want);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(k[i] ^ want[i]);
    return diff == 0;
}

/* ---- slow clients ------------------------------------------------------------ */

/* MHD's connection timeout restarts with every byte read, so a client that
 * trickles its request holds a connection, and its thread, for as long as
 * it likes; a few hundred of them starve everyone. So each connection has
 * a deadline that trickling does not move: the request line and headers
 * within --header-timeout of the connection, or of a kept-alive
 * connection's next request line (the wait for which --timeout bounds),
 * and the body within --body-timeout of the headers. A watchdog thread
 * shuts down the socket of a request past its deadline. A request fully
 * received has none, so a long answer or stream is never cut. */
typedef struct conn_watch {
    struct conn_watch *prev, *next;
    int fd;
    int idle;          /* between two requests of a kept-alive connection */
    double deadline;   /* loom_now() seconds; 0: none */
} conn_watch;

static conn_watch *watch_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void watch_set(server *s, conn_watch *w, int idle, double seconds) {
    if (!w) return;
    pthread_mutex_lock(&s->watch_lock);
    w->idle = idle;
    w->deadline = seconds > 0 ? loom_now() + seconds : 0;
    pthread_mutex_unlock(&s->watch_lock);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    conn_watch *w = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        if (!(w = calloc(1, sizeof *w))) return; /* unwatched, as MHD alone would */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        w->fd = ci ? ci->connect_fd : -1;
        w->deadline = loom_now() + s->p.header_timeout_s;
        pthread_mutex_lock(&s->watch_lock);
        w->next = s->watched;
        if (w->next) w->next->prev = w;
        s->watched = w;
        pthread_mutex_unlock(&s->watch_lock);
        *socket_context = w;
        return;
    }
    if (!w) return;
    /* MHD closes the socket after this, so the watchdog, which holds the
     * lock while it shuts sockets down, never touches a reused fd */
    pthread_mutex_lock(&s->watch_lock);
    if (w->prev) w->prev->next = w->next;
    else s->watched = w->next;
    if (w->next) w->next->prev = w->prev;
    pthread_mutex_unlock(&s->watch_lock);
    free(w);
    *socket_context = NULL;
}

/* The request line of a kept-alive connection's next request: the headers
 * are due from now. */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)uri;
    server *s = cls;
    conn_watch *w = watch_of(conn);
    if (w && w->idle) watch_set(s, w, 0, s->p.header_timeout_s);
    return NULL;
}

static void watch_headers_done(server *s, struct MHD_Connection *conn) {
    watch_set(s, watch_of(conn), 0, s->p.body_timeout_s);
}

static void watch_received(server *s, struct MHD_Connection *conn) {
    watch_set(s, watch_of(conn), 0, 0);
}

static void *watchdog(void *arg) {
    server *s = arg;
    while (!atomic_load(&s->watch_stop)) {
        double now = loom_now();
        pthread_mutex_lock(&s->watch_lock);
        for (conn_watch *w = s->watched; w; w = w->next)
            if (w->deadline > 0 && now > w->deadline && w->fd >= 0) {
                shutdown(w->fd, SHUT_RDWR); /* its thread sees the end and closes it */
                w->deadline = 0;
            }
        pthread_mutex_unlock(&s->watch_lock);
        usleep(100000);
    }
    return NULL;
}

/* ---- routes ------------------------------------------------------------------ */

typedef enum MHD_Result (*route_fn)(server *s, struct MHD_Connection *conn, conn_ctx *cc);

/* One row per endpoint. A /v1/ path is also answered without the prefix
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
};

static enum MHD_Result route_health(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    metrics_count_request(&s->metrics, cc->label, 200);
    return send_text(s, conn, 200, "application/json", strdup("{\"status\":\"ok\"}"));
}

static enum MHD_Result route_metrics(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    loom_engine_stats st = {0};
    pthread_rwlock_rdlock(&s->engine_lock);
    if (s->engine) loom_engine_get_stats(s->engine, &st);
    pthread_rwlock_unlock(&s->engine_lock);
    metrics_count_request(&s->metrics, cc->label, 200);
    return send_text(s, conn, 200, "text/plain; version=0.0.4",
                     metrics_render(&s->metrics, &st, atomic_load(&s->inflight)));
}

static enum MHD_Result route_models(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    metrics_count_request(&s->metrics, cc->label, 200);
    return send_text(s, conn, 200, "application/json", models_json(s));
}

static enum MHD_Result route_chat(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    return handle_generate(s, conn, API_CHAT, cc);
}

static enum MHD_Result route_completions(server *s, struct MHD_Connection *conn, conn_ctx *cc) {
    return handle_generate(s, conn, API_COMPLETION, cc);
}

static const route routes[] = {
    {"GET", "/health", route_health, "health", 0},
    {"GET", "/metrics", route_metrics, "metrics", 1},
    {"GET", "/v1/models", route_models, "models", 1},
    {"POST", "/v1/chat/completions", route_chat, "chat", 1},
    {"POST", "/v1/completions", route_completions, "completions", 1},
};

static int route_has_path(const route *rt, const char *url) {
    return !strcmp(url, rt->path) || (!strncmp(rt->path, "/v1/", 4) && !strcmp(url, rt->path + 3));
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
    if (path_row->auth && !authorized(s, conn)) {
        cc->rt = NULL;
        api_fail(&cc->reject, 401, NULL, "missing or invalid API key (send 'Authorization: Bearer <key>')");
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
        *con_cls = cc;
        atomic_fetch_add(&s->active, 1);
        watch_headers_done(s, conn);
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
    watch_received(s, conn);
    api_error err;
    if (!strcmp(method, "OPTIONS") && s->p.cors) {
        char *empty = strdup("");
        return send_text(s, conn, 204, "text/plain", empty);
    }
    if (cc->reject.status) return send_error(s, conn, cc->label, &cc->reject);
    if (cc->too_big) {
        api_fail(&err, 413, NULL, "the request body exceeds %zu bytes", s->p.max_body);
        return send_error(s, conn, cc->label, &err);
    }
    return cc->rt->fn(s, conn, cc);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    (void)toe;
    /* a kept-alive connection waits for its next request line */
    watch_set(s, watch_of(conn), 1, s->p.timeout_s + s->p.header_timeout_s);
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
    loom_chat_template_free(s->chat);
    loom_tok_free(s->tok);
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

char *loom_service_complete(loom_service *svc, int chat, const char *body, size_t len, int *status) {
    server *s = (server *)svc;
    api_kind kind = chat ? API_CHAT : API_COMPLETION;
    api_error err;
    job *j = calloc(1, sizeof *j);
    if (!j) {
        *status = 500;
        return NULL;
    }
    j->srv = s;
    j->fd = -1;
    atomic_fetch_add(&s->inflight, 1);
    if (api_parse(kind, body, len, s->vocab, &j->req, &err) < 0 ||
        (j->req.stream && api_fail(&err, 400, "stream", "streaming is not available in batch mode") < 0)) {
        job_free(j);
        *status = err.status;
        return api_error_json(&err);
    }
    j->t_start = loom_now();
    j->created = (long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    return complete_job(j, status);
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
    if (pthread_create(&dog, NULL, watchdog, s) != 0) {
        fprintf(stderr, "loom: error: cannot start the connection watchdog: %s\n", strerror(errno));
        free_server(s);
        return 1;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
            MHD_USE_ERROR_LOG,
        (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_URI_LOG_CALLBACK, on_request_line, s, MHD_OPTION_CONNECTION_TIMEOUT,
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
