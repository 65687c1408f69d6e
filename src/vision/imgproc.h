/* imgproc: the Hugging Face image processors of vision-language models,
 * from a model directory's preprocessor_config.json: an RGB image in,
 * the pixel_values tensor the vision tower takes out.
 *
 * Types:
 *   - Qwen2VLImageProcessor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5):
 *     smart_resize to multiples of patch_size * merge_size with the pixel
 *     count kept within [min_pixels, max_pixels], bicubic resize, rescale
 *     and normalise, the image repeated temporal_patch_size times and cut
 *     into patches: pixel_values (grid_t*grid_h*grid_w, 3*T*P*P), rows in
 *     HF's order (merge windows of merge x merge patches, row-major inside
 *     and between windows), each row channel-major then t, y, x.
 *   - Gemma3ImageProcessor: bilinear resize to size.height x size.width,
 *     rescale, normalise: pixel_values (3, H, W).
 *
 * The result matches the torchvision processor (the one AutoImageProcessor
 * loads: transformers' *ImageProcessorFast) bit for bit where its resize
 * does: the uint8 resize with antialiasing (torch's separable
 * horizontal-then-vertical filter with int16 weights, each pass rounded and
 * clamped to uint8), then (x - mean*255) / (std*255) in float32. The PIL
 * processor (transformers' *ImageProcessorPil, use_fast=False), which
 * differs from it by a level here and there, is matched with backend
 * LOOM_IMGPROC_PIL: PIL's resize (22-bit weights), x/255 rounded to
 * float32, then (x - mean) / std. */
#ifndef LOOM_VISION_IMGPROC_H
#define LOOM_VISION_IMGPROC_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "vision/image.h"

typedef enum loom_imgproc_kind {
    LOOM_IMGPROC_QWEN2VL,  /* Qwen2VLImageProcessor (and its Fast name) */
    LOOM_IMGPROC_GEMMA3,   /* Gemma3ImageProcessor */
} loom_imgproc_kind;

/* Which of transformers' two implementations of a processor to match. */
typedef enum loom_imgproc_backend {
    LOOM_IMGPROC_TORCHVISION,  /* the default one (AutoImageProcessor) */
    LOOM_IMGPROC_PIL,          /* the PIL one (use_fast=False) */
} loom_imgproc_backend;

/* PIL's resample numbers, as preprocessor_config.json writes them. */
enum { LOOM_RESAMPLE_BILINEAR = 2, LOOM_RESAMPLE_BICUBIC = 3 };

typedef struct loom_imgproc {
    loom_imgproc_kind kind;
    loom_imgproc_backend backend;  /* TORCHVISION after loading; callers may switch */
    int do_resize, do_rescale, do_normalize;
    int resample;              /* LOOM_RESAMPLE_* */
    double rescale_factor;
    float image_mean[3], image_std[3];
    /* Qwen2VL */
    int patch_size, merge_size, temporal_patch_size;
    int64_t min_pixels, max_pixels;  /* size.shortest_edge/longest_edge or min_pixels/max_pixels */
    /* Gemma3 */
    int height, width;
    int tokens_per_image;      /* mm_tokens_per_image (config.json); 0 if not given */
} loom_imgproc;

/* Reads DIR/preprocessor_config.json (and, for Gemma, mm_tokens_per_image
 * from DIR/config.json). Fields HF defaults when absent are defaulted the
 * same way (mean/std, rescale, resample, min/max pixels); the geometry
 * (image_processor_type, patch_size, merge_size, temporal_patch_size for
 * Qwen; size.height/width for Gemma) must be present. Bad values give
 * LOOM_ERR_FORMAT naming the field, what was expected and what was found;
 * options loom does not implement (pan and scan, other resamplers)
 * LOOM_ERR_UNSUPPORTED. */
loom_status loom_imgproc_load(const char *model_dir, loom_imgproc *out);
/* The same from the JSON text of a preprocessor_config.json; config_json
 * (may be NULL) is the model's config.json text. */
loom_status loom_imgproc_parse(const char *json, const char *config_json, loom_imgproc *out);

/* What one image becomes, from its size alone. */
typedef struct loom_imgproc_plan {
    int resized_w, resized_h;  /* after the resize */
    int grid_t, grid_h, grid_w;  /* Qwen: in patches; Gemma: 1, 1, 1 */
    int n_tokens;              /* placeholder tokens the prompt needs */
    int ndim;                  /* of pixel_values: 2 (Qwen) or 3 (Gemma) */
    int64_t shape[3];
} loom_imgproc_plan;

/* Plans an image of w x h. LOOM_ERR_INVALID_ARG for an image the
 * processor refuses (aspect ratio over 200 for Qwen, a side that does not
 * divide into patches without resize). */
loom_status loom_imgproc_plan_image(const loom_imgproc *p, int w, int h, loom_imgproc_plan *out);

typedef struct loom_imgproc_out {
    loom_imgproc_plan plan;
    float *pixel_values;       /* owned; plan.shape, row-major */
    size_t n;                  /* number of floats */
} loom_imgproc_out;

/* Runs the processor on img. *out is zeroed first; free with
 * loom_imgproc_out_free. */
loom_status loom_imgproc_run(const loom_imgproc *p, const loom_image *img, loom_imgproc_out *out);
void loom_imgproc_out_free(loom_imgproc_out *o);

/* The uint8 resize alone (the one loom_imgproc_run does), into a new
 * image: resample LOOM_RESAMPLE_BILINEAR or _BICUBIC, antialiased when
 * shrinking, as torchvision or PIL does it. */
loom_status loom_image_resize(const loom_image *img, int w, int h, int resample, loom_imgproc_backend backend,
                              loom_image *out);

#endif
