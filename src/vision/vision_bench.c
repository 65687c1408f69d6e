/* vision_bench: the timed path of one image, file to first token
 * (vision_bench.h). It runs a context over the prepared prompt, so it sits
 * above the engine, apart from the tower files. */
#include "vision/vision_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/context.h"
#include "load/safetensors.h"
#include "model/matmul.h"
#include "ops/ops.h"
#include "ops/threadpool.h"
#include "vision/image.h"
#include "vision/imgproc.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct run {
    loom_model *m;
    loom_vision *v;
    loom_imgproc proc;
    const char *image;
} run;

/* File -> pixels: decode, preprocess. */
static loom_status prep(const run *r, loom_imgproc_out *px) {
    loom_image img = {0};
    loom_status s = loom_image_load(r->image, &img);
    if (!s) s = loom_imgproc_run(&r->proc, &img, px);
    loom_image_free(&img);
    return s;
}

/* A short prompt around the image's tok placeholders:
 * 8 text, start, image x tok, end, 8 text. *n gets its length. */
static int32_t *prompt_ids(const loom_vision_info *vi, int tok, int *n) {
    int32_t *ids = malloc(sizeof *ids * (size_t)(tok + 18));
    int k = 0;
    if (!ids) return NULL;
    for (int i = 0; i < 8; i++) ids[k++] = 10 + i;
    if (vi->vision_start >= 0) ids[k++] = vi->vision_start;
    for (int i = 0; i < tok; i++) ids[k++] = vi->image_token;
    if (vi->vision_end >= 0) ids[k++] = vi->vision_end;
    for (int i = 0; i < 8; i++) ids[k++] = 20 + i;
    *n = k;
    return ids;
}

/* File to first greedy token; *tok gets it. */
static loom_status first_token(run *r, int32_t *tok) {
    loom_imgproc_out px;
    loom_status s = prep(r, &px);
    if (s) return s;
    const loom_vision_info *vi = loom_vision_get_info(r->v);
    loom_vision_image img = {px.pixel_values, {px.plan.grid_t, px.plan.grid_h, px.plan.grid_w}, NULL};
    int n = 0;
    int32_t *ids = prompt_ids(vi, loom_vision_tokens(vi, img.grid), &n);
    loom_vision_prompt p;
    loom_context *c = NULL;
    float *logits = malloc(sizeof(float) * (size_t)r->m->cfg.vocab_size);
    s = ids && logits ? loom_vision_prompt_build(r->v, ids, n, &img, 1, &p)
                      : loom_err(LOOM_ERR_NOMEM, "out of memory");
    int built = !s;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n + 1;
    /* whole prompt in one row: no image span is cut */
    cp.n_batch = n;
    if (!s) s = loom_context_create(r->m, &cp, &c);
    if (!s) s = loom_context_eval_input(c, ids, n, &p.in, 0, logits);
    if (!s) {
        int V = r->m->cfg.vocab_size, ok = 1;
        for (int i = 0; i < V; i++) ok &= isfinite(logits[i]) != 0;
        if (!ok) s = loom_err(LOOM_ERR_INTERNAL, "the prompt's logits are not finite");
        *tok = loom_argmax(logits, V);
    }
    loom_context_free(c);
    if (built) loom_vision_prompt_free(&p);
    free(logits);
    free(ids);
    loom_imgproc_out_free(&px);
    return s;
}

/* A fixed pseudo-random weight value, roughly N(0, 0.03^2). */
static float weight_value(uint64_t *rng) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        s += (float)(*rng >> 40) / (float)(1 << 24);
    }
    return 0.03f * (s - 2.0f) * 1.7320508f;
}

/* The matmul peer: GFLOP/s of loom_fwd_matmul over [1280, 1280] of dtype
 * dt at T = 1024, best of 5 after a warm-up. */
