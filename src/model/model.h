/* model: the blueprint (config + architecture description + per-layer
 * plan) and the weights, bound to tensors of the mapped safetensors by
 * their Hugging Face names. Weights are borrowed from the mapping; the
 * small vectors (norms, biases, conv kernels) are converted to f32 once and
 * owned.
 *
 * Every supported family is one row of the architecture table: flags say
 * which building blocks the decoder wires together (norm style, sandwich
 * norms, q/k norms, gated attention, MoE, linear attention, per-layer
 * inputs). The forward pass reads the flags and the per-layer plan; it never
 * branches on architecture names. */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "load/config.h"
#include "load/safetensors.h"
#include "ops/ops.h"
#include "ops/threadpool.h"

enum {
    LOOM_ARCH_QKV_BIAS = 1 << 0,     /* q/k/v projections always have biases */
    LOOM_ARCH_QK_NORM = 1 << 1,      /* RMSNorm on q and k per head */
    LOOM_ARCH_CFG_BIAS = 1 << 2,     /* q/k/v/o biases when attention_bias */
    LOOM_ARCH_SLIDING = 1 << 3,      /* config.sliding_window applies to every layer */
    LOOM_ARCH_NORM_1P = 1 << 4,      /* norm weights are stored as w - 1: scale by 1 + w */
    LOOM_ARCH_SANDWICH = 1 << 5,     /* gemma: norms before and after attention and MLP */
    LOOM_ARCH_EMBED_SCALE = 1 << 6,  /* embeddings times sqrt(hidden) */
    LOOM_ARCH_QPAS = 1 << 7,         /* softmax scale from query_pre_attn_scalar */
    LOOM_ARCH_UNIT_SCALE = 1 << 8,   /* softmax scale 1 (q/k norms carry it) */
    LOOM_ARCH_V_NORM = 1 << 9,       /* unweighted RMSNorm on v per head */
    LOOM_ARCH_ATTN_GATE = 1 << 10,   /* q_proj also yields a sigmoid output gate */
    LOOM_ARCH_MOE = 1 << 11,         /* sparse MoE MLP where num_experts > 0 */
    LOOM_ARCH_LINEAR = 1 << 12,      /* Gated DeltaNet layers, split projections */
    LOOM_ARCH_LINEAR_FUSED = 1 << 13,/* ... with qkvz/ba projections grouped by key head */
    LOOM_ARCH_PLE = 1 << 14,         /* gemma4 per-layer input embeddings */
    LOOM_ARCH_LAYER_SCALAR = 1 << 15,/* gemma4 per-layer output scalar */
    LOOM_ARCH_ALT_SLIDING = 1 << 16, /* no layer_types: even layers slide (gemma2) */
    LOOM_ARCH_PATTERN_SLIDING = 1 << 17, /* no layer_types: sliding_window_pattern (gemma3) */
    LOOM_ARCH_MOE_BESIDE = 1 << 18,  /* enable_moe_block: MoE beside the dense MLP (gemma4) */
};

typedef struct loom_arch {
    const char *name;
    unsigned flags;
} loom_arch;

/* Returns the description for an architecture name, or NULL. */
const loom_arch *loom_arch_find(const char *name);

/* A 2-D weight [rows = out features, cols = in features], borrowed. */
typedef struct loom_weight {
    loom_dtype dtype;          /* F32, F16, BF16, U32 = MLX affine-quantized (q), or
                                  F8_E4M3 = FP8 with block scales (f8) */
    int rows, cols;
    const void *data;          /* (rows, cols) in the mapping; q.w / f8.w when quantized */
    loom_qmat q;               /* when dtype == U32 */
    loom_f8mat f8;             /* when dtype == F8_E4M3 */
} loom_weight;

typedef enum loom_act { LOOM_ACT_SILU, LOOM_ACT_GELU_TANH } loom_act;

/* Rope for one kind of layer: dims (i, i + rot_dim/2) rotate together by
 * position * inv_freq[i]; inv_freq 0 leaves a pair unrotated. */
typedef struct loom_rope {
    int rot_dim;
    double *inv_freq;          /* owned [rot_dim / 2] */
    double scale;              /* multiplies cos/sin (yarn attention factor) */
    /* M-RoPE: pair i turns by position stream stream[i] (0 t, 1 h, 2 w) of
     * the token; NULL = plain rope (one position). */
    unsigned char *stream;     /* owned [rot_dim / 2] or NULL */
} loom_rope;

typedef struct loom_mlp {
    loom_weight gate, up;      /* (inter, hidden) */
    loom_weight down;          /* (hidden, inter) */
} loom_mlp;

typedef struct loom_moe {
    loom_weight router;        /* (n_experts, hidden) */
    loom_mlp *experts;         /* owned [n_experts]; weights borrowed */
    loom_mlp shared;           /* shared expert (gate.rows 0 when none) */
    loom_weight shared_gate;   /* (1, hidden): sigmoid weight of the shared expert */
    int renorm;                /* top-k weights renormalised to sum 1 */
    /* gemma4 router: input rmsnorm (no weight) * in_scale; weights * expert_scale */
    const float *in_scale;     /* (hidden) already times hidden^-0.5, or NULL; owned */
    const float *expert_scale; /* (n_experts) or NULL; owned */
} loom_moe;

