/* vision: the image side of a vision-language model: its tower (patches ->
 * features in the text model's hidden size), and the prepared prompt a
 * forward takes (model/fwd_row.h): text embeddings with the image features
 * spliced in at the placeholder tokens, the prompt's own rope positions and
 * deepstack features.
 *
 * Each family is one row of the table in vision.c (architecture name ->
 * its tower's load / encode / free and its position rule); a tower lives in
 * its own file: qwen_vit.c (Qwen3-VL, Qwen3.5), qwen25_vit.c (Qwen2.5-VL,
 * window attention), siglip.c (Gemma 3: SigLIP and its projector), their
 * shared pieces in vit.c. Qwen towers read model.visual.* or visual.*;
 * SigLIP vision_tower.* and multi_modal_projector.* (also under model.).
 * Qwen prompts own M-RoPE positions; a Gemma 3 prompt keeps plain positions
 * and makes each image's tokens one bidirectional span (groups). */
#ifndef LOOM_VISION_H
#define LOOM_VISION_H

#include <stdint.h>

#include "model/fwd_row.h"
#include "model/model.h"

/* One image as the tower takes it: the image processor's patches in its
 * order (for Qwen: frames, then 2x2 merge blocks row by row, then the
 * patches inside a block), grid = (t, h, w) in patches; for Gemma 3 the
 * (3, S, S) pixel plane, grid (1, 1, 1). */
typedef struct loom_vision_image {
    const float *pixels;     /* (t * h * w, patch_dim) borrowed */
    int grid[3];
    const float *features;   /* or NULL; borrowed: the tower's output for it already,
                                (tokens, out_hidden) then deepstack (n_deep, tokens,
                                out_hidden); pixels are then not read */
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
    int tokens_per_image;    /* > 0: every image gives this many (grid 1, 1, 1; Gemma 3) */
    int out_hidden;          /* feature width (the text model's hidden size) */
    int n_deep;              /* deepstack planes (0: none) */
    int mrope;               /* the prompt owns M-RoPE positions (Qwen rule) */
    int spans;               /* each image's tokens are one bidirectional span */
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

/* The FLOPs the tower spends on one image of grid, counted from the
 * shapes: 2 per multiply-add of every matmul (patch embed, blocks,
 * mergers, projector) and of attention's two products over each segment;
 * norms, activations and rotary are left out. 0 for a grid the tower
 * cannot take. */
double loom_vision_flops(const loom_vision *v, const int grid[3]);

/* Positions of a prompt. Without M-RoPE (Gemma 3): 0 .. n - 1 on all three
 * streams, delta 0. M-RoPE (Qwen's get_rope_index rule): text tokens count on from
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
    int32_t *groups;         /* owned (n): image k's tokens k, -1 elsewhere; or NULL */
    loom_fwd_input in;       /* points at the arrays above */
} loom_vision_prompt;

/* Builds the prepared prompt of ids (placeholders already repeated) with
 * n_img images, in order, each encoded unless it has features. An image
 * whose pixels and features are NULL is not encoded:
 * its placeholders keep their text embeddings and zero deepstack rows (for
 * a caller that holds their KV already, e.g. from a prefix cache). */
loom_status loom_vision_prompt_build(loom_vision *v, const int32_t *ids, int n,
                                     const loom_vision_image *imgs, int n_img,
                                     loom_vision_prompt *out);
void loom_vision_prompt_free(loom_vision_prompt *p);

/* The chunk size to prefill p with, for a caller that would take chunks
 * of n_batch (a context's n_batch): n_batch when p has no spans or no
 * multiple of it falls inside one, else the largest size below it whose
 * cuts split no span (a forward refuses a row that starts or ends inside
 * one), else p->n (the prompt in one row). */
int loom_vision_prompt_batch(const loom_vision_prompt *p, int n_batch);

#endif
