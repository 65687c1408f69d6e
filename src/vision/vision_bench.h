/* vision_bench: one image through a vision-language model, timed: the
 * measuring side of bench/bench_vision and `loom bench --image`.
 *
 * In order:
 * 1. Validation: the image is decoded and preprocessed, the tower encodes
 *    it twice (finite, and the same bits both times), and the prompt built
 *    around it prefills to finite logits.
 * 2. The peer: the model's own matmul (loom_fwd_matmul on the pool) over a
 *    [1280, 1280] weight of the tower's dtype with T = 1024 rows, the
 *    achievable peak of this CPU for the tower's work, measured in the
 *    same run.
 * 3. Timed, median of R after one warm-up: preprocessing (decode + resize
 *    + patches), the tower's encode, and the time to the first token: file
 *    to first greedy token (decode, preprocess, encode, prompt build,
 *    prefill of a short prompt holding the image's placeholders).
 *    The tower's FLOPs per image are counted from its shapes
 *    (loom_vision_flops); GFLOP/s and the share of the peer follow. */
#ifndef LOOM_VISION_BENCH_H
#define LOOM_VISION_BENCH_H

#include "base/buf.h"
#include "model/model.h"
#include "vision/vision.h"

typedef struct loom_vision_bench {
    int resized_w, resized_h;  /* the image after the processor's resize */
    int grid[3], tokens;       /* its grid and image tokens */
    int prompt_tokens;         /* of the first-token prompt */
    int threads;               /* the model's pool */
    int first;                 /* the first greedy token (the same every run) */
    loom_dtype dtype;          /* most of the tower's bytes */
    double tower_gflop;        /* per image, from the shapes */
    double preprocess_s, encode_s, ttft_s; /* medians */
    double encode_gflops, peer_gflops;
} loom_vision_bench;

/* Validates, measures the peer and times reps runs (after a warm-up) of
 * image (a PNG or JPEG file) through tower v of model m, whose directory
 * is model_dir (its preprocessor_config.json). A failed validation is
 * LOOM_ERR_INTERNAL saying what was wrong. */
loom_status loom_vision_bench_run(loom_model *m, loom_vision *v, const char *model_dir,
                                  const char *image, int reps, loom_vision_bench *out);

/* b as text lines, or one JSON object (a line) when json, appended to out;
 * model and image name the run. */
void loom_vision_bench_format(const loom_vision_bench *b, const char *model, const char *image,
                              int json, loom_buf *out);

#endif
