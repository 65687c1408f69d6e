/* Server pieces that need no HTTP: request parsing and validation
 * (api_parse), the tool-call / reasoning splitter (toolcall.c) fed whole
 * and in small pieces, the stop-string hold-back (textstream.c) over a real
 * tokenizer, JSON string escaping and the Prometheus rendering. */
#include <cjson/cJSON.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/server.h"
#include "serve/toolcall.h"
#include "stream/textstream.h"
#include "test.h"
#include "tokenize/tokenizer.h"

/* ---- api_parse ------------------------------------------------------------ */

static void check_rejects(api_kind kind, const char *body, int status, const char *param) {
    api_req r;
    api_error e;
    int rc = api_parse(kind, body, strlen(body), 1000, &r, &e);
    CHECKF(rc < 0, "accepted: %s", body);
    if (rc < 0) {
        CHECKF(e.status == status, "%s: status %d, want %d", body, e.status, status);
        CHECKF(!strcmp(e.param, param), "%s: param \"%s\", want \"%s\" (%s)", body, e.param, param,
               e.message);
        char *j = api_error_json(&e);
        cJSON *p = j ? cJSON_Parse(j) : NULL;
        CHECKF(p && cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(p, "error"), "message")),
               "error JSON %s", j ? j : "(null)");
        cJSON_Delete(p);
        free(j);
    } else {
        api_req_free(&r);
    }
}

static void test_parse_errors(void) {
    const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[512];
    check_rejects(API_CHAT, "{\"messages\":[", 400, "");
    check_rejects(API_CHAT, "", 400, "");
    check_rejects(API_CHAT, "\"text\"", 400, "");
    check_rejects(API_CHAT, "{}", 400, "messages");
    check_rejects(API_CHAT, "{\"messages\":[]}", 400, "messages");
    check_rejects(API_CHAT, "{\"messages\":[1]}", 400, "messages[0]");
    check_rejects(API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role");
    check_rejects(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"ai\"}]}", 400,
                  "messages[1].role");
    /* content parts: an image part needs its URL, an unknown type names itself, at most
     * API_MAX_IMAGES images (the parts themselves: test_media.c) */
    check_rejects(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                  400, "messages[0].content[0]");
    check_rejects(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"a\",{\"type\":\"audio\"}]}]}",
                  400, "messages[0].content[1]");
    {
        loom_buf many = {0};
        loom_buf_puts(&many, "{\"messages\":[{\"role\":\"user\",\"content\":[");
        for (int k = 0; k <= API_MAX_IMAGES; k++)
            loom_buf_printf(&many, "%s{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,%d\"}}",
                            k ? "," : "", k);
        loom_buf_puts(&many, "]}]}");
        char want[48];
        snprintf(want, sizeof want, "messages[0].content[%d]", API_MAX_IMAGES);
        check_rejects(API_CHAT, many.p, 400, want);
        loom_buf_free(&many);
        const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                         "\"text\":\"see\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:A\"}}"
                         ",{\"type\":\"image_url\",\"image_url\":\"data:B\"}]}]}";
        api_req r;
        api_error e;
        CHECKF(api_parse(API_CHAT, ok, strlen(ok), 1000, &r, &e) == 0, "%s", e.message);
        CHECK_EQ_INT(r.n_images, 2);
        CHECK(r.n_images == 2 && !strcmp(r.image_urls[0], "data:A") && !strcmp(r.image_urls[1], "data:B"));
        CHECK_STR(r.image_params[1], "messages[0].content[2]");
        CHECKF(strstr(r.messages_json, "{\"type\":\"text\",\"text\":\"see\"},{\"type\":\"image\"}") &&
               !strstr(r.messages_json, "data:"), "%s", r.messages_json);
        api_req_free(&r);
    }
    static const struct { const char *extra, *param; } bad[] = {
        {"\"model\":5", "model"},
        {"\"stream\":1", "stream"},
        {"\"stream_options\":{\"include_usage\":\"yes\"}", "stream_options"},
        {"\"n\":17", "n"},
        {"\"n\":1.5", "n"},
        {"\"max_tokens\":0", "max_tokens"},
        {"\"max_completion_tokens\":-3", "max_completion_tokens"},
        {"\"temperature\":-0.1", "temperature"},
        {"\"top_p\":0", "top_p"},
        {"\"min_p\":2", "min_p"},
        {"\"presence_penalty\":3", "presence_penalty"},
        {"\"frequency_penalty\":\"x\"", "frequency_penalty"},
        {"\"top_k\":-2", "top_k"},
        {"\"seed\":0.5", "seed"},
        {"\"seed\":1e20", "seed"},
        {"\"seed\":-1e19", "seed"},
        {"\"logit_bias\":[]", "logit_bias"},
        {"\"logit_bias\":{\"1000\":1}", "logit_bias"},
        {"\"logit_bias\":{\"5\":101}", "logit_bias"},
        {"\"logit_bias\":{\"5x\":1}", "logit_bias"},
        {"\"stop\":5", "stop"},
        {"\"stop\":[\"a\",2]", "stop"},
        {"\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]", "stop"},
        {"\"logprobs\":1", "logprobs"},
        {"\"logprobs\":true,\"top_logprobs\":21", "top_logprobs"},
        {"\"top_logprobs\":1", "top_logprobs"},
        {"\"tools\":{}", "tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{}}]", "tools[0].function.name"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"always\"", "tool_choice"},
        {"\"response_format\":{\"type\":\"xml\"}", "response_format"},
        {"\"chat_template_kwargs\":[]", "chat_template_kwargs"},
        {"\"previous_response_id\":5", "previous_response_id"},
        {"\"cache_session_id\":{}", "cache_session_id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(b, sizeof b, "{%s,%s}", M, bad[i].extra);
        check_rejects(API_CHAT, b, 400, bad[i].param);
    }
    check_rejects(API_COMPLETION, "{\"max_tokens\":3}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":\"\"}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":[]}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":[1,1000]}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":[1,-1]}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":[1,2.5]}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":{}}", 400, "prompt");
    check_rejects(API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs");
    check_rejects(API_COMPLETION, "{\"prompt\":\"x\",\"echo\":\"y\"}", 400, "echo");
}

static void test_parse_ok(void) {
    api_req r;
    api_error e;
    const char *b =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"x\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}],"
        "\"n\":3,\"seed\":-1,\"stop\":[\"x\",\"yz\"],\"logprobs\":true,\"top_logprobs\":2,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":7,\"top_k\":-1,"
        "\"logit_bias\":{\"3\":-100,\"4\":2.5},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}";
    CHECKF(api_parse(API_CHAT, b, strlen(b), 1000, &r, &e) == 0, "%s", e.message);
    CHECK_EQ_INT(r.n, 3);
    CHECK_EQ_INT(r.n_stops, 2);
    CHECK_STR(r.stops[1], "yz");
    CHECK_EQ_INT(r.logprobs, 2);
    CHECK(r.stream && r.include_usage && r.seed_given);
    CHECK(r.sampling.seed == UINT64_MAX);
    CHECK_EQ_INT(r.max_tokens, 7);
    CHECK_EQ_INT(r.sampling.top_k, 0);
    CHECK_EQ_INT(r.sampling.n_logit_bias, 2);
    CHECK(isinf(r.sampling.logit_bias[0].bias) && r.sampling.logit_bias[1].bias == 2.5f);
    CHECK(r.tools_json != NULL);
    CHECK_STR(r.model, "m");
    /* content parts joined; string arguments turned into objects for templates */
    cJSON *m = cJSON_Parse(r.messages_json);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 0), "content")->valuestring, "a\nb");
    cJSON *args = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "tool_calls"), 0),
                            "function"),
        "arguments");
    CHECK(cJSON_IsObject(args) && cJSON_GetObjectItem(args, "x")->valueint == 1);
    cJSON_Delete(m);
    api_req_free(&r);

    b = "{\"prompt\":[[5,6,7]],\"echo\":true,\"return_token_ids\":true,\"logprobs\":0,\"tool_choice\":\"none\","
        "\"previous_response_id\":\"cmpl-4\"}";
    CHECKF(api_parse(API_COMPLETION, b, strlen(b), 1000, &r, &e) == 0, "%s", e.message);
    CHECK(r.previous_response_id && !strcmp(r.previous_response_id, "cmpl-4"));
    CHECK_EQ_INT(r.n_prompt_ids, 3);
    CHECK(r.prompt_ids && r.prompt_ids[2] == 7);
    CHECK(r.echo && r.return_token_ids && r.logprobs == 0);
    api_req_free(&r);
    /* a body that is not NUL-terminated is read only up to len */
    char buf[] = "{\"prompt\":\"ab\"}GARBAGE";
    CHECK(api_parse(API_COMPLETION, buf, 15, 1000, &r, &e) == 0);
    api_req_free(&r);
}

