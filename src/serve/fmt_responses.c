/* fmt_responses: the answer shapes of OpenAI's /v1/responses, and the
 * responses kept for GET /v1/responses/{id} and previous_response_id.
 * A response's output is items: reasoning (reasoning_text), a message
 * (output_text) and function_call items. A stream is typed events, each
 * with its sequence_number: response.created, response.in_progress, per
 * item output_item.added, content_part.added, the text's deltas and its
 * .done, content_part.done, output_item.done (a function_call's arguments
 * as function_call_arguments.delta and .done), then response.completed
 * (response.incomplete when max_output_tokens cut it).
 *
 * The store keeps, for each response id, its object (for GET) and its
 * conversation as chat messages (what a continuation renders before its
 * own input); the engine keeps the KV of the same id (save_id), so a
 * continuation computes only its new tokens. Least recently used first
 * out, past a count or a byte cap. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "serve/api_messages.h"
#include "serve/job.h"
#include "serve/json_field.h"

#define STORE_MAX_ENTRIES 1024
#define STORE_MAX_BYTES (64u << 20)

enum { PART_NONE, PART_MESSAGE, PART_REASONING };

/* ---- the store ---------------------------------------------------------------- */

typedef struct resp_entry {
    char id[48];           /* "" when the slot is empty */
    char *response;        /* owned: the response object */
    char *messages;        /* owned: its conversation, a chat messages array */
    size_t bytes;
    uint64_t used;         /* LRU clock */
} resp_entry;

struct resp_store {
    pthread_mutex_t lock;
    resp_entry e[STORE_MAX_ENTRIES];
    size_t bytes;
    uint64_t clock;
};

struct resp_store *fmt_responses_store_create(void) {
    struct resp_store *st = calloc(1, sizeof *st);
    if (st) pthread_mutex_init(&st->lock, NULL);
    return st;
}

static void entry_drop(struct resp_store *st, resp_entry *x) {
    st->bytes -= x->bytes;
    free(x->response);
    free(x->messages);
    *x = (resp_entry){0};
}

