/* model/shard: a rank's weights are the slices it claims (q heads, the KV
 * heads they read, split or replicated, MLP rows; o and down columns
 * copied), the ranks' o and down outputs sum to the whole model's on
 * random inputs, the o bias stays on rank 0, and what does not split is
 * refused by name. On the CPU, over the fixtures as stored (no_copy). */
#include <stdint.h>

#include "base/base.h"
#include "model/shard.h"
#include "test.h"

static unsigned long long rng = 0x243f6a8885a308d3ull;

static loom_model *load(const char *name, int no_copy) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    mp.no_copy = no_copy;
    loom_model *m = NULL;
    CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s: %s", name, loom_last_error());
    return m;
}

/* Element (r, c) of a float matrix as a double. */
static double at(const loom_weight *w, int r, int c) {
    size_t i = (size_t)r * w->cols + c;
    if (w->dtype == LOOM_DT_F32) return ((const float *)w->data)[i];
    uint16_t h = ((const uint16_t *)w->data)[i];
    return w->dtype == LOOM_DT_BF16 ? loom_bf16_to_f32(h) : loom_f16_to_f32(h);
}

/* w's rows [r0, r0 + n) and columns [c0, c0 + cols of s) are s, exactly. */
static int same_block(const loom_weight *s, const loom_weight *w, int r0, int c0) {
    for (int r = 0; r < s->rows; r++)
        for (int c = 0; c < s->cols; c++)
            if (at(s, r, c) != at(w, r0 + r, c0 + c)) return 0;
    return 1;
}

/* max |w x - sum_r s_r x_r| over max |w x|, x random, x_r its columns of s_r. */
static double sum_err(const loom_weight *w, loom_model *const *sh, int n, int down, int l) {
    double *x = malloc(sizeof(double) * (size_t)w->cols), err = 0, mx = 0;
    for (int c = 0; c < w->cols; c++) x[c] = (double)(test_rand_u32(&rng) % 2001) / 1000.0 - 1.0;
    for (int r = 0; r < w->rows; r++) {
        double full = 0, parts = 0;
        for (int c = 0; c < w->cols; c++) full += at(w, r, c) * x[c];
        for (int k = 0, c0 = 0; k < n; k++) {
            const loom_weight *s = down ? &sh[k]->layers[l].mlp.down : &sh[k]->layers[l].attn.wo;
            for (int c = 0; c < s->cols; c++) parts += at(s, r, c) * x[c0 + c];
            c0 += s->cols;
        }
        err = test_max(err, fabs(full - parts));
        mx = test_max(mx, fabs(full));
    }
    free(x);
    return mx > 0 ? err / mx : err;
}

static void check_split(const char *name, int n) {
    loom_model *m = load(name, 1);
    if (!m) return;
    loom_model *sh[8] = {0};
    int ok = 1;
    for (int r = 0; r < n && ok; r++) {
        ok = loom_model_shard(m, r, n, &sh[r]) == LOOM_OK;
        CHECKF(ok, "%s rank %d of %d: %s", name, r, n, loom_last_error());
    }
    int nh = m->cfg.n_heads, qh = nh / n;
    for (int l = 0; ok && l < m->cfg.n_layers; l++) {
        const loom_layer *L = &m->layers[l];
        int hd = L->attn.head_dim, nkv = L->attn.n_kv_heads, kvl = nkv >= n ? nkv / n : 1;
        int il = L->mlp.gate.rows / n;
        for (int r = 0; r < n; r++) {
            const loom_layer *S = &sh[r]->layers[l];
            int k0 = nkv >= n ? r * kvl : r * qh / (nh / nkv);
            CHECK_EQ_INT(sh[r]->cfg.n_heads, qh);
            CHECK_EQ_INT(S->attn.n_kv_heads, kvl);
            CHECK(S->attn.wq.rows == qh * hd && same_block(&S->attn.wq, &L->attn.wq, r * qh * hd, 0));
            CHECK(S->attn.wk.rows == kvl * hd && same_block(&S->attn.wk, &L->attn.wk, k0 * hd, 0));
            CHECK(same_block(&S->attn.wv, &L->attn.wv, k0 * hd, 0));
            CHECK(S->attn.wo.cols == qh * hd && same_block(&S->attn.wo, &L->attn.wo, 0, r * qh * hd));
            CHECK(same_block(&S->mlp.gate, &L->mlp.gate, r * il, 0));
            CHECK(same_block(&S->mlp.up, &L->mlp.up, r * il, 0));
            CHECK(S->mlp.down.cols == il && same_block(&S->mlp.down, &L->mlp.down, 0, r * il));
            CHECK(!L->attn.bq || S->attn.bq == L->attn.bq + (size_t)r * qh * hd);
            CHECK(!L->attn.bk || S->attn.bk == L->attn.bk + (size_t)k0 * hd);
            CHECK(S->attn.bo == (r == 0 ? L->attn.bo : NULL));
            CHECK(S->attn_norm == L->attn_norm && S->attn.q_norm == L->attn.q_norm);
        }
        double eo = sum_err(&L->attn.wo, sh, n, 0, l), ed = sum_err(&L->mlp.down, sh, n, 1, l);
        CHECKF(eo < 1e-12 && ed < 1e-12, "%s layer %d over %d: o %g, down %g off the whole", name,
               l, n, eo, ed);
    }
    for (int r = 0; r < n; r++) loom_model_shard_free(sh[r]);
    loom_model_free(m);
}

static void refused(const char *name, int n, int no_copy, const char *why) {
    loom_model *m = load(name, no_copy), *s = NULL;
    if (!m) return;
    loom_status st = loom_model_shard(m, 0, n, &s);
    CHECKF(st != LOOM_OK && !s && strstr(loom_last_error(), why), "%s over %d: %s", name, n,
           st ? loom_last_error() : "split");
    loom_model_shard_free(s);
    loom_model_free(m);
}

int main(void) {
    check_split("llama3-tiny", 2);
    check_split("qwen2-tiny", 2);    /* q/k/v biases */
    check_split("qwen3-tiny", 4);    /* 2 KV heads over 4 ranks: replicated */
    check_split("gemma2-tiny", 2);
    check_split("qwen3-tiny", 1);
    refused("qwen3-tiny", 3, 1, "do not split 3 ways");
    refused("qwen3moe-tiny", 2, 1, "dense attention");
    refused("qwen3-tiny-mlx4", 2, 1, "quantized");
    refused("qwen3.5-tiny-hybrid", 2, 1, "not a dense attention model");
    refused("qwen3-tiny", 2, 0, "laid out for the CPU");
    return test_report("test_shard");
}
