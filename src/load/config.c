/* config: config.json -> loom_config, with defaults as transformers has them. */
#include "load/config.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/buf.h"

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* A JSON value for messages: the number itself, or what kind of value it is. */
static const char *found_str(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 1e18) snprintf(buf, n, "%.0f", d);
        else snprintf(buf, n, "%g", d);
    } else {
        snprintf(buf, n, "%s", cJSON_IsString(v) ? "a string" : cJSON_IsArray(v) ? "an array"
                               : cJSON_IsObject(v) ? "an object" : cJSON_IsBool(v) ? "a boolean"
                                                                    : "null");
    }
    return buf;
}

/* Reads an integer field in [lo, hi]; missing uses def (or fails when
 * required). The message names the field, the range and what was found. */
static loom_status get_int_in(const cJSON *o, const char *k, int required, int def, int lo,
                              int hi, const char *path, int *out) {
    const cJSON *v = get(o, k);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return loom_err(LOOM_ERR_FORMAT, "%s: missing required field \"%s\"", path, k);
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < lo || v->valuedouble > hi) {
        char found[64], upto[32] = "";
        if (hi < INT_MAX) snprintf(upto, sizeof upto, " up to %d", hi);
        return loom_err(LOOM_ERR_FORMAT, "%s: %s must be %s integer%s, found %s", path, k,
                        lo == 1 ? "a positive" : lo == 0 ? "a non-negative" : "an", upto,
                        found_str(v, found, sizeof found));
    }
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static loom_status get_int(const cJSON *o, const char *k, int required, int def,
                           const char *path, int *out) {
    return get_int_in(o, k, required, def, INT_MIN, INT_MAX, path, out);
}

/* The error for a number field outside its range: names the field (under
 * where, the dict holding it, or "" at the top level), what it must be and
 * what config.json has. */
static loom_status bad_num(const char *path, const char *where, const char *k, const char *want,
                           double found) {
    return loom_err(LOOM_ERR_FORMAT, "%s: %s%s%s must be %s, found %g", path, where,
                    where[0] ? "." : "", k, want, found);
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

static int positive(double v) { return v > 0 && v < INFINITY; }

/* The rope parameters the frequency setup divides by or takes logs of:
 * where names the dict they came from in messages. */
static loom_status check_rope(const loom_rope_config *r, const char *where, const char *path) {
    if (!positive(r->factor)) return bad_num(path, where, "factor", "a positive number", r->factor);
    if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
        return bad_num(path, where, "partial_rotary_factor", "in (0, 1]", r->partial_rotary_factor);
    if (!(r->original_max_pos >= 0 && r->original_max_pos < INFINITY))
        return bad_num(path, where, "original_max_position_embeddings", "a non-negative number",
                       r->original_max_pos);
    if (!(r->attention_factor >= 0 && r->attention_factor < INFINITY))
        return bad_num(path, where, "attention_factor", "a non-negative number",
                       r->attention_factor);
    if (r->type == LOOM_ROPE_LLAMA3) {
        if (!positive(r->low_freq_factor))
            return bad_num(path, where, "low_freq_factor", "a positive number", r->low_freq_factor);
        if (!(r->high_freq_factor > r->low_freq_factor && r->high_freq_factor < INFINITY))
            return bad_num(path, where, "high_freq_factor", "larger than low_freq_factor",
                           r->high_freq_factor);
    }
    if (r->type == LOOM_ROPE_YARN) {
        if (!positive(r->beta_fast))
            return bad_num(path, where, "beta_fast", "a positive number", r->beta_fast);
        if (!positive(r->beta_slow))
            return bad_num(path, where, "beta_slow", "a positive number", r->beta_slow);
    }
    return LOOM_OK;
}

/* mrope_section [t, h, w] (pairs per position stream) and
 * mrope_interleaved from a rope dict; absent: plain rope. */
static loom_status parse_mrope(const cJSON *scaling, const char *path, loom_rope_config *r) {
    const cJSON *sec = get(scaling, "mrope_section");
    if (!sec) return LOOM_OK;
    if (!cJSON_IsArray(sec) || cJSON_GetArraySize(sec) != 3)
        return loom_err(LOOM_ERR_FORMAT, "%s: mrope_section must be an array of 3 integers "
                        "(t, h, w)", path);
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetArrayItem(sec, k);
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 4096 ||
            v->valuedouble != (int)v->valuedouble)
            return loom_err(LOOM_ERR_FORMAT, "%s: mrope_section[%d] must be an integer in "
                            "[0, 4096]", path, k);
        r->mrope_section[k] = v->valueint;
    }
    const cJSON *il = get(scaling, "mrope_interleaved");
    r->mrope_interleaved = cJSON_IsTrue(il);
    return LOOM_OK;
}

