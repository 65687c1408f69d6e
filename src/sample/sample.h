/* sample: turns a logits row into a token id under a sampling policy.
 * Temperature 0 is greedy (argmax). Otherwise the order is: temperature,
 * top-k, top-p, min-p, then a draw from the renormalised distribution with
 * the sampler's own random state (seeded, so runs are reproducible). */
#ifndef LOOM_SAMPLE_H
#define LOOM_SAMPLE_H

#include <stdint.h>

#include "loom.h"

typedef struct loom_sample_params {
    float temperature;   /* 0 = greedy */
    int top_k;           /* 0 = off */
    float top_p;         /* 1 = off */
    float min_p;         /* 0 = off */
    uint64_t seed;
} loom_sample_params;

loom_sample_params loom_sample_default_params(void);

typedef struct loom_sampler {
    loom_sample_params p;
    uint64_t rng;        /* xorshift64* state */
    int cap;
    int32_t *idx;        /* owned [cap] scratch */
    float *prob;         /* owned [cap] scratch */
} loom_sampler;

loom_status loom_sampler_init(loom_sampler *s, const loom_sample_params *p, int vocab);
void loom_sampler_free(loom_sampler *s);
/* Picks a token from logits [n] (logits are not modified). */
int32_t loom_sampler_pick(loom_sampler *s, const float *logits, int n);

#endif
