/* toolcall: a small state machine over the generated text.
 *
 * Tag syntaxes (every one but HARMONY) share one loop: state 0 is content,
 * 1 reasoning, 2 a tool region opened by a marker of tags[] (or a bare JSON
 * answer). A region ends at its close marker, or at the end of the output
 * for markers without one; its body is then parsed by the marker's kind,
 * and what does not parse goes out as content, markers and all.
 *
 * HARMONY (gpt-oss) is a sequence of messages, each a header up to
 * <|message|> (channel, optional recipient "to=...") and a body up to
 * <|end|>, <|call|> or <|return|>; the loop alternates state 0 (header)
 * and 1 (body), routing each body by its header. */
#include "serve/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

enum { BODY_TAGGED, BODY_GEMMA, BODY_JSON };

static const struct tag {
    const char *open, *close; /* close NULL: the region runs to the end */
    int body;
} tags[] = {
    {"<tool_call>", "</tool_call>", BODY_TAGGED},
    {"<|tool_call>", "<tool_call|>", BODY_GEMMA},
    {"<|python_tag|>", NULL, BODY_JSON},
    {"[TOOL_CALLS]", NULL, BODY_JSON},
};

static const char GEMMA_QUOTE[] = "<|\"|>";
static const char *const harmony_ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static int starts(const char *p, const char *e, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(e - p) >= n && !memcmp(p, lit, n);
}

static const char *find(const char *p, const char *e, const char *lit) {
    return p < e ? memmem(p, (size_t)(e - p), lit, strlen(lit)) : NULL;
}

/* Whether the syntax reacts to tags[i]. */
static int tag_on(const loom_toolscan *t, int i) {
    switch (t->syntax) {
    case LOOM_TC_AUTO: return 1;
    case LOOM_TC_QWEN: return i == 0;
    case LOOM_TC_GEMMA4: return i == 1;
    case LOOM_TC_LLAMA3: return i == 2;
    case LOOM_TC_MISTRAL: return i == 3;
    default: return 0;
    }
}

/* Llama 3 answers a call with bare JSON. */
static int bare_json_on(const loom_toolscan *t) {
    return t->syntax == LOOM_TC_AUTO || t->syntax == LOOM_TC_LLAMA3;
}

static const char *think_open(const loom_toolscan *t) {
    return t->syntax == LOOM_TC_GEMMA4 ? "<|channel>" : "<think>";
}

static const char *think_close(const loom_toolscan *t) {
    return t->syntax == LOOM_TC_GEMMA4 ? "<channel|>" : "</think>";
}

/* Templates that open the reasoning block themselves. */
static void state_from_prompt(loom_toolscan *t, const char *prompt) {
    t->state = 0;
    if (!t->think || !prompt) return;
    const char *open = NULL, *p = prompt;
    while ((p = strstr(p, think_open(t)))) open = p++;
    if (open && !strstr(open, think_close(t))) {
        t->state = 1;
        t->label = t->syntax == LOOM_TC_GEMMA4;
    }
}

void loom_toolscan_init(loom_toolscan *t, int tools, int think, const char *prompt) {
    memset(t, 0, sizeof *t);
    t->tools = tools;
    t->think = think;
    t->marker = -1;
    state_from_prompt(t, prompt);
}

void loom_toolscan_set_syntax(loom_toolscan *t, loom_tc_syntax syntax, const char *tools_json,
                              const char *prompt) {
    t->syntax = syntax;
    if (syntax == LOOM_TC_GEMMA4) t->think = 1; /* its channel markers say it */
    cJSON_Delete(t->schema);
    t->schema = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (syntax == LOOM_TC_HARMONY) t->state = 0; /* the prompt ends at <|start|>assistant */
    else state_from_prompt(t, prompt);
}

void loom_toolscan_free(loom_toolscan *t) {
    loom_buf_free(&t->pending);
    loom_buf_free(&t->region);
    loom_buf_free(&t->name);
    loom_buf_free(&t->content);
    loom_buf_free(&t->reasoning);
    cJSON_Delete(t->schema);
    t->schema = NULL;
    for (int i = 0; i < t->n_calls; i++) {
        free(t->calls[i].name);
        free(t->calls[i].arguments);
    }
    t->n_calls = 0;
}

/* Content as is (a call that did not parse). */
static void put_content(loom_toolscan *t, loom_buf *dst, const char *s, size_t n) {
    if (!n) return;
    t->started = 1;
    t->after_call = 0;
    loom_buf_put(dst, s, n);
    loom_buf_put(&t->content, s, n);
}

