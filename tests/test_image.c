/* Image decoding and the vision image processors.
 *
 * Fixture cases (tests/fixtures/vision, from the vision-language model
 * fixtures; extract.py there): every case's images go through decode +
 * preprocess and must give the Hugging Face torchvision processor's
 * pixel_values bit for bit (tolerance 0) and image_grid_thw exactly; the
 * PIL processor's pixel_values_alt is within 2 uint8 levels of that, and
 * the PIL backend gives it bit for bit. Decoding
 * matches PIL's pixels. Then PIL's convert("RGB") rules on PNGs made
 * here (gray, gray+alpha, palette with tRNS, 1-bit, 16-bit, interlaced),
 * gray and CMYK JPEGs, and corrupt, truncated and oversized data, which
 * must give errors with a message (under ASan: without leaks). */
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>
#include <jpeglib.h>
#include <png.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "test.h"
#include "vision/image.h"
#include "vision/imgproc.h"

#define FIX "tests/fixtures/vision"

static loom_safetensors *ref;

static const loom_st_tensor *ref_find(const char *fmt, const char *a, int i) {
    char name[256];
    snprintf(name, sizeof name, fmt, a, i);
    return loom_st_find(ref, name);
}

/* pixel_values stored as .idx (U8) + .lut (F32 [3, 256]): value i is
 * lut[channel(i)][idx[i]] (extract.py). */
static float *ref_pixels(const char *model, int c, const char *suffix, int qwen, size_t *n) {
    char base[96];
    snprintf(base, sizeof base, "%s.case.%d.%s", model, c, suffix);
    const loom_st_tensor *idx = ref_find("%s.idx", base, 0), *lut = ref_find("%s.lut", base, 0);
    if (!idx || !lut) return NULL;
    *n = idx->nbytes;
    float *v = malloc(*n * sizeof *v);
    const uint8_t *ix = idx->data;
    const float *lt = lut->data;
    for (size_t i = 0; i < *n; i++) {
        size_t ch = qwen ? (i % idx->shape[1]) / (idx->shape[1] / 3)
                         : (i / (idx->shape[2] * idx->shape[3])) % 3;
        v[i] = lt[ch * 256 + ix[i]];
    }
    return v;
}

/* ---- fixture cases ---- */

