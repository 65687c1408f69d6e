/* gen_model: writes a random-weight model directory with the exact shapes of
 * a real checkpoint, for benchmarks that need a model of realistic size but
 * not its trained weights.
 *
 *   gen_model --preset qwen3-0.6b|llama3-8b|gemma2|gemma3|gemma4|qwen3moe|qwen3.5|qwen3next|tiny
 *             --dtype bf16
 *             --seed 1 --out DIR [--format safetensors|gguf]
 *             [--layers N --hidden N --heads N --kv-heads N --head-dim N
 *              --intermediate N --vocab N --max-pos N --experts N --experts-used N
 *              --moe-intermediate N --shared-intermediate N --untied]
 *   (--experts on gemma4: its MoE block beside every MLP)
 *   gen_model --check FILE.gguf --against DIR
 *
 * --format safetensors (the default) writes a Hugging Face directory:
 * config.json as transformers writes it for the architecture, and
 * model.safetensors with every tensor under its Hugging Face name.
 * --format gguf writes DIR/model.gguf (GGUF v3, llama.cpp's "qwen3"
 * architecture) with the same values: matrices in the --dtype (bf16, f16,
 * f32, or q8_0 / q4_0 quantized from the bf16 values), 1-D norm weights in
 * f32 holding the values rounded to the float dtype (bf16 for q8_0/q4_0), as
 * llama.cpp's converter stores them. The vocabulary is a dummy one
 * (tokenizer.ggml.model "none" with qwen3.vocab_size entries): enough for
 * llama-bench, which feeds random token ids.
 * --check reads every tensor of a GGUF file back and compares it with the
 * same tensor of the safetensors model in DIR: names, shapes (reversed, as
 * GGUF lists ne0 first), and every element: equal for float types, within
 * the quantization step for q8_0/q4_0. Exit status 1 on any mismatch.
 *
 * Design
 * - A blueprint (gm_shape) comes from a preset, with per-field overrides.
 * - gm_tensors() turns the blueprint into the list of tensors (name, shape,
 *   how to initialise).
 * - Values are a pure function of (seed, tensor name, element index):
 *   gm_fill() can produce any slice of any tensor on its own. A writer for
 *   another file format (GGUF, for llama.cpp) walks the same list, calls
 *   gm_fill(), and gets the same numbers; only its layout and the dtype
 *   conversion differ. Writers live in the `writers` table.
 * - Writers stream: one chunk of GM_CHUNK elements is held at a time, so a
 *   1.2 GB model is written with a few MB of memory.
 *
 * Scales: matrices ~ N(0, 0.02) (the transformers initializer_range), norm
 * weights ~ 1 + N(0, 0.02). With RMSNorm before every projection the
 * activations stay O(1) through any number of layers. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"

#define GM_CHUNK ((size_t)1 << 20) /* elements generated per step */
#define GM_MATRIX_STD 0.02f
#define GM_NORM_STD 0.02f

/* ---- blueprint ---------------------------------------------------------- */

typedef struct gm_shape {
    const char *preset;
    const char *arch;          /* "Qwen3ForCausalLM" */
    const char *model_type;    /* "qwen3" */
    int vocab, hidden, layers, heads, kv_heads, head_dim, inter, max_pos;
    int experts, experts_used, moe_inter; /* routed experts (qwen3_moe), 0 = dense */
    int shared_inter;          /* the gated shared expert's width, 0 = none */
    /* hybrids (Qwen3.5, Qwen3-Next): Gated DeltaNet layers, every attn_every-th
     * layer full (gated) attention with partial rotary */
    int lin_nk, lin_nv, lin_dk, lin_dv, lin_kernel, attn_every;
    /* Gemma 4: per-layer inputs of ple_dim, full layers (every third) of
     * global_head_dim, the last kv_shared layers reading earlier layers' KV */
    int ple_dim, global_head_dim, kv_shared;
    double rope_theta, rms_eps;
    int tie;                   /* tie_word_embeddings */
    int bos_id, eos_id;
} gm_shape;

static const gm_shape presets[] = {
    /* Same shapes and config as Qwen/Qwen3-0.6B. */
    {.preset = "qwen3-0.6b", .arch = "Qwen3ForCausalLM", .model_type = "qwen3",
     .vocab = 151936, .hidden = 1024, .layers = 28, .heads = 16, .kv_heads = 8,
     .head_dim = 128, .inter = 3072, .max_pos = 40960, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 151643, .eos_id = 151645},
    /* Same shapes and config as meta-llama/Meta-Llama-3-8B (no q/k norms,
     * untied head). GGUF output is Qwen3-only. */
    {.preset = "llama3-8b", .arch = "LlamaForCausalLM", .model_type = "llama",
     .vocab = 128256, .hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8,
     .head_dim = 128, .inter = 14336, .max_pos = 8192, .rope_theta = 500000.0,
     .rms_eps = 1e-5, .tie = 0, .bos_id = 128000, .eos_id = 128001},
    /* Gemma 2 and Gemma 3 (text) layouts at small sizes, with the configs'
     * features (sandwich norms, softcaps, alternating or patterned sliding
     * layers of a 16-token window, GELU-tanh): for the GPU forward tests. */
    {.preset = "gemma2", .arch = "Gemma2ForCausalLM", .model_type = "gemma2",
     .vocab = 512, .hidden = 256, .layers = 4, .heads = 4, .kv_heads = 2,
     .head_dim = 256, .inter = 512, .max_pos = 8192, .rope_theta = 10000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 2, .eos_id = 1},
    {.preset = "gemma3", .arch = "Gemma3ForCausalLM", .model_type = "gemma3_text",
     .vocab = 512, .hidden = 256, .layers = 6, .heads = 4, .kv_heads = 2,
     .head_dim = 256, .inter = 512, .max_pos = 8192, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 2, .eos_id = 1},
    /* Gemma 4 (text, dense) at a small hidden size with the E2B's heads:
     * one KV head, sliding heads of 256 and full ones of 512, per-layer
     * inputs of 256, the last two layers sharing KV, layer scalars. */
    {.preset = "gemma4", .arch = "Gemma4ForCausalLM", .model_type = "gemma4_text",
     .vocab = 512, .hidden = 256, .layers = 6, .heads = 4, .kv_heads = 1,
     .head_dim = 256, .inter = 512, .max_pos = 8192, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 2, .eos_id = 1, .ple_dim = 256,
     .global_head_dim = 512, .kv_shared = 2},
    /* Qwen3-MoE's layout (every layer routed, top-k renormalised) at a
     * small hidden size with a realistic expert count, top-k and expert
     * width: for the GPU forward tests. */
    {.preset = "qwen3moe", .arch = "Qwen3MoeForCausalLM", .model_type = "qwen3_moe",
     .vocab = 512, .hidden = 512, .layers = 2, .heads = 8, .kv_heads = 4,
     .head_dim = 64, .inter = 1024, .max_pos = 4096, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 0, .bos_id = 1, .eos_id = 2, .experts = 64, .experts_used = 8,
     .moe_inter = 256},
    /* Qwen3.5's and Qwen3-Next's hybrid layouts at a small hidden size
     * with the real linear-attention heads (16 key heads, 32 value heads of
     * 128) and full-attention heads of 256 every fourth layer: for the GPU
     * forward tests. */
    {.preset = "qwen3.5", .arch = "Qwen3_5ForCausalLM", .model_type = "qwen3_5_text",
     .vocab = 512, .hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2,
     .head_dim = 256, .inter = 1024, .max_pos = 4096, .rope_theta = 10000000.0,
     .rms_eps = 1e-6, .tie = 0, .bos_id = 1, .eos_id = 2, .lin_nk = 16, .lin_nv = 32,
     .lin_dk = 128, .lin_dv = 128, .lin_kernel = 4, .attn_every = 4},
    {.preset = "qwen3next", .arch = "Qwen3NextForCausalLM", .model_type = "qwen3_next",
     .vocab = 512, .hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2,
     .head_dim = 256, .inter = 1024, .max_pos = 4096, .rope_theta = 10000000.0,
     .rms_eps = 1e-6, .tie = 0, .bos_id = 1, .eos_id = 2, .experts = 16, .experts_used = 4,
     .moe_inter = 256, .shared_inter = 512, .lin_nk = 16, .lin_nv = 32, .lin_dk = 128,
     .lin_dv = 128, .lin_kernel = 4, .attn_every = 4},
    /* A few MB: for quick checks of the tool and the benchmark. */
    {.preset = "tiny", .arch = "Qwen3ForCausalLM", .model_type = "qwen3",
     .vocab = 512, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2,
     .head_dim = 16, .inter = 128, .max_pos = 2048, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 1, .eos_id = 2},
};

