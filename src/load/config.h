/* config: the model blueprint parsed from a Hugging Face config.json.
 * Accepts both spellings of rope settings: `rope_parameters` (transformers
 * 5) and `rope_theta` + `rope_scaling` (older checkpoints). */
#ifndef LOOM_CONFIG_H
#define LOOM_CONFIG_H

#include "loom.h"

#define LOOM_MAX_LAYERS 256
#define LOOM_MAX_EOS 8

typedef enum loom_rope_type {
    LOOM_ROPE_DEFAULT,
    LOOM_ROPE_LINEAR,
    LOOM_ROPE_LLAMA3,
    LOOM_ROPE_YARN,
    LOOM_ROPE_DYNAMIC,
    LOOM_ROPE_PROPORTIONAL,        /* gemma4: partial angles over the whole head */
} loom_rope_type;

/* What a decoder layer mixes tokens with (config.json "layer_types"). */
typedef enum loom_layer_type {
    LOOM_LAYER_FULL = 0,    /* "full_attention" */
    LOOM_LAYER_SLIDING,     /* "sliding_attention" */
    LOOM_LAYER_LINEAR,      /* "linear_attention" (Gated DeltaNet) */
} loom_layer_type;

#define LOOM_MAX_QUANT_OVERRIDES 256

/* A per-module quantization setting from config.json "quantization". */
typedef struct loom_quant_override {
    char path[120];         /* module path, e.g. "model.layers.0.mlp.down_proj" */
    int bits;               /* 0 = the module is not quantized */
    int group;
} loom_quant_override;

typedef struct loom_rope_config {
    loom_rope_type type;
    double theta;
    double factor;                 /* linear / llama3 / yarn scale */
    double low_freq_factor;        /* llama3 */
    double high_freq_factor;       /* llama3 */
    double original_max_pos;       /* llama3 / yarn */
    double beta_fast, beta_slow;   /* yarn */
    double attention_factor;       /* yarn mscale (0 = derive) */
    double partial_rotary_factor;  /* fraction of head_dim rotated (1 = all) */
    /* Multimodal rope (Qwen2-VL and later): rotated pair i turns by one of
     * three position streams (t, h, w); mrope_section[k] pairs take stream
     * k, in runs (sectioned) or round robin t,h,w (mrope_interleaved). */
    int mrope_section[3];          /* all 0 = plain rope */
    int mrope_interleaved;
} loom_rope_config;

typedef struct loom_config {
    char arch[64];          /* architectures[0], e.g. "Qwen3ForCausalLM" */
    char model_type[64];
    int vocab_size;
    int hidden_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int intermediate_size;
    int max_positions;
    double rms_eps;
    int tie_embeddings;
    int attention_bias;     /* q/k/v projections carry biases */
    int mlp_bias;           /* MLP projections carry biases (not supported) */
    int sliding_window;     /* 0 = none */
    loom_rope_config rope;
    int bos_id;             /* -1 if unset */
    int eos_ids[LOOM_MAX_EOS];
    int n_eos;
    char hidden_act[32];

    /* Layer kinds: layer_types when given (has_layer_types), else all full. */
    unsigned char layer_types[LOOM_MAX_LAYERS];
    int has_layer_types;
    int sliding_pattern;            /* gemma3 sliding_window_pattern, 0 = unset */
    loom_rope_config rope_local;    /* sliding layers, when has_rope_local */
    int has_rope_local;
    double attn_softcap;            /* 0 = none */
    double final_softcap;           /* 0 = none */
    double query_pre_attn_scalar;   /* 0 = unset */

    /* Mixture of experts (0 experts = dense). */
    int n_experts;
    int n_experts_used;
    int moe_intermediate;
    int norm_topk_prob;
    int decoder_sparse_step;
    unsigned char mlp_only[LOOM_MAX_LAYERS];   /* 1 = dense MLP in that layer */
    int shared_expert_intermediate;            /* 0 = no shared expert */
    int enable_moe_block;                      /* gemma4 */

    /* Gated DeltaNet linear attention. */
    int lin_conv_kernel;
    int lin_n_k_heads, lin_n_v_heads;
    int lin_k_head_dim, lin_v_head_dim;

    /* Gemma 4. */
    int per_layer_input_dim;        /* hidden_size_per_layer_input, 0 = none */
    int vocab_per_layer;
    int n_kv_shared_layers;
    int global_head_dim;            /* 0 = head_dim */
    int attention_k_eq_v;           /* full layers: v = k, num_global_key_value_heads */
    int n_global_kv_heads;
    int double_wide_mlp;
    int per_layer_config;           /* non-empty per_layer_config given */
    int bidirectional;              /* use_bidirectional_attention set */

    /* generation_config.json: sampling defaults, the fields in
     * gen_sampling_set (LOOM_SAMPLING_* bits), loom_sampling_default() else. */
    loom_sampling gen_sampling;
    unsigned gen_sampling_set;

    /* sentence-transformers' Pooling module (modules.json), a loom_pooling;
     * LOOM_POOLING_NONE when the directory has none. */
    int pooling;

    /* Hugging Face FP8 (quantization_config quant_method "fp8", or
     * "fbgemm_fp8"): F8_E4M3 weights with f32/bf16 scales, activations in
     * f32 (dynamic scheme only). fp8_block 0 x 0: per-channel or
     * per-tensor, as each scale's shape says. modules_to_not_convert
     * become quant_overrides with bits 0. */
    int fp8;
    int fp8_block[2];               /* weight_block_size [rows, cols] */

    /* MLX affine quantization (bits 0 = not quantized). */
    int quant_bits, quant_group;
    int n_quant_overrides;
    loom_quant_override quant_overrides[LOOM_MAX_QUANT_OVERRIDES];
} loom_config;

/* Parses dir/config.json, and from dir/generation_config.json (when there)
 * more stop ids and the sampling defaults, and from modules.json (when
 * there) the embedding pooling. Errors name the missing or
 * malformed field. */
loom_status loom_config_load(const char *dir, loom_config *cfg);
/* Parses config JSON text (path is used in messages). */
loom_status loom_config_parse(const char *text, const char *path, loom_config *cfg);

#endif
