/* api_messages: Anthropic's Messages request -> the chat request api_parse
 * reads. Content blocks become what chat templates render: text joins
 * into content, tool_use blocks into an assistant's tool_calls (arguments
 * as objects), tool_result blocks into tool messages ahead of the user's
 * text, thinking blocks into reasoning_content. */
#include "serve/api_messages.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "serve/json_field.h"

static int bad(api_error *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(api_error *err, const char *param, const char *fmt, ...) {
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_fail(err, 400, param, "%s", msg);
}

/* A string, or text blocks joined: system prompts and tool results. */
static int text_of(const cJSON *v, const char *param, loom_buf *b, api_error *err) {
    if (cJSON_IsString(v)) {
        loom_buf_puts(b, v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v)) return bad(err, param, "'%s' must be a string or an array of text blocks", param);
    int i = 0;
    for (const cJSON *blk = v->child; blk; blk = blk->next, i++) {
        const cJSON *type = json_get(blk, "type"), *text = json_get(blk, "text");
        char p[96];
        snprintf(p, sizeof p, "%s[%d]", param, i);
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "image"))
            return bad(err, p, "'%s': images are not supported here (text blocks only)", p);
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return bad(err, p, "'%s' must be a text block ({\"type\": \"text\", \"text\": ...}), found type %s",
                       p, cJSON_IsString(type) ? type->valuestring : "none");
        if (i) loom_buf_puts(b, "\n");
        loom_buf_puts(b, text->valuestring);
    }
    return 0;
}

/* An image block's source as a chat image_url part: base64 data becomes a
 * data: URL, a url source passes as it is (the chat path refuses what it
 * does not read, http(s) among them). NULL with err filled otherwise. */
