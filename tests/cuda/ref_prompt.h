/* ref_prompt.h: the GPU tests' reading of a fixture's reference.safetensors
 * (the transformers run). */
#ifndef LOOM_TESTS_CUDA_REF_PROMPT_H
#define LOOM_TESTS_CUDA_REF_PROMPT_H

#include <stdint.h>
#include <stdio.h>

#include "load/safetensors.h"

/* Prompt i: its ids and their count, and where asked (non-NULL) its greedy
 * continuation and logits (len, vocab). 0, with NULL / 0 outputs, where
 * any asked for is missing. */
static inline int ref_prompt(const loom_safetensors *ref, int i, const int32_t **ids, int *len,
                             const int32_t **greedy, const float **logits) {
    char k[64];
    snprintf(k, sizeof k, "prompt.%d.ids", i);
    const loom_st_tensor *t = loom_st_find(ref, k), *g = NULL, *l = NULL;
    if (greedy) {
        snprintf(k, sizeof k, "prompt.%d.greedy", i);
        g = loom_st_find(ref, k);
    }
    if (logits) {
        snprintf(k, sizeof k, "prompt.%d.logits", i);
        l = loom_st_find(ref, k);
    }
    int ok = t && (!greedy || g) && (!logits || l);
    *ids = ok ? t->data : NULL;
    *len = ok ? (int)t->shape[0] : 0;
    if (greedy) *greedy = ok ? g->data : NULL;
    if (logits) *logits = ok ? l->data : NULL;
    return ok;
}

#endif
