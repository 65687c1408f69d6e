/* model: architecture table, the per-layer plan (layer kinds, head sizes,
 * rope per layer kind, MoE placement, KV sharing), weight binding with
 * shape/dtype checks (float or MLX affine-quantized), rope frequencies. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/dflash.h"
#include "model/wquant.h"

#define GEMMA (LOOM_ARCH_NORM_1P | LOOM_ARCH_SANDWICH | LOOM_ARCH_EMBED_SCALE | LOOM_ARCH_QPAS)
#define GEMMA4 (LOOM_ARCH_SANDWICH | LOOM_ARCH_EMBED_SCALE | LOOM_ARCH_QK_NORM | \
                LOOM_ARCH_V_NORM | LOOM_ARCH_UNIT_SCALE | LOOM_ARCH_PLE | LOOM_ARCH_LAYER_SCALAR | \
                LOOM_ARCH_MOE_BESIDE)
#define QWEN_HYBRID (LOOM_ARCH_NORM_1P | LOOM_ARCH_QK_NORM | LOOM_ARCH_ATTN_GATE | LOOM_ARCH_LINEAR)

static const loom_arch archs[] = {
    {"LlamaForCausalLM", LOOM_ARCH_CFG_BIAS},
    {"MistralForCausalLM", LOOM_ARCH_SLIDING},
    {"Qwen2ForCausalLM", LOOM_ARCH_QKV_BIAS},
    {"Qwen2_5_VLForConditionalGeneration", LOOM_ARCH_QKV_BIAS},
    {"Qwen3ForCausalLM", LOOM_ARCH_QK_NORM | LOOM_ARCH_CFG_BIAS},
    {"Qwen3MoeForCausalLM", LOOM_ARCH_QK_NORM | LOOM_ARCH_CFG_BIAS | LOOM_ARCH_MOE},
    {"Qwen3VLForConditionalGeneration", LOOM_ARCH_QK_NORM | LOOM_ARCH_CFG_BIAS},
    {"Gemma2ForCausalLM", GEMMA | LOOM_ARCH_ALT_SLIDING},
    {"Gemma3ForCausalLM", GEMMA | LOOM_ARCH_QK_NORM | LOOM_ARCH_PATTERN_SLIDING},
    {"Gemma4ForCausalLM", GEMMA4},
    {"Gemma4ForConditionalGeneration", GEMMA4},
    {"Gemma3ForConditionalGeneration", GEMMA | LOOM_ARCH_QK_NORM | LOOM_ARCH_PATTERN_SLIDING},
    {"Qwen3_5ForCausalLM", QWEN_HYBRID},
    {"Qwen3_5ForConditionalGeneration", QWEN_HYBRID},
    {"Qwen3NextForCausalLM", QWEN_HYBRID | LOOM_ARCH_LINEAR_FUSED | LOOM_ARCH_MOE},
};

const loom_arch *loom_arch_find(const char *name) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(archs); i++)
        if (!strcmp(archs[i].name, name)) return &archs[i];
    return NULL;
}

static loom_status unsupported_arch(const char *name) {
    char list[1024] = "";
    size_t w = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(archs); i++)
        w += (size_t)snprintf(list + w, sizeof list - w, "%s%s", i ? ", " : "", archs[i].name);
    return loom_err(LOOM_ERR_UNSUPPORTED, "architecture \"%s\" is not supported (supported: %s)",
                    name, list);
}

int loom_model_kv_dim(const loom_model *m) { return m->kv_dim; }

static int is_float(loom_dtype t) {
    return t == LOOM_DT_F32 || t == LOOM_DT_F16 || t == LOOM_DT_BF16;
}

static loom_status shape_error(const char *name, const char *want,
                               const loom_st_tensor *t) {
    char found[128];
    loom_st_describe(t, found, sizeof found);
    return loom_err(LOOM_ERR_FORMAT, "tensor %s: expected %s, found %s", name, want, found);
}

/* The name a tensor has in this checkpoint: multimodal checkpoints keep
 * the language model under a prefix (m->prefix replaces "model.", and
 * m->head_prefix goes before "lm_head."). Idempotent. */
static const char *real_name(const loom_model *m, const char *name, char *buf, size_t n) {
    if (m->prefix[0] && !strncmp(name, "model.", 6) && strncmp(name, m->prefix, strlen(m->prefix))) {
        snprintf(buf, n, "%s%s", m->prefix, name + 6);
        return buf;
    }
    if (m->head_prefix[0] && !strncmp(name, "lm_head.", 8)) {
        snprintf(buf, n, "%s%s", m->head_prefix, name);
        return buf;
    }
    return name;
}

static const loom_st_tensor *find(const loom_model *m, const char *name) {
    char buf[320];
    return loom_st_find(m->st, real_name(m, name, buf, sizeof buf));
}

/* The config's bits/group for a module path (per-module override first). */
static void quant_for(const loom_config *c, const char *module, int *bits, int *group) {
    *bits = c->quant_bits;
    *group = c->quant_group;
    for (int i = 0; i < c->n_quant_overrides; i++)
        if (!strcmp(c->quant_overrides[i].path, module)) {
            *bits = c->quant_overrides[i].bits;
            *group = c->quant_overrides[i].group;
        }
}

/* Formats a shape "[E, ]rows, cols" (E only when stacked). */
static void fmt_dims(char *buf, size_t n, const char *dtype, int stack, int rows, int cols) {
    if (stack) snprintf(buf, n, "%s [%d, %d, %d]", dtype, stack, rows, cols);
    else snprintf(buf, n, "%s [%d, %d]", dtype, rows, cols);
}

static int dims_are(const loom_st_tensor *t, int stack, int rows, int cols) {
    if (stack) return t->ndim == 3 && t->shape[0] == stack && t->shape[1] == rows && t->shape[2] == cols;
    return t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

static loom_status interleave_all(loom_model *m);

/* Binds an MLX affine-quantized weight: name is "<module>.weight" (U32
 * packed), with "<module>.scales" and "<module>.biases". Bits and group
 * follow from config.json (per-module overrides first) and must match the
 * shapes. With stack > 0 the tensors hold stack experts and this binds
 * expert e. */
static loom_status bind_quant(loom_model *m, const char *name, const loom_st_tensor *t, int stack,
                              int e, int rows, int cols, loom_weight *w) {
    char module[256], sname[300], bname[300], want[160], dt[48];
    size_t len = strlen(name);
    if (len < 8 || strcmp(name + len - 7, ".weight"))
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: U32 but not a quantized weight", name);
    snprintf(module, sizeof module, "%.*s", (int)(len - 7), name);
    snprintf(sname, sizeof sname, "%s.scales", module);
    snprintf(bname, sizeof bname, "%s.biases", module);
    const loom_st_tensor *sc = loom_st_find(m->st, sname), *bi = loom_st_find(m->st, bname);
    int bits, group;
    quant_for(&m->cfg, module, &bits, &group);
    if (!m->cfg.quant_bits || !bits)
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: packed U32 but config.json does not "
                        "quantize %s", name, module);
    if (group <= 0 || cols % group || (cols * bits) % 32)
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: %d columns do not split into groups of %d "
                        "at %d bits", name, cols, group, bits);
    snprintf(dt, sizeof dt, "(%d-bit, group %d)", bits, group);
    fmt_dims(want, sizeof want, "U32", stack, rows, cols * bits / 32);
    snprintf(want + strlen(want), sizeof want - strlen(want), " %s", dt);
    if (!dims_are(t, stack, rows, cols * bits / 32)) return shape_error(name, want, t);
    fmt_dims(want, sizeof want, "BF16/F16", stack, rows, cols / group);
    if (!sc) return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", sname, want);
    if (!bi) return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", bname, want);
    const loom_st_tensor *pair[2] = {sc, bi};
    for (int i = 0; i < 2; i++)
        if ((pair[i]->dtype != LOOM_DT_BF16 && pair[i]->dtype != LOOM_DT_F16) ||
            pair[i]->dtype != sc->dtype || !dims_are(pair[i], stack, rows, cols / group))
            return shape_error(i ? bname : sname, want, pair[i]);
    if (group > LOOM_QGROUP_MAX)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor %s: quantization group %d is larger than "
                        "%d", name, group, LOOM_QGROUP_MAX);
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor %s: %d-bit quantization is not supported "
                        "(expected 2, 3, 4, 5, 6 or 8)", name, bits);
    size_t wo = (size_t)e * rows * ((size_t)cols * bits / 32), so = (size_t)e * rows * (cols / group);
    const uint32_t *qw = (const uint32_t *)t->data + wo;
    *w = (loom_weight){.dtype = LOOM_DT_U32, .rows = rows, .cols = cols, .data = qw};
    w->q = (loom_qmat){.w = qw, .scales = (const uint16_t *)sc->data + so,
                       .biases = (const uint16_t *)bi->data + so, .n = cols, .bits = bits,
                       .group = group, .f16 = sc->dtype == LOOM_DT_F16};
    return LOOM_OK;
}

