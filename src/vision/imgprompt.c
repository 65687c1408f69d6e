/* imgprompt: an image marker in rendered prompt text expanded to the
 * image's tokens, as the model's processor does it (imgprompt.h). */
#include "vision/imgprompt.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"

/* Integer field k of o, or -1 when absent. */
static int32_t cfg_id(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? (int32_t)x->valueint : -1;
}

/* Token id's string into out (NUL-terminated). */
static loom_status token_string(const loom_tok *tok, const char *field, int32_t id, char *out) {
    size_t n = 0;
    const char *s = id >= 0 ? loom_tok_id_to_token(tok, id, &n) : NULL;
    if (!s)
        return loom_err(LOOM_ERR_FORMAT, "config.json: %s %d is not a token of the tokenizer "
                        "(%d tokens)", field, id, loom_tok_vocab_size(tok));
    if (n >= LOOM_IMGPROMPT_TOKEN_MAX)
        return loom_err(LOOM_ERR_FORMAT, "config.json: %s %d is a token of %zu bytes (at most %d "
                        "expected)", field, id, n, LOOM_IMGPROMPT_TOKEN_MAX - 1);
    memcpy(out, s, n);
    out[n] = 0;
    return LOOM_OK;
}

loom_status loom_imgprompt_parse(const char *config_json, const loom_tok *tok, loom_imgprompt *out) {
    memset(out, 0, sizeof *out);
    cJSON *c = cJSON_Parse(config_json);
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return loom_err(LOOM_ERR_FORMAT, "config.json: not a JSON object");
    }
    /* Gemma 3 spells them image_token_index, boi_token_index, eoi_token_index */
    const char *img_field = cfg_id(c, "image_token_id") >= 0 ? "image_token_id" : "image_token_index";
    out->image_token = cfg_id(c, img_field);
    out->boi_token = cfg_id(c, "boi_token_index");
    out->eoi_token = cfg_id(c, "eoi_token_index");
    out->gemma = out->boi_token >= 0;
    cJSON_Delete(c);
    if (out->image_token < 0)
        return loom_err(LOOM_ERR_FORMAT, "config.json: image_token_id: missing (the token an "
                        "image's placeholders are)");
    loom_status s = token_string(tok, img_field, out->image_token, out->image);
    if (!s && out->gemma) s = token_string(tok, "boi_token_index", out->boi_token, out->boi);
    if (!s && out->gemma) s = token_string(tok, "eoi_token_index", out->eoi_token, out->eoi);
    return s;
}

loom_status loom_imgprompt_load(const char *model_dir, const loom_tok *tok, loom_imgprompt *out) {
    char path[4096], *text = NULL;
    memset(out, 0, sizeof *out);
    if (loom_path_join(path, sizeof path, model_dir, "config.json") != LOOM_OK)
        return loom_err(LOOM_ERR_INVALID_ARG, "%s: path too long", model_dir);
    loom_status s = loom_read_file(path, &text, NULL);
    if (!s) s = loom_imgprompt_parse(text, tok, out);
    free(text);
    return s == LOOM_OK ? s : loom_err_wrap(s, "%s", model_dir);
}

const char *loom_imgprompt_marker(const loom_imgprompt *ip) {
    return ip->gemma ? ip->boi : ip->image;
}

/* Occurrences of s (non-empty) in text, each after the one before. */
static int count(const char *text, size_t len, const char *s) {
    size_t n = strlen(s);
    int c = 0;
    for (const char *p = text, *end = text + len; (p = memmem(p, (size_t)(end - p), s, n)); p += n) c++;
    return c;
}

/* Whether text at p (before end) starts with s. */
static int starts(const char *p, const char *end, const char *s) {
    size_t n = strlen(s);
    return (size_t)(end - p) >= n && !memcmp(p, s, n);
}

loom_status loom_imgprompt_expand(const loom_imgprompt *ip, const char *text, size_t len,
                                  const int *n_tokens, int n_img, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    const char *marker = loom_imgprompt_marker(ip), *end = text + len;
    size_t mlen = strlen(marker);
    int have = count(text, len, marker), total = 0;
    for (int k = 0; k < n_img; k++) total += n_tokens[k];
    /* Qwen: already as many placeholders as the images take */
    int keep_all = !ip->gemma && have == total && have != n_img;
    if (have != n_img && !keep_all)
        return loom_err(LOOM_ERR_INVALID_ARG, "the prompt has %d image placeholders (%s) for %d "
                        "images", have, marker, n_img);
    loom_buf b = {0};
    const char *p = text;
    for (int k = 0; k < n_img && !keep_all; k++) {
        const char *at = memmem(p, (size_t)(end - p), marker, mlen);
        loom_buf_put(&b, p, (size_t)(at - p));
        p = at + mlen;
        if (ip->gemma && starts(p, end, ip->image)) { /* written out already */
            loom_buf_puts(&b, marker);
            continue;
        }
        if (ip->gemma) loom_buf_printf(&b, "\n\n%s", ip->boi);
        for (int t = 0; t < n_tokens[k]; t++) loom_buf_puts(&b, ip->image);
        if (ip->gemma) loom_buf_printf(&b, "%s\n\n", ip->eoi);
    }
    loom_buf_put(&b, p, (size_t)(end - p));
    loom_buf_putc(&b, 0);
    if (b.oom) {
        loom_buf_free(&b);
        return loom_err(LOOM_ERR_NOMEM, "out of memory expanding %d images", n_img);
    }
    *out = b.p;
    *out_len = b.len - 1;
    return LOOM_OK;
}
