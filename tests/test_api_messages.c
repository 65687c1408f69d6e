/* The Anthropic Messages and OpenAI Responses request shapes
 * (api_messages.c, api_responses.c): malformed bodies answer 400 naming
 * the field as the client sent it, good ones translate into the chat
 * request (messages, tools, tool_choice, stops, response_format); errors
 * in Anthropic's shape; the answer formatters (fmt_messages.c,
 * fmt_responses.c) over a tool-call scanner fed text, blocking and
 * streamed; the stop string a text stream stopped at. */
#include <cjson/cJSON.h>

#include "base/base.h"
#include "serve/api_messages.h"
#include "serve/job.h"
#include "stream/textstream.h"
#include "test.h"

/* ---- Messages requests ----------------------------------------------------- */

static int msg_parse(const char *body, int count, api_req *r, api_error *e) {
    cJSON *client = NULL;
    int rc = api_messages_parse(body, strlen(body), 1000, count, r, &client, e);
    cJSON_Delete(client);
    return rc;
}

static void msg_rejects(const char *body, const char *param, const char *needle) {
    api_req r;
    api_error e;
    int rc = msg_parse(body, 0, &r, &e);
    CHECKF(rc < 0, "accepted: %s", body);
    if (rc == 0) {
        api_req_free(&r);
        return;
    }
    CHECKF(e.status == 400, "%s: status %d", body, e.status);
    CHECKF(!strcmp(e.param, param), "%s: param \"%s\", want \"%s\" (%s)", body, e.param, param, e.message);
    CHECKF(strstr(e.message, param) != NULL, "%s: the message \"%s\" does not name %s", body, e.message, param);
    if (needle) CHECKF(strstr(e.message, needle) != NULL, "%s: \"%s\" lacks \"%s\"", body, e.message, needle);
    CHECK(e.dialect == API_DIALECT_ANTHROPIC);
    char *j = api_error_json(&e);
    cJSON *p = j ? cJSON_Parse(j) : NULL;
    const cJSON *err = cJSON_GetObjectItem(p, "error");
    CHECKF(p && !strcmp(cJSON_GetObjectItem(p, "type")->valuestring, "error") &&
               !strcmp(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error") &&
               cJSON_IsString(cJSON_GetObjectItem(err, "message")),
           "Anthropic error shape: %s", j ? j : "(null)");
    cJSON_Delete(p);
    free(j);
}

static void test_messages_errors(void) {
    const char *U = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[1024];
    msg_rejects("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens", "required");
    static const struct { const char *extra, *param, *needle; } bad[] = {
        {"\"max_tokens\":\"ten\"", "max_tokens", "integer"},
        {"\"max_tokens\":0", "max_tokens", NULL},
        {"\"max_tokens\":4,\"temperature\":1.5", "temperature", "between 0 and 1"},
        {"\"max_tokens\":4,\"temperature\":\"hot\"", "temperature", NULL},
        {"\"max_tokens\":4,\"top_p\":2", "top_p", NULL},
        {"\"max_tokens\":4,\"top_k\":\"k\"", "top_k", NULL},
        {"\"max_tokens\":4,\"stream\":\"yes\"", "stream", NULL},
        {"\"max_tokens\":4,\"stop_sequences\":\"x\"", "stop_sequences", NULL},
        {"\"max_tokens\":4,\"stop_sequences\":[\"a\",3]", "stop_sequences", "strings"},
        {"\"max_tokens\":4,\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
         "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]", "stop_sequences", "16"},
        {"\"max_tokens\":4,\"system\":5", "system", NULL},
        {"\"max_tokens\":4,\"system\":[{\"type\":\"image\"}]", "system[0]", "images are not supported here"},
        {"\"max_tokens\":4,\"metadata\":\"u\"", "metadata", NULL},
        {"\"max_tokens\":4,\"thinking\":{\"type\":\"maybe\"}", "thinking", NULL},
        {"\"max_tokens\":4,\"tools\":{}", "tools", NULL},
        {"\"max_tokens\":4,\"tools\":[{\"input_schema\":{}}]", "tools[0].name", NULL},
        {"\"max_tokens\":4,\"tools\":[{\"name\":\"f\"}]", "tools[0].input_schema", NULL},
        {"\"max_tokens\":4,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}]", "tools[0]", "bash_20250124"},
        {"\"max_tokens\":4,\"tool_choice\":\"auto\"", "tool_choice", NULL},
        {"\"max_tokens\":4,\"tool_choice\":{\"type\":\"any\"}", "tool_choice", "needs 'tools'"},
        {"\"max_tokens\":4,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\"}",
         "tool_choice.name", NULL},
        {"\"max_tokens\":4,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"maybe\"}",
         "tool_choice.type", "maybe"},
        {"\"max_tokens\":4,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
         "\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}", "tool_choice", "'g'"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(bad); i++) {
        snprintf(b, sizeof b, "{%s,%s}", U, bad[i].extra);
        msg_rejects(b, bad[i].param, bad[i].needle);
    }
    static const struct { const char *messages, *param, *needle; } badm[] = {
        {"{}", "messages", NULL},
        {"[]", "messages", "non-empty"},
        {"[5]", "messages[0]", "object"},
        {"[{\"role\":\"system\",\"content\":\"x\"}]", "messages[0].role", "system"},
        {"[{\"role\":\"user\"}]", "messages[0].content", "required"},
        {"[{\"role\":\"user\",\"content\":7}]", "messages[0].content", NULL},
        {"[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]", "messages[0].content[0]", "type"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]", "messages[0].content[0]", "text"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"hologram\"}]}]", "messages[0].content[0]", "hologram"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]", "messages[0].content[0]",
         "source"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"data\":\"AA==\"}}]}]",
         "messages[0].content[0]", "media_type"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]", "messages[0].content[0]", "documents"},
        {"[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"image\","
         "\"source\":{\"type\":\"url\",\"url\":\"u\"}}]}]", "messages[1].content[0]", "image"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}]}]",
         "messages[0].content[0]", "tool_use"},
        {"[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"name\":\"f\"}]}]", "messages[1].content[0]", "id"},
        {"[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"t\",\"name\":\"f\",\"input\":[1]}]}]", "messages[1].content[0]", "input"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":\"x\"}]}]",
         "messages[0].content[0].tool_use_id", NULL},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":5}]}]",
         "messages[0].content[0].content", NULL},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":"
         "[{\"type\":\"image\"}]}]}]", "messages[0].content[0].content[0]", "images are not supported here"},
        {"[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}]}]",
         "messages[0].content[0]", "tool_result"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(badm); i++) {
        snprintf(b, sizeof b, "{\"max_tokens\":4,\"messages\":%s}", badm[i].messages);
        msg_rejects(b, badm[i].param, badm[i].needle);
    }
    /* the body checks every request gets */
    api_req r;
    api_error e;
    CHECK(msg_parse("{\"max_tokens\":", 0, &r, &e) < 0 && strstr(e.message, "not valid JSON"));
    CHECK(msg_parse("[1]", 0, &r, &e) < 0 && e.status == 400 && e.dialect == API_DIALECT_ANTHROPIC);
}