/* An FP8 weight's scale tensor: "<module>.weight_scale_inv" (the fp8
 * method's name) or "<module>.weight_scale" (fbgemm, compressed-tensors);
 * both multiply. */
static const loom_st_tensor *f8_scale_tensor(const loom_model *m, const char *module, char *name,
                                             size_t n) {
    snprintf(name, n, "%s.weight_scale_inv", module);
    const loom_st_tensor *s = loom_st_find(m->st, name);
    if (s) return s;
    snprintf(name, n, "%s.weight_scale", module);
    s = loom_st_find(m->st, name);
    if (!s) snprintf(name, n, "%s.weight_scale_inv", module);
    return s;
}

static int is_scale_name(const char *name) {
    size_t len = strlen(name);
    return (len > 17 && !strcmp(name + len - 17, ".weight_scale_inv")) ||
           (len > 13 && !strcmp(name + len - 13, ".weight_scale"));
}

/* Binds an FP8 weight: "<module>.weight" F8_E4M3 [rows, cols] and its
 * scales, f32 or bf16, converted to f32 once. With weight_block_size
 * [br, bc] the scales are [ceil(rows / br), ceil(cols / bc)]; without it,
 * per-channel [rows] / [rows, 1] or per-tensor [] / [1] / [1, 1]. */
static loom_status bind_f8(loom_model *m, const char *name, const loom_st_tensor *t, int rows,
                           int cols, loom_weight *w) {
    const loom_config *c = &m->cfg;
    char module[256], sname[300], want[200];
    size_t len = strlen(name);
    if (len < 8 || strcmp(name + len - 7, ".weight"))
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: F8_E4M3 but not a linear weight", name);
    if (!c->fp8)
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: F8_E4M3 but config.json has no "
                        "quantization_config with quant_method \"fp8\"", name);
    snprintf(want, sizeof want, "F8_E4M3 [%d, %d]", rows, cols);
    if (!dims_are(t, 0, rows, cols)) return shape_error(name, want, t);
    snprintf(module, sizeof module, "%.*s", (int)(len - 7), name);
    const loom_st_tensor *s = f8_scale_tensor(m, module, sname, sizeof sname);
    int br = c->fp8_block[0], bc = c->fp8_block[1], sr, sc;
    if (br > 0) {
        sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
        snprintf(want, sizeof want, "F32/BF16 [%d, %d] (%dx%d blocks of F8_E4M3 [%d, %d])", sr,
                 sc, br, bc, rows, cols);
    } else {
        snprintf(want, sizeof want, "F32/BF16 [%d] or [%d, 1] per channel, or [1] per tensor "
                 "(F8_E4M3 [%d, %d], no weight_block_size)", rows, rows, rows, cols);
    }
    if (!s) return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", sname, want);
    size_t count = 1;
    for (int d = 0; d < s->ndim; d++) count *= (size_t)s->shape[d];
    int ok = is_float(s->dtype);
    if (br > 0) {
        ok = ok && dims_are(s, 0, sr, sc);
    } else if (count == 1 && s->ndim <= 2) {
        br = rows, bc = cols;                      /* per tensor */
    } else {
        ok = ok && ((s->ndim == 1 && s->shape[0] == rows) || dims_are(s, 0, rows, 1));
        br = 1, bc = cols;                         /* per channel */
    }
    if (!ok) return shape_error(sname, want, s);
    if (m->f8_used + count > m->f8_cap)
        return loom_err(LOOM_ERR_INTERNAL, "FP8 scale buffer too small at %s", sname);
    float *dst = m->f8_scales + m->f8_used;
    m->f8_used += count;
    for (size_t i = 0; i < count; i++) {
        dst[i] = s->dtype == LOOM_DT_F32 ? ((const float *)s->data)[i]
                 : s->dtype == LOOM_DT_BF16 ? loom_bf16_to_f32(((const uint16_t *)s->data)[i])
                                            : loom_f16_to_f32(((const uint16_t *)s->data)[i]);
        if (!isfinite(dst[i]))
            return loom_err(LOOM_ERR_FORMAT, "tensor %s: scale %zu is %g (expected finite "
                            "scales)", sname, i, (double)dst[i]);
    }
    *w = (loom_weight){.dtype = LOOM_DT_F8_E4M3, .rows = rows, .cols = cols, .data = t->data};
    w->f8 = (loom_f8mat){.w = t->data, .scales = dst, .n = cols, .br = br, .bc = bc};
    m->n_f8++;
    return LOOM_OK;
}

