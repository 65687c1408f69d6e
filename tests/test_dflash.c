/* The projected-context drafter (DFlashDraftModel) on a tiny target: a
 * random drafter written here loads; its projection and block forward
 * agree with a plain reference written below from the layout alone
 * (non-causal block attention over the context rows); through the engine
 * greedy output is token for token that of plain decoding; a round whose
 * proposals were rejected leaves context rows only for kept tokens (the
 * rows equal those of one fresh forward over the kept sequence). */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/exec.h"
#include "engine/request.h"
#include "engine/spec.h"
#include "load/safetensors.h"
#include "model/dflash.h"
#include "model/model.h"
#include "test.h"

#define TARGET "tests/fixtures/models/qwen3-tiny"
/* the drafter: 2 layers of 2 heads (1 KV head) of 16 over the target's 64 */
#define DL 2
#define DNH 2
#define DNKV 1
#define DHD 16
#define DI 48
#define DB 8
#define MASK 5
static const int taps[] = {0, 2};
#define NT 2

typedef struct ref_model {
    int H, V;
    float *embed;  /* [V, H], the target's (tied: also its head) */
    float *fc, *hnorm, *norm;
    float *in_n[DL], *post_n[DL], *qn[DL], *kn[DL], *q[DL], *k[DL], *v[DL], *o[DL], *g[DL], *u[DL], *dn[DL];
} ref_model;

static float *rnd(unsigned long long *s, size_t n, float scale, float base) {
    float *p = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = base + scale * test_rand_f(s);
    return p;
}

/* Writes a random drafter for a target of hidden H and vocabulary V to dir
 * (kept in r for the reference). */
static void write_drafter(const char *dir, int H, int V, ref_model *r) {
    unsigned long long s = 0x9e3779b97f4a7c15ull;
    mkdir(dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"architectures\": [\"DFlashDraftModel\"], \"target_layer_ids\": [%d, %d], "
               "\"block_size\": %d, \"mask_token_id\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d, "
               "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
               "\"intermediate_size\": %d, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, "
               "\"vocab_size\": %d, \"target_hidden_size\": %d}\n",
            taps[0], taps[1], DB, MASK, H, DL, DNH, DNKV, DHD, DI, V, H);
    fclose(f);
    int qd = DNH * DHD, kvd = DNKV * DHD;
    r->fc = rnd(&s, (size_t)H * NT * H, 0.3f, 0);
    r->hnorm = rnd(&s, H, 0.2f, 1);
    r->norm = rnd(&s, H, 0.2f, 1);
    loom_st_write_entry e[3 + 11 * DL];
    int n = 0;
    char names[11 * DL][64];
    e[n++] = (loom_st_write_entry){"fc.weight", LOOM_DT_F32, 2, {H, NT * H}, r->fc};
    e[n++] = (loom_st_write_entry){"hidden_norm.weight", LOOM_DT_F32, 1, {H}, r->hnorm};
    e[n++] = (loom_st_write_entry){"norm.weight", LOOM_DT_F32, 1, {H}, r->norm};
    for (int l = 0; l < DL; l++) {
        struct { const char *name; float **p; int rows, cols; float scale, base; } t[] = {
            {"input_layernorm.weight", &r->in_n[l], H, 0, 0.2f, 1},
            {"post_attention_layernorm.weight", &r->post_n[l], H, 0, 0.2f, 1},
            {"self_attn.q_norm.weight", &r->qn[l], DHD, 0, 0.2f, 1},
            {"self_attn.k_norm.weight", &r->kn[l], DHD, 0, 0.2f, 1},
            {"self_attn.q_proj.weight", &r->q[l], qd, H, 0.4f, 0},
            {"self_attn.k_proj.weight", &r->k[l], kvd, H, 0.4f, 0},
            {"self_attn.v_proj.weight", &r->v[l], kvd, H, 0.4f, 0},
            {"self_attn.o_proj.weight", &r->o[l], H, qd, 0.3f, 0},
            {"mlp.gate_proj.weight", &r->g[l], DI, H, 0.3f, 0},
            {"mlp.up_proj.weight", &r->u[l], DI, H, 0.3f, 0},
            {"mlp.down_proj.weight", &r->dn[l], H, DI, 0.3f, 0},
        };
        for (int i = 0; i < 11; i++) {
            size_t cnt = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
            *t[i].p = rnd(&s, cnt, t[i].scale, t[i].base);
            snprintf(names[l * 11 + i], sizeof names[0], "layers.%d.%s", l, t[i].name);
            e[n] = (loom_st_write_entry){names[l * 11 + i], LOOM_DT_F32, t[i].cols ? 2 : 1,
                                         {t[i].rows, t[i].cols}, *t[i].p};
            n++;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(loom_st_write(path, e, n) == LOOM_OK);
}

static void free_ref(ref_model *r) {
    free(r->embed), free(r->fc), free(r->hnorm), free(r->norm);
    for (int l = 0; l < DL; l++) {
        free(r->in_n[l]), free(r->post_n[l]), free(r->qn[l]), free(r->kn[l]), free(r->q[l]);
        free(r->k[l]), free(r->v[l]), free(r->o[l]), free(r->g[l]), free(r->u[l]), free(r->dn[l]);
    }
}

/* ---- the reference, from the layout (docs/dflash.md) ---------------------------- */

/* y [rows] = W [rows, cols] x */
static void ref_mv(float *y, const float *w, const float *x, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        double a = 0;
        for (int j = 0; j < cols; j++) a += (double)w[(size_t)i * cols + j] * x[j];
        y[i] = (float)a;
    }
}

static void ref_norm(float *y, const float *x, const float *w, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + 1e-6));
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