static void out_content(loom_toolscan *t, loom_buf *dst, const char *s, size_t n) {
    if (t->after_call) {
        /* The blank between calls, or after the last, is no answer. */
        while (n && is_ws(*s)) s++, n--;
        if (!n) return;
    }
    if (!t->started && t->think) {
        /* Leading whitespace before the answer (after </think>) is dropped. */
        while (n && is_ws(*s)) s++, n--;
    }
    put_content(t, dst, s, n);
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

/* The earliest tool marker in s[0..n); *which gets its tags[] index. */
static const char *find_tag(const loom_toolscan *t, const char *s, size_t n, int *which) {
    const char *best = NULL;
    for (int i = 0; i < (int)LOOM_ARRAY_LEN(tags); i++) {
        if (!tag_on(t, i)) continue;
        const char *h = memmem(s, n, tags[i].open, strlen(tags[i].open));
        if (h && (!best || h < best)) best = h, *which = i;
    }
    return best;
}

/* Finds the earliest marker the current state reacts to. kind: 0 opens
 * reasoning, 1 closes it, 2 opens a tool region. */
static const char *find_marker(const loom_toolscan *t, const char *s, size_t n, size_t *mlen,
                               int *kind, int *which) {
    const char *best = NULL;
    if (t->state == 1) {
        const char *close = think_close(t);
        best = memmem(s, n, close, strlen(close));
        *mlen = strlen(close);
        *kind = 1;
        /* Gemma 4 may start a call without closing its thought. */
        if (t->tools && t->syntax == LOOM_TC_GEMMA4) {
            const char *h = find_tag(t, s, n, which);
            if (h && (!best || h < best)) best = h, *mlen = strlen(tags[*which].open), *kind = 2;
        }
        return best;
    }
    if (t->think && !t->started && !t->reasoning.len) {
        /* Only an opening tag before any content counts: the same text
         * must split the same way whether it comes whole or in pieces. */
        const char *open = think_open(t);
        const char *h = memmem(s, n, open, strlen(open));
        for (const char *q = s; h && q < h; q++)
            if (!is_ws(*q)) h = NULL;
        if (h) {
            best = h;
            *mlen = strlen(open);
            *kind = 0;
        }
    }
    if (t->tools) {
        int w = 0;
        const char *h = find_tag(t, s, n, &w);
        if (h && (!best || h < best)) {
            best = h;
            *mlen = strlen(tags[w].open);
            *kind = 2;
            *which = w;
        }
    }
    return best;
}

static size_t hold_len(const loom_toolscan *t, const char *s, size_t n) {
    size_t h = 0;
    if (t->state == 1) {
        h = partial(s, n, think_close(t));
        if (t->tools && t->syntax == LOOM_TC_GEMMA4) h = LOOM_MAX(h, partial(s, n, tags[1].open));
        return h;
    }
    if (t->think && !t->started) h = LOOM_MAX(h, partial(s, n, think_open(t)));
    if (t->tools)
        for (int i = 0; i < (int)LOOM_ARRAY_LEN(tags); i++)
            if (tag_on(t, i)) h = LOOM_MAX(h, partial(s, n, tags[i].open));
    return h;
}

/* ---- calls ---------------------------------------------------------------- */

/* Takes ownership of name and args (both freed on failure). */
static int new_call(loom_toolscan *t, char *name, char *args) {
    if (t->n_calls >= LOOM_MAX_TOOL_CALLS || !name || !args || !name[0]) {
        free(name);
        free(args);
        return 0;
    }
    loom_tool_call *c = &t->calls[t->n_calls];
    c->name = name;
    c->arguments = args;
    c->sent = 0;
    static unsigned long long seq;
    snprintf(c->id, sizeof c->id, "call_%llx%04x",
             (unsigned long long)__atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED),
             (unsigned)(t->n_calls * 2654435761u) & 0xffff);
    t->n_calls++;
    return 1;
}

static void drop_calls(loom_toolscan *t, int keep) {
    while (t->n_calls > keep) {
        t->n_calls--;
        free(t->calls[t->n_calls].name);
        free(t->calls[t->n_calls].arguments);
    }
}

static int add_call(loom_toolscan *t, const cJSON *obj) {
    if (!cJSON_IsObject(obj)) return 0;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    if (!cJSON_IsString(name)) return 0;
    char *a = cJSON_IsString(args) ? strdup(args->valuestring)
              : args             ? cJSON_PrintUnformatted(args)
                                 : strdup("{}");
    return new_call(t, strdup(name->valuestring), a);
}

/* Parses JSON text holding an object, an array of objects, or several
 * objects separated by ';' or whitespace. Returns the calls added. */
static int add_json(loom_toolscan *t, const char *s, size_t n) {
    int added = 0;
    while (n) {
        while (n && (is_ws(*s) || *s == ';')) s++, n--;
        if (!n) break;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
        if (!j) break;
        if (cJSON_IsArray(j))
            for (const cJSON *e = j->child; e; e = e->next) added += add_call(t, e);
        else added += add_call(t, j);
        cJSON_Delete(j);
        n -= (size_t)(end - s);
        s = end;
    }
    return added;
}

