/* image: PNG (libpng) and JPEG (libjpeg-turbo) decoding to RGB8, the way
 * PIL's Image.open(f).convert("RGB") gives the pixels (image.h lists the
 * rules).
 *
 * Both libraries report fatal errors by calling a hook that must not
 * return, so each decode runs in one function that calls setjmp and
 * touches no local variable after it: everything that must be freed on
 * the error path lives in a job struct the caller owns and frees from. */
#include "vision/image.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/base.h"

/* A file larger than this is not read: no image under the pixel limit
 * needs it (an uncompressed 64 Mi-pixel RGBA PNG is 256 MiB). */
#define IMAGE_MAX_FILE ((uint64_t)1 << 30)

static loom_status too_large(uint64_t w, uint64_t h, uint64_t max) {
    return loom_err(LOOM_ERR_UNSUPPORTED,
                    "image is %llux%llu (%llu pixels); the limit is %llu pixels",
                    (unsigned long long)w, (unsigned long long)h,
                    (unsigned long long)(w * h), (unsigned long long)max);
}

static loom_status alloc_rgb(loom_image *out, int w, int h) {
    out->rgb = loom_alloc_raw((size_t)w * h * 3);
    if (!out->rgb)
        return loom_err(LOOM_ERR_NOMEM, "image %dx%d: out of memory for %zu bytes",
                        w, h, (size_t)w * h * 3);
    out->w = w;
    out->h = h;
    return LOOM_OK;
}

/* ---- PNG ---- */

typedef struct png_job {
    const uint8_t *data;
    size_t n, off;
    uint64_t max_pixels;
    loom_status status;  /* set with msg when the failure is ours */
    char msg[256];
    uint8_t *raw;        /* one row, or every row of an interlaced image */
    png_bytep *rows;     /* interlaced only */
    loom_image *out;
} png_job;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_job *j = png_get_error_ptr(png);
    snprintf(j->msg, sizeof j->msg, "%s", msg);
    png_longjmp(png, 1);
}

/* Warnings are for recoverable damage (a bad ancillary chunk's CRC) that
 * PIL reads past as well. */
static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void png_on_read(png_structp png, png_bytep dst, size_t len) {
    png_job *j = png_get_io_ptr(png);
    if (len > j->n - j->off) png_error(png, "truncated: the data ends inside a chunk");
    memcpy(dst, j->data + j->off, len);
    j->off += len;
}

/* One row of libpng's output (after the transforms png_decode_run asks
 * for) to RGB: channels 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA; depth 16
 * only for gray (big-endian samples, clamped to 255 as PIL's I;16). */
static void png_row_to_rgb(const uint8_t *in, uint8_t *out, int w, int ch, int depth) {
    for (int x = 0; x < w; x++, out += 3) {
        switch (ch) {
        case 1:
            if (depth == 16) {
                unsigned v = (unsigned)in[2 * x] << 8 | in[2 * x + 1];
                out[0] = out[1] = out[2] = (uint8_t)(v > 255 ? 255 : v);
            } else {
                out[0] = out[1] = out[2] = in[x];
            }
            break;
        case 2: out[0] = out[1] = out[2] = in[2 * x]; break;
        case 3: memcpy(out, in + 3 * x, 3); break;
        default: memcpy(out, in + 4 * x, 3); break;
        }
    }
}

/* Returns 0 on success, -1 after an error (libpng's in j->msg, or ours in
 * j->status). Touches no local after setjmp returns a second time. */