/* The first half of a head's dims rotates with the second half. */
static void ref_rope(float *v, int pos) {
    float o[DHD];
    for (int i = 0; i < DHD; i++) {
        int k = i % (DHD / 2);
        double ang = pos / pow(10000.0, 2.0 * k / DHD);
        float pair = i < DHD / 2 ? -v[i + DHD / 2] : v[i - DHD / 2];
        o[i] = v[i] * (float)cos(ang) + pair * (float)sin(ang);
    }
    memcpy(v, o, sizeof o);
}

/* K and V of context row c [H] (already fc + norm) at layer l, position pos. */
static void ref_ctx_kv(const ref_model *r, int l, const float *c, int pos, float *k, float *v) {
    ref_mv(k, r->k[l], c, DNKV * DHD, r->H);
    ref_mv(v, r->v[l], c, DNKV * DHD, r->H);
    for (int h = 0; h < DNKV; h++) {
        ref_norm(k + h * DHD, k + h * DHD, r->kn[l], DHD);
        ref_rope(k + h * DHD, pos);
    }
}

/* logits [DB - 1, V] of the block [last, mask...] at pos over context
 * tap states taps [pos, NT * H]. */
static void ref_block(const ref_model *r, const float *taps_in, int pos, int last, float *logits) {
    int H = r->H, n = pos + DB, kvd = DNKV * DHD, qd = DNH * DHD;
    float *K = calloc((size_t)DL * n * kvd, 4), *Vv = calloc((size_t)DL * n * kvd, 4);
    float *x = calloc((size_t)DB * H, 4), *c = calloc((size_t)H, 4), *hh = calloc((size_t)DB * H, 4);
    float *q = calloc((size_t)DB * qd, 4), *att = calloc((size_t)qd, 4), *sc = calloc((size_t)n, 4);
    float g[DI], u[DI], t[64 * 4];
    for (int j = 0; j < pos; j++) {
        ref_mv(c, r->fc, taps_in + (size_t)j * NT * H, H, NT * H);
        ref_norm(c, c, r->hnorm, H);
        for (int l = 0; l < DL; l++)
            ref_ctx_kv(r, l, c, j, K + ((size_t)l * n + j) * kvd, Vv + ((size_t)l * n + j) * kvd);
    }
    for (int i = 0; i < DB; i++) memcpy(x + (size_t)i * H, r->embed + (size_t)(i ? MASK : last) * H, 4 * (size_t)H);
    for (int l = 0; l < DL; l++) {
        for (int i = 0; i < DB; i++) {
            float *h = hh + (size_t)i * H;
            ref_norm(h, x + (size_t)i * H, r->in_n[l], H);
            ref_mv(q + (size_t)i * qd, r->q[l], h, qd, H);
            for (int a = 0; a < DNH; a++) {
                ref_norm(q + (size_t)i * qd + a * DHD, q + (size_t)i * qd + a * DHD, r->qn[l], DHD);
                ref_rope(q + (size_t)i * qd + a * DHD, pos + i);
            }
            ref_ctx_kv(r, l, h, pos + i, K + ((size_t)l * n + pos + i) * kvd, Vv + ((size_t)l * n + pos + i) * kvd);
        }
        for (int i = 0; i < DB; i++) {
            for (int a = 0; a < DNH; a++) {
                int kh = a / (DNH / DNKV);
                double mx = -1e30, sum = 0;
                for (int j = 0; j < n; j++) { /* every key: context and the whole block */
                    double d = 0;
                    for (int e = 0; e < DHD; e++)
                        d += (double)q[(size_t)i * qd + a * DHD + e] * K[((size_t)l * n + j) * kvd + kh * DHD + e];
                    sc[j] = (float)(d / sqrt((double)DHD));
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < n; j++) sum += sc[j] = (float)exp(sc[j] - mx);
                for (int e = 0; e < DHD; e++) {
                    double o = 0;
                    for (int j = 0; j < n; j++) o += sc[j] / sum * Vv[((size_t)l * n + j) * kvd + kh * DHD + e];
                    att[a * DHD + e] = (float)o;
                }
            }
            ref_mv(t, r->o[l], att, H, qd);
            for (int e = 0; e < H; e++) x[(size_t)i * H + e] += t[e];
        }
        for (int i = 0; i < DB; i++) {
            float *xi = x + (size_t)i * H;
            ref_norm(t, xi, r->post_n[l], H);
            ref_mv(g, r->g[l], t, DI, H);
            ref_mv(u, r->u[l], t, DI, H);
            for (int e = 0; e < DI; e++) g[e] = g[e] / (1 + expf(-g[e])) * u[e];
            ref_mv(t, r->dn[l], g, H, DI);
            for (int e = 0; e < H; e++) xi[e] += t[e];
        }
    }
    for (int i = 1; i < DB; i++) {
        ref_norm(t, x + (size_t)i * H, r->norm, H);
        ref_mv(logits + (size_t)(i - 1) * r->V, r->embed, t, r->V, H);
    }
    free(K), free(Vv), free(x), free(c), free(hh), free(q), free(att), free(sc);
}

