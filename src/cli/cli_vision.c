/* cli_vision: --image for the commands that run a prompt: each file
 * decoded, preprocessed as the model's processor does, encoded by its
 * vision tower and spliced into the prompt's placeholders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "vision/image.h"
#include "vision/imgproc.h"
#include "vision/imgprompt.h"

loom_status cli_vision_prompt(loom_model *m, const char *model_dir, const int32_t *ids, int n,
                              const char *const *files, int n_files, cli_vision *out) {
    memset(out, 0, sizeof *out);
    loom_status s = loom_vision_load(m, model_dir, &out->v);
    if (!s && !out->v)
        s = loom_err(LOOM_ERR_UNSUPPORTED, "%s has no vision tower (no vision_config in "
                     "config.json), so it takes no --image", model_dir);
    loom_imgproc proc;
    if (!s) s = loom_imgproc_load(model_dir, &proc);
    loom_imgproc_out *px = calloc((size_t)n_files, sizeof *px);
    loom_vision_image *imgs = calloc((size_t)n_files, sizeof *imgs);
    if (!s && (!px || !imgs)) s = loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int k = 0; !s && k < n_files; k++) {
        loom_image img = {0};
        s = loom_image_load(files[k], &img); /* its errors name the file */
        if (!s && (s = loom_imgproc_run(&proc, &img, &px[k])))
            loom_err_wrap(s, "image %s", files[k]);
        loom_image_free(&img);
        if (s) break;
        imgs[k].pixels = px[k].pixel_values;
        imgs[k].grid[0] = px[k].plan.grid_t;
        imgs[k].grid[1] = px[k].plan.grid_h;
        imgs[k].grid[2] = px[k].plan.grid_w;
    }
    if (!s) s = loom_vision_prompt_build(out->v, ids, n, imgs, n_files, &out->p);
    for (int k = 0; px && k < n_files; k++) loom_imgproc_out_free(&px[k]);
    free(px);
    free(imgs);
    if (s) cli_vision_free(out);
    return s;
}

loom_status cli_vision_expand(const char *model_dir, const loom_tok *tok, const char *const *files,
                              int n_files, const char *text, char **out, size_t *out_len) {
    int n_tok[CLI_MAX_IMAGES];
    loom_imgproc proc;
    loom_imgprompt ip;
    loom_status s = n_files <= CLI_MAX_IMAGES ? loom_imgproc_load(model_dir, &proc)
                    : loom_err(LOOM_ERR_INVALID_ARG, "at most %d images", CLI_MAX_IMAGES);
    if (!s) s = loom_imgprompt_load(model_dir, tok, &ip);
    for (int k = 0; !s && k < n_files; k++) {
        loom_image img = {0};
        loom_imgproc_plan plan = {0};
        s = loom_image_load(files[k], &img); /* its errors name the file */
        if (!s && (s = loom_imgproc_plan_image(&proc, img.w, img.h, &plan)))
            loom_err_wrap(s, "image %s", files[k]);
        loom_image_free(&img);
        n_tok[k] = plan.n_tokens;
    }
    return s ? s : loom_imgprompt_expand(&ip, text, strlen(text), n_tok, n_files, out, out_len);
}

void cli_vision_free(cli_vision *cv) {
    loom_vision_prompt_free(&cv->p);
    loom_vision_free(cv->v);
    cv->v = NULL;
}

/* the context's own chunk when n_batch is 0 */
#define CLI_CONTEXT_BATCH 512

int cli_vision_n_batch(const cli_vision *cv) {
    if (!cv->v || !cv->p.groups) return 0;
    int b = loom_vision_prompt_batch(&cv->p, CLI_CONTEXT_BATCH);
    return b == CLI_CONTEXT_BATCH ? 0 : b;
}
