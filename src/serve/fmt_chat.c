/* fmt_chat: the answer shapes of /v1/chat/completions, apart from the
 * job so that each endpoint's OpenAI format reads in one place: a message
 * (content, reasoning_content, tool_calls), per-token logprobs objects,
 * and stream deltas that open with the role. */
#include <stdlib.h>

#include "serve/job.h"

static void put_token_bytes(server *s, loom_buf *b, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    loom_buf_puts(b, "[");
    if (loom_tok_decode(s->tok, &id, 1, 0, &t, &n) == LOOM_OK)
        for (size_t i = 0; i < n; i++) loom_buf_printf(b, "%s%u", i ? "," : "", (unsigned char)t[i]);
    free(t);
    loom_buf_puts(b, "]");
}

static void chat_logprob(job *j, choice *c, const loom_event *ev) {
    server *s = j->srv;
    loom_buf *b = &c->lp;
    loom_buf_puts(b, "{\"token\":");
    job_put_token_text(s, b, ev->token);
    loom_buf_printf(b, ",\"logprob\":%.6g,\"bytes\":", ev->logprob);
    put_token_bytes(s, b, ev->token);
    loom_buf_puts(b, ",\"top_logprobs\":[");
    for (int k = 0; k < ev->n_top; k++) {
        loom_buf_puts(b, k ? ",{\"token\":" : "{\"token\":");
        job_put_token_text(s, b, ev->top_ids[k]);
        loom_buf_printf(b, ",\"logprob\":%.6g,\"bytes\":", ev->top_logprobs[k]);
        put_token_bytes(s, b, ev->top_ids[k]);
        loom_buf_puts(b, "}");
    }
    loom_buf_puts(b, "]}");
}

static void chat_choice(job *j, choice *c, loom_buf *b) {
    loom_buf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
    const loom_buf *content = &c->scan.content;
    if (c->scan.n_calls > 0 && content->len == 0) loom_buf_puts(b, "null");
    else api_put_json_str(b, content->p ? content->p : "", content->len);
    if (c->scan.reasoning.len) {
        loom_buf_puts(b, ",\"reasoning_content\":");
        api_put_json_str(b, c->scan.reasoning.p, c->scan.reasoning.len);
    }
    if (c->scan.n_calls > 0) {
        loom_buf_puts(b, ",\"tool_calls\":");
        loom_toolscan_put_calls(&c->scan, b, 0);
    }
    loom_buf_puts(b, "},\"logprobs\":");
    if (j->req.logprobs >= 0) {
        loom_buf_puts(b, "{\"content\":[");
        if (c->lp.p) loom_buf_put(b, c->lp.p, c->lp.len);
        loom_buf_puts(b, "]}");
    } else {
        loom_buf_puts(b, "null");
    }
    if (j->req.return_token_ids) { /* as vLLM: the prompt's ids (images' placeholders expanded) */
        loom_buf_puts(b, ",\"prompt_token_ids\":[");
        for (int k = 0; k < j->n_prompt; k++) loom_buf_printf(b, "%s%d", k ? "," : "", j->prompt[k]);
        loom_buf_puts(b, "],\"token_ids\":[");
        for (int k = 0; k < c->n_ids; k++) loom_buf_printf(b, "%s%d", k ? "," : "", c->ids[k]);
        loom_buf_puts(b, "]");
    }
}

/* role first, so clients see the stream open at once */
static void chat_sse_open(job *j) {
    for (int i = 0; i < j->n; i++) {
        job_sse_chunk_begin(j, i);
        loom_buf_puts(&j->out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                               "\"finish_reason\":null}]}\n\n");
    }
}

static void chat_sse_delta(job *j, int index, const emitted *em, const loom_buf *lp_new) {
    if (!em->content.len && !em->reasoning.len && !lp_new) return;
    job_sse_chunk_begin(j, index);
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
}

/* The tool calls choice index parsed since the last chunk: for each, a
 * delta with its id and name, then one with its arguments. */
static void chat_sse_tool_deltas(job *j, int index) {
    loom_buf d = {0};
    while (loom_toolscan_next_delta(&j->ch[index].scan, &d)) {
        job_sse_chunk_begin(j, index);
        loom_buf_puts(&j->out, "\"delta\":{\"tool_calls\":");
        loom_buf_put(&j->out, d.p, d.len);
        loom_buf_puts(&j->out, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        d.len = 0;
    }
    loom_buf_free(&d);
}

const api_endpoint fmt_chat = {
    .kind = API_CHAT,
    .id_prefix = "chatcmpl",
    .object = "chat.completion",
    .chunk_object = "chat.completion.chunk",
    .logprob = chat_logprob,
    .put_choice = chat_choice,
    .sse_open = chat_sse_open,
    .sse_delta = chat_sse_delta,
    .sse_extra = chat_sse_tool_deltas,
    .final_delta = "\"delta\":{},",
};