void fmt_responses_store_free(struct resp_store *st) {
    if (!st) return;
    for (int i = 0; i < STORE_MAX_ENTRIES; i++)
        if (st->e[i].id[0]) entry_drop(st, &st->e[i]);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* Call with the lock held. */
static resp_entry *entry_find(struct resp_store *st, const char *id) {
    for (int i = 0; i < STORE_MAX_ENTRIES; i++)
        if (st->e[i].id[0] && !strcmp(st->e[i].id, id)) return &st->e[i];
    return NULL;
}

/* Keeps response and messages (owned from here) under id, evicting the
 * least recently used until both caps hold. */
static void store_put(struct resp_store *st, const char *id, char *response, char *messages) {
    size_t bytes = strlen(response) + strlen(messages);
    if (!st || bytes > STORE_MAX_BYTES) {
        free(response);
        free(messages);
        return;
    }
    pthread_mutex_lock(&st->lock);
    resp_entry *slot = entry_find(st, id);
    if (slot) entry_drop(st, slot);
    for (;;) {
        resp_entry *old = NULL, *empty = NULL;
        for (int i = 0; i < STORE_MAX_ENTRIES; i++) {
            resp_entry *x = &st->e[i];
            if (!x->id[0]) empty = empty ? empty : x;
            else if (!old || x->used < old->used) old = x;
        }
        if (empty && st->bytes + bytes <= STORE_MAX_BYTES) {
            slot = empty;
            break;
        }
        entry_drop(st, old); /* old exists: a full store or one past its bytes has entries */
    }
    snprintf(slot->id, sizeof slot->id, "%s", id);
    slot->response = response;
    slot->messages = messages;
    slot->bytes = bytes;
    slot->used = ++st->clock;
    st->bytes += bytes;
    pthread_mutex_unlock(&st->lock);
}

/* A copy of the entry's response object (want_messages 0) or its
 * conversation, or NULL when id is unknown or evicted. */
static char *store_get(struct resp_store *st, const char *id, int want_messages) {
    if (!st) return NULL;
    pthread_mutex_lock(&st->lock);
    resp_entry *x = entry_find(st, id);
    char *out = NULL;
    if (x) {
        x->used = ++st->clock;
        out = strdup(want_messages ? x->messages : x->response);
    }
    pthread_mutex_unlock(&st->lock);
    return out;
}

/* ---- the request ---------------------------------------------------------------- */

static int responses_parse(job *j, const char *body, size_t len, api_error *err) {
    memset(err, 0, sizeof *err);
    cJSON *in = api_parse_object(body, len, err), *history = NULL;
    if (!in) return -1;
    const cJSON *prev = json_get(in, "previous_response_id");
    if (prev && !cJSON_IsString(prev)) {
        cJSON_Delete(in);
        return api_fail(err, 400, "previous_response_id", "'previous_response_id' must be a string");
    }
    if (prev) {
        char *text = store_get(j->srv->responses, prev->valuestring, 1);
        history = text ? cJSON_Parse(text) : NULL;
        free(text);
        if (!history) {
            api_fail(err, 404, "previous_response_id", "Previous response with id '%s' not found.",
                     prev->valuestring);
            err->code = "previous_response_not_found";
            cJSON_Delete(in);
            return -1;
        }
    }
    int rc = api_responses_parse(in, history, j->srv->vocab, &j->req, err);
    cJSON_Delete(history);
    if (rc < 0) {
        cJSON_Delete(in);
        return -1;
    }
    j->client = in;
    return 0;
}

/* ---- the response object ---------------------------------------------------------- */

/* The number in the response id, which item ids share. */
static const char *id_num(const job *j) { return j->id + strlen("resp_"); }

static int incomplete(const job *j) {
    const choice *c = &j->ch[0];
    return c->finish && !strcmp(c->finish, "length") && c->scan.n_calls == 0;
}

static void put_text_item(job *j, loom_buf *b, int kind, int index, const char *text, size_t n, int done) {
    if (kind == PART_REASONING) {
        loom_buf_printf(b, "{\"id\":\"rs_%s_%d\",\"type\":\"reasoning\",\"summary\":[],\"content\":[", id_num(j), index);
        if (done) {
            loom_buf_puts(b, "{\"type\":\"reasoning_text\",\"text\":");
            api_put_json_str(b, text, n);
            loom_buf_puts(b, "}");
        }
        loom_buf_puts(b, "]}");
        return;
    }
    loom_buf_printf(b, "{\"id\":\"msg_%s_%d\",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\","
                       "\"content\":[", id_num(j), index, done ? "completed" : "in_progress");
    if (done) {
        loom_buf_puts(b, "{\"type\":\"output_text\",\"text\":");
        api_put_json_str(b, text, n);
        loom_buf_puts(b, ",\"annotations\":[],\"logprobs\":[]}");
    }
    loom_buf_puts(b, "]}");
}

static void put_call_item(job *j, loom_buf *b, const loom_tool_call *tc, int index, int done) {
    loom_buf_printf(b, "{\"id\":\"fc_%s_%d\",\"type\":\"function_call\",\"status\":\"%s\",\"call_id\":", id_num(j),
                    index, done ? "completed" : "in_progress");
    api_put_json_str(b, tc->id, strlen(tc->id));
    loom_buf_puts(b, ",\"name\":");
    api_put_json_str(b, tc->name, strlen(tc->name));
    loom_buf_puts(b, ",\"arguments\":");
    if (done) api_put_json_str(b, tc->arguments, strlen(tc->arguments));
    else loom_buf_puts(b, "\"\"");
    loom_buf_puts(b, "}");
}

/* The output items of a finished response: reasoning, message, calls. */
static void put_output(job *j, loom_buf *b) {
    const choice *c = &j->ch[0];
    int k = 0;
    loom_buf_puts(b, "[");
    if (c->scan.reasoning.len) {
        put_text_item(j, b, PART_REASONING, k++, c->scan.reasoning.p, c->scan.reasoning.len, 1);
    }
    if (c->scan.content.len || c->scan.n_calls == 0) {
        if (k) loom_buf_puts(b, ",");
        put_text_item(j, b, PART_MESSAGE, k++, c->scan.content.p ? c->scan.content.p : "", c->scan.content.len, 1);
    }
    for (int i = 0; i < c->scan.n_calls; i++) {
        if (k) loom_buf_puts(b, ",");
        put_call_item(j, b, &c->scan.calls[i], k++, 1);
    }
    loom_buf_puts(b, "]");
}

/* The field of the request as sent, or dflt (JSON text). */
static void put_echo(job *j, loom_buf *b, const char *key, const char *as, const char *dflt) {
    const cJSON *v = json_get(j->client, key);
    char *t = v ? cJSON_PrintUnformatted(v) : NULL;
    loom_buf_printf(b, ",\"%s\":%s", as ? as : key, t ? t : dflt);
    free(t);
}

/* The response object; final: with its output, status and usage. */
static void put_response(job *j, loom_buf *b, int final) {
    const char *status = !final ? "in_progress" : incomplete(j) ? "incomplete" : "completed";
    loom_buf_printf(b, "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%ld,\"status\":\"%s\",\"model\":",
                    j->id, j->created, status);
    api_put_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
    loom_buf_puts(b, ",\"output\":");
    if (final) put_output(j, b);
    else loom_buf_puts(b, "[]");
    loom_buf_printf(b, ",\"error\":null,\"incomplete_details\":%s",
                    final && incomplete(j) ? "{\"reason\":\"max_output_tokens\"}" : "null");
    put_echo(j, b, "instructions", NULL, "null");
    put_echo(j, b, "max_output_tokens", NULL, "null");
    put_echo(j, b, "previous_response_id", NULL, "null");
    put_echo(j, b, "temperature", NULL, "null");
    put_echo(j, b, "top_p", NULL, "null");
    put_echo(j, b, "tools", NULL, "[]");
    put_echo(j, b, "tool_choice", NULL, "\"auto\"");
    put_echo(j, b, "text", NULL, "{\"format\":{\"type\":\"text\"}}");
    put_echo(j, b, "store", NULL, "true");
    put_echo(j, b, "metadata", NULL, "{}");
    put_echo(j, b, "parallel_tool_calls", NULL, "true");
    if (final) {
        int gen, cached;
        job_usage(j, &gen, &cached);
        loom_buf_printf(b, ",\"usage\":{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},"
                           "\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":0},"
                           "\"total_tokens\":%d}",
                        j->n_prompt, cached, gen, j->n_prompt + gen);
    } else {
        loom_buf_puts(b, ",\"usage\":null");
    }
    loom_buf_puts(b, "}");
}

