/* media: the images of a chat request, from their OpenAI content parts to
 * the encoded bytes (PNG or JPEG) the image decoder takes. A part is
 *   {"type": "image_url", "image_url": {"url": URL}}   (or "image_url": URL)
 * where URL is
 *   - a data: URL of base64 PNG or JPEG (data:image/png;base64,...,
 *     image/jpeg or image/jpg);
 *   - a file:// URL of a file under the server's --allowed-media-dir: its
 *     real path (symlinks resolved) must lie inside that directory's real
 *     path, so neither "..", nor a symlink out of it, reaches other files.
 * Nothing is ever fetched over the network: http(s) URLs are refused. No
 * engine and no HTTP here, so the parser can be fuzzed and tested alone. */
#ifndef LOOM_SERVE_MEDIA_H
#define LOOM_SERVE_MEDIA_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/api.h"

#define API_MEDIA_MAX_FILE ((size_t)64 << 20)   /* bytes of one file:// image */

/* Whether part is an image content part ({"type": "image_url"}). */
int api_media_is_image(const cJSON *part);

/* The URL of image part `part` (borrowed from it). param names the part
 * ("messages[1].content[0]") in errors. Returns 0, or -1 with err filled. */
int api_media_url(const cJSON *part, const char *param, const char **url, api_error *err);

/* The encoded image bytes at url into *data (owned, *len bytes): a data:
 * URL's decoded base64, or a file:// URL's file under allowed_dir (NULL:
 * file URLs are refused). Every refusal is a 400 naming param. Returns 0,
 * or -1 with err filled. */
int api_media_load(const char *url, const char *allowed_dir, const char *param, uint8_t **data,
                   size_t *len, api_error *err);

/* Strict base64 (RFC 4648, '=' padding optional, no other characters) of
 * s[0, n) into out (at least n / 4 * 3 + 3 bytes); the decoded length, or
 * -1 with *bad the offset of the first character that is not base64. */
long api_base64_decode(const char *s, size_t n, uint8_t *out, size_t *bad);

#endif
