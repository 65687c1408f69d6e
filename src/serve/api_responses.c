/* api_responses: OpenAI's Responses request -> the chat request api_parse
 * reads. Input items become chat messages (function_call items an
 * assistant's tool_calls, function_call_output items tool messages),
 * instructions a system message ahead of the conversation a
 * previous_response_id continues, text.format the response_format that
 * chat's structured output reads. */
#include "serve/api_messages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "serve/json_field.h"

/* The text gathered so far as a text part of parts (then cleared). */
static void flush_text(cJSON *parts, loom_buf *b) {
    if (!b->len) return;
    cJSON *tp = cJSON_CreateObject();
    cJSON_AddStringToObject(tp, "type", "text");
    cJSON_AddStringToObject(tp, "text", b->p);
    cJSON_AddItemToArray(parts, tp);
    b->len = 0;
    b->p[0] = 0;
}

/* A string, or content parts (input_text, output_text) joined. Where parts
 * is not NULL, input_image parts are taken too: *parts is then the chat
 * content array (text and image_url parts in order); else they are
 * refused. */
static int parts_text(const cJSON *v, const char *param, loom_buf *b, cJSON **parts, api_error *err) {
    if (cJSON_IsString(v)) {
        loom_buf_puts(b, v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v))
        return api_fail(err, 400, param, "'%s' must be a string or an array of content parts", param);
    int i = 0, n_text = 0;
    for (const cJSON *p = v->child; p; p = p->next, i++) {
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%d]", param, i);
        const cJSON *type = json_get(p, "type"), *text = json_get(p, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "input_image") && parts) {
            const cJSON *url = json_get(p, "image_url");
            if (!cJSON_IsString(url))
                return api_fail(err, 400, pp, "'%s.image_url' must be a string (a data: or file:// URL; "
                                "file_id is not supported)", pp);
            if (!*parts) *parts = cJSON_CreateArray();
            flush_text(*parts, b);
            n_text = 0;
            cJSON *ip = cJSON_CreateObject();
            cJSON_AddStringToObject(ip, "type", "image_url");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(ip, "image_url"), "url", url->valuestring);
            cJSON_AddStringToObject(ip, "loom_param", pp);
            cJSON_AddItemToArray(*parts, ip);
            continue;
        }
        if (!strcmp(t, "input_image") || !strcmp(t, "input_file"))
            return api_fail(err, 400, pp, "'%s': %s are not supported here", pp,
                            t[6] == 'i' ? "images" : "files");
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "refusal"))
            return api_fail(err, 400, pp, "'%s' must be an input_text or output_text part, found type %s", pp,
                            t[0] ? t : "none");
        if (!strcmp(t, "refusal")) text = json_get(p, "refusal");
        if (!cJSON_IsString(text)) return api_fail(err, 400, pp, "'%s.text' must be a string", pp);
        if (n_text++) loom_buf_puts(b, "\n");
        loom_buf_puts(b, text->valuestring);
    }
    if (parts && *parts) flush_text(*parts, b);
    return 0;
}

/* The assistant message a function_call item joins: the last message when
 * it is the assistant's, else a new one. */
static cJSON *assistant_for_call(cJSON *out) {
    int n = cJSON_GetArraySize(out);
    cJSON *last = n ? cJSON_GetArrayItem(out, n - 1) : NULL;
    const cJSON *role = json_get(last, "role");
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) {
        last = json_message("assistant", "");
        cJSON_AddItemToArray(out, last);
    }
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    return calls ? calls : cJSON_AddArrayToObject(last, "tool_calls");
}