static void run_model(const char *dir, const char *refname) {
    char path[512];
    snprintf(path, sizeof path, FIX "/%s", dir);
    loom_imgproc ip;
    loom_status s = loom_imgproc_load(path, &ip);
    CHECKF(s == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (s != LOOM_OK) return;
    int qwen = ip.kind == LOOM_IMGPROC_QWEN2VL;
    snprintf(path, sizeof path, FIX "/%s/cases.json", dir);
    char *text;
    CHECK(loom_read_file(path, &text, NULL) == LOOM_OK);
    cJSON *cases = cJSON_Parse(text);
    free(text);
    CHECK(cJSON_GetArraySize(cases) == 3);
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cases) {
        int c = cJSON_GetObjectItem(cs, "index")->valueint;
        size_t nref = 0, nalt = 0, off = 0;
        float *want = ref_pixels(refname, c, "pixel_values", qwen, &nref);
        float *alt = ref_pixels(refname, c, "pixel_values_alt", qwen, &nalt);
        const loom_st_tensor *grid = NULL;
        if (qwen) {
            char name[128];
            snprintf(name, sizeof name, "%s.case.%d.image_grid_thw", refname, c);
            grid = loom_st_find(ref, name);
            CHECK(grid && grid->dtype == LOOM_DT_I64 && grid->shape[1] == 3);
        }
        CHECKF(want != NULL, "%s case %d: no reference", refname, c);
        if (!want) continue;
        double err = 0, err_alt = 0, lv = 0, lv_alt = 0, err_pil = 0;
        int k = 0;
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItem(cs, "images")) {
            snprintf(path, sizeof path, FIX "/images/%s", f->valuestring);
            loom_image im;
            loom_imgproc_out o = {0};
            s = loom_image_load(path, &im);
            CHECKF(s == LOOM_OK, "%s: %s", path, loom_last_error());
            if (s == LOOM_OK) s = loom_imgproc_run(&ip, &im, &o);
            CHECKF(s == LOOM_OK, "%s on %s: %s", dir, path, loom_last_error());
            if (s != LOOM_OK) {
                loom_image_free(&im);
                break;
            }
            CHECKF(off + o.n <= nref, "%s case %d: %zu values, reference %zu", dir, c, off + o.n, nref);
            if (off + o.n > nref) break;
            /* per value: error in normalised units and in uint8 levels
             * (std * 255 per unit when rescale and normalise are on) */
            size_t per = qwen ? (size_t)o.plan.shape[1] / 3 : (size_t)o.plan.shape[1] * o.plan.shape[2];
            for (size_t i = 0; i < o.n; i++) {
                int ch = (int)((qwen ? i % o.plan.shape[1] : i) / per % 3);
                double unit = ip.image_std[ch] / ip.rescale_factor;
                double e = fabs((double)o.pixel_values[i] - want[off + i]);
                err = test_max(err, e);
                lv = test_max(lv, e * unit);
                if (alt && off + i < nalt) {
                    double ea = fabs((double)o.pixel_values[i] - alt[off + i]);
                    err_alt = test_max(err_alt, ea);
                    lv_alt = test_max(lv_alt, ea * unit);
                }
            }
            if (alt && off + o.n <= nalt) {
                /* the PIL backend gives the PIL processor's values */
                loom_imgproc ipp = ip;
                loom_imgproc_out op;
                ipp.backend = LOOM_IMGPROC_PIL;
                CHECK(loom_imgproc_run(&ipp, &im, &op) == LOOM_OK && op.n == o.n);
                for (size_t i = 0; op.pixel_values && i < op.n; i++)
                    err_pil = test_max(err_pil, fabs((double)op.pixel_values[i] - alt[off + i]));
                loom_imgproc_out_free(&op);
            }
            if (qwen) {
                const int64_t *g = grid->data;
                CHECKF(k < grid->shape[0] && g[3 * k] == o.plan.grid_t && g[3 * k + 1] == o.plan.grid_h &&
                           g[3 * k + 2] == o.plan.grid_w,
                       "%s case %d image %d: grid %d %d %d", dir, c, k, o.plan.grid_t, o.plan.grid_h,
                       o.plan.grid_w);
                CHECK_EQ_INT(o.plan.n_tokens, o.plan.grid_t * o.plan.grid_h * o.plan.grid_w /
                                                  (ip.merge_size * ip.merge_size));
            } else {
                CHECK_EQ_INT(o.plan.n_tokens, 16);
                CHECK(o.plan.shape[0] == 3 && o.plan.shape[1] == 112 && o.plan.shape[2] == 112);
            }
            off += o.n;
            k++;
            loom_imgproc_out_free(&o);
            loom_image_free(&im);
        }
        CHECKF(off == nref, "%s case %d: %zu values, reference %zu", dir, c, off, nref);
        if (grid) CHECK_EQ_INT(k, grid->shape[0]);
        CHECKF(err == 0, "%s case %d: max |diff| %g (%g uint8 levels)", dir, c, err, lv);
        fprintf(stderr, "%-10s case %d: max |diff| %g (%g levels) vs pixel_values", dir, c, err, lv);
        if (alt)
            fprintf(stderr, ", %g (%g levels) vs pixel_values_alt (PIL); PIL backend: %g", err_alt, lv_alt,
                    err_pil);
        fputc('\n', stderr);
        if (alt) {
            CHECKF(lv_alt < 2.5, "%s case %d: %g levels from the PIL processor", dir, c, lv_alt);
            CHECKF(err_pil == 0, "%s case %d: PIL backend %g from pixel_values_alt", dir, c, err_pil);
        }
        free(want);
        free(alt);
    }
    cJSON_Delete(cases);
}

/* A, B, C decode to PIL's pixels (C is RGBA: its alpha is dropped). */
static void test_decode_fixtures(void) {
    static const char *files[] = {"A_64x48_rgb.png", "B_100x70_noisy_q90.jpg", "C_32x32_rgba.png"};
    for (int i = 0; i < 3; i++) {
        char path[256], name[32];
        snprintf(path, sizeof path, FIX "/images/%s", files[i]);
        snprintf(name, sizeof name, "image.%c.decoded", 'A' + i);
        const loom_st_tensor *t = loom_st_find(ref, name);
        loom_image im;
        CHECKF(loom_image_load(path, &im) == LOOM_OK, "%s: %s", path, loom_last_error());
        CHECK(t && im.h == t->shape[0] && im.w == t->shape[1]);
        if (!t || im.h != t->shape[0] || im.w != t->shape[1]) continue;
        int ch = (int)t->shape[2], bad = 0;
        for (size_t p = 0; p < (size_t)im.w * im.h; p++)
            for (int c = 0; c < 3; c++) bad += im.rgb[3 * p + c] != ((const uint8_t *)t->data)[p * ch + c];
        CHECKF(bad == 0, "%s: %d samples differ from PIL's", files[i], bad);
        loom_image_free(&im);
    }
}