/* The conversation after this response, as chat messages: the request's
 * (without its instructions, which a continuation does not inherit) and
 * the assistant's turn. */
static char *conversation(job *j) {
    cJSON *msgs = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(j->req.body, "messages"), 1);
    if (!msgs) return NULL;
    if (cJSON_IsString(json_get(j->client, "instructions"))) cJSON_DeleteItemFromArray(msgs, 0);
    const choice *c = &j->ch[0];
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", c->scan.content.p ? c->scan.content.p : "");
    if (c->scan.reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", c->scan.reasoning.p);
    if (c->scan.n_calls) {
        cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < c->scan.n_calls; i++) {
            cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(tc, "id", c->scan.calls[i].id);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(fn, "name", c->scan.calls[i].name);
            cJSON *args = cJSON_Parse(c->scan.calls[i].arguments);
            cJSON_AddItemToObject(fn, "arguments", args ? args : cJSON_CreateObject());
            cJSON_AddItemToObject(tc, "function", fn);
            cJSON_AddItemToArray(calls, tc);
        }
    }
    cJSON_AddItemToArray(msgs, m);
    char *text = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    return text;
}

/* Keeps the finished response unless the request said store: false. */
static void keep(job *j, const loom_buf *response) {
    if (cJSON_IsFalse(json_get(j->client, "store")) || response->oom || !response->p) return;
    char *r = strdup(response->p), *m = conversation(j);
    if (!r || !m) {
        free(r);
        free(m);
        return;
    }
    store_put(j->srv->responses, j->id, r, m);
}

static void responses_answer(job *j, loom_buf *b) {
    put_response(j, b, 1);
    keep(j, b);
}

/* ---- streaming ---------------------------------------------------------------- */