/* Rejected with a message naming what is wrong (and the field, if any). */
static void check_rejects_msg(api_kind kind, const char *body, size_t len, const char *param,
                              const char *msg) {
    api_req r;
    api_error e;
    int rc = api_parse(kind, body, len, 1000, &r, &e);
    CHECKF(rc < 0, "accepted: %.*s", (int)len, body);
    if (rc < 0) {
        CHECKF(e.status == 400, "%s: status %d", body, e.status);
        CHECKF(!strcmp(e.param, param), "%s: param \"%s\", want \"%s\" (%s)", body, e.param, param, e.message);
        CHECKF(strstr(e.message, msg) != NULL, "%s: message \"%s\" lacks \"%s\"", body, e.message, msg);
    } else {
        api_req_free(&r);
    }
}

/* cJSON strings end at a NUL: a \u0000 escape or a raw NUL byte would cut
 * text short unseen, so both are refused, the escape naming its field. */
static void test_parse_nul(void) {
    const char *nul = "contains a NUL character (\\u0000)";
    check_rejects_msg(API_COMPLETION, "{\"prompt\":\"a\\u0000b\",\"echo\":true}", 33, "prompt", nul);
    const char *b = "{\"prompt\":\"x\",\"stop\":[\"ok\",\"a\\u0000\"]}";
    check_rejects_msg(API_COMPLETION, b, strlen(b), "stop[1]", nul);
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"user\",\"content\":\"x\\u0000y\"}]}";
    check_rejects_msg(API_CHAT, b, strlen(b), "messages[1].content", nul);
    b = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\\\"\\u0000\"}]}]}";
    check_rejects_msg(API_CHAT, b, strlen(b), "messages[0].content[0].text", nul);
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"parameters\":{\"a\":[1,{\"b\":\"\\u0000\"}]}}}]}";
    check_rejects_msg(API_CHAT, b, strlen(b), "tools[0].function.parameters.a[1].b", nul);
    b = "{\"prompt\":\"x\",\"a\\u0000b\":1}";
    check_rejects_msg(API_COMPLETION, b, strlen(b), "a\\u0000b", nul);
    /* an escaped backslash, then text: "\\u0000" is no NUL, "\\\u0000" is */
    b = "{\"prompt\":\"a\\\\u0000b\"}";
    api_req r;
    api_error e;
    CHECKF(api_parse(API_COMPLETION, b, strlen(b), 1000, &r, &e) == 0, "%s", e.message);
    CHECK(r.prompt_text && !strcmp(r.prompt_text, "a\\u0000b"));
    api_req_free(&r);
    b = "{\"prompt\":\"a\\\\\\u0000b\"}";
    check_rejects_msg(API_COMPLETION, b, strlen(b), "prompt", nul);
    /* raw NUL bytes, inside a string and after the object */
    static const char raw1[] = "{\"prompt\":\"a\0b\"}", raw2[] = "{\"prompt\":\"a\"}\0";
    check_rejects_msg(API_COMPLETION, raw1, sizeof raw1 - 1, "", "NUL byte (at byte 12)");
    check_rejects_msg(API_COMPLETION, raw2, sizeof raw2 - 1, "", "NUL byte (at byte 14)");
}

/* Only whitespace may follow the object, and nothing past len is read:
 * bodies and all their prefixes end where an inaccessible page begins. */
