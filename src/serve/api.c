/* api: OpenAI request parsing and validation, JSON string building. */
#include "serve/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "serve/json_field.h"
#include "serve/media.h"

int api_fail(api_error *err, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->status = status;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->type = status == 401   ? "authentication_error"
                : status == 404 ? "not_found_error"
                : status == 429 ? "rate_limit_error"
                : status >= 500 ? "server_error"
                                : "invalid_request_error";
    err->code = NULL;
    return -1;
}

/* ---- JSON text ----------------------------------------------------------- */

void api_put_json_str(loom_buf *b, const char *s, size_t n) {
    loom_buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        }
        if (!esc) continue;
        loom_buf_put(b, s + run, i - run);
        loom_buf_puts(b, esc);
        run = i + 1;
    }
    loom_buf_put(b, s + run, n - run);
    loom_buf_put(b, "\"", 1);
}

/* Anthropic names its error types by status. */
static const char *anthropic_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *api_error_json(const api_error *err) {
    loom_buf b = {0};
    if (err->dialect == API_DIALECT_ANTHROPIC) {
        loom_buf_printf(&b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":",
                        anthropic_type(err->status));
        api_put_json_str(&b, err->message, strlen(err->message));
        loom_buf_puts(&b, "}}");
        return b.oom ? (loom_buf_free(&b), NULL) : b.p;
    }
    loom_buf_puts(&b, "{\"error\":{\"message\":");
    api_put_json_str(&b, err->message, strlen(err->message));
    loom_buf_printf(&b, ",\"type\":\"%s\",\"param\":", err->type ? err->type : "invalid_request_error");
    if (err->param[0]) api_put_json_str(&b, err->param, strlen(err->param));
    else loom_buf_puts(&b, "null");
    loom_buf_puts(&b, ",\"code\":");
    if (err->code) api_put_json_str(&b, err->code, strlen(err->code));
    else loom_buf_puts(&b, "null");
    loom_buf_puts(&b, "}}");
    if (b.oom) {
        loom_buf_free(&b);
        return NULL;
    }
    return b.p;
}

/* ---- field readers ------------------------------------------------------ */

static const cJSON *field(const api_req *r, const char *k) {
    return json_get(r->body, k);
}

static int get_number(const api_req *r, const char *k, double lo, double hi, double *out,
                      api_error *err) {
    const cJSON *v = field(r, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v))
        return api_fail(err, 400, k, "'%s' must be a number", k);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return api_fail(err, 400, k, "'%s' must be between %g and %g, got %g", k, lo, hi,
                        v->valuedouble);
    *out = v->valuedouble;
    return 1;
}