static cJSON *image_part(const cJSON *blk, const char *p, api_error *err) {
    const cJSON *src = json_get(blk, "source"), *type = json_get(src, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    loom_buf url = {0};
    if (!strcmp(t, "base64")) {
        const cJSON *mt = json_get(src, "media_type"), *data = json_get(src, "data");
        if (!cJSON_IsString(mt) || !cJSON_IsString(data)) {
            bad(err, p, "'%s.source' (base64) needs a string 'media_type' and 'data'", p);
            return NULL;
        }
        loom_buf_printf(&url, "data:%s;base64,%s", mt->valuestring, data->valuestring);
    } else if (!strcmp(t, "url") && cJSON_IsString(json_get(src, "url"))) {
        loom_buf_puts(&url, json_get(src, "url")->valuestring);
    } else {
        bad(err, p, "'%s.source' must be {\"type\": \"base64\", \"media_type\", \"data\"} or "
            "{\"type\": \"url\", \"url\"}, found type %s", p, t[0] ? t : "none");
        return NULL;
    }
    cJSON *part = cJSON_CreateObject(), *iu = cJSON_AddObjectToObject(part, "image_url");
    cJSON_AddStringToObject(part, "type", "image_url");
    cJSON_AddStringToObject(iu, "url", url.p ? url.p : "");
    cJSON_AddStringToObject(part, "loom_param", p);
    loom_buf_free(&url);
    return part;
}

/* The text gathered so far as a text part of parts (then cleared). */
static void flush_text(cJSON *parts, loom_buf *text, int *n_text) {
    if (!*n_text) return;
    cJSON *tp = cJSON_CreateObject();
    cJSON_AddStringToObject(tp, "type", "text");
    cJSON_AddStringToObject(tp, "text", text->p ? text->p : "");
    cJSON_AddItemToArray(parts, tp);
    text->len = 0;
    if (text->p) text->p[0] = 0;
    *n_text = 0;
}

/* One Anthropic message -> one or more chat messages appended to out. */
static int translate_message(const cJSON *m, int idx, cJSON *out, api_error *err) {
    char param[96];
    snprintf(param, sizeof param, "messages[%d]", idx);
    if (!cJSON_IsObject(m)) return bad(err, param, "'%s' must be an object", param);
    const cJSON *role = json_get(m, "role"), *content = json_get(m, "content");
    snprintf(param, sizeof param, "messages[%d].role", idx);
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return bad(err, param, "'%s' must be \"user\" or \"assistant\", found %s", param,
                   cJSON_IsString(role) ? role->valuestring : role ? "a non-string" : "none");
    int user = !strcmp(role->valuestring, "user");
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (!content) return bad(err, param, "'%s' is required", param);
    if (cJSON_IsString(content)) {
        cJSON_AddItemToArray(out, json_message(role->valuestring, content->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(content)) return bad(err, param, "'%s' must be a string or an array of content blocks", param);
    loom_buf text = {0}, thinking = {0};
    cJSON *calls = NULL, *parts = NULL; /* parts: text and images in order, once there is an image */
    int i = 0, n_text = 0, n_img = 0, rc = 0;
    for (const cJSON *blk = content->child; blk && !rc; blk = blk->next, i++) {
        char p[128];
        snprintf(p, sizeof p, "messages[%d].content[%d]", idx, i);
        const cJSON *type = json_get(blk, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!cJSON_IsObject(blk) || !cJSON_IsString(type)) {
            rc = bad(err, p, "'%s' must be a content block object with a string 'type'", p);
        } else if (!strcmp(t, "text")) {
            const cJSON *s = json_get(blk, "text");
            if (!cJSON_IsString(s)) rc = bad(err, p, "'%s.text' must be a string", p);
            else loom_buf_printf(&text, "%s%s", n_text++ ? "\n" : "", s->valuestring);
        } else if (!strcmp(t, "image") && user) {
            cJSON *part = image_part(blk, p, err);
            if (!part) {
                rc = -1;
                continue;
            }
            if (!parts) parts = cJSON_CreateArray();
            flush_text(parts, &text, &n_text);
            cJSON_AddItemToArray(parts, part);
            n_img++;
        } else if (!strcmp(t, "document")) {
            rc = bad(err, p, "'%s': documents are not supported", p);
        } else if (!strcmp(t, "tool_use") && !user) {
            const cJSON *id = json_get(blk, "id"), *name = json_get(blk, "name"), *input = json_get(blk, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || (input && !cJSON_IsObject(input))) {
                rc = bad(err, p, "'%s' (tool_use) needs a string 'id' and 'name' and an object 'input'", p);
                continue;
            }
            if (!calls) calls = cJSON_CreateArray();
            cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(tc, "id", id->valuestring);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddItemToObject(fn, "arguments", input ? cJSON_Duplicate(input, 1) : cJSON_CreateObject());
            cJSON_AddItemToObject(tc, "function", fn);
            cJSON_AddItemToArray(calls, tc);
        } else if (!strcmp(t, "tool_result") && user) {
            const cJSON *id = json_get(blk, "tool_use_id"), *c = json_get(blk, "content");
            char cp[160];
            if (!cJSON_IsString(id)) {
                snprintf(cp, sizeof cp, "%s.tool_use_id", p);
                rc = bad(err, cp, "'%s' must be a string", cp);
                continue;
            }
            loom_buf r = {0};
            snprintf(cp, sizeof cp, "%s.content", p);
            if (c && text_of(c, cp, &r, err) < 0) rc = -1;
            else {
                cJSON *tm = json_message("tool", r.p ? r.p : "");
                cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
                cJSON_AddItemToArray(out, tm); /* results answer the calls, before any text */
            }
            loom_buf_free(&r);
        } else if ((!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) && !user) {
            const cJSON *s = json_get(blk, "thinking");
            if (cJSON_IsString(s)) loom_buf_puts(&thinking, s->valuestring);
        } else {
            rc = bad(err, p, "'%s': unsupported content block type '%s' in a%s %s message (expected text%s)", p,
                     t, user ? "" : "n", role->valuestring, user ? ", tool_result" : ", tool_use, thinking");
        }
    }
    if (!rc && (user ? n_text > 0 || n_img > 0 || cJSON_GetArraySize(content) == 0 : 1)) {
        /* "" rather than null: templates concatenate content */
        cJSON *msg = json_message(role->valuestring, text.p ? text.p : "");
        if (parts) {
            flush_text(parts, &text, &n_text);
            cJSON_ReplaceItemInObject(msg, "content", parts);
            parts = NULL;
        }
        if (thinking.len) cJSON_AddStringToObject(msg, "reasoning_content", thinking.p);
        if (calls) cJSON_AddItemToObject(msg, "tool_calls", calls), calls = NULL;
        cJSON_AddItemToArray(out, msg);
    }
    cJSON_Delete(calls);
    cJSON_Delete(parts);
    loom_buf_free(&text);
    loom_buf_free(&thinking);
    return rc;
}

/* tools: [{name, description, input_schema}] -> chat's function tools. */
static int translate_tools(const cJSON *in, cJSON *out, api_error *err) {
    const cJSON *tools = json_get(in, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return bad(err, "tools", "'tools' must be an array");
    cJSON *arr = cJSON_AddArrayToObject(out, "tools");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        char p[64];
        const cJSON *type = json_get(t, "type"), *name = json_get(t, "name"), *schema = json_get(t, "input_schema");
        snprintf(p, sizeof p, "tools[%d]", i);
        if (!cJSON_IsObject(t)) return bad(err, p, "'%s' must be an object", p);
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "custom")))
            return bad(err, p, "'%s': only client tools (name, description, input_schema) are supported, "
                       "found type %s", p, cJSON_IsString(type) ? type->valuestring : "non-string");
        snprintf(p, sizeof p, "tools[%d].name", i);
        if (!cJSON_IsString(name) || !name->valuestring[0]) return bad(err, p, "'%s' must be a non-empty string", p);
        snprintf(p, sizeof p, "tools[%d].input_schema", i);
        if (!cJSON_IsObject(schema)) return bad(err, p, "'%s' must be a JSON schema object", p);
        cJSON *fn = cJSON_CreateObject(), *tool = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "type", "function");
        json_copy(t, fn, "name", NULL);
        json_copy(t, fn, "description", NULL);
        json_copy(t, fn, "input_schema", "parameters");
        cJSON_AddItemToObject(tool, "function", fn);
        cJSON_AddItemToArray(arr, tool);
    }
    return 0;
}