/* ---- Qwen3-Coder / Qwen 3.5: <function=NAME><parameter=K>V</parameter> ---- */

/* The JSON schema type of parameter key of function fn in the request's
 * tools; NULL when the tools do not say. */
static const char *param_type(const loom_toolscan *t, const char *fn, const char *key) {
    const cJSON *tool;
    cJSON_ArrayForEach(tool, t->schema) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f ? f : tool, "name");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, fn)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f ? f : tool, "parameters");
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        if (cJSON_IsString(type)) return type->valuestring;
        const cJSON *e;
        cJSON_ArrayForEach(e, type) /* ["integer", "null"] */
            if (cJSON_IsString(e) && strcmp(e->valuestring, "null")) return e->valuestring;
        return NULL;
    }
    return NULL;
}

static int type_is(const char *type, const char *const *names) {
    for (; *names; names++)
        if (!strcasecmp(type, *names)) return 1;
    return 0;
}

/* A parameter's text as the JSON value its schema type asks for: strings
 * (and parameters the schema does not type) stay strings; numbers,
 * booleans, null, objects and arrays are parsed, falling back to the
 * string when the text is not one. */
static cJSON *param_value(const loom_toolscan *t, const char *fn, const char *key, const char *v,
                          size_t n) {
    static const char *const strings[] = {"string", "str", "text", "varchar", "char", "enum", NULL};
    static const char *const numbers[] = {"integer", "int", "number", "float", "double", NULL};
    static const char *const bools[] = {"boolean", "bool", NULL};
    char *raw = strndup(v, n);
    if (!raw) return NULL;
    const char *type = param_type(t, fn, key);
    cJSON *out = NULL;
    if (type && !type_is(type, strings)) {
        const char *a = raw, *e = raw + n;
        while (a < e && is_ws(*a)) a++;
        while (e > a && is_ws(e[-1])) e--;
        size_t len = (size_t)(e - a);
        if (len == 4 && !strncasecmp(a, "null", 4)) out = cJSON_CreateNull();
        else if (type_is(type, bools)) {
            if (len == 4 && !strncasecmp(a, "true", 4)) out = cJSON_CreateTrue();
            else if (len == 5 && !strncasecmp(a, "false", 5)) out = cJSON_CreateFalse();
        } else {
            const char *end = NULL;
            cJSON *j = len ? cJSON_ParseWithLengthOpts(a, len, &end, 0) : NULL;
            int whole = j && end == e;
            if (whole && (!type_is(type, numbers) || cJSON_IsNumber(j))) out = j;
            else cJSON_Delete(j);
        }
    }
    if (!out) out = cJSON_CreateString(raw);
    free(raw);
    return out;
}

/* Trims one newline each side: the template writes "<parameter=k>\nV\n</parameter>". */
static void strip_newline(const char **a, const char **e) {
    if (*a < *e && **a == '\n') (*a)++;
    else if (*e - *a >= 2 && (*a)[0] == '\r' && (*a)[1] == '\n') *a += 2;
    if (*e > *a && (*e)[-1] == '\n') (*e)--;
    if (*e > *a && (*e)[-1] == '\r') (*e)--;
}

/* A name in "<function=NAME>": up to '>', on one line. */
static char *tag_name(const char **p, const char *e) {
    const char *a = *p, *q = a;
    while (q < e && *q != '>' && *q != '\n' && *q != '<') q++;
    if (q == e || *q != '>') return NULL;
    *p = q + 1;
    while (a < q && is_ws(*a)) a++;
    while (q > a && is_ws(q[-1])) q--;
    return q > a ? strndup(a, (size_t)(q - a)) : NULL;
}

/* One or more <function=...> blocks; any other text fails the region. */
static int add_xml(loom_toolscan *t, const char *p, const char *e) {
    int added = 0;
    for (;;) {
        while (p < e && is_ws(*p)) p++;
        if (p == e) return added;
        if (!starts(p, e, "<function=")) return 0;
        p += 10;
        char *name = tag_name(&p, e);
        if (!name) return 0;
        const char *fend = find(p, e, "</function>"), *body_end = fend ? fend : e;
        cJSON *args = cJSON_CreateObject();
        int ok = args != NULL;
        while (ok) {
            while (p < body_end && is_ws(*p)) p++;
            if (p == body_end) break;
            if (!starts(p, body_end, "<parameter=")) {
                ok = 0;
                break;
            }
            p += 11;
            char *key = tag_name(&p, body_end);
            if (!key) {
                ok = 0;
                break;
            }
            /* An unclosed value runs to the next parameter or the end. */
            const char *vend = find(p, body_end, "</parameter>"), *next;
            if (vend) next = vend + 12;
            else {
                vend = find(p, body_end, "<parameter=");
                if (!vend) vend = body_end;
                next = vend;
            }
            const char *va = p, *ve = vend;
            strip_newline(&va, &ve);
            cJSON *v = param_value(t, name, key, va, (size_t)(ve - va));
            cJSON_DeleteItemFromObjectCaseSensitive(args, key);
            if (!v || !cJSON_AddItemToObject(args, key, v)) {
                cJSON_Delete(v);
                ok = 0;
            }
            free(key);
            p = next;
        }
        char *a = ok ? cJSON_PrintUnformatted(args) : NULL;
        cJSON_Delete(args);
        if (!ok) {
            free(name);
            return 0;
        }
        added += new_call(t, name, a);
        p = fend ? fend + 11 : e;
    }
}