static void test_parse_trailing(void) {
    const char *after = "text after the JSON value";
    check_rejects_msg(API_COMPLETION, "{\"prompt\":\"a\"} junk", 19, "", after);
    check_rejects_msg(API_COMPLETION, "{\"prompt\":\"a\"}{}", 16, "", after);
    check_rejects_msg(API_COMPLETION, "{\"prompt\":\"a\"},", 15, "", after);
    api_req r;
    api_error e;
    const char *ok = "{\"prompt\":\"a\"} \r\n\t ";
    CHECKF(api_parse(API_COMPLETION, ok, strlen(ok), 1000, &r, &e) == 0, "%s", e.message);
    api_req_free(&r);
    long pg = sysconf(_SC_PAGESIZE);
    char *map = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED && mprotect(map + pg, (size_t)pg, PROT_NONE) == 0);
    if (map == MAP_FAILED) return;
    static const char *const bodies[] = {
        "{\"prompt\":\"a\\u00e9\\ud83d\\ude00\",\"max_tokens\":12,\"temperature\":1e-3,\"echo\":true}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\\\\\"}],\"stop\":[\"x\"],\"n\":1} ",
    };
    for (size_t k = 0; k < LOOM_ARRAY_LEN(bodies); k++) {
        size_t n = strlen(bodies[k]), whole = n;
        while (bodies[k][whole - 1] == ' ') whole--;
        for (size_t len = 0; len <= n; len++) {
            char *at = map + pg - len;
            memcpy(at, bodies[k], len);
            int rc = api_parse(k ? API_CHAT : API_COMPLETION, at, len, 1000, &r, &e);
            CHECKF((rc == 0) == (len >= whole), "body %zu, %zu of %zu bytes: rc %d (%s)", k, len, n, rc,
                   rc ? e.message : "");
            if (rc == 0) api_req_free(&r);
        }
    }
    munmap(map, (size_t)pg * 2);
}

/* tool_choice: its shape, and the function it names must be a tool. */
static void test_parse_tool_choice(void) {
    const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    const char *T = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                    "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]";
    static const struct { int tools; const char *choice, *msg; } bad[] = {
        {1, "{\"type\":\"function\",\"function\":{\"name\":\"h\"}}",
         "tool_choice names function 'h', which is not in tools"},
        {0, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
         "tool_choice names function 'f', which is not in tools"},
        {0, "\"required\"", "'tool_choice' is required, but there are no tools"},
        {1, "\"always\"", "must be none, auto, required or {\"type\": \"function\""},
        {1, "5", "'tool_choice' must be a string or an object"},
        {1, "[]", "'tool_choice' must be a string or an object"},
        {1, "{\"type\":\"tool\",\"function\":{\"name\":\"f\"}}", "'tool_choice.type' must be \"function\""},
        {1, "{\"function\":{\"name\":\"f\"}}", "'tool_choice.type' must be \"function\""},
        {1, "{\"type\":\"function\"}", "'tool_choice.function.name' is required"},
        {1, "{\"type\":\"function\",\"function\":{\"name\":3}}", "'tool_choice.function.name' is required"},
    };
    char b[512];
    for (size_t i = 0; i < LOOM_ARRAY_LEN(bad); i++) {
        snprintf(b, sizeof b, "{%s%s%s,\"tool_choice\":%s}", M, bad[i].tools ? "," : "", bad[i].tools ? T : "",
                 bad[i].choice);
        check_rejects_msg(API_CHAT, b, strlen(b), "tool_choice", bad[i].msg);
    }
    static const struct { int tools; const char *choice, *want; int has_tools; } good[] = {
        {1, "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}", "g", 1},
        {1, "\"required\"", "required", 1},
        {1, "\"none\"", "none", 1}, /* the tools stay in the prompt */
        {1, "null", "auto", 1},
        {0, "\"auto\"", "auto", 0},
        {0, "\"none\"", "none", 0},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(good); i++) {
        snprintf(b, sizeof b, "{%s%s%s,\"tool_choice\":%s}", M, good[i].tools ? "," : "",
                 good[i].tools ? T : "", good[i].choice);
        api_req r;
        api_error e;
        CHECKF(api_parse(API_CHAT, b, strlen(b), 1000, &r, &e) == 0, "%s: %s", b, e.message);
        CHECKF(r.tool_choice && !strcmp(r.tool_choice, good[i].want), "%s: tool_choice %s", b, r.tool_choice);
        CHECK_EQ_INT(r.tools_json != NULL, good[i].has_tools);
        api_req_free(&r);
    }
}

/* A schema loom cannot keep is a 400 at parse time, in OpenAI's error
 * shape, naming the keyword and where it is; strict also refuses what
 * would only be approximated, and a strict tool's parameters are checked
 * the same way. */
static void test_parse_schemas(void) {
    const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    const char *overlap = "{\"oneOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"string\",\"minLength\":2}]}";
    char b[1024];
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
             "\"schema\":{\"type\":\"object\",\"properties\":{\"ids\":{\"type\":\"array\",\"contains\":{}}}}}}}", M);
    check_rejects_msg(API_CHAT, b, strlen(b), "response_format",
                      "'response_format' cannot be used: 'contains' is not supported (at #/properties/ids/contains)");
    check_rejects(API_CHAT, b, 400, "response_format");
    snprintf(b, sizeof b, "{%s,\"guided_json\":{\"type\":\"array\",\"prefixItems\":[]}}", M);
    check_rejects_msg(API_CHAT, b, strlen(b), "guided_json", "'prefixItems' is not supported");
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
             "\"strict\":true,\"schema\":%s}}}", M, overlap);
    check_rejects_msg(API_CHAT, b, strlen(b), "response_format", "'oneOf' branches 0 and 1 may both match one value");
    /* without strict the same schema is taken (oneOf written as anyOf) */
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
             "\"schema\":%s}}}", M, overlap);
    api_req r;
    api_error e;
    CHECKF(api_parse(API_CHAT, b, strlen(b), 1000, &r, &e) == 0, "%s: %s", b, e.message);
    api_req_free(&r);
    const char *tool = "{\"type\":\"function\",\"function\":{\"name\":\"f\",%s\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}}}";
    char t[512];
    snprintf(t, sizeof t, tool, "\"strict\":true,");
    snprintf(b, sizeof b, "{%s,\"tools\":[%s]}", M, t);
    check_rejects_msg(API_CHAT, b, strlen(b), "tools[0].function.parameters", "strict tool 'f' parameters: regex '(?=x)'");
    snprintf(t, sizeof t, tool, "");
    snprintf(b, sizeof b, "{%s,\"tools\":[%s]}", M, t);
    CHECKF(api_parse(API_CHAT, b, strlen(b), 1000, &r, &e) == 0, "%s: %s", b, e.message);
    api_req_free(&r);
}

/* max_tokens 0 (the prompt alone) is for completions with echo only. */
static void test_parse_max_tokens_zero(void) {
    api_req r;
    api_error e;
    const char *b = "{\"prompt\":\"x\",\"max_tokens\":0,\"echo\":true,\"logprobs\":1}";
    CHECKF(api_parse(API_COMPLETION, b, strlen(b), 1000, &r, &e) == 0, "%s", e.message);
    CHECK_EQ_INT(r.max_tokens, 0);
    api_req_free(&r);
    b = "{\"prompt\":\"x\",\"max_tokens\":0}";
    check_rejects_msg(API_COMPLETION, b, strlen(b), "max_tokens", "needs 'echo': true");
}