static int get_int(const api_req *r, const char *k, long lo, long hi, int *out, api_error *err) {
    const cJSON *v = field(r, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return api_fail(err, 400, k, "'%s' must be an integer", k);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return api_fail(err, 400, k, "'%s' must be between %ld and %ld, got %.0f", k, lo, hi,
                        v->valuedouble);
    *out = (int)v->valuedouble;
    return 1;
}

static int get_bool(const api_req *r, const char *k, int *out, api_error *err) {
    const cJSON *v = field(r, k);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return api_fail(err, 400, k, "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(v);
    return 1;
}

/* Token id arrays: [1, 2, 3]. */
static int get_ids(const cJSON *v, const char *param, int vocab, int32_t **out, int *n,
                   api_error *err) {
    int cnt = cJSON_GetArraySize(v);
    if (cnt == 0) return api_fail(err, 400, param, "'%s' is empty", param);
    int32_t *ids = malloc(sizeof *ids * (size_t)cnt);
    if (!ids) return api_fail(err, 500, NULL, "out of memory");
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= vocab) {
            free(ids);
            return api_fail(err, 400, param,
                            "'%s'[%d] must be a token id in [0, %d)", param, i, vocab);
        }
        ids[i] = (int32_t)e->valuedouble;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

/* Content as the template sees it: a string, or text parts joined; with
 * images, the parts in order, {"type": "text", "text"} and {"type":
 * "image"} (the image's URL kept in r->image_urls, out of the template's
 * way), as the vision-language templates read them. */
static int normalise_content(api_req *r, cJSON *msg, int idx, api_error *err) {
    cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) return 0;
    if (!cJSON_IsArray(c))
        return api_fail(err, 400, param, "'%s' must be a string or an array of content parts", param);
    loom_buf b = {0};
    int first = 1, k = 0, images = 0;
    cJSON *parts = cJSON_CreateArray();
    if (!parts) return api_fail(err, 500, NULL, "out of memory");
    for (const cJSON *part = c->child; part; part = part->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        char pp[48];
        snprintf(pp, sizeof pp, "messages[%d].content[%d]", idx % 100000, k % 100000);
        /* a part translated from another API names itself as its client sent it */
        const cJSON *as = cJSON_GetObjectItemCaseSensitive(part, "loom_param");
        if (cJSON_IsString(as)) snprintf(pp, sizeof pp, "%s", as->valuestring);
        cJSON *np = NULL;
        if (cJSON_IsString(part)) text = part;
        if (api_media_is_image(part)) {
            const char *url;
            if (api_media_url(part, pp, &url, err) < 0) goto fail;
            if (r->n_images == API_MAX_IMAGES) {
                api_fail(err, 400, pp, "'%s': too many images: a request takes at most %d", pp,
                         API_MAX_IMAGES);
                goto fail;
            }
            snprintf(r->image_params[r->n_images], sizeof r->image_params[0], "%s", pp);
            if (!(r->image_urls[r->n_images++] = strdup(url))) goto oom;
            np = cJSON_CreateObject();
            if (!np || !cJSON_AddStringToObject(np, "type", "image")) goto oom_np;
            images++;
        } else if (cJSON_IsString(part) || (cJSON_IsString(type) && !strcmp(type->valuestring, "text") &&
                                            cJSON_IsString(text))) {
            if (!first) loom_buf_put(&b, "\n", 1);
            loom_buf_puts(&b, text->valuestring);
            first = 0;
            np = cJSON_CreateObject();
            if (!np || !cJSON_AddStringToObject(np, "type", "text") ||
                !cJSON_AddStringToObject(np, "text", text->valuestring))
                goto oom_np;
        } else {
            api_fail(err, 400, pp, "'%s': unknown content part type '%s' (expected text or "
                     "image_url)", pp, cJSON_IsString(type) ? type->valuestring : "?");
            goto fail;
        }
        cJSON_AddItemToArray(parts, np);
        continue;
    oom_np:
        cJSON_Delete(np);
        goto oom;
    }
    cJSON *s = images ? parts : cJSON_CreateString(b.p ? b.p : "");
    loom_buf_free(&b);
    if (!images) cJSON_Delete(parts);
    if (!s) return api_fail(err, 500, NULL, "out of memory");
    cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", s);
    return 0;
oom:
    api_fail(err, 500, NULL, "out of memory");
fail:
    loom_buf_free(&b);
    cJSON_Delete(parts);
    return -1;
}

/* Templates index tool-call arguments as objects; OpenAI sends strings. */
static void arguments_to_objects(cJSON *msg) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    for (cJSON *tc = cJSON_IsArray(calls) ? calls->child : NULL; tc; tc = tc->next) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(args)) continue;
        cJSON *obj = cJSON_Parse(args->valuestring);
        if (cJSON_IsObject(obj)) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj);
        else cJSON_Delete(obj);
    }
}

static int parse_messages(api_req *r, api_error *err) {
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(r->body, "messages");
    if (!msgs) return api_fail(err, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return api_fail(err, 400, "messages", "'messages' must be a non-empty array");
    int i = 0;
    for (cJSON *m = msgs->child; m; m = m->next, i++) {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return api_fail(err, 400, param, "'%s' must be an object", param);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role))
            return api_fail(err, 400, param, "'%s' must be a string", param);
        static const char *roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(roles); k++) known |= !strcmp(role->valuestring, roles[k]);
        if (!known)
            return api_fail(err, 400, param, "'%s' must be one of system, developer, user, "
                            "assistant, tool; got '%s'", param, role->valuestring);
        if (normalise_content(r, m, i, err)) return -1;
        arguments_to_objects(m);
    }
    r->messages_json = cJSON_PrintUnformatted(msgs);
    if (!r->messages_json) return api_fail(err, 500, NULL, "out of memory");
    return 0;
}