/* ---- tensor list -------------------------------------------------------- */

/* GM_INIT_NORM0: norm weights stored as w - 1 (gemma, the hybrids), so
 * ~ N(0, 0.02); GM_INIT_WIDE ~ N(0, 0.5) (the hybrids' conv and decay);
 * GM_INIT_QK: Gemma 4's q/k norms, whose attention has no 1/sqrt(head_dim):
 * at 1 its scores of unit-RMS heads have variance head_dim, a softmax near
 * one-hot that bf16 rounding flips, unlike trained weights; head_dim^-1/4
 * on each side gives them variance 1. */
enum { GM_INIT_MATRIX, GM_INIT_NORM, GM_INIT_NORM0, GM_INIT_WIDE, GM_INIT_QK };

typedef struct gm_tensor {
    char name[96];
    int ndim;
    int64_t shape[3];
    int init;                  /* GM_INIT_* */
} gm_tensor;

static size_t gm_numel(const gm_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static void gm_add(gm_tensor *list, int *n, int init, int64_t rows, int64_t cols,
                   const char *fmt, int layer) {
    gm_tensor *t = &list[(*n)++];
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->init = init;
}

/* The same for expert e of a layer: fmt takes the layer, then e. */
static void gm_add_expert(gm_tensor *list, int *n, int64_t rows, int64_t cols, const char *fmt,
                          int layer, int e) {
    gm_tensor *t = &list[(*n)++];
    snprintf(t->name, sizeof t->name, fmt, layer, e);
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->init = GM_INIT_MATRIX;
}

static int gm_gemma(const gm_shape *s) { return !strncmp(s->model_type, "gemma", 5); }

/* Layer l of a hybrid is linear attention (all but every attn_every-th). */
static int gm_linear(const gm_shape *s, int l) {
    return s->attn_every > 0 && (l + 1) % s->attn_every != 0;
}

/* Qwen3 (dense and MoE) and Gemma 3 and 4 have RMSNorms on q and k per
 * head; Llama and Gemma 2 none. */
static int gm_qk_norm(const gm_shape *s) {
    return !strcmp(s->model_type, "qwen3") || !strcmp(s->model_type, "qwen3_moe") ||
           !strcmp(s->model_type, "gemma3_text") || s->ple_dim > 0 || s->attn_every > 0;
}

/* Gemma 4's layer l is full attention (every third), else sliding. */
static int gm_g4_full(int l) { return (l + 1) % 3 == 0; }

/* Tensors gm_tensors lists for s. */
static size_t gm_capacity(const gm_shape *s) {
    return 8 + (24 + 3 * (size_t)s->experts + 5) * (size_t)s->layers;
}

/* Fills list (gm_capacity(s) entries) in Hugging Face order; returns the
 * count. */
static int gm_tensors(const gm_shape *s, gm_tensor *list) {
    /* Gemma 4 stores its norms as w (not w - 1) */
    int n = 0, g4 = s->ple_dim > 0;
    int norm = (gm_gemma(s) && !g4) || s->attn_every ? GM_INIT_NORM0 : GM_INIT_NORM;
    int64_t H = s->hidden, I = s->inter, LP = (int64_t)s->layers * s->ple_dim;
    gm_add(list, &n, GM_INIT_MATRIX, s->vocab, H, "model.embed_tokens.weight", 0);
    if (g4) {
        gm_add(list, &n, GM_INIT_MATRIX, s->vocab, LP, "model.embed_tokens_per_layer.weight", 0);
        gm_add(list, &n, GM_INIT_MATRIX, LP, H, "model.per_layer_model_projection.weight", 0);
        gm_add(list, &n, norm, s->ple_dim, 0, "model.per_layer_projection_norm.weight", 0);
    }
    for (int l = 0; l < s->layers; l++) {
        int hd = g4 && gm_g4_full(l) && s->global_head_dim ? s->global_head_dim : s->head_dim;
        int64_t q = (int64_t)s->heads * hd, kv = (int64_t)s->kv_heads * hd;
        gm_add(list, &n, norm, H, 0, "model.layers.%d.input_layernorm.weight", l);
        if (gm_linear(s, l)) {
            int64_t nk = s->lin_nk, nv = s->lin_nv, vd = nv * s->lin_dv;
            int64_t conv = 2 * nk * s->lin_dk + vd;
            if (!strcmp(s->model_type, "qwen3_next")) {
                gm_add(list, &n, GM_INIT_MATRIX, conv + vd, H,
                       "model.layers.%d.linear_attn.in_proj_qkvz.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, 2 * nv, H,
                       "model.layers.%d.linear_attn.in_proj_ba.weight", l);
            } else {
                gm_add(list, &n, GM_INIT_MATRIX, conv, H,
                       "model.layers.%d.linear_attn.in_proj_qkv.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, vd, H,
                       "model.layers.%d.linear_attn.in_proj_z.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, nv, H,
                       "model.layers.%d.linear_attn.in_proj_b.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, nv, H,
                       "model.layers.%d.linear_attn.in_proj_a.weight", l);
            }
            gm_add(list, &n, GM_INIT_WIDE, conv, 1, "model.layers.%d.linear_attn.conv1d.weight", l);
            list[n - 1].ndim = 3;
            list[n - 1].shape[2] = s->lin_kernel;
            gm_add(list, &n, GM_INIT_WIDE, nv, 0, "model.layers.%d.linear_attn.A_log", l);
            gm_add(list, &n, GM_INIT_MATRIX, nv, 0, "model.layers.%d.linear_attn.dt_bias", l);
            gm_add(list, &n, GM_INIT_NORM, s->lin_dv, 0, "model.layers.%d.linear_attn.norm.weight", l);
            gm_add(list, &n, GM_INIT_MATRIX, H, vd, "model.layers.%d.linear_attn.out_proj.weight", l);
        } else {
            /* the hybrids' q_proj also yields the output gate: [query | gate] per head */
            gm_add(list, &n, GM_INIT_MATRIX, s->attn_every ? 2 * q : q, H,
                   "model.layers.%d.self_attn.q_proj.weight", l);
            gm_add(list, &n, GM_INIT_MATRIX, kv, H, "model.layers.%d.self_attn.k_proj.weight", l);
            gm_add(list, &n, GM_INIT_MATRIX, kv, H, "model.layers.%d.self_attn.v_proj.weight", l);
            gm_add(list, &n, GM_INIT_MATRIX, H, q, "model.layers.%d.self_attn.o_proj.weight", l);
            if (gm_qk_norm(s)) {
                int qk = g4 ? GM_INIT_QK : norm;
                gm_add(list, &n, qk, hd, 0, "model.layers.%d.self_attn.q_norm.weight", l);
                gm_add(list, &n, qk, hd, 0, "model.layers.%d.self_attn.k_norm.weight", l);
            }
        }
        gm_add(list, &n, norm, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (gm_gemma(s)) {
            gm_add(list, &n, norm, H, 0, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            gm_add(list, &n, norm, H, 0, "model.layers.%d.post_feedforward_layernorm.weight", l);
        }
        if (s->experts && !g4) {
            /* the router, one tensor per expert (the hub checkpoints' form),
             * and the optional shared expert with its sigmoid gate */
            int64_t M = s->moe_inter, S = s->shared_inter;
            gm_add(list, &n, GM_INIT_MATRIX, s->experts, H, "model.layers.%d.mlp.gate.weight", l);
            for (int e = 0; e < s->experts; e++) {
                gm_add_expert(list, &n, M, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight",
                              l, e);
                gm_add_expert(list, &n, M, H, "model.layers.%d.mlp.experts.%d.up_proj.weight",
                              l, e);
                gm_add_expert(list, &n, H, M, "model.layers.%d.mlp.experts.%d.down_proj.weight",
                              l, e);
            }
            if (S) {
                gm_add(list, &n, GM_INIT_MATRIX, S, H,
                       "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, S, H,
                       "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, H, S,
                       "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
                gm_add(list, &n, GM_INIT_MATRIX, 1, H,
                       "model.layers.%d.mlp.shared_expert_gate.weight", l);
            }
            continue;
        }
        gm_add(list, &n, GM_INIT_MATRIX, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, H, I, "model.layers.%d.mlp.down_proj.weight", l);
        if (g4) {
            gm_add(list, &n, GM_INIT_MATRIX, s->ple_dim, H,
                   "model.layers.%d.per_layer_input_gate.weight", l);
            gm_add(list, &n, GM_INIT_MATRIX, H, s->ple_dim,
                   "model.layers.%d.per_layer_projection.weight", l);
            gm_add(list, &n, norm, H, 0, "model.layers.%d.post_per_layer_input_norm.weight", l);
            gm_add(list, &n, norm, 1, 0, "model.layers.%d.layer_scalar", l);
        }
        if (g4 && s->experts) {
            /* the MoE block beside the MLP: router with its input and
             * per-expert scales, fused experts (E, 2 I, H) and (E, H, I) */
            int64_t E = s->experts, M = s->moe_inter;
            gm_add(list, &n, GM_INIT_MATRIX, E, H, "model.layers.%d.router.proj.weight", l);
            gm_add(list, &n, GM_INIT_NORM, H, 0, "model.layers.%d.router.scale", l);
            gm_add(list, &n, GM_INIT_NORM, E, 0, "model.layers.%d.router.per_expert_scale", l);
            gm_add(list, &n, GM_INIT_MATRIX, E, 2 * M, "model.layers.%d.experts.gate_up_proj", l);
            list[n - 1].ndim = 3;
            list[n - 1].shape[2] = H;
            gm_add(list, &n, GM_INIT_MATRIX, E, H, "model.layers.%d.experts.down_proj", l);
            list[n - 1].ndim = 3;
            list[n - 1].shape[2] = M;
            gm_add(list, &n, norm, H, 0, "model.layers.%d.post_feedforward_layernorm_1.weight", l);
            gm_add(list, &n, norm, H, 0, "model.layers.%d.pre_feedforward_layernorm_2.weight", l);
            gm_add(list, &n, norm, H, 0, "model.layers.%d.post_feedforward_layernorm_2.weight", l);
        }
    }
    gm_add(list, &n, norm, H, 0, "model.norm.weight", 0);
    if (!s->tie) gm_add(list, &n, GM_INIT_MATRIX, s->vocab, H, "lm_head.weight", 0);
    return n;
}

/* ---- values ------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Per-tensor stream key from the seed and the name (FNV-1a). */
static uint64_t gm_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return splitmix64(seed ^ splitmix64(h));
}

/* Values [start, start + n) of tensor t: unit normal-ish noise (sum of four
 * 16-bit uniforms, Irwin-Hall, rescaled to variance 1; bounded by +-3.5)
 * scaled by the tensor's init. */
static void gm_fill(const gm_tensor *t, uint64_t seed, size_t start, size_t n, float *out) {
    uint64_t key = gm_key(seed, t->name);
    const float scale = 1.7320508f / 65536.0f; /* sqrt(3) / 2^16 */
    for (size_t i = 0; i < n; i++) {
        uint64_t r = splitmix64(key + (uint64_t)(start + i));
        float sum = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) +
                    (float)((r >> 32) & 0xffff) + (float)(r >> 48);
        float z = (sum - 2.0f * 65535.0f) * scale;
        out[i] = t->init == GM_INIT_NORM    ? 1.0f + GM_NORM_STD * z
                 : t->init == GM_INIT_QK    ? (1.0f + GM_NORM_STD * z) / sqrtf(sqrtf((float)t->shape[0]))
                 : t->init == GM_INIT_NORM0 ? GM_NORM_STD * z
                 : t->init == GM_INIT_WIDE  ? 0.5f * z
                                            : GM_MATRIX_STD * z;
    }
}

/* Converts n f32 values to dtype in dst. */
static void gm_convert(loom_dtype dt, const float *src, size_t n, void *dst) {
    if (dt == LOOM_DT_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == LOOM_DT_BF16) {
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom_f32_to_bf16(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom_f32_to_f16(src[i]);
    }
}

/* ---- GGUF (llama.cpp) ---------------------------------------------------- */

/* GGUF v3 layout (little-endian):
 *   "GGUF", u32 version = 3, u64 n_tensors, u64 n_kv,
 *   n_kv x (string key, u32 value type, value),
 *   n_tensors x (string name, u32 n_dims, u64 ne[n_dims] (ne[0] is the
 *                contiguous dimension), u32 ggml type, u64 offset),
 *   zero padding to general.alignment (32), then the tensor data, each
 *   tensor at its offset from the data start (a multiple of the alignment).
 * A string is a u64 byte count and the bytes (no terminator). */
#define GGUF_ALIGN 32
enum { GGUF_T_U32 = 4, GGUF_T_I32 = 5, GGUF_T_F32 = 6, GGUF_T_STRING = 8, GGUF_T_ARRAY = 9 };

/* Storage types, with their ggml type ids, block sizes and the
 * general.file_type (llama_ftype) of a model whose matrices use them. */
typedef enum gm_type { GM_F32, GM_F16, GM_BF16, GM_Q8_0, GM_Q4_0, GM_TYPE_COUNT } gm_type;

static const struct {
    const char *name;
    uint32_t ggml;          /* ggml_type */
    size_t block, bytes;    /* elements per block, bytes per block */
    uint32_t ftype;         /* llama_ftype */
} gm_types[GM_TYPE_COUNT] = {
    [GM_F32] = {"f32", 0, 1, 4, 0},
    [GM_F16] = {"f16", 1, 1, 2, 1},
    [GM_BF16] = {"bf16", 30, 1, 2, 32},
    [GM_Q8_0] = {"q8_0", 8, 32, 34, 7},
    [GM_Q4_0] = {"q4_0", 2, 32, 18, 2},
};

/* ---- writers ------------------------------------------------------------ */

typedef struct gm_job {
    const gm_shape *shape;
    const gm_tensor *tensors;
    int n_tensors;
    loom_dtype dtype;          /* float type every value is rounded to */
    gm_type type;              /* GGUF: storage type of the matrices */
    uint64_t seed;
    const char *dir;
} gm_job;

/* Streams every tensor's data, in list order, to f. */
/* One worker's share of a chunk: fill and convert elements [a, b). An 8B
 * model is 8e9 values; one thread takes minutes, so chunks are split over
 * the cores (the values stay a function of seed, name and index). */
typedef struct gm_part {
    const gm_tensor *t;
    uint64_t seed;
    size_t start, a, b;
    float *vals;
    void *conv;
    loom_dtype dt;
} gm_part;

static void *gm_part_run(void *arg) {
    gm_part *p = arg;
    size_t es = loom_dtype_size(p->dt);
    gm_fill(p->t, p->seed, p->start + p->a, p->b - p->a, p->vals + p->a);
    gm_convert(p->dt, p->vals + p->a, p->b - p->a, (char *)p->conv + p->a * es);
    return NULL;
}

#define GM_MAX_THREADS 32

static int gm_write_data(const gm_job *j, FILE *f) {
    size_t es = loom_dtype_size(j->dtype), chunk = GM_CHUNK * 16;
    float *vals = malloc(chunk * sizeof(float));
    void *conv = malloc(chunk * es);
    int ok = vals && conv;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = nc < 1 ? 1 : nc > GM_MAX_THREADS ? GM_MAX_THREADS : (int)nc;
    for (int i = 0; i < j->n_tensors && ok; i++) {
        size_t total = gm_numel(&j->tensors[i]);
        for (size_t off = 0; off < total && ok; off += chunk) {
            size_t n = LOOM_MIN(chunk, total - off);
            gm_part parts[GM_MAX_THREADS];
            pthread_t tid[GM_MAX_THREADS];
            int started[GM_MAX_THREADS] = {0};
            int np = n < GM_CHUNK ? 1 : nt;
            for (int k = 0; k < np; k++) {
                parts[k] = (gm_part){.t = &j->tensors[i], .seed = j->seed, .start = off,
                                     .a = n * k / np, .b = n * (k + 1) / np, .vals = vals,
                                     .conv = conv, .dt = j->dtype};
                started[k] = k > 0 && pthread_create(&tid[k], NULL, gm_part_run, &parts[k]) == 0;
                if (k > 0 && !started[k]) gm_part_run(&parts[k]);
            }
            gm_part_run(&parts[0]);
            for (int k = 1; k < np; k++)
                if (started[k]) pthread_join(tid[k], NULL);
            ok = fwrite(conv, es, n, f) == n;
        }
    }
    free(vals);
    free(conv);
    return ok;
}

/* Appends to a growing string; returns 0 when out of memory. */
typedef struct gm_buf {
    char *p;
    size_t len, cap;
} gm_buf;

__attribute__((format(printf, 2, 3))) static int gm_printf(gm_buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (w < 0) return 0;
        if (b->p && b->len + (size_t)w < b->cap) {
            b->len += (size_t)w;
            return 1;
        }
        size_t cap = LOOM_MAX(b->cap * 2, b->len + (size_t)w + 4096);
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
}

/* Opens DIR/name.tmp for writing; the caller renames it into place once the
 * file is complete, so a crashed run never leaves a half file behind. */
static FILE *gm_open_tmp(const char *dir, const char *name, char *tmp, size_t n) {
    if (snprintf(tmp, n, "%s/%s.tmp", dir, name) >= (int)n) return NULL;
    FILE *f = fopen(tmp, "wb");
    if (!f) fprintf(stderr, "gen_model: %s: %s\n", tmp, strerror(errno));
    return f;
}

static int gm_commit(FILE *f, int ok, const char *tmp, const char *dir, const char *name) {
    char path[4096];
    ok = (fclose(f) == 0) && ok;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "gen_model: writing %s failed: %s\n", path, strerror(errno));
        unlink(tmp);
        return 0;
    }
    return 1;
}

/* model.safetensors: u64 little-endian header length, JSON header padded
 * with spaces to a multiple of 8 bytes (so the data section is 8-aligned),
 * then the tensors back to back in list order. */
static int gm_write_safetensors(const gm_job *j) {
    gm_buf h = {0};
    int ok = gm_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0, es = loom_dtype_size(j->dtype);
    for (int i = 0; i < j->n_tensors && ok; i++) {
        const gm_tensor *t = &j->tensors[i];
        size_t bytes = gm_numel(t) * es;
        ok = gm_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name,
                       loom_dtype_name(j->dtype), (long long)t->shape[0]);
        for (int d = 1; d < t->ndim && ok; d++) ok = gm_printf(&h, ",%lld", (long long)t->shape[d]);
        if (ok) ok = gm_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    if (ok) ok = gm_printf(&h, "}");
    while (ok && h.len % 8) ok = gm_printf(&h, " ");
    if (!ok) {
        free(h.p);
        fprintf(stderr, "gen_model: out of memory\n");
        return 0;
    }
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "model.safetensors", tmp, sizeof tmp);
    if (!f) {
        free(h.p);
        return 0;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h.p, 1, h.len, f) == h.len;
    free(h.p);
    if (ok) ok = gm_write_data(j, f);
    return gm_commit(f, ok, tmp, j->dir, "model.safetensors");
}

