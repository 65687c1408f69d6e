/* kvconfig: kv_config.json into per-layer row codecs. */
#include "engine/kvconfig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/base.h"

static const char *json_kind(const cJSON *v) {
    return cJSON_IsNumber(v) ? "a number" : cJSON_IsString(v) ? "a string" : cJSON_IsArray(v) ? "an array"
           : cJSON_IsObject(v) ? "an object" : cJSON_IsBool(v) ? "a boolean" : "null";
}

/* An integer member, or fails naming it. present: 0 when absent. */
static loom_status get_int(const char *path, int i, const cJSON *e, const char *key, int *out,
                           int *present) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    *present = v != NULL;
    if (!v) return LOOM_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 1e9) {
        char found[64];
        if (cJSON_IsNumber(v)) snprintf(found, sizeof found, "%g", v->valuedouble);
        else snprintf(found, sizeof found, "%s", json_kind(v));
        return loom_err(LOOM_ERR_FORMAT, "kv config %s: entry %d: %s: expected an integer, found %s",
                        path, i, key, found);
    }
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static loom_status apply(const char *path, const cJSON *root, int n_layers, int kv_dim, loom_kv_spec *spec,
                         int *seen) {
    if (!cJSON_IsArray(root))
        return loom_err(LOOM_ERR_FORMAT,
                        "kv config %s: expected a JSON array of {\"layer_idx\", \"bits\", \"group_size\"} "
                        "objects, found %s", path, json_kind(root));
    int i = 0;
    for (const cJSON *e = root->child; e; e = e->next, i++) {
        if (!cJSON_IsObject(e))
            return loom_err(LOOM_ERR_FORMAT, "kv config %s: entry %d: expected an object, found %s", path, i,
                            json_kind(e));
        for (const cJSON *k = e->child; k; k = k->next)
            if (strcmp(k->string, "layer_idx") && strcmp(k->string, "bits") && strcmp(k->string, "group_size"))
                return loom_err(LOOM_ERR_FORMAT,
                                "kv config %s: entry %d: unknown key \"%s\" (expected layer_idx, bits, "
                                "group_size)", path, i, k->string);
        int layer = -1, bits = 0, group = 0, has_layer, has_bits, has_group;
        loom_status s = get_int(path, i, e, "layer_idx", &layer, &has_layer);
        if (!s) s = get_int(path, i, e, "bits", &bits, &has_bits);
        if (!s) s = get_int(path, i, e, "group_size", &group, &has_group);
        if (s) return s;
        if (!has_layer || !has_bits)
            return loom_err(LOOM_ERR_FORMAT, "kv config %s: entry %d: expected \"layer_idx\" and \"bits\", "
                            "found no \"%s\"", path, i, has_layer ? "bits" : "layer_idx");
        if (layer < 0 || layer >= n_layers)
            return loom_err(LOOM_ERR_INVALID_ARG,
                            "kv config %s: entry %d: layer_idx %d is out of range (the model has %d "
                            "layers: 0..%d)", path, i, layer, n_layers, n_layers - 1);
        if (seen[layer])
            return loom_err(LOOM_ERR_INVALID_ARG, "kv config %s: entry %d: layer %d is listed twice "
                            "(first in entry %d)", path, i, layer, seen[layer] - 1);
        seen[layer] = i + 1;
        loom_kv_spec sp = {0};
        switch (bits) {
        case 32: sp.type = LOOM_KV_F32; break;
        case 16: sp.type = LOOM_KV_F16; break;
        case 8: sp.type = LOOM_KV_Q8; break;
        case 4: sp.type = LOOM_KV_Q4; break;
        default:
            return loom_err(LOOM_ERR_INVALID_ARG,
                            "kv config %s: entry %d (layer %d): bits %d is not supported (expected 4, 8, "
                            "16 or 32)", path, i, layer, bits);
        }
        if (bits <= 8) {
            sp.group = has_group ? group : 0;
            if (has_group && ((group != 32 && group != 64 && group != 128) || kv_dim % group))
                return loom_err(LOOM_ERR_INVALID_ARG,
                                "kv config %s: entry %d (layer %d): group_size %d is not supported "
                                "(expected 32, 64 or 128, dividing the KV row of %d values)", path, i,
                                layer, group, kv_dim);
            if (!loom_kv_spec_block_bytes(&sp, 1, kv_dim, 1))
                return loom_err(LOOM_ERR_INVALID_ARG,
                                "kv config %s: entry %d (layer %d): %d-bit rows of %d values cannot be "
                                "grouped (expected a row that is a multiple of 32)", path, i, layer, bits,
                                kv_dim);
        }
        spec[layer] = sp;
    }
    return LOOM_OK;
}

loom_status loom_kv_config_load(const char *path, int n_layers, int kv_dim, loom_kv_type base,
                                loom_kv_spec *spec) {
    for (int l = 0; l < n_layers; l++) spec[l] = (loom_kv_spec){.type = base};
    size_t len = 0;
    char *text = NULL;
    loom_status s = loom_read_file(path, &text, &len);
    if (s) return s;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        free(text);
        return loom_err(LOOM_ERR_FORMAT, "kv config %s: not valid JSON (error near byte %zu)", path, off);
    }
    int *seen = calloc((size_t)n_layers, sizeof *seen);
    s = seen ? apply(path, root, n_layers, kv_dim, spec, seen) : loom_err(LOOM_ERR_NOMEM, "out of memory");
    free(seen);
    cJSON_Delete(root);
    free(text);
    return s;
}

void loom_kv_layout_name(const loom_kv_pool *p, char *out, size_t cap) {
    const loom_kv_layer *L = &p->lay.layer[0];
    if (!p->lay.mixed) {
        int def = p->lay.kv_dim % 64 == 0 ? 64 : 32;
        if (L->bits && L->group != def) snprintf(out, cap, "%s/g%d", loom_kv_type_name(L->type), L->group);
        else snprintf(out, cap, "%s", loom_kv_type_name(L->type));
        return;
    }
    /* chained one-shot hashes: no state to allocate or fail */
    uint64_t h = 0;
    for (int l = 0; l < p->lay.n_layers; l++) {
        int32_t v[2] = {(int32_t)p->lay.layer[l].type, p->lay.layer[l].bits ? p->lay.layer[l].group : 0};
        h = XXH3_64bits_withSeed(v, sizeof v, h);
    }
    snprintf(out, cap, "mixed:%016llx", (unsigned long long)h);
}