/* tool_choice: "none", "auto", "required" or {"type": "function",
 * "function": {"name": ...}} naming one of the tools. Without tools only
 * "none" and "auto" mean anything. */
static int parse_tool_choice(api_req *r, const cJSON *tools, api_error *err) {
    int n_tools = cJSON_GetArraySize(tools);
    const cJSON *tc = field(r, "tool_choice");
    r->tool_choice = tools ? "auto" : "none";
    if (!tc) return 0;
    if (cJSON_IsString(tc)) {
        if (strcmp(tc->valuestring, "none") && strcmp(tc->valuestring, "auto") &&
            strcmp(tc->valuestring, "required"))
            return api_fail(err, 400, "tool_choice",
                            "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}, got '%s'", tc->valuestring);
        if (!strcmp(tc->valuestring, "required") && !n_tools)
            return api_fail(err, 400, "tool_choice", "'tool_choice' is required, but there are no tools");
        r->tool_choice = tc->valuestring;
        return 0;
    }
    if (!cJSON_IsObject(tc))
        return api_fail(err, 400, "tool_choice", "'tool_choice' must be a string or an object");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return api_fail(err, 400, "tool_choice", "'tool_choice.type' must be \"function\"");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
    if (!cJSON_IsString(name))
        return api_fail(err, 400, "tool_choice", "'tool_choice.function.name' is required");
    for (const cJSON *t = n_tools ? tools->child : NULL; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, name->valuestring)) {
            r->tool_choice = name->valuestring;
            return 0;
        }
    }
    return api_fail(err, 400, "tool_choice", "tool_choice names function '%s', which is not in tools",
                    name->valuestring);
}

/* Schemas are translated here (no vocabulary needed), so what loom cannot
 * keep is a 400 naming it before any work; strict: what it would only
 * approximate too. */
static int check_schema(const char *param, const char *src, int strict, api_error *err) {
    char msg[400];
    char *g = loom_grammar_schema_to_gbnf_ex(src, strict ? LOOM_SCHEMA_STRICT : 0, msg, sizeof msg);
    if (!g) return api_fail(err, 400, param, "'%s' cannot be used: %s", param, msg);
    free(g);
    return 0;
}

/* A tool with "strict": true promises arguments that validate: its
 * parameters must be a schema loom writes exactly (tools_to_gbnf reads
 * the flag). */
static int check_strict_tool(const cJSON *t, int i, api_error *err) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"))) return 0;
    cJSON *one = cJSON_CreateArray();
    cJSON_AddItemToArray(one, cJSON_Duplicate(t, 1));
    char *j = cJSON_PrintUnformatted(one), msg[400], param[64];
    cJSON_Delete(one);
    if (!j) return api_fail(err, 500, NULL, "out of memory");
    loom_gtool_syntax syn = {"", "", "", "", NULL, "arguments", 1};
    char *g = loom_grammar_tools_to_gbnf(j, NULL, &syn, msg, sizeof msg);
    free(j);
    if (g) return free(g), 0;
    snprintf(param, sizeof param, "tools[%d].function.parameters", i);
    return api_fail(err, 400, param, "strict %s", msg);
}

static int parse_tools(api_req *r, api_error *err) {
    const cJSON *tools = field(r, "tools");
    if (tools && !cJSON_IsArray(tools)) return api_fail(err, 400, "tools", "'tools' must be an array");
    int i = 0;
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(name)) {
            char param[48];
            snprintf(param, sizeof param, "tools[%d].function.name", i);
            return api_fail(err, 400, param, "'%s' is required", param);
        }
        if (check_strict_tool(t, i, err) < 0) return -1;
    }
    if (parse_tool_choice(r, tools, err) < 0) return -1;
    /* "none" keeps the tools in the prompt (the model sees them, as with
       OpenAI); the job bans the call markers instead */
    if (!tools) return 0;
    r->tools_json = cJSON_PrintUnformatted(tools);
    if (!r->tools_json) return api_fail(err, 500, NULL, "out of memory");
    return 0;
}