/* ---- JSON strings ------------------------------------------------------------ */

static void test_json_str(void) {
    const char raw[] = "a\"b\\c\n\r\t\x01\x1f\x7f \xc3\xa9 </script>";
    loom_buf b = {0};
    api_put_json_str(&b, raw, sizeof raw - 1);
    cJSON *j = cJSON_Parse(b.p);
    CHECKF(cJSON_IsString(j) && !strcmp(j->valuestring, raw), "%s", b.p);
    cJSON_Delete(j);
    loom_buf_free(&b);
    /* embedded NUL */
    api_put_json_str(&b, "x\0y", 3);
    CHECK_STR(b.p, "\"x\\u0000y\"");
    loom_buf_free(&b);
    loom_buf_printf(&b, "%s-%0600d", "long", 1);
    CHECK_EQ_INT(b.len, 605);
    loom_buf_free(&b);
}

/* ---- tool calls ---------------------------------------------------------------- */

typedef struct scan_out {
    loom_buf content, reasoning;
    loom_toolscan t;
} scan_out;

/* Feeds text in pieces of `piece` bytes (0: whole), then finishes. */
static void scan(scan_out *o, int tools, int think, const char *prompt, const char *text, size_t piece) {
    memset(o, 0, sizeof *o);
    loom_toolscan_init(&o->t, tools, think, prompt);
    size_t n = strlen(text);
    if (!piece) piece = n ? n : 1;
    for (size_t i = 0; i < n; i += piece) {
        size_t k = n - i < piece ? n - i : piece;
        loom_toolscan_feed(&o->t, text + i, k, 0, &o->content, &o->reasoning);
        /* nothing that may start a marker leaves before it is decided */
        if (tools && o->content.p) CHECKF(!strstr(o->content.p, "<tool_call"), "leaked: %s", o->content.p);
    }
    loom_toolscan_feed(&o->t, "", 0, 1, &o->content, &o->reasoning);
}

static void scan_free(scan_out *o) {
    loom_buf_free(&o->content);
    loom_buf_free(&o->reasoning);
    loom_toolscan_free(&o->t);
}

static const char *str(const loom_buf *b) { return b->p ? b->p : ""; }

/* The call's arguments, reparsed: compares JSON values, not spacing. */
static int args_equal(const char *got, const char *want) {
    cJSON *a = cJSON_Parse(got), *b = cJSON_Parse(want);
    int eq = a && b && cJSON_Compare(a, b, 1);
    cJSON_Delete(a);
    cJSON_Delete(b);
    return eq;
}

static void test_toolcalls(void) {
    static const struct {
        const char *text, *content, *name0, *args0, *name1;
        int n_calls;
    } cases[] = {
        /* Qwen / Hermes */
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
         "get_weather", "{\"city\":\"Paris\"}", NULL, 1},
        {"Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n"
         "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
         "Let me look.\n", "a", "{\"x\":[1,2]}", "b", 2},
        /* Llama 3: bare JSON with parameters, or after <|python_tag|> */
        {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "", "get_weather",
         "{\"city\":\"Oslo\"}", NULL, 1},
        {"<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"a<b\"}}", "", "f", "{\"q\":\"a<b\"}", NULL, 1},
        /* Mistral */
        {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": 1}}, {\"name\": \"b\", \"arguments\": \"{}\"}]", "",
         "a", "{\"k\":1}", "b", 2},
        /* not calls: returned as content, whole */
        {"{not json at all", "{not json at all", NULL, NULL, NULL, 0},
        {"if a < b and c <tool", "if a < b and c <tool", NULL, NULL, NULL, 0},
        {"x = [TOOL", "x = [TOOL", NULL, NULL, NULL, 0},
        {"plain answer", "plain answer", NULL, NULL, NULL, 0},
        {"[1, 2, 3] is the list", "[1, 2, 3] is the list", NULL, NULL, NULL, 0},
        {"{\"name\": 5}", "{\"name\": 5}", NULL, NULL, NULL, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t piece = 0; piece <= 7; piece++) {
            scan_out o;
            scan(&o, 1, 0, NULL, cases[c].text, piece);
            CHECKF(o.t.n_calls == cases[c].n_calls, "case %zu piece %zu: %d calls", c, piece, o.t.n_calls);
            CHECKF(!strcmp(str(&o.content), cases[c].content), "case %zu piece %zu: content \"%s\"", c, piece,
                   str(&o.content));
            if (cases[c].n_calls > 0 && o.t.n_calls > 0) {
                CHECK_STR(o.t.calls[0].name, cases[c].name0);
                CHECKF(args_equal(o.t.calls[0].arguments, cases[c].args0), "case %zu: args %s", c,
                       o.t.calls[0].arguments);
            }
            if (cases[c].name1 && o.t.n_calls > 1) CHECK_STR(o.t.calls[1].name, cases[c].name1);
            if (piece == 0 && o.t.n_calls > 0) {
                /* the OpenAI shape, with indexes when streamed */
                loom_buf b = {0};
                loom_toolscan_put_calls(&o.t, &b, 1);
                cJSON *j = cJSON_Parse(b.p);
                CHECKF(cJSON_GetArraySize(j) == o.t.n_calls, "%s", b.p);
                cJSON *f = cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "function");
                CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "index")->valueint == 0);
                CHECK(cJSON_IsString(cJSON_GetObjectItem(f, "arguments")));
                CHECK(!strncmp(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "id")->valuestring, "call_", 5));
                cJSON_Delete(j);
                loom_buf_free(&b);
            }
            scan_free(&o);
        }
    /* tools off: markers are plain text */
    scan_out o;
    scan(&o, 0, 0, NULL, "<tool_call>{\"name\":\"f\"}</tool_call>", 3);
    CHECK_EQ_INT(o.t.n_calls, 0);
    CHECK_STR(str(&o.content), "<tool_call>{\"name\":\"f\"}</tool_call>");
    scan_free(&o);
    /* distinct ids */
    scan(&o, 1, 0, NULL, cases[1].text, 0);
    CHECK(o.t.n_calls == 2 && strcmp(o.t.calls[0].id, o.t.calls[1].id) != 0);
    scan_free(&o);
}