static const char *gm_torch_dtype(loom_dtype t) {
    return t == LOOM_DT_BF16 ? "bfloat16" : t == LOOM_DT_F16 ? "float16" : "float32";
}

/* config.json with the keys, order and spelling transformers 4.51 writes for
 * Qwen3ForCausalLM (the form of the published Qwen3 checkpoints). */
static int gm_write_config_gemma(const gm_job *j);

static int gm_write_config_hybrid(const gm_job *j);

static int gm_write_config(const gm_job *j) {
    const gm_shape *s = j->shape;
    if (gm_gemma(s)) return gm_write_config_gemma(j);
    if (s->attn_every) return gm_write_config_hybrid(j);
    /* Qwen3-MoE's keys (decoder_sparse_step 1: every layer routed) */
    char moe[512] = "";
    if (s->experts)
        snprintf(moe, sizeof moe,
                 "  \"decoder_sparse_step\": 1,\n"
                 "  \"mlp_only_layers\": [],\n"
                 "  \"moe_intermediate_size\": %d,\n"
                 "  \"norm_topk_prob\": true,\n"
                 "  \"num_experts\": %d,\n"
                 "  \"num_experts_per_tok\": %d,\n"
                 "  \"output_router_logits\": false,\n"
                 "  \"router_aux_loss_coef\": 0.001,\n",
                 s->moe_inter, s->experts, s->experts_used);
    if (s->experts && s->shared_inter)
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe),
                 "  \"shared_expert_intermediate_size\": %d,\n", s->shared_inter);
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "config.json", tmp, sizeof tmp);
    if (!f) return 0;
    int w = fprintf(f,
        "{\n"
        "  \"architectures\": [\n"
        "    \"%s\"\n"
        "  ],\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"bos_token_id\": %d,\n"
        "  \"eos_token_id\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"max_window_layers\": %d,\n"
        "%s"
        "  \"model_type\": \"%s\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"rms_norm_eps\": %g,\n"
        "  \"rope_scaling\": null,\n"
        "  \"rope_theta\": %.0f,\n"
        "  \"sliding_window\": null,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"torch_dtype\": \"%s\",\n"
        "  \"transformers_version\": \"4.51.0\",\n"
        "  \"use_cache\": true,\n"
        "  \"use_sliding_window\": false,\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        s->arch, s->bos_id, s->eos_id, s->head_dim, s->hidden, s->inter, s->max_pos,
        s->layers, moe, s->model_type, s->heads, s->layers, s->kv_heads, s->rms_eps,
        s->rope_theta, s->tie ? "true" : "false", gm_torch_dtype(j->dtype), s->vocab);
    return gm_commit(f, w > 0, tmp, j->dir, "config.json");
}