/* The translated request's messages as JSON, for comparison. */
static char *messages_of(const api_req *r) {
    cJSON *m = cJSON_Parse(r->messages_json);
    char *t = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    return t;
}

static void test_messages_translate(void) {
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,"
        "\"stop_sequences\":[\"END\",\"##\"],\"metadata\":{\"user_id\":\"u\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"be brief\"},{\"type\":\"text\",\"text\":\"in Python\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"Let me look.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":\"and tomorrow?\"}]}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":100}}";
    api_req r;
    api_error e;
    if (msg_parse(body, 0, &r, &e) < 0) {
        CHECKF(0, "rejected: %s (%s)", e.message, e.param);
        return;
    }
    CHECK(r.kind == API_CHAT);
    CHECK_STR(r.model, "m");
    CHECK_EQ_INT(r.max_tokens, 7);
    CHECK(fabsf(r.sampling.temperature - 0.5f) < 1e-6f && fabsf(r.sampling.top_p - 0.9f) < 1e-6f);
    CHECK_EQ_INT(r.sampling.top_k, 3);
    CHECK_EQ_INT(r.n_stops, 2);
    CHECK(r.n_stops == 2 && !strcmp(r.stops[0], "END") && !strcmp(r.stops[1], "##"));
    CHECK_STR(r.tool_choice, "required");
    char *m = messages_of(&r);
    CHECK_STR(m, "[{\"role\":\"system\",\"content\":\"be brief\\nin Python\"},"
                 "{\"role\":\"user\",\"content\":\"weather?\"},"
                 "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"reasoning_content\":\"hm\","
                 "\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                 "\"arguments\":{\"city\":\"Paris\"}}}]},"
                 "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_call_id\":\"toolu_1\"},"
                 "{\"role\":\"user\",\"content\":\"and tomorrow?\"}]");
    free(m);
    CHECK_STR(r.tools_json, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","
                            "\"parameters\":{\"type\":\"object\"}}}]");
    CHECK(r.kwargs_json && !strcmp(r.kwargs_json, "{\"enable_thinking\":true}"));
    api_req_free(&r);

    /* tool_choice: a named tool; none keeps the tools for the template (the
       job bans the token that opens a call) */
    const char *T = "\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]";
    char b[512];
    snprintf(b, sizeof b, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,"
                          "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}}", T);
    CHECK(msg_parse(b, 0, &r, &e) == 0 && !strcmp(r.tool_choice, "f") && r.tools_json);
    api_req_free(&r);
    snprintf(b, sizeof b, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,"
                          "\"tool_choice\":{\"type\":\"none\"}}", T);
    CHECK(msg_parse(b, 0, &r, &e) == 0 && !strcmp(r.tool_choice, "none") && r.tools_json);
    api_req_free(&r);
    /* count_tokens: no max_tokens asked for; a user turn of tool results alone */
    const char *c = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}]}]}";
    CHECK(msg_parse(c, 1, &r, &e) == 0);
    m = messages_of(&r);
    CHECK_STR(m, "[{\"role\":\"tool\",\"content\":\"\",\"tool_call_id\":\"t\"}]");
    free(m);
    api_req_free(&r);
    CHECK(msg_parse(c, 0, &r, &e) < 0 && !strcmp(e.param, "max_tokens"));
}

