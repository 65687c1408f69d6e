/* libFuzzer target: the Jinja engine (template/jinja.h) and the chat layer
 * over it (template/chat.h) on arbitrary template source.
 *
 * Input: byte 0 picks the variables and the entry point, the rest is the
 * template source.
 *   bits 0-1  0: "{}"; 1: a chat conversation with tools and special tokens;
 *             2: one value of every JSON type; 3: the variables are the
 *             bytes after the first NUL of the source (any text).
 *   bit 2     render through loom_chat_apply (the source as the "default"
 *             template, the conversation of context 1) instead of
 *             loom_jinja_render; bit 3 then adds the tools, bit 4
 *             add_generation_prompt, bit 5 an enable_thinking kwarg.
 * Sources longer than MAX_SRC bytes are skipped: the engine's own limits
 * (steps, output, memory, nesting) are what keep a render finite, and short
 * sources already reach them.
 *
 * Checks, beyond no crash, leak or sanitizer report:
 *   - a failed compile leaves *out NULL and names a template line;
 *   - a render either fails with a message, or returns a NUL-terminated
 *     string of the stated length, no longer than the engine's 256 MiB cap;
 *   - from UTF-8 source and one of the fixed contexts the output is UTF-8
 *     (a byte-sliced multi-byte character would be a divergence from
 *     Python, which slices code points);
 *   - rendering is repeatable: the same template and variables give the
 *     same status and text (templates calling strftime_now are exempt). */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "template/chat.h"
#include "template/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SRC 16384
#define MAX_OUT ((size_t)256 << 20)

static const char *const CONTEXTS[3] = {
    "{}",
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be terse.\"},"
    " {\"role\": \"user\", \"content\": \"Hi <b>&</b> \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"think\","
    "  \"tool_calls\": [{\"type\": \"function\", \"id\": \"c1\", \"function\": {\"name\": \"f\","
    "  \"arguments\": {\"a\": 1, \"b\": [true, null, 1.5]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"again\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}},"
    "  \"required\": [\"a\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false}",
    "{\"s\": \"a\\u00e9\\u4e2d\\ud83d\\ude00\", \"e\": \"\", \"n\": -3, \"f\": 2.5,"
    " \"big\": 12345678901234567890, \"l\": [1, \"x\", [2, []], {\"k\": null}],"
    " \"d\": {\"k\": \"v\", \"n\": {\"m\": [0]}}, \"t\": true, \"z\": null}",
};

static const char MESSAGES[] =
    "[{\"role\": \"system\", \"content\": \"Be terse.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"type\": \"function\","
    "  \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}, {\"role\": \"user\", \"content\": \"more\"}]";
static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]";

/* Strict UTF-8 (no surrogates, no overlongs, at most U+10FFFF), by
 * utf8proc through base rather than the code under test. */
static int utf8_ok(const unsigned char *s, size_t n) { return loom_utf8_valid((const char *)s, n); }

/* One render through the chosen entry point. */
static loom_status render(const loom_jinja_template *jt, const loom_chat_template *ct,
                          const char *vars, uint8_t mode, char **out, size_t *len) {
    *out = NULL;
    *len = (size_t)-1;
    if (!ct) return loom_jinja_render(jt, vars, out, len);
    loom_chat_params p = loom_chat_default_params();
    p.messages_json = MESSAGES;
    if (mode & 8) p.tools_json = TOOLS;
    p.add_generation_prompt = !!(mode & 16);
    if (mode & 32) p.kwargs_json = "{\"enable_thinking\": true}";
    return loom_chat_apply(ct, &p, out, len);
}

static void check_result(loom_status st, const char *out, size_t len) {
    if (st == LOOM_OK) {
        assert(out != NULL);
        assert(len <= MAX_OUT);
        assert(out[len] == '\0');
    } else {
        assert(out == NULL);
        assert(loom_last_error() && loom_last_error()[0]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size - 1 > MAX_SRC) return 0;
    uint8_t mode = data[0];
    const char *src = (const char *)data + 1;
    size_t src_len = size - 1;
    char vars_buf[MAX_SRC + 1];
    const char *vars = CONTEXTS[mode & 3 ? (mode & 3) % 3 : 0];
    if ((mode & 3) == 3) {
        const char *nul = memchr(src, 0, src_len);
        if (!nul) return 0;
        size_t vl = src_len - (size_t)(nul + 1 - src);
        memcpy(vars_buf, nul + 1, vl);
        vars_buf[vl] = '\0';
        vars = vars_buf;
        src_len = (size_t)(nul - src);
    }
    int is_chat = !!(mode & 4);
    if (is_chat) vars = CONTEXTS[1];

    loom_jinja_template *jt = (loom_jinja_template *)1;
    loom_chat_template *ct = NULL;
    loom_status st;
    char *srcz = malloc(src_len + 1);
    if (!srcz) return 0;
    memcpy(srcz, src, src_len);
    srcz[src_len] = '\0';
    if (is_chat) {
        /* the chat layer takes a NUL-terminated source */
        jt = NULL;
        st = loom_chat_template_from_config(NULL, srcz, &ct);
        if (st != LOOM_OK) {
            assert(ct == NULL);
            assert(loom_last_error()[0]);
        }
    } else {
        st = loom_jinja_compile(src, src_len, &jt);
        if (st != LOOM_OK) {
            assert(jt == NULL);
            assert(strstr(loom_last_error(), "line") != NULL);
        }
    }
    if (st == LOOM_OK) {
        char *out1, *out2;
        size_t len1, len2;
        loom_status r1 = render(jt, ct, vars, mode, &out1, &len1);
        check_result(r1, out1, len1);
        if (r1 == LOOM_OK && (mode & 3) != 3 && utf8_ok((const unsigned char *)src, src_len) &&
            !utf8_ok((const unsigned char *)out1, len1)) {
            fprintf(stderr, "fuzz_jinja: UTF-8 source rendered to invalid UTF-8\n");
            abort();
        }
        if (!strstr(srcz, "strftime_now") && (r1 != LOOM_OK || len1 < ((size_t)1 << 20))) {
            loom_status r2 = render(jt, ct, vars, mode, &out2, &len2);
            check_result(r2, out2, len2);
            assert(r1 == r2);
            if (r1 == LOOM_OK) assert(len1 == len2 && memcmp(out1, out2, len1) == 0);
            free(out2);
        }
        free(out1);
    }
    loom_jinja_free(jt);
    loom_chat_template_free(ct);
    free(srcz);
    return 0;
}