static int input_item(const cJSON *it, const char *param, cJSON *out, api_error *err) {
    if (!cJSON_IsObject(it)) return api_fail(err, 400, param, "'%s' must be an object", param);
    const cJSON *type = json_get(it, "type"), *role = json_get(it, "role");
    const char *t = cJSON_IsString(type) ? type->valuestring : "message";
    char p[128];
    if (!strcmp(t, "message")) {
        snprintf(p, sizeof p, "%s.role", param);
        static const char *roles[] = {"user", "assistant", "system", "developer"};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(roles); k++) known |= cJSON_IsString(role) && !strcmp(role->valuestring, roles[k]);
        if (!known) return api_fail(err, 400, p, "'%s' must be user, assistant, system or developer", p);
        snprintf(p, sizeof p, "%s.content", param);
        const cJSON *content = json_get(it, "content");
        if (!content) return api_fail(err, 400, p, "'%s' is required", p);
        loom_buf b = {0};
        cJSON *parts = NULL;
        int rc = parts_text(content, p, &b, strcmp(role->valuestring, "user") ? NULL : &parts, err);
        if (!rc) {
            cJSON *m = json_message(role->valuestring, b.p ? b.p : "");
            if (parts) cJSON_ReplaceItemInObject(m, "content", parts), parts = NULL;
            cJSON_AddItemToArray(out, m);
        }
        cJSON_Delete(parts);
        loom_buf_free(&b);
        return rc;
    }
    if (!strcmp(t, "function_call")) {
        const cJSON *id = json_get(it, "call_id"), *name = json_get(it, "name"), *args = json_get(it, "arguments");
        if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
            return api_fail(err, 400, param, "'%s' (function_call) needs string 'call_id', 'name' and 'arguments'", param);
        cJSON *obj = cJSON_Parse(args->valuestring);
        if (!cJSON_IsObject(obj)) {
            cJSON_Delete(obj);
            snprintf(p, sizeof p, "%s.arguments", param);
            return api_fail(err, 400, p, "'%s' must be a JSON object as text", p);
        }
        cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(tc, "id", id->valuestring);
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        cJSON_AddItemToObject(fn, "arguments", obj); /* templates index arguments as objects */
        cJSON_AddItemToObject(tc, "function", fn);
        cJSON_AddItemToArray(assistant_for_call(out), tc);
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *id = json_get(it, "call_id"), *o = json_get(it, "output");
        snprintf(p, sizeof p, "%s.call_id", param);
        if (!cJSON_IsString(id)) return api_fail(err, 400, p, "'%s' must be a string", p);
        snprintf(p, sizeof p, "%s.output", param);
        if (!o) return api_fail(err, 400, p, "'%s' is required", p);
        loom_buf b = {0};
        int rc = parts_text(o, p, &b, NULL, err);
        if (!rc) {
            cJSON *m = json_message("tool", b.p ? b.p : "");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddItemToArray(out, m);
        }
        loom_buf_free(&b);
        return rc;
    }
    if (!strcmp(t, "reasoning")) return 0; /* earlier reasoning: templates drop it */
    snprintf(p, sizeof p, "%s.type", param);
    return api_fail(err, 400, p, "'%s' must be message, function_call or function_call_output, found '%s'", p, t);
}

int api_responses_input(const cJSON *in, cJSON *out, api_error *err) {
    const cJSON *input = json_get(in, "input");
    if (!input) return api_fail(err, 400, "input", "'input' is required");
    if (cJSON_IsString(input)) {
        cJSON_AddItemToArray(out, json_message("user", input->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(input) || !cJSON_GetArraySize(input))
        return api_fail(err, 400, "input", "'input' must be a string or a non-empty array of items");
    int i = 0;
    for (const cJSON *it = input->child; it; it = it->next, i++) {
        char p[48];
        snprintf(p, sizeof p, "input[%d]", i);
        if (input_item(it, p, out, err) < 0) return -1;
    }
    return 0;
}

/* tools: [{type: function, name, description, parameters}] -> chat's. */
static int translate_tools(const cJSON *in, cJSON *out, api_error *err) {
    const cJSON *tools = json_get(in, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return api_fail(err, 400, "tools", "'tools' must be an array");
    cJSON *arr = cJSON_AddArrayToObject(out, "tools");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        char p[48];
        const cJSON *type = json_get(t, "type"), *name = json_get(t, "name");
        snprintf(p, sizeof p, "tools[%d].type", i);
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return api_fail(err, 400, p, "'%s' must be \"function\" (the only tools run here are the client's)", p);
        snprintf(p, sizeof p, "tools[%d].name", i);
        if (!cJSON_IsString(name)) return api_fail(err, 400, p, "'%s' is required", p);
        cJSON *tool = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "type", "function");
        json_copy(t, fn, "name", NULL);
        json_copy(t, fn, "description", NULL);
        json_copy(t, fn, "parameters", NULL);
        cJSON_AddItemToObject(tool, "function", fn);
        cJSON_AddItemToArray(arr, tool);
    }
    const cJSON *tc = json_get(in, "tool_choice");
    if (cJSON_IsObject(tc)) { /* {type: function, name} -> chat's nesting */
        const cJSON *name = json_get(tc, "name");
        if (!cJSON_IsString(json_get(tc, "type")) || strcmp(json_get(tc, "type")->valuestring, "function") ||
            !cJSON_IsString(name))
            return api_fail(err, 400, "tool_choice", "'tool_choice' must be none, auto, required or "
                            "{\"type\": \"function\", \"name\": ...}");
        cJSON *o = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name->valuestring);
    } else {
        json_copy(in, out, "tool_choice", NULL);
    }
    return 0;
}

