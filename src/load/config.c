/* config: config.json -> loom_config, with defaults as transformers has them. */
#include "load/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* Reads an integer field; missing uses def (or fails when required). */
static loom_status get_int(const cJSON *o, const char *k, int required, int def,
                           const char *path, int *out) {
    const cJSON *v = get(o, k);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return loom_err(LOOM_ERR_FORMAT, "%s: missing required field \"%s\"", path, k);
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 2e9)
        return loom_err(LOOM_ERR_FORMAT, "%s: field \"%s\": expected an integer", path, k);
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static loom_status get_num(const cJSON *o, const char *k, double def,
                           const char *path, double *out) {
    const cJSON *v = get(o, k);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v))
        return loom_err(LOOM_ERR_FORMAT, "%s: field \"%s\": expected a number", path, k);
    *out = v->valuedouble;
    return LOOM_OK;
}

static loom_status parse_rope(const cJSON *root, const char *path,
                              loom_rope_config *r) {
    /* transformers 5 folds everything into rope_parameters; older files
     * keep rope_theta at top level and the scaling dict in rope_scaling. */
    const cJSON *rp = get(root, "rope_parameters");
    const cJSON *scaling = cJSON_IsObject(rp) ? rp : get(root, "rope_scaling");
    loom_status s;
    double theta_top;
    if ((s = get_num(root, "rope_theta", 10000.0, path, &theta_top))) return s;
    if ((s = get_num(cJSON_IsObject(rp) ? rp : NULL, "rope_theta", theta_top, path, &r->theta)))
        return s;
    double prf_top;
    if ((s = get_num(root, "partial_rotary_factor", 1.0, path, &prf_top))) return s;
    r->partial_rotary_factor = prf_top;
    r->type = LOOM_ROPE_DEFAULT;
    r->factor = 1.0;
    r->attention_factor = 0;
    if (!cJSON_IsObject(scaling)) return LOOM_OK;
    if ((s = get_num(scaling, "partial_rotary_factor", prf_top, path, &r->partial_rotary_factor)))
        return s;
    const cJSON *t = get(scaling, "rope_type");
    if (!cJSON_IsString(t)) t = get(scaling, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    if ((s = get_num(scaling, "factor", 1.0, path, &r->factor))) return s;
    if ((s = get_num(scaling, "low_freq_factor", 1.0, path, &r->low_freq_factor))) return s;
    if ((s = get_num(scaling, "high_freq_factor", 4.0, path, &r->high_freq_factor))) return s;
    if ((s = get_num(scaling, "original_max_position_embeddings", 0, path, &r->original_max_pos)))
        return s;
    if ((s = get_num(scaling, "beta_fast", 32.0, path, &r->beta_fast))) return s;
    if ((s = get_num(scaling, "beta_slow", 1.0, path, &r->beta_slow))) return s;
    if ((s = get_num(scaling, "attention_factor", 0, path, &r->attention_factor))) return s;
    if (!strcmp(type, "default")) r->type = LOOM_ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) r->type = LOOM_ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) r->type = LOOM_ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) r->type = LOOM_ROPE_YARN;
    else if (!strcmp(type, "dynamic")) r->type = LOOM_ROPE_DYNAMIC;
    else
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "%s: rope type \"%s\" is not supported (expected default, linear, "
                        "llama3, yarn or dynamic)",
                        path, type);
    if (r->type == LOOM_ROPE_LLAMA3 && r->original_max_pos <= 0)
        return loom_err(LOOM_ERR_FORMAT,
                        "%s: llama3 rope needs original_max_position_embeddings", path);
    return LOOM_OK;
}

