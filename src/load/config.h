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
} loom_rope_type;

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
    int sliding_window;     /* 0 = none */
    loom_rope_config rope;
    int bos_id;             /* -1 if unset */
    int eos_ids[LOOM_MAX_EOS];
    int n_eos;
    char hidden_act[32];
} loom_config;

/* Parses dir/config.json. Errors name the missing or malformed field. */
loom_status loom_config_load(const char *dir, loom_config *cfg);
/* Parses config JSON text (path is used in messages). */
loom_status loom_config_parse(const char *text, const char *path, loom_config *cfg);

#endif
