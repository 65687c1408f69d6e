/* template/chat: chat-template loading and application on top of the Jinja
 * engine; see chat.h for the contract. The variables are assembled as one
 * JSON object text so that integers, floats and key order in messages and
 * tools reach the template exactly as given (json.loads semantics). */
#include "template/chat.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "template/jinja.h"

#define MAX_TEMPLATES 16

static const char *const SPECIAL_KEYS[] = {
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
    "mask_token", NULL,
};

struct loom_chat_template {
    int n;                                   /* templates held */
    char *names[MAX_TEMPLATES];              /* owned */
    loom_jinja_template *tpl[MAX_TEMPLATES]; /* owned, compiled */
    char *special_json;                      /* owned: `"bos_token": "<s>", ...` */
};

loom_chat_params loom_chat_default_params(void) {
    loom_chat_params p;
    memset(&p, 0, sizeof p);
    return p;
}

void loom_chat_template_free(loom_chat_template *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        free(t->names[i]);
        loom_jinja_free(t->tpl[i]);
    }
    free(t->special_json);
    free(t);
}

const char *const *loom_chat_template_names(const loom_chat_template *t, int *n) {
    *n = t ? t->n : 0;
    return t ? (const char *const *)t->names : NULL;
}

static loom_status add_template(loom_chat_template *t, const char *name, const char *src) {
    if (t->n == MAX_TEMPLATES)
        return loom_err(LOOM_ERR_UNSUPPORTED, "chat template: more than %d named templates",
                        MAX_TEMPLATES);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->names[i], name)) { /* a later source replaces it */
            loom_jinja_template *c;
            loom_status st = loom_jinja_compile(src, strlen(src), &c);
            if (st != LOOM_OK) return loom_err_wrap(st, "chat template '%s'", name);
            loom_jinja_free(t->tpl[i]);
            t->tpl[i] = c;
            return LOOM_OK;
        }
    char *nm = strdup(name);
    if (!nm) return loom_err(LOOM_ERR_NOMEM, "chat template: out of memory");
    loom_status st = loom_jinja_compile(src, strlen(src), &t->tpl[t->n]);
    if (st != LOOM_OK) {
        free(nm);
        return loom_err_wrap(st, "chat template '%s'", name);
    }
    t->names[t->n++] = nm;
    return LOOM_OK;
}

/* Adds the template(s) of a "chat_template" JSON value: a string, or a list
 * of {"name": ..., "template": ...}. */
static loom_status add_from_json(loom_chat_template *t, const cJSON *ct, const char *where) {
    if (cJSON_IsString(ct)) return add_template(t, "default", ct->valuestring);
    if (cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(nm) || !cJSON_IsString(tp))
                return loom_err(LOOM_ERR_FORMAT, "%s: chat_template list entry: expected "
                                "{\"name\": string, \"template\": string}", where);
            loom_status st = add_template(t, nm->valuestring, tp->valuestring);
            if (st != LOOM_OK) return st;
        }
        return LOOM_OK;
    }
    if (cJSON_IsNull(ct)) return LOOM_OK;
    return loom_err(LOOM_ERR_FORMAT, "%s: chat_template: expected a string or a list", where);
}

/* Appends `"key": "value", ` for a special token given as a string or an
 * AddedToken object. */
static void put_special(char **buf, size_t *len, const char *key, const cJSON *v) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return;
    cJSON *s = cJSON_CreateString(v->valuestring);
    char *enc = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    if (!enc) return;
    size_t add = strlen(key) + strlen(enc) + 8;
    char *nb = realloc(*buf, *len + add + 1);
    if (nb) {
        *buf = nb;
        *len += (size_t)snprintf(nb + *len, add + 1, "\"%s\": %s, ", key, enc);
    }
    free(enc);
}