static int parse_stop(api_req *r, api_error *err) {
    const cJSON *st = field(r, "stop");
    if (!st) return 0;
    if (cJSON_IsString(st)) {
        r->stops[r->n_stops++] = st->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(st)) return api_fail(err, 400, "stop", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(st) > API_MAX_STOPS)
        return api_fail(err, 400, "stop", "'stop' has more than %d strings", API_MAX_STOPS);
    for (const cJSON *e = st->child; e; e = e->next) {
        if (!cJSON_IsString(e)) return api_fail(err, 400, "stop", "'stop' must contain only strings");
        r->stops[r->n_stops++] = e->valuestring;
    }
    return 0;
}

loom_sampling api_sampling_default(void) {
    loom_sampling s = loom_sampling_default();
    s.temperature = 1.0f;
    s.penalty_last_n = -1;
    return s;
}

static int parse_sampling(api_req *r, int vocab, api_error *err) {
    loom_sampling *s = &r->sampling;
    *s = api_sampling_default();
    double d;
    int k;
    /* bit: the field's LOOM_SAMPLING_* bit, for the server's defaults */
#define NUM(key, lo, hi, dst, bit) \
    if ((k = get_number(r, key, lo, hi, &d, err)) < 0) return -1; \
    if (k) dst = (float)d, r->sampling_given |= (bit);
    NUM("temperature", 0, 2, s->temperature, LOOM_SAMPLING_TEMPERATURE);
    NUM("top_p", 1e-9, 1, s->top_p, LOOM_SAMPLING_TOP_P);
    NUM("min_p", 0, 1, s->min_p, LOOM_SAMPLING_MIN_P);
    NUM("presence_penalty", -2, 2, s->presence_penalty, 0);
    NUM("frequency_penalty", -2, 2, s->frequency_penalty, 0);
    NUM("repetition_penalty", 1e-6, 100, s->repetition_penalty, LOOM_SAMPLING_REPETITION_PENALTY);
    NUM("xtc_probability", 0, 1, s->xtc_probability, 0);
    NUM("xtc_threshold", 0, 1, s->xtc_threshold, 0);
#undef NUM
    if (get_int(r, "top_k", -1, 1 << 30, &k, err) < 0) return -1;
    if (field(r, "top_k")) s->top_k = k < 0 ? 0 : k, r->sampling_given |= LOOM_SAMPLING_TOP_K;
    const cJSON *seed = field(r, "seed");
    if (seed) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble))
            return api_fail(err, 400, "seed", "'seed' must be an integer");
        /* A double outside the target type makes the conversion undefined. */
        double v = seed->valuedouble;
        if (!(v >= -9223372036854775808.0 && v < 18446744073709551616.0))
            return api_fail(err, 400, "seed", "'seed' must fit in 64 bits, got %g", v);
        s->seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
        r->seed_given = 1;
    }
    const cJSON *lb = field(r, "logit_bias");
    if (lb) {
        if (!cJSON_IsObject(lb)) return api_fail(err, 400, "logit_bias", "'logit_bias' must be an object");
        int n = cJSON_GetArraySize(lb);
        r->bias = calloc((size_t)(n + 1), sizeof *r->bias);
        if (!r->bias) return api_fail(err, 500, NULL, "out of memory");
        for (const cJSON *e = lb->child; e; e = e->next) {
            char *end;
            long id = strtol(e->string, &end, 10);
            if (*end || end == e->string || id < 0 || id >= vocab)
                return api_fail(err, 400, "logit_bias",
                                "'logit_bias' keys must be token ids in [0, %d), got '%s'", vocab,
                                e->string);
            if (!cJSON_IsNumber(e) || e->valuedouble < -100 || e->valuedouble > 100)
                return api_fail(err, 400, "logit_bias", "'logit_bias' values must be in [-100, 100]");
            r->bias[s->n_logit_bias++] =
                (loom_logit_bias){(int32_t)id, e->valuedouble <= -100 ? -INFINITY : (float)e->valuedouble};
        }
        s->logit_bias = r->bias;
    }
    return 0;
}

/* ---- constrained output ------------------------------------------------- */