/* Binds a 2-D weight (float, or quantized when the file packs it). */
static loom_status bind_weight(loom_model *m, const char *name, int rows, int cols,
                               loom_weight *w) {
    char rn[320];
    name = real_name(m, name, rn, sizeof rn);
    const loom_st_tensor *t = loom_st_find(m->st, name);
    char want[96];
    snprintf(want, sizeof want, "F32/F16/BF16 [%d, %d]", rows, cols);
    if (!t) return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", name, want);
    if (t->dtype == LOOM_DT_U32) return bind_quant(m, name, t, 0, 0, rows, cols, w);
    if (t->dtype == LOOM_DT_F8_E4M3) return bind_f8(m, name, t, rows, cols, w);
    if (!is_float(t->dtype) || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return shape_error(name, want, t);
    *w = (loom_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    return LOOM_OK;
}

/* Expert e of a fused 3-D tensor [n_experts, rows_total, cols], rows
 * [r0, r0 + rows). Float only. */
static loom_status bind_expert_slice(loom_model *m, const char *name, int e, int n_experts,
                                     int rows_total, int r0, int rows, int cols, loom_weight *w) {
    char rn[320];
    name = real_name(m, name, rn, sizeof rn);
    const loom_st_tensor *t = loom_st_find(m->st, name);
    char want[96];
    snprintf(want, sizeof want, "F32/F16/BF16 [%d, %d, %d]", n_experts, rows_total, cols);
    if (!t) return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", name, want);
    if (!is_float(t->dtype) || t->ndim != 3 || t->shape[0] != n_experts ||
        t->shape[1] != rows_total || t->shape[2] != cols)
        return shape_error(name, want, t);
    size_t off = ((size_t)e * rows_total + (size_t)r0) * (size_t)cols * loom_dtype_size(t->dtype);
    *w = (loom_weight){.dtype = t->dtype, .rows = rows, .cols = cols,
                       .data = (const char *)t->data + off};
    return LOOM_OK;
}

/* Expert e of a stacked "<module>.weight" [n_experts, rows, cols] (MLX
 * switch_mlp), float or quantized. */
static loom_status bind_stacked(loom_model *m, const char *name, int e, int n_experts, int rows,
                                int cols, loom_weight *w) {
    char rn[320];
    name = real_name(m, name, rn, sizeof rn);
    const loom_st_tensor *t = loom_st_find(m->st, name);
    if (t && t->dtype == LOOM_DT_U32) return bind_quant(m, name, t, n_experts, e, rows, cols, w);
    return bind_expert_slice(m, name, e, n_experts, rows, 0, rows, cols, w);
}

/* Copies a float tensor of the given shape into the arena as f32 (adding
 * 1 when plus1). With optional set, a missing tensor gives *out = NULL. */
static loom_status bind_f32(loom_model *m, const char *name, int ndim, const int *dims,
                            int optional, int plus1, const float **out) {
    *out = NULL;
    char rn[320];
    name = real_name(m, name, rn, sizeof rn);
    const loom_st_tensor *t = loom_st_find(m->st, name);
    char want[96];
    int w = snprintf(want, sizeof want, "F32/F16/BF16 [");
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        w += snprintf(want + w, sizeof want - (size_t)w, "%s%d", i ? ", " : "", dims[i]);
        n *= (size_t)dims[i];
    }
    snprintf(want + w, sizeof want - (size_t)w, "]");
    if (!t) {
        if (optional) return LOOM_OK;
        return loom_err(LOOM_ERR_FORMAT, "tensor %s: missing (expected %s)", name, want);
    }
    int ok = is_float(t->dtype) && t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == dims[i];
    if (!ok) return shape_error(name, want, t);
    if (m->arena_used + n > m->arena_cap)
        return loom_err(LOOM_ERR_INTERNAL, "vector arena too small at %s", name);
    float *dst = m->arena + m->arena_used;
    m->arena_used += (n + 15) & ~(size_t)15;
    if (t->dtype == LOOM_DT_F32) memcpy(dst, t->data, n * 4);
    else if (t->dtype == LOOM_DT_F16) loom_kernels_ref.f16_to_f32(dst, t->data, (int)n);
    else loom_kernels_ref.bf16_to_f32(dst, t->data, (int)n);
    if (plus1)
        for (size_t i = 0; i < n; i++) dst[i] += 1.0f;
    *out = dst;
    return LOOM_OK;
}

static loom_status bind_vec(loom_model *m, const char *name, int n, int optional,
                            const float **out) {
    return bind_f32(m, name, 1, &n, optional, 0, out);
}

/* A norm weight: (1 + w) for the families that store it offset. */
static loom_status bind_norm(loom_model *m, const char *name, int n, const float **out) {
    return bind_f32(m, name, 1, &n, 0, (m->arch->flags & LOOM_ARCH_NORM_1P) != 0, out);
}

/* Which position stream turns each rotated pair: runs of mrope_section[k]
 * pairs (Qwen2-VL, Qwen2.5-VL), or interleaved t,h,w,t,h,w... with h and w
 * stopping after 3 * section[k] pairs (Qwen3-VL, Qwen3.5). */
static loom_status setup_mrope(const loom_rope_config *r, int half, loom_rope *out) {
    const int *sec = r->mrope_section;
    int sum = sec[0] + sec[1] + sec[2];
    if (sum == 0) return LOOM_OK;
    if (sum != half)
        return loom_err(LOOM_ERR_FORMAT, "mrope_section [%d, %d, %d] covers %d rotated pairs, "
                        "the rope has %d", sec[0], sec[1], sec[2], sum, half);
    out->stream = malloc((size_t)half);
    if (!out->stream) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < half; i++) {
        int k = i < sec[0] ? 0 : i < sec[0] + sec[1] ? 1 : 2;
        if (r->mrope_interleaved)
            k = i % 3 == 1 && i < 3 * sec[1] ? 1 : i % 3 == 2 && i < 3 * sec[2] ? 2 : 0;
        out->stream[i] = (unsigned char)k;
    }
    return LOOM_OK;
}

/* inv_freq per rotated pair, following transformers' rope init functions,
 * for heads of head_dim. */
