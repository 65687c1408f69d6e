/* sample: turns a logits row into a token id under a request's sampling
 * policy (see loom_sampling in loom.h for the order of the steps), and
 * reports log-probabilities. One sampler per request: it owns the random
 * state and the penalty window, so a request's tokens never depend on what
 * else shares the batch. */
#ifndef LOOM_SAMPLE_H
#define LOOM_SAMPLE_H

#include <stdint.h>

#include "loom.h"

#define LOOM_MAX_TOP_LOGPROBS 20

typedef struct loom_sampler {
    loom_sampling p;            /* frozen copy; p.logit_bias points at bias */
    loom_logit_bias *bias;      /* owned [p.n_logit_bias] */
    int vocab;
    uint64_t rng;               /* xorshift64* state */
    int32_t *idx;               /* owned [vocab] scratch */
    float *prob;                /* owned [vocab] scratch */
    /* Penalty window, allocated only when a penalty is on. */
    int32_t *window;            /* owned ring [window_cap] of recent tokens */
    uint8_t *is_output;         /* owned ring [window_cap]: token was generated */
    int window_cap, window_len, window_head;
    int *count_ctx, *count_out; /* owned [vocab] occurrences in the window */
} loom_sampler;

/* The chosen token and, when asked, its log-probability and the top n. */
typedef struct loom_sample_result {
    int32_t id;
    float logprob;              /* log softmax of the raw logits */
    int n_top;
    int32_t top_ids[LOOM_MAX_TOP_LOGPROBS];
    float top_logprobs[LOOM_MAX_TOP_LOGPROBS];
} loom_sample_result;

/* One row's sampling for a token drawn outside the sampler (a device
 * forward, loom_cuda_sample): what loom_sampler_pick does for temperature
 * > 0, 1 <= top_k <= the drawing side's limit (LOOM_CUDA_TOPK_MAX), top_p,
 * min_p (no XTC, bias or penalties), with u the request generator's next
 * uniform draw in [0, 1) (loom_sampler_uniform). */
typedef struct loom_sample_pick {
    float temperature, top_p, min_p;
    int top_k;
    double u;
} loom_sample_pick;

/* Validates and copies p. Errors name the bad field. */
loom_status loom_sampler_init(loom_sampler *s, const loom_sampling *p, int vocab);
void loom_sampler_free(loom_sampler *s);
/* Adds a token to the penalty window (prompt tokens with is_output 0). */
void loom_sampler_accept(loom_sampler *s, int32_t id, int is_output);
/* Picks a token. logits [vocab] are used as scratch (modified). With
 * n_top >= 0, fills logprob and the n_top most likely tokens. */
void loom_sampler_pick(loom_sampler *s, float *logits, int n_top, loom_sample_result *r);
/* Speculative verification of a drafted token under the same steps as
 * loom_sampler_pick (logits [vocab] are scratch): greedy keeps draft when
 * it is the argmax; sampling keeps it with probability p(draft) and else
 * draws from p without it, so that r->id is distributed as a pick's
 * (the drafter proposes one token: q is one-hot). Returns 1 when r->id is
 * the draft. draft < 0: a plain pick (returns 0). Not with XTC, whose cut
 * is itself a draw. */
int loom_sampler_verify(loom_sampler *s, float *logits, int32_t draft, int n_top,
                        loom_sample_result *r);
/* Log-probability of token id under the raw logits [vocab] and the n_top
 * most likely tokens, into r (r->id = id); no sampling step applies. */
void loom_sampler_logprobs(loom_sampler *s, const float *logits, int32_t id, int n_top,
                           loom_sample_result *r);
/* The next draw of the request's generator in [0, 1): the one
 * loom_sampler_pick would take, for a pick made elsewhere (on the device)
 * from the same settings. */
double loom_sampler_uniform(loom_sampler *s);

#endif