/* ---- Gemma 4: call:NAME{key:value,...} --------------------------------------- */

/* A string quoted by <|"|> (taken literally) or by '"' (JSON escapes). */
static cJSON *gemma_string(const char **p, const char *e) {
    if (starts(*p, e, GEMMA_QUOTE)) {
        const char *a = *p + 5, *q = find(a, e, GEMMA_QUOTE);
        if (!q) return NULL;
        *p = q + 5;
        char *s = strndup(a, (size_t)(q - a));
        cJSON *j = s ? cJSON_CreateString(s) : NULL;
        free(s);
        return j;
    }
    const char *q = *p + 1;
    while (q < e && *q != '"') q += *q == '\\' && q + 1 < e ? 2 : 1;
    if (q >= e) return NULL;
    cJSON *j = cJSON_ParseWithLength(*p, (size_t)(q + 1 - *p));
    *p = q + 1;
    return j;
}

static cJSON *gemma_value(const char **p, const char *e, int depth);

/* {k:v,...} with bare or quoted keys, or [v,...]; *p at the bracket. */
static cJSON *gemma_container(const char **p, const char *e, int depth) {
    int obj = **p == '{';
    char close = obj ? '}' : ']';
    cJSON *out = obj ? cJSON_CreateObject() : cJSON_CreateArray();
    const char *q = *p + 1;
    while (out) {
        while (q < e && is_ws(*q)) q++;
        if (q < e && *q == close) break; /* the end (a trailing comma is let go) */
        char *key = NULL;
        if (obj) {
            if (q < e && (*q == '"' || starts(q, e, GEMMA_QUOTE))) {
                cJSON *k = gemma_string(&q, e);
                key = cJSON_IsString(k) ? strdup(k->valuestring) : NULL;
                cJSON_Delete(k);
            } else {
                const char *a = q;
                while (q < e && *q != ':' && *q != ',' && *q != close && *q != '{') q++;
                const char *b = q;
                while (b > a && is_ws(b[-1])) b--;
                key = b > a ? strndup(a, (size_t)(b - a)) : NULL;
            }
            while (q < e && is_ws(*q)) q++;
            if (!key || q == e || *q != ':') {
                free(key);
                q = e;
                break;
            }
            q++;
        }
        cJSON *v = gemma_value(&q, e, depth + 1);
        int added = v && (obj ? cJSON_AddItemToObject(out, key, v) : cJSON_AddItemToArray(out, v));
        free(key);
        if (!added) {
            cJSON_Delete(v);
            q = e;
            break;
        }
        while (q < e && is_ws(*q)) q++;
        if (q < e && *q == ',') {
            q++;
            continue;
        }
        if (q < e && *q == close) break;
        q = e; /* neither: malformed */
        break;
    }
    if (!out || q >= e || *q != close) {
        cJSON_Delete(out);
        return NULL;
    }
    *p = q + 1;
    return out;
}

static cJSON *gemma_value(const char **p, const char *e, int depth) {
    const char *q = *p;
    while (q < e && is_ws(*q)) q++;
    if (q == e || depth > 64) return NULL;
    cJSON *v;
    if (*q == '"' || starts(q, e, GEMMA_QUOTE)) v = gemma_string(&q, e);
    else if (*q == '{' || *q == '[') v = gemma_container(&q, e, depth);
    else {
        /* A bare scalar: number, true/false, null (or Python's None). */
        const char *a = q;
        while (q < e && *q != ',' && *q != '}' && *q != ']') q++;
        const char *b = q;
        while (b > a && is_ws(b[-1])) b--;
        size_t n = (size_t)(b - a);
        const char *end = NULL;
        if (!n) return NULL;
        if ((n == 4 && !memcmp(a, "None", 4)) || (n == 4 && !memcmp(a, "null", 4))) v = cJSON_CreateNull();
        else if (n == 4 && !strncasecmp(a, "true", 4)) v = cJSON_CreateTrue();
        else if (n == 5 && !strncasecmp(a, "false", 5)) v = cJSON_CreateFalse();
        else if ((v = cJSON_ParseWithLengthOpts(a, n, &end, 0)) && (end != b || !cJSON_IsNumber(v))) {
            cJSON_Delete(v);
            v = NULL;
        }
        if (!v) { /* a bare word: keep it as text */
            char *s = strndup(a, n);
            v = s ? cJSON_CreateString(s) : NULL;
            free(s);
        }
    }
    if (v) *p = q;
    return v;
}