static loom_status setup_rope(const loom_config *c, const loom_rope_config *r, int head_dim,
                              loom_rope *out) {
    int rot = (int)(head_dim * r->partial_rotary_factor);
    if (r->type == LOOM_ROPE_PROPORTIONAL) rot = head_dim;
    rot &= ~1;
    if (rot <= 0 || rot > head_dim)
        return loom_err(LOOM_ERR_FORMAT, "partial_rotary_factor %g gives %d rotated dims of %d",
                        r->partial_rotary_factor, rot, head_dim);
    out->rot_dim = rot;
    out->scale = 1.0;
    out->inv_freq = malloc(sizeof(double) * (size_t)(rot / 2));
    if (!out->inv_freq) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    double *f = out->inv_freq;
    for (int i = 0; i < rot / 2; i++) f[i] = 1.0 / pow(r->theta, (double)(2 * i) / rot);
    switch (r->type) {
    case LOOM_ROPE_DEFAULT:
        break;
    case LOOM_ROPE_LINEAR:
        for (int i = 0; i < rot / 2; i++) f[i] /= r->factor;
        break;
    case LOOM_ROPE_PROPORTIONAL: {
        /* Only the first prf * head_dim / 2 angles turn (exponents over the
         * whole head); the rest stay put, yet pairs still span half a head. */
        int angles = (int)floor(r->partial_rotary_factor * head_dim / 2);
        for (int i = 0; i < rot / 2; i++)
            f[i] = i < angles ? 1.0 / pow(r->theta, (double)(2 * i) / head_dim) / r->factor : 0;
        break;
    }
    case LOOM_ROPE_LLAMA3: {
        double old = r->original_max_pos;
        double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
        for (int i = 0; i < rot / 2; i++) {
            double fi = f[i], wl = 2 * M_PI / fi;
            if (wl > low_wl) {
                fi /= r->factor;
            } else if (wl >= high_wl) {
                double s = (old / wl - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                fi = (1 - s) * fi / r->factor + s * fi;
            }
            f[i] = fi;
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
            f[i] = f[i] / r->factor * (1 - extra) + f[i] * extra;
        }
        out->scale = r->attention_factor > 0 ? r->attention_factor
                     : r->factor <= 1       ? 1.0
                                            : 0.1 * log(r->factor) + 1.0;
        break;
    }
    case LOOM_ROPE_DYNAMIC:
        return loom_err(LOOM_ERR_UNSUPPORTED, "rope type \"dynamic\" is not supported yet");
    }
    return setup_mrope(r, rot / 2, out);
}

/* A scale as the checkpoint's dtype holds it: transformers multiplies by
 * the normalizer cast to the weights' dtype (sqrt(3072) is 55.5 in bf16). */
static float round_to_dtype(double v, loom_dtype t) {
    float f = (float)v;
    if (t == LOOM_DT_BF16) {
        uint32_t u;
        memcpy(&u, &f, 4);
        u += 0x7fff + ((u >> 16) & 1);
        u &= 0xffff0000u;
        memcpy(&f, &u, 4);
    } else if (t == LOOM_DT_F16) {
        f = loom_f16_to_f32(loom_f32_to_f16(f));
    }
    return f;
}

static loom_status bind_mlp(loom_model *m, const char *prefix, int inter, loom_mlp *mlp) {
    int H = m->cfg.hidden_size;
    char n[320];
    loom_status s;
    snprintf(n, sizeof n, "%s.gate_proj.weight", prefix);
    if ((s = bind_weight(m, n, inter, H, &mlp->gate))) return s;
    snprintf(n, sizeof n, "%s.up_proj.weight", prefix);
    if ((s = bind_weight(m, n, inter, H, &mlp->up))) return s;
    snprintf(n, sizeof n, "%s.down_proj.weight", prefix);
    if ((s = bind_weight(m, n, H, inter, &mlp->down))) return s;
    m->max_inter = LOOM_MAX(m->max_inter, inter);
    return LOOM_OK;
}

static loom_status bind_moe(loom_model *m, int l, loom_moe *moe) {
    const loom_config *c = &m->cfg;
    int H = c->hidden_size, E = c->n_experts, I = c->moe_intermediate;
    char n[320], p[256];
    loom_status s;
    if (E <= 0 || c->n_experts_used <= 0 || I <= 0)
        return loom_err(LOOM_ERR_FORMAT, "MoE layer %d: needs num_experts, num_experts_per_tok "
                        "and moe_intermediate_size", l);
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    if ((s = bind_weight(m, n, E, H, &moe->router))) return s;
    moe->renorm = c->norm_topk_prob;
    moe->experts = calloc((size_t)E, sizeof *moe->experts);
    if (!moe->experts) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    /* Hub checkpoints keep one tensor per expert; transformers 5 saves them
     * fused as experts.gate_up_proj [E, 2I, H] and experts.down_proj. */
    char fused[256];
    snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.gate_up_proj", l);
    char stacked[256];
    snprintf(stacked, sizeof stacked, "model.layers.%d.mlp.switch_mlp.gate_proj.weight", l);
    if (find(m, stacked)) {
        /* MLX: switch_mlp.{gate,up,down}_proj stacked over experts */
        for (int e = 0; e < E; e++) {
            loom_mlp *x = &moe->experts[e];
            snprintf(p, sizeof p, "model.layers.%d.mlp.switch_mlp.gate_proj.weight", l);
            if ((s = bind_stacked(m, p, e, E, I, H, &x->gate))) return s;
            snprintf(p, sizeof p, "model.layers.%d.mlp.switch_mlp.up_proj.weight", l);
            if ((s = bind_stacked(m, p, e, E, I, H, &x->up))) return s;
            snprintf(p, sizeof p, "model.layers.%d.mlp.switch_mlp.down_proj.weight", l);
            if ((s = bind_stacked(m, p, e, E, H, I, &x->down))) return s;
        }
        m->max_inter = LOOM_MAX(m->max_inter, I);
    } else if (find(m, fused)) {
        char down[256];
        snprintf(down, sizeof down, "model.layers.%d.mlp.experts.down_proj", l);
        for (int e = 0; e < E; e++) {
            loom_mlp *x = &moe->experts[e];
            if ((s = bind_expert_slice(m, fused, e, E, 2 * I, 0, I, H, &x->gate))) return s;
            if ((s = bind_expert_slice(m, fused, e, E, 2 * I, I, I, H, &x->up))) return s;
            if ((s = bind_expert_slice(m, down, e, E, H, 0, H, I, &x->down))) return s;
        }
        m->max_inter = LOOM_MAX(m->max_inter, I);
    } else {
        for (int e = 0; e < E; e++) {
            snprintf(p, sizeof p, "model.layers.%d.mlp.experts.%d", l, e);
            if ((s = bind_mlp(m, p, I, &moe->experts[e]))) return s;
        }
    }
    if (c->shared_expert_intermediate > 0) {
        snprintf(p, sizeof p, "model.layers.%d.mlp.shared_expert", l);
        if ((s = bind_mlp(m, p, c->shared_expert_intermediate, &moe->shared))) return s;
        snprintf(n, sizeof n, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        if ((s = bind_weight(m, n, 1, H, &moe->shared_gate))) return s;
    }
    return LOOM_OK;
}

/* Gemma 4 MoE block: a router with its own input scaling and per-expert
 * scales, fused expert tensors, and three extra norms. */
static loom_status bind_gemma4_moe(loom_model *m, int l, loom_layer *L) {
    const loom_config *c = &m->cfg;
    int H = c->hidden_size, E = c->n_experts, I = c->moe_intermediate;
    loom_moe *moe = &L->moe;
    char n[256], down[256];
    loom_status s;
    if (E <= 0 || c->n_experts_used <= 0 || I <= 0)
        return loom_err(LOOM_ERR_FORMAT, "MoE layer %d: needs num_experts, top_k_experts and "
                        "moe_intermediate_size", l);
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
    if ((s = bind_weight(m, NAME("router.proj.weight"), E, H, &moe->router))) return s;
    if ((s = bind_vec(m, NAME("router.scale"), H, 0, &moe->in_scale))) return s;
    float rs = (float)(1.0 / sqrt((double)H));
    for (int i = 0; i < H; i++) ((float *)moe->in_scale)[i] *= rs;
    if ((s = bind_vec(m, NAME("router.per_expert_scale"), E, 0, &moe->expert_scale))) return s;
    if ((s = bind_norm(m, NAME("post_feedforward_layernorm_1.weight"), H, &L->post_ffn_norm1)))
        return s;
    if ((s = bind_norm(m, NAME("pre_feedforward_layernorm_2.weight"), H, &L->pre_moe_norm)))
        return s;
    if ((s = bind_norm(m, NAME("post_feedforward_layernorm_2.weight"), H, &L->post_moe_norm)))
        return s;
    moe->renorm = 1;
    moe->experts = calloc((size_t)E, sizeof *moe->experts);
    if (!moe->experts) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    snprintf(down, sizeof down, "model.layers.%d.experts.down_proj", l);
    NAME("experts.gate_up_proj");
    for (int e = 0; e < E; e++) {
        loom_mlp *x = &moe->experts[e];
        if ((s = bind_expert_slice(m, n, e, E, 2 * I, 0, I, H, &x->gate))) return s;
        if ((s = bind_expert_slice(m, n, e, E, 2 * I, I, I, H, &x->up))) return s;
        if ((s = bind_expert_slice(m, down, e, E, H, 0, H, I, &x->down))) return s;
    }
#undef NAME
    m->max_inter = LOOM_MAX(m->max_inter, I);
    L->moe_beside = 1;
    return LOOM_OK;
}

static loom_status bind_attn(loom_model *m, int l, loom_layer *L) {
    const loom_config *c = &m->cfg;
    unsigned fl = m->arch->flags;
    loom_attn *A = &L->attn;
    int H = c->hidden_size, hd = A->head_dim;
    int qd = c->n_heads * hd, kvd = A->n_kv_heads * hd;
    int qrows = qd * ((fl & LOOM_ARCH_ATTN_GATE) ? 2 : 1);
    char n[256];
    loom_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.self_attn.%s", l, suffix), n)
    if ((s = bind_weight(m, NAME("q_proj.weight"), qrows, H, &A->wq))) return s;
    if ((s = bind_weight(m, NAME("o_proj.weight"), H, qd, &A->wo))) return s;
    int shared = A->kv_layer != l;
    if (!shared) {
        if ((s = bind_weight(m, NAME("k_proj.weight"), kvd, H, &A->wk))) return s;
        if (!A->k_eq_v && (s = bind_weight(m, NAME("v_proj.weight"), kvd, H, &A->wv))) return s;
    }
    int bias = (fl & LOOM_ARCH_QKV_BIAS) || ((fl & LOOM_ARCH_CFG_BIAS) && c->attention_bias);
    if (bias) {
        if ((s = bind_vec(m, NAME("q_proj.bias"), qrows, 0, &A->bq))) return s;
        if (!shared) {
            if ((s = bind_vec(m, NAME("k_proj.bias"), kvd, 0, &A->bk))) return s;
            if (!A->k_eq_v && (s = bind_vec(m, NAME("v_proj.bias"), kvd, 0, &A->bv))) return s;
        }
    }
    if ((fl & LOOM_ARCH_CFG_BIAS) && c->attention_bias)
        if ((s = bind_vec(m, NAME("o_proj.bias"), H, 1, &A->bo))) return s;
    if (fl & LOOM_ARCH_QK_NORM) {
        if ((s = bind_norm(m, NAME("q_norm.weight"), hd, &A->q_norm))) return s;
        if (!shared && (s = bind_norm(m, NAME("k_norm.weight"), hd, &A->k_norm))) return s;
    }
#undef NAME
    m->max_q_dim = LOOM_MAX(m->max_q_dim, qrows);
    m->max_head_dim = LOOM_MAX(m->max_head_dim, hd);
    m->kv_dim = LOOM_MAX(m->kv_dim, kvd);
    return LOOM_OK;
}

static loom_status bind_linear(loom_model *m, int l, loom_linattn *A) {
    const loom_config *c = &m->cfg;
    int H = c->hidden_size, nk = c->lin_n_k_heads, nv = c->lin_n_v_heads;
    int dk = c->lin_k_head_dim, dv = c->lin_v_head_dim, K = c->lin_conv_kernel;
    int conv = 2 * nk * dk + nv * dv;
    char n[256];
    loom_status s;
    if (nk <= 0 || nv <= 0 || dk <= 0 || dv <= 0 || K <= 0 || nv % nk)
        return loom_err(LOOM_ERR_FORMAT, "linear attention layer %d: linear_num_key_heads %d, "
                        "linear_num_value_heads %d (a multiple), head dims %d/%d, conv kernel %d "
                        "must be positive", l, nk, nv, dk, dv, K);
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.linear_attn.%s", l, suffix), n)
    A->fused = (m->arch->flags & LOOM_ARCH_LINEAR_FUSED) != 0;
    if (A->fused) {
        if ((s = bind_weight(m, NAME("in_proj_qkvz.weight"), conv + nv * dv, H, &A->in_qkvz)))
            return s;
        if ((s = bind_weight(m, NAME("in_proj_ba.weight"), 2 * nv, H, &A->in_ba))) return s;
    } else {
        if ((s = bind_weight(m, NAME("in_proj_qkv.weight"), conv, H, &A->in_qkv))) return s;
        if ((s = bind_weight(m, NAME("in_proj_z.weight"), nv * dv, H, &A->in_z))) return s;
        if ((s = bind_weight(m, NAME("in_proj_b.weight"), nv, H, &A->in_b))) return s;
        if ((s = bind_weight(m, NAME("in_proj_a.weight"), nv, H, &A->in_a))) return s;
    }
    int cd[3] = {conv, 1, K};
    if ((s = bind_f32(m, NAME("conv1d.weight"), 3, cd, 0, 0, &A->conv))) return s;
    if ((s = bind_vec(m, NAME("A_log"), nv, 0, &A->neg_a))) return s;
    for (int i = 0; i < nv; i++) ((float *)A->neg_a)[i] = -expf(A->neg_a[i]);
    if ((s = bind_vec(m, NAME("dt_bias"), nv, 0, &A->dt_bias))) return s;
    if ((s = bind_vec(m, NAME("norm.weight"), dv, 0, &A->norm))) return s;
    if ((s = bind_weight(m, NAME("out_proj.weight"), H, nv * dv, &A->out))) return s;
#undef NAME
    A->slot = m->n_linear++;
    m->lin_conv_dim = conv;
    m->lin_proj_dim = conv + nv * dv + 2 * nv;
    return LOOM_OK;
}

/* Which layers read another layer's KV (gemma4 num_kv_shared_layers): the
 * last earlier layer of the same kind that computes its own. */
static int kv_source(const loom_config *c, const loom_layer *layers, int l) {
    int first = c->n_layers - c->n_kv_shared_layers;
    if (c->n_kv_shared_layers <= 0 || l < first) return l;
    for (int j = first - 1; j >= 0; j--)
        if (layers[j].kind == layers[l].kind) return j;
    return -1;
}

static loom_status bind_layer(loom_model *m, int l) {
    const loom_config *c = &m->cfg;
    unsigned fl = m->arch->flags;
    loom_layer *L = &m->layers[l];
    int H = c->hidden_size;
    char n[256];
    loom_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
    if ((s = bind_norm(m, NAME("input_layernorm.weight"), H, &L->attn_norm))) return s;
    if (fl & LOOM_ARCH_SANDWICH) {
        if ((s = bind_norm(m, NAME("post_attention_layernorm.weight"), H, &L->post_attn_norm)))
            return s;
        if ((s = bind_norm(m, NAME("pre_feedforward_layernorm.weight"), H, &L->ffn_norm)))
            return s;
        if ((s = bind_norm(m, NAME("post_feedforward_layernorm.weight"), H, &L->post_ffn_norm)))
            return s;
    } else {
        if ((s = bind_norm(m, NAME("post_attention_layernorm.weight"), H, &L->ffn_norm))) return s;
    }
    if (L->kind == LOOM_LAYER_LINEAR) {
        if ((s = bind_linear(m, l, &L->lin))) return s;
    } else {
        if ((s = bind_attn(m, l, L))) return s;
    }
    L->is_moe = (fl & LOOM_ARCH_MOE) && c->n_experts > 0 && !c->mlp_only[l] &&
                (l + 1) % c->decoder_sparse_step == 0;
    if (L->is_moe) {
        if ((s = bind_moe(m, l, &L->moe))) return s;
    } else {
        int inter = c->intermediate_size;
        int first_shared = c->n_layers - c->n_kv_shared_layers;
        if (c->double_wide_mlp && c->n_kv_shared_layers > 0 && l >= first_shared && first_shared > 0)
            inter *= 2;
        if ((s = bind_mlp(m, NAME("mlp"), inter, &L->mlp))) return s;
        if (c->enable_moe_block && (s = bind_gemma4_moe(m, l, L))) return s;
    }
    L->out_scale = 1.0f;
    if (m->has_ple) {
        int P = c->per_layer_input_dim;
        if ((s = bind_weight(m, NAME("per_layer_input_gate.weight"), P, H, &L->ple_gate))) return s;
        if ((s = bind_weight(m, NAME("per_layer_projection.weight"), H, P, &L->ple_proj))) return s;
        if ((s = bind_norm(m, NAME("post_per_layer_input_norm.weight"), H, &L->ple_norm))) return s;
    }
    if (fl & LOOM_ARCH_LAYER_SCALAR) {
        const float *v;
        if ((s = bind_vec(m, NAME("layer_scalar"), 1, 1, &v))) return s;
        if (v) L->out_scale = v[0];
    }
#undef NAME
    return LOOM_OK;
}

/* Layer kinds, head sizes, windows and ropes, before any tensor is read. */
static loom_status plan_layers(loom_model *m) {
    const loom_config *c = &m->cfg;
    unsigned fl = m->arch->flags;
    int n_sliding = 0;
    for (int l = 0; l < c->n_layers; l++) {
        loom_layer *L = &m->layers[l];
        loom_layer_type k = LOOM_LAYER_FULL;
        if (c->has_layer_types) k = c->layer_types[l];
        else if (fl & LOOM_ARCH_ALT_SLIDING) k = l % 2 == 0 ? LOOM_LAYER_SLIDING : LOOM_LAYER_FULL;
        else if ((fl & LOOM_ARCH_PATTERN_SLIDING) && c->sliding_pattern > 0)
            k = (l + 1) % c->sliding_pattern ? LOOM_LAYER_SLIDING : LOOM_LAYER_FULL;
        if ((fl & LOOM_ARCH_SLIDING) && k == LOOM_LAYER_FULL && c->sliding_window > 0)
            k = LOOM_LAYER_SLIDING;
        if (k == LOOM_LAYER_SLIDING && c->sliding_window <= 0) k = LOOM_LAYER_FULL;
        if (k == LOOM_LAYER_LINEAR && !(fl & LOOM_ARCH_LINEAR))
            return loom_err(LOOM_ERR_UNSUPPORTED, "%s: layer %d is linear_attention, which this "
                            "architecture does not have", c->arch, l);
        L->kind = k;
        if (k == LOOM_LAYER_LINEAR) continue;
        loom_attn *A = &L->attn;
        A->head_dim = k == LOOM_LAYER_FULL && c->global_head_dim > 0 ? c->global_head_dim
                                                                       : c->head_dim;
        A->k_eq_v = c->attention_k_eq_v && k == LOOM_LAYER_FULL;
        A->n_kv_heads = A->k_eq_v ? c->n_global_kv_heads : c->n_kv_heads;
        if (A->n_kv_heads <= 0 || c->n_heads % A->n_kv_heads)
            return loom_err(LOOM_ERR_FORMAT, "layer %d: %d attention heads over %d kv heads", l,
                            c->n_heads, A->n_kv_heads);
        A->window = k == LOOM_LAYER_SLIDING ? c->sliding_window : 0;
        A->rope = k == LOOM_LAYER_SLIDING ? 1 : 0;
        n_sliding += k == LOOM_LAYER_SLIDING;
        double qpas = c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : A->head_dim;
        A->scale = (fl & LOOM_ARCH_UNIT_SCALE) ? 1.0f
                   : (fl & LOOM_ARCH_QPAS)    ? (float)(1.0 / sqrt(qpas))
                                              : (float)(1.0 / sqrt((double)A->head_dim));
    }
    for (int l = 0; l < c->n_layers; l++) {
        loom_layer *L = &m->layers[l];
        if (L->kind == LOOM_LAYER_LINEAR) continue;
        L->attn.kv_layer = kv_source(c, m->layers, l);
        if (L->attn.kv_layer < 0 ||
            m->layers[L->attn.kv_layer].attn.head_dim != L->attn.head_dim ||
            m->layers[L->attn.kv_layer].attn.n_kv_heads != L->attn.n_kv_heads)
            return loom_err(LOOM_ERR_FORMAT, "layer %d shares KV but no earlier %s layer computes it",
                            l, L->kind == LOOM_LAYER_SLIDING ? "sliding" : "full");
    }
    /* Rope 0 serves full layers, rope 1 sliding ones (their own base when
     * the config gives one, and their own head size). */
    int full_hd = c->global_head_dim > 0 ? c->global_head_dim : c->head_dim;
    loom_status s = setup_rope(c, &c->rope, full_hd, &m->ropes[0]);
    if (s != LOOM_OK) return s;
    m->n_ropes = 1;
    if (n_sliding) {
        const loom_rope_config *r = c->has_rope_local ? &c->rope_local : &c->rope;
        if ((s = setup_rope(c, r, c->head_dim, &m->ropes[1]))) return s;
        m->n_ropes = 2;
    }
    return LOOM_OK;
}

/* Config fields that change the math in ways loom does not implement. */
static loom_status check_supported(const loom_model *m) {
    const loom_config *c = &m->cfg;
    if (c->per_layer_config)
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: per_layer_config is not supported", c->arch);
    if (c->bidirectional)
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: use_bidirectional_attention is not supported",
                        c->arch);
    unsigned fl = m->arch->flags;
    if (c->enable_moe_block && !(fl & LOOM_ARCH_MOE_BESIDE))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: enable_moe_block is not supported", c->arch);
    if (c->n_experts > 0 && !(fl & LOOM_ARCH_MOE) && !(c->enable_moe_block && (fl & LOOM_ARCH_MOE_BESIDE)))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: num_experts %d, but this architecture has no "
                        "MoE support", c->arch, c->n_experts);
    if (c->per_layer_input_dim > 0 && !(m->arch->flags & LOOM_ARCH_PLE))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: hidden_size_per_layer_input is not supported",
                        c->arch);
    if (c->mlp_bias)
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: mlp_bias is not supported", c->arch);
    if (c->attention_bias && !(fl & (LOOM_ARCH_QKV_BIAS | LOOM_ARCH_CFG_BIAS)))
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: attention_bias is not supported for this "
                        "architecture", c->arch);
    return LOOM_OK;
}

