/* embed: POST /v1/embeddings. Every input of a call (a string, a list of
 * strings, a list of token ids, or a list of such lists) becomes its own
 * engine request, all submitted before any is waited for, so they share
 * the engine's steps with each other and with generations. The vector is
 * the model's hidden state after its final norm, pooled as the model
 * directory says (last token by default, as for decoder models), and
 * L2-normalised; `dimensions` keeps the first n values and normalises
 * again, as OpenAI's v3 models do. */
#include "serve/embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* OpenAI's bound on the inputs of one call. */
#define EMBED_MAX_INPUTS 2048

typedef struct embed_input {
    int32_t *ids;   /* owned [n] */
    int n;
} embed_input;

typedef struct embed_call {
    cJSON *body;              /* owned */
    const char *model;        /* borrowed from body, may be NULL */
    embed_input *in;          /* owned [n_in] */
    int n_in;
    int dims;                 /* values kept per vector */
    int base64;
    loom_request **rq;        /* owned [n_in] */
} embed_call;

static void call_free(embed_call *c) {
    for (int i = 0; i < c->n_in; i++) {
        free(c->in[i].ids);
        if (c->rq) loom_request_free(c->rq[i]);
    }
    free(c->in);
    free(c->rq);
    cJSON_Delete(c->body);
}

/* One list of token ids, v (an array), into in. */
static int put_ids(const cJSON *v, const char *param, int vocab, embed_input *in, api_error *err) {
    int n = cJSON_GetArraySize(v), i = 0;
    if (n == 0) return api_fail(err, 400, "input", "'%s' is an empty list of token ids", param);
    in->ids = malloc(sizeof *in->ids * (size_t)n);
    if (!in->ids) return api_fail(err, 500, NULL, "out of memory");
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= vocab)
            return api_fail(err, 400, "input", "'%s'[%d] must be a token id in [0, %d)", param, i, vocab);
        in->ids[i] = (int32_t)e->valuedouble;
    }
    in->n = n;
    return 0;
}

/* One string, v, tokenized into in. */
static int put_text(server *s, const cJSON *v, const char *param, embed_input *in, api_error *err) {
    if (!v->valuestring[0]) return api_fail(err, 400, "input", "'%s' is an empty string", param);
    if (!s->tok)
        return api_fail(err, 400, "input", "this model directory has no tokenizer (tokenizer.json); "
                                           "send token ids");
    size_t n = 0;
    if (loom_tok_encode(s->tok, v->valuestring, strlen(v->valuestring), LOOM_TOK_ADD_SPECIAL, &in->ids, &n))
        return api_fail(err, 400, "input", "'%s': %s", param, loom_last_error());
    if (n == 0) return api_fail(err, 400, "input", "'%s' encodes to no tokens", param);
    in->n = (int)n;
    return 0;
}

/* input: a string, a list of token ids, or a list of strings or of token
 * id lists (one kind in one list). */
static int parse_input(server *s, embed_call *c, api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->body, "input");
    if (!v) return api_fail(err, 400, "input", "'input' is required");
    int one = cJSON_IsString(v) || (cJSON_IsArray(v) && cJSON_IsNumber(v->child));
    if (!one && !cJSON_IsArray(v))
        return api_fail(err, 400, "input", "'input' must be a string, a list of strings, a list of "
                                           "token ids or a list of token id lists");
    int n = one ? 1 : cJSON_GetArraySize(v);
    if (n == 0) return api_fail(err, 400, "input", "'input' is an empty list");
    if (n > EMBED_MAX_INPUTS)
        return api_fail(err, 400, "input", "'input' has %d items; at most %d are taken in one call", n,
                        EMBED_MAX_INPUTS);
    c->in = calloc((size_t)n, sizeof *c->in);
    if (!c->in) return api_fail(err, 500, NULL, "out of memory");
    c->n_in = n;
    if (one) return cJSON_IsString(v) ? put_text(s, v, "input", c->in, err)
                                      : put_ids(v, "input", s->vocab, c->in, err);
    int strings = cJSON_IsString(v->child), i = 0;
    if (!strings && !cJSON_IsArray(v->child))
        return api_fail(err, 400, "input", "'input[0]' must be a string or a list of token ids");
    /* every item's kind first: a mixed list is refused as such */
    for (const cJSON *e = v->child; e; e = e->next, i++)
        if (strings ? !cJSON_IsString(e) : !cJSON_IsArray(e))
            return api_fail(err, 400, "input", "'input[%d]' must be %s, as 'input[0]' is", i,
                            strings ? "a string" : "a list of token ids");
    i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        char param[32];
        snprintf(param, sizeof param, "input[%d]", i);
        if ((strings ? put_text(s, e, param, &c->in[i], err) : put_ids(e, param, s->vocab, &c->in[i], err)) < 0)
            return -1;
    }
    return 0;
}

