/* sample: greedy and stochastic token selection. */
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>

#include "base/base.h"
#include "ops/ops.h"

loom_sample_params loom_sample_default_params(void) {
    return (loom_sample_params){.temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0,
                                .seed = 0x9e3779b97f4a7c15ull};
}

loom_status loom_sampler_init(loom_sampler *s, const loom_sample_params *p, int vocab) {
    *s = (loom_sampler){.p = p ? *p : loom_sample_default_params()};
    s->rng = s->p.seed ? s->p.seed : 0x9e3779b97f4a7c15ull;
    s->cap = vocab;
    s->idx = malloc(sizeof *s->idx * (size_t)vocab);
    s->prob = malloc(sizeof *s->prob * (size_t)vocab);
    if (!s->idx || !s->prob) {
        loom_sampler_free(s);
        return loom_err(LOOM_ERR_NOMEM, "sampler: out of memory");
    }
    return LOOM_OK;
}

void loom_sampler_free(loom_sampler *s) {
    free(s->idx);
    free(s->prob);
    s->idx = NULL;
    s->prob = NULL;
}

static double next_uniform(loom_sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (double)((s->rng * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}

static int by_prob_desc(const void *a, const void *b, void *keys) {
    const float *k = keys;
    float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int32_t *)a - *(const int32_t *)b);
}

int32_t loom_sampler_pick(loom_sampler *s, const float *logits, int n) {
    if (s->p.temperature <= 0 || s->p.top_k == 1 || n > s->cap) return loom_argmax(logits, n);
    float mx = logits[loom_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temperature);
        sum += s->prob[i];
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = (float)(s->prob[i] / sum);
        /* min-p: drop tokens below min_p times the top probability (1/sum). */
        if (s->p.min_p > 0 && s->prob[i] < s->p.min_p * (float)(1.0 / sum)) continue;
        s->idx[m++] = i;
    }
    qsort_r(s->idx, (size_t)m, sizeof *s->idx, by_prob_desc, s->prob);
    if (s->p.top_k > 0 && s->p.top_k < m) m = s->p.top_k;
    double keep = 0;
    int cut = m;
    for (int i = 0; i < m; i++) {
        keep += s->prob[s->idx[i]];
        if (s->p.top_p < 1 && keep >= s->p.top_p) { cut = i + 1; break; }
    }
    m = cut;
    double tot = 0;
    for (int i = 0; i < m; i++) tot += s->prob[s->idx[i]];
    double r = next_uniform(s) * tot, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[m - 1];
}