/* Floats the arena must hold: every small float tensor, padded. */
static size_t arena_need(const loom_safetensors *st) {
    size_t n = 64;
    for (int i = 0; i < loom_st_count(st); i++) {
        const loom_st_tensor *t = loom_st_at(st, i);
        size_t e = 1;
        for (int d = 0; d < t->ndim; d++) e *= (size_t)t->shape[d];
        if (t->ndim <= 1 || (t->ndim == 3 && t->shape[1] == 1)) n += (e + 15) & ~(size_t)15;
    }
    return n;
}

/* Floats every FP8 scale tensor holds, converted to f32 at bind time. */
static size_t f8_scale_need(const loom_safetensors *st) {
    size_t n = 0;
    for (int i = 0; i < loom_st_count(st); i++) {
        const loom_st_tensor *t = loom_st_at(st, i);
        if (!is_scale_name(t->name)) continue;
        size_t e = 1;
        for (int d = 0; d < t->ndim; d++) e *= (size_t)t->shape[d];
        n += e;
    }
    return n;
}

/* config.json's vocab_size and hidden_size against the embedding's shape,
 * before anything sizes buffers by them: a wrong vocab_size otherwise shows
 * only as a shape mismatch, or not at all where nothing binds by it. */
static loom_status check_embedding(const loom_model *m) {
    const loom_st_tensor *t = find(m, "model.embed_tokens.weight");
    if (!t || t->ndim != 2) return LOOM_OK;  /* bind_weight says what it expected */
    const loom_config *c = &m->cfg;
    if (t->shape[0] != c->vocab_size)
        return loom_err(LOOM_ERR_FORMAT, "config.json: vocab_size %d %s the embedding's %lld "
                        "rows (tensor %s)", c->vocab_size,
                        c->vocab_size > t->shape[0] ? "is larger than" : "is smaller than",
                        (long long)t->shape[0], t->name);
    if (is_float(t->dtype) && t->shape[1] != c->hidden_size)
        return loom_err(LOOM_ERR_FORMAT, "config.json: hidden_size %d differs from the embedding's "
                        "%lld columns (tensor %s)", c->hidden_size, (long long)t->shape[1], t->name);
    return LOOM_OK;
}