/* ---- images made here ---- */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static void mem_put(membuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void png_put(png_structp png, png_bytep d, size_t n) { mem_put(png_get_io_ptr(png), d, n); }
static void png_flush_none(png_structp png) { (void)png; }

/* A PNG of w x h from rows of raw samples (rowbytes each) in the given
 * colour type and depth. rows NULL writes the header alone. */
static membuf png_make(int w, int h, int ctype, int depth, int interlace, const uint8_t *rows,
                       size_t rowbytes, const png_color *pal, int npal, const uint8_t *trns, int ntrns) {
    membuf b = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(b.p);
        b = (membuf){0};
        return b;
    }
    png_set_write_fn(png, &b, png_put, png_flush_none);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, ctype,
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (pal) png_set_PLTE(png, info, pal, npal);
    if (trns) png_set_tRNS(png, info, trns, ntrns, NULL);
    png_write_info(png, info);
    if (rows) {
        png_bytep *rp = malloc(sizeof *rp * h);
        for (int y = 0; y < h; y++) rp[y] = (png_bytep)rows + rowbytes * y;
        png_write_image(png, rp);
        png_write_end(png, NULL);
        free(rp);
    }
    png_destroy_write_struct(&png, &info);
    return b;
}

/* Decodes b and checks every pixel against want (w x h x 3). */
static void expect_pixels(const char *what, membuf b, int w, int h, const uint8_t *want) {
    loom_image im;
    loom_status s = loom_image_decode(b.p, b.n, &im);
    CHECKF(s == LOOM_OK, "%s: %s", what, loom_last_error());
    if (s == LOOM_OK) {
        CHECKF(im.w == w && im.h == h, "%s: %dx%d", what, im.w, im.h);
        int bad = 0;
        for (size_t i = 0; im.w == w && im.h == h && i < (size_t)w * h * 3; i++) bad += im.rgb[i] != want[i];
        CHECKF(bad == 0, "%s: %d samples differ", what, bad);
    }
    loom_image_free(&im);
    free(b.p);
}

static void test_png_modes(void) {
    enum { W = 5, H = 3 };
    uint8_t want[W * H * 3], raw[W * H * 8];
    /* 8-bit gray: replicated */
    for (int i = 0; i < W * H; i++) raw[i] = (uint8_t)(i * 17 + 3);
    for (int i = 0; i < W * H * 3; i++) want[i] = raw[i / 3];
    expect_pixels("gray8", png_make(W, H, PNG_COLOR_TYPE_GRAY, 8, 0, raw, W, NULL, 0, NULL, 0), W, H, want);
    /* gray with a tRNS colour: the transparency is ignored */
    membuf b = {0};
    {
        png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
        png_infop info = png_create_info_struct(png);
        png_color_16 tc = {.gray = 20};
        png_set_write_fn(png, &b, png_put, png_flush_none);
        png_set_IHDR(png, info, W, H, 8, PNG_COLOR_TYPE_GRAY, 0, 0, 0);
        png_set_tRNS(png, info, NULL, 0, &tc);
        png_write_info(png, info);
        for (int y = 0; y < H; y++) png_write_row(png, raw + y * W);
        png_write_end(png, NULL);
        png_destroy_write_struct(&png, &info);
    }
    expect_pixels("gray8+tRNS", b, W, H, want);
    /* 16-bit gray: PIL's I;16 clamps the value to 255 */
    for (int i = 0; i < W * H; i++) {
        unsigned v = (unsigned)i * 4099u;  /* 0 .. 57386: a few under 256 */
        raw[2 * i] = (uint8_t)(v >> 8);
        raw[2 * i + 1] = (uint8_t)v;
        for (int c = 0; c < 3; c++) want[3 * i + c] = (uint8_t)(v > 255 ? 255 : v);
    }
    expect_pixels("gray16", png_make(W, H, PNG_COLOR_TYPE_GRAY, 16, 0, raw, 2 * W, NULL, 0, NULL, 0), W, H,
                  want);
    /* 8-bit gray + alpha: alpha dropped, not composited */
    for (int i = 0; i < W * H; i++) {
        raw[2 * i] = (uint8_t)(i * 13 + 7);
        raw[2 * i + 1] = (uint8_t)(i * 29);
        for (int c = 0; c < 3; c++) want[3 * i + c] = raw[2 * i];
    }
    expect_pixels("gray+alpha", png_make(W, H, PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0, raw, 2 * W, NULL, 0, NULL, 0),
                  W, H, want);
    /* 16-bit RGBA: the high byte of each sample, alpha dropped */
    for (int i = 0; i < W * H * 4; i++) {
        raw[2 * i] = (uint8_t)(i * 37 + 1);
        raw[2 * i + 1] = (uint8_t)(i * 91 + 5);
    }
    for (int i = 0; i < W * H; i++)
        for (int c = 0; c < 3; c++) want[3 * i + c] = raw[8 * i + 2 * c];
    expect_pixels("rgba16", png_make(W, H, PNG_COLOR_TYPE_RGBA, 16, 0, raw, 8 * W, NULL, 0, NULL, 0), W, H,
                  want);
    /* 1-bit gray: 0 and 255 */
    for (int y = 0; y < H; y++) raw[y] = (uint8_t)(0xa5 ^ (y * 0x3c));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) want[(y * W + x) * 3 + c] = (raw[y] >> (7 - x)) & 1 ? 255 : 0;
    expect_pixels("gray1", png_make(W, H, PNG_COLOR_TYPE_GRAY, 1, 0, raw, 1, NULL, 0, NULL, 0), W, H, want);
    /* 4-bit palette with tRNS alphas: looked up, transparency ignored */
    png_color pal[4] = {{10, 20, 30}, {200, 0, 100}, {0, 255, 7}, {99, 98, 97}};
    uint8_t alphas[4] = {0, 128, 255, 3};
    for (int y = 0; y < H; y++)
        for (int x = 0; x < 3; x++) raw[y * 3 + x] = (uint8_t)(((x + y) % 4) << 4 | ((x + y + 1) % 4));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int v = raw[y * 3 + x / 2] >> (x % 2 ? 0 : 4) & 15;
            memcpy(want + (y * W + x) * 3, &pal[v], 3);
        }
    expect_pixels("palette4+tRNS", png_make(W, H, PNG_COLOR_TYPE_PALETTE, 4, 0, raw, 3, pal, 4, alphas, 4), W, H,
                  want);
    /* interlaced 8-bit RGB */
    enum { IW = 13, IH = 11 };
    uint8_t iraw[IW * IH * 3];
    for (int i = 0; i < IW * IH * 3; i++) iraw[i] = (uint8_t)(i * 7 + i / 5);
    expect_pixels("rgb8 interlaced",
                  png_make(IW, IH, PNG_COLOR_TYPE_RGB, 8, 1, iraw, IW * 3, NULL, 0, NULL, 0), IW, IH, iraw);
}