/* ---- helpers over the target ----------------------------------------------------- */

typedef struct target {
    loom_model *m, *draft;
    loom_kv_pool *kv;
    loom_exec *x;
    ref_model ref;
} target;

static int open_target(target *t, const char *dir) {
    memset(t, 0, sizeof *t);
    if (loom_model_load(TARGET, NULL, &t->m)) return 0;
    int H = t->m->cfg.hidden_size, V = t->m->cfg.vocab_size;
    t->ref.H = H, t->ref.V = V;
    write_drafter(dir, H, V, &t->ref);
    loom_safetensors *st;
    CHECK(loom_st_open(TARGET "/model.safetensors", &st) == LOOM_OK);
    const loom_st_tensor *e = loom_st_find(st, "model.embed_tokens.weight");
    t->ref.embed = malloc(e->nbytes);
    memcpy(t->ref.embed, e->data, e->nbytes);
    loom_st_close(st);
    CHECKF(loom_model_load(dir, NULL, &t->draft) == LOOM_OK, "drafter: %s", loom_last_error());
    CHECK(t->draft && t->draft->dflash && !strcmp(loom_model_arch(t->draft), "DFlashDraftModel"));
    CHECK(loom_kv_pool_create(t->m->cfg.n_layers, loom_model_kv_dim(t->m), 16, 64, LOOM_KV_F32, &t->kv) == LOOM_OK);
    CHECK(loom_exec_create(t->m, t->kv, 64, 512, &t->x) == LOOM_OK);
    return t->draft && t->draft->dflash && t->x;
}

static void close_target(target *t) {
    loom_exec_free(t->x);
    loom_kv_pool_free(t->kv);
    loom_model_free(t->draft);
    loom_model_free(t->m);
    free_ref(&t->ref);
}