static loom_status load(loom_model *m, const char *dir, const loom_model_params *p) {
    loom_status s;
    if ((s = loom_config_load(dir, &m->cfg))) return s;
    const loom_config *c = &m->cfg;
    m->arch = loom_arch_find(c->arch);
    if (!m->arch) return unsupported_arch(c->arch);
    if (!strcmp(c->hidden_act, "silu")) m->act = LOOM_ACT_SILU;
    else if (!strcmp(c->hidden_act, "gelu_pytorch_tanh") || !strcmp(c->hidden_act, "gelu_new"))
        m->act = LOOM_ACT_GELU_TANH;
    else
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (expected "
                        "silu, gelu_pytorch_tanh or gelu_new)", c->arch, c->hidden_act);
    if ((s = check_supported(m))) return s;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    if ((s = plan_layers(m))) return s;
    if ((s = loom_st_open_dir(dir, &m->st))) return s;

    /* Multimodal checkpoints (text only here): transformers 5 saves the language model as
     * model.language_model.*, older ones as language_model.model.* with
     * language_model.lm_head. */
    if (loom_st_find(m->st, "model.language_model.embed_tokens.weight")) {
        snprintf(m->prefix, sizeof m->prefix, "model.language_model.");
    } else if (loom_st_find(m->st, "language_model.model.embed_tokens.weight")) {
        snprintf(m->prefix, sizeof m->prefix, "language_model.model.");
        snprintf(m->head_prefix, sizeof m->head_prefix, "language_model.");
    }
    if ((s = check_embedding(m))) return s;
    int H = c->hidden_size;
    m->arena_cap = arena_need(m->st);
    m->arena = loom_alloc(m->arena_cap * sizeof(float));
    if (!m->arena) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    m->f8_cap = f8_scale_need(m->st);
    if (m->f8_cap && !(m->f8_scales = loom_alloc(m->f8_cap * sizeof(float))))
        return loom_err(LOOM_ERR_NOMEM, "out of memory for %zu FP8 scales", m->f8_cap);

    if ((s = bind_weight(m, "model.embed_tokens.weight", c->vocab_size, H, &m->embed))) return s;
    m->embed_scale = 1.0f;
    if (m->arch->flags & LOOM_ARCH_EMBED_SCALE)
        m->embed_scale = round_to_dtype(sqrt((double)H), m->embed.dtype);
    if ((s = bind_norm(m, "model.norm.weight", H, &m->final_norm))) return s;
    /* Tied checkpoints omit lm_head.weight; some tied ones still carry it. */
    if (find(m, "lm_head.weight") || !c->tie_embeddings) {
        if ((s = bind_weight(m, "lm_head.weight", c->vocab_size, H, &m->lm_head))) return s;
    } else {
        m->lm_head = m->embed;
    }
    if ((m->arch->flags & LOOM_ARCH_PLE) && c->per_layer_input_dim > 0) {
        int P = c->per_layer_input_dim, LP = c->n_layers * P;
        m->has_ple = 1;
        if (c->vocab_per_layer != c->vocab_size)
            return loom_err(LOOM_ERR_UNSUPPORTED, "vocab_size_per_layer_input %d differs from "
                            "vocab_size %d", c->vocab_per_layer, c->vocab_size);
        if ((s = bind_weight(m, "model.embed_tokens_per_layer.weight", c->vocab_per_layer, LP,
                             &m->ple_embed)))
            return s;
        m->ple_embed_scale = round_to_dtype(sqrt((double)P), m->ple_embed.dtype);
        if ((s = bind_weight(m, "model.per_layer_model_projection.weight", LP, H,
                             &m->ple_model_proj)))
            return s;
        if ((s = bind_norm(m, "model.per_layer_projection_norm.weight", P, &m->ple_proj_norm)))
            return s;
    }
    for (int l = 0; l < c->n_layers; l++)
        if ((s = bind_layer(m, l))) return s;
    if (m->kv_dim == 0) m->kv_dim = c->n_kv_heads * c->head_dim;  /* no attention layer */
    m->k = p->fast_matmul ? loom_kernels_get_fast() : loom_kernels_get();
    if (p->quantize_bits && (p->quantize_bits != 4 && p->quantize_bits != 8))
        return loom_err(LOOM_ERR_INVALID_ARG, "quantize_bits: expected 0, 4 or 8, found %d", p->quantize_bits);
    if (p->quantize_bits && (m->device >= 0 || p->no_copy))
        return loom_err(LOOM_ERR_UNSUPPORTED, "quantize_bits: quantizing at load is for the CPU, "
                        "with the weights copied (found %s)", m->device >= 0 ? "a CUDA device" : "no_copy");
    m->quant_bits = p->quantize_bits;
    if (m->device < 0 && !p->no_copy && (s = interleave_all(m))) return s;
    return loom_pool_create(p->n_threads, &m->pool);
}

