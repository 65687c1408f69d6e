/* libFuzzer target: the tool-call / reasoning splitter and the JSON the
 * server writes into SSE chunks. The first byte holds the flags (tools,
 * reasoning, a prompt that opens <think>) and the piece size; the rest is
 * the generated text. Checks: feeding in pieces gives what feeding it whole
 * gives; no marker leaks into streamed content before it is decided; the
 * chunk JSON built from the pieces and calls parses, and its strings come
 * back byte for byte. */
#include <assert.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct result {
    loom_buf content, reasoning;
    loom_toolscan t;
} result;

static void run(result *o, int tools, int think, const char *prompt, const char *text, size_t n,
                size_t piece) {
    memset(o, 0, sizeof *o);
    loom_toolscan_init(&o->t, tools, think, prompt);
    for (size_t i = 0; i < n; i += piece) {
        size_t k = n - i < piece ? n - i : piece;
        loom_toolscan_feed(&o->t, text + i, k, 0, &o->content, &o->reasoning);
    }
    loom_toolscan_feed(&o->t, "", 0, 1, &o->content, &o->reasoning);
}

static void clear(result *o) {
    loom_buf_free(&o->content);
    loom_buf_free(&o->reasoning);
    loom_toolscan_free(&o->t);
}

static int same(const loom_buf *a, const loom_buf *b) {
    return a->len == b->len && (a->len == 0 || !memcmp(a->p, b->p, a->len));
}

/* A chat chunk as the server writes it; parses it back. */
static void check_chunk(const loom_buf *content, const loom_toolscan *t) {
    loom_buf b = {0};
    loom_buf_puts(&b, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":");
    api_put_json_str(&b, content->p ? content->p : "", content->len);
    if (t->n_calls) {
        loom_buf_puts(&b, ",\"tool_calls\":");
        loom_toolscan_put_calls(t, &b, 1);
    }
    loom_buf_puts(&b, "}}]}");
    assert(!b.oom);
    cJSON *j = cJSON_Parse(b.p);
    assert(j);
    cJSON *delta = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
    const cJSON *c = cJSON_GetObjectItem(delta, "content");
    assert(cJSON_IsString(c));
    /* cJSON strings end at a NUL; compare what it can hold */
    if (!content->p || !memchr(content->p, 0, content->len))
        assert(strlen(c->valuestring) == content->len && !memcmp(c->valuestring, content->p ? content->p : "", content->len));
    const cJSON *calls = cJSON_GetObjectItem(delta, "tool_calls");
    assert(cJSON_GetArraySize(calls) == t->n_calls);
    for (int i = 0; i < t->n_calls; i++) {
        const cJSON *f = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, i), "function");
        assert(cJSON_IsString(cJSON_GetObjectItem(f, "name")));
        assert(cJSON_IsString(cJSON_GetObjectItem(f, "arguments")));
        assert(!strcmp(cJSON_GetObjectItem(f, "name")->valuestring, t->calls[i].name));
        assert(!strcmp(cJSON_GetObjectItem(f, "arguments")->valuestring, t->calls[i].arguments));
    }
    cJSON_Delete(j);
    loom_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int tools = data[0] & 1, think = (data[0] >> 1) & 1;
    const char *prompt = (data[0] >> 2) & 1 ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n";
    size_t piece = 1 + (data[0] >> 3);
    const char *text = (const char *)data + 1;
    size_t n = size - 1;

    result whole, parts;
    run(&whole, tools, think, prompt, text, n, n ? n : 1);
    run(&parts, tools, think, prompt, text, n, piece);
    assert(same(&whole.content, &parts.content));
    assert(same(&whole.reasoning, &parts.reasoning));
    assert(whole.t.n_calls == parts.t.n_calls);
    for (int i = 0; i < whole.t.n_calls; i++) {
        assert(!strcmp(whole.t.calls[i].name, parts.t.calls[i].name));
        assert(!strcmp(whole.t.calls[i].arguments, parts.t.calls[i].arguments));
    }
    /* what the scanner says it emitted is what it handed out */
    assert(same(&whole.content, &whole.t.content));
    assert(same(&whole.reasoning, &whole.t.reasoning));
    check_chunk(&parts.content, &parts.t);
    clear(&whole);
    clear(&parts);
    return 0;
}
