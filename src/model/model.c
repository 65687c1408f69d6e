/* model: architecture table, weight binding with shape/dtype checks, rope
 * frequencies. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static const loom_arch archs[] = {
    {"LlamaForCausalLM", LOOM_ARCH_CFG_BIAS},
    {"MistralForCausalLM", LOOM_ARCH_SLIDING},
    {"Qwen2ForCausalLM", LOOM_ARCH_QKV_BIAS},
    {"Qwen3ForCausalLM", LOOM_ARCH_QK_NORM | LOOM_ARCH_CFG_BIAS},
};

const loom_arch *loom_arch_find(const char *name) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(archs); i++)
        if (!strcmp(archs[i].name, name)) return &archs[i];
    return NULL;
}

static loom_status unsupported_arch(const char *name) {
    char list[512] = "";
    size_t w = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(archs); i++)
        w += (size_t)snprintf(list + w, sizeof list - w, "%s%s", i ? ", " : "", archs[i].name);
    return loom_err(LOOM_ERR_UNSUPPORTED, "architecture \"%s\" is not supported (supported: %s)",
                    name, list);
}

static int is_float(loom_dtype t) {
    return t == LOOM_DT_F32 || t == LOOM_DT_F16 || t == LOOM_DT_BF16;
}

static loom_status shape_error(const char *name, const char *want,
                               const loom_st_tensor *t) {
    char found[128];
    loom_st_describe(t, found, sizeof found);
    return loom_err(LOOM_ERR_FORMAT, "tensor %s: expected %s, found %s", name, want, found);
}

/* Binds a 2-D float weight, checking its shape. */
static loom_status bind_weight(loom_model *m, const char *name, int rows, int cols,
                               loom_weight *w) {
    const loom_st_tensor *t = loom_st_find(m->st, name);
    char want[96];
    snprintf(want, sizeof want, "F32/F16/BF16 [%d, %d]", rows, cols);
    if (!t) return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", name, want);
    if (!is_float(t->dtype) || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return shape_error(name, want, t);
    *w = (loom_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    return LOOM_OK;
}

/* Copies a 1-D float vector of n elements into the arena as f32. With
 * optional set, a missing tensor gives *out = NULL. */
static loom_status bind_vec(loom_model *m, const char *name, int n, int optional,
                            const float **out) {
    *out = NULL;
    const loom_st_tensor *t = loom_st_find(m->st, name);
    char want[64];
    snprintf(want, sizeof want, "F32/F16/BF16 [%d]", n);
    if (!t) {
        if (optional) return LOOM_OK;
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", name, want);
    }
    if (!is_float(t->dtype) || t->ndim != 1 || t->shape[0] != n) return shape_error(name, want, t);
    if (m->arena_used + (size_t)n > m->arena_cap)
        return loom_err(LOOM_ERR_INTERNAL, "vector arena too small at %s", name);
    float *dst = m->arena + m->arena_used;
    m->arena_used += ((size_t)n + 15) & ~(size_t)15;
    if (t->dtype == LOOM_DT_F32) memcpy(dst, t->data, (size_t)n * 4);
    else if (t->dtype == LOOM_DT_F16) loom_kernels_ref.f16_to_f32(dst, t->data, n);
    else loom_kernels_ref.bf16_to_f32(dst, t->data, n);
    *out = dst;
    return LOOM_OK;
}

/* inv_freq per rotated pair, following transformers' rope init functions. */
static loom_status setup_rope(loom_model *m) {
    const loom_config *c = &m->cfg;
    const loom_rope_config *r = &c->rope;
    int rot = (int)(c->head_dim * r->partial_rotary_factor);
    rot &= ~1;
    if (rot <= 0 || rot > c->head_dim)
        return loom_err(LOOM_ERR_FORMAT, "partial_rotary_factor %g gives %d rotated dims of %d",
                        r->partial_rotary_factor, rot, c->head_dim);
    m->rot_dim = rot;
    m->rope_scale = 1.0;
    m->inv_freq = malloc(sizeof(double) * (size_t)(rot / 2));
    if (!m->inv_freq) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < rot / 2; i++)
        m->inv_freq[i] = 1.0 / pow(r->theta, (double)(2 * i) / rot);
    switch (r->type) {
    case LOOM_ROPE_DEFAULT:
        break;
    case LOOM_ROPE_LINEAR:
        for (int i = 0; i < rot / 2; i++) m->inv_freq[i] /= r->factor;
        break;
    case LOOM_ROPE_LLAMA3: {
        double old = r->original_max_pos;
        double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
        for (int i = 0; i < rot / 2; i++) {
            double f = m->inv_freq[i], wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f /= r->factor;
            } else if (wl >= high_wl) {
                double s = (old / wl - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                f = (1 - s) * f / r->factor + s * f;
            }
            m->inv_freq[i] = f;
        }
        break;
    }
    case LOOM_ROPE_YARN: {
        double orig = r->original_max_pos > 0 ? r->original_max_pos : c->max_positions;
        double base = r->theta, dim = rot;
        double lo = floor(dim * log(orig / (r->beta_fast * 2 * M_PI)) / (2 * log(base)));
        double hi = ceil(dim * log(orig / (r->beta_slow * 2 * M_PI)) / (2 * log(base)));
        lo = LOOM_MAX(lo, 0);
        hi = LOOM_MIN(hi, dim - 1);
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < rot / 2; i++) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1 - ramp;  /* share of the unscaled frequency */
            double f = m->inv_freq[i];
            m->inv_freq[i] = f / r->factor * (1 - extra) + f * extra;
        }
        m->rope_scale = r->attention_factor > 0 ? r->attention_factor
                        : r->factor <= 1       ? 1.0
                                               : 0.1 * log(r->factor) + 1.0;
        break;
    }
    case LOOM_ROPE_DYNAMIC:
        return loom_err(LOOM_ERR_UNSUPPORTED, "rope type \"dynamic\" is not supported yet");
    }
    return LOOM_OK;
}