/* The target's tap states of tokens [0, n) in one forward. */
static float *tap_states(target *t, const int32_t *tok, int n) {
    int H = t->m->cfg.hidden_size;
    float *out = malloc(sizeof(float) * (size_t)n * NT * H);
    loom_kv_seq seq = {0};
    CHECK(loom_kv_seq_reserve(t->kv, &seq, n) == LOOM_OK);
    loom_fwd_row row = {.tokens = tok, .n = n, .seq = &seq};
    CHECK(loom_exec_set_taps(t->x, taps, NT, out));
    CHECK(loom_exec_forward(t->x, t->kv, &row, 1) == LOOM_OK);
    loom_exec_set_taps(t->x, NULL, 0, NULL);
    loom_kv_seq_release(t->kv, &seq);
    return out;
}

/* longer than a KV block: a repeat of it hits the prefix cache */
static const int32_t prompt[] = {17, 201, 33, 87, 412, 9, 150, 66, 301, 5, 77, 250, 18, 300, 41, 99,
                                 7, 460, 123, 88, 64, 12, 250, 331, 17, 201, 33, 90, 180, 270, 360, 450};
#define NP ((int)(sizeof prompt / sizeof *prompt))

/* The drafter's projection and block forward against the reference. */
static void forward_matches_reference(target *t) {
    const loom_dflash *d = t->draft->dflash;
    int V = t->m->cfg.vocab_size;
    float *tp = tap_states(t, prompt, NP);
    size_t row = loom_dflash_row_floats(d);
    float *ctx = malloc(sizeof(float) * row * NP);
    float *scr = malloc(sizeof(float) * LOOM_MAX(loom_dflash_scratch(d, NP, 1), (size_t)NP * 80));
    float *got = malloc(sizeof(float) * (DB - 1) * (size_t)V), *want = malloc(sizeof(float) * (DB - 1) * (size_t)V);
    /* context rows projected in two pieces, as two forwards would */
    loom_dflash_project(d, t->m, tp, 0, 5, ctx, scr);
    loom_dflash_project(d, t->m, tp + 5 * NT * t->ref.H, 5, NP - 5, ctx + 5 * row, scr);
    loom_dflash_block(d, t->m, ctx, NP, NP, 123, got, scr);
    ref_block(&t->ref, tp, NP, 123, want);
    double err = test_rel_err(got, want, (size_t)(DB - 1) * V);
    CHECKF(err < 1e-4, "block logits: relative error %g against the reference", err);
    free(tp), free(ctx), free(scr), free(got), free(want);
}

/* Blocks of several requests in one forward (different contexts, one
 * of them empty, positions, tokens and rows wanted) give bit for bit the
 * logits of each request's own forward. */
static void batched_matches_single(target *t) {
    const loom_dflash *d = t->draft->dflash;
    int V = t->m->cfg.vocab_size;
    float *tp = tap_states(t, prompt, NP);
    size_t row = loom_dflash_row_floats(d);
    float *ctx = malloc(sizeof(float) * row * NP);
    float *scr = malloc(sizeof(float) * LOOM_MAX(loom_dflash_scratch(d, NP, 3), (size_t)NP * 80));
    float *got = malloc(sizeof(float) * 3 * (DB - 1) * (size_t)V), *one = malloc(sizeof(float) * (DB - 1) * (size_t)V);
    loom_dflash_project(d, t->m, tp, 0, NP, ctx, scr);
    loom_dflash_req rq[3] = {
        {.ctx = ctx, .n_ctx = 9, .pos = 9, .n_out = 3, .last = prompt[9]},
        {.ctx = ctx, .n_ctx = NP, .pos = NP, .n_out = DB - 1, .last = 123},
        {.ctx = ctx + 4 * row, .n_ctx = 0, .pos = 4, .n_out = 1, .last = 77},
    };
    loom_dflash_blocks(d, t->m, rq, 3, got, scr);
    const float *g = got;
    for (int k = 0; k < 3; g += (size_t)rq[k++].n_out * V) {
        loom_dflash_block(d, t->m, rq[k].ctx, rq[k].n_ctx, rq[k].pos, rq[k].last, one, scr);
        CHECKF(!memcmp(g, one, sizeof(float) * (size_t)rq[k].n_out * V),
               "request %d of a batched drafter forward: logits differ from its own forward", k);
    }
    free(tp), free(ctx), free(scr), free(got), free(one);
}