static membuf jpeg_make(int w, int h, int comps, J_COLOR_SPACE cs, const uint8_t *px) {
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr err;
    unsigned char *out = NULL;
    unsigned long n = 0;
    ci.err = jpeg_std_error(&err);
    jpeg_create_compress(&ci);
    jpeg_mem_dest(&ci, &out, &n);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = comps;
    ci.in_color_space = cs;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 100, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW r = (JSAMPROW)px + (size_t)ci.next_scanline * w * comps;
        jpeg_write_scanlines(&ci, &r, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    membuf b = {.p = malloc(n), .n = n};
    memcpy(b.p, out, n);
    free(out);
    return b;
}

static void test_jpeg_modes(void) {
    enum { W = 16, H = 16 };
    uint8_t px[W * H * 4];
    /* gray JPEG: R = G = B, near the source (lossy) */
    for (int i = 0; i < W * H; i++) px[i] = (uint8_t)(i % W * 12 + i / W * 3);
    membuf b = jpeg_make(W, H, 1, JCS_GRAYSCALE, px);
    loom_image im;
    CHECKF(loom_image_decode(b.p, b.n, &im) == LOOM_OK, "gray jpeg: %s", loom_last_error());
    int far = 0, unequal = 0;
    for (int i = 0; im.rgb && i < W * H; i++) {
        unequal += im.rgb[3 * i] != im.rgb[3 * i + 1] || im.rgb[3 * i] != im.rgb[3 * i + 2];
        far += abs(im.rgb[3 * i] - px[i]) > 3;
    }
    CHECK(im.w == W && im.h == H && unequal == 0 && far == 0);
    loom_image_free(&im);
    free(b.p);
    /* CMYK JPEG: written as Adobe inverted CMYK (what libjpeg writes for
     * JCS_CMYK and Photoshop writes); R = (255 - C)(255 - K) / 255 with
     * C, K the ink amounts, i.e. raw_c * raw_k / 255 of the raw values */
    for (int i = 0; i < W * H; i++) {
        px[4 * i] = (uint8_t)(255 - i);
        px[4 * i + 1] = (uint8_t)(i * 5);
        px[4 * i + 2] = 128;
        px[4 * i + 3] = (uint8_t)(255 - (i % 7) * 20);
    }
    b = jpeg_make(W, H, 4, JCS_CMYK, px);
    CHECKF(loom_image_decode(b.p, b.n, &im) == LOOM_OK, "cmyk jpeg: %s", loom_last_error());
    far = 0;
    for (int i = 0; im.rgb && i < W * H; i++)
        for (int c = 0; c < 3; c++) far += abs(im.rgb[3 * i + c] - px[4 * i + c] * px[4 * i + 3] / 255) > 4;
    CHECKF(im.w == W && im.h == H && far == 0, "cmyk: %d samples off", far);
    loom_image_free(&im);
    free(b.p);
}

/* ---- bad data ---- */

static void expect_error(const char *what, const void *d, size_t n, loom_status want, const char *needle) {
    loom_image im = {.w = 7};
    loom_status s = loom_image_decode(d, n, &im);
    CHECKF(s == want, "%s: got %s (%s)", what, loom_status_str(s), loom_last_error());
    CHECKF(im.rgb == NULL && im.w == 0, "%s: image left set", what);
    CHECKF(loom_last_error()[0] && (!needle || strstr(loom_last_error(), needle)),
           "%s: message \"%s\" lacks \"%s\"", what, loom_last_error(), needle ? needle : "");
    loom_image_free(&im);
}

static void test_bad_data(void) {
    char *a, *bj;
    size_t na, nb;
    CHECK(loom_read_file(FIX "/images/A_64x48_rgb.png", &a, &na) == LOOM_OK);
    CHECK(loom_read_file(FIX "/images/B_100x70_noisy_q90.jpg", &bj, &nb) == LOOM_OK);
    /* every cut of the PNG before its IEND chunk (the last 12 bytes; the
     * pixels are whole without it), every 3rd of the JPEG before its EOI */
    for (size_t n = 0; n < na - 12; n++) {
        loom_image im;
        loom_status s = loom_image_decode(a, n, &im);
        CHECKF(s == LOOM_ERR_FORMAT && loom_last_error()[0], "png cut at %zu: %s", n, loom_status_str(s));
        loom_image_free(&im);
    }
    for (size_t n = 0; n + 2 < nb; n += 3) {
        loom_image im;
        loom_status s = loom_image_decode(bj, n, &im);
        CHECKF(s == LOOM_ERR_FORMAT && loom_last_error()[0], "jpeg cut at %zu: %s", n, loom_status_str(s));
        loom_image_free(&im);
    }
    expect_error("png cut mid-IDAT", a, na / 2, LOOM_ERR_FORMAT, "truncated");
    expect_error("jpeg cut mid-scan", bj, nb / 2, LOOM_ERR_FORMAT, "truncated");
    /* a flipped bit in the IHDR fails its CRC */
    char *c = malloc(na);
    memcpy(c, a, na);
    c[30] ^= 0x10; /* IHDR's CRC */
    expect_error("png IHDR crc", c, na, LOOM_ERR_FORMAT, "PNG");
    /* flipped bytes through the image data: an error or some image, never
     * a crash or a leak */
    for (size_t i = 33; i < na; i += 5) {
        memcpy(c, a, na);
        c[i] ^= 0x5a;
        loom_image im;
        loom_status s = loom_image_decode(c, na, &im);
        CHECK(s == LOOM_OK || (s == LOOM_ERR_FORMAT && loom_last_error()[0]));
        loom_image_free(&im);
    }
    free(c);
    c = malloc(nb);
    for (size_t i = 2; i < nb; i += 11) {
        memcpy(c, bj, nb);
        c[i] ^= 0xa5;
        loom_image im;
        loom_status s = loom_image_decode(c, nb, &im);
        CHECK(s == LOOM_OK || ((s == LOOM_ERR_FORMAT || s == LOOM_ERR_UNSUPPORTED) && loom_last_error()[0]));
        loom_image_free(&im);
    }
    /* a JPEG whose frame header claims 60000 x 60000 */
    memcpy(c, bj, nb);
    size_t sof = 0;
    for (size_t i = 2; i + 9 < nb; i++)
        if ((uint8_t)c[i] == 0xff && (uint8_t)c[i + 1] == 0xc0) {
            sof = i;
            break;
        }
    CHECK(sof > 0);
    c[sof + 5] = (char)0xea;
    c[sof + 6] = 0x60;
    c[sof + 7] = (char)0xea;
    c[sof + 8] = 0x60;
    expect_error("jpeg 60000x60000", c, nb, LOOM_ERR_UNSUPPORTED, "60000x60000");
    free(c);
    /* a PNG header of 100000 x 100000 (no pixel data follows: the size is
     * refused first) */
    membuf big = png_make(100000, 100000, PNG_COLOR_TYPE_RGB, 8, 0, NULL, 0, NULL, 0, NULL, 0);
    CHECK(big.n > 0);
    expect_error("png 100000x100000", big.p, big.n, LOOM_ERR_UNSUPPORTED, "100000x100000");
    CHECK(strstr(loom_last_error(), "67108864") != NULL);  /* the limit */
    free(big.p);
    /* a side over libpng's default limit (1e6) within the pixel limit */
    uint8_t wide_row[1 + 1200000 / 8] = {0};
    {
        membuf wide = png_make(1200000, 1, PNG_COLOR_TYPE_GRAY, 1, 0, wide_row, sizeof wide_row - 1, NULL, 0,
                               NULL, 0);
        loom_image w;
        CHECKF(loom_image_decode(wide.p, wide.n, &w) == LOOM_OK, "1200000x1: %s", loom_last_error());
        CHECK(w.w == 1200000 && w.h == 1 && w.rgb[3 * 1199999] == 0);
        loom_image_free(&w);
        free(wide.p);
    }
    /* a lower limit */
    loom_image im;
    CHECK(loom_image_decode_max(a, na, 64 * 47, &im) == LOOM_ERR_UNSUPPORTED);
    CHECK(strstr(loom_last_error(), "64x48") && strstr(loom_last_error(), "3008"));
    CHECK(loom_image_decode_max(a, na, 64 * 48, &im) == LOOM_OK);
    loom_image_free(&im);
    /* not an image */
    expect_error("gif", "GIF89a....", 10, LOOM_ERR_FORMAT, "47 49 46 38");
    expect_error("empty", "", 0, LOOM_ERR_FORMAT, "nothing");
    CHECK(loom_image_load("/nonexistent/x.png", &im) == LOOM_ERR_IO);
    CHECK(strstr(loom_last_error(), "/nonexistent/x.png") != NULL);
    free(a);
    free(bj);
}

/* ---- hashing, resize, planning, configs ---- */

static void test_hash_resize(void) {
    loom_image a, b;
    CHECK(loom_image_load(FIX "/images/A_64x48_rgb.png", &a) == LOOM_OK);
    CHECK(loom_image_load(FIX "/images/A_64x48_rgb.png", &b) == LOOM_OK);
    CHECK(loom_image_hash(&a) == loom_image_hash(&b));
    b.rgb[1000] ^= 1;
    CHECK(loom_image_hash(&a) != loom_image_hash(&b));
    b.rgb[1000] ^= 1;
    b.w = 48, b.h = 64;  /* same bytes, other shape */
    CHECK(loom_image_hash(&a) != loom_image_hash(&b));
    loom_image_free(&b);
    /* same size: a copy; a flat image stays flat whatever the filter */
    CHECK(loom_image_resize(&a, 64, 48, LOOM_RESAMPLE_BICUBIC, LOOM_IMGPROC_TORCHVISION, &b) == LOOM_OK);
    CHECK(b.rgb && !memcmp(a.rgb, b.rgb, 64 * 48 * 3));
    loom_image_free(&b);
    memset(a.rgb, 77, 64 * 48 * 3);
    int sizes[][2] = {{1, 1}, {7, 300}, {63, 49}, {200, 5}};
    for (int r = LOOM_RESAMPLE_BILINEAR; r <= LOOM_RESAMPLE_BICUBIC; r++)
        for (size_t i = 0; i < 2 * LOOM_ARRAY_LEN(sizes); i++) {
            loom_imgproc_backend be = i % 2 ? LOOM_IMGPROC_PIL : LOOM_IMGPROC_TORCHVISION;
            CHECK(loom_image_resize(&a, sizes[i / 2][0], sizes[i / 2][1], r, be, &b) == LOOM_OK);
            int bad = 0;
            for (size_t p = 0; b.rgb && p < (size_t)b.w * b.h * 3; p++) bad += b.rgb[p] != 77;
            CHECKF(bad == 0, "flat resize to %dx%d (%d, %d): %d differ", sizes[i / 2][0], sizes[i / 2][1], r,
                   be, bad);
            loom_image_free(&b);
        }
    CHECK(loom_image_resize(&a, 10, 10, 1, LOOM_IMGPROC_TORCHVISION, &b) == LOOM_ERR_UNSUPPORTED);
    loom_image_free(&a);
}

/* The filter by its definition, in double: out(x) = sum_i in(i)
 * f((i + 0.5 - center) / s) / norm over the taps within center +- support
 * (s = max(scale, 1)); horizontal, rounded and clamped to uint8 (it is a
 * uint8 image in between), then vertical. */
static double ref_filter(double x, int cubic) {
    x = fabs(x);
    if (!cubic) return x < 1 ? 1 - x : 0;
    if (x < 1) return (1.5 * x - 2.5) * x * x + 1;
    return x < 2 ? ((-0.5 * x + 2.5) * x - 4) * x + 2 : 0;
}

static uint8_t ref_sample(const uint8_t *p, size_t stride, int in, int out, int o, int cubic) {
    if (in == out) return p[(size_t)o * stride];
    double scale = (double)in / out, s = scale > 1 ? scale : 1, support = (cubic ? 2 : 1) * s;
    double center = (o + 0.5) * scale, total = 0, v = 0;
    int lo = (int)fmax(0, floor(center - support + 0.5)), hi = (int)fmin(in, floor(center + support + 0.5));
    for (int i = lo; i < hi; i++) {
        double w = ref_filter((i + 0.5 - center) / s, cubic);
        total += w;
        v += w * p[(size_t)i * stride];
    }
    return (uint8_t)fmin(255, fmax(0, floor(v / total + 0.5)));
}

/* Random images at random sizes, up and down: the uint8 resize is within a
 * level of the definition (the int16 weights make the difference). */
static void test_resize_vs_definition(void) {
    unsigned long long seed = 0x1234567;
    for (int trial = 0; trial < 40; trial++) {
        int iw = 1 + (int)(test_rand_u32(&seed) % 90), ih = 1 + (int)(test_rand_u32(&seed) % 90);
        int ow = 1 + (int)(test_rand_u32(&seed) % 90), oh = 1 + (int)(test_rand_u32(&seed) % 90);
        int cubic = trial & 1;
        loom_imgproc_backend be = trial & 2 ? LOOM_IMGPROC_PIL : LOOM_IMGPROC_TORCHVISION;
        loom_image in = {iw, ih, malloc((size_t)iw * ih * 3)}, out;
        uint8_t *mid = malloc((size_t)ow * ih * 3);
        for (size_t i = 0; i < (size_t)iw * ih * 3; i++)
            in.rgb[i] = (uint8_t)(trial % 3 ? (i * 7 + i / 11) % 256 : test_rand_u32(&seed));
        CHECK(loom_image_resize(&in, ow, oh, cubic ? LOOM_RESAMPLE_BICUBIC : LOOM_RESAMPLE_BILINEAR, be, &out) ==
              LOOM_OK);
        for (int y = 0; y < ih; y++)
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < 3; c++) {
                    const uint8_t *row = in.rgb + (size_t)y * iw * 3 + c;
                    mid[((size_t)y * ow + x) * 3 + c] = ref_sample(row, 3, iw, ow, x, cubic);
                }
        int worst = 0;
        for (int y = 0; out.rgb && y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < 3; c++) {
                    int want = ref_sample(mid + (size_t)x * 3 + c, (size_t)ow * 3, ih, oh, y, cubic);
                    int d = abs(out.rgb[((size_t)y * ow + x) * 3 + c] - want);
                    worst = d > worst ? d : worst;
                }
        CHECKF(worst <= 1, "%dx%d -> %dx%d (%s, %s): %d levels from the definition", iw, ih, ow, oh,
               cubic ? "bicubic" : "bilinear", be == LOOM_IMGPROC_PIL ? "PIL" : "torchvision", worst);
        loom_image_free(&out);
        free(in.rgb);
        free(mid);
    }
}