/* config.json as transformers 5 writes Gemma2ForCausalLM and
 * Gemma3ForCausalLM: explicit layer_types (gemma2: even layers slide;
 * gemma3: five sliding layers, then a full one), a 16-token window, and
 * gemma2's softcaps; gemma3's sliding layers take rope theta 10000. */
static int gm_write_config_gemma4(const gm_job *j);

static int gm_write_config_gemma(const gm_job *j) {
    const gm_shape *s = j->shape;
    if (s->ple_dim > 0) return gm_write_config_gemma4(j);
    int g3 = gm_qk_norm(s);
    char types[4096] = "", rope[512];
    size_t w0 = 0;
    for (int l = 0; l < s->layers && w0 < sizeof types - 64; l++) {
        int slide = g3 ? (l + 1) % 6 != 0 : l % 2 == 0;
        w0 += (size_t)snprintf(types + w0, sizeof types - w0, "%s\"%s_attention\"", l ? ", " : "",
                               slide ? "sliding" : "full");
    }
    if (g3)
        snprintf(rope, sizeof rope, "{\"full_attention\": {\"rope_theta\": %.1f, \"rope_type\": "
                 "\"default\"}, \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": "
                 "\"default\"}}", s->rope_theta);
    else
        snprintf(rope, sizeof rope, "{\"rope_theta\": %.1f, \"rope_type\": \"default\"}",
                 s->rope_theta);
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "config.json", tmp, sizeof tmp);
    if (!f) return 0;
    int w = fprintf(f,
        "{\n"
        "  \"architectures\": [\"%s\"],\n"
        "  \"attention_bias\": false,\n"
        "  \"attn_logit_softcapping\": %s,\n"
        "  \"bos_token_id\": %d,\n"
        "  \"dtype\": \"%s\",\n"
        "  \"eos_token_id\": %d,\n"
        "  \"final_logit_softcapping\": %s,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"layer_types\": [%s],\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"model_type\": \"%s\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"query_pre_attn_scalar\": %d,\n"
        "  \"rms_norm_eps\": %g,\n"
        "  \"rope_parameters\": %s,\n"
        "  \"sliding_window\": 16,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"transformers_version\": \"5.17.0\",\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        s->arch, g3 ? "null" : "50.0", s->bos_id, gm_torch_dtype(j->dtype), s->eos_id,
        g3 ? "null" : "30.0", s->head_dim, s->hidden, s->inter, types, s->max_pos,
        s->model_type, s->heads, s->layers, s->kv_heads, s->head_dim, s->rms_eps, rope,
        s->tie ? "true" : "false", s->vocab);
    return gm_commit(f, w > 0, tmp, j->dir, "config.json");
}

/* config.json as transformers 5 writes Gemma4ForCausalLM (text, dense):
 * every third layer full (proportional rope, partial rotary 0.25, its
 * global_head_dim), sliding ones of a 16-token window at theta 10000,
 * per-layer inputs, the last kv_shared layers sharing KV. */