static void test_reasoning(void) {
    for (size_t piece = 0; piece <= 5; piece++) {
        scan_out o;
        scan(&o, 0, 1, NULL, "<think>\nweigh it</think>\n\nthe answer", piece);
        CHECKF(!strcmp(str(&o.reasoning), "weigh it"), "piece %zu: reasoning \"%s\"", piece, str(&o.reasoning));
        CHECKF(!strcmp(str(&o.content), "the answer"), "piece %zu: content \"%s\"", piece, str(&o.content));
        scan_free(&o);
        /* the template opened the block */
        scan(&o, 1, 1, "<|im_start|>assistant\n<think>\n", "hmm</think>\n<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>",
             piece);
        CHECK_STR(str(&o.reasoning), "hmm");
        CHECK_EQ_INT(o.t.n_calls, 1);
        CHECK_STR(str(&o.content), "");
        scan_free(&o);
        /* a prompt with a closed block starts in content */
        scan(&o, 0, 1, "<think>\n\n</think>\n\n", "just text", piece);
        CHECK_STR(str(&o.content), "just text");
        CHECK_STR(str(&o.reasoning), "");
        scan_free(&o);
    }
}

/* ---- stop strings over a real tokenizer ----------------------------------------- */

static void run_stream(const loom_tok *tok, const int32_t *ids, size_t n, const char *const *stops, int n_stops,
                       loom_buf *out, int *stopped) {
    loom_textstream *ts = NULL;
    CHECK(loom_ts_create(tok, stops, n_stops, 1, &ts) == LOOM_OK);
    if (!ts) return;
    *stopped = 0;
    for (size_t i = 0; i < n && !*stopped; i++) {
        const char *t;
        size_t len;
        CHECK(loom_ts_push(ts, ids[i], &t, &len, stopped) == LOOM_OK);
        loom_buf_put(out, t, len);
        /* no emitted text ever holds a stop string */
        for (int k = 0; k < n_stops; k++)
            if (out->p && stops[k][0]) CHECKF(!strstr(out->p, stops[k]), "stop \"%s\" leaked", stops[k]);
    }
    if (!*stopped) {
        const char *t;
        size_t len;
        CHECK(loom_ts_finish(ts, &t, &len, stopped) == LOOM_OK);
        loom_buf_put(out, t, len);
    }
    size_t all;
    const char *a = loom_ts_text(ts, &all);
    CHECKF(all == out->len && !memcmp(a, out->p ? out->p : "", all), "loom_ts_text differs");
    loom_ts_free(ts);
}

static void test_textstream(void) {
    loom_tok *tok = NULL;
    if (loom_tok_load_dir("tests/fixtures/trained/pycoder-16m", &tok) != LOOM_OK) {
        CHECKF(0, "tokenizer: %s", loom_last_error());
        return;
    }
    const char *text = "def fib(n):\n    if n < 2:\n        return n  # done\n    return fib(n - 1) + fib(n - 2)\n"
                       "print(\"h\xc3\xa9llo \xe2\x82\xac\")\n";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(loom_tok_encode(tok, text, strlen(text), 0, &ids, &n) == LOOM_OK);
    loom_buf out = {0};
    int stopped = 0;
    run_stream(tok, ids, n, NULL, 0, &out, &stopped);
    CHECK_STR(out.p ? out.p : "", text);
    CHECK(!stopped);
    loom_buf_free(&out);
    /* every substring start, a few lengths: the output is the text up to
     * the first occurrence of the stop */
    size_t L = strlen(text);
    unsigned long long rng = 0x5eed;
    for (int trial = 0; trial < 300; trial++) {
        size_t a = test_rand_u32(&rng) % L, len = 1 + test_rand_u32(&rng) % 6;
        if (a + len > L) len = L - a;
        char stop[8];
        memcpy(stop, text + a, len);
        stop[len] = 0;
        const char *stops[3] = {"never there", stop, ""};
        run_stream(tok, ids, n, stops, 3, &out, &stopped);
        size_t want = (size_t)(strstr(text, stop) - text);
        CHECKF(stopped && out.len == want && !memcmp(out.p ? out.p : "", text, want),
               "stop \"%s\": got %zu bytes, want %zu", stop, out.len, want);
        loom_buf_free(&out);
    }
    /* a stop that only completes at the very end */
    const char *tail[] = {"\")\n"};
    run_stream(tok, ids, n, tail, 1, &out, &stopped);
    CHECK(stopped && out.len == L - 3);
    loom_buf_free(&out);
    free(ids);
    loom_tok_free(tok);
}

/* ---- metrics ----------------------------------------------------------------------- */

static void test_metrics(void) {
    loom_metrics m;
    metrics_init(&m);
    metrics_count_request(&m, "chat", 200);
    metrics_count_request(&m, "chat", 400);
    metrics_count_request(&m, "completions", 418);
    metrics_count_disconnect(&m);
    metrics_add_tokens(&m, 10, 3);
    metrics_observe_ttft(&m, 0.003);
    metrics_observe_ttft(&m, 100);
    metrics_observe_itl(&m, 0.02);
    loom_engine_stats st = {.waiting = 2, .running = 1, .kv_blocks_total = 10, .kv_blocks_free = 7};
    char *t = metrics_render(&m, &st, 3);
    CHECK(t != NULL);
    if (t) {
        CHECK(strstr(t, "loom_requests_total{endpoint=\"chat\",status=\"400\"} 1\n") != NULL);
        CHECK(strstr(t, "loom_requests_total{endpoint=\"completions\",status=\"500\"} 1\n") != NULL);
        CHECK(strstr(t, "\nloom_kv_blocks_used 3\n") != NULL);
        CHECK(strstr(t, "\nloom_queue_depth 2\n") != NULL);
        CHECK(strstr(t, "\nloom_requests_in_flight 3\n") != NULL);
        CHECK(strstr(t, "loom_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n") != NULL);
        CHECK(strstr(t, "loom_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n") != NULL);
        CHECK(strstr(t, "loom_time_to_first_token_seconds_bucket{le=\"30\"} 1\n") != NULL);
        CHECK(strstr(t, "loom_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n") != NULL);
        CHECK(strstr(t, "loom_time_to_first_token_seconds_count 2\n") != NULL);
        /* every sample line is NAME[{labels}] VALUE */
        for (char *l = strtok(t, "\n"); l; l = strtok(NULL, "\n")) {
            if (l[0] == '#') continue;
            char *sp = strrchr(l, ' ');
            char *end = NULL;
            CHECKF(sp && (strtod(sp + 1, &end), *end == 0), "bad sample line: %s", l);
        }
    }
    free(t);
    metrics_free(&m);
}