static loom_status read_specials(loom_chat_template *t, const cJSON *cfg) {
    char *buf = calloc(1, 1);
    size_t len = 0;
    if (!buf) return loom_err(LOOM_ERR_NOMEM, "chat template: out of memory");
    for (int i = 0; cfg && SPECIAL_KEYS[i]; i++)
        put_special(&buf, &len, SPECIAL_KEYS[i],
                    cJSON_GetObjectItemCaseSensitive(cfg, SPECIAL_KEYS[i]));
    const cJSON *extra = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens")
                             : NULL;
    if (cJSON_IsArray(extra)) {
        /* a list of strings, as transformers exposes it */
        cJSON *list = cJSON_CreateArray();
        const cJSON *e;
        cJSON_ArrayForEach(e, extra) {
            const cJSON *s = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "content") : e;
            if (cJSON_IsString(s)) cJSON_AddItemToArray(list, cJSON_CreateString(s->valuestring));
        }
        char *enc = list ? cJSON_PrintUnformatted(list) : NULL;
        cJSON_Delete(list);
        if (enc) {
            size_t add = strlen(enc) + 40;
            char *nb = realloc(buf, len + add + 1);
            if (nb) {
                buf = nb;
                len += (size_t)snprintf(nb + len, add + 1, "\"additional_special_tokens\": %s, ", enc);
            }
            free(enc);
        }
    }
    t->special_json = buf;
    return LOOM_OK;
}

loom_status loom_chat_template_from_config(const char *config_json, const char *template_src,
                                           loom_chat_template **out) {
    *out = NULL;
    loom_chat_template *t = calloc(1, sizeof *t);
    if (!t) return loom_err(LOOM_ERR_NOMEM, "chat template: out of memory");
    cJSON *cfg = NULL;
    loom_status st = LOOM_OK;
    if (config_json) {
        cfg = cJSON_Parse(config_json);
        if (!cJSON_IsObject(cfg)) {
            st = loom_err(LOOM_ERR_FORMAT, "tokenizer_config.json: expected a JSON object");
            goto fail;
        }
    }
    if (template_src) st = add_template(t, "default", template_src);
    else if (cfg) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (ct) st = add_from_json(t, ct, "tokenizer_config.json");
    }
    if (st != LOOM_OK) goto fail;
    if (!t->n) {
        st = loom_err(LOOM_ERR_UNSUPPORTED, "no chat template: tokenizer_config.json has no "
                      "chat_template and no template was given");
        goto fail;
    }
    st = read_specials(t, cfg);
    if (st != LOOM_OK) goto fail;
    cJSON_Delete(cfg);
    *out = t;
    return LOOM_OK;
fail:
    cJSON_Delete(cfg);
    loom_chat_template_free(t);
    return st;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

loom_status loom_chat_template_load(const char *dir, loom_chat_template **out) {
    *out = NULL;
    char path[4096];
    char *cfg_text = NULL, *jinja = NULL;
    loom_status st = loom_path_join(path, sizeof path, dir, "tokenizer_config.json");
    if (st != LOOM_OK) return st;
    if (file_exists(path) && (st = loom_read_file(path, &cfg_text, NULL)) != LOOM_OK) return st;
    /* chat_template.jinja, as transformers saves it, wins over the config */
    if ((st = loom_path_join(path, sizeof path, dir, "chat_template.jinja")) != LOOM_OK) goto done;
    if (file_exists(path) && (st = loom_read_file(path, &jinja, NULL)) != LOOM_OK) goto done;
    if (!jinja && cfg_text) {
        cJSON *cfg = cJSON_Parse(cfg_text);
        int has = cfg && cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") &&
                  !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"));
        cJSON_Delete(cfg);
        if (!has) {
            /* processors keep it in chat_template.json */
            if ((st = loom_path_join(path, sizeof path, dir, "chat_template.json")) != LOOM_OK)
                goto done;
            if (file_exists(path)) {
                char *text = NULL;
                if ((st = loom_read_file(path, &text, NULL)) != LOOM_OK) goto done;
                cJSON *j = cJSON_Parse(text);
                free(text);
                const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
                if (cJSON_IsString(ct)) jinja = strdup(ct->valuestring);
                cJSON_Delete(j);
            }
        }
    }
    st = loom_chat_template_from_config(cfg_text, jinja, out);
    if (st != LOOM_OK) loom_err_wrap(st, "%s", dir);
    if (st == LOOM_OK) {
        /* transformers 5 also reads additional_chat_templates/NAME.jinja */
        if (loom_path_join(path, sizeof path, dir, "additional_chat_templates") == LOOM_OK) {
            DIR *d = opendir(path);
            struct dirent *e;
            while (d && st == LOOM_OK && (e = readdir(d))) {
                size_t l = strlen(e->d_name);
                if (l <= 6 || strcmp(e->d_name + l - 6, ".jinja")) continue;
                char fp[4096 + 256], name[256], *src = NULL;
                snprintf(fp, sizeof fp, "%s/%s", path, e->d_name);
                snprintf(name, sizeof name, "%.*s", (int)(l - 6), e->d_name);
                if (loom_read_file(fp, &src, NULL) != LOOM_OK) continue;
                st = add_template(*out, name, src);
                free(src);
            }
            if (d) closedir(d);
            if (st != LOOM_OK) {
                loom_chat_template_free(*out);
                *out = NULL;
            }
        }
    }
done:
    free(cfg_text);
    free(jinja);
    return st;
}