static double matmul_peer(loom_model *m, loom_dtype dt) {
    enum { R = 1280, C = 1280, T = 1024 };
    size_t es = loom_dtype_size(dt);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    void *w = loom_alloc((size_t)R * C * es);
    float *x = loom_alloc(sizeof(float) * (size_t)T * C), *y = loom_alloc(sizeof(float) * (size_t)T * R);
    double best = 0;
    if (!w || !x || !y) goto done;
    for (size_t i = 0; i < (size_t)R * C; i++) {
        float f = weight_value(&rng);
        if (dt == LOOM_DT_F32) ((float *)w)[i] = f;
        else if (dt == LOOM_DT_BF16) ((uint16_t *)w)[i] = loom_f32_to_bf16(f);
        else ((uint16_t *)w)[i] = loom_f32_to_f16(f);
    }
    for (size_t i = 0; i < (size_t)T * C; i++) x[i] = weight_value(&rng) / 0.03f;
    loom_weight lw = {.dtype = dt, .rows = R, .cols = C, .data = w};
    for (int r = 0; r < 6; r++) {
        double t0 = loom_now();
        loom_fwd_matmul(m, y, x, &lw, T);
        double dtm = loom_now() - t0;
        if (r) best = LOOM_MAX(best, 2.0 * R * C * T / dtm / 1e9);
    }
done:
    loom_free(w), loom_free(x), loom_free(y);
    return best;
}

/* The dtype most of the tower's bytes are in (F32 if unsure). */
static loom_dtype tower_dtype(const loom_model *m) {
    double by[LOOM_DT_COUNT] = {0};
    for (int i = 0; i < loom_st_count(m->st); i++) {
        const loom_st_tensor *t = loom_st_at(m->st, i);
        if (strstr(t->name, "visual.") || strstr(t->name, "vision_tower."))
            by[t->dtype] += (double)t->nbytes;
    }
    loom_dtype best = LOOM_DT_F32;
    for (int d = 0; d < LOOM_DT_COUNT; d++)
        if (by[d] > by[best]) best = (loom_dtype)d;
    return best == LOOM_DT_BF16 || best == LOOM_DT_F16 ? best : LOOM_DT_F32;
}

/* The timed repeats (and one warm-up): medians into b. */
static loom_status timed(run *r, const loom_vision_image *img, float *emb, float *deep, int reps,
                         loom_vision_bench *b) {
    double *tp = malloc(sizeof(double) * (size_t)reps), *te = malloc(sizeof(double) * (size_t)reps);
    double *tt = malloc(sizeof(double) * (size_t)reps);
    loom_status s = tp && te && tt ? LOOM_OK : loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int k = -1; !s && k < reps; k++) {
        loom_imgproc_out o;
        double t0 = loom_now();
        if ((s = prep(r, &o))) break;
        double t1 = loom_now();
        loom_imgproc_out_free(&o);
        if ((s = loom_vision_encode(r->v, img, emb, deep))) break;
        double t2 = loom_now();
        int32_t t_ = -1;
        if ((s = first_token(r, &t_))) break;
        if (t_ != b->first) {
            s = loom_err(LOOM_ERR_INTERNAL, "the first token changed (%d, then %d)", b->first, t_);
            break;
        }
        double t3 = loom_now();
        if (k >= 0) tp[k] = t1 - t0, te[k] = t2 - t1, tt[k] = t3 - t2;
    }
    if (!s) {
        b->preprocess_s = median(tp, reps);
        b->encode_s = median(te, reps);
        b->ttft_s = median(tt, reps);
    }
    free(tp), free(te), free(tt);
    return s;
}