/* Softmax attention over the paged KV cache. */
typedef struct loom_attn {
    loom_weight wq;            /* (n_heads * head_dim * (gated ? 2 : 1), hidden) */
    loom_weight wk, wv;        /* (n_kv_heads * head_dim, hidden) */
    loom_weight wo;            /* (hidden, n_heads * head_dim) */
    const float *bq, *bk, *bv; /* or NULL; owned */
    const float *bo;           /* (hidden) or NULL; owned */
    const float *q_norm;       /* (head_dim) or NULL; owned */
    const float *k_norm;       /* (head_dim) or NULL; owned */
    int head_dim;
    int n_kv_heads;
    int k_eq_v;                /* no v_proj: values are the raw keys (gemma4 full layers) */
    int window;                /* sliding window in tokens, 0 = full */
    int rope;                  /* index into loom_model.ropes */
    int kv_layer;              /* layer whose KV this layer reads (itself unless shared) */
    float scale;               /* softmax scale */
} loom_attn;

/* Gated DeltaNet: causal depthwise conv over [q | k | v], then the gated
 * delta rule per value head, then a gated RMSNorm. */
typedef struct loom_linattn {
    loom_weight in_qkv, in_z, in_b, in_a;  /* split projections (qwen3.5) */
    loom_weight in_qkvz, in_ba;            /* grouped projections (qwen3-next) */
    int fused;
    const float *conv;         /* (conv_dim, kernel) owned */
    const float *neg_a;        /* (n_v) -exp(A_log), owned */
    const float *dt_bias;      /* (n_v) owned */
    const float *norm;         /* (v_dim) owned */
    loom_weight out;           /* (hidden, n_v * v_dim) */
    int slot;                  /* index among the linear layers (recurrent state) */
} loom_linattn;

typedef struct loom_layer {
    loom_layer_type kind;
    const float *attn_norm;       /* (hidden) before the token mixer; owned */
    const float *post_attn_norm;  /* (hidden) after it (sandwich), or NULL */
    const float *ffn_norm;        /* (hidden) before the MLP */
    const float *post_ffn_norm;   /* (hidden) after it (sandwich), or NULL */
    loom_attn attn;               /* kind FULL or SLIDING */
    loom_linattn lin;             /* kind LINEAR */
    int is_moe;                   /* the MLP is the routed MoE (qwen) */
    int moe_beside;               /* dense MLP plus a MoE block beside it (gemma4) */
    loom_mlp mlp;                 /* dense MLP unless is_moe */
    loom_moe moe;
    const float *post_ffn_norm1;  /* gemma4 MoE block: after the dense MLP */
    const float *pre_moe_norm;    /* ... before the experts */
    const float *post_moe_norm;   /* ... after the experts */
    /* gemma4 per-layer input */
    loom_weight ple_gate;         /* (ple_dim, hidden) */
    loom_weight ple_proj;         /* (hidden, ple_dim) */
    const float *ple_norm;        /* (hidden) */
    float out_scale;              /* layer_scalar, 1 when absent */
} loom_layer;

#define LOOM_MAX_ROPES 2

struct loom_model {
    loom_config cfg;
    int device;                /* -1 CPU, else the CUDA device forwards run on */
    const loom_arch *arch;
    loom_safetensors *st;      /* owned; every loom_weight points into it */
    char prefix[32];           /* replaces "model." in tensor names ("" = none) */
    char head_prefix[32];      /* goes before "lm_head." ("" = none) */
    loom_weight embed;         /* (vocab, hidden) */
    float embed_scale;         /* 1, or sqrt(hidden) rounded to the weights' dtype */
    loom_weight lm_head;       /* (vocab, hidden); = embed when tied */
    const float *final_norm;   /* (hidden) owned */
    loom_layer *layers;        /* owned [n_layers] */
    float *arena;              /* owned: every f32 vector above */
    size_t arena_used, arena_cap;
    float *f8_scales;          /* owned: every FP8 weight's scales as f32 */
    size_t f8_used, f8_cap;
    int n_f8;                  /* FP8 weights bound */
    loom_rope ropes[LOOM_MAX_ROPES];
    int n_ropes;
    loom_act act;
    /* Derived sizes the forward state is carved by. */
    int max_head_dim;          /* over attention layers */
    int kv_dim;                /* max n_kv_heads * head_dim over attention layers */
    int max_q_dim;             /* max q_proj rows */
    int max_inter;             /* max MLP width (dense, expert, shared) */
    int n_linear;              /* linear-attention layers */
    int lin_conv_dim;          /* 2 * n_k * k_dim + n_v * v_dim */
    int lin_proj_dim;          /* conv_dim + v_dim * n_v + 2 * n_v */
    /* gemma4 per-layer inputs */
    loom_weight ple_embed;     /* (vocab_per_layer, n_layers * ple_dim) */
    loom_weight ple_model_proj;/* (n_layers * ple_dim, hidden) */
    const float *ple_proj_norm;/* (ple_dim) */
    float ple_embed_scale;     /* sqrt(ple_dim) in the weights' dtype */
    int has_ple;
    loom_pool *pool;           /* owned */
    const loom_kernels *k;     /* borrowed, static */
    uint8_t *il_mem;           /* owned: the matrices on 2 MiB pages, quantized ones re-laid out for k */
    int quant_bits;            /* loom_model_params.quantize_bits */
    int tp_n;                  /* tensor-parallel ranks (0: one device) */
    int tp_devices[8];         /* their devices */
    /* A DFlashDraftModel checkpoint loads as a model of nothing but this
     * (and cfg.arch, cfg.vocab_size): a drafter, not a decoder */
    struct loom_dflash *dflash; /* owned, or NULL */
};

/* KV row width a pool for this model needs (max over attention layers). */
int loom_model_kv_dim(const loom_model *m);

#endif
