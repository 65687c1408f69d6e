/* job: a generation request's life with no HTTP in it. The engine emits
 * one event per choice per step; pump() takes them in turn and polls the
 * client's socket on a clock, so a client that goes away is noticed (and
 * its requests cancelled) even while events keep coming. */
#include "serve/job.h"

#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "model/forward.h"

job *job_create(server *s, const api_endpoint *ep, const char *body, size_t len, api_error *err) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        err->status = 0;
        return NULL;
    }
    j->srv = s;
    j->ep = ep;
    j->fd = -1;
    atomic_fetch_add(&s->inflight, 1);
    if ((ep->parse ? ep->parse(j, body, len, err) : api_parse(ep->kind, body, len, s->vocab, &j->req, err)) < 0) {
        job_free(j);
        return NULL;
    }
    return j;
}

void job_free(job *j) {
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
    job_images_free(j);
    free(j->prompt);
    free(j->prompt_text);
    free(j->prompt_off);
    api_req_free(&j->req);
    cJSON_Delete(j->client);
    loom_grammar_release(j->grammar);
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

void job_cancel(job *j) {
    for (int i = 0; i < j->n; i++) loom_request_cancel(j->ch[i].rq);
}

/* ---- prompt ---------------------------------------------------------------- */

static int conversation_boundary(job *j);

/* The field a prompt error names. */
static const char *prompt_field(const api_req *r) { return r->kind == API_CHAT ? "messages" : "prompt"; }

int job_build_prompt(job *j, api_error *err) {
    server *s = j->srv;
    api_req *r = &j->req;
    if (!s->tok && (r->kind == API_CHAT || !r->prompt_ids))
        return api_fail(err, 400, prompt_field(r),
                        "this model directory has no tokenizer (tokenizer.json); send token ids%s",
                        r->kind == API_CHAT ? " to /v1/completions" : "");
    if (!s->tok && r->n_stops)
        return api_fail(err, 400, "stop", "stop strings need a tokenizer (tokenizer.json), "
                                          "and this model directory has none");
    if (r->kind == API_CHAT) {
        if (!s->chat)
            return api_fail(err, 400, "messages",
                            "this model has no chat template; use /v1/completions");
        if (r->n_images && job_images_prepare(j, err) < 0) return -1;
        loom_chat_params cp = loom_chat_default_params();
        cp.messages_json = r->messages_json;
        cp.tools_json = r->tools_json;
        cp.add_generation_prompt = 1;
        cp.kwargs_json = r->kwargs_json;
        size_t len;
        loom_status st = loom_chat_apply(s->chat, &cp, &j->prompt_text, &len);
        if (st != LOOM_OK)
            return api_fail(err, 400, "messages", "chat template: %s", loom_last_error());
        if (r->n_images && job_images_expand(j, &len, err) < 0) return -1;
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
    if (j->n_prompt == 0) return api_fail(err, 400, prompt_field(r), "the prompt encodes to no tokens");
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

/* tool_choice "required" or a named function: the output is one call (a
 * model left free to add more rarely stops) in the syntax the model writes
 * calls in (toolcall.h), so the scanner parses it as it would any call; the
 * output ends with the call. Syntaxes
 * whose calls are not JSON, or whose markers are special tokens a grammar
 * over text cannot write, are refused. */
static int tool_syntax(const server *s, const api_req *r, loom_gtool_syntax *syn, api_error *err) {
    int named = strcmp(r->tool_choice, "required") != 0;
    switch (s->tc_syntax) {
    case LOOM_TC_AUTO:
    case LOOM_TC_QWEN:
        if (s->tc_syntax == LOOM_TC_QWEN && loom_toolcall_xml_form(s->chat)) break;
        *syn = (loom_gtool_syntax){"", "", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", 1};
        return 0;
    case LOOM_TC_LLAMA3:
        *syn = (loom_gtool_syntax){"", "", "", "", NULL, "parameters", 1};
        return 0;
    case LOOM_TC_MISTRAL:
        *syn = (loom_gtool_syntax){"[TOOL_CALLS][", "]", "", "", ", ", "arguments", 1};
        return 0;
    default: break;
    }
    return api_fail(err, 400, "tool_choice",
                    "tool_choice '%s' is not supported for this model: its tool calls (%s%s syntax) are not "
                    "JSON a grammar can force; use \"auto\"",
                    named ? "function" : "required", loom_toolcall_syntax_name(s->tc_syntax),
                    s->tc_syntax == LOOM_TC_QWEN ? " with XML arguments" : "");
}

static int forced_tool(const api_req *r) {
    return r->kind == API_CHAT && r->tools_json && r->tool_choice && strcmp(r->tool_choice, "auto") &&
           strcmp(r->tool_choice, "none");
}

int job_grammar(server *s, const api_req *r, loom_grammar **out, api_error *err) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    *out = NULL;
    int tool = forced_tool(r);
    if (tool && r->grammar)
        return api_fail(err, 400, r->grammar_param, "'%s' and tool_choice '%s' both constrain the output: give one",
                        r->grammar_param, r->tool_choice);
    if (!r->grammar && !tool) return 0;
    const char *param = tool ? "tool_choice" : r->grammar_param;
    loom_gtool_syntax syn;
    if (tool && tool_syntax(s, r, &syn, err) < 0) return -1;
    if (!s->tok) return api_fail(err, 400, param, "constrained output needs the model's tokenizer");
    pthread_mutex_lock(&lock);
    loom_status st = s->gvocab ? LOOM_OK : loom_gvocab_from_tok(s->tok, s->vocab, &s->gvocab);
    pthread_mutex_unlock(&lock);
    if (st) return api_fail(err, 500, NULL, "%s", loom_last_error());
    char msg[400];
    if (tool) {
        const char *only = strcmp(r->tool_choice, "required") ? r->tool_choice : NULL;
        st = loom_grammar_from_tools(r->tools_json, only, &syn, s->gvocab, out, msg, sizeof msg);
        if (st == LOOM_ERR_NOMEM) return api_fail(err, 500, NULL, "out of memory");
        if (st) return api_fail(err, 400, "tools", "tool_choice '%s' cannot be forced: %s", r->tool_choice, msg);
        return 0;
    }
    switch (r->grammar) {
    case API_GRAMMAR_JSON_OBJECT: st = loom_grammar_json_object(s->gvocab, out, msg, sizeof msg); break;
    case API_GRAMMAR_JSON_SCHEMA: st = loom_grammar_from_schema(r->grammar_src, s->gvocab, out, msg, sizeof msg); break;
    case API_GRAMMAR_GBNF: st = loom_grammar_from_gbnf(r->grammar_src, s->gvocab, out, msg, sizeof msg); break;
    default: st = loom_grammar_from_regex(r->grammar_src, s->gvocab, out, msg, sizeof msg); break;
    }
    if (st == LOOM_ERR_NOMEM) return api_fail(err, 500, NULL, "out of memory");
    if (st) return api_fail(err, 400, r->grammar_param, "'%s' cannot be used: %s", r->grammar_param, msg);
    return 0;
}

/* Submits the n choices. */
static int submit(job *j, api_error *err) {
    server *s = j->srv;
    api_req *r = &j->req;
    loom_request_params rp = loom_request_default_params();
    rp.prompt = j->prompt;
    rp.n_prompt = j->n_prompt;
    rp.max_tokens = r->max_tokens > 0 ? r->max_tokens : s->p.default_max_tokens;
    /* max_tokens 0 (echo): the prompt alone; the one token made is dropped */
    if (r->max_tokens == 0) rp.max_tokens = 1;
    /* echo with logprobs: the prompt tokens' too (the first has none) */
    int echo_lp = j->ep->prompt_logprob && r->echo && r->logprobs >= 0;
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
    rp.images = j->images;
    rp.n_images = j->n_images;
    if (r->kind == API_CHAT && !r->ignore_eos) {
        rp.stop_ids = s->turn_end;
        rp.n_stop_ids = s->n_turn_end;
    }
    if (job_grammar(s, r, &j->grammar, err) < 0) return -1;
    rp.grammar = j->grammar; /* each choice's request takes its own reference */
    /* tool_choice "none": the tools stay in the prompt, and the tokens that
       open a call are banned (the request copies the biases at submit) */
    int no_calls = r->kind == API_CHAT && r->tools_json && !strcmp(r->tool_choice, "none");
    if (no_calls) {
        int32_t ids[8];
        int n_ids = loom_toolcall_open_ids(s->tc_syntax, s->tok, ids, 8), nb = r->sampling.n_logit_bias;
        loom_logit_bias *b = realloc(r->bias, sizeof *b * (size_t)(nb + n_ids + 1));
        if (!b) return api_fail(err, 500, NULL, "out of memory");
        for (int i = 0; i < n_ids; i++) b[nb++] = (loom_logit_bias){ids[i], -INFINITY};
        r->bias = b;
        r->sampling.logit_bias = rp.sampling.logit_bias = b;
        r->sampling.n_logit_bias = rp.sampling.n_logit_bias = nb;
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
        loom_toolscan_init(&c->scan, r->kind == API_CHAT && r->tools_json != NULL && !no_calls,
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
        if (echo_lp) j->ep->prompt_logprob(j, c, NULL);
        pthread_rwlock_rdlock(&s->engine_lock);
        loom_status st = atomic_load(&s->shutting_down)
                             ? LOOM_ERR_BUSY
                             : loom_engine_submit(s->engine, &rp, &c->rq);
        pthread_rwlock_unlock(&s->engine_lock);
        if (st == LOOM_ERR_BUSY)
            return api_fail(err, atomic_load(&s->shutting_down) ? 503 : 429, NULL,
                            "the server is busy: %s", atomic_load(&s->shutting_down)
                                                          ? "shutting down" : loom_last_error());
        if (st == LOOM_ERR_RANGE || st == LOOM_ERR_INVALID_ARG || st == LOOM_ERR_UNSUPPORTED)
            return api_fail(err, 400, prompt_field(r), "%s", loom_last_error());
        if (st != LOOM_OK) return api_fail(err, 500, NULL, "%s", loom_last_error());
    }
    metrics_add_tokens(&s->metrics, (uint64_t)j->n_prompt * (uint64_t)j->n, 0);
    return 0;
}

int job_start(job *j, api_error *err) {
    j->t_start = loom_now();
    j->created = (long)time(NULL);
    const char *pre = j->ep->id_prefix;
    snprintf(j->id, sizeof j->id, "%s%s%llu", pre, pre[strlen(pre) - 1] == '_' ? "" : "-",
             (unsigned long long)atomic_fetch_add(&j->srv->next_id, 1));
    return job_build_prompt(j, err) < 0 || submit(j, err) < 0 ? -1 : 0;
}

/* ---- what every endpoint's answer shares --------------------------------- */

void job_put_token_text(server *s, loom_buf *b, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    if (loom_tok_decode(s->tok, &id, 1, 0, &t, &n) != LOOM_OK) {
        loom_buf_puts(b, "\"\"");
        return;
    }
    api_put_json_str(b, t, n);
    free(t);
}

void job_usage(const job *j, int *generated, int *cached) {
    *generated = *cached = 0;
    for (int i = 0; i < j->n; i++) {
        *generated += j->ch[i].n_ids;
        *cached = LOOM_MAX(*cached, j->ch[i].n_cached);
    }
}

static void put_usage(job *j, loom_buf *b) {
    int gen, cached;
    job_usage(j, &gen, &cached);
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
        loom_event ev = {.finish = j->ch[i].final_seen ? LOOM_FINISH_STOP : LOOM_FINISH_NONE};
        for (int k = 0; k < 100 && ev.finish == LOOM_FINISH_NONE; k++)
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
    const char *obj = chunk ? j->ep->chunk_object : j->ep->object;
    loom_buf_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", j->id, obj,
              j->created);
    api_put_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
    loom_buf_puts(b, ",");
}

/* ---- event processing -------------------------------------------------------- */

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

/* Handles one event of choice c. Returns -1 on a failure (j->err set). */
static int on_event(job *j, choice *c, const loom_event *ev, emitted *em) {
    server *s = j->srv;
    if (ev->finish != LOOM_FINISH_NONE) {
        c->n_cached = ev->n_cached;
        c->final_seen = 1;
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
        if (j->ep->prompt_logprob) j->ep->prompt_logprob(j, c, ev);
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
    if (j->req.logprobs >= 0) {
        if (c->lp.len) loom_buf_puts(&c->lp, ",");
        j->ep->logprob(j, c, ev);
        c->text_offset += len;
    }
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
            job_cancel(j);
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
        job_cancel(j);
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

/* A choice a stop string ended was cancelled before its final event,
 * which carries the usage's cached tokens: wait for it (the cancel takes
 * effect at the next step). */
static void settle(job *j) {
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        loom_event ev;
        for (int k = 0; k < 50 && !c->final_seen; k++)
            if (loom_request_next(c->rq, &ev, 100) == LOOM_OK && ev.finish != LOOM_FINISH_NONE) {
                c->n_cached = ev.n_cached;
                c->final_seen = 1;
            }
    }
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
    settle(j);
    loom_buf b = {0};
    if (j->ep->put_answer) {
        j->ep->put_answer(j, &b);
        if (!b.oom) return b.p;
        loom_buf_free(&b);
        return NULL;
    }
    put_head(j, &b, 0);
    loom_buf_puts(&b, "\"choices\":[");
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        loom_buf_printf(&b, "%s{\"index\":%d,", i ? "," : "", i);
        j->ep->put_choice(j, c, &b);
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

void job_sse_chunk_begin(job *j, int index) {
    loom_buf_puts(&j->out, "data: ");
    put_head(j, &j->out, 1);
    loom_buf_printf(&j->out, "\"choices\":[{\"index\":%d,", index);
}

static void sse_finish(job *j) {
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        if (j->ep->sse_extra) j->ep->sse_extra(j, i);
        job_sse_chunk_begin(j, i);
        loom_buf_puts(&j->out, j->ep->final_delta);
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

void job_stream_open(job *j) { j->ep->sse_open(j); }

int job_stream_fill(job *j) {
    while (j->out_pos == j->out.len) {
        j->out.len = j->out_pos = 0;
        if (j->phase == 2) return 0;
        if (j->phase == 1 || all_done(j)) {
            if (j->phase == 0) {
                settle(j);
                (j->ep->sse_finish ? j->ep->sse_finish : sse_finish)(j);
            }
            j->phase = 2;
            continue;
        }
        emitted em = {0};
        int which = 0;
        for (int i = 0; i < j->n; i++) j->ch[i].lp.len = 0; /* stream sends lp per chunk */
        int r = pump(j, &which, &em);
        if (r < 0) {
            loom_buf_free(&em.content);
            loom_buf_free(&em.reasoning);
            if (!j->failed) return -1; /* client gone */
            (j->ep->sse_error ? j->ep->sse_error : sse_error)(j);
            j->phase = 2;
            continue;
        }
        if (r > 0) {
            choice *c = &j->ch[which];
            j->ep->sse_delta(j, which, &em, c->lp.len ? &c->lp : NULL);
            if (j->ep->sse_extra) j->ep->sse_extra(j, which);
        }
        loom_buf_free(&em.content);
        loom_buf_free(&em.reasoning);
        if (j->out.oom) return -1;
    }
    return 1;
}

void job_stream_close(job *j) {
    /* A stream dropped before its end: the client went away (a failed
     * write) or the server is stopping. */
    if (j->phase != 2 && !j->gone) metrics_count_disconnect(&j->srv->metrics);
    job_cancel(j);
    job_free(j);
}

char *job_complete(job *j, int *status) {
    api_error err;
    char *body = NULL;
    if (job_start(j, &err) < 0) {
        *status = err.status;
        err.dialect = j->ep->dialect;
        body = api_error_json(&err);
    } else if ((body = run_blocking(j)) != NULL) {
        *status = 200;
    } else if (j->failed) {
        *status = j->err.status;
        j->err.dialect = j->ep->dialect;
        body = api_error_json(&j->err);
    } else {
        *status = 0;
    }
    job_cancel(j);
    job_free(j);
    return body;
}