static int gm_write_config_gemma4(const gm_job *j) {
    const gm_shape *s = j->shape;
    char types[4096] = "";
    size_t w0 = 0;
    for (int l = 0; l < s->layers && w0 < sizeof types - 64; l++)
        w0 += (size_t)snprintf(types + w0, sizeof types - w0, "%s\"%s_attention\"", l ? ", " : "",
                               gm_g4_full(l) ? "full" : "sliding");
    char moe[256] = "  \"enable_moe_block\": false,\n";
    if (s->experts)
        snprintf(moe, sizeof moe, "  \"enable_moe_block\": true,\n  \"moe_intermediate_size\": %d,\n"
                 "  \"num_experts\": %d,\n  \"top_k_experts\": %d,\n", s->moe_inter, s->experts,
                 s->experts_used);
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "config.json", tmp, sizeof tmp);
    if (!f) return 0;
    int w = fprintf(f,
        "{\n"
        "  \"architectures\": [\"%s\"],\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_k_eq_v\": false,\n"
        "  \"bos_token_id\": %d,\n"
        "  \"dtype\": \"%s\",\n"
        "%s"
        "  \"eos_token_id\": %d,\n"
        "  \"final_logit_softcapping\": 30.0,\n"
        "  \"global_head_dim\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"hidden_size_per_layer_input\": %d,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"layer_types\": [%s],\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"model_type\": \"%s\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"num_kv_shared_layers\": %d,\n"
        "  \"rms_norm_eps\": %g,\n"
        "  \"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25, "
        "\"rope_theta\": %.1f, \"rope_type\": \"proportional\"}, \"sliding_attention\": "
        "{\"rope_theta\": 10000.0, \"rope_type\": \"default\"}},\n"
        "  \"sliding_window\": 16,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"transformers_version\": \"5.17.0\",\n"
        "  \"use_double_wide_mlp\": false,\n"
        "  \"vocab_size\": %d,\n"
        "  \"vocab_size_per_layer_input\": %d\n"
        "}\n",
        s->arch, s->bos_id, gm_torch_dtype(j->dtype), moe, s->eos_id,
        s->global_head_dim ? s->global_head_dim : s->head_dim, s->head_dim, s->hidden,
        s->ple_dim, s->inter, types, s->max_pos, s->model_type, s->heads, s->layers,
        s->kv_heads, s->kv_shared, s->rms_eps, s->rope_theta, s->tie ? "true" : "false",
        s->vocab, s->vocab);
    return gm_commit(f, w > 0, tmp, j->dir, "config.json");
}

/* config.json as transformers 5 writes Qwen3_5ForCausalLM (text) and
 * Qwen3NextForCausalLM: explicit layer_types, the linear-attention heads,
 * partial rotary 0.25; Qwen3-Next's routed and shared experts. */
static int gm_write_config_hybrid(const gm_job *j) {
    const gm_shape *s = j->shape;
    char types[4096] = "", moe[512] = "";
    size_t w0 = 0;
    for (int l = 0; l < s->layers && w0 < sizeof types - 64; l++)
        w0 += (size_t)snprintf(types + w0, sizeof types - w0, "%s\"%s_attention\"", l ? ", " : "",
                               gm_linear(s, l) ? "linear" : "full");
    if (s->experts)
        snprintf(moe, sizeof moe,
                 "  \"decoder_sparse_step\": 1,\n"
                 "  \"mlp_only_layers\": [],\n"
                 "  \"moe_intermediate_size\": %d,\n"
                 "  \"norm_topk_prob\": true,\n"
                 "  \"num_experts\": %d,\n"
                 "  \"num_experts_per_tok\": %d,\n"
                 "  \"shared_expert_intermediate_size\": %d,\n",
                 s->moe_inter, s->experts, s->experts_used, s->shared_inter);
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "config.json", tmp, sizeof tmp);
    if (!f) return 0;
    int w = fprintf(f,
        "{\n"
        "  \"architectures\": [\"%s\"],\n"
        "  \"attention_bias\": false,\n"
        "  \"bos_token_id\": %d,\n"
        "%s"
        "  \"dtype\": \"%s\",\n"
        "  \"eos_token_id\": %d,\n"
        "  \"full_attention_interval\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"layer_types\": [%s],\n"
        "  \"linear_conv_kernel_dim\": %d,\n"
        "  \"linear_key_head_dim\": %d,\n"
        "  \"linear_num_key_heads\": %d,\n"
        "  \"linear_num_value_heads\": %d,\n"
        "  \"linear_value_head_dim\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"model_type\": \"%s\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"partial_rotary_factor\": 0.25,\n"
        "  \"rms_norm_eps\": %g,\n"
        "  \"rope_parameters\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": %.1f, "
        "\"rope_type\": \"default\"},\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"transformers_version\": \"5.17.0\",\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        s->arch, s->bos_id, moe, gm_torch_dtype(j->dtype), s->eos_id, s->attn_every,
        s->head_dim, s->hidden, s->inter, types, s->lin_kernel, s->lin_dk, s->lin_nk, s->lin_nv,
        s->lin_dv, s->max_pos, s->model_type, s->heads, s->layers, s->kv_heads, s->rms_eps,
        s->rope_theta, s->tie ? "true" : "false", s->vocab);
    return gm_commit(f, w > 0, tmp, j->dir, "config.json");
}

static size_t gm_type_bytes(gm_type t, size_t n) {
    return n / gm_types[t].block * gm_types[t].bytes;
}