/* The CPU re-layout: one pass sizes it (il == NULL), a second writes every
 * matrix into one buffer on 2 MiB pages. Decode streams every weight once
 * a token; from the file's 4 KiB pages it pays a TLB miss per page and the
 * hardware prefetchers stop at each page boundary (bf16 decode, Qwen3-0.6B
 * shapes, 2 threads: about 5% slower). */
typedef struct {
    loom_model *m;
    uint8_t *il;
    size_t used;
    loom_status s;   /* the first failure of a quantized copy */
} il_pass;

#define IL_ALIGN(n) (((n) + 63) & ~(size_t)63)

/* Copies n bytes from *src to the buffer, points *src at the copy and
 * drops the file's pages. The sizing pass only counts. */
static void il_copy(il_pass *ps, const void **src, size_t n) {
    if (ps->il) {
        uint8_t *dst = ps->il + ps->used;
        memcpy(dst, *src, n);
        loom_st_release(*src, n);
        *src = dst;
    }
    ps->used += IL_ALIGN(n);
}

/* One matrix into the buffer: a quantized one in the kernels' 16-row
 * layout when the table has one and the shape fits it, else as it is. A
 * tied embedding follows a plain copy; the 16-row layout cannot serve its
 * row gathers, so there it keeps the file's pages. */
static void interleave(il_pass *ps, loom_weight *w);

/* w (dense) replaced by its quant_bits copy (model/wquant.h) in the
 * buffer, in the kernels' layout, or in the plain one (il16 0) that row
 * gathers read; the file's pages are dropped unless keep. */
static void quantize(il_pass *ps, loom_weight *w, int il16, int keep) {
    size_t n = loom_wq_bytes(w, ps->m->quant_bits, il16);
    if (ps->il && !ps->s) {
        loom_weight q;
        ps->s = loom_wq_copy(ps->m, w, ps->m->quant_bits, il16, ps->il + ps->used, &q);
        if (!ps->s && !keep) loom_st_release(w->data, (size_t)w->rows * w->cols * loom_dtype_size(w->dtype));
        if (!ps->s) *w = q;
    }
    ps->used += IL_ALIGN(n);
}

/* quant_bits: the embeddings and the head as `loom convert` leaves them,
 * both quantized (a tied head then reads the embeddings' copy, in the
 * kernels' layout when it has one). */
static void quantize_embed_head(il_pass *ps) {
    loom_model *m = ps->m;
    loom_weight *e = &m->embed, *h = &m->lm_head;
    int tied = h->data == e->data, il = m->k->q_il16;
    if (!loom_wq_bytes(e, m->quant_bits, 0)) {
        interleave(ps, h);
        return;
    }
    loom_qmat shape = {.n = e->cols, .bits = m->quant_bits, .group = LOOM_WQ_GROUP};
    if (!tied) {
        quantize(ps, e, 0, 0);
        if (loom_wq_bytes(h, m->quant_bits, il)) quantize(ps, h, il, 0);
        else interleave(ps, h);
    } else if (il && loom_q_il16_ok(&shape, e->rows)) {
        quantize(ps, e, 0, 0);
        size_t n = loom_q_il16_bytes(&shape, e->rows);
        if (ps->il && !ps->s) {
            loom_qmat q;
            ps->s = loom_q_interleave_into(&e->q, e->rows, &q, ps->il + ps->used);
            *h = (loom_weight){.dtype = LOOM_DT_U32, .rows = e->rows, .cols = e->cols, .data = q.w, .q = q};
        }
        ps->used += IL_ALIGN(n);
    } else {
        quantize(ps, e, 0, 0);
        if (ps->il) *h = *e;
    }
}