/* Image blocks become the chat request's image_url parts in their place
 * among the text, naming themselves as the client sent them. */
static void test_messages_images(void) {
    const char *body =
        "{\"max_tokens\":4,\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":["
        "{\"type\":\"text\",\"text\":\"look\"},"
        "{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"QUJD\"}},"
        "{\"type\":\"text\",\"text\":\"and\"},{\"type\":\"text\",\"text\":\"this\"},"
        "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"file:///x.png\"}}]}]}";
    api_req r;
    api_error e;
    if (msg_parse(body, 0, &r, &e) < 0) {
        CHECKF(0, "rejected: %s (%s)", e.message, e.param);
        return;
    }
    CHECK_EQ_INT(r.n_images, 2);
    if (r.n_images == 2) {
        CHECK_STR(r.image_urls[0], "data:image/png;base64,QUJD");
        CHECK_STR(r.image_urls[1], "file:///x.png");
        CHECK_STR(r.image_params[0], "messages[0].content[1]");
        CHECK_STR(r.image_params[1], "messages[0].content[4]");
    }
    char *m = messages_of(&r);
    CHECK_STR(m, "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":["
                 "{\"type\":\"text\",\"text\":\"look\"},{\"type\":\"image\"},"
                 "{\"type\":\"text\",\"text\":\"and\\nthis\"},{\"type\":\"image\"}]}]");
    free(m);
    api_req_free(&r);
}

static void test_anthropic_error_types(void) {
    static const struct { int status; const char *type; } t[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
        {413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(t); i++) {
        api_error e = {0};
        api_fail(&e, t[i].status, NULL, "m \"%d\"", t[i].status);
        e.dialect = API_DIALECT_ANTHROPIC;
        char *j = api_error_json(&e), want[128];
        snprintf(want, sizeof want, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"m \\\"%d\\\"\"}}",
                 t[i].type, t[i].status);
        CHECK_STR(j ? j : "", want);
        free(j);
    }
}

/* ---- Responses requests --------------------------------------------------------- */

static int resp_parse(const char *body, const char *history, api_req *r, api_error *e) {
    cJSON *in = api_parse_object(body, strlen(body), e), *h = history ? cJSON_Parse(history) : NULL;
    int rc = in ? api_responses_parse(in, h, 1000, r, e) : -1;
    cJSON_Delete(in);
    cJSON_Delete(h);
    return rc;
}

static void resp_rejects(const char *body, const char *param, const char *needle) {
    api_req r;
    api_error e;
    int rc = resp_parse(body, NULL, &r, &e);
    CHECKF(rc < 0, "accepted: %s", body);
    if (rc == 0) {
        api_req_free(&r);
        return;
    }
    CHECKF(e.status == 400 && !strcmp(e.param, param), "%s: %d param \"%s\", want \"%s\" (%s)", body, e.status,
           e.param, param, e.message);
    if (needle) CHECKF(strstr(e.message, needle) != NULL, "%s: \"%s\" lacks \"%s\"", body, e.message, needle);
    CHECK(e.dialect == API_DIALECT_OPENAI);
}

static void test_responses_errors(void) {
    static const struct { const char *body, *param, *needle; } bad[] = {
        {"{}", "input", "required"},
        {"{\"input\":5}", "input", NULL},
        {"{\"input\":[]}", "input", NULL},
        {"{\"input\":[3]}", "input[0]", NULL},
        {"{\"input\":[{\"type\":\"wizardry\"}]}", "input[0].type", "wizardry"},
        {"{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0].role", NULL},
        {"{\"input\":[{\"role\":\"user\"}]}", "input[0].content", "required"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"file_id\":\"f\"}]}]}",
         "input[0].content[0]", "file_id"},
        {"{\"input\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
         "input[0].content[0]", "images are not supported here"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}", "input[0].content[0]", "text"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}", "input[0].content[0]", "audio"},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", "input[0]", "call_id"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{no\"}]}",
         "input[0].arguments", NULL},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[0].output", NULL},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", NULL},
        {"{\"input\":\"x\",\"max_output_tokens\":\"many\"}", "max_output_tokens", NULL},
        {"{\"input\":\"x\",\"instructions\":5}", "instructions", NULL},
        {"{\"input\":\"x\",\"store\":\"yes\"}", "store", NULL},
        {"{\"input\":\"x\",\"temperature\":3}", "temperature", NULL},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type", NULL},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name", NULL},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":\"x\"}}",
         "tool_choice", NULL},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"sometimes\"}",
         "tool_choice", NULL},
        {"{\"input\":\"x\",\"text\":{\"format\":{}}}", "text.format.type", NULL},
        {"{\"input\":\"x\",\"reasoning\":{\"effort\":3}}", "reasoning", NULL},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "response_format", NULL},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(bad); i++) resp_rejects(bad[i].body, bad[i].param, bad[i].needle);
}