/* One forward of rows through the spec hooks, as the engine steps them. */
static void step(target *t, loom_spec *sp, loom_request *r, loom_kv_seq *seq, int start, int n, int draft,
                 float *logits) {
    sched_row w = {.r = r, .start = start, .n = n, .kind = draft >= 0 ? SCHED_DECODE : SCHED_FINAL,
                   .draft = draft > 0 ? draft : 0};
    step_plan plan = {.rows = &w, .n_rows = 1, .tokens = n};
    if (draft > 0) {
        CHECK(loom_spec_draft(sp, &plan) == LOOM_OK);
        CHECKF(r->dfl_n == start, "after drafting at %d the drafter holds %d context rows", start, r->dfl_n);
        CHECK(w.draft >= 1);
    }
    CHECK(loom_kv_seq_reserve(t->kv, seq, start + w.n) == LOOM_OK);
    loom_fwd_row row = {.tokens = r->tokens + start, .n = w.n, .seq = seq, .logits = LOOM_LOGITS_ALL, .out = logits};
    loom_spec_taps(sp, t->x, 1);
    CHECK(loom_exec_forward(t->x, t->kv, &row, 1) == LOOM_OK);
    loom_spec_after_forward(sp, &plan, &row);
    loom_spec_taps(sp, t->x, 0);
    /* a prefill row's states are projected at once; a decode row's wait
     * for the next draft, which projects the kept ones */
    if (draft < 0) CHECK_EQ_INT(r->dfl_n, start + w.n);
    else CHECK_EQ_INT(r->dfl_raw_n, start + w.n);
    if (draft > 0) CHECK_EQ_INT(r->dfl_n, start);
}

/* A round's rejected proposals leave no context rows: after a rejection
 * and another round, the rows equal one fresh forward's over the kept
 * sequence. */
static void rollback(target *t) {
    loom_engine_params ep = loom_engine_default_params();
    ep.speculative = LOOM_SPEC_DRAFT;
    ep.draft_model = t->draft;
    int V = t->m->cfg.vocab_size;
    loom_spec *sp = NULL;
    CHECKF(loom_spec_create(&ep, t->m, V, 4, 512, 64, &sp) == LOOM_OK, "%s", loom_last_error());
    if (!sp) return;
    CHECK_STR(loom_spec_name(sp), "dflash");
    CHECK_EQ_INT(loom_spec_block(sp), DB - 1); /* the engine's default proposals per round */
    float *lg = malloc(sizeof(float) * 64 * (size_t)V);
    loom_request *r = calloc(1, sizeof *r), *fresh = calloc(1, sizeof *fresh);
    int32_t tok[64];
    memcpy(tok, prompt, sizeof prompt);
    r->tokens = tok;
    loom_kv_seq seq = {0};
    step(t, sp, r, &seq, 0, NP, -1, lg);
    tok[NP] = loom_argmax(lg + (size_t)(NP - 1) * V, V);
    step(t, sp, r, &seq, NP, 1 + 4, 4, lg); /* proposals at NP + 1.. */
    /* the target keeps none: its token at NP + 1 differs from the proposal */
    tok[NP + 1] = (tok[NP + 1] + 1) % V;
    loom_kv_seq_truncate(t->kv, &seq, NP + 1);
    step(t, sp, r, &seq, NP + 1, 1 + 4, 4, lg);
    int n = r->dfl_n;
    /* the same tokens in one forward, through a request of its own */
    int32_t tok2[64];
    memcpy(tok2, tok, sizeof tok2);
    fresh->tokens = tok2;
    loom_kv_seq seq2 = {0};
    step(t, sp, fresh, &seq2, 0, n, -1, lg);
    size_t row = loom_dflash_row_floats(t->draft->dflash);
    CHECK_EQ_INT(fresh->dfl_n, n);
    double err = test_rel_err(r->dfl_ctx, fresh->dfl_ctx, row * (size_t)n);
    CHECKF(err < 1e-5, "context rows after a rejection: relative error %g against a fresh forward", err);
    loom_kv_seq_release(t->kv, &seq);
    loom_kv_seq_release(t->kv, &seq2);
    loom_spec_done(sp, r);
    loom_spec_done(sp, fresh);
    free(r), free(fresh), free(lg);
    loom_spec_free(sp);
}

