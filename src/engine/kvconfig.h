/* kvconfig: per-layer KV storage from a kv_config.json file:
 *
 *   [{"layer_idx": 0, "bits": 8, "group_size": 64},
 *    {"layer_idx": 5, "bits": 16}]
 *
 * bits 16 stores the layer's rows as f16 (32 as f32); 8 and 4 quantize
 * them affinely in groups of group_size values (32, 64 or 128, dividing
 * the KV row; default 64, or 32 for rows that are not a multiple of 64).
 * Layers not listed keep the engine's KV type. */
#ifndef LOOM_KVCONFIG_H
#define LOOM_KVCONFIG_H

#include "engine/kv.h"

/* Fills spec[0, n_layers) with base, then applies the file at path. Errors
 * (LOOM_ERR_IO, LOOM_ERR_FORMAT, LOOM_ERR_INVALID_ARG) name the file, the
 * entry, and what was expected and found. */
loom_status loom_kv_config_load(const char *path, int n_layers, int kv_dim, loom_kv_type base,
                                loom_kv_spec *spec);
/* Namespace text of a pool's storage ("f32", "q8/g128", "mixed:<hash>"),
 * so caches never mix KV stored differently. */
void loom_kv_layout_name(const loom_kv_pool *p, char *out, size_t cap);

#endif