/* input_image parts of a user message become image_url parts in order. */
static void test_responses_images(void) {
    const char *body =
        "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
        "\"data:image/jpeg;base64,QUJD\",\"detail\":\"auto\"},{\"type\":\"input_text\",\"text\":\"what?\"}]}]}";
    api_req r;
    api_error e;
    if (resp_parse(body, NULL, &r, &e) < 0) {
        CHECKF(0, "rejected: %s (%s)", e.message, e.param);
        return;
    }
    CHECK_EQ_INT(r.n_images, 1);
    if (r.n_images == 1) {
        CHECK_STR(r.image_urls[0], "data:image/jpeg;base64,QUJD");
        CHECK_STR(r.image_params[0], "input[0].content[0]");
    }
    char *m = messages_of(&r);
    CHECK_STR(m, "[{\"role\":\"user\",\"content\":[{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"what?\"}]}]");
    free(m);
    api_req_free(&r);
}

static void test_responses_translate(void) {
    api_req r;
    api_error e;
    const char *body =
        "{\"instructions\":\"be brief\",\"max_output_tokens\":9,\"top_p\":0.5,"
        "\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
        "{\"type\":\"input_text\",\"text\":\"b\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"one\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":\"two\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}},"
        "{\"type\":\"function\",\"name\":\"g\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"},"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":{\"type\":\"object\"}}}}";
    const char *history = "[{\"role\":\"user\",\"content\":\"before\"},{\"role\":\"assistant\",\"content\":\"ok\"}]";
    if (resp_parse(body, history, &r, &e) < 0) {
        CHECKF(0, "rejected: %s (%s)", e.message, e.param);
        return;
    }
    CHECK_EQ_INT(r.max_tokens, 9);
    CHECK(fabsf(r.sampling.top_p - 0.5f) < 1e-6f);
    CHECK_STR(r.tool_choice, "g");
    CHECK(r.grammar == API_GRAMMAR_JSON_SCHEMA && r.grammar_src && strstr(r.grammar_src, "\"object\""));
    char *m = messages_of(&r);
    /* instructions first, then the earlier conversation, then the input;
     * consecutive calls are one assistant turn */
    CHECK_STR(m, "[{\"role\":\"system\",\"content\":\"be brief\"},"
                 "{\"role\":\"user\",\"content\":\"before\"},{\"role\":\"assistant\",\"content\":\"ok\"},"
                 "{\"role\":\"user\",\"content\":\"a\\nb\"},"
                 "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
                 "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}},"
                 "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":{}}}]},"
                 "{\"role\":\"tool\",\"content\":\"one\",\"tool_call_id\":\"c1\"},"
                 "{\"role\":\"tool\",\"content\":\"two\",\"tool_call_id\":\"c2\"}]");
    free(m);
    CHECK_STR(r.tools_json, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}},"
                            "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]");
    api_req_free(&r);
    /* a string is one user turn; what a stored response keeps of its input */
    CHECK(resp_parse("{\"input\":\"hi\",\"previous_response_id\":\"resp_1\"}", NULL, &r, &e) == 0);
    m = messages_of(&r);
    CHECK_STR(m, "[{\"role\":\"user\",\"content\":\"hi\"}]");
    CHECK(r.previous_response_id && !strcmp(r.previous_response_id, "resp_1"));
    CHECK(r.kwargs_json == NULL);
    free(m);
    api_req_free(&r);
    CHECK(resp_parse("{\"input\":\"hi\",\"reasoning\":{\"effort\":\"low\"}}", NULL, &r, &e) == 0);
    CHECK(r.kwargs_json && !strcmp(r.kwargs_json, "{\"reasoning_effort\":\"low\"}"));
    api_req_free(&r);
    cJSON *in = cJSON_Parse("{\"input\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"u\"}]}");
    cJSON *out = cJSON_CreateArray();
    CHECK(api_responses_input(in, out, &e) == 0 && cJSON_GetArraySize(out) == 2);
    cJSON_Delete(in);
    cJSON_Delete(out);
}

/* ---- the formatters -------------------------------------------------------------- */

typedef struct fake {
    server s;
    job j;
} fake;

static struct resp_store *fake_store; /* the fakes' server keeps responses here */