/* ---- applying ------------------------------------------------------------ */

/* Skips JSON whitespace; returns the first significant character. */
static char first_char(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return *s;
}

typedef struct loom_buf {
    char *p;
    size_t n, cap;
    int failed;
} loom_buf;

static void loom_buf_put(loom_buf *b, const char *s) {
    size_t l = strlen(s);
    if (b->failed) return;
    if (b->n + l + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + l + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, l + 1);
    b->n += l;
}

/* The text of the final message that continue_final_message continues. */
static loom_status final_text(const char *messages_json, char **out) {
    *out = NULL;
    cJSON *m = cJSON_Parse(messages_json);
    const cJSON *last = cJSON_IsArray(m) ? cJSON_GetArrayItem(m, cJSON_GetArraySize(m) - 1) : NULL;
    const cJSON *content = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    if (cJSON_IsString(content)) {
        *out = strdup(content->valuestring);
    } else if (cJSON_IsArray(content)) {
        for (int i = cJSON_GetArraySize(content) - 1; i >= 0 && !*out; i--) {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(content, i), "text");
            if (cJSON_IsString(tx)) *out = strdup(tx->valuestring);
        }
    }
    cJSON_Delete(m);
    if (!*out)
        return loom_err(LOOM_ERR_INVALID_ARG, "continue_final_message: the final message has "
                        "no text to continue");
    return LOOM_OK;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Cuts the rendering right after the final message's text, as transformers
 * does: at the last occurrence of the stripped text, keeping its trailing
 * whitespace only when the template kept it. */
static loom_status continue_cut(char *text, size_t *len, const char *final) {
    size_t fl = strlen(final), b = 0, e = fl;
    while (b < e && is_space(final[b])) b++;
    while (e > b && is_space(final[e - 1])) e--;
    size_t sl = e - b;
    char *hit = NULL;
    for (size_t i = *len + 1; i-- > 0;)
        if (i + sl <= *len && !memcmp(text + i, final + b, sl)) {
            hit = text + i;
            break;
        }
    if (!hit)
        return loom_err(LOOM_ERR_INVALID_ARG, "continue_final_message: the final message does "
                        "not appear in the rendered chat");
    size_t lstripped = fl - b;
    size_t pos = (size_t)(hit - text);
    size_t keep = pos + lstripped <= *len && !memcmp(hit, final + b, lstripped) ? lstripped : sl;
    *len = pos + keep;
    text[*len] = 0;
    return LOOM_OK;
}

