/* siglip: the SigLIP vision tower with Gemma 3's multimodal projector,
 * from preprocessed images to rows in the text model's hidden size:
 *
 *   image (3, S, S) -> conv patch embed (P x P, stride P, bias)
 *   + learned position embedding per patch
 *   -> layers x [LayerNorm -> attention over all patches (q/k/v/out
 *      biases) -> residual -> LayerNorm -> fc1, GELU (tanh), fc2 -> residual]
 *   -> post LayerNorm
 *   -> average pool the (S/P)^2 patch grid to mm_tokens_per_image tokens
 *   -> RMSNorm (1 + w) -> projection to the text hidden size.
 *
 * Tower weights under "vision_tower.vision_model." (hub checkpoints),
 * "vision_tower." or either under "model."; the projector under
 * "multi_modal_projector." or "model.multi_modal_projector.". */
#ifndef LOOM_SIGLIP_H
#define LOOM_SIGLIP_H

#include <cjson/cJSON.h>

#include "model/model.h"

typedef struct loom_siglip loom_siglip;

/* Binds the tower and projector to m's tensors (m->st; m->pool and m->k
 * run it; m is borrowed and must outlive it) from root's vision_config and
 * mm_tokens_per_image (config.json). out_dim is the text hidden size. */
loom_status loom_siglip_load(loom_model *m, const cJSON *root, int out_dim, loom_siglip **out);
void loom_siglip_free(loom_siglip *v);

/* The side S of the square images it takes. */
int loom_siglip_image_size(const loom_siglip *v);
/* Output rows per image (mm_tokens_per_image). */
int loom_siglip_tokens(const loom_siglip *v);

/* Intermediates, for tests (each NULL or (n_images * patches, hidden)):
 * the embeddings (patches + positions) and the post layer norm output. */
typedef struct loom_siglip_taps {
    float *embeddings;
    float *post_layernorm;
} loom_siglip_taps;

/* Encodes n_images images, pixels (n_images, 3, S, S) as the image
 * processor gives them, into out (n_images * tokens, out_dim). taps may be
 * NULL. */
loom_status loom_siglip_encode(loom_siglip *v, const float *pixels, int n_images, float *out,
                               const loom_siglip_taps *taps);

#endif