/* Q8_0 block: f16 d = max|x| / 127, then 32 x int8 round(x / d). */
static void gm_quant_q8_0(const float *x, size_t n, uint8_t *out) {
    for (size_t b = 0; b < n / 32; b++, x += 32, out += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = loom_f32_to_f16(d);
        out[0] = (uint8_t)dh;
        out[1] = (uint8_t)(dh >> 8);
        for (int i = 0; i < 32; i++) out[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

/* Q4_0 block: f16 d = (the value of largest magnitude) / -8, then 16 bytes:
 * byte i holds element i in its low nibble and element i + 16 in its high
 * nibble, each as min(15, trunc(x / d + 8.5)); value = (q - 8) * d. */
static void gm_quant_q4_0(const float *x, size_t n, uint8_t *out) {
    for (size_t b = 0; b < n / 32; b++, x += 32, out += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = loom_f32_to_f16(d);
        out[0] = (uint8_t)dh;
        out[1] = (uint8_t)(dh >> 8);
        for (int i = 0; i < 16; i++) {
            int q0 = LOOM_MIN(15, (int)(x[i] * id + 8.5f));
            int q1 = LOOM_MIN(15, (int)(x[i + 16] * id + 8.5f));
            out[2 + i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Rounds n values to dt (the model's float dtype) in place. */
static void gm_round(loom_dtype dt, float *v, size_t n) {
    if (dt == LOOM_DT_BF16)
        for (size_t i = 0; i < n; i++) v[i] = loom_bf16_to_f32(loom_f32_to_bf16(v[i]));
    else if (dt == LOOM_DT_F16)
        for (size_t i = 0; i < n; i++) v[i] = loom_f16_to_f32(loom_f32_to_f16(v[i]));
}

/* Encodes n f32 values as t (n a multiple of t's block). */
static void gm_encode(gm_type t, const float *src, size_t n, void *dst) {
    switch (t) {
    case GM_F32: gm_convert(LOOM_DT_F32, src, n, dst); break;
    case GM_F16: gm_convert(LOOM_DT_F16, src, n, dst); break;
    case GM_BF16: gm_convert(LOOM_DT_BF16, src, n, dst); break;
    case GM_Q8_0: gm_quant_q8_0(src, n, dst); break;
    case GM_Q4_0: gm_quant_q4_0(src, n, dst); break;
    default: break;
    }
}

/* The llama.cpp name of a Hugging Face Qwen3 tensor; 0 if it has none. */
static int gm_gguf_name(const char *hf, char *out, size_t n) {
    static const char *const map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    int layer, pos = 0;
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, n, "token_embd.weight") < (int)n;
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, n, "output_norm.weight") < (int)n;
    if (!strcmp(hf, "lm_head.weight")) return snprintf(out, n, "output.weight") < (int)n;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &pos) != 1 || !pos) return 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(map); i++)
        if (!strcmp(hf + pos, map[i][0])) return snprintf(out, n, "blk.%d.%s", layer, map[i][1]) < (int)n;
    return 0;
}

/* Matrices are stored as the requested type; 1-D tensors (norms) as f32,
 * which is what llama.cpp expects of them. */
static gm_type gm_gguf_type(const gm_job *j, const gm_tensor *t) {
    return t->ndim == 2 ? j->type : GM_F32;
}

static size_t gm_pad(size_t x) { return (x + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN; }

static int gm_put(gm_buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = LOOM_MAX(b->cap * 2, b->len + n + 4096);
        char *q = realloc(b->p, cap);
        if (!q) return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 1;
}

static int gm_put_u32(gm_buf *b, uint32_t v) {
    uint8_t le[4];
    for (int i = 0; i < 4; i++) le[i] = (uint8_t)(v >> (8 * i));
    return gm_put(b, le, 4);
}

static int gm_put_u64(gm_buf *b, uint64_t v) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(v >> (8 * i));
    return gm_put(b, le, 8);
}

static int gm_put_str(gm_buf *b, const char *s) {
    return gm_put_u64(b, strlen(s)) && gm_put(b, s, strlen(s));
}

/* Key/value pairs, counted as they are added. */
typedef struct gm_kv {
    gm_buf b;
    uint64_t n;
    int ok;
} gm_kv;

static void gm_kv_u32(gm_kv *kv, const char *key, uint32_t v) {
    kv->ok = kv->ok && gm_put_str(&kv->b, key) && gm_put_u32(&kv->b, GGUF_T_U32) &&
             gm_put_u32(&kv->b, v);
    kv->n++;
}

static void gm_kv_f32(gm_kv *kv, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    kv->ok = kv->ok && gm_put_str(&kv->b, key) && gm_put_u32(&kv->b, GGUF_T_F32) &&
             gm_put_u32(&kv->b, u);
    kv->n++;
}

static void gm_kv_str(gm_kv *kv, const char *key, const char *v) {
    kv->ok = kv->ok && gm_put_str(&kv->b, key) && gm_put_u32(&kv->b, GGUF_T_STRING) &&
             gm_put_str(&kv->b, v);
    kv->n++;
}

/* The metadata llama.cpp reads for a "qwen3" model (llama-arch.cpp key
 * names; head_dim is given as key/value length since it is not
 * hidden / heads). */
static int gm_gguf_metadata(const gm_job *j, gm_kv *kv) {
    const gm_shape *s = j->shape;
    char name[128];
    snprintf(name, sizeof name, "random %s seed %llu", s->preset, (unsigned long long)j->seed);
    gm_kv_str(kv, "general.architecture", s->model_type);
    gm_kv_str(kv, "general.name", name);
    gm_kv_u32(kv, "general.file_type", gm_types[j->type].ftype);
    gm_kv_u32(kv, "general.quantization_version", 2);
    gm_kv_u32(kv, "general.alignment", GGUF_ALIGN);
    gm_kv_u32(kv, "qwen3.context_length", (uint32_t)s->max_pos);
    gm_kv_u32(kv, "qwen3.embedding_length", (uint32_t)s->hidden);
    gm_kv_u32(kv, "qwen3.block_count", (uint32_t)s->layers);
    gm_kv_u32(kv, "qwen3.feed_forward_length", (uint32_t)s->inter);
    gm_kv_u32(kv, "qwen3.attention.head_count", (uint32_t)s->heads);
    gm_kv_u32(kv, "qwen3.attention.head_count_kv", (uint32_t)s->kv_heads);
    gm_kv_u32(kv, "qwen3.attention.key_length", (uint32_t)s->head_dim);
    gm_kv_u32(kv, "qwen3.attention.value_length", (uint32_t)s->head_dim);
    gm_kv_u32(kv, "qwen3.rope.dimension_count", (uint32_t)s->head_dim);
    gm_kv_f32(kv, "qwen3.rope.freq_base", (float)s->rope_theta);
    gm_kv_f32(kv, "qwen3.attention.layer_norm_rms_epsilon", (float)s->rms_eps);
    gm_kv_u32(kv, "qwen3.vocab_size", (uint32_t)s->vocab);
    gm_kv_str(kv, "tokenizer.ggml.model", "none");
    return kv->ok;
}

static int gm_write_gguf(const gm_job *j) {
    for (int i = 0; i < j->n_tensors; i++)
        if (j->tensors[i].ndim == 2 && j->tensors[i].shape[1] % (int64_t)gm_types[j->type].block) {
            fprintf(stderr, "gen_model: %s: rows must be a multiple of 32 for %s\n",
                    j->tensors[i].name, gm_types[j->type].name);
            return 0;
        }
    gm_kv kv = {.ok = 1};
    gm_buf h = {0};
    int ok = gm_gguf_metadata(j, &kv);
    ok = ok && gm_put(&h, "GGUF", 4) && gm_put_u32(&h, 3) && gm_put_u64(&h, (uint64_t)j->n_tensors) &&
         gm_put_u64(&h, kv.n) && gm_put(&h, kv.b.p, kv.b.len);
    free(kv.b.p);
    uint64_t off = 0;
    for (int i = 0; i < j->n_tensors && ok; i++) {
        const gm_tensor *t = &j->tensors[i];
        char name[96];
        if (!gm_gguf_name(t->name, name, sizeof name)) {
            fprintf(stderr, "gen_model: %s has no GGUF name\n", t->name);
            ok = 0;
            break;
        }
        gm_type ty = gm_gguf_type(j, t);
        ok = gm_put_str(&h, name) && gm_put_u32(&h, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0 && ok; d--) ok = gm_put_u64(&h, (uint64_t)t->shape[d]);
        ok = ok && gm_put_u32(&h, gm_types[ty].ggml) && gm_put_u64(&h, off);
        off += gm_pad(gm_type_bytes(ty, gm_numel(t)));
    }
    static const uint8_t zeros[GGUF_ALIGN];
    if (ok) ok = gm_put(&h, zeros, gm_pad(h.len) - h.len);
    char tmp[4096];
    FILE *f = ok ? gm_open_tmp(j->dir, "model.gguf", tmp, sizeof tmp) : NULL;
    if (!f) {
        if (!ok) fprintf(stderr, "gen_model: out of memory\n");
        free(h.p);
        return 0;
    }
    ok = fwrite(h.p, 1, h.len, f) == h.len;
    free(h.p);
    float *vals = malloc(GM_CHUNK * sizeof(float));
    void *enc = malloc(GM_CHUNK * sizeof(float));
    ok = ok && vals && enc;
    for (int i = 0; i < j->n_tensors && ok; i++) {
        const gm_tensor *t = &j->tensors[i];
        gm_type ty = gm_gguf_type(j, t);
        size_t total = gm_numel(t), bytes = 0;
        for (size_t o = 0; o < total && ok; o += GM_CHUNK) {
            size_t n = LOOM_MIN(GM_CHUNK, total - o), nb = gm_type_bytes(ty, n);
            gm_fill(t, j->seed, o, n, vals);
            gm_round(j->dtype, vals, n);
            gm_encode(ty, vals, n, enc);
            ok = fwrite(enc, 1, nb, f) == nb;
            bytes += nb;
        }
        if (ok) ok = fwrite(zeros, 1, gm_pad(bytes) - bytes, f) == gm_pad(bytes) - bytes;
    }
    free(vals);
    free(enc);
    return gm_commit(f, ok, tmp, j->dir, "model.gguf");
}

/* ---- GGUF read-back check ------------------------------------------------ */

typedef struct gg_reader {
    const uint8_t *p;
    size_t size, pos;
    int ok;
} gg_reader;

static uint64_t gg_uint(gg_reader *r, int bytes) {
    uint64_t v = 0;
    if (r->pos + (size_t)bytes > r->size) {
        r->ok = 0;
        return 0;
    }
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->pos + (size_t)i] << (8 * i);
    r->pos += (size_t)bytes;
    return v;
}

/* Reads a string into out (truncated to n - 1 bytes). */
static void gg_str(gg_reader *r, char *out, size_t n) {
    uint64_t len = gg_uint(r, 8);
    if (!r->ok || len > r->size - r->pos) {
        r->ok = 0;
        if (n) out[0] = 0;
        return;
    }
    if (n) {
        size_t c = LOOM_MIN((size_t)len, n - 1);
        memcpy(out, r->p + r->pos, c);
        out[c] = 0;
    }
    r->pos += (size_t)len;
}

static void gg_skip_value(gg_reader *r, uint32_t type, int depth) {
    static const int size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == GGUF_T_STRING) {
        gg_str(r, NULL, 0);
    } else if (type == GGUF_T_ARRAY && depth < 4) {
        uint32_t et = (uint32_t)gg_uint(r, 4);
        uint64_t n = gg_uint(r, 8);
        for (uint64_t i = 0; i < n && r->ok; i++) gg_skip_value(r, et, depth + 1);
    } else if (type < 13 && size[type]) {
        gg_uint(r, size[type]);
    } else {
        r->ok = 0;
    }
}

/* Element i of a tensor of ggml type ty at data, as f32. */
static float gg_value(uint32_t ty, const uint8_t *data, size_t i, float *scale) {
    *scale = 0.0f;
    if (ty == gm_types[GM_F32].ggml) {
        float f;
        memcpy(&f, data + 4 * i, 4);
        return f;
    }
    if (ty == gm_types[GM_F16].ggml) return loom_f16_to_f32((uint16_t)(data[2 * i] | data[2 * i + 1] << 8));
    if (ty == gm_types[GM_BF16].ggml) return loom_bf16_to_f32((uint16_t)(data[2 * i] | data[2 * i + 1] << 8));
    size_t b = i / 32, k = i % 32;
    if (ty == gm_types[GM_Q8_0].ggml) {
        const uint8_t *blk = data + 34 * b;
        *scale = loom_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
        return (float)(int8_t)blk[2 + k] * *scale;
    }
    const uint8_t *blk = data + 18 * b; /* Q4_0 */
    *scale = loom_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
    int q = k < 16 ? blk[2 + k] & 15 : blk[2 + k - 16] >> 4;
    return (float)(q - 8) * *scale;
}

static float gg_st_value(const loom_st_tensor *t, size_t i) {
    const uint8_t *d = t->data;
    if (t->dtype == LOOM_DT_F32) {
        float f;
        memcpy(&f, d + 4 * i, 4);
        return f;
    }
    uint16_t h = (uint16_t)(d[2 * i] | d[2 * i + 1] << 8);
    return t->dtype == LOOM_DT_BF16 ? loom_bf16_to_f32(h) : loom_f16_to_f32(h);
}

/* Compares every tensor of the GGUF file with the model in dir. Float types
 * must be equal; a quantized element x' of a block with scale d must be
 * within 0.6 |d| (q8_0: rounding plus the f16 scale) or 1.05 |d| (q4_0: the
 * top of the range clamps to 15) of the safetensors value. */
static int gm_check(const char *gguf, const char *dir) {
    int fd = open(gguf, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "gen_model: %s: %s\n", gguf, strerror(errno));
        if (fd >= 0) close(fd);
        return 0;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "gen_model: mmap %s: %s\n", gguf, strerror(errno));
        return 0;
    }
    loom_safetensors *st = NULL;
    if (loom_st_open_dir(dir, &st) != LOOM_OK) {
        fprintf(stderr, "gen_model: cannot open the safetensors model in %s\n", dir);
        munmap(map, (size_t)sb.st_size);
        return 0;
    }
    gg_reader r = {.p = map, .size = (size_t)sb.st_size, .ok = 1};
    int ok = r.size >= 24 && !memcmp(r.p, "GGUF", 4);
    r.pos = 4;
    uint32_t version = (uint32_t)gg_uint(&r, 4);
    uint64_t n_tensors = gg_uint(&r, 8), n_kv = gg_uint(&r, 8);
    if (!ok || version != 3) {
        fprintf(stderr, "gen_model: %s: expected GGUF v3, found %s v%u\n", gguf,
                ok ? "GGUF" : "no GGUF magic", version);
        ok = 0;
    }
    uint64_t align = GGUF_ALIGN;
    for (uint64_t i = 0; i < n_kv && ok && r.ok; i++) {
        char key[256];
        gg_str(&r, key, sizeof key);
        uint32_t type = (uint32_t)gg_uint(&r, 4);
        if (!strcmp(key, "general.alignment") && type == GGUF_T_U32) align = gg_uint(&r, 4);
        else gg_skip_value(&r, type, 0);
    }
    typedef struct { char name[96]; uint32_t ndim, type; uint64_t ne[4], off; } info;
    info *inf = ok ? calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *inf) : NULL;
    ok = ok && inf && align && n_tensors == (uint64_t)loom_st_count(st);
    if (inf && !ok)
        fprintf(stderr, "gen_model: %s holds %llu tensors, the model %d\n", gguf,
                (unsigned long long)n_tensors, loom_st_count(st));
    for (uint64_t i = 0; i < n_tensors && ok && r.ok; i++) {
        gg_str(&r, inf[i].name, sizeof inf[i].name);
        inf[i].ndim = (uint32_t)gg_uint(&r, 4);
        if (inf[i].ndim < 1 || inf[i].ndim > 4) r.ok = 0;
        for (uint32_t d = 0; d < inf[i].ndim && r.ok; d++) inf[i].ne[d] = gg_uint(&r, 8);
        inf[i].type = (uint32_t)gg_uint(&r, 4);
        inf[i].off = gg_uint(&r, 8);
    }
    if (ok && !r.ok) {
        fprintf(stderr, "gen_model: %s: header truncated or malformed\n", gguf);
        ok = 0;
    }
    size_t data = (r.pos + (size_t)align - 1) / (size_t)align * (size_t)align;
    int bad = 0;
    size_t checked = 0;
    for (int i = 0; i < loom_st_count(st) && ok; i++) {
        const loom_st_tensor *t = loom_st_at(st, i);
        char want[96];
        const info *g = NULL;
        if (gm_gguf_name(t->name, want, sizeof want))
            for (uint64_t k = 0; k < n_tensors; k++)
                if (!strcmp(inf[k].name, want)) g = &inf[k];
        if (!g) {
            fprintf(stderr, "gen_model: %s: no tensor %s in %s\n", t->name, want, gguf);
            bad++;
            continue;
        }
        int shape_ok = (int)g->ndim == t->ndim;
        for (int d = 0; d < t->ndim && shape_ok; d++)
            shape_ok = g->ne[d] == (uint64_t)t->shape[t->ndim - 1 - d];
        gm_type ty = GM_TYPE_COUNT;
        for (int k = 0; k < GM_TYPE_COUNT; k++)
            if (gm_types[k].ggml == g->type) ty = (gm_type)k;
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        if (!shape_ok || ty == GM_TYPE_COUNT || n % gm_types[ty].block ||
            data + g->off + gm_type_bytes(ty, n) > r.size) {
            fprintf(stderr, "gen_model: %s: %s has ggml type %u, %u dims, or lies outside the "
                    "file; expected the reversed shape of the safetensors tensor\n", t->name,
                    g->name, g->type, g->ndim);
            bad++;
            continue;
        }
        const uint8_t *p = r.p + data + g->off;
        for (size_t e = 0; e < n; e++) {
            float scale, x = gg_value(g->type, p, e, &scale), want_x = gg_st_value(t, e);
            float tol = ty == GM_Q8_0 ? 0.6f * fabsf(scale) : ty == GM_Q4_0 ? 1.05f * fabsf(scale) : 0.0f;
            if (!(fabsf(x - want_x) <= tol)) {
                fprintf(stderr, "gen_model: %s: element %zu is %g in %s (%s), %g in the "
                        "safetensors model (tolerance %g)\n", g->name, e, (double)x, gguf,
                        gm_types[ty].name, (double)want_x, (double)tol);
                bad++;
                break;
            }
        }
        checked += n;
    }
    if (ok && !bad)
        fprintf(stderr, "gen_model: %s matches %s: %llu tensors, %zu values\n", gguf, dir,
                (unsigned long long)n_tensors, checked);
    free(inf);
    loom_st_close(st);
    munmap(map, (size_t)sb.st_size);
    return ok && !bad;
}

