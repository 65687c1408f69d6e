/* libFuzzer target: the Anthropic Messages and OpenAI Responses request
 * translators. Byte 0 picks the shape (messages, count_tokens, responses,
 * responses continuing a conversation), the rest is the body. A parse
 * either fails with a 4xx/5xx error whose JSON is in its dialect's shape,
 * or yields a chat request whose messages are a non-empty array. */
#include <assert.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api_messages.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int shape = data[0] & 3;
    /* the body is not NUL-terminated: the parser must honour the length */
    char *body = malloc(size - 1 ? size - 1 : 1);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    api_req r;
    api_error e;
    cJSON *client = NULL;
    int rc;
    if (shape < 2) {
        rc = api_messages_parse(body, size - 1, 512, shape, &r, &client, &e);
        assert(rc < 0 || client);
    } else {
        cJSON *history = shape == 3 ? cJSON_Parse("[{\"role\":\"user\",\"content\":\"a\"},"
                                                  "{\"role\":\"assistant\",\"content\":\"b\"}]")
                                    : NULL;
        client = api_parse_object(body, size - 1, &e);
        rc = client ? api_responses_parse(client, history, 512, &r, &e) : -1;
        if (rc == 0) {
            cJSON *out = cJSON_CreateArray();
            api_error e2;
            assert(api_responses_input(client, out, &e2) == 0);
            cJSON_Delete(out);
        }
        cJSON_Delete(history);
    }
    if (rc < 0) {
        assert(e.status >= 400 && e.status < 600);
        assert(memchr(e.message, 0, sizeof e.message) && memchr(e.param, 0, sizeof e.param));
        char *j = api_error_json(&e);
        assert(j);
        cJSON *p = cJSON_Parse(j);
        assert(p && cJSON_IsObject(cJSON_GetObjectItem(p, "error")));
        assert(shape >= 2 || cJSON_IsString(cJSON_GetObjectItem(p, "type")));
        cJSON_Delete(p);
        free(j);
    } else {
        assert(r.kind == API_CHAT && r.n == 1);
        assert(r.n_stops >= 0 && r.n_stops <= API_MAX_STOPS);
        assert(shape == 1 || shape >= 2 || r.max_tokens >= 1);
        assert(r.tool_choice && (r.tools_json || strcmp(r.tool_choice, "required")));
        cJSON *m = cJSON_Parse(r.messages_json);
        assert(cJSON_IsArray(m) && cJSON_GetArraySize(m) > 0);
        cJSON_Delete(m);
        api_req_free(&r);
    }
    cJSON_Delete(client);
    free(body);
    return 0;
}