/* A finished job of endpoint ep whose one choice generated text (tools on,
 * reasoning split, Hermes syntax), fed in pieces; finish as the job sets it. */
static void fake_job(fake *f, const api_endpoint *ep, const char *id, const char *body, const char *text,
                     const char *finish) {
    memset(f, 0, sizeof *f);
    snprintf(f->s.model_id, sizeof f->s.model_id, "m");
    f->s.responses = fake_store;
    f->s.vocab = 1000;
    f->j.srv = &f->s;
    f->j.ep = ep;
    f->j.n = 1;
    f->j.n_prompt = 10;
    f->j.fd = -1;
    snprintf(f->j.id, sizeof f->j.id, "%s", id);
    api_error e;
    if (ep->parse != fmt_responses.parse || ep->parse(&f->j, body, strlen(body), &e) < 0) {
        f->j.client = cJSON_Parse(body);
        f->j.req.body = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    }
    f->j.req.stream = 1;
    choice *c = &f->j.ch[0];
    c->n_cached = 4;
    c->n_ids = 6;
    c->finish = finish;
    CHECK(loom_ts_create(NULL, NULL, 0, 1, &c->ts) == LOOM_OK);
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]";
    loom_toolscan_init(&c->scan, 1, 1, "");
    loom_toolscan_set_syntax(&c->scan, LOOM_TC_QWEN, tools, "");
    ep->sse_open(&f->j);
    size_t n = strlen(text);
    for (size_t at = 0; at < n; at += 5) {
        emitted em = {0};
        loom_toolscan_feed(&c->scan, text + at, LOOM_MIN((size_t)5, n - at), 0, &em.content, &em.reasoning);
        ep->sse_delta(&f->j, 0, &em, NULL);
        ep->sse_extra(&f->j, 0);
        loom_buf_free(&em.content);
        loom_buf_free(&em.reasoning);
    }
    emitted em = {0};
    loom_toolscan_feed(&c->scan, "", 0, 1, &em.content, &em.reasoning);
    ep->sse_delta(&f->j, 0, &em, NULL);
    ep->sse_extra(&f->j, 0);
    loom_buf_free(&em.content);
    loom_buf_free(&em.reasoning);
    if (c->scan.n_calls) c->finish = "tool_calls";
    ep->sse_finish(&f->j);
}

static void fake_free(fake *f) {
    loom_ts_free(f->j.ch[0].ts);
    loom_toolscan_free(&f->j.ch[0].scan);
    loom_buf_free(&f->j.out);
    cJSON_Delete(f->j.client);
    api_req_free(&f->j.req);
}

/* The stream's events as a JSON array of {"event", "data"}. */
static cJSON *events_of(const loom_buf *out) {
    cJSON *arr = cJSON_CreateArray();
    const char *p = out->p ? out->p : "";
    while (*p) {
        const char *ev = strstr(p, "event: "), *data = strstr(p, "\ndata: "), *end = strstr(p, "\n\n");
        if (!ev || !data || !end || data > end) break;
        cJSON *o = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(data - ev - 7), ev + 7);
        cJSON_AddStringToObject(o, "event", name);
        char *d = strndup(data + 7, (size_t)(end - data - 7));
        cJSON *dj = cJSON_Parse(d);
        CHECKF(dj != NULL, "event %s: data is not JSON: %s", name, d);
        free(d);
        cJSON_AddItemToObject(o, "data", dj ? dj : cJSON_CreateNull());
        cJSON_AddItemToArray(arr, o);
        p = end + 2;
    }
    return arr;
}

static const char *ev_name(const cJSON *e) { return cJSON_GetObjectItem(e, "event")->valuestring; }
static const cJSON *ev_data(const cJSON *e, const char *k) { return cJSON_GetObjectItem(cJSON_GetObjectItem(e, "data"), k); }

