/* toolcall: a small state machine over the generated text. */
#include "serve/toolcall.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static const char *const tool_markers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
static const char think_open[] = "<think>", think_close[] = "</think>";

void loom_toolscan_init(loom_toolscan *t, int tools, int think, const char *prompt) {
    memset(t, 0, sizeof *t);
    t->tools = tools;
    t->think = think;
    if (think && prompt) {
        /* Templates that open the reasoning block themselves. */
        const char *open = NULL, *p = prompt;
        while ((p = strstr(p, think_open))) open = p++;
        if (open && !strstr(open, think_close)) t->state = 1;
    }
}

void loom_toolscan_free(loom_toolscan *t) {
    loom_buf_free(&t->pending);
    loom_buf_free(&t->region);
    loom_buf_free(&t->content);
    loom_buf_free(&t->reasoning);
    for (int i = 0; i < t->n_calls; i++) {
        free(t->calls[i].name);
        free(t->calls[i].arguments);
    }
    t->n_calls = 0;
}

static void out_content(loom_toolscan *t, loom_buf *dst, const char *s, size_t n) {
    if (!t->started) {
        /* Leading whitespace before the answer (after </think>) is dropped. */
        if (t->think)
            while (n && (*s == '\n' || *s == ' ' || *s == '\r' || *s == '\t')) s++, n--;
        if (!n) return;
        t->started = 1;
    }
    loom_buf_put(dst, s, n);
    loom_buf_put(&t->content, s, n);
}

static void out_reasoning(loom_toolscan *t, loom_buf *dst, const char *s, size_t n) {
    if (!t->reasoning.len)
        while (n && (*s == '\n' || *s == ' ')) s++, n--;
    loom_buf_put(dst, s, n);
    loom_buf_put(&t->reasoning, s, n);
}

/* Longest suffix of s[0..n) that is a proper prefix of marker. */
static size_t partial(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = LOOM_MIN(m - 1, n); k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

/* Finds the earliest marker the current state reacts to. */
static const char *find_marker(const loom_toolscan *t, const char *s, size_t n, size_t *mlen,
                               int *kind) {
    const char *best = NULL;
    if (t->state == 1) {
        best = memmem(s, n, think_close, sizeof think_close - 1);
        *mlen = sizeof think_close - 1;
        *kind = 1;
        return best;
    }
    if (t->think && !t->started && !t->reasoning.len) {
        /* Only an opening tag before any content counts: the same text
         * must split the same way whether it comes whole or in pieces. */
        const char *h = memmem(s, n, think_open, sizeof think_open - 1);
        for (const char *q = s; h && q < h; q++)
            if (*q != ' ' && *q != '\n' && *q != '\r' && *q != '\t') h = NULL;
        if (h) {
            best = h;
            *mlen = sizeof think_open - 1;
            *kind = 0;
        }
    }
    if (t->tools)
        for (size_t i = 0; i < LOOM_ARRAY_LEN(tool_markers); i++) {
            const char *h = memmem(s, n, tool_markers[i], strlen(tool_markers[i]));
            if (h && (!best || h < best)) {
                best = h;
                *mlen = 0; /* the marker stays in the region: the parser needs it */
                *kind = 2;
            }
        }
    return best;
}

static size_t hold_len(const loom_toolscan *t, const char *s, size_t n) {
    size_t h = 0;
    if (t->state == 1) return partial(s, n, think_close);
    if (t->think && !t->started) h = LOOM_MAX(h, partial(s, n, think_open));
    if (t->tools)
        for (size_t i = 0; i < LOOM_ARRAY_LEN(tool_markers); i++)
            h = LOOM_MAX(h, partial(s, n, tool_markers[i]));
    return h;
}

/* ---- parsing the region ------------------------------------------------- */

static void add_call(loom_toolscan *t, const cJSON *obj) {
    if (t->n_calls >= LOOM_MAX_TOOL_CALLS || !cJSON_IsObject(obj)) return;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    if (!cJSON_IsString(name)) return;
    loom_tool_call *c = &t->calls[t->n_calls];
    c->name = strdup(name->valuestring);
    if (cJSON_IsString(args)) c->arguments = strdup(args->valuestring);
    else if (args) c->arguments = cJSON_PrintUnformatted(args);
    else c->arguments = strdup("{}");
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return;
    }
    static unsigned long long seq;
    snprintf(c->id, sizeof c->id, "call_%llx%04x", (unsigned long long)__atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED),
             (unsigned)(t->n_calls * 2654435761u) & 0xffff);
    t->n_calls++;
}