static int set_grammar(api_req *r, api_grammar g, const char *param, char *src, api_error *err) {
    if (r->grammar) {
        free(src);
        return api_fail(err, 400, param, "'%s' and '%s' both constrain the output: give one", r->grammar_param, param);
    }
    if (g != API_GRAMMAR_JSON_OBJECT && !src) return api_fail(err, 500, NULL, "out of memory");
    r->grammar = g;
    r->grammar_src = src;
    r->grammar_param = param;
    return 0;
}

/* response_format (OpenAI), grammar (GBNF, as llama.cpp's server), regex,
 * and vLLM's guided_json / guided_regex / guided_grammar. */
static int parse_grammar(api_req *r, api_error *err) {
    const cJSON *rf = field(r, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(t) ||
            (strcmp(t->valuestring, "text") && strcmp(t->valuestring, "json_object") && strcmp(t->valuestring, "json_schema")))
            return api_fail(err, 400, "response_format", "'response_format.type' must be text, json_object or json_schema");
        if (!strcmp(t->valuestring, "json_object") && set_grammar(r, API_GRAMMAR_JSON_OBJECT, "response_format", NULL, err))
            return -1;
        if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
            const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
            if (!cJSON_IsObject(js))
                return api_fail(err, 400, "response_format", "'response_format.json_schema' must be an object");
            if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
                return api_fail(err, 400, "response_format", "'response_format.json_schema.strict' must be a boolean");
            if (sc && !cJSON_IsObject(sc) && !cJSON_IsBool(sc))
                return api_fail(err, 400, "response_format", "'response_format.json_schema.schema' must be an object");
            /* no schema: any JSON object, as OpenAI's json_object */
            if (set_grammar(r, sc ? API_GRAMMAR_JSON_SCHEMA : API_GRAMMAR_JSON_OBJECT, "response_format",
                            sc ? cJSON_PrintUnformatted(sc) : NULL, err))
                return -1;
            if (sc && check_schema("response_format", r->grammar_src, cJSON_IsTrue(strict), err)) return -1;
        }
    }
    static const struct {
        const char *name;
        api_grammar g;
    } ext[] = {{"grammar", API_GRAMMAR_GBNF}, {"guided_grammar", API_GRAMMAR_GBNF}, {"regex", API_GRAMMAR_REGEX},
               {"guided_regex", API_GRAMMAR_REGEX}, {"guided_json", API_GRAMMAR_JSON_SCHEMA}};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
        const cJSON *v = field(r, ext[i].name);
        if (!v || cJSON_IsNull(v)) continue;
        char *src = NULL;
        if (ext[i].g == API_GRAMMAR_JSON_SCHEMA && (cJSON_IsObject(v) || cJSON_IsString(v)))
            src = cJSON_IsObject(v) ? cJSON_PrintUnformatted(v) : strdup(v->valuestring);
        else if (cJSON_IsString(v) && v->valuestring[0]) src = strdup(v->valuestring);
        else return api_fail(err, 400, ext[i].name, "'%s' must be a non-empty string%s", ext[i].name,
                             ext[i].g == API_GRAMMAR_JSON_SCHEMA ? " or a schema object" : "");
        if (set_grammar(r, ext[i].g, ext[i].name, src, err)) return -1;
        if (ext[i].g == API_GRAMMAR_JSON_SCHEMA && check_schema(ext[i].name, r->grammar_src, 0, err)) return -1;
    }
    return 0;
}

/* ---- body checks ---------------------------------------------------------- */

/* Offset of the first \u0000 escape in a JSON text, or -1. Backslashes
 * occur only inside strings, each escaping the next character, so "\\"
 * followed by "u0000" is a backslash and text, not a NUL. */
static long nul_escape(const char *s, size_t n) {
    for (size_t i = 0; i + 6 <= n; i++) {
        if (s[i] != '\\') continue;
        if (!memcmp(s + i + 1, "u0000", 5)) return (long)i;
        i++; /* the escaped character */
    }
    return -1;
}

/* The field of a valid JSON text whose string holds byte `at`, as
 * "messages[1].content" (a key's own string names that key). For error
 * messages: nesting past 16 levels is left out. */
