/* Sampler: greedy, bias, penalties, top-k/top-p/min-p/XTC supports,
 * empirical distribution, seeds, log-probabilities, parameter errors. */
#include "base/base.h"
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

/* ---- speculative verification ------------------------------------------ */

#define SV 8 /* vocabulary of the verification tests */

static const double sv_probs[SV] = {0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.04, 0.01};

/* Counts of n draws of s over sv_probs' logits: loom_sampler_pick when
 * draft == -2, else loom_sampler_verify of draft (-1: a fresh draft drawn
 * each time from a generator of its own, q's stand-in). Returns how many
 * verifications kept the draft. */
static int sv_counts(loom_sampler *s, int draft, int n, int *count) {
    memset(count, 0, sizeof(int) * SV);
    unsigned long long q = 99;
    int kept = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        float l[SV];
        for (int k = 0; k < SV; k++) l[k] = (float)log(sv_probs[k]);
        loom_sample_result r;
        if (draft == -2) {
            loom_sampler_pick(s, l, -1, &r);
        } else {
            q = q * 6364136223846793005ull + 1442695040888963407ull;
            int d = draft >= 0 ? draft : (int)((q >> 33) % SV);
            kept += loom_sampler_verify(s, l, d, -1, &r);
        }
        if (r.id >= 0 && r.id < SV) count[r.id]++;
        else bad++;
    }
    CHECK_EQ_INT(bad, 0);
    return kept;
}

/* Pearson's statistic of counts against probabilities p (cells with p > 0;
 * a count where p is 0 makes it infinite), and its degrees of freedom. */
static double chi2_fit(const int *count, const double *p, int n, int *df) {
    double x = 0;
    *df = -1;
    for (int k = 0; k < SV; k++) {
        if (p[k] <= 0) {
            if (count[k]) return INFINITY;
            continue;
        }
        double e = p[k] * n;
        x += (count[k] - e) * (count[k] - e) / e;
        ++*df;
    }
    return x;
}

/* Two samples of equal size from one distribution? */
static double chi2_two(const int *a, const int *b, int *df) {
    double x = 0;
    *df = -1;
    for (int k = 0; k < SV; k++) {
        if (a[k] + b[k] == 0) continue;
        x += (double)(a[k] - b[k]) * (a[k] - b[k]) / (a[k] + b[k]);
        ++*df;
    }
    return x;
}

/* Critical values at significance 1e-6 for df 1..7: a fixed seed makes the
 * test deterministic, and a correct rule is nowhere near them. */
static const double chi2_crit[8] = {0, 23.9, 27.6, 30.7, 33.4, 35.9, 38.3, 40.5};

static void verify_distribution(void) {
    enum { N = 60000 };
    int c[SV], ref[SV], df;
    /* temperature 0.7 alone: the exact target is sv_probs^(1/0.7), normalised */
    loom_sampling sp = loom_sampling_default();
    sp.temperature = 0.7f;
    sp.seed = 5;
    double p[SV], z = 0;
    for (int k = 0; k < SV; k++) z += p[k] = pow(sv_probs[k], 1 / 0.7);
    for (int k = 0; k < SV; k++) p[k] /= z;
    static const int drafts[] = {0, 3, 7, -1};
    for (size_t d = 0; d < LOOM_ARRAY_LEN(drafts); d++) {
        loom_sampler s;
        CHECK(loom_sampler_init(&s, &sp, SV) == LOOM_OK);
        int kept = sv_counts(&s, drafts[d], N, c);
        double x = chi2_fit(c, p, N, &df);
        CHECKF(x < chi2_crit[df], "temperature 0.7, draft %d: chi2 %.1f (df %d)", drafts[d], x, df);
        /* a fixed draft stands with probability p(draft) */
        if (drafts[d] >= 0)
            CHECKF(fabs((double)kept / N - p[drafts[d]]) < 0.01, "draft %d kept %.4f, p %.4f", drafts[d],
                   (double)kept / N, p[drafts[d]]);
        loom_sampler_free(&s);
    }
    /* every transform (penalties over a window, top-k, top-p, min-p): the
     * verified tokens against plain picks of the same sampler settings */
    sp.temperature = 1.3f;
    sp.top_k = 6;
    sp.top_p = 0.9f;
    sp.min_p = 0.1f;
    sp.repetition_penalty = 1.5f;
    sp.presence_penalty = 0.3f;
    static const int32_t window[] = {0, 2, 2, 5};
    for (size_t d = 0; d < LOOM_ARRAY_LEN(drafts) + 1; d++) {
        int draft = d < LOOM_ARRAY_LEN(drafts) ? drafts[d] : 7; /* 7: cut by top-k */
        loom_sampler a, b;
        sp.seed = 11 + d;
        CHECK(loom_sampler_init(&a, &sp, SV) == LOOM_OK);
        sp.seed = 1000 + d;
        CHECK(loom_sampler_init(&b, &sp, SV) == LOOM_OK);
        for (size_t k = 0; k < LOOM_ARRAY_LEN(window); k++) {
            loom_sampler_accept(&a, window[k], k >= 2);
            loom_sampler_accept(&b, window[k], k >= 2);
        }
        sv_counts(&a, -2, N, ref);
        int kept = sv_counts(&b, draft, N, c);
        double x = chi2_two(c, ref, &df);
        CHECKF(df >= 1 && x < chi2_crit[df], "all transforms, draft %d: chi2 %.1f (df %d)", draft, x, df);
        if (draft == 7) CHECK_EQ_INT(kept, 0);
        CHECK_EQ_INT(c[7], 0); /* top-k never lets the tail in */
        loom_sampler_free(&a);
        loom_sampler_free(&b);
    }
    /* greedy keeps a draft exactly when it is the argmax */
    loom_sampler g;
    loom_sampling gp = loom_sampling_default();
    CHECK(loom_sampler_init(&g, &gp, SV) == LOOM_OK);
    CHECK_EQ_INT(sv_counts(&g, 0, 10, c), 10);
    CHECK_EQ_INT(c[0], 10);
    CHECK_EQ_INT(sv_counts(&g, 2, 10, c), 0);
    CHECK_EQ_INT(c[0], 10);
    loom_sampler_free(&g);
}

int main(void) {
    verify_distribution();
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
