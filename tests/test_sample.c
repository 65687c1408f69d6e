/* Sampler: greedy, bias, penalties, top-k/top-p/min-p/XTC supports,
 * empirical distribution, seeds, log-probabilities, parameter errors. */
#include "sample/sample.h"
#include "test.h"

#define V 4

static void logits_of(float *l, const double *p) {
    for (int i = 0; i < V; i++) l[i] = (float)log(p[i]);
}

static const double probs[V] = {0.5, 0.3, 0.15, 0.05};

/* Draws n tokens and counts them. */
static void draw(loom_sampling sp, int n, int *count) {
    loom_sampler s;
    CHECK(loom_sampler_init(&s, &sp, V) == LOOM_OK);
    memset(count, 0, sizeof(int) * V);
    for (int i = 0; i < n; i++) {
        float l[V];
        logits_of(l, probs);
        loom_sample_result r;
        loom_sampler_pick(&s, l, -1, &r);
        count[r.id]++;
    }
    loom_sampler_free(&s);
}

static int pick_once(loom_sampler *s, const float *in) {
    float l[V];
    memcpy(l, in, sizeof l);
    loom_sample_result r;
    loom_sampler_pick(s, l, -1, &r);
    return r.id;
}

int main(void) {
    int c[V];
    loom_sampling sp = loom_sampling_default();
    /* greedy */
    draw(sp, 10, c);
    CHECK(c[0] == 10);
    /* plain temperature 1 matches the distribution */
    sp.temperature = 1;
    sp.seed = 42;
    draw(sp, 40000, c);
    for (int i = 0; i < V; i++)
        CHECKF(fabs(c[i] / 40000.0 - probs[i]) < 0.01, "token %d freq %g want %g", i, c[i] / 40000.0,
               probs[i]);
    /* temperature sharpens: at 0.5 the ratio p0/p1 squares */
    sp.temperature = 0.5f;
    draw(sp, 40000, c);
    double want0 = 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025);
    CHECKF(fabs(c[0] / 40000.0 - want0) < 0.01, "T=0.5 freq %g want %g", c[0] / 40000.0, want0);
    sp.temperature = 1;
    /* supports */
    sp.top_k = 2;
    draw(sp, 5000, c);
    CHECK(c[2] == 0 && c[3] == 0 && c[0] > 0 && c[1] > 0);
    CHECKF(fabs((double)c[0] / (c[0] + c[1]) - 0.625) < 0.03, "top-k renormalised %g",
           (double)c[0] / (c[0] + c[1]));
    sp.top_k = 0;
    sp.top_p = 0.7f;
    draw(sp, 5000, c);
    CHECK(c[2] == 0 && c[3] == 0 && c[1] > 0);
    sp.top_p = 0.81f;
    draw(sp, 5000, c);
    CHECK(c[2] > 0 && c[3] == 0);
    sp.top_p = 1;
    sp.min_p = 0.5f;
    draw(sp, 5000, c);
    CHECK(c[2] == 0 && c[3] == 0 && c[1] > 0);
    sp.min_p = 0;
    sp.xtc_probability = 1;
    sp.xtc_threshold = 0.1f;
    draw(sp, 5000, c);
    CHECK(c[0] == 0 && c[1] == 0 && c[2] > 0 && c[3] > 0);
    sp.xtc_probability = 0;
    /* seeds: same seed same draws, other seed differs */
    {
        loom_sampler a, b, d;
        sp.seed = 7;
        loom_sampler_init(&a, &sp, V);
        loom_sampler_init(&b, &sp, V);
        sp.seed = 8;
        loom_sampler_init(&d, &sp, V);
        float l[V];
        logits_of(l, probs);
        int same = 1, diff = 0;
        for (int i = 0; i < 200; i++) {
            int x = pick_once(&a, l), y = pick_once(&b, l), z = pick_once(&d, l);
            same &= x == y;
            diff |= x != z;
        }
        CHECK(same && diff);
        loom_sampler_free(&a);
        loom_sampler_free(&b);
        loom_sampler_free(&d);
    }
    /* logit bias bans the argmax under greedy */
    {
        loom_logit_bias lb[1] = {{0, -INFINITY}};
        loom_sampling g = loom_sampling_default();
        g.logit_bias = lb;
        g.n_logit_bias = 1;
        loom_sampler s;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_OK);
        lb[0].bias = 0; /* the sampler copied it: later edits do not matter */
        float l[V];
        logits_of(l, probs);
        CHECK_EQ_INT(pick_once(&s, l), 1);
        loom_sampler_free(&s);
    }
    /* repetition penalty over the context flips the greedy choice */
    {
        loom_sampling g = loom_sampling_default();
        g.repetition_penalty = 2;
        loom_sampler s;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_OK);
        float l[V] = {2.0f, 1.5f, -1, -2};
        CHECK_EQ_INT(pick_once(&s, l), 0);
        loom_sampler_accept(&s, 0, 0);
        loom_sampler_accept(&s, 0, 0);  /* counted once, not twice */
        CHECK_EQ_INT(pick_once(&s, l), 1);
        float l2[V] = {2.0f, 1.1f, -1, -2};  /* 2/2 = 1.0 < 1.1 */
        CHECK_EQ_INT(pick_once(&s, l2), 1);
        float l3[V] = {2.0f, 0.9f, -1, -2};  /* 1.0 > 0.9: applied once */
        CHECK_EQ_INT(pick_once(&s, l3), 0);
        loom_sampler_free(&s);
    }
    /* presence/frequency count output tokens only; the window forgets */
    {
        loom_sampling g = loom_sampling_default();
        g.presence_penalty = 0.5f;
        g.frequency_penalty = 0.2f;
        g.penalty_last_n = 3;
        loom_sampler s;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_OK);
        float l[V] = {1.0f, 0.5f, 0, 0};
        loom_sampler_accept(&s, 0, 0);           /* prompt: no presence penalty */
        CHECK_EQ_INT(pick_once(&s, l), 0);
        loom_sampler_accept(&s, 0, 1);           /* output: 1 - 0.5 - 0.2 = 0.3 */
        CHECK_EQ_INT(pick_once(&s, l), 1);
        loom_sampler_accept(&s, 2, 1);
        loom_sampler_accept(&s, 3, 1);
        loom_sampler_accept(&s, 3, 1);           /* token 0 left the window */
        CHECK_EQ_INT(pick_once(&s, l), 0);
        loom_sampler_free(&s);
    }
    /* log-probabilities of the raw logits */
    {
        loom_sampling g = loom_sampling_default();
        g.logit_bias = (loom_logit_bias[]){{3, 100}};
        g.n_logit_bias = 1;
        loom_sampler s;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_OK);
        float l[V];
        logits_of(l, probs);
        loom_sample_result r;
        loom_sampler_pick(&s, l, 3, &r);
        CHECK_EQ_INT(r.id, 3);
        CHECK(fabs(r.logprob - log(0.05)) < 1e-5);
        CHECK_EQ_INT(r.n_top, 3);
        CHECK(r.top_ids[0] == 0 && r.top_ids[1] == 1 && r.top_ids[2] == 2);
        CHECK(fabs(r.top_logprobs[1] - log(0.3)) < 1e-5);
        loom_sampler_free(&s);
    }
    /* a large vocabulary: top-k from the heap equals a brute-force pick */
    {
        enum { N = 5000 };
        float *l = malloc(sizeof(float) * N), *keep = malloc(sizeof(float) * N);
        unsigned long long rs = 99;
        for (int i = 0; i < N; i++) keep[i] = test_rand_f(&rs) * 5;
        loom_sampling g = loom_sampling_default();
        g.temperature = 1;
        g.top_k = 3;
        g.seed = 5;
        loom_sampler s;
        CHECK(loom_sampler_init(&s, &g, N) == LOOM_OK);
        int top[3] = {-1, -1, -1};
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < N; i++) {
                int used = 0;
                for (int j = 0; j < k; j++) used |= top[j] == i;
                if (!used && (top[k] < 0 || keep[i] > keep[top[k]])) top[k] = i;
            }
        int ok = 1;
        for (int t = 0; t < 300; t++) {
            memcpy(l, keep, sizeof(float) * N);
            loom_sample_result r;
            loom_sampler_pick(&s, l, -1, &r);
            ok &= r.id == top[0] || r.id == top[1] || r.id == top[2];
        }
        CHECK(ok);
        loom_sampler_free(&s);
        free(l);
        free(keep);
    }
    /* bad parameters name the field */
    {
        loom_sampler s;
        loom_sampling g = loom_sampling_default();
        g.top_p = 0;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_ERR_INVALID_ARG);
        CHECK(strstr(loom_last_error(), "top_p") != NULL);
        g = loom_sampling_default();
        g.temperature = -1;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_ERR_INVALID_ARG);
        CHECK(strstr(loom_last_error(), "temperature") != NULL);
        g = loom_sampling_default();
        g.logit_bias = (loom_logit_bias[]){{V, 1}};
        g.n_logit_bias = 1;
        CHECK(loom_sampler_init(&s, &g, V) == LOOM_ERR_INVALID_ARG);
        CHECK(strstr(loom_last_error(), "logit_bias") != NULL);
    }
    return test_report("test_sample");
}
