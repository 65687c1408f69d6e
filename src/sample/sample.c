/* sample: logit processing and selection. Candidates for top-k / top-p are
 * taken from a max-heap over the whole vocabulary (O(V + k log V)), so a
 * 150k vocabulary costs no full sort. */
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"

loom_sampling loom_sampling_default(void) {
    return (loom_sampling){
        .temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0, .xtc_probability = 0,
        .xtc_threshold = 0.1f, .repetition_penalty = 1, .presence_penalty = 0,
        .frequency_penalty = 0, .penalty_last_n = 64, .seed = 0,
    };
}

void loom_sampling_apply(loom_sampling *dst, const loom_sampling *src, unsigned fields) {
    if (fields & LOOM_SAMPLING_TEMPERATURE) dst->temperature = src->temperature;
    if (fields & LOOM_SAMPLING_TOP_P) dst->top_p = src->top_p;
    if (fields & LOOM_SAMPLING_TOP_K) dst->top_k = src->top_k;
    if (fields & LOOM_SAMPLING_MIN_P) dst->min_p = src->min_p;
    if (fields & LOOM_SAMPLING_REPETITION_PENALTY) dst->repetition_penalty = src->repetition_penalty;
}

static int penalties_on(const loom_sampling *p) {
    return p->repetition_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

loom_status loom_sampler_init(loom_sampler *s, const loom_sampling *p, int vocab) {
    memset(s, 0, sizeof *s);
    s->p = p ? *p : loom_sampling_default();
    p = &s->p;
#define BAD(cond, ...) if (cond) return loom_err(LOOM_ERR_INVALID_ARG, __VA_ARGS__)
    BAD(!(p->temperature >= 0 && p->temperature <= 100), "temperature: expected 0..100, found %g",
        p->temperature);
    BAD(p->top_k < 0, "top_k: expected >= 0, found %d", p->top_k);
    BAD(!(p->top_p > 0 && p->top_p <= 1), "top_p: expected (0, 1], found %g", p->top_p);
    BAD(!(p->min_p >= 0 && p->min_p <= 1), "min_p: expected [0, 1], found %g", p->min_p);
    BAD(!(p->xtc_probability >= 0 && p->xtc_probability <= 1),
        "xtc_probability: expected [0, 1], found %g", p->xtc_probability);
    BAD(!(p->repetition_penalty > 0 && p->repetition_penalty <= 100),
        "repetition_penalty: expected (0, 100], found %g", p->repetition_penalty);
    BAD(!(fabsf(p->presence_penalty) <= 2), "presence_penalty: expected -2..2, found %g",
        p->presence_penalty);
    BAD(!(fabsf(p->frequency_penalty) <= 2), "frequency_penalty: expected -2..2, found %g",
        p->frequency_penalty);
    BAD(p->penalty_last_n < -1, "penalty_last_n: expected -1 or >= 0, found %d", p->penalty_last_n);
    BAD(p->n_logit_bias < 0 || (p->n_logit_bias && !p->logit_bias), "logit_bias: bad count");
    for (int i = 0; i < p->n_logit_bias; i++) {
        BAD(p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab,
            "logit_bias: token %d is outside the vocabulary (0..%d)", p->logit_bias[i].token,
            vocab - 1);
        BAD(isnan(p->logit_bias[i].bias), "logit_bias: bias for token %d is NaN",
            p->logit_bias[i].token);
    }
#undef BAD
    s->vocab = vocab;
    s->rng = p->seed ? p->seed * 0x9e3779b97f4a7c15ull + 1 : 0x9e3779b97f4a7c15ull;
    s->idx = malloc(sizeof *s->idx * (size_t)vocab);
    s->prob = malloc(sizeof *s->prob * (size_t)vocab);
    if (p->n_logit_bias) {
        s->bias = malloc(sizeof *s->bias * (size_t)p->n_logit_bias);
        if (s->bias) memcpy(s->bias, p->logit_bias, sizeof *s->bias * (size_t)p->n_logit_bias);
    }
    s->p.logit_bias = s->bias;
    int fail = !s->idx || !s->prob || (p->n_logit_bias && !s->bias);
    if (!fail && penalties_on(p) && p->penalty_last_n != 0) {
        s->window_cap = p->penalty_last_n > 0 ? p->penalty_last_n : 1024;
        s->window = malloc(sizeof *s->window * (size_t)s->window_cap);
        s->is_output = malloc((size_t)s->window_cap);
        s->count_ctx = calloc((size_t)vocab, sizeof *s->count_ctx);
        s->count_out = calloc((size_t)vocab, sizeof *s->count_out);
        fail = !s->window || !s->is_output || !s->count_ctx || !s->count_out;
    }
    if (fail) {
        loom_sampler_free(s);
        return loom_err(LOOM_ERR_NOMEM, "sampler: out of memory");
    }
    return LOOM_OK;
}

void loom_sampler_free(loom_sampler *s) {
    free(s->idx);
    free(s->prob);
    free(s->bias);
    free(s->window);
    free(s->is_output);
    free(s->count_ctx);
    free(s->count_out);
    memset(s, 0, sizeof *s);
}

void loom_sampler_accept(loom_sampler *s, int32_t id, int is_output) {
    if (!s->window || id < 0 || id >= s->vocab) return;
    if (s->window_len == s->window_cap) {
        /* whole-sequence window: grow instead of forgetting */
        if (s->p.penalty_last_n < 0) {
            int cap = s->window_cap * 2;
            int32_t *w = malloc(sizeof *w * (size_t)cap);
            uint8_t *o = malloc((size_t)cap);
            if (w && o) {
                for (int i = 0; i < s->window_len; i++) {
                    int j = (s->window_head + i) % s->window_cap;
                    w[i] = s->window[j];
                    o[i] = s->is_output[j];
                }
                free(s->window);
                free(s->is_output);
                s->window = w;
                s->is_output = o;
                s->window_head = 0;
                s->window_cap = cap;
            } else {
                free(w);
                free(o);
            }
        }
        if (s->window_len == s->window_cap) {
            int old = s->window[s->window_head];
            s->count_ctx[old]--;
            if (s->is_output[s->window_head]) s->count_out[old]--;
            s->window_head = (s->window_head + 1) % s->window_cap;
            s->window_len--;
        }
    }
    int at = (s->window_head + s->window_len) % s->window_cap;
    s->window[at] = id;
    s->is_output[at] = (uint8_t)(is_output != 0);
    s->window_len++;
    s->count_ctx[id]++;
    if (is_output) s->count_out[id]++;
}

static uint64_t next_u64(loom_sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 0x2545f4914f6cdd1dull;
}
static double next_uniform(loom_sampler *s) {
    return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

double loom_sampler_uniform(loom_sampler *s) { return next_uniform(s); }

/* Max-heap of indices keyed by v; ties put the lower index first so
 * selection order is deterministic. */
static int heap_less(const float *v, int32_t a, int32_t b) {
    return v[a] < v[b] || (v[a] == v[b] && a > b);
}
static void sift_down(int32_t *h, int n, int i, const float *v) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(v, h[m], h[l])) m = l;
        if (r < n && heap_less(v, h[m], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}
static void heapify(int32_t *h, int n, const float *v) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(h, n, i, v);
}
static int32_t heap_pop(int32_t *h, int *n, const float *v) {
    int32_t top = h[0];
    h[0] = h[--*n];
    sift_down(h, *n, 0, v);
    return top;
}

/* Log-probabilities of the raw logits and the top n. */
static void logprobs(loom_sampler *s, const float *logits, int n_top, loom_sample_result *r) {
    int V = s->vocab;
    float mx = logits[loom_argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    float lse = mx + (float)log(sum);
    r->logprob = logits[r->id] - lse;
    if (n_top > LOOM_MAX_TOP_LOGPROBS) n_top = LOOM_MAX_TOP_LOGPROBS;
    if (n_top > V) n_top = V;
    r->n_top = n_top;
    if (n_top <= 0) return;
    int n = V;
    for (int i = 0; i < V; i++) s->idx[i] = i;
    heapify(s->idx, n, logits);
    for (int k = 0; k < n_top; k++) {
        int32_t id = heap_pop(s->idx, &n, logits);
        r->top_ids[k] = id;
        r->top_logprobs[k] = logits[id] - lse;
    }
}

void loom_sampler_logprobs(loom_sampler *s, const float *logits, int32_t id, int n_top,
                           loom_sample_result *r) {
    memset(r, 0, sizeof *r);
    r->id = id;
    logprobs(s, logits, n_top, r);
}

/* The request's transforms of logits in place: bias, then penalties. */
static void adjust(loom_sampler *s, float *logits) {
    const loom_sampling *p = &s->p;
    for (int i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias[i].token] += p->logit_bias[i].bias;
    if (s->window) {
        for (int i = 0; i < s->window_len; i++) {
            int t = s->window[(s->window_head + i) % s->window_cap];
            if (s->count_ctx[t] <= 0) continue;
            /* Each distinct token once: the count is negated while in use. */
            float *l = &logits[t];
            if (p->repetition_penalty != 1)
                *l = *l > 0 ? *l / p->repetition_penalty : *l * p->repetition_penalty;
            if (s->count_out[t] > 0)
                *l -= p->presence_penalty + p->frequency_penalty * (float)s->count_out[t];
            s->count_ctx[t] = -s->count_ctx[t];
        }
        for (int i = 0; i < s->window_len; i++) {
            int t = s->window[(s->window_head + i) % s->window_cap];
            if (s->count_ctx[t] < 0) s->count_ctx[t] = -s->count_ctx[t];
        }
    }
}

static int greedy(const loom_sampling *p) { return p->temperature <= 0 || p->top_k == 1; }

/* The candidates of a sampled (not greedy) pick from adjusted logits:
 * their probabilities (temperature, top-k, top-p, min-p, XTC) are left in
 * logits[], unnormalised over the m ids of *cand, most likely first when
 * sorted. */
static int candidates(loom_sampler *s, float *logits, int32_t **cand_out) {
    const loom_sampling *p = &s->p;
    int V = s->vocab;
    {
        /* probabilities at temperature, kept in logits[] */
        float mx = logits[loom_argmax(logits, V)];
        double sum = 0;
        for (int i = 0; i < V; i++) {
            float e = expf((logits[i] - mx) / p->temperature);
            logits[i] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < V; i++) logits[i] *= inv;
        /* candidates in descending probability: only as many as needed */
        int n = V, m = 0;
        for (int i = 0; i < V; i++) s->idx[i] = i;
        int need_sorted = p->top_k > 0 || p->top_p < 1 || p->xtc_probability > 0;
        int32_t *cand = s->idx;
        if (need_sorted) {
            /* popped ids go to the tail of idx, in order; collect them in front */
            heapify(s->idx, n, logits);
            int limit = p->top_k > 0 ? LOOM_MIN(p->top_k, V) : V;
            double mass = 0;
            /* The heap shrinks from the end: store the k-th pick at idx[V-1-k]. */
            while (m < limit && n > 0) {
                int32_t id = heap_pop(s->idx, &n, logits);
                s->idx[V - 1 - m] = id;
                m++;
                mass += logits[id];
                if (p->top_p < 1 && mass >= p->top_p) break;
            }
            /* idx[V-m..V) holds the picks last-to-first; reverse it */
            cand = s->idx + V - m;
            for (int i = 0; i < m / 2; i++) {
                int32_t t = cand[i]; cand[i] = cand[m - 1 - i]; cand[m - 1 - i] = t;
            }
        } else {
            m = V;
        }
        /* min-p against the top probability */
        if (p->min_p > 0) {
            float top = need_sorted ? logits[cand[0]] : logits[loom_argmax(logits, V)];
            int k = 0;
            for (int i = 0; i < m; i++)
                if (logits[cand[i]] >= p->min_p * top) cand[k++] = cand[i];
            m = k;
        }
        /* XTC: sometimes cut every token above the threshold but the least
         * likely of them (cand is sorted descending here) */
        if (p->xtc_probability > 0 && m > 1 && next_uniform(s) < p->xtc_probability) {
            int above = 0;
            while (above < m && logits[cand[above]] >= p->xtc_threshold) above++;
            if (above > 1) {
                cand += above - 1;
                m -= above - 1;
            }
        }
        *cand_out = cand;
        return m;
    }
}

/* A draw from the m candidates' weights in logits[], skipping id `skip`
 * (-1: none; the caller has taken it out of tot). */
static int32_t draw(loom_sampler *s, const float *logits, const int32_t *cand, int m, double tot,
                    int32_t skip) {
    double u = next_uniform(s) * tot, acc = 0;
    int32_t id = cand[m - 1] == skip && m > 1 ? cand[m - 2] : cand[m - 1];
    for (int i = 0; i < m; i++) {
        if (cand[i] == skip) continue;
        acc += logits[cand[i]];
        if (u < acc) return cand[i];
    }
    return id;
}

/* Copies the raw logits when log-probabilities are asked for (they
 * describe the model, before any processing). */
static float *keep_raw(loom_sampler *s, const float *logits, int n_top) {
    if (n_top < 0) return NULL;
    memcpy(s->prob, logits, sizeof(float) * (size_t)s->vocab);
    return s->prob;
}

void loom_sampler_pick(loom_sampler *s, float *logits, int n_top, loom_sample_result *r) {
    memset(r, 0, sizeof *r);
    float *raw = keep_raw(s, logits, n_top);
    adjust(s, logits);
    if (greedy(&s->p)) {
        r->id = loom_argmax(logits, s->vocab);
    } else {
        int32_t *cand;
        int m = candidates(s, logits, &cand);
        double tot = 0;
        for (int i = 0; i < m; i++) tot += logits[cand[i]];
        r->id = draw(s, logits, cand, m, tot, -1);
    }
    if (raw) logprobs(s, raw, n_top, r);
}

int loom_sampler_verify(loom_sampler *s, float *logits, int32_t draft, int n_top,
                        loom_sample_result *r) {
    if (draft < 0 || draft >= s->vocab) {
        loom_sampler_pick(s, logits, n_top, r);
        return 0;
    }
    memset(r, 0, sizeof *r);
    float *raw = keep_raw(s, logits, n_top);
    adjust(s, logits);
    int ok;
    if (greedy(&s->p)) {
        r->id = loom_argmax(logits, s->vocab);
        ok = r->id == draft;
    } else {
        /* The draft proposes one token (q is one-hot): it stands with
         * probability p(draft); else the token comes from p with the draft
         * taken out, renormalised (max(0, p - q) normalised). The result is
         * distributed as p. */
        int32_t *cand;
        int m = candidates(s, logits, &cand);
        double tot = 0, pd = 0;
        for (int i = 0; i < m; i++) {
            tot += logits[cand[i]];
            if (cand[i] == draft) pd = logits[cand[i]];
        }
        ok = pd > 0 && next_uniform(s) * tot < pd;
        r->id = ok ? draft : m > 1 || pd == 0 ? draw(s, logits, cand, m, tot - pd, draft) : draft;
    }
    if (raw) logprobs(s, raw, n_top, r);
    return ok;
}
