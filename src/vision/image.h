/* image: PNG and JPEG files decoded to 8-bit RGB, the pixels a vision
 * model's image processor starts from.
 *
 * The result is what Python's PIL gives for Image.open(f).convert("RGB"),
 * which is what the Hugging Face processors run on:
 *   - alpha is dropped, never composited (RGBA, gray+alpha, palette or
 *     tRNS transparency alike);
 *   - gray is replicated into R, G and B; 1/2/4-bit gray is scaled to
 *     0..255 (x255, x85, x17); palettes are looked up;
 *   - 16-bit samples keep their high byte, except 16-bit gray without
 *     alpha, which PIL opens as mode I;16 and converts by clamping the
 *     value to 255;
 *   - JPEG is decoded by libjpeg(-turbo) with its defaults (islow DCT,
 *     fancy upsampling), as PIL does; CMYK/YCCK JPEGs are read as Adobe
 *     (inverted) CMYK and converted with PIL's formula;
 *   - no gamma, ICC profile or EXIF orientation is applied (PIL's
 *     convert("RGB") applies none).
 * The format is found from the magic bytes, not from a file name.
 *
 * Images above LOOM_IMAGE_MAX_PIXELS (or the limit passed) are refused
 * from their header, before any pixel memory is allocated. Corrupt and
 * truncated data give LOOM_ERR_FORMAT with the decoder's message; the
 * decoders' longjmp-based error paths free everything they allocated. */
#ifndef LOOM_VISION_IMAGE_H
#define LOOM_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* 64 Mi pixels (8192 x 8192): 192 MiB of RGB. */
#define LOOM_IMAGE_MAX_PIXELS ((uint64_t)64 << 20)

typedef struct loom_image {
    int w, h;
    uint8_t *rgb;  /* owned; (h, w, 3) row-major, R G B */
} loom_image;

/* Decodes a PNG or JPEG held in data[0..n) into *out (zeroed first, so
 * loom_image_free is safe on any result). LOOM_ERR_FORMAT: not PNG/JPEG,
 * corrupt or truncated; LOOM_ERR_UNSUPPORTED: valid but too large (the
 * message names the size found and the limit); LOOM_ERR_NOMEM. */
loom_status loom_image_decode(const void *data, size_t n, loom_image *out);
/* The same with a limit of max_pixels (w * h) instead of the default. */
loom_status loom_image_decode_max(const void *data, size_t n,
                                  uint64_t max_pixels, loom_image *out);
/* Reads the file at path and decodes it; LOOM_ERR_IO if it cannot be read.
 * Errors are prefixed with the path. */
loom_status loom_image_load(const char *path, loom_image *out);
/* Frees img->rgb and zeroes *img; NULL and zeroed images are fine. */
void loom_image_free(loom_image *img);

/* XXH3-64 of the size and the RGB pixels: equal for images that decode to
 * the same pixels, whatever the file format or encoding. A cache key, not
 * a cryptographic digest. */
uint64_t loom_image_hash(const loom_image *img);

#endif
