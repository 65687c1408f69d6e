/* loom imgproc: runs a model's image processor on image files and prints
 * what each becomes (size, grid, placeholder tokens); --out writes the
 * pixel_values and image_grid_thw the vision tower takes, as the Hugging
 * Face processor returns them for the same images in one call. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "load/safetensors.h"
#include "vision/image.h"
#include "vision/imgproc.h"

static const char usage[] =
    "usage: loom imgproc --model DIR --image FILE [--image FILE ...] [--out FILE] [--pil]\n"
    "\n"
    "Decodes each PNG/JPEG image and runs the model's image processor\n"
    "(DIR/preprocessor_config.json: Qwen2VLImageProcessor, Gemma3ImageProcessor) on it.\n"
    "Prints per image: the decoded size, the size after resize, the patch grid (t x h x w),\n"
    "the placeholder tokens the prompt needs, the shape of its pixel_values and the\n"
    "pixels' hash.\n"
    "\n"
    "  --out FILE   write pixel_values (all images, concatenated as HF batches them)\n"
    "               and, for Qwen, image_grid_thw [n, 3] (I64) as safetensors\n"
    "  --pil        match transformers' PIL processor (use_fast=False) instead of the\n"
    "               default torchvision one (they differ by a uint8 level here and there)\n";

#define MAX_IMAGES 64

int cmd_imgproc(int argc, char **argv) {
    const char *dir = NULL, *outp = NULL, *images[MAX_IMAGES];
    int n_img = 0, pil = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--pil")) {
            pil = 1;
            continue;
        }
        if (strcmp(a, "--model") && strcmp(a, "--image") && strcmp(a, "--out"))
            return cli_usage_error("imgproc", "unknown option \"%s\"", a);
        if (!(v = cli_value("imgproc", argc, argv, &i))) return 2;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--out")) outp = v;
        else if (n_img == MAX_IMAGES) return cli_usage_error("imgproc", "at most %d images", MAX_IMAGES);
        else images[n_img++] = v;
    }
    if (!dir) return cli_usage_error("imgproc", "--model is required");
    if (!n_img) return cli_usage_error("imgproc", "--image is required");
    loom_imgproc p;
    loom_status s = loom_imgproc_load(dir, &p);
    if (s != LOOM_OK) return cli_fail("loading the image processor", s);
    if (pil) p.backend = LOOM_IMGPROC_PIL;
    float *all = NULL;
    size_t n_all = 0;
    int64_t grid[MAX_IMAGES * 3], rows = 0, shape[3] = {0};
    int rc = 0;
    for (int k = 0; k < n_img && !rc; k++) {
        loom_image im;
        loom_imgproc_out o;
        if ((s = loom_image_load(images[k], &im)) != LOOM_OK) {
            rc = cli_fail("decoding", s);
            break;
        }
        if ((s = loom_imgproc_run(&p, &im, &o)) != LOOM_OK) {
            loom_image_free(&im);
            rc = cli_fail(images[k], s);
            break;
        }
        const loom_imgproc_plan *pl = &o.plan;
        printf("%s: %dx%d -> %dx%d, grid %dx%dx%d, %d tokens, pixel_values [%" PRId64 ", %" PRId64, images[k],
               im.w, im.h, pl->resized_w, pl->resized_h, pl->grid_t, pl->grid_h, pl->grid_w, pl->n_tokens,
               pl->shape[0], pl->shape[1]);
        if (pl->ndim == 3) printf(", %" PRId64, pl->shape[2]);
        printf("], hash %016" PRIx64 "\n", loom_image_hash(&im));
        grid[3 * k] = pl->grid_t, grid[3 * k + 1] = pl->grid_h, grid[3 * k + 2] = pl->grid_w;
        /* HF stacks Gemma images into [n, 3, H, W] (one size for all) and
         * concatenates Qwen's patch rows */
        if (outp && k && pl->ndim == 3 && memcmp(shape, pl->shape, sizeof shape))
            rc = cli_fail("imgproc", loom_err(LOOM_ERR_INVALID_ARG, "--out: %s is not the size of the "
                                              "images before it (do_resize is off)", images[k]));
        rows += pl->ndim == 2 ? pl->shape[0] : 1;
        memcpy(shape, pl->shape, sizeof shape);
        float *grown = outp && !rc ? realloc(all, (n_all + o.n) * sizeof *all) : NULL;
        if (outp && !rc && !grown) rc = cli_fail("imgproc", loom_err(LOOM_ERR_NOMEM, "out of memory"));
        if (grown) {
            all = grown;
            memcpy(all + n_all, o.pixel_values, o.n * sizeof *all);
            n_all += o.n;
        }
        loom_imgproc_out_free(&o);
        loom_image_free(&im);
    }
    if (!rc && outp) {
        loom_st_write_entry e[2] = {{.name = "pixel_values", .dtype = LOOM_DT_F32, .data = all}};
        int n_e = 1;
        if (p.kind == LOOM_IMGPROC_QWEN2VL) {
            e[0].ndim = 2, e[0].shape[0] = rows, e[0].shape[1] = shape[1];
            e[1] = (loom_st_write_entry){.name = "image_grid_thw", .dtype = LOOM_DT_I64, .ndim = 2,
                                         .shape = {n_img, 3}, .data = grid};
            n_e = 2;
        } else {
            e[0].ndim = 4, e[0].shape[0] = rows;
            memcpy(e[0].shape + 1, shape, sizeof shape);
        }
        if ((s = loom_st_write(outp, e, n_e)) != LOOM_OK) rc = cli_fail("writing", s);
    }
    free(all);
    return rc;
}