static int png_decode_run(png_structp png, png_infop info, png_job *j) {
    if (setjmp(png_jmpbuf(png))) return -1;
    png_set_read_fn(png, j, png_on_read);
    /* the pixel limit decides, not libpng's default of 1e6 per side */
    png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, ctype, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    if ((uint64_t)w * h > j->max_pixels) {
        j->status = too_large(w, h, j->max_pixels);
        return -1;
    }
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    /* strip_16 keeps the high byte, as PIL's ;16B unpackers do; 16-bit
     * gray alone is clamped instead (png_row_to_rgb) */
    if (depth == 16 && ctype != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info), odepth = png_get_bit_depth(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (ch < 1 || ch > 4 || (odepth != 8 && !(odepth == 16 && ch == 1)) ||
        rowbytes < (size_t)w * ch * (odepth / 8)) {
        j->status = loom_err(LOOM_ERR_INTERNAL, "PNG: unexpected decoded layout: %d channels of %d bits",
                             ch, odepth);
        return -1;
    }
    if ((j->status = alloc_rgb(j->out, (int)w, (int)h)) != LOOM_OK) return -1;
    size_t nrows = passes > 1 ? h : 1;
    j->raw = loom_alloc_raw(rowbytes * nrows);
    if (passes > 1) j->rows = loom_alloc_raw(sizeof *j->rows * h);
    if (!j->raw || (passes > 1 && !j->rows)) {
        j->status = loom_err(LOOM_ERR_NOMEM, "PNG %ux%u: out of memory for rows", w, h);
        return -1;
    }
    if (passes > 1) {
        for (png_uint_32 y = 0; y < h; y++) j->rows[y] = j->raw + rowbytes * y;
        png_read_image(png, j->rows);
        for (png_uint_32 y = 0; y < h; y++)
            png_row_to_rgb(j->rows[y], j->out->rgb + (size_t)y * w * 3, (int)w, ch, odepth);
    } else {
        for (png_uint_32 y = 0; y < h; y++) {
            png_read_row(png, j->raw, NULL);
            png_row_to_rgb(j->raw, j->out->rgb + (size_t)y * w * 3, (int)w, ch, odepth);
        }
    }
    return 0;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static loom_status png_decode(const uint8_t *data, size_t n, uint64_t max_pixels, loom_image *out) {
    /* The size from IHDR (always first, at byte 16) before libpng reads
     * on: a huge image is refused as such even when what follows is cut */
    if (n >= 24 && !memcmp(data + 12, "IHDR", 4) &&
        (uint64_t)be32(data + 16) * be32(data + 20) > max_pixels)
        return loom_err_wrap(too_large(be32(data + 16), be32(data + 20), max_pixels), "PNG");
    png_job j = {.data = data, .n = n, .max_pixels = max_pixels, .out = out};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &j, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return loom_err(LOOM_ERR_NOMEM, "PNG: out of memory creating the decoder");
    }
    int rc = png_decode_run(png, info, &j);
    png_destroy_read_struct(&png, &info, NULL);
    loom_free(j.raw);
    loom_free(j.rows);
    if (rc == 0) return LOOM_OK;
    loom_image_free(out);
    if (j.status != LOOM_OK) return loom_err_wrap(j.status, "PNG");
    return loom_err(LOOM_ERR_FORMAT, "PNG: %s (at byte %zu of %zu)", j.msg, j.off, n);
}

/* ---- JPEG ---- */

typedef struct jpeg_job {
    struct jpeg_error_mgr err;  /* first: libjpeg hands back &err */
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    loom_status status;
    int created;
    uint64_t max_pixels;
    uint8_t *cmyk;              /* one CMYK row */
    loom_image *out;
} jpeg_job;

static void jpeg_on_error(j_common_ptr c) {
    jpeg_job *j = (jpeg_job *)c->err;
    c->err->format_message(c, j->msg);
    longjmp(j->jb, 1);
}

/* libjpeg only warns when the data ends early and fills the rest with
 * gray; PIL refuses such a file ("image file is truncated"), so this
 * does too. Other warnings (stray bytes before a marker) are read past,
 * as PIL reads past them. */
static void jpeg_on_message(j_common_ptr c, int level) {
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
        jpeg_job *j = (jpeg_job *)c->err;
        snprintf(j->msg, sizeof j->msg, "truncated: the data ends before the image does");
        longjmp(j->jb, 1);
    }
}

/* PIL reads CMYK JPEGs as Adobe's inverted CMYK ("CMYK;I") and converts
 * with cmyk2rgb: R = (255 - K) - C * (255 - K) / 255, rounded its way. */