static void test_plan(void) {
    loom_imgproc q;
    CHECK(loom_imgproc_load(FIX "/qwen3-vl", &q) == LOOM_OK);
    loom_imgproc_plan p;
    /* 80 / 32 = 2.5 rounds to even (2) as Python's round does: 64 x 64 */
    CHECK(loom_imgproc_plan_image(&q, 80, 80, &p) == LOOM_OK);
    CHECK(p.resized_w == 64 && p.resized_h == 64 && p.grid_h == 4 && p.n_tokens == 4);
    /* 112 / 32 = 3.5 rounds to 4 */
    CHECK(loom_imgproc_plan_image(&q, 112, 64, &p) == LOOM_OK);
    CHECK(p.resized_w == 128 && p.resized_h == 64 && p.shape[0] == 32 && p.shape[1] == 1536);
    /* aspect ratio 200 is allowed, over 200 refused */
    CHECK(loom_imgproc_plan_image(&q, 2000, 10, &p) == LOOM_OK);
    CHECK(loom_imgproc_plan_image(&q, 2001, 10, &p) == LOOM_ERR_INVALID_ARG);
    CHECK(strstr(loom_last_error(), "aspect") != NULL);
    /* above max_pixels (16384): scaled down by sqrt, floored */
    CHECK(loom_imgproc_plan_image(&q, 1000, 1000, &p) == LOOM_OK);
    CHECK(p.resized_w == 128 && p.resized_h == 128 && p.n_tokens == 16);
    loom_imgproc g;
    CHECK(loom_imgproc_load(FIX "/gemma3-vl", &g) == LOOM_OK);
    CHECK(g.kind == LOOM_IMGPROC_GEMMA3 && g.tokens_per_image == 16 && g.resample == LOOM_RESAMPLE_BILINEAR);
    CHECK(loom_imgproc_plan_image(&g, 5000, 3, &p) == LOOM_OK);
    CHECK(p.n_tokens == 16 && p.ndim == 3 && p.shape[1] == 112);
}

