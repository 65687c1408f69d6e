/* fmt_messages: the answer shapes of Anthropic's /v1/messages. A message
 * holds content blocks (thinking, text, tool_use) in the order the model
 * wrote them, a stop_reason (end_turn, max_tokens, stop_sequence,
 * tool_use) and usage whose input_tokens leave out what the prefix cache
 * or a continued session served (cache_read_input_tokens). A stream is
 * named events: message_start, then per block content_block_start,
 * content_block_delta (text_delta, thinking_delta, input_json_delta) and
 * content_block_stop, then message_delta and message_stop. */
#include <stdlib.h>
#include <string.h>

#include "serve/api_messages.h"
#include "serve/job.h"

enum { PART_NONE, PART_TEXT, PART_THINKING };

static int messages_parse(job *j, const char *body, size_t len, api_error *err) {
    return api_messages_parse(body, len, j->srv->vocab, 0, &j->req, &j->client, err);
}

static int count_parse(job *j, const char *body, size_t len, api_error *err) {
    return api_messages_parse(body, len, j->srv->vocab, 1, &j->req, &j->client, err);
}

static const char *stop_reason(const choice *c, const char **seq) {
    *seq = NULL;
    if (c->scan.n_calls > 0) return "tool_use";
    if (c->finish && !strcmp(c->finish, "length")) return "max_tokens";
    if ((*seq = loom_ts_stop_hit(c->ts)) != NULL) return "stop_sequence";
    return "end_turn";
}