/* One rope description: rp is the transformers 5 dict (or NULL), scaling the
 * dict holding rope_type and its parameters (rp itself, or the older
 * rope_scaling), where its name in messages. theta and prf are the
 * defaults from the top level. */
static loom_status parse_rope_dict(const cJSON *rp, const cJSON *scaling, double theta_top,
                                   double prf_top, const char *where, const char *path,
                                   loom_rope_config *r) {
    loom_status s;
    if (!cJSON_IsObject(rp)) rp = NULL;
    if ((s = get_num(rp, "rope_theta", theta_top, path, &r->theta))) return s;
    if (!positive(r->theta))
        return bad_num(path, rp && get(rp, "rope_theta") ? where : "", "rope_theta",
                       "a positive number", r->theta);
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
    /* Qwen2-VL's rope_scaling says "mrope": default frequencies, three streams */
    if (!strcmp(type, "default") || !strcmp(type, "mrope")) r->type = LOOM_ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) r->type = LOOM_ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) r->type = LOOM_ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) r->type = LOOM_ROPE_YARN;
    else if (!strcmp(type, "dynamic")) r->type = LOOM_ROPE_DYNAMIC;
    else if (!strcmp(type, "proportional")) r->type = LOOM_ROPE_PROPORTIONAL;
    else
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "%s: rope type \"%s\" is not supported (expected default, linear, "
                        "llama3, yarn, dynamic or proportional)",
                        path, type);
    if ((s = parse_mrope(scaling, path, r))) return s;
    if (r->type == LOOM_ROPE_LLAMA3 && r->original_max_pos <= 0)
        return loom_err(LOOM_ERR_FORMAT,
                        "%s: llama3 rope needs original_max_position_embeddings", path);
    return check_rope(r, where, path);
}

static loom_status parse_rope(const cJSON *root, const char *path, loom_config *cfg) {
    /* transformers 5 folds everything into rope_parameters (per layer type
     * for models that mix sliding and full layers); older files keep
     * rope_theta at top level and the scaling dict in rope_scaling. */
    const cJSON *rp = get(root, "rope_parameters");
    loom_status s;
    double theta_top, prf_top;
    if ((s = get_num(root, "rope_theta", 10000.0, path, &theta_top))) return s;
    if ((s = get_num(root, "partial_rotary_factor", 1.0, path, &prf_top))) return s;
    if (!(prf_top > 0 && prf_top <= 1))
        return bad_num(path, "", "partial_rotary_factor", "in (0, 1]", prf_top);
    const cJSON *full = cJSON_IsObject(rp) ? get(rp, "full_attention") : NULL;
    const cJSON *slid = cJSON_IsObject(rp) ? get(rp, "sliding_attention") : NULL;
    if (cJSON_IsObject(full) || cJSON_IsObject(slid)) {
        const cJSON *g = cJSON_IsObject(full) ? full : slid;
        if ((s = parse_rope_dict(g, g, theta_top, prf_top,
                                 g == full ? "rope_parameters.full_attention"
                                           : "rope_parameters.sliding_attention",
                                 path, &cfg->rope)))
            return s;
        if (cJSON_IsObject(slid)) {
            if ((s = parse_rope_dict(slid, slid, theta_top, prf_top,
                                     "rope_parameters.sliding_attention", path, &cfg->rope_local)))
                return s;
            cfg->has_rope_local = 1;
        }
        return LOOM_OK;
    }
    const cJSON *scaling = cJSON_IsObject(rp) ? rp : get(root, "rope_scaling");
    if ((s = parse_rope_dict(rp, scaling, theta_top, prf_top,
                             cJSON_IsObject(rp) ? "rope_parameters" : "rope_scaling", path,
                             &cfg->rope)))
        return s;
    /* gemma3 before transformers 5: local layers have their own base and
     * no scaling. */
    double local;
    if ((s = get_num(root, "rope_local_base_freq", 0, path, &local))) return s;
    if (local > 0) {
        if ((s = parse_rope_dict(NULL, NULL, local, prf_top, "", path, &cfg->rope_local))) return s;
        cfg->has_rope_local = 1;
    }
    return LOOM_OK;
}