static loom_status bind_layer(loom_model *m, int l) {
    const loom_config *c = &m->cfg;
    loom_layer *L = &m->layers[l];
    int H = c->hidden_size, hd = c->head_dim;
    int qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, I = c->intermediate_size;
    char n[256];
    loom_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
    if ((s = bind_vec(m, NAME("input_layernorm.weight"), H, 0, &L->attn_norm))) return s;
    if ((s = bind_vec(m, NAME("post_attention_layernorm.weight"), H, 0, &L->ffn_norm))) return s;
    if ((s = bind_weight(m, NAME("self_attn.q_proj.weight"), qd, H, &L->wq))) return s;
    if ((s = bind_weight(m, NAME("self_attn.k_proj.weight"), kvd, H, &L->wk))) return s;
    if ((s = bind_weight(m, NAME("self_attn.v_proj.weight"), kvd, H, &L->wv))) return s;
    if ((s = bind_weight(m, NAME("self_attn.o_proj.weight"), H, qd, &L->wo))) return s;
    int bias = (m->arch->flags & LOOM_ARCH_QKV_BIAS) ||
               ((m->arch->flags & LOOM_ARCH_CFG_BIAS) && c->attention_bias);
    if (bias) {
        if ((s = bind_vec(m, NAME("self_attn.q_proj.bias"), qd, 0, &L->bq))) return s;
        if ((s = bind_vec(m, NAME("self_attn.k_proj.bias"), kvd, 0, &L->bk))) return s;
        if ((s = bind_vec(m, NAME("self_attn.v_proj.bias"), kvd, 0, &L->bv))) return s;
    }
    if ((m->arch->flags & LOOM_ARCH_CFG_BIAS) && c->attention_bias)
        if ((s = bind_vec(m, NAME("self_attn.o_proj.bias"), H, 1, &L->bo))) return s;
    if (m->arch->flags & LOOM_ARCH_QK_NORM) {
        if ((s = bind_vec(m, NAME("self_attn.q_norm.weight"), hd, 0, &L->q_norm))) return s;
        if ((s = bind_vec(m, NAME("self_attn.k_norm.weight"), hd, 0, &L->k_norm))) return s;
    }
    if ((s = bind_weight(m, NAME("mlp.gate_proj.weight"), I, H, &L->w_gate))) return s;
    if ((s = bind_weight(m, NAME("mlp.up_proj.weight"), I, H, &L->w_up))) return s;
    if ((s = bind_weight(m, NAME("mlp.down_proj.weight"), H, I, &L->w_down))) return s;
#undef NAME
    L->window = (m->arch->flags & LOOM_ARCH_SLIDING) ? c->sliding_window : 0;
    return LOOM_OK;
}

