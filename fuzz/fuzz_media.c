/* libFuzzer target: chat content parts with images (api_parse's
 * normalisation) and image URLs (api_media_load, api_base64_decode).
 *
 * Input: byte 0 picks the mode (bit 0: the rest is a content array
 * spliced into a chat body; else a URL); the rest is the text. A URL is
 * either refused with a 400 naming the part and a message, or loaded: a
 * data: URL's bytes then re-encode (base64, no padding) to its data less
 * padding; file:// URLs are always refused (no directory is allowed). A
 * body is refused with a 4xx whose error JSON parses, or accepted with at
 * most API_MAX_IMAGES images, each URL a string of the part, and no URL
 * in the messages the template sees. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "serve/media.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void check_url(const char *url) {
    uint8_t *out = NULL;
    size_t len = 0;
    api_error e = {0};
    int rc = api_media_load(url, NULL, "messages[0].content[0]", &out, &len, &e);
    if (rc < 0) {
        assert(out == NULL && e.status == 400 && e.message[0]);
        assert(!strcmp(e.param, "messages[0].content[0]"));
        return;
    }
    assert(out && len > 0 && strncmp(url, "file", 4) && strncmp(url, "FILE", 4));
    const char *b64 = strchr(url, ',') + 1;
    size_t n = strlen(b64);
    while (n > 0 && b64[n - 1] == '=') n--;
    size_t w = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)out[i] << 16 | (i + 1 < len ? (uint32_t)out[i + 1] << 8 : 0) |
                     (i + 2 < len ? out[i + 2] : 0);
        size_t k = len - i >= 3 ? 4 : len - i + 1;
        for (size_t j = 0; j < k; j++, w++) {
            /* the last character's unused low bits may be anything */
            int v6 = (int)(v >> (18 - 6 * j) & 63);
            assert(w < n);
            if (w + 1 < n || len % 3 == 0) assert(b64[w] == B64[v6]);
        }
    }
    assert(w == n);
    free(out);
}

static void check_body(const char *parts, size_t n) {
    loom_buf b = {0};
    loom_buf_puts(&b, "{\"messages\":[{\"role\":\"user\",\"content\":");
    loom_buf_put(&b, parts, n);
    loom_buf_puts(&b, "}]}");
    if (b.oom) {
        loom_buf_free(&b);
        return;
    }
    api_req r;
    api_error e;
    if (api_parse(API_CHAT, b.p, b.len, 1000, &r, &e) < 0) {
        assert(e.status >= 400 && e.status < 500 && e.message[0]);
        char *j = api_error_json(&e);
        cJSON *p = j ? cJSON_Parse(j) : NULL;
        assert(p);
        cJSON_Delete(p);
        free(j);
    } else {
        assert(r.n_images >= 0 && r.n_images <= API_MAX_IMAGES);
        for (int i = 0; i < r.n_images; i++) {
            assert(r.image_urls[i] && r.image_urls[i][0]);
            assert(!strncmp(r.image_params[i], "messages[0].content[", 20));
            /* the template sees {"type": "image"}, never the URL */
            if (strlen(r.image_urls[i]) > 8) assert(!strstr(r.messages_json, r.image_urls[i]));
        }
        api_req_free(&r);
    }
    loom_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 16)) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    if (data[0] & 1) check_body(text, size - 1);
    else if (!memchr(data + 1, 0, size - 1)) check_url(text);
    free(text);
    return 0;
}
