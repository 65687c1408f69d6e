/* Helpers for checks that follow a greedy path through a model: the
 * logits at each step, and how clear each step's choice was. */
#ifndef LOOM_TEST_PATH_H
#define LOOM_TEST_PATH_H

#include <math.h>
#include <stdint.h>

#include "loom.h"

/* Next-token logits at each of the ng steps of a greedy path: after the
 * prompt ids[0, L), then after each path token (out: [ng][V]), with KV
 * type t. */
static inline int test_path_logits(loom_model *m, loom_kv_type t, const int32_t *ids, int L,
                                   const int32_t *path, int ng, float *out) {
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = L + ng + 1;
    cp.kv_type = t;
    loom_context *c = NULL;
    if (loom_context_create(m, &cp, &c) != LOOM_OK) return 0;
    int V = loom_model_vocab_size(m), ok = loom_context_eval(c, ids, L, 0, out) == LOOM_OK;
    for (int k = 0; ok && k + 1 < ng; k++)
        ok = loom_context_eval(c, &path[k], 1, 0, out + (size_t)(k + 1) * V) == LOOM_OK;
    loom_context_free(c);
    return ok;
}

/* The best logit's lead over the second. */
static inline double test_top2_margin(const float *l, int V) {
    double a = -INFINITY, b = -INFINITY;
    for (int k = 0; k < V; k++) {
        if (l[k] > a) b = a, a = l[k];
        else if (l[k] > b) b = l[k];
    }
    return a - b;
}

#endif