static void test_fmt_messages(void) {
    fake f;
    const char *gen = "<think>hm, weather</think>Let me look.<tool_call>\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    fake_job(&f, &fmt_messages, "msg_7", "{}", gen, "stop");
    /* the stream: message_start, thinking, text, tool_use blocks, the end */
    cJSON *evs = events_of(&f.j.out);
    const char *want[] = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                          "content_block_start", "content_block_delta", "content_block_stop",
                          "content_block_start", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"};
    /* deltas may be several per block: fold runs of them */
    loom_buf seq = {0}, wantb = {0};
    const char *last = "";
    for (const cJSON *e = evs->child; e; e = e->next) {
        CHECK_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "data"), "type")->valuestring, ev_name(e));
        if (!strcmp(ev_name(e), "content_block_delta") && !strcmp(last, "content_block_delta")) continue;
        loom_buf_printf(&seq, "%s ", last = ev_name(e));
    }
    for (size_t i = 0; i < LOOM_ARRAY_LEN(want); i++) loom_buf_printf(&wantb, "%s ", want[i]);
    CHECK_STR(seq.p ? seq.p : "", wantb.p);
    loom_buf_free(&seq);
    loom_buf_free(&wantb);
    loom_buf thinking = {0}, text = {0}, json = {0};
    for (const cJSON *e = evs->child; e; e = e->next) {
        if (strcmp(ev_name(e), "content_block_delta")) continue;
        const cJSON *d = ev_data(e, "delta");
        const char *t = cJSON_GetObjectItem(d, "type")->valuestring;
        int index = ev_data(e, "index")->valueint;
        if (!strcmp(t, "thinking_delta")) {
            loom_buf_puts(&thinking, cJSON_GetObjectItem(d, "thinking")->valuestring);
            CHECK(index == 0);
        } else if (!strcmp(t, "text_delta")) {
            loom_buf_puts(&text, cJSON_GetObjectItem(d, "text")->valuestring);
            CHECK(index == 1);
        } else {
            loom_buf_puts(&json, cJSON_GetObjectItem(d, "partial_json")->valuestring);
            CHECK(index == 2 && !strcmp(t, "input_json_delta"));
        }
    }
    CHECK_STR(thinking.p ? thinking.p : "", "hm, weather");
    CHECK_STR(text.p ? text.p : "", "Let me look.");
    CHECK_STR(json.p ? json.p : "", "{\"city\":\"Paris\"}");
    loom_buf_free(&thinking);
    loom_buf_free(&text);
    loom_buf_free(&json);
    const cJSON *blk = NULL;
    for (const cJSON *e = evs->child; e; e = e->next)
        if (!strcmp(ev_name(e), "content_block_start") && ev_data(e, "index")->valueint == 2)
            blk = ev_data(e, "content_block");
    CHECK(blk && !strcmp(cJSON_GetObjectItem(blk, "type")->valuestring, "tool_use") &&
          !strcmp(cJSON_GetObjectItem(blk, "name")->valuestring, "get_weather") &&
          cJSON_GetArraySize(cJSON_GetObjectItem(blk, "input")) == 0);
    const cJSON *md = cJSON_GetArrayItem(evs, cJSON_GetArraySize(evs) - 2);
    CHECK_STR(cJSON_GetObjectItem(ev_data(md, "delta"), "stop_reason")->valuestring, "tool_use");
    const cJSON *u = ev_data(md, "usage");
    CHECK(cJSON_GetObjectItem(u, "input_tokens")->valueint == 6 && cJSON_GetObjectItem(u, "output_tokens")->valueint == 6 &&
          cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint == 4);
    cJSON_Delete(evs);
    /* the blocking answer: the same blocks */
    loom_buf b = {0};
    fmt_messages.put_answer(&f.j, &b);
    cJSON *a = cJSON_Parse(b.p);
    const cJSON *content = cJSON_GetObjectItem(a, "content");
    CHECK_EQ_INT(cJSON_GetArraySize(content), 3);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(content, 0), "type")->valuestring, "thinking");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(content, 1), "text")->valuestring, "Let me look.");
    const cJSON *tu = cJSON_GetArrayItem(content, 2);
    CHECK_STR(cJSON_GetObjectItem(tu, "type")->valuestring, "tool_use");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(tu, "input"), "city")->valuestring, "Paris");
    CHECK_STR(cJSON_GetObjectItem(a, "stop_reason")->valuestring, "tool_use");
    CHECK_STR(cJSON_GetObjectItem(a, "id")->valuestring, "msg_7");
    cJSON_Delete(a);
    loom_buf_free(&b);
    fake_free(&f);

    /* plain text cut by max_tokens; nothing generated: one empty text block */
    fake_job(&f, &fmt_messages, "msg_8", "{}", "just text", "length");
    fmt_messages.put_answer(&f.j, &b);
    a = cJSON_Parse(b.p);
    CHECK_STR(cJSON_GetObjectItem(a, "stop_reason")->valuestring, "max_tokens");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a, "content"), 0), "text")->valuestring, "just text");
    cJSON_Delete(a);
    loom_buf_free(&b);
    fake_free(&f);
    fake_job(&f, &fmt_messages, "msg_9", "{}", "", "stop");
    evs = events_of(&f.j.out);
    CHECK_EQ_INT(cJSON_GetArraySize(evs), 5); /* start, block start/stop, delta, stop */
    CHECK_STR(cJSON_GetObjectItem(ev_data(cJSON_GetArrayItem(evs, 3), "delta"), "stop_reason")->valuestring, "end_turn");
    cJSON_Delete(evs);
    fake_free(&f);
}