static int parse(server *s, embed_call *c, const char *body, size_t len, api_model_check check,
                 api_error *err) {
    if (!(c->body = api_parse_object(body, len, err))) return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(c->body, "model");
    if (model && !cJSON_IsString(model)) return api_fail(err, 400, "model", "'model' must be a string");
    c->model = model ? model->valuestring : NULL;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(c->body, "encoding_format");
    if (fmt && (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64"))))
        return api_fail(err, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    c->base64 = fmt && !strcmp(fmt->valuestring, "base64");
    int H = loom_model_hidden_size(s->model);
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(c->body, "dimensions");
    c->dims = H;
    if (dims && !cJSON_IsNull(dims)) {
        if (!cJSON_IsNumber(dims) || dims->valuedouble != floor(dims->valuedouble) || dims->valuedouble < 1)
            return api_fail(err, 400, "dimensions", "'dimensions' must be a positive integer");
        if (dims->valuedouble > H)
            return api_fail(err, 400, "dimensions", "'dimensions' is %.0f; this model's embeddings have %d",
                            dims->valuedouble, H);
        c->dims = (int)dims->valuedouble;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(c->body, "user");
    if (user && !cJSON_IsString(user)) return api_fail(err, 400, "user", "'user' must be a string");
    /* the model is checked before any tokenizing */
    if (check && check(s, c->model, err) < 0) return -1;
    return parse_input(s, c, err);
}

/* Submits every input; the first failure cancels the ones before it. */
static int submit(server *s, embed_call *c, api_error *err) {
    c->rq = calloc((size_t)c->n_in, sizeof *c->rq);
    if (!c->rq) return api_fail(err, 500, NULL, "out of memory");
    loom_request_params rp = loom_request_default_params();
    rp.pooling = loom_model_pooling(s->model);
    rp.normalize = 1;
    for (int i = 0; i < c->n_in; i++) {
        rp.prompt = c->in[i].ids;
        rp.n_prompt = c->in[i].n;
        pthread_rwlock_rdlock(&s->engine_lock);
        int down = atomic_load(&s->shutting_down);
        loom_status st = down ? LOOM_ERR_BUSY : loom_engine_submit(s->engine, &rp, &c->rq[i]);
        pthread_rwlock_unlock(&s->engine_lock);
        if (st == LOOM_OK) continue;
        const char *at = c->n_in > 1 ? "input[" : "input";
        char idx[16] = "";
        if (c->n_in > 1) snprintf(idx, sizeof idx, "%d]", i);
        if (st == LOOM_ERR_BUSY)
            return api_fail(err, down ? 503 : 429, NULL, "the server is busy: %s",
                            down ? "shutting down" : loom_last_error());
        if (st == LOOM_ERR_RANGE || st == LOOM_ERR_INVALID_ARG)
            return api_fail(err, 400, "input", "'%s%s': %s", at, idx, loom_last_error());
        if (st == LOOM_ERR_UNSUPPORTED) return api_fail(err, 501, NULL, "%s", loom_last_error());
        return api_fail(err, 500, NULL, "%s", loom_last_error());
    }
    return 0;
}

/* Waits for input i's vector into v ([H]). */
static int wait_one(embed_call *c, int i, float *v, int H, api_error *err) {
    loom_event ev;
    loom_request *r = c->rq[i];
    while (loom_request_next(r, &ev, -1) == LOOM_OK && ev.finish == LOOM_FINISH_NONE) {}
    if (ev.finish == LOOM_FINISH_CANCELLED) return api_fail(err, 503, NULL, "the server is shutting down");
    if (ev.finish != LOOM_FINISH_STOP || loom_request_embedding(r, v, H) != H)
        return api_fail(err, 500, NULL, "input %d: %s", i, loom_request_error(r));
    return 0;
}

static void put_base64(loom_buf *b, const float *v, int n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = (size_t)n * 4;
    unsigned char *bytes = malloc(len);
    if (!bytes) {
        b->oom = 1;
        return;
    }
    for (int i = 0; i < n; i++) { /* little-endian float32, whatever the host */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) bytes[(size_t)i * 4 + k] = (unsigned char)(u >> (8 * k));
    }
    loom_buf_putc(b, '"');
    for (size_t i = 0; i < len; i += 3) {
        unsigned x = (unsigned)bytes[i] << 16 | (i + 1 < len ? (unsigned)bytes[i + 1] << 8 : 0) |
                     (i + 2 < len ? bytes[i + 2] : 0);
        char q[4] = {tab[x >> 18 & 63], tab[x >> 12 & 63], i + 1 < len ? tab[x >> 6 & 63] : '=',
                     i + 2 < len ? tab[x & 63] : '='};
        loom_buf_put(b, q, 4);
    }
    loom_buf_putc(b, '"');
    free(bytes);
}

/* One vector, cut to c->dims values (normalised again when cut). */
static void put_vector(loom_buf *b, const embed_call *c, float *v, int H) {
    if (c->dims < H) {
        double ss = 0;
        for (int j = 0; j < c->dims; j++) ss += (double)v[j] * v[j];
        for (int j = 0; j < c->dims && ss > 0; j++) v[j] = (float)(v[j] / sqrt(ss));
    }
    if (c->base64) {
        put_base64(b, v, c->dims);
        return;
    }
    loom_buf_putc(b, '[');
    for (int j = 0; j < c->dims; j++) loom_buf_printf(b, "%s%.9g", j ? "," : "", (double)v[j]);
    loom_buf_putc(b, ']');
}

static char *answer(server *s, embed_call *c, api_error *err) {
    int H = loom_model_hidden_size(s->model);
    float *v = malloc(sizeof *v * (size_t)H);
    if (!v) return api_fail(err, 500, NULL, "out of memory"), NULL;
    loom_buf b = {0};
    long tokens = 0;
    loom_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < c->n_in; i++) {
        if (wait_one(c, i, v, H, err) < 0) {
            free(v);
            loom_buf_free(&b);
            return NULL;
        }
        loom_buf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        put_vector(&b, c, v, H);
        loom_buf_putc(&b, '}');
        tokens += c->in[i].n;
    }
    free(v);
    loom_buf_puts(&b, "],\"model\":");
    api_put_json_str(&b, s->model_id, strlen(s->model_id));
    loom_buf_printf(&b, ",\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}", tokens, tokens);
    metrics_add_tokens(&s->metrics, (uint64_t)tokens, 0);
    if (b.oom) {
        loom_buf_free(&b);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    return b.p;
}

static char *embed_run(server *s, const char *body, size_t len, api_model_check check, int *status) {
    embed_call c = {0};
    api_error err = {0};
    atomic_fetch_add(&s->inflight, 1);
    char *out = parse(s, &c, body, len, check, &err) < 0 || submit(s, &c, &err) < 0 ? NULL
                                                                                 : answer(s, &c, &err);
    call_free(&c);
    atomic_fetch_sub(&s->inflight, 1);
    *status = out ? 200 : err.status ? err.status : 500;
    return out ? out : api_error_json(&err);
}

const api_endpoint fmt_embeddings = {.object = "list", .run = embed_run};