loom_status loom_vision_bench_run(loom_model *m, loom_vision *v, const char *model_dir,
                                  const char *image, int reps, loom_vision_bench *out) {
    memset(out, 0, sizeof *out);
    run r = {.m = m, .v = v, .image = image};
    loom_imgproc_out px = {0};
    loom_status s = loom_imgproc_load(model_dir, &r.proc);
    if (!s) s = prep(&r, &px);
    if (s) return s;
    const loom_vision_info *vi = loom_vision_get_info(v);
    loom_vision_image img = {px.pixel_values, {px.plan.grid_t, px.plan.grid_h, px.plan.grid_w}, NULL};
    int tok = loom_vision_tokens(vi, img.grid), H = vi->out_hidden, D = vi->n_deep;
    size_t ne = (size_t)tok * H, nd = (size_t)LOOM_MAX(D, 1) * tok * H;
    float *e1 = malloc(sizeof(float) * ne), *e2 = malloc(sizeof(float) * ne);
    float *d1 = malloc(sizeof(float) * nd), *d2 = malloc(sizeof(float) * nd);
    if (!e1 || !e2 || !d1 || !d2) s = loom_err(LOOM_ERR_NOMEM, "out of memory for %d image tokens", tok);
    /* 1. validate */
    if (!s) s = loom_vision_encode(v, &img, e1, D ? d1 : NULL);
    if (!s) s = loom_vision_encode(v, &img, e2, D ? d2 : NULL);
    int ok = !s && !memcmp(e1, e2, sizeof(float) * ne) && (!D || !memcmp(d1, d2, sizeof(float) * nd));
    for (size_t i = 0; ok && i < ne; i++) ok = isfinite(e1[i]) != 0;
    if (!s && !ok) s = loom_err(LOOM_ERR_INTERNAL, "the tower's output is not finite or not reproducible");
    int32_t first = -1;
    if (!s) s = first_token(&r, &first);
    out->first = first;
    if (s) {
        loom_err_wrap(s, "validation failed");
    } else {
        /* 2. the peer, 3. timed */
        out->dtype = tower_dtype(m);
        out->peer_gflops = matmul_peer(m, out->dtype);
        s = timed(&r, &img, e1, D ? d1 : NULL, reps, out);
    }
    out->resized_w = px.plan.resized_w;
    out->resized_h = px.plan.resized_h;
    memcpy(out->grid, img.grid, sizeof out->grid);
    out->tokens = tok;
    out->prompt_tokens = tok + 16 + (vi->vision_start >= 0) + (vi->vision_end >= 0);
    out->threads = loom_pool_size(m->pool);
    out->tower_gflop = loom_vision_flops(v, img.grid) / 1e9;
    out->encode_gflops = out->encode_s > 0 ? out->tower_gflop / out->encode_s : 0;
    free(e1), free(e2), free(d1), free(d2);
    loom_imgproc_out_free(&px);
    return s;
}

void loom_vision_bench_format(const loom_vision_bench *b, const char *model, const char *image,
                              int json, loom_buf *out) {
    const char *dt = loom_dtype_name(b->dtype);
    double share = b->peer_gflops > 0 ? b->encode_gflops / b->peer_gflops : 0;
    if (json) {
        loom_buf_printf(out, "{\"model\":\"%s\",\"image\":\"%s\",\"resized\":[%d,%d],\"grid\":[%d,%d,%d],"
                        "\"tokens\":%d,\"threads\":%d,\"dtype\":\"%s\",\"tower_gflop\":%.4f,"
                        "\"preprocess_s\":%.6f,\"encode_s\":%.6f,\"ttft_s\":%.6f,\"encode_gflops\":%.3f,"
                        "\"matmul_peer_gflops\":%.3f,\"share_of_peer\":%.4f}\n",
                        model, image, b->resized_w, b->resized_h, b->grid[0], b->grid[1], b->grid[2],
                        b->tokens, b->threads, dt, b->tower_gflop, b->preprocess_s, b->encode_s,
                        b->ttft_s, b->encode_gflops, b->peer_gflops, share);
        return;
    }
    loom_buf_printf(out, "%s, %s: %dx%d -> grid %dx%dx%d, %d image tokens; %d threads, tower %s\n",
                    model, image, b->resized_w, b->resized_h, b->grid[0], b->grid[1], b->grid[2],
                    b->tokens, b->threads, dt);
    loom_buf_printf(out, "  tower      %.3f GFLOP per image (counted from the shapes)\n", b->tower_gflop);
    loom_buf_printf(out, "  preprocess %8.2f ms   (decode + resize + patches)\n", b->preprocess_s * 1e3);
    loom_buf_printf(out, "  encode     %8.2f ms   %.1f GFLOP/s, %.0f%% of the matmul peer (%.1f GFLOP/s, "
                    "%s [1280 x 1280] at T = 1024)\n", b->encode_s * 1e3, b->encode_gflops, 100 * share,
                    b->peer_gflops, dt);
    loom_buf_printf(out, "  TTFT       %8.2f ms   (file to first token, %d-token prompt)\n", b->ttft_s * 1e3,
                    b->prompt_tokens);
}