static void test_fmt_responses(void) {
    fake f;
    const char *gen = "<think>hm</think>Let me look.<tool_call>\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    fake_job(&f, &fmt_responses, "resp_3", "{\"instructions\":\"i\",\"store\":false}", gen, "stop");
    cJSON *evs = events_of(&f.j.out);
    int i = 0;
    for (const cJSON *e = evs->child; e; e = e->next, i++) {
        CHECK_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "data"), "type")->valuestring, ev_name(e));
        CHECKF(ev_data(e, "sequence_number")->valueint == i, "event %d (%s) has number %d", i, ev_name(e),
               ev_data(e, "sequence_number")->valueint);
    }
    loom_buf seq = {0};
    const char *last = "";
    for (const cJSON *e = evs->child; e; e = e->next) {
        if (strstr(ev_name(e), ".delta") && !strcmp(last, ev_name(e))) continue;
        loom_buf_printf(&seq, "%s ", last = ev_name(e));
    }
    CHECK_STR(seq.p ? seq.p : "",
              "response.created response.in_progress "
              "response.output_item.added response.content_part.added response.reasoning_text.delta "
              "response.reasoning_text.done response.content_part.done response.output_item.done "
              "response.output_item.added response.content_part.added response.output_text.delta "
              "response.output_text.done response.content_part.done response.output_item.done "
              "response.output_item.added response.function_call_arguments.delta "
              "response.function_call_arguments.done response.output_item.done response.completed ");
    loom_buf_free(&seq);
    const cJSON *done = cJSON_GetArrayItem(evs, cJSON_GetArraySize(evs) - 1);
    const cJSON *resp = ev_data(done, "response");
    const cJSON *out = cJSON_GetObjectItem(resp, "output");
    CHECK_EQ_INT(cJSON_GetArraySize(out), 3);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(out, 0), "type")->valuestring, "reasoning");
    const cJSON *msg = cJSON_GetArrayItem(out, 1), *fc = cJSON_GetArrayItem(out, 2);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "content"), 0), "text")->valuestring,
              "Let me look.");
    CHECK_STR(cJSON_GetObjectItem(fc, "type")->valuestring, "function_call");
    CHECK_STR(cJSON_GetObjectItem(fc, "arguments")->valuestring, "{\"city\":\"Paris\"}");
    CHECK(!strncmp(cJSON_GetObjectItem(fc, "call_id")->valuestring, "call_", 5));
    CHECK_STR(cJSON_GetObjectItem(resp, "status")->valuestring, "completed");
    CHECK_STR(cJSON_GetObjectItem(resp, "instructions")->valuestring, "i");
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(resp, "store")));
    const cJSON *u = cJSON_GetObjectItem(resp, "usage");
    CHECK(cJSON_GetObjectItem(u, "input_tokens")->valueint == 10 &&
          cJSON_GetObjectItem(cJSON_GetObjectItem(u, "input_tokens_details"), "cached_tokens")->valueint == 4 &&
          cJSON_GetObjectItem(u, "total_tokens")->valueint == 16);
    /* the streamed items' ids are the final object's */
    for (const cJSON *e = evs->child; e; e = e->next)
        if (!strcmp(ev_name(e), "response.output_item.done")) {
            int k = ev_data(e, "output_index")->valueint;
            CHECK_STR(cJSON_GetObjectItem(ev_data(e, "item"), "id")->valuestring,
                      cJSON_GetObjectItem(cJSON_GetArrayItem(out, k), "id")->valuestring);
        }
    /* the blocking answer is the final object */
    loom_buf b = {0};
    fmt_responses.put_answer(&f.j, &b);
    char *t = cJSON_PrintUnformatted(resp);
    CHECK_STR(b.p ? b.p : "", t ? t : "");
    free(t);
    loom_buf_free(&b);
    cJSON_Delete(evs);
    fake_free(&f);

    /* cut by max_output_tokens: incomplete */
    fake_job(&f, &fmt_responses, "resp_4", "{}", "text", "length");
    evs = events_of(&f.j.out);
    done = cJSON_GetArrayItem(evs, cJSON_GetArraySize(evs) - 1);
    CHECK_STR(ev_name(done), "response.incomplete");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(ev_data(done, "response"), "incomplete_details"), "reason")->valuestring,
              "max_output_tokens");
    cJSON_Delete(evs);
    fake_free(&f);
}

/* A stored response continues: its conversation (with its tool call)
 * comes before the new input; deleted or evicted, it is a 404. */