static int get_bool(const cJSON *o, const char *k, int def) {
    const cJSON *v = get(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    return def;
}

static loom_status parse_layer_types(const cJSON *c, const char *path, loom_config *cfg) {
    const cJSON *lt = get(c, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        /* Qwen2-style configs without layer_types: sliding from layer
         * max_window_layers on, when use_sliding_window. */
        if (cJSON_IsTrue(get(c, "use_sliding_window")) && cfg->sliding_window > 0) {
            int from;
            loom_status s = get_int_in(c, "max_window_layers", 0, 0, 0, INT_MAX, path, &from);
            if (s) return s;
            for (int i = 0; i < cfg->n_layers; i++)
                cfg->layer_types[i] = i >= from ? LOOM_LAYER_SLIDING : LOOM_LAYER_FULL;
            cfg->has_layer_types = 1;
        }
        return LOOM_OK;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->n_layers)
        return loom_err(LOOM_ERR_FORMAT, "%s: \"layer_types\": expected %d strings", path,
                        cfg->n_layers);
    int i = 0;
    for (const cJSON *e = lt->child; e; e = e->next, i++) {
        const char *t = cJSON_IsString(e) ? e->valuestring : "";
        if (!strcmp(t, "full_attention")) cfg->layer_types[i] = LOOM_LAYER_FULL;
        else if (!strcmp(t, "sliding_attention")) cfg->layer_types[i] = LOOM_LAYER_SLIDING;
        else if (!strcmp(t, "linear_attention")) cfg->layer_types[i] = LOOM_LAYER_LINEAR;
        else
            return loom_err(LOOM_ERR_UNSUPPORTED,
                            "%s: layer type \"%s\" (layer %d) is not supported (expected "
                            "full_attention, sliding_attention or linear_attention)",
                            path, t, i);
    }
    cfg->has_layer_types = 1;
    return LOOM_OK;
}

/* found_str, with a string's own text. */
static const char *value_str(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsString(v)) snprintf(buf, n, "\"%.40s\"", v->valuestring);
    else found_str(v, buf, n);
    return buf;
}

/* Hugging Face FP8: {"quant_method": "fp8", "fmt": "e4m3",
 * "activation_scheme": "dynamic", "weight_block_size": [128, 128],
 * "modules_to_not_convert": [...]}, or fbgemm's per-channel "fbgemm_fp8". */