/* Many decode rows without proposals (a gated batch) keep a bounded
 * number of unprojected states: the context then starts over after the
 * oldest dropped, and a draft's rows equal a fresh forward's at the same
 * positions. */
static void stash_bound(target *t) {
    loom_engine_params ep = loom_engine_default_params();
    ep.speculative = LOOM_SPEC_DRAFT;
    ep.draft_model = t->draft;
    int V = t->m->cfg.vocab_size;
    loom_spec *sp = NULL;
    CHECKF(loom_spec_create(&ep, t->m, V, 4, 512, 64, &sp) == LOOM_OK, "%s", loom_last_error());
    if (!sp) return;
    enum { N = 320 };
    float *lg = malloc(sizeof(float) * 64 * (size_t)V);
    loom_request *r = calloc(1, sizeof *r), *fresh = calloc(1, sizeof *fresh);
    int32_t tok[N + 8];
    for (int i = 0; i < N + 8; i++) tok[i] = prompt[i % NP] + i / NP;
    r->tokens = tok;
    loom_kv_seq seq = {0}, seq2 = {0};
    step(t, sp, r, &seq, 0, NP, -1, lg);
    for (int p = NP; p < N; p++) step(t, sp, r, &seq, p, 1, 0, lg);
    int lo = r->dfl_lo, kept = r->dfl_raw_n - r->dfl_n;
    CHECKF(lo > 0 && kept > 0 && kept < N - NP, "after %d plain decode rows: context from %d, %d states "
           "unprojected", N - NP, lo, kept);
    step(t, sp, r, &seq, N, 1 + 4, 4, lg);
    CHECK_EQ_INT(r->dfl_lo, lo);
    fresh->tokens = tok;
    for (int a = 0; a < N; a += 64) step(t, sp, fresh, &seq2, a, LOOM_MIN(64, N - a), -1, lg); /* the forward's most */
    size_t row = loom_dflash_row_floats(t->draft->dflash);
    double err = test_rel_err(r->dfl_ctx, fresh->dfl_ctx + (size_t)lo * row, row * (size_t)(N - lo));
    CHECKF(err < 1e-5, "context rows after the stash dropped its oldest: relative error %g", err);
    loom_kv_seq_release(t->kv, &seq);
    loom_kv_seq_release(t->kv, &seq2);
    loom_spec_done(sp, r);
    loom_spec_done(sp, fresh);
    free(r), free(fresh), free(lg);
    loom_spec_free(sp);
}

/* Greedy through the engine: the same tokens as plain decoding, three
 * requests batched, with the prefix cache off and on; a traced request
 * has the companion, projection and draft spans of mechanism dflash. */