static void interleave(il_pass *ps, loom_weight *w) {
    loom_weight *e = &ps->m->embed;
    if (ps->m->quant_bits && w != &ps->m->lm_head && loom_wq_bytes(w, ps->m->quant_bits, 1)) {
        quantize(ps, w, ps->m->k->q_il16, 0);
        return;
    }
    if (w->dtype == LOOM_DT_F32 || w->dtype == LOOM_DT_F16 || w->dtype == LOOM_DT_BF16 ||
        w->dtype == LOOM_DT_F8_E4M3) {
        if (!w->data) return;
        int tied = e->data == w->data;
        il_copy(ps, &w->data, (size_t)w->rows * w->cols * loom_dtype_size(w->dtype));
        if (w->dtype == LOOM_DT_F8_E4M3) w->f8.w = w->data;
        if (tied) e->data = w->data, e->f8.w = w->f8.w;
        return;
    }
    if (w->dtype != LOOM_DT_U32 || !w->q.w) return;
    int tied = e->dtype == LOOM_DT_U32 && e->q.w == w->q.w;
    size_t wb = (size_t)w->rows * w->cols * w->q.bits / 8;
    if (!ps->m->k->q_il16 || !loom_q_il16_ok(&w->q, w->rows)) {
        size_t sb = (size_t)w->rows * (w->cols / w->q.group) * 2;
        const void *p = w->q.w, *sc = w->q.scales, *bi = w->q.biases;
        il_copy(ps, &p, wb);
        il_copy(ps, &sc, sb);
        il_copy(ps, &bi, sb);
        w->q.w = p;
        w->q.scales = sc;
        w->q.biases = bi;
        w->data = p;
        if (tied) e->q = w->q, e->data = w->data;
        return;
    }
    size_t n = loom_q_il16_bytes(&w->q, w->rows);
    if (ps->il) {
        loom_qmat q;
        loom_q_interleave_into(&w->q, w->rows, &q, ps->il + ps->used);
        if (!tied) loom_st_release(w->q.w, wb);
        w->q = q;
        w->data = q.w;
    }
    ps->used += IL_ALIGN(n);
}

static void interleave_mlp(il_pass *ps, loom_mlp *p) {
    interleave(ps, &p->gate);
    interleave(ps, &p->up);
    interleave(ps, &p->down);
}

/* Every matrix the forward multiplies by (not the embeddings it gathers). */
static void interleave_pass(il_pass *ps) {
    loom_model *m = ps->m;
    if (m->quant_bits) quantize_embed_head(ps);
    else interleave(ps, &m->lm_head);
    interleave(ps, &m->ple_model_proj);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        loom_layer *L = &m->layers[l];
        loom_weight *ws[] = {&L->attn.wq, &L->attn.wk, &L->attn.wv, &L->attn.wo,
                             &L->lin.in_qkv, &L->lin.in_z, &L->lin.in_b, &L->lin.in_a,
                             &L->lin.in_qkvz, &L->lin.in_ba, &L->lin.out, &L->moe.router,
                             &L->moe.shared_gate, &L->ple_gate, &L->ple_proj};
        for (size_t i = 0; i < LOOM_ARRAY_LEN(ws); i++) interleave(ps, ws[i]);
        interleave_mlp(ps, &L->mlp);
        interleave_mlp(ps, &L->moe.shared);
        if (L->moe.experts)
            for (int e = 0; e < m->cfg.n_experts; e++) interleave_mlp(ps, &L->moe.experts[e]);
    }
}

/* Without room for the copy the weights stay in the file mapping (the
 * kernels read either): slower, but a model larger than the free memory
 * still loads, as the page cache can evict clean file pages. */
static loom_status interleave_all(loom_model *m) {
    il_pass ps = {.m = m};
    interleave_pass(&ps);
    if (!ps.used) return LOOM_OK;
    size_t avail = loom_mem_available();
    /* every byte a kernel reads is written below; the padding is not read */
    if ((avail && ps.used > avail / 10 * 9) || !(m->il_mem = loom_alloc_raw(ps.used))) {
        if (m->quant_bits)
            return loom_err(LOOM_ERR_NOMEM, "quantize_bits %d: no room for the %zu-byte quantized "
                            "copy (%zu bytes available)", m->quant_bits, ps.used, avail);
        loom_log(LOOM_LOG_WARN, "no room for a %zu-byte copy of the weights on 2 MiB pages "
                 "(%zu bytes available); reading them from the file mapping", ps.used, avail);
        return LOOM_OK;
    }
    ps = (il_pass){.m = m, .il = m->il_mem};
    interleave_pass(&ps);
    return ps.s;
}

loom_status loom_draft_model_load(const char *dir, int exact, loom_model **out) {
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    /* 8-bit only where the fast table multiplies it in integers */
    if (!exact && loom_kernels_get_fast()->matmul_q != loom_kernels_get()->matmul_q) {
        mp.quantize_bits = 8;
        mp.fast_matmul = 1;
    }
    return loom_model_load(dir, &mp, out);
}

loom_model_params loom_model_default_params(void) {
    return (loom_model_params){.n_threads = 0, .device = -1};
}

static loom_status load_dflash(loom_model *m, const char *dir) {
    if (m->device >= 0)
        return loom_err(LOOM_ERR_UNSUPPORTED, "DFlashDraftModel: expected the CPU, found cuda:%d", m->device);
    loom_status s = loom_dflash_load(dir, &m->dflash);
    if (s) return s;
    snprintf(m->cfg.arch, sizeof m->cfg.arch, "DFlashDraftModel");
    m->cfg.vocab_size = m->dflash->vocab;
    return LOOM_OK;
}

loom_status loom_model_load(const char *dir, const loom_model_params *params,
                            loom_model **out) {
    *out = NULL;
    loom_model_params p = params ? *params : loom_model_default_params();
    loom_model *m = calloc(1, sizeof *m);
    if (!m) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    m->device = p.device < 0 ? -1 : p.device;
    if (p.tensor_parallel < 0 || p.tensor_parallel > 8 || (p.tensor_parallel && m->device < 0)) {
        int cpu = m->device < 0;
        free(m);
        return loom_err(LOOM_ERR_INVALID_ARG, "tensor parallel over %d ranks%s (expected 1 to 8, "
                        "on a CUDA device)", p.tensor_parallel, cpu ? " on the CPU" : "");
    }
    m->tp_n = p.tensor_parallel;
    for (int r = 0; r < m->tp_n; r++) m->tp_devices[r] = p.tp_devices ? p.tp_devices[r] : m->device + r;
    if (m->tp_n && p.tp_devices) m->device = p.tp_devices[0];
    loom_status s = loom_dflash_is(dir) ? load_dflash(m, dir) : load(m, dir, &p);
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
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) free(m->layers[l].moe.experts);
    free(m->layers);
    loom_free(m->arena);
    loom_free(m->f8_scales);
    for (int i = 0; i < LOOM_MAX_ROPES; i++) {
        free(m->ropes[i].inv_freq);
        free(m->ropes[i].stream);
    }
    loom_free(m->il_mem);
    loom_dflash_free(m->dflash);
    free(m);
}

int loom_model_vocab_size(const loom_model *m) { return m->cfg.vocab_size; }
int loom_model_max_positions(const loom_model *m) { return m->cfg.max_positions; }
int loom_model_hidden_size(const loom_model *m) { return m->cfg.hidden_size; }
loom_pooling loom_model_pooling(const loom_model *m) {
    return m->cfg.pooling ? (loom_pooling)m->cfg.pooling : LOOM_POOLING_LAST;
}
const char *loom_model_arch(const loom_model *m) { return m->cfg.arch; }

int loom_model_eos_ids(const loom_model *m, int32_t *out, int cap) {
    for (int i = 0; i < m->cfg.n_eos && i < cap; i++) out[i] = m->cfg.eos_ids[i];
    return m->cfg.n_eos;
}

unsigned loom_model_sampling_defaults(const loom_model *m, loom_sampling *out) {
    *out = m->cfg.gen_sampling;
    return m->cfg.gen_sampling_set;
}

void loom_model_warm(loom_model *m, void (*progress)(void *ctx, double done), void *ctx) {
    /* Copied weights are resident already; reading the mapping would only
     * bring the file's dropped pages back. */
    if (m->il_mem) return;
    loom_st_warm(m->st, progress, ctx);
}