static int add_gemma(loom_toolscan *t, const char *p, const char *e) {
    int added = 0;
    for (;;) {
        while (p < e && is_ws(*p)) p++;
        if (p == e) return added;
        if (!starts(p, e, "call:")) return 0;
        p += 5;
        const char *a = p;
        while (p < e && *p != '{' && *p != '\n') p++;
        const char *b = p;
        while (b > a && is_ws(b[-1])) b--;
        if (p == e || *p != '{' || b == a) return 0;
        cJSON *args = gemma_container(&p, e, 0);
        if (!args) return 0;
        char *s = cJSON_PrintUnformatted(args);
        cJSON_Delete(args);
        added += new_call(t, strndup(a, (size_t)(b - a)), s);
    }
}

/* ---- tag regions ---------------------------------------------------------------- */

static int parse_body(loom_toolscan *t, int kind, const char *s, size_t n) {
    const char *p = s, *e = s + n;
    while (p < e && is_ws(*p)) p++;
    if (kind == BODY_GEMMA) return add_gemma(t, p, e);
    if (kind == BODY_TAGGED && starts(p, e, "<function=")) return add_xml(t, p, e);
    return add_json(t, p, (size_t)(e - p));
}

/* The region's body s[0..n) ended (closed: by its close marker). */
static void close_region(loom_toolscan *t, const char *s, size_t n, int closed, loom_buf *content) {
    int before = t->n_calls;
    int kind = t->marker >= 0 ? tags[t->marker].body : BODY_JSON;
    if (parse_body(t, kind, s, n) > 0) {
        t->after_call = 1;
        return;
    }
    /* Not a tool call after all: it is content. */
    drop_calls(t, before);
    if (t->marker >= 0) put_content(t, content, tags[t->marker].open, strlen(tags[t->marker].open));
    put_content(t, content, s, n);
    if (closed) put_content(t, content, tags[t->marker].close, strlen(tags[t->marker].close));
}

/* Moves pending text into the region and ends it at its close marker (or
 * at the end). Returns 1 when the region ended. */
static int region_step(loom_toolscan *t, int final, loom_buf *content) {
    loom_buf_put(&t->region, t->pending.p ? t->pending.p : "", t->pending.len);
    t->pending.len = 0;
    const char *close = t->marker >= 0 ? tags[t->marker].close : NULL;
    const char *r = t->region.p ? t->region.p : "";
    size_t n = t->region.len;
    if (close) {
        size_t cl = strlen(close);
        const char *hit = t->scanned < n ? memmem(r + t->scanned, n - t->scanned, close, cl) : NULL;
        if (hit) {
            size_t body = (size_t)(hit - r), after = body + cl;
            close_region(t, r, body, 1, content);
            /* the text after the call goes round again */
            loom_buf_put(&t->pending, r + after, n - after);
            t->region.len = 0;
            t->state = 0;
            return 1;
        }
        t->scanned = n >= cl ? n - cl + 1 : 0;
    }
    if (!final) return 0;
    close_region(t, r, n, 0, content);
    t->region.len = 0;
    t->state = 0;
    return 1;
}

static void run_tags(loom_toolscan *t, int final, loom_buf *content, loom_buf *reasoning) {
    for (;;) {
        if (t->state == 2) {
            if (!region_step(t, final, content)) break;
            continue;
        }
        char *s = t->pending.p ? t->pending.p : "";
        size_t n = t->pending.len;
        if (t->state == 1 && t->label) {
            /* Gemma 4 labels its reasoning: <|channel>thought\n... */
            static const char label[] = "thought\n";
            size_t k = LOOM_MIN(n, sizeof label - 1);
            if (k < sizeof label - 1 && !final && !memcmp(s, label, k)) break;
            size_t drop = k >= 7 && !memcmp(s, label, k) ? k : 0;
            memmove(s, s + drop, n - drop);
            t->pending.len = n -= drop;
            t->label = 0;
        }
        /* A bare JSON answer is a tool call when tools are on. */
        if (t->tools && bare_json_on(t) && t->state == 0 && !t->started && !t->content.len &&
            !t->n_calls) {
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            /* Blank so far: hold it, or a piece boundary would decide. */
            if (k == n && n && !final) break;
            /* "[TOOL_CALLS]" starts with '[' too: its marker decides. */
            int tagged = 0, maybe = 0;
            for (int i = 0; i < (int)LOOM_ARRAY_LEN(tags) && k < n; i++) {
                size_t m = strlen(tags[i].open), avail = n - k;
                if (tag_on(t, i) && !memcmp(s + k, tags[i].open, LOOM_MIN(m, avail)))
                    avail >= m ? (tagged = 1) : (maybe = 1);
            }
            if (maybe && !tagged && !final) break;
            if (k < n && (s[k] == '{' || s[k] == '[') && !tagged) {
                t->state = 2;
                t->marker = -1;
                t->scanned = 0;
                continue;
            }
        }
        size_t mlen = 0;
        int kind = 0, which = 0;
        const char *m = find_marker(t, s, n, &mlen, &kind, &which);
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
        if (kind == 0) {
            t->state = 1;
            t->label = t->syntax == LOOM_TC_GEMMA4;
        } else if (kind == 1) {
            t->state = 0;
            t->started = 0; /* drop the blank line after </think> */
        } else {
            t->state = 2;
            t->marker = which;
            t->scanned = 0;
        }
        size_t used = before + mlen;
        memmove(s, s + used, n - used);
        t->pending.len = n - used;
    }
}