/* Parses JSON text holding an object, an array of objects, or several
 * objects separated by ';' or whitespace. */
static void add_json(loom_toolscan *t, const char *s, size_t n) {
    while (n) {
        while (n && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t' || *s == ';')) s++, n--;
        if (!n) return;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
        if (!j) return;
        if (cJSON_IsArray(j))
            for (const cJSON *e = j->child; e; e = e->next) add_call(t, e);
        else add_call(t, j);
        cJSON_Delete(j);
        n -= (size_t)(end - s);
        s = end;
    }
}

static void parse_region(loom_toolscan *t) {
    const char *s = t->region.p ? t->region.p : "";
    size_t n = t->region.len;
    if (!strncmp(s, "<tool_call>", 11)) {
        const char *p = s;
        while ((p = memmem(p, n - (size_t)(p - s), "<tool_call>", 11))) {
            p += 11;
            const char *e = memmem(p, n - (size_t)(p - s), "</tool_call>", 12);
            size_t len = e ? (size_t)(e - p) : n - (size_t)(p - s);
            add_json(t, p, len);
            if (!e) break;
            p = e + 12;
        }
    } else if (!strncmp(s, "[TOOL_CALLS]", 12)) {
        add_json(t, s + 12, n - 12);
    } else if (!strncmp(s, "<|python_tag|>", 14)) {
        add_json(t, s + 14, n - 14);
    } else {
        add_json(t, s, n);
    }
}

void loom_toolscan_feed(loom_toolscan *t, const char *text, size_t len, int final, loom_buf *content,
                        loom_buf *reasoning) {
    loom_buf_put(&t->pending, text, len);
    for (;;) {
        char *s = t->pending.p ? t->pending.p : "";
        size_t n = t->pending.len;
        if (t->state == 2) {
            loom_buf_put(&t->region, s, n);
            t->pending.len = 0;
            break;
        }
        /* A bare JSON answer is a tool call when tools are on. */
        if (t->tools && t->state == 0 && !t->started) {
            size_t k = 0;
            while (k < n && (s[k] == ' ' || s[k] == '\n' || s[k] == '\r' || s[k] == '\t')) k++;
            /* Blank so far: hold it, or a piece boundary would decide. */
            if (k == n && n && !final && !t->content.len) break;
            if (k < n && (s[k] == '{' || s[k] == '[') && !t->content.len) {
                t->state = 2;
                continue;
            }
        }
        size_t mlen = 0;
        int kind = 0;
        const char *m = find_marker(t, s, n, &mlen, &kind);
        if (!m) {
            size_t keep = final ? 0 : hold_len(t, s, n);
            if (t->state == 1) out_reasoning(t, reasoning, s, n - keep);
            else out_content(t, content, s, n - keep);
            memmove(s, s + n - keep, keep);
            t->pending.len = keep;
            break;
        }
        size_t before = (size_t)(m - s);
        if (t->state == 1) out_reasoning(t, reasoning, s, before);
        else out_content(t, content, s, before);
        t->state = kind == 0 ? 1 : kind == 1 ? 0 : 2;
        if (kind == 1) t->started = 0; /* drop the blank line after </think> */
        size_t used = before + mlen;
        memmove(s, s + used, n - used);
        t->pending.len = n - used;
    }
    if (t->pending.p) t->pending.p[t->pending.len] = 0;
    if (final && t->state == 2) {
        parse_region(t);
        if (t->n_calls == 0 && t->region.len) {
            /* Not a tool call after all: it is content. */
            t->state = 0;
            int was = t->started;
            t->started = 1;
            out_content(t, content, t->region.p, t->region.len);
            t->started = was || t->region.len;
        }
        t->region.len = 0;
    }
}

void loom_toolscan_put_calls(const loom_toolscan *t, loom_buf *b, int stream) {
    loom_buf_puts(b, "[");
    for (int i = 0; i < t->n_calls; i++) {
        const loom_tool_call *c = &t->calls[i];
        loom_buf_puts(b, i ? ",{" : "{");
        if (stream) loom_buf_printf(b, "\"index\":%d,", i);
        loom_buf_printf(b, "\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", c->id);
        api_put_json_str(b, c->name, strlen(c->name));
        loom_buf_puts(b, ",\"arguments\":");
        api_put_json_str(b, c->arguments, strlen(c->arguments));
        loom_buf_puts(b, "}}");
    }
    loom_buf_puts(b, "]");
}
