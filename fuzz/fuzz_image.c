/* libFuzzer target: image decoding (loom_image_decode_max) and the image
 * processors (loom_imgproc_run) on a file's bytes.
 *
 * Input: byte 0 picks the processor (bits 0-1: none, a Qwen2-VL one with
 * patch 14, a Qwen3-VL one with patch 16 and tight pixel bounds, Gemma 3
 * at 32 x 32; bit 2: the PIL backend); the rest is a PNG or JPEG file. A decode either fails with
 * a zeroed image and a message, or returns w x h within the pixel limit
 * with every byte readable; decoding again gives the same pixels and hash.
 * A processor's output has the shape its plan states (and that
 * loom_imgproc_plan_image gives from the size alone), the token count
 * grid_t*grid_h*grid_w/merge^2 (Qwen) or 16 (Gemma), sides in multiples
 * of patch x merge within max_pixels (Qwen), and only finite values
 * within what levels 0 and 255 normalise to. */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "vision/image.h"
#include "vision/imgproc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Small enough that a fuzzed header cannot make one input slow. */
#define FUZZ_MAX_PIXELS (1u << 18)

static const char *configs[] = {
    NULL,
    "{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 14, \"merge_size\": 2,"
    " \"temporal_patch_size\": 2, \"min_pixels\": 3136, \"max_pixels\": 50176}",
    "{\"image_processor_type\": \"Qwen2VLImageProcessorFast\", \"patch_size\": 16, \"merge_size\": 2,"
    " \"temporal_patch_size\": 2, \"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0.5, 0.5],"
    " \"size\": {\"shortest_edge\": 1024, \"longest_edge\": 4096}}",
    "{\"image_processor_type\": \"Gemma3ImageProcessor\", \"size\": {\"height\": 32, \"width\": 32},"
    " \"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0.5, 0.5]}",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3, pil = data[0] & 4;
    data++, size--;
    loom_image im = {.w = -1};
    loom_status s = loom_image_decode_max(data, size, FUZZ_MAX_PIXELS, &im);
    if (s != LOOM_OK) {
        assert(im.rgb == NULL && im.w == 0 && im.h == 0 && loom_last_error()[0]);
        return 0;
    }
    assert(im.w > 0 && im.h > 0 && (uint64_t)im.w * im.h <= FUZZ_MAX_PIXELS && im.rgb);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < (size_t)im.w * im.h * 3; i++) sink ^= im.rgb[i];
    (void)sink;
    loom_image again;
    assert(loom_image_decode_max(data, size, FUZZ_MAX_PIXELS, &again) == LOOM_OK);
    assert(again.w == im.w && again.h == im.h && !memcmp(again.rgb, im.rgb, (size_t)im.w * im.h * 3));
    assert(loom_image_hash(&again) == loom_image_hash(&im));
    loom_image_free(&again);
    if (configs[which]) {
        loom_imgproc p;
        assert(loom_imgproc_parse(configs[which], NULL, &p) == LOOM_OK);
        p.tokens_per_image = 16;
        p.backend = pil ? LOOM_IMGPROC_PIL : LOOM_IMGPROC_TORCHVISION;
        loom_imgproc_plan plan;
        loom_status ps = loom_imgproc_plan_image(&p, im.w, im.h, &plan);
        loom_imgproc_out o;
        s = loom_imgproc_run(&p, &im, &o);
        assert(s == ps);
        if (s != LOOM_OK) {
            /* only Qwen refuses an image: an aspect ratio over 200 */
            assert(p.kind == LOOM_IMGPROC_QWEN2VL && o.pixel_values == NULL && loom_last_error()[0]);
        } else {
            assert(!memcmp(&o.plan, &plan, sizeof plan));
            size_t n = 1;
            for (int d = 0; d < plan.ndim; d++) n *= (size_t)plan.shape[d];
            assert(n == o.n && o.pixel_values);
            if (p.kind == LOOM_IMGPROC_QWEN2VL) {
                assert(plan.resized_w % (p.patch_size * p.merge_size) == 0);
                assert(plan.resized_h % (p.patch_size * p.merge_size) == 0);
                assert((int64_t)plan.resized_w * plan.resized_h <= p.max_pixels ||
                       plan.resized_w == p.patch_size * p.merge_size ||
                       plan.resized_h == p.patch_size * p.merge_size);
                assert(plan.n_tokens * p.merge_size * p.merge_size == plan.grid_t * plan.grid_h * plan.grid_w);
            } else {
                assert(plan.n_tokens == 16 && plan.resized_w == 32 && plan.resized_h == 32);
            }
            /* mean/std 0.5 give [-1, 1]; CLIP's [-1.80, 2.15] */
            for (size_t i = 0; i < o.n; i++) {
                float v = o.pixel_values[i];
                assert(isfinite(v) && v >= -2.0f && v <= 2.2f);
            }
        }
        loom_imgproc_out_free(&o);
    }
    loom_image_free(&im);
    return 0;
}