static void expect_cfg(const char *json, loom_status want, const char *needle) {
    loom_imgproc p;
    loom_status s = loom_imgproc_parse(json, NULL, &p);
    CHECKF(s == want, "%s: got %s (%s)", json, loom_status_str(s), loom_last_error());
    CHECKF(!needle || strstr(loom_last_error(), needle), "%s: message \"%s\" lacks \"%s\"", json,
           loom_last_error(), needle);
}

#define QWEN "\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 14, " \
             "\"merge_size\": 2, \"temporal_patch_size\": 2"

static void test_configs(void) {
    loom_imgproc p;
    /* HF's defaults where HF has them */
    CHECK(loom_imgproc_parse("{" QWEN "}", NULL, &p) == LOOM_OK);
    CHECK(p.min_pixels == 3136 && p.max_pixels == 1003520 && p.resample == LOOM_RESAMPLE_BICUBIC);
    CHECK(p.image_std[2] == 0.27577711f && p.do_normalize && fabs(p.rescale_factor - 1 / 255.0) < 1e-15);
    /* min_pixels / max_pixels override size */
    CHECK(loom_imgproc_parse("{" QWEN ", \"size\": {\"shortest_edge\": 10, \"longest_edge\": 20}, "
                             "\"max_pixels\": 30}", NULL, &p) == LOOM_OK);
    CHECK(p.min_pixels == 10 && p.max_pixels == 30);
    CHECK(loom_imgproc_parse("{" QWEN ", \"image_mean\": 0.25}", NULL, &p) == LOOM_OK);
    CHECK(p.image_mean[1] == 0.25f);
    expect_cfg("[1]", LOOM_ERR_FORMAT, "not a JSON object");
    expect_cfg("{\"patch_size\": 14}", LOOM_ERR_FORMAT, "image_processor_type: missing");
    expect_cfg("{\"image_processor_type\": \"SiglipImageProcessor\"}", LOOM_ERR_UNSUPPORTED,
               "SiglipImageProcessor");
    expect_cfg("{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 14, \"merge_size\": 2}",
               LOOM_ERR_FORMAT, "temporal_patch_size: missing");
    expect_cfg("{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 0, \"merge_size\": 2, "
               "\"temporal_patch_size\": 2}", LOOM_ERR_FORMAT,
               "patch_size: expected an integer in [1, 1024], found 0");
    expect_cfg("{\"image_processor_type\": \"Qwen2VLImageProcessor\", \"patch_size\": 14.5, \"merge_size\": 2, "
               "\"temporal_patch_size\": 2}", LOOM_ERR_FORMAT, "found 14.5");
    expect_cfg("{" QWEN ", \"image_std\": [0.5, 0, 0.5]}", LOOM_ERR_FORMAT, "image_std[1]");
    expect_cfg("{" QWEN ", \"image_mean\": [0.5, 0.5]}", LOOM_ERR_FORMAT, "image_mean");
    expect_cfg("{" QWEN ", \"image_mean\": \"x\"}", LOOM_ERR_FORMAT, "image_mean");
    expect_cfg("{" QWEN ", \"resample\": 1}", LOOM_ERR_UNSUPPORTED, "resample: 1");
    expect_cfg("{" QWEN ", \"do_resize\": 1}", LOOM_ERR_FORMAT, "do_resize: expected true or false, found 1");
    expect_cfg("{" QWEN ", \"rescale_factor\": -1}", LOOM_ERR_FORMAT,
               "rescale_factor: expected a number in [1e-12, 1e+12], found -1");
    expect_cfg("{" QWEN ", \"max_pixels\": \"big\"}", LOOM_ERR_FORMAT,
               "max_pixels: expected an integer in [1, 1099511627776], found a string");
    expect_cfg("{" QWEN ", \"size\": {\"shortest_edge\": 100}}", LOOM_ERR_FORMAT, "longest_edge");
    expect_cfg("{" QWEN ", \"min_pixels\": 100, \"max_pixels\": 99}", LOOM_ERR_FORMAT, "above max_pixels");
    expect_cfg("{\"image_processor_type\": \"Gemma3ImageProcessor\"}", LOOM_ERR_FORMAT, "size: missing");
    expect_cfg("{\"image_processor_type\": \"Gemma3ImageProcessor\", \"size\": {\"height\": 0, \"width\": 4}}",
               LOOM_ERR_FORMAT, "height");
    expect_cfg("{\"image_processor_type\": \"Gemma3ImageProcessor\", \"do_pan_and_scan\": true, "
               "\"size\": {\"height\": 4, \"width\": 4}}", LOOM_ERR_UNSUPPORTED, "pan_and_scan");
    CHECK(loom_imgproc_load("/nonexistent", &p) == LOOM_ERR_IO);
    /* without do_resize a Qwen image must already divide into windows */
    CHECK(loom_imgproc_parse("{" QWEN ", \"do_resize\": false}", NULL, &p) == LOOM_OK);
    loom_imgproc_plan pl;
    CHECK(loom_imgproc_plan_image(&p, 56, 84, &pl) == LOOM_OK && pl.grid_h == 6 && pl.grid_w == 4);
    CHECK(loom_imgproc_plan_image(&p, 56, 80, &pl) == LOOM_ERR_INVALID_ARG);
}

int main(void) {
    CHECKF(loom_st_open(FIX "/reference.safetensors", &ref) == LOOM_OK, "%s", loom_last_error());
    if (!ref) return test_report("test_image");
    test_decode_fixtures();
    run_model("qwen3-vl", "qwen3-vl");
    run_model("qwen3.5-vl", "qwen3-vl");  /* the same output; stored once */
    run_model("qwen2.5-vl", "qwen2.5-vl");
    run_model("gemma3-vl", "gemma3-vl");
    test_png_modes();
    test_jpeg_modes();
    test_bad_data();
    test_hash_resize();
    test_resize_vs_definition();
    test_plan();
    test_configs();
    loom_st_close(ref);
    return test_report("test_image");
}