static void json_path_at(const char *s, size_t n, size_t at, char *out, size_t cap) {
    typedef struct { int arr, index, want_key; const char *key; size_t key_len; } level;
    level st[16];
    int depth = 0;
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '{' || c == '[') {
            if (depth < 16) st[depth] = (level){c == '[', 0, c == '{', NULL, 0};
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth > 0 && depth <= 16) {
            if (st[depth - 1].arr) st[depth - 1].index++;
            else st[depth - 1].want_key = 1;
        } else if (c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
            j = LOOM_MIN(j, n);
            if (depth > 0 && depth <= 16 && !st[depth - 1].arr && st[depth - 1].want_key) {
                st[depth - 1].key = s + i + 1;
                st[depth - 1].key_len = j - i - 1;
                st[depth - 1].want_key = 0;
            }
            if (at > i && at < j) break;
            i = j;
        }
    }
    size_t w = 0;
    for (int d = 0; d < depth && d < 16 && w + 1 < cap; d++) {
        int k = st[d].arr ? snprintf(out + w, cap - w, "[%d]", st[d].index)
                : st[d].key ? snprintf(out + w, cap - w, "%s%.*s", d ? "." : "",
                                       (int)st[d].key_len, st[d].key)
                            : 0;
        w += (size_t)LOOM_MAX(k, 0);
    }
}

/* cJSON ends its strings at a NUL, so text after a \u0000 escape would
 * be dropped without a word: it is refused, naming the field. Runs on a
 * body that parsed. */
static int check_nul_escape(const char *body, size_t len, api_error *err) {
    long at = nul_escape(body, len);
    if (at < 0) return 0;
    char path[64];
    json_path_at(body, len, (size_t)at, path, sizeof path);
    return api_fail(err, 400, path, "'%s' contains a NUL character (\\u0000), which is not accepted",
                    path[0] ? path : "(a key)");
}

/* Only JSON whitespace may follow the value. */
static int only_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p == end;
}

cJSON *api_parse_object(const char *body, size_t len, api_error *err) {
    memset(err, 0, sizeof *err);
    const char *end = NULL;
    /* Everything downstream (templates, tokenizer, JSON out) expects UTF-8. */
    if (!loom_utf8_valid(body, len)) {
        api_fail(err, 400, NULL, "the request body is not valid UTF-8");
        return NULL;
    }
    /* cJSON takes a raw NUL for whitespace, or for the end of a string */
    const char *nul = memchr(body, 0, len);
    if (nul) {
        api_fail(err, 400, NULL, "the request body contains a NUL byte (at byte %zu)",
                 (size_t)(nul - body));
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!o) {
        size_t at = end ? (size_t)(end - body) : 0;
        api_fail(err, 400, NULL, "the request body is not valid JSON (error near byte %zu)", at);
    } else if (!end || !only_space(end, body + len)) {
        api_fail(err, 400, NULL, "the request body has text after the JSON value (at byte %zu)",
                 end ? (size_t)(end - body) : 0);
    } else if (!cJSON_IsObject(o)) {
        api_fail(err, 400, NULL, "the request body must be a JSON object");
    } else if (check_nul_escape(body, len, err) == 0) {
        return o;
    }
    cJSON_Delete(o);
    return NULL;
}