loom_status loom_chat_apply(const loom_chat_template *t, const loom_chat_params *p, char **out,
                            size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !p || !p->messages_json)
        return loom_err(LOOM_ERR_INVALID_ARG, "chat: template and messages are required");
    if (first_char(p->messages_json) != '[')
        return loom_err(LOOM_ERR_INVALID_ARG, "chat: messages: expected a JSON array");
    if (p->tools_json && first_char(p->tools_json) != '[' && strcmp(p->tools_json, "null"))
        return loom_err(LOOM_ERR_INVALID_ARG, "chat: tools: expected a JSON array");
    if (p->kwargs_json && first_char(p->kwargs_json) != '{')
        return loom_err(LOOM_ERR_INVALID_ARG, "chat: kwargs: expected a JSON object");
    if (p->continue_final_message && p->add_generation_prompt)
        return loom_err(LOOM_ERR_INVALID_ARG, "chat: continue_final_message and "
                        "add_generation_prompt are mutually exclusive");
    int has_tools = p->tools_json && strcmp(p->tools_json, "null");
    /* pick the template as transformers does */
    const loom_jinja_template *tpl = NULL;
    const char *want = p->template_name;
    for (int pass = 0; pass < 2 && !tpl; pass++) {
        const char *name = want ? want : pass == 0 ? (has_tools ? "tool_use" : NULL) : "default";
        if (want && pass) break;
        for (int i = 0; name && i < t->n; i++)
            if (!strcmp(t->names[i], name)) tpl = t->tpl[i];
    }
    if (!tpl) {
        if (want) return loom_err(LOOM_ERR_INVALID_ARG, "chat: no template named '%s'", want);
        return loom_err(LOOM_ERR_INVALID_ARG, "chat: the model has named chat templates but "
                        "none called 'default'");
    }
    loom_buf vars = {0};
    loom_buf_put(&vars, "{\"messages\": ");
    loom_buf_put(&vars, p->messages_json);
    loom_buf_put(&vars, ", \"tools\": ");
    loom_buf_put(&vars, has_tools ? p->tools_json : "null");
    loom_buf_put(&vars, ", \"documents\": ");
    loom_buf_put(&vars, p->documents_json ? p->documents_json : "null");
    loom_buf_put(&vars, ", \"add_generation_prompt\": ");
    loom_buf_put(&vars, p->add_generation_prompt ? "true, " : "false, ");
    loom_buf_put(&vars, t->special_json);
    if (p->kwargs_json) {
        /* splice the object's members in last: later keys override */
        const char *s = p->kwargs_json;
        while (*s != '{') s++;
        const char *e = s + strlen(s);
        while (e > s && e[-1] != '}') e--;
        size_t inner = e > s + 1 ? (size_t)(e - 1 - (s + 1)) : 0;
        char *copy = malloc(inner + 1);
        if (!copy) {
            free(vars.p);
            return loom_err(LOOM_ERR_NOMEM, "chat: out of memory");
        }
        memcpy(copy, s + 1, inner);
        copy[inner] = 0;
        size_t k = 0;
        while (k < inner && is_space(copy[k])) k++;
        if (k < inner) {
            loom_buf_put(&vars, copy);
            loom_buf_put(&vars, ", ");
        }
        free(copy);
    }
    if (!vars.failed && vars.n >= 2 && !memcmp(vars.p + vars.n - 2, ", ", 2)) {
        vars.n -= 2;
        vars.p[vars.n] = 0;
    }
    loom_buf_put(&vars, "}");
    if (vars.failed) {
        free(vars.p);
        return loom_err(LOOM_ERR_NOMEM, "chat: out of memory");
    }
    char *text = NULL;
    size_t len = 0;
    loom_status st = loom_jinja_render(tpl, vars.p, &text, &len);
    free(vars.p);
    if (st != LOOM_OK) return st;
    if (p->continue_final_message) {
        char *final = NULL;
        st = final_text(p->messages_json, &final);
        if (st == LOOM_OK) st = continue_cut(text, &len, final);
        free(final);
        if (st != LOOM_OK) {
            free(text);
            return st;
        }
    }
    *out = text;
    if (out_len) *out_len = len;
    return LOOM_OK;
}