/* ---- harmony --------------------------------------------------------------------- */

/* The header's channel and recipient decide where the body goes. */
static void harmony_header(loom_toolscan *t, const char *h, size_t n) {
    const char *e = h + n, *chan = NULL, *p = h;
    while ((p = find(p, e, "<|channel|>"))) chan = p += 11;
    size_t clen = 0;
    while (chan && chan + clen < e && !is_ws(chan[clen]) && chan[clen] != '<') clen++;
    t->name.len = 0;
    const char *to = find(h, e, "to=");
    if (to) {
        to += 3;
        const char *q = to;
        while (q < e && !is_ws(*q) && *q != '<') q++;
        if (starts(to, q, "functions.")) to += 10;
        loom_buf_put(&t->name, to, (size_t)(q - to));
    }
    if (t->tools && t->name.len) t->channel = 2;
    else t->channel = chan && clen == 8 && !memcmp(chan, "analysis", 8) ? 0 : 1;
}

static void harmony_call(loom_toolscan *t, loom_buf *content) {
    const char *s = t->region.p ? t->region.p : "";
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, t->region.len, &end, 0);
    while (end && end < s + t->region.len && is_ws(*end)) end++;
    if (j && end == s + t->region.len && new_call(t, strndup(t->name.p, t->name.len), cJSON_PrintUnformatted(j)))
        t->after_call = 1;
    else put_content(t, content, s, t->region.len);
    cJSON_Delete(j);
    t->region.len = 0;
}

static void run_harmony(loom_toolscan *t, int final, loom_buf *content, loom_buf *reasoning) {
    for (;;) {
        char *s = t->pending.p ? t->pending.p : "";
        size_t n = t->pending.len;
        if (t->state == 0) {
            loom_buf_put(&t->region, s, n);
            t->pending.len = 0;
            const char *r = t->region.p ? t->region.p : "";
            size_t rn = t->region.len;
            const char *hit = t->scanned < rn ? memmem(r + t->scanned, rn - t->scanned, "<|message|>", 11) : NULL;
            if (!hit) {
                t->scanned = rn >= 11 ? rn - 10 : 0;
                /* Text with no header at all is plain content. */
                if (final && !memmem(r, rn, "<|", 2)) put_content(t, content, r, rn);
                if (final) t->region.len = 0;
                break;
            }
            harmony_header(t, r, (size_t)(hit - r));
            size_t after = (size_t)(hit - r) + 11;
            loom_buf_put(&t->pending, r + after, rn - after);
            t->region.len = 0;
            t->scanned = 0;
            t->state = 1;
            continue;
        }
        const char *m = NULL;
        size_t mlen = 0, keep = 0;
        for (size_t i = 0; i < LOOM_ARRAY_LEN(harmony_ends); i++) {
            const char *h = memmem(s, n, harmony_ends[i], strlen(harmony_ends[i]));
            if (h && (!m || h < m)) m = h, mlen = strlen(harmony_ends[i]);
            if (!final) keep = LOOM_MAX(keep, partial(s, n, harmony_ends[i]));
        }
        size_t take = m ? (size_t)(m - s) : n - keep;
        if (t->channel == 2) loom_buf_put(&t->region, s, take);
        else if (t->channel == 0) out_reasoning(t, reasoning, s, take);
        else out_content(t, content, s, take);
        if (m || final) {
            if (t->channel == 2) harmony_call(t, content);
            t->state = 0;
        }
        size_t used = m ? take + mlen : take;
        memmove(s, s + used, n - used);
        t->pending.len = n - used;
        if (!m) break;
    }
}

