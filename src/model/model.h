/* model: the blueprint (config + architecture description) and the
 * weights, bound to tensors of the mapped safetensors by their Hugging Face
 * names. Weights are borrowed from the mapping; the few small vectors
 * (norms, biases) are converted to f32 once and owned. */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "load/config.h"
#include "load/safetensors.h"
#include "ops/ops.h"
#include "ops/threadpool.h"

/* What an architecture wires together. One entry per HF architecture name;
 * the forward pass reads these flags instead of branching on names. */
enum {
    LOOM_ARCH_QKV_BIAS = 1 << 0,     /* q/k/v projections always have biases */
    LOOM_ARCH_QK_NORM = 1 << 1,      /* RMSNorm on q and k per head */
    LOOM_ARCH_CFG_BIAS = 1 << 2,     /* q/k/v/o biases when attention_bias */
    LOOM_ARCH_SLIDING = 1 << 3,      /* config.sliding_window applies */
};

typedef struct loom_arch {
    const char *name;
    unsigned flags;
} loom_arch;

/* Returns the description for an architecture name, or NULL. */
const loom_arch *loom_arch_find(const char *name);

/* A 2-D weight [rows = out features, cols = in features], borrowed. */
typedef struct loom_weight {
    loom_dtype dtype;          /* F32, F16 or BF16 */
    int rows, cols;
    const void *data;          /* (rows, cols) in the mapping */
} loom_weight;

typedef struct loom_layer {
    const float *attn_norm;    /* (hidden) owned */
    loom_weight wq;            /* (n_heads*head_dim, hidden) */
    loom_weight wk, wv;        /* (n_kv_heads*head_dim, hidden) */
    loom_weight wo;            /* (hidden, n_heads*head_dim) */
    const float *bq, *bk, *bv; /* (q_dim), (kv_dim), (kv_dim) or NULL; owned */
    const float *bo;           /* (hidden) or NULL; owned */
    const float *q_norm;       /* (head_dim) or NULL; owned */
    const float *k_norm;       /* (head_dim) or NULL; owned */
    const float *ffn_norm;     /* (hidden) owned */
    loom_weight w_gate, w_up;  /* (intermediate, hidden) */
    loom_weight w_down;        /* (hidden, intermediate) */
    int window;                /* sliding window in tokens, 0 = full */
} loom_layer;

struct loom_model {
    loom_config cfg;
    const loom_arch *arch;
    loom_safetensors *st;      /* owned; every loom_weight points into it */
    loom_weight embed;         /* (vocab, hidden) */
    loom_weight lm_head;       /* (vocab, hidden); = embed when tied */
    const float *final_norm;   /* (hidden) owned */
    loom_layer *layers;        /* owned [n_layers] */
    float *arena;              /* owned: every f32 vector above */
    size_t arena_used, arena_cap;
    int rot_dim;               /* rotated dims per head (partial rope) */
    double *inv_freq;          /* owned [rot_dim/2] */
    double rope_scale;         /* multiplies cos/sin (yarn attention factor) */
    float attn_scale;          /* softmax scale, 1/sqrt(head_dim) */
    loom_pool *pool;           /* owned */
    const loom_kernels *k;     /* borrowed, static */
};

#endif