static void ev_begin(job *j, const char *name) {
    loom_buf_printf(&j->out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d", name, name, j->seq++);
}

static void ev_end(job *j) { loom_buf_puts(&j->out, "}\n\n"); }

static const loom_buf *part_text(job *j, int kind) {
    return kind == PART_REASONING ? &j->ch[0].scan.reasoning : &j->ch[0].scan.content;
}

static void item_close(job *j) {
    int kind = j->part_open, k = j->part - 1;
    if (kind == PART_NONE) return;
    const loom_buf *all = part_text(j, kind);
    const char *text = all->p ? all->p + j->part_from : "";
    size_t n = all->len - j->part_from;
    const char *item = kind == PART_REASONING ? "rs" : "msg";
    ev_begin(j, kind == PART_REASONING ? "response.reasoning_text.done" : "response.output_text.done");
    loom_buf_printf(&j->out, ",\"item_id\":\"%s_%s_%d\",\"output_index\":%d,\"content_index\":0,\"text\":", item,
                    id_num(j), k, k);
    api_put_json_str(&j->out, text, n);
    ev_end(j);
    ev_begin(j, "response.content_part.done");
    loom_buf_printf(&j->out, ",\"item_id\":\"%s_%s_%d\",\"output_index\":%d,\"content_index\":0,\"part\":{\"type\":\"%s\","
                             "\"text\":", item, id_num(j), k, k, kind == PART_REASONING ? "reasoning_text" : "output_text");
    api_put_json_str(&j->out, text, n);
    loom_buf_puts(&j->out, kind == PART_REASONING ? "}" : ",\"annotations\":[]}");
    ev_end(j);
    ev_begin(j, "response.output_item.done");
    loom_buf_printf(&j->out, ",\"output_index\":%d,\"item\":", k);
    put_text_item(j, &j->out, kind, k, text, n, 1);
    ev_end(j);
    j->part_open = PART_NONE;
}

/* Opens an item of kind unless one is open; its text begins n bytes
 * before the end of the scan's text (this step's, already taken). */
static void item_open(job *j, int kind, size_t n) {
    if (j->part_open == kind) return;
    item_close(j);
    int k = j->part++;
    j->part_open = kind;
    j->part_from = part_text(j, kind)->len - n;
    ev_begin(j, "response.output_item.added");
    loom_buf_printf(&j->out, ",\"output_index\":%d,\"item\":", k);
    put_text_item(j, &j->out, kind, k, "", 0, 0);
    ev_end(j);
    ev_begin(j, "response.content_part.added");
    loom_buf_printf(&j->out, ",\"item_id\":\"%s_%s_%d\",\"output_index\":%d,\"content_index\":0,\"part\":%s",
                    kind == PART_REASONING ? "rs" : "msg", id_num(j), k, k,
                    kind == PART_REASONING ? "{\"type\":\"reasoning_text\",\"text\":\"\"}"
                                           : "{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}");
    ev_end(j);
}

static void item_delta(job *j, const char *s, size_t n) {
    int k = j->part - 1, r = j->part_open == PART_REASONING;
    ev_begin(j, r ? "response.reasoning_text.delta" : "response.output_text.delta");
    loom_buf_printf(&j->out, ",\"item_id\":\"%s_%s_%d\",\"output_index\":%d,\"content_index\":0,\"delta\":",
                    r ? "rs" : "msg", id_num(j), k, k);
    api_put_json_str(&j->out, s, n);
    if (!r) loom_buf_puts(&j->out, ",\"logprobs\":[]");
    ev_end(j);
}

static void responses_sse_open(job *j) {
    static const char *names[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        ev_begin(j, names[i]);
        loom_buf_puts(&j->out, ",\"response\":");
        put_response(j, &j->out, 0);
        ev_end(j);
    }
}

static void responses_sse_delta(job *j, int index, const emitted *em, const loom_buf *lp_new) {
    (void)index;
    (void)lp_new;
    if (em->reasoning.len) {
        item_open(j, PART_REASONING, em->reasoning.len);
        item_delta(j, em->reasoning.p, em->reasoning.len);
    }
    if (em->content.len) {
        item_open(j, PART_MESSAGE, em->content.len);
        item_delta(j, em->content.p, em->content.len);
    }
}

static void responses_sse_calls(job *j, int index) {
    loom_toolscan *sc = &j->ch[index].scan;
    for (int i = 0; i < sc->n_calls; i++) {
        loom_tool_call *tc = &sc->calls[i];
        if (tc->sent) continue;
        item_close(j);
        int k = j->part++;
        ev_begin(j, "response.output_item.added");
        loom_buf_printf(&j->out, ",\"output_index\":%d,\"item\":", k);
        put_call_item(j, &j->out, tc, k, 0);
        ev_end(j);
        ev_begin(j, "response.function_call_arguments.delta");
        loom_buf_printf(&j->out, ",\"item_id\":\"fc_%s_%d\",\"output_index\":%d,\"delta\":", id_num(j), k, k);
        api_put_json_str(&j->out, tc->arguments, strlen(tc->arguments));
        ev_end(j);
        ev_begin(j, "response.function_call_arguments.done");
        loom_buf_printf(&j->out, ",\"item_id\":\"fc_%s_%d\",\"output_index\":%d,\"name\":", id_num(j), k, k);
        api_put_json_str(&j->out, tc->name, strlen(tc->name));
        loom_buf_puts(&j->out, ",\"arguments\":");
        api_put_json_str(&j->out, tc->arguments, strlen(tc->arguments));
        ev_end(j);
        ev_begin(j, "response.output_item.done");
        loom_buf_printf(&j->out, ",\"output_index\":%d,\"item\":", k);
        put_call_item(j, &j->out, tc, k, 1);
        ev_end(j);
        tc->sent = 2;
    }
}

static void responses_sse_finish(job *j) {
    responses_sse_calls(j, 0);
    if (j->part == 0) item_open(j, PART_MESSAGE, 0); /* as the blocking answer: one message */
    item_close(j);
    loom_buf resp = {0};
    put_response(j, &resp, 1);
    keep(j, &resp);
    ev_begin(j, incomplete(j) ? "response.incomplete" : "response.completed");
    loom_buf_puts(&j->out, ",\"response\":");
    if (resp.p) loom_buf_put(&j->out, resp.p, resp.len);
    else loom_buf_puts(&j->out, "null");
    ev_end(j);
    loom_buf_free(&resp);
}

static void responses_sse_error(job *j) {
    ev_begin(j, "error");
    loom_buf_printf(&j->out, ",\"code\":\"%s\",\"message\":", j->err.type ? j->err.type : "server_error");
    api_put_json_str(&j->out, j->err.message, strlen(j->err.message));
    loom_buf_puts(&j->out, ",\"param\":null");
    ev_end(j);
}

const api_endpoint fmt_responses = {
    .kind = API_CHAT,
    .id_prefix = "resp_",
    .object = "response",
    .chunk_object = "response",
    .sse_open = responses_sse_open,
    .sse_delta = responses_sse_delta,
    .sse_extra = responses_sse_calls,
    .parse = responses_parse,
    .put_answer = responses_answer,
    .sse_finish = responses_sse_finish,
    .sse_error = responses_sse_error,
};

/* Drops the entry of id; 1 when there was one. */
static int store_delete(struct resp_store *st, const char *id) {
    if (!st) return 0;
    pthread_mutex_lock(&st->lock);
    resp_entry *x = entry_find(st, id);
    if (x) entry_drop(st, x);
    pthread_mutex_unlock(&st->lock);
    return x != NULL;
}

char *fmt_responses_get(server *s, const char *id, int del, int *status) {
    char *r = del ? NULL : store_get(s->responses, id, 0);
    if (r) {
        *status = 200;
        return r;
    }
    if (del && store_delete(s->responses, id)) {
        loom_buf b = {0};
        loom_buf_puts(&b, "{\"id\":");
        api_put_json_str(&b, id, strlen(id));
        loom_buf_puts(&b, ",\"object\":\"response\",\"deleted\":true}");
        *status = 200;
        return b.oom ? (loom_buf_free(&b), NULL) : b.p;
    }
    api_error err = {0};
    api_fail(&err, 404, NULL, "Response with id '%s' not found.", id);
    *status = 404;
    return api_error_json(&err);
}
