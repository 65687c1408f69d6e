/* vision_int: what a tower file sees of the vision module: the family
 * row it fills in and the loaded vision state (the pieces towers share are
 * vit.h's). Not part of the model API. */
#ifndef LOOM_VISION_INT_H
#define LOOM_VISION_INT_H

#include <cjson/cJSON.h>

#include "vision/vision.h"

/* One family of towers (a row of vision.c's table). */
typedef struct loom_vision_family {
    const char *arch;        /* architectures[0] of config.json */
    /* Reads vision_config (vc; root is the whole config.json) and the
     * weights into v->tower, fills v->info's tower fields (patch sizes,
     * merge or tokens_per_image, out_hidden, n_deep). */
    loom_status (*load)(loom_vision *v, const cJSON *root, const cJSON *vc);
    loom_status (*encode)(loom_vision *v, const loom_vision_image *img, float *embeds,
                          float *deep);
    void (*free)(void *tower);
    /* FLOPs of one image (loom_vision_flops) */
    double (*flops)(const loom_vision *v, const int grid[3]);
    int mrope;               /* the prompt takes M-RoPE positions (Qwen rule) */
    int spans;               /* each image's tokens attend both ways (Gemma 3) */
} loom_vision_family;

struct loom_vision {
    const loom_vision_family *fam;
    loom_vision_info info;
    loom_model *m;           /* borrowed: pool, kernels, embeddings, safetensors */
    void *tower;             /* owned by fam */
    /* Tests: when set, a tower copies its patch embeddings (before the
     * position embeddings) and the merger's input there, (patches, D). */
    float *tap_patch, *tap_merge_in;
};

#endif