static void cmyk_row_to_rgb(const uint8_t *in, uint8_t *out, int w) {
    for (int x = 0; x < w; x++, in += 4, out += 3) {
        int nk = in[3];  /* 255 - K with K = 255 - raw */
        for (int c = 0; c < 3; c++) {
            int t = (255 - in[c]) * nk + 128;
            int v = nk - (((t >> 8) + t) >> 8);
            out[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

static int jpeg_decode_run(struct jpeg_decompress_struct *ci, jpeg_job *j,
                           const uint8_t *data, size_t n) {
    if (setjmp(j->jb)) return -1;
    jpeg_create_decompress(ci);
    j->created = 1;
    jpeg_mem_src(ci, data, (unsigned long)n);
    jpeg_read_header(ci, TRUE);
    if ((uint64_t)ci->image_width * ci->image_height > j->max_pixels) {
        j->status = too_large(ci->image_width, ci->image_height, j->max_pixels);
        return -1;
    }
    int cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
    ci->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(ci);
    int w = (int)ci->output_width, h = (int)ci->output_height;
    if (ci->output_components != (cmyk ? 4 : 3)) {
        j->status = loom_err(LOOM_ERR_INTERNAL, "JPEG: %d output components", ci->output_components);
        return -1;
    }
    if ((j->status = alloc_rgb(j->out, w, h)) != LOOM_OK) return -1;
    if (cmyk && !(j->cmyk = loom_alloc_raw((size_t)w * 4))) {
        j->status = loom_err(LOOM_ERR_NOMEM, "JPEG %dx%d: out of memory for a row", w, h);
        return -1;
    }
    while (ci->output_scanline < ci->output_height) {
        uint8_t *dst = j->out->rgb + (size_t)ci->output_scanline * w * 3;
        JSAMPROW row = cmyk ? j->cmyk : dst;
        if (jpeg_read_scanlines(ci, &row, 1) != 1) {
            snprintf(j->msg, sizeof j->msg, "no scanline returned at row %u", ci->output_scanline);
            return -1;
        }
        if (cmyk) cmyk_row_to_rgb(j->cmyk, dst, w);
    }
    return 0;
}

static loom_status jpeg_decode(const uint8_t *data, size_t n, uint64_t max_pixels, loom_image *out) {
    struct jpeg_decompress_struct ci;
    jpeg_job j = {.max_pixels = max_pixels, .out = out};
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&j.err);
    j.err.error_exit = jpeg_on_error;
    j.err.emit_message = jpeg_on_message;
    int rc = jpeg_decode_run(&ci, &j, data, n);
    /* not jpeg_finish_decompress: bytes after the last scanline (EOI,
     * trailing junk) do not change the pixels */
    if (j.created) jpeg_destroy_decompress(&ci);
    loom_free(j.cmyk);
    if (rc == 0) return LOOM_OK;
    loom_image_free(out);
    if (j.status != LOOM_OK) return loom_err_wrap(j.status, "JPEG");
    return loom_err(LOOM_ERR_FORMAT, "JPEG: %s", j.msg);
}

/* ---- public ---- */

loom_status loom_image_decode_max(const void *data, size_t n, uint64_t max_pixels, loom_image *out) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = data;
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && !memcmp(p, png_magic, 8)) return png_decode(p, n, max_pixels, out);
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return jpeg_decode(p, n, max_pixels, out);
    char seen[3 * 8 + 1] = "";
    for (size_t i = 0; i < n && i < 8; i++) snprintf(seen + 3 * i, 4, "%02x ", p[i]);
    if (n) seen[3 * LOOM_MIN(n, 8) - 1] = 0;
    return loom_err(LOOM_ERR_FORMAT,
                    "image: expected PNG (89 50 4e 47 ...) or JPEG (ff d8 ff) data, found %s%s (%zu bytes)",
                    n ? "" : "nothing", seen, n);
}

loom_status loom_image_decode(const void *data, size_t n, loom_image *out) {
    return loom_image_decode_max(data, n, LOOM_IMAGE_MAX_PIXELS, out);
}

loom_status loom_image_load(const char *path, loom_image *out) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > IMAGE_MAX_FILE)
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: file is %lld bytes; images over %llu bytes are refused",
                        path, (long long)st.st_size, (unsigned long long)IMAGE_MAX_FILE);
    char *buf;
    size_t n;
    loom_status s = loom_read_file(path, &buf, &n);
    if (s != LOOM_OK) return s;
    s = loom_image_decode(buf, n, out);
    free(buf);
    return s == LOOM_OK ? s : loom_err_wrap(s, "%s", path);
}

void loom_image_free(loom_image *img) {
    if (!img) return;
    loom_free(img->rgb);
    memset(img, 0, sizeof *img);
}

uint64_t loom_image_hash(const loom_image *img) {
    uint64_t seed = (uint64_t)(uint32_t)img->w << 32 | (uint32_t)img->h;
    return XXH3_64bits_withSeed(img->rgb, (size_t)img->w * img->h * 3, seed);
}