/* tool_choice {type: auto|any|tool|none, name} -> auto, required, the named
 * function, none (whose tools are then not offered to the template). */
static int translate_tool_choice(const cJSON *in, cJSON *out, api_error *err) {
    const cJSON *tc = json_get(in, "tool_choice");
    if (!tc) return 0;
    const cJSON *type = json_get(tc, "type"), *name = json_get(tc, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type))
        return bad(err, "tool_choice", "'tool_choice' must be an object with a 'type' (auto, any, tool or none)");
    const char *t = type->valuestring;
    int n_tools = cJSON_GetArraySize(json_get(in, "tools"));
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(out, "tool_choice", t);
    } else if (!strcmp(t, "any") || !strcmp(t, "tool")) {
        if (!n_tools) return bad(err, "tool_choice", "'tool_choice' %s needs 'tools'", t);
        if (t[0] == 'a') {
            cJSON_AddStringToObject(out, "tool_choice", "required");
            return 0;
        }
        if (!cJSON_IsString(name)) return bad(err, "tool_choice.name", "'tool_choice.name' is required with type tool");
        cJSON *o = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name->valuestring);
    } else {
        return bad(err, "tool_choice.type", "'tool_choice.type' must be auto, any, tool or none, found '%s'", t);
    }
    return 0;
}