static loom_status parse_fp8(const cJSON *hq, const char *method, const char *path,
                             loom_config *cfg) {
    char buf[64];
    cfg->fp8 = 1;
    const cJSON *fmt = get(hq, "fmt");
    if (fmt && !cJSON_IsNull(fmt) && !(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "e4m3")))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: quantization_config fmt %s is not supported "
                        "(expected \"e4m3\")", path, value_str(fmt, buf, sizeof buf));
    const cJSON *act = get(hq, "activation_scheme");
    if (act && !cJSON_IsNull(act) &&
        !(cJSON_IsString(act) && !strcmp(act->valuestring, "dynamic")))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: quantization_config activation_scheme %s is "
                        "not supported (expected \"dynamic\": activations stay f32 here)", path,
                        value_str(act, buf, sizeof buf));
    const cJSON *bs = get(hq, "weight_block_size");
    if (bs && !cJSON_IsNull(bs)) {
        int ok = cJSON_IsArray(bs) && cJSON_GetArraySize(bs) == 2;
        for (int i = 0; ok && i < 2; i++) {
            const cJSON *v = cJSON_GetArrayItem(bs, i);
            ok = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1 << 20 &&
                 v->valuedouble == (int)v->valuedouble;
            if (ok) cfg->fp8_block[i] = (int)v->valuedouble;
        }
        if (!ok)
            return loom_err(LOOM_ERR_FORMAT, "%s: quantization_config weight_block_size: "
                            "expected [rows, cols] (positive integers)", path);
    } else if (!bs && !strcmp(method, "fp8")) {
        /* transformers' FineGrainedFP8Config default; null: per tensor or channel */
        cfg->fp8_block[0] = cfg->fp8_block[1] = 128;
    }
    const cJSON *skip = get(hq, "modules_to_not_convert");
    if (skip && !cJSON_IsNull(skip) && !cJSON_IsArray(skip))
        return loom_err(LOOM_ERR_FORMAT, "%s: quantization_config modules_to_not_convert: "
                        "expected a list of module names", path);
    for (const cJSON *e = skip && cJSON_IsArray(skip) ? skip->child : NULL; e; e = e->next) {
        if (!cJSON_IsString(e))
            return loom_err(LOOM_ERR_FORMAT, "%s: quantization_config modules_to_not_convert: "
                            "expected a list of module names", path);
        if (cfg->n_quant_overrides == LOOM_MAX_QUANT_OVERRIDES)
            return loom_err(LOOM_ERR_UNSUPPORTED, "%s: more than %d modules_to_not_convert",
                            path, LOOM_MAX_QUANT_OVERRIDES);
        loom_quant_override *o = &cfg->quant_overrides[cfg->n_quant_overrides++];
        snprintf(o->path, sizeof o->path, "%s", e->valuestring);
        o->bits = o->group = 0;
    }
    return LOOM_OK;
}

/* MLX "quantization": {"group_size", "bits", "<module path>": {...} | false}. */
static loom_status parse_quant(const cJSON *root, const char *path, loom_config *cfg) {
    /* Hugging Face quantizers (gptq, awq, fp8, bitsandbytes, ...) name
     * themselves; MLX's copy of its settings there does not. */
    const cJSON *hq = get(root, "quantization_config");
    const cJSON *qm = cJSON_IsObject(hq) ? get(hq, "quant_method") : NULL;
    if (cJSON_IsString(qm) &&
        (!strcmp(qm->valuestring, "fp8") || !strcmp(qm->valuestring, "fbgemm_fp8")))
        return parse_fp8(hq, qm->valuestring, path, cfg);
    if (cJSON_IsString(qm))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: quantization_config quant_method \"%s\" is not "
                        "supported (MLX affine \"quantization\" and \"fp8\" are)", path,
                        qm->valuestring);
    const cJSON *q = get(root, "quantization");
    if (!cJSON_IsObject(q)) return LOOM_OK;
    loom_status s;
    if ((s = get_int(q, "bits", 1, 0, path, &cfg->quant_bits))) return s;
    if ((s = get_int(q, "group_size", 0, 64, path, &cfg->quant_group))) return s;
    for (const cJSON *e = q->child; e; e = e->next) {
        if (!strcmp(e->string, "bits") || !strcmp(e->string, "group_size") ||
            !strcmp(e->string, "mode"))
            continue;
        if (!cJSON_IsObject(e) && !cJSON_IsBool(e)) continue;
        if (cfg->n_quant_overrides == LOOM_MAX_QUANT_OVERRIDES)
            return loom_err(LOOM_ERR_UNSUPPORTED, "%s: more than %d quantization overrides", path,
                            LOOM_MAX_QUANT_OVERRIDES);
        loom_quant_override *o = &cfg->quant_overrides[cfg->n_quant_overrides++];
        snprintf(o->path, sizeof o->path, "%s", e->string);
        o->bits = 0;
        o->group = 0;
        if (cJSON_IsObject(e)) {
            if ((s = get_int(e, "bits", 0, cfg->quant_bits, path, &o->bits))) return s;
            if ((s = get_int(e, "group_size", 0, cfg->quant_group, path, &o->group))) return s;
        }
    }
    const cJSON *mode = get(q, "mode");
    if (cJSON_IsString(mode) && strcmp(mode->valuestring, "affine"))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: quantization mode \"%s\" is not supported "
                        "(expected affine)", path, mode->valuestring);
    return LOOM_OK;
}