int api_parse(api_kind kind, const char *body, size_t len, int vocab, api_req *r, api_error *err) {
    memset(r, 0, sizeof *r);
    memset(err, 0, sizeof *err);
    r->kind = kind;
    r->max_tokens = -1;
    r->logprobs = -1;
    r->n = 1;
    if (!(r->body = api_parse_object(body, len, err))) goto fail;
    const cJSON *model = field(r, "model");
    if (model && !cJSON_IsString(model)) {
        api_fail(err, 400, "model", "'model' must be a string");
        goto fail;
    }
    r->model = model ? model->valuestring : NULL;
    if (get_bool(r, "stream", &r->stream, err) < 0) goto fail;
    const cJSON *so = field(r, "stream_options");
    if (so) {
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (!cJSON_IsObject(so) || (iu && !cJSON_IsBool(iu))) {
            api_fail(err, 400, "stream_options", "'stream_options' must be an object with a boolean include_usage");
            goto fail;
        }
        r->include_usage = cJSON_IsTrue(iu);
    }
    if (get_int(r, "n", 1, API_MAX_N, &r->n, err) < 0) goto fail;
    /* completions: 0 with echo scores the prompt alone (checked below) */
    if (get_int(r, "max_tokens", kind == API_COMPLETION ? 0 : 1, 1 << 24, &r->max_tokens, err) < 0)
        goto fail;
    if (get_int(r, "max_completion_tokens", 1, 1 << 24, &r->max_tokens, err) < 0) goto fail;
    if (get_bool(r, "ignore_eos", &r->ignore_eos, err) < 0) goto fail;
    if (get_bool(r, "loom_trace", &r->trace, err) < 0) goto fail;
    const cJSON *sid = field(r, "cache_session_id");
    if (sid && (!cJSON_IsString(sid) || strlen(sid->valuestring) > 200)) {
        api_fail(err, 400, "cache_session_id", "'cache_session_id' must be a string of at most 200 bytes");
        goto fail;
    }
    r->cache_session_id = sid ? sid->valuestring : NULL;
    const cJSON *prev = field(r, "previous_response_id");
    if (prev && !cJSON_IsNull(prev) && (!cJSON_IsString(prev) || strlen(prev->valuestring) > 200)) {
        api_fail(err, 400, "previous_response_id",
                 "'previous_response_id' must be a string of at most 200 bytes");
        goto fail;
    }
    r->previous_response_id = cJSON_IsString(prev) ? prev->valuestring : NULL;
    if (parse_sampling(r, vocab, err) < 0) goto fail;
    if (parse_stop(r, err) < 0) goto fail;
    if (parse_grammar(r, err) < 0) goto fail;

    if (kind == API_CHAT) {
        int lp = 0;
        if (get_bool(r, "logprobs", &lp, err) < 0) goto fail;
        int top = 0;
        if (get_int(r, "top_logprobs", 0, 20, &top, err) < 0) goto fail;
        if (field(r, "top_logprobs") && !lp) {
            api_fail(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto fail;
        }
        r->logprobs = lp ? top : -1;
        if (get_bool(r, "return_token_ids", &r->return_token_ids, err) < 0) goto fail;
        if (parse_messages(r, err) < 0 || parse_tools(r, err) < 0) goto fail;
        const cJSON *kw = field(r, "chat_template_kwargs");
        if (kw) {
            if (!cJSON_IsObject(kw)) {
                api_fail(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
                goto fail;
            }
            r->kwargs_json = cJSON_PrintUnformatted(kw);
        }
    } else {
        int lp;
        int k = get_int(r, "logprobs", 0, 20, &lp, err);
        if (k < 0) goto fail;
        if (k) r->logprobs = lp;
        if (get_bool(r, "echo", &r->echo, err) < 0) goto fail;
        if (r->max_tokens == 0 && !r->echo) {
            api_fail(err, 400, "max_tokens",
                     "'max_tokens' must be at least 1 (0, the prompt alone, needs 'echo': true)");
            goto fail;
        }
        if (get_bool(r, "return_token_ids", &r->return_token_ids, err) < 0) goto fail;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(r->body, "prompt");
        if (!p) {
            api_fail(err, 400, "prompt", "'prompt' is required");
            goto fail;
        }
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
            (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
            p = p->child; /* a batch of one */
        if (cJSON_IsString(p)) {
            r->prompt_text = p->valuestring;
            if (!p->valuestring[0]) {
                api_fail(err, 400, "prompt", "'prompt' is empty");
                goto fail;
            }
        } else if (cJSON_IsArray(p) && cJSON_IsNumber(p->child)) {
            if (get_ids(p, "prompt", vocab, &r->prompt_ids, &r->n_prompt_ids, err) < 0) goto fail;
        } else {
            api_fail(err, 400, "prompt", "'prompt' must be a string or an array of token ids "
                     "(batches of several prompts are not supported)");
            goto fail;
        }
    }
    return 0;
fail:
    api_req_free(r);
    return -1;
}

void api_req_free(api_req *r) {
    cJSON_Delete(r->body);
    free(r->bias);
    free(r->messages_json);
    free(r->tools_json);
    free(r->kwargs_json);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_images; i++) free(r->image_urls[i]);
    free(r->grammar_src);
    memset(r, 0, sizeof *r);
}
