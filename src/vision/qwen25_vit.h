/* qwen25_vit: the vision tower of Qwen2.5-VL, from preprocessed patches
 * to rows in the text model's hidden size:
 *
 *   patches (N, C * T * P * P) -> linear patch embed (the Conv3d)
 *   -> permute merge units into windows (window_size / merge / patch units
 *      a side; the last window of a row or column is partial)
 *   -> depth x [RMSNorm -> attention with 2-D rotary (h, w), inside a
 *      window, or inside a whole frame on the fullatt_block_indexes blocks
 *      -> residual -> RMSNorm -> gated MLP with biases -> residual]
 *   -> merger: RMSNorm, merge^2 rows side by side, linear, GELU, linear
 *   -> merge units back in image order.
 *
 * Weights under "visual." (older checkpoints) or "model.visual."; the
 * patch order within an image is the image processor's (each merge^2
 * block of patches contiguous, blocks row-major). */
#ifndef LOOM_QWEN25_VIT_H
#define LOOM_QWEN25_VIT_H

#include <cjson/cJSON.h>

#include "model/model.h"

typedef struct loom_qwen25_vit loom_qwen25_vit;

/* Binds the tower to m's tensors (m->st; m->pool and m->k run it; m is
 * borrowed and must outlive the tower) from the vision_config of root
 * (config.json). out_dim is the text model's hidden size, which
 * out_hidden_size must equal. */
loom_status loom_qwen25_vit_load(loom_model *m, const cJSON *root, int out_dim,
                                 loom_qwen25_vit **out);
void loom_qwen25_vit_free(loom_qwen25_vit *v);

/* Floats per patch row of the pixel input (C * T * P * P). */
int loom_qwen25_vit_patch_dim(const loom_qwen25_vit *v);
/* Output rows of an image of grid (t, h, w): t * h * w / merge^2; 0 (error
 * set) when h or w is not a multiple of the merge size. */
int loom_qwen25_vit_tokens(const loom_qwen25_vit *v, const int grid[3]);

/* Intermediates, for tests (each NULL or (N, hidden) floats): the patch
 * embedding in image order, and the merger's input in window order. */
typedef struct loom_qwen25_vit_taps {
    float *patch_embed;
    float *merger_in;
} loom_qwen25_vit_taps;

/* Encodes n_images images: pixels (N, patch_dim) with N = sum t * h * w
 * over grids (n_images x {t, h, w}), into out (sum of the images' tokens,
 * out_dim), image after image. taps may be NULL. */
loom_status loom_qwen25_vit_encode(loom_qwen25_vit *v, const float *pixels, const int *grids,
                                   int n_images, float *out, const loom_qwen25_vit_taps *taps);

#endif