void loom_toolscan_feed(loom_toolscan *t, const char *text, size_t len, int final, loom_buf *content,
                        loom_buf *reasoning) {
    loom_buf_put(&t->pending, text, len);
    if (t->syntax == LOOM_TC_HARMONY) run_harmony(t, final, content, reasoning);
    else run_tags(t, final, content, reasoning);
    if (final) t->pending.len = 0;
    if (t->pending.p) t->pending.p[t->pending.len] = 0;
}

/* ---- output ------------------------------------------------------------------------ */

static void put_call(const loom_tool_call *c, int index, loom_buf *b, int args) {
    loom_buf_puts(b, "{");
    if (index >= 0) loom_buf_printf(b, "\"index\":%d,", index);
    loom_buf_printf(b, "\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", c->id);
    api_put_json_str(b, c->name, strlen(c->name));
    loom_buf_puts(b, ",\"arguments\":");
    if (args) api_put_json_str(b, c->arguments, strlen(c->arguments));
    else loom_buf_puts(b, "\"\"");
    loom_buf_puts(b, "}}");
}

void loom_toolscan_put_calls(const loom_toolscan *t, loom_buf *b, int stream) {
    loom_buf_puts(b, "[");
    for (int i = 0; i < t->n_calls; i++) {
        if (i) loom_buf_puts(b, ",");
        put_call(&t->calls[i], stream ? i : -1, b, 1);
    }
    loom_buf_puts(b, "]");
}

int loom_toolscan_next_delta(loom_toolscan *t, loom_buf *b) {
    for (int i = 0; i < t->n_calls; i++) {
        loom_tool_call *c = &t->calls[i];
        if (c->sent == 2) continue;
        loom_buf_puts(b, "[");
        if (c->sent == 0) {
            put_call(c, i, b, 0);
        } else {
            loom_buf_printf(b, "{\"index\":%d,\"function\":{\"arguments\":", i);
            api_put_json_str(b, c->arguments, strlen(c->arguments));
            loom_buf_puts(b, "}}");
        }
        loom_buf_puts(b, "]");
        c->sent++;
        return 1;
    }
    return 0;
}

/* ---- which syntax ------------------------------------------------------------------- */

const char *loom_toolcall_syntax_name(loom_tc_syntax syntax) {
    static const char *const names[] = {"auto", "qwen", "gemma4", "llama3", "mistral", "harmony"};
    return (unsigned)syntax < LOOM_ARRAY_LEN(names) ? names[syntax] : "?";
}

static int has_token(const loom_tok *tok, const char *s) {
    return tok && loom_tok_token_to_id(tok, s, strlen(s)) >= 0;
}

/* The template's rendering of a conversation with one probe call (the
 * arguments as an object, else as a string); NULL when neither renders. */
static char *render_probe(const loom_chat_template *chat) {
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"loom_probe\",\"description\":\"probe\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}]";
    static const char *const messages[2] = {
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
        "[{\"id\":\"a1b2c3d4e\",\"type\":\"function\",\"function\":{\"name\":\"loom_probe\",\"arguments\":"
        "{\"a\":\"b\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"a1b2c3d4e\",\"name\":\"loom_probe\","
        "\"content\":\"r\"}]",
        /* templates that concatenate the arguments need them as a string */
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
        "[{\"id\":\"a1b2c3d4e\",\"type\":\"function\",\"function\":{\"name\":\"loom_probe\",\"arguments\":"
        "\"{\\\"a\\\":\\\"b\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"a1b2c3d4e\",\"name\":"
        "\"loom_probe\",\"content\":\"r\"}]",
    };
    for (int k = 0; k < 2; k++) {
        loom_chat_params cp = loom_chat_default_params();
        cp.messages_json = messages[k];
        cp.tools_json = tools;
        cp.add_generation_prompt = 1;
        char *out = NULL;
        if (loom_chat_apply(chat, &cp, &out, NULL) != LOOM_OK) {
            loom_err_clear();
            continue;
        }
        return out;
    }
    return NULL;
}

int loom_toolcall_xml_form(const loom_chat_template *chat) {
    char *out = chat ? render_probe(chat) : NULL;
    int xml = out && strstr(out, "<function=loom_probe>");
    free(out);
    return xml;
}

/* How the template renders a call in history is how the model writes one. */
static loom_tc_syntax from_template(const loom_chat_template *chat) {
    char *out = render_probe(chat);
    if (out) {
        loom_tc_syntax s = LOOM_TC_AUTO;
        if (strstr(out, "to=functions.loom_probe")) s = LOOM_TC_HARMONY;
        else if (strstr(out, "<|tool_call>call:loom_probe")) s = LOOM_TC_GEMMA4;
        else if (strstr(out, "<function=loom_probe>") || strstr(out, "<tool_call>")) s = LOOM_TC_QWEN;
        else if (strstr(out, "[TOOL_CALLS]")) s = LOOM_TC_MISTRAL;
        else if (strstr(out, "<|python_tag|>") || strstr(out, "\"parameters\": {\"a\": \"b\"}"))
            s = LOOM_TC_LLAMA3;
        free(out);
        return s;
    }
    return LOOM_TC_AUTO;
}