static void put_stop(const choice *c, loom_buf *b) {
    const char *seq;
    loom_buf_printf(b, "\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason(c, &seq));
    if (seq) api_put_json_str(b, seq, strlen(seq));
    else loom_buf_puts(b, "null");
}

static void put_usage(job *j, loom_buf *b, int final) {
    int gen, cached;
    job_usage(j, &gen, &cached);
    loom_buf_printf(b, "\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
                       "\"cache_read_input_tokens\":%d,\"output_tokens\":%d}",
                    j->n_prompt - cached, cached, final ? gen : 0);
}

/* A call's id in Anthropic's form: toolu_ and what follows the scanner's
 * call_ (the same call keeps one id blocking and streamed). */
static void put_tool_id(loom_buf *b, const char *id) {
    if (!strncmp(id, "call_", 5)) id += 5;
    loom_buf_printf(b, "\"toolu_%s\"", id);
}

static void put_tool_use(const loom_tool_call *tc, loom_buf *b) {
    loom_buf_puts(b, "{\"type\":\"tool_use\",\"id\":");
    put_tool_id(b, tc->id);
    loom_buf_puts(b, ",\"name\":");
    api_put_json_str(b, tc->name, strlen(tc->name));
    loom_buf_printf(b, ",\"input\":%s}", tc->arguments);
}

static void put_head(job *j, loom_buf *b) {
    loom_buf_printf(b, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", j->id);
    api_put_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
}

static void messages_answer(job *j, loom_buf *b) {
    const choice *c = &j->ch[0];
    put_head(j, b);
    loom_buf_puts(b, ",\"content\":[");
    int n = 0;
    if (c->scan.reasoning.len) {
        loom_buf_puts(b, "{\"type\":\"thinking\",\"thinking\":");
        api_put_json_str(b, c->scan.reasoning.p, c->scan.reasoning.len);
        loom_buf_puts(b, ",\"signature\":\"\"}");
        n++;
    }
    if (c->scan.content.len || c->scan.n_calls == 0) {
        loom_buf_puts(b, n++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
        api_put_json_str(b, c->scan.content.p ? c->scan.content.p : "", c->scan.content.len);
        loom_buf_puts(b, "}");
    }
    for (int i = 0; i < c->scan.n_calls; i++) {
        if (n++) loom_buf_puts(b, ",");
        put_tool_use(&c->scan.calls[i], b);
    }
    loom_buf_puts(b, "],");
    put_stop(c, b);
    loom_buf_puts(b, ",");
    put_usage(j, b, 1);
    loom_buf_puts(b, "}");
}

/* ---- streaming -------------------------------------------------------------- */

static void event_begin(job *j, const char *name) {
    loom_buf_printf(&j->out, "event: %s\ndata: {\"type\":\"%s\"", name, name);
}

static void block_stop(job *j) {
    if (!j->part_open) return;
    event_begin(j, "content_block_stop");
    loom_buf_printf(&j->out, ",\"index\":%d}\n\n", j->part - 1);
    j->part_open = PART_NONE;
}

/* Opens a block of kind unless one is open; j->part counts the blocks. */
static void block_start(job *j, int kind) {
    if (j->part_open == kind) return;
    block_stop(j);
    event_begin(j, "content_block_start");
    loom_buf_printf(&j->out, ",\"index\":%d,\"content_block\":%s}\n\n", j->part++,
                    kind == PART_TEXT ? "{\"type\":\"text\",\"text\":\"\"}"
                                      : "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
    j->part_open = kind;
}

static void block_delta(job *j, const char *type, const char *key, const char *s, size_t n) {
    event_begin(j, "content_block_delta");
    loom_buf_printf(&j->out, ",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", j->part - 1, type, key);
    api_put_json_str(&j->out, s, n);
    loom_buf_puts(&j->out, "}}\n\n");
}

static void messages_sse_open(job *j) {
    event_begin(j, "message_start");
    loom_buf_puts(&j->out, ",\"message\":");
    put_head(j, &j->out);
    loom_buf_puts(&j->out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,");
    put_usage(j, &j->out, 0);
    loom_buf_puts(&j->out, "}}\n\n");
}

static void messages_sse_delta(job *j, int index, const emitted *em, const loom_buf *lp_new) {
    (void)index;
    (void)lp_new;
    if (em->reasoning.len) {
        block_start(j, PART_THINKING);
        block_delta(j, "thinking_delta", "thinking", em->reasoning.p, em->reasoning.len);
    }
    if (em->content.len) {
        block_start(j, PART_TEXT);
        block_delta(j, "text_delta", "text", em->content.p, em->content.len);
    }
}

/* Each tool call, once parsed, is a block of its own: its start with an
 * empty input, the input as one input_json_delta, its stop. */
static void messages_sse_tools(job *j, int index) {
    loom_toolscan *sc = &j->ch[index].scan;
    for (int i = 0; i < sc->n_calls; i++) {
        loom_tool_call *tc = &sc->calls[i];
        if (tc->sent) continue;
        block_stop(j);
        event_begin(j, "content_block_start");
        loom_buf_printf(&j->out, ",\"index\":%d,\"content_block\":{\"type\":\"tool_use\",\"id\":", j->part++);
        put_tool_id(&j->out, tc->id);
        loom_buf_puts(&j->out, ",\"name\":");
        api_put_json_str(&j->out, tc->name, strlen(tc->name));
        loom_buf_puts(&j->out, ",\"input\":{}}}\n\n");
        j->part_open = -1; /* a tool block: no later text joins it */
        block_delta(j, "input_json_delta", "partial_json", tc->arguments, strlen(tc->arguments));
        block_stop(j);
        tc->sent = 2;
    }
}

static void messages_sse_finish(job *j) {
    const choice *c = &j->ch[0];
    messages_sse_tools(j, 0);
    if (j->part == 0) block_start(j, PART_TEXT); /* as the blocking answer: one empty text block */
    block_stop(j);
    event_begin(j, "message_delta");
    loom_buf_puts(&j->out, ",\"delta\":{");
    put_stop(c, &j->out);
    loom_buf_puts(&j->out, "},");
    put_usage(j, &j->out, 1);
    loom_buf_puts(&j->out, "}\n\n");
    event_begin(j, "message_stop");
    loom_buf_puts(&j->out, "}\n\n");
}

static void messages_sse_error(job *j) {
    j->err.dialect = API_DIALECT_ANTHROPIC;
    char *e = api_error_json(&j->err);
    loom_buf_puts(&j->out, "event: error\ndata: ");
    loom_buf_puts(&j->out, e ? e : "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"error\"}}");
    loom_buf_puts(&j->out, "\n\n");
    free(e);
}

const api_endpoint fmt_messages = {
    .kind = API_CHAT,
    .id_prefix = "msg_",
    .object = "message",
    .chunk_object = "message",
    .sse_open = messages_sse_open,
    .sse_delta = messages_sse_delta,
    .sse_extra = messages_sse_tools,
    .parse = messages_parse,
    .put_answer = messages_answer,
    .sse_finish = messages_sse_finish,
    .sse_error = messages_sse_error,
    .dialect = API_DIALECT_ANTHROPIC,
};

static const api_endpoint fmt_messages_count = {
    .kind = API_CHAT,
    .id_prefix = "msg_",
    .parse = count_parse,
};

/* The prompt as /v1/messages would render and tokenize it. */
char *fmt_messages_count_tokens(server *s, const char *body, size_t len, int *status) {
    api_error err;
    job *j = job_create(s, &fmt_messages_count, body, len, &err);
    if (!j && !err.status) {
        *status = 500;
        return NULL;
    }
    char *out = NULL;
    if (j && job_build_prompt(j, &err) == 0) {
        loom_buf b = {0};
        loom_buf_printf(&b, "{\"input_tokens\":%d}", j->n_prompt);
        *status = 200;
        out = b.oom ? (loom_buf_free(&b), NULL) : b.p;
    } else {
        err.dialect = API_DIALECT_ANTHROPIC;
        *status = err.status;
        out = api_error_json(&err);
    }
    job_free(j);
    return out;
}