static loom_status load(loom_model *m, const char *dir, const loom_model_params *p) {
    loom_status s;
    if ((s = loom_config_load(dir, &m->cfg))) return s;
    const loom_config *c = &m->cfg;
    m->arch = loom_arch_find(c->arch);
    if (!m->arch) return unsupported_arch(c->arch);
    if (strcmp(c->hidden_act, "silu") != 0)
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (expected silu)",
                        c->arch, c->hidden_act);
    if ((s = setup_rope(m))) return s;
    m->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
    if ((s = loom_st_open_dir(dir, &m->st))) return s;

    int H = c->hidden_size, hd = c->head_dim;
    size_t per_layer = 2 * (size_t)H + 3 * (size_t)(c->n_heads + 2 * c->n_kv_heads) * hd +
                       2 * (size_t)hd + (size_t)H + 16 * 10;
    m->arena_cap = per_layer * (size_t)c->n_layers + (size_t)H + 16;
    m->arena = loom_alloc(m->arena_cap * sizeof(float));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->arena || !m->layers) return loom_err(LOOM_ERR_NOMEM, "out of memory");

    if ((s = bind_weight(m, "model.embed_tokens.weight", c->vocab_size, H, &m->embed))) return s;
    if ((s = bind_vec(m, "model.norm.weight", H, 0, &m->final_norm))) return s;
    /* Tied checkpoints omit lm_head.weight; some tied ones still carry it. */
    if (loom_st_find(m->st, "lm_head.weight") || !c->tie_embeddings) {
        if ((s = bind_weight(m, "lm_head.weight", c->vocab_size, H, &m->lm_head))) return s;
    } else {
        m->lm_head = m->embed;
    }
    for (int l = 0; l < c->n_layers; l++)
        if ((s = bind_layer(m, l))) return s;
    m->k = loom_kernels_get();
    return loom_pool_create(p->n_threads, &m->pool);
}

loom_model_params loom_model_default_params(void) {
    return (loom_model_params){.n_threads = 0};
}

loom_status loom_model_load(const char *dir, const loom_model_params *params,
                            loom_model **out) {
    *out = NULL;
    loom_model_params p = params ? *params : loom_model_default_params();
    loom_model *m = calloc(1, sizeof *m);
    if (!m) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    loom_status s = load(m, dir, &p);
    if (s != LOOM_OK) {
        loom_err_wrap(s, "%s", dir);
        loom_model_free(m);
        return s;
    }
    *out = m;
    return LOOM_OK;
}

void loom_model_free(loom_model *m) {
    if (!m) return;
    loom_pool_free(m->pool);
    loom_st_close(m->st);
    free(m->layers);
    loom_free(m->arena);
    free(m->inv_freq);
    free(m);
}

int loom_model_vocab_size(const loom_model *m) { return m->cfg.vocab_size; }
int loom_model_max_positions(const loom_model *m) { return m->cfg.max_positions; }
const char *loom_model_arch(const loom_model *m) { return m->cfg.arch; }

int loom_model_eos_ids(const loom_model *m, int32_t *out, int cap) {
    for (int i = 0; i < m->cfg.n_eos && i < cap; i++) out[i] = m->cfg.eos_ids[i];
    return m->cfg.n_eos;
}