static void engine_identity(target *t) {
    int32_t toks[2][3][48];
    uint64_t drafted = 0, accepted = 0;
    /* 0 plain; 1 and 2 the drafter as it runs by default (8-bit where the
     * CPU has the integer kernels), without and with the prefix cache; 3
     * the drafter in exact f32 */
    for (int mode = 0; mode < 4; mode++) {
        loom_engine_params ep = loom_engine_default_params();
        ep.max_batch_tokens = 64;
        ep.max_seqs = 4;
        ep.n_ctx = 256;
        ep.prefix_cache = mode != 1;
        if (mode) {
            ep.speculative = LOOM_SPEC_DRAFT;
            ep.draft_model = t->draft;
            ep.draft_tokens = DB - 1;
            ep.draft_exact = mode == 3;
        }
        loom_engine *e = NULL;
        CHECKF(loom_engine_create(t->m, &ep, &e) == LOOM_OK, "engine: %s", loom_last_error());
        if (!e) return;
        loom_request *rq[3];
        for (int i = 0; i < 3; i++) {
            loom_request_params rp = loom_request_default_params();
            rp.prompt = prompt + i;
            rp.n_prompt = NP - i;
            rp.max_tokens = 48;
            rp.ignore_eos = 1;
            rp.trace = i == 0;
            CHECK(loom_engine_submit(e, &rp, &rq[i]) == LOOM_OK);
        }
        for (int i = 0; i < 3; i++) {
            int n = 0;
            for (;;) {
                loom_event ev;
                if (loom_request_next(rq[i], &ev, 60000) != LOOM_OK || ev.finish != LOOM_FINISH_NONE) break;
                if (n < 48) toks[mode ? 1 : 0][i][n] = ev.token;
                n++;
            }
            CHECK_EQ_INT(n, 48);
            if (i == 0 && mode) { /* the companion export, the projection and the draft */
                char *js = loom_request_trace_json(rq[i]);
                CHECKF(js && strstr(js, "{\"name\":\"prefill.companion\"") &&
                           strstr(js, "{\"name\":\"prefill.project\"") &&
                           strstr(js, "{\"name\":\"decode.draft\"") &&
                           strstr(js, "\"mechanism\":\"dflash\"") && !strstr(js, "\"mechanism\":\"draft-model\""),
                       "trace: %.600s", js ? js : "(null)");
                free(js);
            }
            loom_request_free(rq[i]);
        }
        if (mode == 2) { /* the first prompt again: its first blocks come from the cache */
            loom_request_params rp = loom_request_default_params();
            rp.prompt = prompt;
            rp.n_prompt = NP;
            rp.max_tokens = 48;
            rp.ignore_eos = 1;
            rp.trace = 1;
            loom_request *r4 = NULL;
            CHECK(loom_engine_submit(e, &rp, &r4) == LOOM_OK);
            int n = 0, cached = 0, same = 1;
            for (;;) {
                loom_event ev;
                if (loom_request_next(r4, &ev, 60000) != LOOM_OK) break;
                if (ev.finish != LOOM_FINISH_NONE) {
                    cached = ev.n_cached;
                    break;
                }
                same &= n < 48 && ev.token == toks[0][0][n];
                n++;
            }
            CHECKF(n == 48 && same, "a prefix-cache hit: %d tokens, same as plain %d", n, same);
            char *js = loom_request_trace_json(r4);
            CHECKF(cached > 0 && js && strstr(js, "{\"name\":\"decode.draft\""),
                   "a prefix-cache hit (%d cached) drafts after the cached blocks: %.300s", cached,
                   js ? js : "(null)");
            free(js);
            loom_request_free(r4);
        }
        loom_engine_stats st;
        loom_engine_get_stats(e, &st);
        loom_engine_free(e);
        if (!mode) continue;
        drafted += st.spec_drafted;
        accepted += st.spec_accepted;
        for (int i = 0; i < 3; i++) {
            int at = 0;
            while (at < 48 && toks[0][i][at] == toks[1][i][at]) at++;
            CHECKF(at == 48, "mode %d request %d: first difference from plain at %d", mode, i, at);
        }
    }
    CHECKF(drafted > accepted, "dflash: %llu drafted, %llu accepted: nothing rejected",
           (unsigned long long)drafted, (unsigned long long)accepted);
    printf("dflash (random drafter): %llu/%llu accepted\n", (unsigned long long)accepted,
           (unsigned long long)drafted);
}

/* The 8-bit drafter (loom_dflash_prepare) against its exact logits
 * `exact` for one block: where the CPU has the integer kernels, close,
 * and the same pick on nearly every row; elsewhere, and once prepared
 * back to exact, the very same bits. */
static void q8_agrees(loom_dflash *d, loom_model *m, const float *ctx, int n_ctx, int32_t last,
                      const float *exact, float *scr) {
    int V = m->cfg.vocab_size, rows = d->block - 1;
    float *got = malloc(sizeof(float) * (size_t)rows * V);
    CHECKF(loom_dflash_prepare(d, m, 1) == LOOM_OK, "prepare: %s", loom_last_error());
    CHECK(loom_dflash_prepare(d, m, 1) == LOOM_OK); /* again: kept as it is */
    loom_dflash_block(d, m, ctx, n_ctx, n_ctx, last, got, scr);
    if (loom_dflash_is_q8(d)) {
        int same = 0;
        for (int i = 0; i < rows; i++)
            same += loom_argmax(got + (size_t)i * V, V) == loom_argmax(exact + (size_t)i * V, V);
        double err = test_rel_err(got, exact, (size_t)rows * V);
        CHECKF(err < 5e-2 && same >= rows - 2, "8-bit drafter: logits %g from exact, %d of %d picks "
               "the same", err, same, rows);
        printf("8-bit drafter: logits within %.2g of exact, %d of %d picks the same\n", err, same, rows);
    } else {
        CHECKF(!memcmp(got, exact, sizeof(float) * (size_t)rows * V),
               "prepare(fast) without integer kernels changed the logits");
    }
    CHECK(loom_dflash_prepare(d, m, 0) == LOOM_OK);
    CHECK(!loom_dflash_is_q8(d));
    loom_dflash_block(d, m, ctx, n_ctx, n_ctx, last, got, scr);
    CHECKF(!memcmp(got, exact, sizeof(float) * (size_t)rows * V), "prepared back to exact: the "
           "logits are not the checkpoint's");
    free(got);
}