loom_tc_syntax loom_toolcall_detect(const loom_chat_template *chat, const loom_tok *tok) {
    loom_tc_syntax s = chat ? from_template(chat) : LOOM_TC_AUTO;
    if (s != LOOM_TC_AUTO) return s;
    if (has_token(tok, "<|channel|>") && has_token(tok, "<|message|>") && has_token(tok, "<|call|>"))
        return LOOM_TC_HARMONY;
    if (has_token(tok, "<|tool_call>") && has_token(tok, "<tool_call|>")) return LOOM_TC_GEMMA4;
    if (has_token(tok, "<tool_call>")) return LOOM_TC_QWEN;
    if (has_token(tok, "[TOOL_CALLS]")) return LOOM_TC_MISTRAL;
    if (has_token(tok, "<|python_tag|>")) return LOOM_TC_LLAMA3;
    return LOOM_TC_AUTO;
}

static int add_ids(const loom_tok *tok, const char *const *names, int32_t *out, int n, int cap) {
    for (; *names && n < cap; names++) {
        int32_t id = tok ? loom_tok_token_to_id(tok, *names, strlen(*names)) : -1;
        if (id >= 0 && loom_tok_is_special(tok, id)) out[n++] = id;
    }
    return n;
}

int loom_toolcall_keep_ids(loom_tc_syntax syntax, const loom_tok *tok, int tools, int32_t *out,
                           int cap) {
    static const char *const qwen[] = {"<tool_call>", "</tool_call>", NULL};
    static const char *const gemma[] = {"<|tool_call>", "<tool_call|>", "<|\"|>", NULL};
    static const char *const gemma_think[] = {"<|channel>", "<channel|>", NULL};
    static const char *const llama[] = {"<|python_tag|>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", NULL};
    static const char *const harmony[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                          "<|end|>", "<|call|>", "<|return|>", NULL};
    int n = 0;
    if (syntax == LOOM_TC_HARMONY) return add_ids(tok, harmony, out, n, cap);
    if (syntax == LOOM_TC_GEMMA4) n = add_ids(tok, gemma_think, out, n, cap);
    if (!tools) return n;
    if (syntax == LOOM_TC_AUTO || syntax == LOOM_TC_QWEN) n = add_ids(tok, qwen, out, n, cap);
    if (syntax == LOOM_TC_AUTO || syntax == LOOM_TC_GEMMA4) n = add_ids(tok, gemma, out, n, cap);
    if (syntax == LOOM_TC_AUTO || syntax == LOOM_TC_LLAMA3) n = add_ids(tok, llama, out, n, cap);
    if (syntax == LOOM_TC_AUTO || syntax == LOOM_TC_MISTRAL) n = add_ids(tok, mistral, out, n, cap);
    return n;
}

int loom_toolcall_open_ids(loom_tc_syntax syntax, const loom_tok *tok, int32_t *out, int cap) {
    static const struct {
        loom_tc_syntax syntax;
        const char *open;
    } opens[] = {{LOOM_TC_QWEN, "<tool_call>"}, {LOOM_TC_GEMMA4, "<|tool_call>"}, {LOOM_TC_LLAMA3, "<|python_tag|>"},
                 {LOOM_TC_MISTRAL, "[TOOL_CALLS]"}};
    int n = 0;
    for (size_t i = 0; i < sizeof opens / sizeof *opens && n < cap; i++) {
        if (syntax != LOOM_TC_AUTO && syntax != opens[i].syntax) continue;
        int32_t id = tok ? loom_tok_token_to_id(tok, opens[i].open, strlen(opens[i].open)) : -1;
        if (id >= 0) out[n++] = id;
    }
    return n;
}

int loom_toolcall_turn_end_ids(loom_tc_syntax syntax, const loom_tok *tok, int32_t *out, int cap) {
    if (syntax == LOOM_TC_HARMONY) {
        static const char *const ends[] = {"<|return|>", "<|call|>", NULL};
        int n = 0;
        for (const char *const *e = ends; *e && n < cap; e++) {
            int32_t id = loom_tok_token_to_id(tok, *e, strlen(*e));
            if (id >= 0) out[n++] = id;
        }
        if (n < cap && loom_tok_eos_id(tok) >= 0) out[n++] = loom_tok_eos_id(tok);
        return n;
    }
    int n = loom_tok_turn_end_ids(tok, out, cap);
    int32_t id = syntax == LOOM_TC_GEMMA4 ? loom_tok_token_to_id(tok, "<|tool_response>", 16) : -1;
    if (id >= 0 && n < cap) out[n++] = id;
    return n;
}