/* text.format {type: text | json_object | json_schema, name, schema,
 * strict} -> response_format. */
static int translate_format(const cJSON *in, cJSON *out, api_error *err) {
    const cJSON *text = json_get(in, "text");
    if (!text) return 0;
    const cJSON *fmt = json_get(text, "format");
    if (!cJSON_IsObject(text) || (fmt && !cJSON_IsObject(fmt)))
        return api_fail(err, 400, "text.format", "'text' must be an object whose 'format' is an object");
    if (!fmt) return 0;
    const cJSON *type = json_get(fmt, "type");
    if (!cJSON_IsString(type))
        return api_fail(err, 400, "text.format.type", "'text.format.type' must be text, json_object or json_schema");
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    cJSON_AddStringToObject(rf, "type", type->valuestring);
    if (!strcmp(type->valuestring, "json_schema")) {
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        static const char *keys[] = {"name", "description", "schema", "strict"};
        for (size_t i = 0; i < LOOM_ARRAY_LEN(keys); i++) json_copy(fmt, js, keys[i], NULL);
    }
    return 0;
}

static int translate(const cJSON *in, const cJSON *history, cJSON *out, api_error *err) {
    json_copy(in, out, "model", NULL);
    json_copy(in, out, "stream", NULL);
    json_copy(in, out, "max_output_tokens", "max_tokens");
    json_copy(in, out, "previous_response_id", NULL);
    static const char *same[] = {"temperature", "top_p", "top_k", "seed", "ignore_eos", "min_p",
                                 "repetition_penalty", "cache_session_id"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(same); i++) json_copy(in, out, same[i], NULL);
    const cJSON *reasoning = json_get(in, "reasoning"), *effort = json_get(reasoning, "effort");
    if (reasoning && (!cJSON_IsObject(reasoning) || (effort && !cJSON_IsString(effort))))
        return api_fail(err, 400, "reasoning", "'reasoning' must be an object with a string 'effort'");
    /* the switch reasoning templates read (gpt-oss's) */
    if (effort) cJSON_AddStringToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"), "reasoning_effort",
                                        effort->valuestring);
    const cJSON *store = json_get(in, "store"), *ins = json_get(in, "instructions");
    if (store && !cJSON_IsBool(store)) return api_fail(err, 400, "store", "'store' must be a boolean");
    if (ins && !cJSON_IsString(ins)) return api_fail(err, 400, "instructions", "'instructions' must be a string");
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    /* instructions are this request's alone: a continued conversation
     * does not carry the earlier ones */
    if (ins) cJSON_AddItemToArray(msgs, json_message("system", ins->valuestring));
    for (const cJSON *m = history ? history->child : NULL; m; m = m->next)
        cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, 1));
    if (api_responses_input(in, msgs, err) < 0) return -1;
    return translate_tools(in, out, err) < 0 || translate_format(in, out, err) < 0 ? -1 : 0;
}

int api_responses_parse(const cJSON *in, const cJSON *history, int vocab, api_req *req,
                        api_error *err) {
    memset(req, 0, sizeof *req);
    memset(err, 0, sizeof *err);
    cJSON *out = cJSON_CreateObject();
    if (!out) return api_fail(err, 500, NULL, "out of memory");
    int rc = translate(in, history, out, err);
    char *text = rc == 0 ? cJSON_PrintUnformatted(out) : NULL;
    cJSON_Delete(out);
    if (rc == 0 && !text) rc = api_fail(err, 500, NULL, "out of memory");
    if (rc == 0) {
        rc = api_parse(API_CHAT, text, strlen(text), vocab, req, err);
        /* the field as the client named it */
        if (rc < 0 && !strcmp(err->param, "max_tokens")) {
            snprintf(err->param, sizeof err->param, "max_output_tokens");
            snprintf(err->message, sizeof err->message, "'max_output_tokens' must be an integer of at least 1");
        }
    }
    free(text);
    return rc;
}