typedef struct gm_writer {
    const char *format;
    int (*write)(const gm_job *j);  /* returns 1 on success */
} gm_writer;

static int gm_write_hf(const gm_job *j) {
    return gm_write_config(j) && gm_write_safetensors(j);
}

static const gm_writer writers[] = {
    {"safetensors", gm_write_hf},  /* Hugging Face directory */
    {"gguf", gm_write_gguf},       /* DIR/model.gguf for llama.cpp */
};

/* ---- command line ------------------------------------------------------- */

static int mkdir_p(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return 0;
    for (char *c = p + 1;; c++) {
        if (*c == '/' || !*c) {
            char save = *c;
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "gen_model: mkdir %s: %s\n", p, strerror(errno));
                return 0;
            }
            *c = save;
            if (!save) return 1;
        }
    }
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: gen_model --out DIR [--preset qwen3-0.6b|llama3-8b|gemma2|gemma3|gemma4|qwen3moe|qwen3.5|\n"
        "                 qwen3next|tiny]\n"
        "                 [--dtype bf16|f16|f32|q8_0|q4_0] [--seed N]\n"
        "                 [--format safetensors|gguf]\n"
        "                 [--layers N] [--hidden N] [--heads N] [--kv-heads N]\n"
        "                 [--head-dim N] [--intermediate N] [--vocab N] [--max-pos N]\n"
        "                 [--experts N] [--experts-used N] [--moe-intermediate N]\n"
        "                 [--shared-intermediate N] (qwen3moe) [--untied]\n"
        "       gen_model --check FILE.gguf --against DIR\n"
        "Writes a random-weight model directory (config.json + model.safetensors,\n"
        "or model.gguf for llama.cpp with --format gguf; q8_0 and q4_0 are GGUF\n"
        "only, quantized from the bf16 values). Values depend only on the seed\n"
        "and the tensor names, not on the dtype or the file format. --check\n"
        "compares every tensor of a GGUF file with the safetensors model in DIR.\n");
}