/* A trained drafter's reference.safetensors (tools/train_dflash.py writes
 * one: block logits after a held-out prompt, from PyTorch in f32): loom's
 * projection and block forward give the same logits. Skipped without one. */
static void trained_reference(const char *dir, const char *target_dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    if (access(path, R_OK) != 0) {
        printf("%s: no reference (skipped)\n", dir);
        return;
    }
    loom_model *m = NULL, *dm = NULL;
    CHECK(loom_st_open(path, &ref) == LOOM_OK);
    CHECKF(loom_model_load(target_dir, NULL, &m) == LOOM_OK && loom_model_load(dir, NULL, &dm) == LOOM_OK,
           "%s", loom_last_error());
    const loom_st_tensor *ids = ref ? loom_st_find(ref, "ids") : NULL, *want = ref ? loom_st_find(ref, "block_logits") : NULL;
    if (m && dm && dm->dflash && ids && want) {
        const loom_dflash *d = dm->dflash;
        int p = (int)ids->shape[0] - 1, V = m->cfg.vocab_size, H = m->cfg.hidden_size;
        const int32_t *tok = ids->data;
        loom_kv_pool *kv = NULL;
        loom_exec *x = NULL;
        CHECK(loom_kv_pool_create(m->cfg.n_layers, loom_model_kv_dim(m), 16, 8, LOOM_KV_F32, &kv) == LOOM_OK);
        CHECK(loom_exec_create(m, kv, p, p + 1, &x) == LOOM_OK);
        float *taps_out = malloc(sizeof(float) * (size_t)p * d->n_taps * H);
        float *ctx = malloc(sizeof(float) * loom_dflash_row_floats(d) * (size_t)p);
        float *scr = malloc(sizeof(float) * LOOM_MAX(loom_dflash_scratch(d, p, 1), (size_t)p * (H + d->n_kv * d->head_dim)));
        float *got = malloc(sizeof(float) * (size_t)(d->block - 1) * V);
        loom_kv_seq seq = {0};
        CHECK(loom_kv_seq_reserve(kv, &seq, p) == LOOM_OK);
        loom_fwd_row row = {.tokens = tok, .n = p, .seq = &seq};
        loom_exec_set_taps(x, d->taps, d->n_taps, taps_out);
        CHECK(loom_exec_forward(x, kv, &row, 1) == LOOM_OK);
        loom_dflash_project(d, m, taps_out, 0, p, ctx, scr);
        loom_dflash_block(d, m, ctx, p, p, tok[p], got, scr);
        double err = test_rel_err(got, want->data, (size_t)(d->block - 1) * V);
        CHECKF(err < 2e-3, "%s: block logits %g from the reference", dir, err);
        printf("%s: block logits within %.2g of PyTorch's\n", dir, err);
        q8_agrees(dm->dflash, m, ctx, p, tok[p], got, scr);
        loom_kv_seq_release(kv, &seq);
        loom_exec_free(x);
        loom_kv_pool_free(kv);
        free(taps_out), free(ctx), free(scr), free(got);
    }
    loom_model_free(dm);
    loom_model_free(m);
    loom_st_close(ref);
}

int main(void) {
    char dir[] = "/tmp/loom-dflash-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/drafter", dir);
    target t;
    if (open_target(&t, sub)) {
        forward_matches_reference(&t);
        batched_matches_single(&t);
        rollback(&t);
        stash_bound(&t);
        engine_identity(&t);
    } else {
        CHECKF(0, "fixtures: %s", loom_last_error());
    }
    close_target(&t);
    trained_reference("models/pycoder-16m-dflash", "models/pycoder-16m");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return test_report("test_dflash");
}