/* Endpoint labels are listed in the order first added, each once; past
 * the table's room, and "other" itself, count as "other". */
static void test_metrics_labels(void) {
    static const char *names[METRICS_ENDPOINTS + 2];
    static char text[METRICS_ENDPOINTS + 2][16];
    loom_metrics m;
    metrics_init(&m);
    metrics_add_endpoint(&m, "b");
    metrics_add_endpoint(&m, "a");
    metrics_add_endpoint(&m, "b");
    metrics_count_request(&m, "other", 404);
    for (int i = 0; i < METRICS_ENDPOINTS + 2; i++) {
        snprintf(text[i], sizeof text[i], "e%d", i);
        names[i] = text[i];
        metrics_count_request(&m, names[i], 200);
    }
    loom_engine_stats st = {0};
    char *t = metrics_render(&m, &st, 0);
    CHECK(t != NULL);
    if (t) {
        const char *b = strstr(t, "{endpoint=\"b\",status=\"200\"} 0\n");
        const char *a = strstr(t, "{endpoint=\"a\",status=\"200\"} 0\n");
        CHECK(b && a && b < a);
        CHECK(strstr(b + 1, "{endpoint=\"b\"") == NULL);
        CHECK(strstr(t, "{endpoint=\"e12\",status=\"200\"} 1\n") != NULL);
        CHECK(strstr(t, "{endpoint=\"e13\"") == NULL);
        CHECK(strstr(t, "{endpoint=\"other\",status=\"200\"} 5\n") != NULL);
        CHECK(strstr(t, "{endpoint=\"other\",status=\"404\"} 1\n") != NULL);
    }
    free(t);
    metrics_free(&m);
}

static void test_not_utf8(void) {
    api_req r;
    api_error e;
    const char b[] = "{\"prompt\": \"a\xff\xfe\", \"max_tokens\": 2}";
    CHECK(api_parse(API_COMPLETION, b, sizeof b - 1, 1000, &r, &e) < 0);
    CHECK(e.status == 400 && strstr(e.message, "UTF-8") != NULL);
}

/* ---- sampling defaults ---------------------------------------------------------------- */

/* A copy of the pycoder fixture (weights linked) with the given
 * generation_config.json, or none when gen is NULL. */
static void sampling_dir(const char *dir, const char *gen) {
    static const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                  "model.safetensors"};
    mkdir(dir, 0700);
    char cwd[2048], from[4096], to[4096];
    if (!getcwd(cwd, sizeof cwd)) return;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(files); i++) {
        snprintf(from, sizeof from, "%s/tests/fixtures/trained/pycoder-16m/%s", cwd, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        CHECKF(symlink(from, to) == 0, "symlink %s", to);
    }
    if (!gen) return;
    snprintf(to, sizeof to, "%s/generation_config.json", dir);
    FILE *f = fopen(to, "w");
    if (f) {
        fputs(gen, f);
        fclose(f);
    }
}

static loom_service *sampling_service(const char *dir, const loom_sampling *flags, unsigned set) {
    loom_serve_params p = loom_serve_default_params();
    p.model_dir = dir;
    p.n_threads = 1;
    p.engine.n_ctx = 128;
    p.engine.max_seqs = 2;
    if (flags) p.sampling = *flags;
    p.sampling_set = set;
    loom_service *svc = NULL;
    CHECKF(loom_service_open(&p, &svc) == LOOM_OK, "%s: %s", dir, loom_last_error());
    return svc;
}

/* The text a completion request (fields added to a fixed prompt) gets. */
static char *complete_text(loom_service *svc, const char *fields) {
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\": \"def fib(n):\", \"max_tokens\": 16%s}", fields);
    int status = 0;
    char *resp = svc ? loom_service_complete(svc, 0, body, strlen(body), &status) : NULL;
    cJSON *j = resp ? cJSON_Parse(resp) : NULL;
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
    CHECKF(status == 200 && cJSON_IsString(t), "%s: %d %s", body, status, resp ? resp : "");
    char *out = strdup(cJSON_IsString(t) ? t->valuestring : "");
    cJSON_Delete(j);
    free(resp);
    return out;
}

/* The text a completion request with fields gets must be want. */
static void expect_text(loom_service *svc, const char *fields, const char *want, const char *what) {
    char *a = complete_text(svc, fields);
    CHECKF(!strcmp(a, want), "%s: \"%s\", want \"%s\"", what, a, want);
    free(a);
}

/* Each sampling field a request leaves out comes from the server's flag,
 * else generation_config.json, else the API default (temperature 1); the
 * request's own value wins over all. Greedy answers the same whatever the
 * seed; sampling at temperature 1 with a seed answers as any other
 * temperature-1 request with that seed. */