/* Fields of the newer families: Gemma, MoE, linear attention. */
static loom_status parse_family(const cJSON *c, const char *path, loom_config *cfg) {
    loom_status s;
    if ((s = parse_layer_types(c, path, cfg))) return s;
    if ((s = get_int_in(c, "sliding_window_pattern", 0, 0, 0, INT_MAX, path, &cfg->sliding_pattern))) return s;
    if (!cfg->sliding_pattern &&
        (s = get_int_in(c, "_sliding_window_pattern", 0, 0, 0, INT_MAX, path, &cfg->sliding_pattern)))
        return s;
    if ((s = get_num(c, "attn_logit_softcapping", 0, path, &cfg->attn_softcap))) return s;
    if ((s = get_num(c, "final_logit_softcapping", 0, path, &cfg->final_softcap))) return s;
    if ((s = get_num(c, "query_pre_attn_scalar", 0, path, &cfg->query_pre_attn_scalar))) return s;
    if (!(cfg->query_pre_attn_scalar >= 0 && cfg->query_pre_attn_scalar < INFINITY))
        return bad_num(path, "", "query_pre_attn_scalar", "a non-negative number",
                       cfg->query_pre_attn_scalar);
    if (!(cfg->attn_softcap >= 0 && cfg->attn_softcap < INFINITY))
        return bad_num(path, "", "attn_logit_softcapping", "a non-negative number (0 = off)",
                       cfg->attn_softcap);
    if (!(cfg->final_softcap >= 0 && cfg->final_softcap < INFINITY))
        return bad_num(path, "", "final_logit_softcapping", "a non-negative number (0 = off)",
                       cfg->final_softcap);

    if ((s = get_int_in(c, "num_experts", 0, 0, 0, 1 << 16, path, &cfg->n_experts))) return s;
    if (!cfg->n_experts && (s = get_int_in(c, "num_local_experts", 0, 0, 0, 1 << 16, path, &cfg->n_experts)))
        return s;
    if ((s = get_int_in(c, "num_experts_per_tok", 0, 0, 0, 1 << 16, path, &cfg->n_experts_used))) return s;
    if (!cfg->n_experts_used && (s = get_int_in(c, "top_k_experts", 0, 0, 0, 1 << 16, path, &cfg->n_experts_used)))
        return s;
    if ((s = get_int_in(c, "moe_intermediate_size", 0, 0, 0, 1 << 24, path, &cfg->moe_intermediate))) return s;
    cfg->norm_topk_prob = get_bool(c, "norm_topk_prob", 0);
    if ((s = get_int(c, "decoder_sparse_step", 0, 1, path, &cfg->decoder_sparse_step))) return s;
    if (cfg->decoder_sparse_step <= 0) cfg->decoder_sparse_step = 1;
    const cJSON *mo = get(c, "mlp_only_layers");
    if (cJSON_IsArray(mo))
        for (const cJSON *e = mo->child; e; e = e->next)
            if (cJSON_IsNumber(e) && e->valueint >= 0 && e->valueint < cfg->n_layers)
                cfg->mlp_only[e->valueint] = 1;
    if ((s = get_int_in(c, "shared_expert_intermediate_size", 0, 0, 0, 1 << 24, path,
                     &cfg->shared_expert_intermediate)))
        return s;
    cfg->enable_moe_block = get_bool(c, "enable_moe_block", 0);
    if (cfg->n_experts < 0 || cfg->n_experts_used < 0 || cfg->n_experts_used > cfg->n_experts)
        return loom_err(LOOM_ERR_FORMAT, "%s: num_experts_per_tok %d with %d experts", path,
                        cfg->n_experts_used, cfg->n_experts);

    if ((s = get_int_in(c, "linear_conv_kernel_dim", 0, 4, 0, 1 << 12, path, &cfg->lin_conv_kernel))) return s;
    if ((s = get_int_in(c, "linear_num_key_heads", 0, 0, 0, 1 << 12, path, &cfg->lin_n_k_heads))) return s;
    if ((s = get_int_in(c, "linear_num_value_heads", 0, 0, 0, 1 << 12, path, &cfg->lin_n_v_heads))) return s;
    if ((s = get_int_in(c, "linear_key_head_dim", 0, 0, 0, 1 << 12, path, &cfg->lin_k_head_dim))) return s;
    if ((s = get_int_in(c, "linear_value_head_dim", 0, 0, 0, 1 << 12, path, &cfg->lin_v_head_dim))) return s;

    if ((s = get_int_in(c, "hidden_size_per_layer_input", 0, 0, 0, 1 << 16, path, &cfg->per_layer_input_dim)))
        return s;
    if ((s = get_int_in(c, "vocab_size_per_layer_input", 0, cfg->vocab_size, 0, INT_MAX, path,
                     &cfg->vocab_per_layer)))
        return s;
    if ((s = get_int_in(c, "num_kv_shared_layers", 0, 0, 0, cfg->n_layers, path, &cfg->n_kv_shared_layers))) return s;
    if ((s = get_int_in(c, "global_head_dim", 0, 0, 0, 1 << 12, path, &cfg->global_head_dim))) return s;
    if (cfg->global_head_dim % 2)
        return loom_err(LOOM_ERR_FORMAT, "%s: global_head_dim must be a non-negative even integer, "
                        "found %d", path, cfg->global_head_dim);
    cfg->attention_k_eq_v = get_bool(c, "attention_k_eq_v", 0);
    if ((s = get_int_in(c, "num_global_key_value_heads", 0, cfg->n_kv_heads, 1, cfg->n_heads, path,
                     &cfg->n_global_kv_heads)))
        return s;
    cfg->double_wide_mlp = get_bool(c, "use_double_wide_mlp", 0);
    const cJSON *plc = get(c, "per_layer_config");
    cfg->per_layer_config = cJSON_IsObject(plc) && plc->child;
    const cJSON *bi = get(c, "use_bidirectional_attention");
    cfg->bidirectional = (cJSON_IsBool(bi) && cJSON_IsTrue(bi)) || cJSON_IsString(bi);
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

    /* Upper bounds keep the products of sizes the loader and the forward
     * compute in int (heads x head_dim, layers x per-layer widths) far from
     * overflow; real models are well under them. vocab_size is checked
     * against the embedding when the weights are bound. */
    if ((s = get_int_in(c, "vocab_size", 1, 0, 1, INT_MAX, path, &cfg->vocab_size))) goto out;
    if ((s = get_int_in(c, "hidden_size", 1, 0, 1, 1 << 20, path, &cfg->hidden_size))) goto out;
    if ((s = get_int_in(c, "num_hidden_layers", 1, 0, 1, INT_MAX, path, &cfg->n_layers))) goto out;
    if (cfg->n_layers > LOOM_MAX_LAYERS) {
        s = loom_err(LOOM_ERR_UNSUPPORTED, "%s: num_hidden_layers %d, at most %d supported", path,
                     cfg->n_layers, LOOM_MAX_LAYERS);
        goto out;
    }
    if ((s = get_int_in(c, "num_attention_heads", 1, 0, 1, 1 << 12, path, &cfg->n_heads)))
        goto out;
    if ((s = get_int_in(c, "num_key_value_heads", 0, cfg->n_heads, 1, cfg->n_heads, path,
                        &cfg->n_kv_heads)))
        goto out;
    if ((s = get_int_in(c, "intermediate_size", 1, 0, 1, 1 << 24, path, &cfg->intermediate_size)))
        goto out;
    if ((s = get_int_in(c, "max_position_embeddings", 0, 4096, 1, INT_MAX, path,
                        &cfg->max_positions)))
        goto out;
    if ((s = get_int_in(c, "sliding_window", 0, 0, 0, INT_MAX, path, &cfg->sliding_window)))
        goto out;
    if (cfg->n_heads % cfg->n_kv_heads) {
        s = loom_err(LOOM_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of "
                     "num_key_value_heads %d", path, cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    if ((s = get_int_in(c, "head_dim", 0, cfg->hidden_size / cfg->n_heads, 1, 1 << 12, path,
                        &cfg->head_dim)))
        goto out;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2) {
        s = loom_err(LOOM_ERR_FORMAT, "%s: head_dim must be a positive even integer, found %d%s",
                     path, cfg->head_dim, get(c, "head_dim") ? "" : " (hidden_size / "
                     "num_attention_heads)");
        goto out;
    }
    double eps;
    if ((s = get_num(c, "rms_norm_eps", 1e-6, path, &eps))) goto out;
    if (!positive(eps)) {
        s = bad_num(path, "", "rms_norm_eps", "a positive number", eps);
        goto out;
    }
    cfg->rms_eps = eps;
    const cJSON *tie = get(c, "tie_word_embeddings");
    if (!tie) tie = get(root, "tie_word_embeddings");
    cfg->tie_embeddings = tie ? cJSON_IsTrue(tie) : 1;
    const cJSON *ab = get(c, "attention_bias");
    cfg->attention_bias = cJSON_IsTrue(ab);
    cfg->mlp_bias = cJSON_IsTrue(get(c, "mlp_bias"));
    if ((s = parse_rope(c, path, cfg))) goto out;
    if ((s = parse_family(c, path, cfg))) goto out;
    if ((s = parse_quant(root, path, cfg))) goto out;

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

/* generation_config.json's sampling defaults, each checked as the sampler
 * will check it. "do_sample": false is greedy in transformers, which then
 * applies no temperature, top-p or top-k warper (nor min-p). */
static loom_status parse_gen_sampling(const cJSON *g, const char *path, loom_config *cfg) {
    loom_sampling *sp = &cfg->gen_sampling;
    static const struct {
        const char *key;
        unsigned bit;
        double lo, hi;
        int lo_open;
    } fields[] = {
        {"temperature", LOOM_SAMPLING_TEMPERATURE, 0, 100, 0},
        {"top_p", LOOM_SAMPLING_TOP_P, 0, 1, 1},
        {"min_p", LOOM_SAMPLING_MIN_P, 0, 1, 0},
        {"repetition_penalty", LOOM_SAMPLING_REPETITION_PENALTY, 0, 100, 1},
    };
    float *dst[] = {&sp->temperature, &sp->top_p, &sp->min_p, &sp->repetition_penalty};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(fields); i++) {
        const cJSON *v = get(g, fields[i].key);
        if (!v || cJSON_IsNull(v)) continue;
        double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!(fields[i].lo_open ? d > fields[i].lo : d >= fields[i].lo) || !(d <= fields[i].hi)) {
            char found[64];
            return loom_err(LOOM_ERR_FORMAT, "%s: %s must be a number in %c%g, %g], found %s", path,
                            fields[i].key, fields[i].lo_open ? '(' : '[', fields[i].lo,
                            fields[i].hi, found_str(v, found, sizeof found));
        }
        *dst[i] = (float)d;
        cfg->gen_sampling_set |= fields[i].bit;
    }
    const cJSON *tk = get(g, "top_k");
    if (tk && !cJSON_IsNull(tk)) {
        int k;
        loom_status s = get_int(g, "top_k", 1, 0, path, &k);
        if (s) return s;
        if (k < -1)
            return loom_err(LOOM_ERR_FORMAT, "%s: top_k must be a non-negative integer (or -1, "
                            "off), found %d", path, k);
        sp->top_k = k < 0 ? 0 : k;  /* -1 is off, as 0 is */
        cfg->gen_sampling_set |= LOOM_SAMPLING_TOP_K;
    }
    if (cJSON_IsFalse(get(g, "do_sample"))) {
        loom_sampling d = loom_sampling_default();
        unsigned warpers = LOOM_SAMPLING_TOP_P | LOOM_SAMPLING_TOP_K | LOOM_SAMPLING_MIN_P;
        loom_sampling_apply(sp, &d, warpers);
        sp->temperature = 0;
        cfg->gen_sampling_set = (cfg->gen_sampling_set & ~warpers) | LOOM_SAMPLING_TEMPERATURE;
    }
    return LOOM_OK;
}