static void test_responses_store(void) {
    fake_store = fmt_responses_store_create();
    fake f;
    const char *gen = "<think>hm</think>Let me look.<tool_call>\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    fake_job(&f, &fmt_responses, "resp_5", "{\"input\":\"q\",\"instructions\":\"not carried over\"}", gen, "stop");
    char call_id[32];
    snprintf(call_id, sizeof call_id, "%s", f.j.ch[0].scan.calls[0].id);
    int status = 0;
    char *got = fmt_responses_get(&f.s, "resp_5", 0, &status);
    CHECK(status == 200 && got && strstr(got, "\"id\":\"resp_5\"") && strstr(got, "\"function_call\""));
    free(got);
    fake_free(&f);

    fake g;
    memset(&g, 0, sizeof g);
    g.s.responses = fake_store;
    g.s.vocab = 1000;
    g.j.srv = &g.s;
    char body[512];
    snprintf(body, sizeof body, "{\"previous_response_id\":\"resp_5\",\"input\":[{\"type\":\"function_call_output\","
                                "\"call_id\":\"%s\",\"output\":\"sunny\"}]}", call_id);
    api_error e;
    if (fmt_responses.parse(&g.j, body, strlen(body), &e) < 0) {
        CHECKF(0, "continuation rejected: %s", e.message);
    } else {
        char *m = messages_of(&g.j.req), want[1024];
        snprintf(want, sizeof want,
                 "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"Let me look.\","
                 "\"reasoning_content\":\"hm\",\"tool_calls\":[{\"id\":\"%s\",\"type\":\"function\",\"function\":"
                 "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                 "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_call_id\":\"%s\"}]", call_id, call_id);
        CHECK_STR(m, want);
        CHECK(g.j.req.previous_response_id && !strcmp(g.j.req.previous_response_id, "resp_5"));
        free(m);
    }
    fake_free(&g);

    /* deleted: gone for GET, DELETE and continuing */
    got = fmt_responses_get(&f.s, "resp_5", 1, &status);
    CHECK(status == 200 && got && strstr(got, "\"deleted\":true"));
    free(got);
    got = fmt_responses_get(&f.s, "resp_5", 1, &status);
    CHECK(status == 404);
    free(got);
    memset(&g, 0, sizeof g);
    g.s.responses = fake_store;
    g.j.srv = &g.s;
    CHECK(fmt_responses.parse(&g.j, body, strlen(body), &e) < 0 && e.status == 404 &&
          !strcmp(e.param, "previous_response_id") && e.code && !strcmp(e.code, "previous_response_not_found"));

    /* past the count cap the least recently used go first */
    for (int i = 0; i < 1100; i++) {
        char id[32];
        snprintf(id, sizeof id, "resp_%d", 100 + i);
        fake_job(&f, &fmt_responses, id, "{}", "x", "stop");
        fake_free(&f);
        /* resp_100, used again before the cap is reached, outlives those stored after it */
        if (i == 1000) free(fmt_responses_get(&f.s, "resp_100", 0, &status));
    }
    free(fmt_responses_get(&f.s, "resp_101", 0, &status));
    CHECK_EQ_INT(status, 404);
    free(fmt_responses_get(&f.s, "resp_100", 0, &status));
    CHECK_EQ_INT(status, 200);
    free(fmt_responses_get(&f.s, "resp_1199", 0, &status));
    CHECK_EQ_INT(status, 200);
    fmt_responses_store_free(fake_store);
    fake_store = NULL;
}

/* ---- the stop string a stream stopped at --------------------------------------------- */

static void test_stop_hit(void) {
    loom_tok *tok = NULL;
    if (loom_tok_load_dir("tests/fixtures/trained/pycoder-16m", &tok) != LOOM_OK) {
        CHECKF(0, "tokenizer: %s", loom_last_error());
        return;
    }
    const char *text = "def fib(n):\n    return n  # done\n";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(loom_tok_encode(tok, text, strlen(text), 0, &ids, &n) == LOOM_OK);
    static const struct { const char *stops[3]; int n; const char *hit; } cases[] = {
        {{"never", "", "return"}, 3, "return"},   /* an empty stop is skipped, the index still right */
        {{"# done", "(n)"}, 2, "(n)"},            /* the earliest in the text wins */
        {{"zzz"}, 1, NULL},
    };
    for (size_t c = 0; c < LOOM_ARRAY_LEN(cases); c++) {
        loom_textstream *ts = NULL;
        CHECK(loom_ts_create(tok, cases[c].stops, cases[c].n, 1, &ts) == LOOM_OK);
        CHECK(loom_ts_stop_hit(ts) == NULL);
        int stopped = 0;
        const char *t;
        size_t len;
        for (size_t i = 0; i < n && !stopped; i++) loom_ts_push(ts, ids[i], &t, &len, &stopped);
        if (!stopped) loom_ts_finish(ts, &t, &len, &stopped);
        const char *hit = loom_ts_stop_hit(ts);
        CHECKF(cases[c].hit ? hit && !strcmp(hit, cases[c].hit) : hit == NULL, "case %zu: hit %s", c, hit ? hit : "none");
        loom_ts_free(ts);
    }
    free(ids);
    loom_tok_free(tok);
}

int main(void) {
    test_messages_errors();
    test_messages_translate();
    test_messages_images();
    test_anthropic_error_types();
    test_responses_errors();
    test_responses_translate();
    test_responses_images();
    test_fmt_messages();
    test_fmt_responses();
    test_responses_store();
    test_stop_hit();
    return test_report("test_api_messages");
}