static int translate(const cJSON *in, int count, cJSON *out, api_error *err) {
    json_copy(in, out, "model", NULL);
    json_copy(in, out, "stream", NULL);
    if (!count) {
        if (!json_get(in, "max_tokens")) return bad(err, "max_tokens", "'max_tokens' is required");
        json_copy(in, out, "max_tokens", NULL);
    }
    const cJSON *temp = json_get(in, "temperature");
    if (temp && (!cJSON_IsNumber(temp) || temp->valuedouble < 0 || temp->valuedouble > 1))
        return bad(err, "temperature", "'temperature' must be a number between 0 and 1");
    json_copy(in, out, "temperature", NULL);
    json_copy(in, out, "top_p", NULL);
    json_copy(in, out, "top_k", NULL);
    /* loom's own sampling fields, as on the OpenAI routes */
    static const char *extra[] = {"seed", "ignore_eos", "min_p", "repetition_penalty", "cache_session_id", "logit_bias"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(extra); i++) json_copy(in, out, extra[i], NULL);
    const cJSON *stops = json_get(in, "stop_sequences");
    if (stops) {
        if (!cJSON_IsArray(stops) || cJSON_GetArraySize(stops) > API_MAX_STOPS)
            return bad(err, "stop_sequences", "'stop_sequences' must be an array of at most %d strings", API_MAX_STOPS);
        for (const cJSON *s = stops->child; s; s = s->next)
            if (!cJSON_IsString(s)) return bad(err, "stop_sequences", "'stop_sequences' must contain only strings");
        json_copy(in, out, "stop_sequences", "stop");
    }
    const cJSON *meta = json_get(in, "metadata"); /* user_id: nothing here uses it */
    if (meta && !cJSON_IsObject(meta)) return bad(err, "metadata", "'metadata' must be an object");
    const cJSON *th = json_get(in, "thinking");
    if (th) {
        const cJSON *type = json_get(th, "type");
        if (!cJSON_IsObject(th) || !cJSON_IsString(type) ||
            (strcmp(type->valuestring, "enabled") && strcmp(type->valuestring, "disabled")))
            return bad(err, "thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} "
                       "or {\"type\": \"disabled\"}");
        /* the switch reasoning templates read (Qwen 3's) */
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"), "enable_thinking",
                              type->valuestring[0] == 'e');
    }

    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    const cJSON *sys = json_get(in, "system");
    if (sys) {
        loom_buf b = {0};
        int rc = text_of(sys, "system", &b, err);
        if (!rc) cJSON_AddItemToArray(msgs, json_message("system", b.p ? b.p : ""));
        loom_buf_free(&b);
        if (rc) return -1;
    }
    const cJSON *in_msgs = json_get(in, "messages");
    if (!in_msgs) return bad(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(in_msgs) || !cJSON_GetArraySize(in_msgs))
        return bad(err, "messages", "'messages' must be a non-empty array");
    int i = 0;
    for (const cJSON *m = in_msgs->child; m; m = m->next, i++)
        if (translate_message(m, i, msgs, err) < 0) return -1;
    if (translate_tools(in, out, err) < 0 || translate_tool_choice(in, out, err) < 0) return -1;
    return 0;
}

int api_messages_parse(const char *body, size_t len, int vocab, int count, api_req *req,
                       cJSON **client, api_error *err) {
    memset(req, 0, sizeof *req);
    memset(err, 0, sizeof *err);
    *client = NULL;
    cJSON *in = api_parse_object(body, len, err), *out = cJSON_CreateObject();
    char *text = NULL;
    int rc = -1;
    if (in && out && translate(in, count, out, err) == 0) {
        text = cJSON_PrintUnformatted(out);
        if (!text) api_fail(err, 500, NULL, "out of memory");
        else rc = api_parse(API_CHAT, text, strlen(text), vocab, req, err);
    } else if (in && !out) {
        api_fail(err, 500, NULL, "out of memory");
    }
    free(text);
    cJSON_Delete(out);
    if (rc < 0) {
        cJSON_Delete(in);
        err->dialect = API_DIALECT_ANTHROPIC;
        return -1;
    }
    *client = in;
    return 0;
}