static int parse_pos_int(const char *flag, const char *v, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x <= 0 || x > 1 << 30) {
        fprintf(stderr, "gen_model: %s: expected a positive integer, got \"%s\"\n", flag, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int main(int argc, char **argv) {
    const char *preset = "qwen3-0.6b", *dtype_s = "bf16", *out = NULL, *format = "safetensors";
    const char *check = NULL, *against = NULL;
    uint64_t seed = 1;
    enum { N_OV = 12 };
    int ov[N_OV] = {0}, untied = 0;
    static const char *ov_flags[N_OV] = {"--layers", "--hidden", "--heads", "--kv-heads",
                                         "--head-dim", "--intermediate", "--vocab", "--max-pos",
                                         "--experts", "--experts-used", "--moe-intermediate",
                                         "--shared-intermediate"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--untied")) {
            untied = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gen_model: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int k = -1;
        for (int o = 0; o < N_OV; o++)
            if (!strcmp(a, ov_flags[o])) k = o;
        if (k >= 0) {
            if (!parse_pos_int(a, v, &ov[k])) return 2;
        } else if (!strcmp(a, "--preset")) {
            preset = v;
        } else if (!strcmp(a, "--dtype")) {
            dtype_s = v;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            seed = strtoull(v, &end, 10);
            if (*end || !*v) {
                fprintf(stderr, "gen_model: --seed: expected an integer, got \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--out")) {
            out = v;
        } else if (!strcmp(a, "--format")) {
            format = v;
        } else if (!strcmp(a, "--check")) {
            check = v;
        } else if (!strcmp(a, "--against")) {
            against = v;
        } else {
            fprintf(stderr, "gen_model: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (check || against) {
        if (!check || !against) {
            fprintf(stderr, "gen_model: --check FILE.gguf needs --against DIR\n");
            return 2;
        }
        return gm_check(check, against) ? 0 : 1;
    }
    if (!out) {
        fprintf(stderr, "gen_model: --out DIR is required\n");
        usage(stderr);
        return 2;
    }
    gm_shape s;
    const gm_shape *p = NULL;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(presets); i++)
        if (!strcmp(presets[i].preset, preset)) p = &presets[i];
    if (!p) {
        fprintf(stderr, "gen_model: unknown preset \"%s\" (expected qwen3-0.6b, llama3-8b, gemma2, gemma3, gemma4, qwen3moe, qwen3.5, qwen3next or tiny)\n",
                preset);
        return 2;
    }
    s = *p;
    int *fields[N_OV] = {&s.layers, &s.hidden, &s.heads, &s.kv_heads,
                         &s.head_dim, &s.inter, &s.vocab, &s.max_pos,
                         &s.experts, &s.experts_used, &s.moe_inter, &s.shared_inter};
    int moe_ov = 0;
    for (int o = 0; o < N_OV; o++) {
        if (ov[o]) *fields[o] = ov[o];
        moe_ov |= o >= 8 && ov[o];
    }
    if (untied) s.tie = 0;
    if (moe_ov && !p->experts && !(p->ple_dim && !s.shared_inter)) {
        fprintf(stderr, "gen_model: --experts, --experts-used, --moe-intermediate and "
                "--shared-intermediate need --preset qwen3moe or qwen3next (gemma4: all but "
                "--shared-intermediate) (preset %s is %s)\n", s.preset,
                s.arch);
        return 2;
    }
    if (s.experts && (s.experts_used > s.experts || !s.experts_used || !s.moe_inter)) {
        fprintf(stderr, "gen_model: experts used (%d) must be 1 to experts (%d), with an expert "
                "width (--moe-intermediate, %d)\n", s.experts_used, s.experts, s.moe_inter);
        return 2;
    }
    if (s.heads % s.kv_heads || s.head_dim % 2) {
        fprintf(stderr, "gen_model: heads (%d) must be a multiple of kv-heads (%d) and "
                "head-dim (%d) even\n", s.heads, s.kv_heads, s.head_dim);
        return 2;
    }
    if (s.bos_id >= s.vocab) s.bos_id = 0;
    if (s.eos_id >= s.vocab) s.eos_id = 0;
    gm_type ty = GM_TYPE_COUNT;
    for (int k = 0; k < GM_TYPE_COUNT; k++)
        if (!strcmp(dtype_s, gm_types[k].name)) ty = (gm_type)k;
    if (ty == GM_TYPE_COUNT) {
        fprintf(stderr, "gen_model: --dtype: expected bf16, f16, f32, q8_0 or q4_0, got \"%s\"\n",
                dtype_s);
        return 2;
    }
    /* Quantized types start from the bf16 values, as a conversion of the
     * bf16 checkpoint would. */
    loom_dtype dt = ty == GM_F32 ? LOOM_DT_F32 : ty == GM_F16 ? LOOM_DT_F16 : LOOM_DT_BF16;
    const gm_writer *wr = NULL;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(writers); i++)
        if (!strcmp(writers[i].format, format)) wr = &writers[i];
    if (!wr) {
        fprintf(stderr, "gen_model: --format: expected safetensors or gguf, got \"%s\"\n", format);
        return 2;
    }
    if (wr->write == gm_write_gguf && strcmp(s.model_type, "qwen3")) {
        fprintf(stderr, "gen_model: --format gguf writes llama.cpp's qwen3 architecture only "
                "(preset %s is %s)\n", s.preset, s.arch);
        return 2;
    }
    if (wr->write == gm_write_hf && (ty == GM_Q8_0 || ty == GM_Q4_0)) {
        fprintf(stderr, "gen_model: --dtype %s is only written as --format gguf (for loom's "
                "8/4-bit models, run `loom convert --bits 8|4` on the bf16 model)\n", dtype_s);
        return 2;
    }

    gm_tensor *list = calloc(gm_capacity(&s), sizeof *list);
    if (!list) {
        fprintf(stderr, "gen_model: out of memory\n");
        return 1;
    }
    gm_job j = {.shape = &s, .tensors = list, .n_tensors = gm_tensors(&s, list),
                .dtype = dt, .type = ty, .seed = seed, .dir = out};
    size_t params = 0;
    for (int i = 0; i < j.n_tensors; i++) params += gm_numel(&list[i]);
    double t0 = loom_now();
    int ok = mkdir_p(out) && wr->write(&j);
    if (ok)
        fprintf(stderr, "gen_model: %s %s seed %llu: %d tensors, %.1fM params, %.2f GB in %s "
                "(%.1f s)\n", s.preset, dtype_s, (unsigned long long)seed, j.n_tensors,
                (double)params / 1e6,
                (double)(wr->write == gm_write_hf ? params * loom_dtype_size(dt)
                                                  : gm_type_bytes(ty, params)) / 1e9, out,
                loom_now() - t0);
    free(list);
    return ok ? 0 : 1;
}