/* A JSON object file under dir, or NULL with *st LOOM_OK when absent. */
static cJSON *read_json_object(const char *dir, const char *name, loom_status *st) {
    char path[4096];
    char *text = NULL;
    size_t len = 0;
    *st = loom_path_join(path, sizeof path, dir, name);
    if (*st || access(path, F_OK) != 0) return NULL;
    if ((*st = loom_read_file(path, &text, &len))) return NULL;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    if (!o) *st = loom_err(LOOM_ERR_FORMAT, "%s: expected JSON, found invalid JSON", path);
    return o;
}

/* sentence-transformers: modules.json lists the pipeline; its Pooling
 * module's config.json says how token vectors become one. */
static loom_status load_pooling(const char *dir, loom_config *cfg) {
    loom_status st;
    cJSON *mods = read_json_object(dir, "modules.json", &st);
    const cJSON *pool = NULL;
    for (const cJSON *m = cJSON_IsArray(mods) ? mods->child : NULL; m && !pool; m = m->next) {
        const cJSON *type = get(m, "type"), *path = get(m, "path");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        size_t n = strlen(t);
        if (n >= 7 && !strcmp(t + n - 7, "Pooling") && cJSON_IsString(path)) pool = path;
    }
    char sub[4096];
    cJSON *pc = NULL;
    if (pool && !(st = loom_path_join(sub, sizeof sub, pool->valuestring, "config.json")))
        pc = read_json_object(dir, sub, &st);
    static const struct { const char *key; int mode; } modes[] = {
        {"pooling_mode_lasttoken", LOOM_POOLING_LAST},
        {"pooling_mode_mean_tokens", LOOM_POOLING_MEAN},
        {"pooling_mode_cls_token", LOOM_POOLING_CLS},
    };
    int found = 0, set = 0;
    for (size_t i = 0; pc && i < LOOM_ARRAY_LEN(modes); i++)
        if (get_bool(pc, modes[i].key, 0)) found = found ? -1 : modes[i].mode;
    loom_buf names = {0};
    for (const cJSON *f = pc ? pc->child : NULL; f; f = f->next)
        if (f->string && !strncmp(f->string, "pooling_mode_", 13) && cJSON_IsTrue(f))
            loom_buf_printf(&names, "%s%s", set++ ? ", " : "", f->string);
    if (pc && (found <= 0 || set != 1))
        loom_log(LOOM_LOG_WARN, "%s/%s: expected one of pooling_mode_lasttoken, pooling_mode_mean_tokens "
                 "or pooling_mode_cls_token set, found %s; embeddings pool the last token", dir, sub,
                 set ? names.p : "none");
    else if (found > 0)
        cfg->pooling = found;
    loom_buf_free(&names);
    cJSON_Delete(pc);
    cJSON_Delete(mods);
    return st;
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
    cfg->gen_sampling = loom_sampling_default();
    if ((s = load_pooling(dir, cfg))) return s;
    /* generation_config.json may list more stop ids than config.json. */
    if ((s = loom_path_join(path, sizeof path, dir, "generation_config.json"))) return s;
    if (access(path, F_OK) != 0) return LOOM_OK; /* the file is optional */
    size_t len = 0;
    if ((s = loom_read_file(path, &text, &len))) return s;
    /* a file that is there but broken would silently drop the model's
     * sampling defaults and stop ids */
    const char *end = NULL;
    cJSON *g = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!cJSON_IsObject(g)) {
        const char *found = !len ? "an empty file" : g ? "another JSON value" : "invalid JSON";
        size_t at = !g && end ? (size_t)(end - text) : 0;
        cJSON_Delete(g);
        free(text);
        return loom_err(LOOM_ERR_FORMAT, "%s: expected a JSON object, found %s (byte %zu)", path,
                        found, at);
    }
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
    s = parse_gen_sampling(g, path, cfg);
    cJSON_Delete(g);
    return s;
}
