/* imgprompt: the text side of a vision-language processor. A chat
 * template writes one marker per image; the model's Hugging Face
 * processor replaces it, in the rendered text and before tokenizing, with
 * the image's token sequence:
 *   - Qwen2VLProcessor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen 3.5): the
 *     marker <|image_pad|> repeated to the image's token count;
 *   - Gemma3Processor: the marker <start_of_image> becomes
 *     "\n\n<start_of_image>" + "<image_soft_token>" x tokens +
 *     "<end_of_image>\n\n".
 * The server, `loom generate --image` and `loom chat` all expand through
 * loom_imgprompt_expand, so one image gives one prompt wherever it is sent. */
#ifndef LOOM_VISION_IMGPROMPT_H
#define LOOM_VISION_IMGPROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "tokenize/tokenizer.h"

#define LOOM_IMGPROMPT_TOKEN_MAX 64

typedef struct loom_imgprompt {
    int gemma;                 /* Gemma3Processor's rule (config.json has boi_token_index) */
    int32_t image_token;       /* image_token_id (or Gemma's image_token_index) */
    int32_t boi_token, eoi_token; /* Gemma: boi_token_index, eoi_token_index; else -1 */
    /* the tokens' strings (the tokenizer's), NUL-terminated */
    char image[LOOM_IMGPROMPT_TOKEN_MAX];
    char boi[LOOM_IMGPROMPT_TOKEN_MAX], eoi[LOOM_IMGPROMPT_TOKEN_MAX];
} loom_imgprompt;

/* From config_json (the model's config.json text) and tok, the model's
 * tokenizer (its strings are copied). LOOM_ERR_FORMAT naming the field when
 * the config names no image token, or a token id the tokenizer lacks. */
loom_status loom_imgprompt_parse(const char *config_json, const loom_tok *tok, loom_imgprompt *out);
/* The same from DIR/config.json. */
loom_status loom_imgprompt_load(const char *model_dir, const loom_tok *tok, loom_imgprompt *out);

/* The marker string the template writes for an image. */
const char *loom_imgprompt_marker(const loom_imgprompt *ip);

/* text (len bytes) with image k's marker expanded to n_tokens[k] image
 * tokens, images in order, into *out (malloc'd, NUL-terminated, *out_len
 * bytes). Markers already expanded are kept: for Qwen, a prompt holding
 * exactly the images' total of <|image_pad|> when that differs from their
 * number; for Gemma, a <start_of_image> followed by <image_soft_token>.
 * LOOM_ERR_INVALID_ARG naming both counts when the markers do not match
 * the images. */
loom_status loom_imgprompt_expand(const loom_imgprompt *ip, const char *text, size_t len,
                                  const int *n_tokens, int n_img, char **out, size_t *out_len);

#endif