static void test_sampling_defaults(void) {
    char tmp[] = "/tmp/loom-test-api-XXXXXX", dir[4][256];
    if (!mkdtemp(tmp)) return;
    const char *gens[4] = {NULL, "{\"eos_token_id\": 0, \"temperature\": 0.0}",
                           "{\"do_sample\": false, \"temperature\": 0.9, \"top_k\": 1}",
                           "{\"temperature\": 1.0, \"top_k\": 1}"};
    for (int i = 0; i < 4; i++) {
        snprintf(dir[i], sizeof dir[i], "%s/m%d", tmp, i);
        sampling_dir(dir[i], gens[i]);
    }
    /* the references: the API's defaults (no generation_config sampling) */
    loom_service *plain = sampling_service(dir[0], NULL, 0);
    char *greedy = complete_text(plain, ", \"temperature\": 0");
    char *seed7 = complete_text(plain, ", \"seed\": 7");
    char *seed8 = complete_text(plain, ", \"seed\": 8");
    CHECKF(strcmp(greedy, seed7) && strcmp(seed7, seed8),
           "temperature 1 should not answer greedily here: \"%s\" \"%s\" \"%s\"", greedy, seed7, seed8);
    loom_service_close(plain);

    /* generation_config temperature 0: greedy unless the request asks */
    loom_service *g0 = sampling_service(dir[1], NULL, 0);
    expect_text(g0, ", \"seed\": 7", greedy, "generation_config temperature 0, seed 7");
    expect_text(g0, ", \"seed\": 8", greedy, "generation_config temperature 0, seed 8");
    expect_text(g0, ", \"seed\": 7, \"temperature\": 1", seed7, "the request's temperature");
    loom_service_close(g0);

    /* a server flag wins over generation_config.json */
    loom_sampling flags = loom_sampling_default();
    flags.temperature = 1;
    loom_service *g0f = sampling_service(dir[1], &flags, LOOM_SAMPLING_TEMPERATURE);
    expect_text(g0f, ", \"seed\": 7", seed7, "the --temperature flag");
    loom_service_close(g0f);

    /* do_sample false: greedy; a request's temperature samples without the
     * file's top_k */
    loom_service *ds = sampling_service(dir[2], NULL, 0);
    expect_text(ds, ", \"seed\": 7", greedy, "do_sample false");
    expect_text(ds, ", \"seed\": 7, \"temperature\": 1", seed7, "do_sample false, temperature 1 asked");
    loom_service_close(ds);

    /* top_k 1 from the file is greedy at any temperature; the request's
     * top_k and a flag's each override it */
    loom_service *k1 = sampling_service(dir[3], NULL, 0);
    expect_text(k1, ", \"seed\": 7", greedy, "generation_config top_k 1");
    expect_text(k1, ", \"seed\": 7, \"top_k\": 0", seed7, "the request's top_k 0");
    loom_service_close(k1);
    flags.top_k = 0;
    k1 = sampling_service(dir[3], &flags, LOOM_SAMPLING_TOP_K);
    expect_text(k1, ", \"seed\": 7", seed7, "the --top-k 0 flag");
    loom_service_close(k1);

    free(greedy);
    free(seed7);
    free(seed8);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
}

/* ---- /v1/embeddings ---------------------------------------------------------- */

#define EMB_DIR "tests/fixtures/models/qwen3-tiny"

static char *embed_post(loom_service *svc, const char *body, int *status) {
    *status = 0;
    return svc ? loom_service_request(svc, "/v1/embeddings", body, strlen(body), status) : NULL;
}

static void embed_rejects(loom_service *svc, const char *body, int status, const char *param,
                          const char *says) {
    int got;
    char *resp = embed_post(svc, body, &got);
    cJSON *j = resp ? cJSON_Parse(resp) : NULL;
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    const cJSON *p = cJSON_GetObjectItem(e, "param"), *m = cJSON_GetObjectItem(e, "message");
    const char *pv = cJSON_IsString(p) ? p->valuestring : "";
    CHECKF(got == status && !strcmp(pv, param) && cJSON_IsString(m), "%s: %d %s (want %d, param %s)", body, got,
           resp ? resp : "", status, param);
    if (says && cJSON_IsString(m)) CHECKF(strstr(m->valuestring, says) != NULL, "%s: \"%s\"", body, m->valuestring);
    cJSON_Delete(j);
    free(resp);
}

static int b64_value(char c) {
    const char *tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *at = c ? strchr(tab, c) : NULL;
    return at ? (int)(at - tab) : -1;
}

/* Little-endian float32 values of base64 text into out; returns how many. */
static int b64_floats(const char *s, float *out, int cap) {
    unsigned char bytes[4096];
    size_t n = 0, len = strlen(s);
    for (size_t i = 0; i + 4 <= len && n + 3 <= sizeof bytes; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) v[k] = s[i + k] == '=' ? 0 : b64_value(s[i + k]);
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) return -1;
        unsigned x = (unsigned)(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
        bytes[n++] = (unsigned char)(x >> 16);
        if (s[i + 2] != '=') bytes[n++] = (unsigned char)(x >> 8);
        if (s[i + 3] != '=') bytes[n++] = (unsigned char)x;
    }
    int m = 0;
    for (; m < cap && (size_t)(m + 1) * 4 <= n; m++) {
        uint32_t u = 0;
        for (int k = 0; k < 4; k++) u |= (uint32_t)bytes[m * 4 + k] << (8 * k);
        memcpy(&out[m], &u, 4);
    }
    return m;
}

/* The vectors of a response into out ([n, dim]); returns how many came. */
static int embed_vectors(const char *resp, float *out, int n, int dim, int *prompt_tokens) {
    cJSON *j = resp ? cJSON_Parse(resp) : NULL;
    const cJSON *data = cJSON_GetObjectItem(j, "data");
    int got = 0;
    for (const cJSON *d = data ? data->child : NULL; d && got < n; d = d->next, got++) {
        const cJSON *e = cJSON_GetObjectItem(d, "embedding"), *ix = cJSON_GetObjectItem(d, "index");
        CHECKF(cJSON_IsNumber(ix) && ix->valueint == got, "index %d", got);
        if (cJSON_IsString(e)) {
            CHECK_EQ_INT(b64_floats(e->valuestring, out + (size_t)got * dim, dim), dim);
        } else {
            CHECK_EQ_INT(cJSON_GetArraySize(e), dim);
            int k = 0;
            for (const cJSON *x = e ? e->child : NULL; x && k < dim; x = x->next, k++)
                out[(size_t)got * dim + k] = (float)x->valuedouble;
        }
    }
    const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens");
    if (prompt_tokens) *prompt_tokens = cJSON_IsNumber(u) ? u->valueint : -1;
    CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "object")) &&
          !strcmp(cJSON_GetObjectItem(j, "object")->valuestring, "list"));
    cJSON_Delete(j);
    return got;
}

/* The service (batch mode's way in) on the transformers fixture, which has
 * no tokenizer: token-id inputs give its last-token vectors, in float and
 * base64; dimensions cuts and normalises again; malformed requests get 400
 * naming the field. */
