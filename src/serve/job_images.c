/* job_images: a chat request's images on the HTTP thread: each URL read
 * (media.c), decoded (PNG/JPEG, refused from its header past
 * LOOM_IMAGE_MAX_PIXELS before any pixel memory is taken), preprocessed as
 * the model's processor does (resized within its max_pixels), hashed for
 * the prefix cache, and its marker in the rendered prompt expanded to its
 * tokens. The engine runs the vision tower itself (engine.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "serve/job.h"
#include "serve/media.h"
#include "vision/image.h"

void job_images_open(server *s) {
    char path[4096], *text = NULL;
    s->imgproc = NULL;
    if (!s->tok ||
        loom_path_join(path, sizeof path, s->p.model_dir, "preprocessor_config.json") != LOOM_OK ||
        loom_path_join(path, sizeof path, s->p.model_dir, "config.json") != LOOM_OK ||
        loom_read_file(path, &text, NULL) != LOOM_OK) {
        loom_err_clear();
        return;
    }
    cJSON *cfg = cJSON_Parse(text);
    int has_vision = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"));
    cJSON_Delete(cfg);
    loom_status st = has_vision ? loom_imgprompt_parse(text, s->tok, &s->imgprompt) : LOOM_OK;
    free(text);
    if (!has_vision) return;
    loom_imgproc *p = st == LOOM_OK ? malloc(sizeof *p) : NULL;
    if (p && loom_imgproc_load(s->p.model_dir, p) == LOOM_OK) {
        s->imgproc = p;
        return;
    }
    fprintf(stderr, "loom: warning: %s; requests with images are refused\n", loom_last_error());
    loom_err_clear();
    free(p);
}

void job_images_close(server *s) {
    free(s->imgproc);
    s->imgproc = NULL;
}

void job_images_free(job *j) {
    for (int k = 0; k < j->n_images; k++) loom_imgproc_out_free(&j->px[k]);
    free(j->px);
    free(j->images);
    j->px = NULL;
    j->images = NULL;
    j->n_images = 0;
}

/* Image k of the request: read, decoded, preprocessed, hashed. */
static int load_image(job *j, int k, api_error *err) {
    server *s = j->srv;
    const char *param = j->req.image_params[k];
    uint8_t *data = NULL;
    size_t len = 0;
    if (api_media_load(j->req.image_urls[k], s->p.allowed_media_dir, param, &data, &len, err) < 0)
        return -1;
    loom_image img = {0};
    loom_status st = loom_image_decode(data, len, &img);
    free(data);
    if (st == LOOM_OK) st = loom_imgproc_run(s->imgproc, &img, &j->px[k]);
    if (st != LOOM_OK) {
        loom_image_free(&img);
        return api_fail(err, st == LOOM_ERR_NOMEM ? 500 : 400, param, "'%s': %s", param,
                        loom_last_error());
    }
    const loom_imgproc_plan *pl = &j->px[k].plan;
    j->images[k] = (loom_request_image){.pixels = j->px[k].pixel_values, .hash = loom_image_hash(&img),
                                        .grid = {pl->grid_t, pl->grid_h, pl->grid_w}};
    loom_image_free(&img);
    return 0;
}

int job_images_prepare(job *j, api_error *err) {
    server *s = j->srv;
    api_req *r = &j->req;
    if (!s->imgproc)
        return api_fail(err, 400, r->image_params[0], "'%s': the model '%s' takes no images (it has "
                        "no vision tower and image processor)", r->image_params[0], s->model_id);
    j->images = calloc((size_t)r->n_images, sizeof *j->images);
    j->px = calloc((size_t)r->n_images, sizeof *j->px);
    if (!j->images || !j->px) return api_fail(err, 500, NULL, "out of memory");
    j->n_images = r->n_images;
    for (int k = 0; k < r->n_images; k++)
        if (load_image(j, k, err) < 0) return -1;
    return 0;
}

int job_images_expand(job *j, size_t *len, api_error *err) {
    int n_tok[API_MAX_IMAGES];
    for (int k = 0; k < j->n_images; k++) n_tok[k] = j->px[k].plan.n_tokens;
    char *text = NULL;
    loom_status st = loom_imgprompt_expand(&j->srv->imgprompt, j->prompt_text, *len, n_tok,
                                           j->n_images, &text, len);
    if (st != LOOM_OK)
        return api_fail(err, st == LOOM_ERR_NOMEM ? 500 : 400, "messages", "chat template: %s",
                        loom_last_error());
    free(j->prompt_text);
    j->prompt_text = text;
    return 0;
}