loom_status loom_config_parse(const char *text, const char *path, loom_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_err(LOOM_ERR_FORMAT, "%s: not a JSON object", path);
    }
    /* Multimodal checkpoints nest the language model under text_config. */
    const cJSON *c = root;
    const cJSON *tc = get(root, "text_config");
    if (cJSON_IsObject(tc) && !get(root, "hidden_size")) c = tc;

    loom_status s = LOOM_OK;
    const cJSON *archs = get(root, "architectures");
    const cJSON *a0 = cJSON_GetArrayItem(archs, 0);
    if (!cJSON_IsString(a0)) {
        s = loom_err(LOOM_ERR_FORMAT, "%s: missing \"architectures\" (expected e.g. "
                     "[\"LlamaForCausalLM\"])", path);
        goto out;
    }
    snprintf(cfg->arch, sizeof cfg->arch, "%s", a0->valuestring);
    const cJSON *mt = get(c, "model_type");
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s",
             cJSON_IsString(mt) ? mt->valuestring : "");
    const cJSON *act = get(c, "hidden_act");
    if (!cJSON_IsString(act)) act = get(c, "hidden_activation");
    snprintf(cfg->hidden_act, sizeof cfg->hidden_act, "%s",
             cJSON_IsString(act) ? act->valuestring : "silu");

    if ((s = get_int(c, "vocab_size", 1, 0, path, &cfg->vocab_size))) goto out;
    if ((s = get_int(c, "hidden_size", 1, 0, path, &cfg->hidden_size))) goto out;
    if ((s = get_int(c, "num_hidden_layers", 1, 0, path, &cfg->n_layers))) goto out;
    if ((s = get_int(c, "num_attention_heads", 1, 0, path, &cfg->n_heads))) goto out;
    if ((s = get_int(c, "num_key_value_heads", 0, cfg->n_heads, path, &cfg->n_kv_heads))) goto out;
    if ((s = get_int(c, "intermediate_size", 1, 0, path, &cfg->intermediate_size))) goto out;
    if ((s = get_int(c, "max_position_embeddings", 0, 4096, path, &cfg->max_positions))) goto out;
    if ((s = get_int(c, "sliding_window", 0, 0, path, &cfg->sliding_window))) goto out;
    if (cfg->n_heads <= 0 || cfg->hidden_size <= 0 || cfg->n_layers <= 0 ||
        cfg->vocab_size <= 0 || cfg->n_kv_heads <= 0 || cfg->intermediate_size <= 0) {
        s = loom_err(LOOM_ERR_FORMAT, "%s: sizes must be positive", path);
        goto out;
    }
    if (cfg->n_layers > LOOM_MAX_LAYERS) {
        s = loom_err(LOOM_ERR_UNSUPPORTED, "%s: %d layers, at most %d supported", path,
                     cfg->n_layers, LOOM_MAX_LAYERS);
        goto out;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        s = loom_err(LOOM_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of "
                     "num_key_value_heads %d", path, cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    if ((s = get_int(c, "head_dim", 0, cfg->hidden_size / cfg->n_heads, path, &cfg->head_dim)))
        goto out;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2) {
        s = loom_err(LOOM_ERR_FORMAT, "%s: head_dim %d must be positive and even", path,
                     cfg->head_dim);
        goto out;
    }
    double eps;
    if ((s = get_num(c, "rms_norm_eps", 1e-6, path, &eps))) goto out;
    cfg->rms_eps = eps;
    const cJSON *tie = get(c, "tie_word_embeddings");
    if (!tie) tie = get(root, "tie_word_embeddings");
    cfg->tie_embeddings = tie ? cJSON_IsTrue(tie) : 1;
    const cJSON *ab = get(c, "attention_bias");
    cfg->attention_bias = cJSON_IsTrue(ab);
    if ((s = parse_rope(c, path, &cfg->rope))) goto out;

    cfg->bos_id = -1;
    const cJSON *bos = get(c, "bos_token_id");
    if (!bos) bos = get(root, "bos_token_id");
    if (cJSON_IsNumber(bos)) cfg->bos_id = bos->valueint;
    const cJSON *eos = get(c, "eos_token_id");
    if (!eos) eos = get(root, "eos_token_id");
    if (cJSON_IsNumber(eos)) cfg->eos_ids[cfg->n_eos++] = eos->valueint;
    else if (cJSON_IsArray(eos))
        for (const cJSON *e = eos->child; e && cfg->n_eos < LOOM_MAX_EOS; e = e->next)
            if (cJSON_IsNumber(e)) cfg->eos_ids[cfg->n_eos++] = e->valueint;
out:
    cJSON_Delete(root);
    return s;
}

loom_status loom_config_load(const char *dir, loom_config *cfg) {
    char path[4096];
    loom_status s = loom_path_join(path, sizeof path, dir, "config.json");
    if (s != LOOM_OK) return s;
    char *text = NULL;
    if ((s = loom_read_file(path, &text, NULL))) return s;
    s = loom_config_parse(text, path, cfg);
    free(text);
    if (s != LOOM_OK) return s;
    /* generation_config.json may list more stop ids than config.json. */
    if (loom_path_join(path, sizeof path, dir, "generation_config.json") != LOOM_OK ||
        loom_read_file(path, &text, NULL) != LOOM_OK) {
        loom_err_clear();
        return LOOM_OK;
    }
    cJSON *g = cJSON_Parse(text);
    free(text);
    const cJSON *eos = get(g, "eos_token_id");
    const cJSON *one = cJSON_IsNumber(eos) ? eos : NULL;
    for (const cJSON *e = one ? one : cJSON_IsArray(eos) ? eos->child : NULL; e;
         e = one ? NULL : e->next) {
        int dup = 0;
        for (int i = 0; i < cfg->n_eos; i++) dup |= cfg->eos_ids[i] == e->valueint;
        if (cJSON_IsNumber(e) && !dup && cfg->n_eos < LOOM_MAX_EOS)
            cfg->eos_ids[cfg->n_eos++] = e->valueint;
    }
    cJSON_Delete(g);
    return LOOM_OK;
}