static void test_embeddings(void) {
    loom_safetensors *ref = NULL;
    CHECKF(loom_st_open(EMB_DIR "/embeddings.safetensors", &ref) == LOOM_OK, "%s", loom_last_error());
    loom_serve_params p = loom_serve_default_params();
    p.model_dir = EMB_DIR;
    p.n_threads = 1;
    p.engine.n_ctx = 32;
    p.engine.max_seqs = 4;
    p.tokenizer_optional = 1;
    loom_service *svc = NULL;
    CHECKF(loom_service_open(&p, &svc) == LOOM_OK, "%s", loom_last_error());
    CHECK(loom_service_has_route("/v1/embeddings"));
    char paths[256];
    loom_service_paths(paths, sizeof paths);
    CHECKF(strstr(paths, "/v1/embeddings") != NULL, "%s", paths);
    enum { H = 64, N = 3 }; /* the fixture's hidden size; prompts 0..2 fit the context of 32 */
    loom_buf b = {0};
    int want_tokens = 0;
    loom_buf_puts(&b, "{\"model\":\"any\",\"input\":[");
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *t = ref ? loom_st_find(ref, name) : NULL;
        int n = t ? (int)t->shape[0] : 0;
        loom_buf_puts(&b, i ? ",[" : "[");
        for (int k = 0; k < n; k++) loom_buf_printf(&b, "%s%d", k ? "," : "", ((const int32_t *)t->data)[k]);
        loom_buf_puts(&b, "]");
        want_tokens += n;
    }
    loom_buf_puts(&b, "]");
    static const char *formats[] = {"}", ",\"encoding_format\":\"base64\"}"};
    for (int f = 0; f < 2; f++) {
        size_t at = b.len;
        loom_buf_puts(&b, formats[f]);
        int status, tokens = 0;
        char *resp = embed_post(svc, b.p, &status);
        CHECKF(status == 200, "%d %s", status, resp ? resp : "");
        float v[N * H];
        CHECK_EQ_INT(embed_vectors(resp, v, N, H, &tokens), N);
        CHECK_EQ_INT(tokens, want_tokens);
        for (int i = 0; i < N; i++) {
            char name[32];
            snprintf(name, sizeof name, "prompt.%d.last_norm", i);
            const loom_st_tensor *t = ref ? loom_st_find(ref, name) : NULL;
            double e = t ? test_rel_err(v + i * H, t->data, H) : INFINITY;
            CHECKF(e < 1e-5, "%s prompt %d: off by %g", formats[f], i, e);
        }
        free(resp);
        b.len = at;
    }
    /* dimensions 8 of the longest: its head, normalised again */
    const loom_st_tensor *t2 = ref ? loom_st_find(ref, "prompt.2.last_norm") : NULL;
    loom_buf_puts(&b, ",\"dimensions\":8}");
    int status;
    char *resp = embed_post(svc, b.p, &status);
    float v[N * 8];
    CHECK_EQ_INT(embed_vectors(resp, v, N, 8, NULL), N);
    double ss = 0;
    for (int k = 0; t2 && k < 8; k++) ss += (double)((const float *)t2->data)[k] * ((const float *)t2->data)[k];
    for (int k = 0; t2 && k < 8; k++)
        CHECKF(fabs(v[2 * 8 + k] - ((const float *)t2->data)[k] / sqrt(ss)) < 1e-5, "dimensions 8: [%d] %g", k,
               v[2 * 8 + k]);
    free(resp);
    loom_buf_free(&b);

    embed_rejects(svc, "{\"input\":", 400, "", "not valid JSON");
    embed_rejects(svc, "[1]", 400, "", "JSON object");
    embed_rejects(svc, "{}", 400, "input", "required");
    embed_rejects(svc, "{\"input\":\"\"}", 400, "input", "empty string");
    embed_rejects(svc, "{\"input\":\"hello\"}", 400, "input", "no tokenizer");
    embed_rejects(svc, "{\"input\":[]}", 400, "input", "empty list");
    embed_rejects(svc, "{\"input\":[[]]}", 400, "input", "'input[0]' is an empty list of token ids");
    embed_rejects(svc, "{\"input\":[[1],[]]}", 400, "input", "'input[1]' is an empty");
    embed_rejects(svc, "{\"input\":[1.5]}", 400, "input", "'input'[0] must be a token id in [0, 512)");
    embed_rejects(svc, "{\"input\":[3,-1]}", 400, "input", "'input'[1]");
    embed_rejects(svc, "{\"input\":[512]}", 400, "input", "[0, 512)");
    embed_rejects(svc, "{\"input\":[[1],\"a\"]}", 400, "input", "'input[1]' must be a list of token ids");
    embed_rejects(svc, "{\"input\":[\"a\",[1]]}", 400, "input", "'input[1]' must be a string");
    embed_rejects(svc, "{\"input\":[null]}", 400, "input", NULL);
    embed_rejects(svc, "{\"input\":{}}", 400, "input", "must be a string, a list of strings");
    embed_rejects(svc, "{\"input\":7}", 400, "input", NULL);
    embed_rejects(svc, "{\"input\":[1],\"model\":5}", 400, "model", NULL);
    embed_rejects(svc, "{\"input\":[1],\"dimensions\":0}", 400, "dimensions", "positive integer");
    embed_rejects(svc, "{\"input\":[1],\"dimensions\":2.5}", 400, "dimensions", NULL);
    embed_rejects(svc, "{\"input\":[1],\"dimensions\":\"8\"}", 400, "dimensions", NULL);
    embed_rejects(svc, "{\"input\":[1],\"dimensions\":65}", 400, "dimensions", "is 65; this model's embeddings have 64");
    embed_rejects(svc, "{\"input\":[1],\"encoding_format\":\"int8\"}", 400, "encoding_format", NULL);
    embed_rejects(svc, "{\"input\":[1],\"user\":3}", 400, "user", NULL);
    /* longer than the context: both numbers, and which input */
    loom_buf l = {0};
    loom_buf_puts(&l, "{\"input\":[[1],[");
    for (int k = 0; k < 33; k++) loom_buf_printf(&l, "%s%d", k ? "," : "", k);
    loom_buf_puts(&l, "]]}");
    embed_rejects(svc, l.p, 400, "input", "'input[1]': the input has 33 tokens; the context holds 32");
    loom_buf_free(&l);
    /* a full context is taken, user is ignored */
    loom_buf_puts(&l, "{\"user\":\"u\",\"input\":[");
    for (int k = 0; k < 32; k++) loom_buf_printf(&l, "%s%d", k ? "," : "", k);
    loom_buf_puts(&l, "]}");
    resp = embed_post(svc, l.p, &status);
    CHECKF(status == 200, "a full context: %d %s", status, resp ? resp : "");
    free(resp);
    loom_buf_free(&l);
    loom_service_close(svc);
    loom_st_close(ref);
}

int main(void) {
    test_embeddings();
    test_sampling_defaults();
    test_not_utf8();
    test_parse_errors();
    test_parse_ok();
    test_parse_nul();
    test_parse_trailing();
    test_parse_tool_choice();
    test_parse_schemas();
    test_parse_max_tokens_zero();
    test_json_str();
    test_toolcalls();
    test_reasoning();
    test_textstream();
    test_metrics();
    test_metrics_labels();
    return test_report("test_api");
}
