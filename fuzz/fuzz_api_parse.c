/* libFuzzer target: the request parser and validator. The first byte picks
 * the endpoint, the rest is the body. A parse either fails with a 4xx/5xx
 * error whose JSON is well formed, or yields a request within the limits
 * the server relies on. */
#include <assert.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    api_kind kind = data[0] & 1 ? API_COMPLETION : API_CHAT;
    int vocab = 1 + (data[0] >> 1) * 64;
    /* the body is not NUL-terminated: the parser must honour the length */
    char *body = malloc(size - 1 ? size - 1 : 1);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    api_req r;
    api_error e;
    if (api_parse(kind, body, size - 1, vocab, &r, &e) < 0) {
        assert(e.status >= 400 && e.status < 600);
        assert(memchr(e.message, 0, sizeof e.message) && memchr(e.param, 0, sizeof e.param));
        char *j = api_error_json(&e);
        assert(j);
        cJSON *p = cJSON_Parse(j);
        assert(p && cJSON_IsObject(cJSON_GetObjectItem(p, "error")));
        cJSON_Delete(p);
        free(j);
    } else {
        assert(r.n >= 1 && r.n <= API_MAX_N);
        assert(r.n_stops >= 0 && r.n_stops <= API_MAX_STOPS);
        assert(r.max_tokens == -1 || r.max_tokens >= 1 || (r.max_tokens == 0 && r.echo));
        /* no NUL, raw or escaped, got through to be cut short */
        assert(!memchr(body, 0, size - 1));
        assert(r.logprobs >= -1 && r.logprobs <= 20);
        assert(r.sampling.temperature >= 0 && r.sampling.temperature <= 2);
        for (int i = 0; i < r.sampling.n_logit_bias; i++)
            assert(r.sampling.logit_bias[i].token >= 0 && r.sampling.logit_bias[i].token < vocab);
        if (kind == API_CHAT) {
            assert(r.messages_json);
            assert(r.tool_choice && (r.tools_json || strcmp(r.tool_choice, "required")));
            cJSON *m = cJSON_Parse(r.messages_json);
            assert(cJSON_IsArray(m) && cJSON_GetArraySize(m) > 0);
            cJSON_Delete(m);
        } else {
            assert(r.prompt_text || r.prompt_ids);
            for (int i = 0; r.prompt_ids && i < r.n_prompt_ids; i++)
                assert(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < vocab);
        }
        api_req_free(&r);
    }
    free(body);
    return 0;
}
