/* vision: the image side of a vision-language model: its tower (patches ->
 * features in the text model's hidden size), and the prepared prompt a
 * forward takes (model/fwd_row.h): text embeddings with the image features
 * spliced in at the placeholder tokens, the prompt's own rope positions and
 * deepstack features.
 *
 * Each family is one row of the table in vision.c (architecture name ->
 * its tower's load / encode / free and its position rule); a tower lives in
 * its own file (qwen_vit.c: Qwen3-VL and Qwen3.5). The tower's weights are
 * read from the same safetensors as the text model, under the hub spelling
 * `model.visual.*` or the older `visual.*`. */
#ifndef LOOM_VISION_H
#define LOOM_VISION_H

#include <stdint.h>

#include "model/fwd_row.h"
#include "model/model.h"

/* One image as the tower takes it: the image processor's patches in its
 * order (for Qwen: frames, then 2x2 merge blocks row by row, then the
 * patches inside a block), grid = (t, h, w) in patches. */
typedef struct loom_vision_image {
    const float *pixels;     /* (t * h * w, patch_dim) borrowed */
    int grid[3];
} loom_vision_image;

/* What the prompt side needs to know of the model (config.json). */
typedef struct loom_vision_info {
    int image_token;         /* image_token_id: one placeholder per image token */
    int video_token;         /* video_token_id, -1 if none */
    int vision_start;        /* vision_start_token_id, -1 if none */
    int vision_end;          /* vision_end_token_id, -1 if none */
    int patch, temporal_patch, in_channels;
    int patch_dim;           /* in_channels * temporal_patch * patch^2 */
    int merge;               /* spatial_merge_size: tokens = t * h * w / merge^2 */
    int out_hidden;          /* feature width (the text model's hidden size) */
    int n_deep;              /* deepstack planes (0: none) */
    int mrope;               /* the prompt owns M-RoPE positions (Qwen rule) */
} loom_vision_info;

typedef struct loom_vision loom_vision;

/* The tower of the model in dir, for text model m (its thread pool and
 * kernels; m must outlive it). *out is NULL and the call succeeds when the
 * config has no vision_config; an architecture with a vision_config but no
 * tower here is LOOM_ERR_UNSUPPORTED. */
loom_status loom_vision_load(loom_model *m, const char *dir, loom_vision **out);
void loom_vision_free(loom_vision *v);
const loom_vision_info *loom_vision_get_info(const loom_vision *v);

/* Image tokens (placeholders in the prompt) a grid gives; 0 for a grid the
 * tower cannot take (non-positive, or h, w not multiples of merge). */
int loom_vision_tokens(const loom_vision_info *vi, const int grid[3]);

/* Runs the tower over one image: embeds (tokens, out_hidden) and, when the
 * model has deepstack planes and deep is not NULL, deep (n_deep, tokens,
 * out_hidden). */
loom_status loom_vision_encode(loom_vision *v, const loom_vision_image *img, float *embeds,
                               float *deep);

/* M-RoPE positions of a prompt (Qwen's rule): text tokens count on from
 * the last position in all three streams; image k's placeholders (the next
 * run of image_token, tokens(grid k) long) take (t, h, w) over its merged
 * grid from the position after the text before it; *delta = max + 1 - n
 * (decode continues at KV position + delta). pos3 is (3, n). A placeholder
 * count that does not match the grids is an error naming both. */
loom_status loom_vision_positions(const loom_vision_info *vi, const int32_t *ids, int n,
                                  const int (*grids)[3], int n_img, int32_t *pos3, int *delta);

/* A prepared prompt: owned arrays, and the view a forward takes. */
typedef struct loom_vision_prompt {
    int n;                   /* tokens */
    float *embeds;           /* owned (n, hidden) */
    int32_t *pos3;           /* owned (3, n), or NULL without M-RoPE */
    float *deepstack;        /* owned (n_deep, n, hidden), or NULL */
    loom_fwd_input in;       /* points at the arrays above */
} loom_vision_prompt;

/* Builds the prepared prompt of ids (placeholders already repeated) with
 * n_img images, in order. An image whose pixels is NULL is not encoded:
 * its placeholders keep their text embeddings and zero deepstack rows (for
 * a caller that holds their KV already, e.g. from a prefix cache). */
loom_status loom_vision_prompt_build(loom_vision *v, const int32_t *ids, int n,
                                     const loom_vision_image *imgs, int n_img,
                                     loom_vision_prompt *out);
void loom_vision_prompt_free(loom_vision_prompt *p);

#endif
