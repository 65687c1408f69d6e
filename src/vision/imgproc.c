/* imgproc: Qwen2-VL-style and Gemma 3 image processors (imgproc.h).
 *
 * The resize is the one torchvision runs on a uint8 tensor on the CPU
 * (aten's antialiased bilinear/bicubic, which follows Pillow-SIMD):
 * separable, the horizontal pass first and then the vertical one, each
 * skipped when that side keeps its size. Per output sample the filter
 * covers [center - support, center + support) of the input with
 * support = taps/2 * max(scale, 1), the weights normalised to sum 1, then
 * scaled to int16 with the most fractional bits that keep the largest
 * weight below 2^15; each pass rounds (adds half) and clamps to uint8.
 * PIL's resize (the PIL processor's) is the same filter with 22 fractional
 * bits always and its own order of the cubic's operations. */
#include "vision/imgproc.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ---- resize ---- */

/* loom_image_free without linking image.c (libpng, libjpeg): the
 * processors build where the decoders do not (the CUDA-min build). */
static void image_release(loom_image *img) {
    loom_free(img->rgb);
    memset(img, 0, sizeof *img);
}

static double filter_bilinear(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Keys' cubic with a = -0.5, written as aten writes it (the order of the
 * operations decides the last bits of a weight, and a weight's last bits
 * can decide a rounding). */
static double filter_bicubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

static double filter_bicubic_pil(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

typedef struct aa_coeffs {
    int ksize;   /* taps per output sample (room for) */
    int prec;    /* fractional bits of k */
    int *lo;     /* [out] first input sample */
    int *len;    /* [out] taps used */
    int32_t *k;  /* [out, ksize]; int16 range for torchvision */
} aa_coeffs;

static void aa_coeffs_free(aa_coeffs *c) {
    loom_free(c->lo);
    loom_free(c->len);
    loom_free(c->k);
    memset(c, 0, sizeof *c);
}

static loom_status aa_coeffs_make(int in, int out, int resample, loom_imgproc_backend backend, aa_coeffs *c) {
    memset(c, 0, sizeof *c);
    int pil = backend == LOOM_IMGPROC_PIL;
    double (*f)(double) = resample != LOOM_RESAMPLE_BICUBIC ? filter_bilinear
                          : pil                             ? filter_bicubic_pil
                                                            : filter_bicubic;
    int taps = resample == LOOM_RESAMPLE_BICUBIC ? 4 : 2;
    double scale = (double)in / out;
    double support = scale >= 1.0 ? taps * 0.5 * scale : taps * 0.5;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int ksize = (int)ceil(support) * 2 + 1;
    double *w = loom_alloc((size_t)out * ksize * sizeof *w);
    c->lo = loom_alloc((size_t)out * sizeof *c->lo);
    c->len = loom_alloc((size_t)out * sizeof *c->len);
    c->k = loom_alloc((size_t)out * ksize * sizeof *c->k);
    if (!w || !c->lo || !c->len || !c->k) {
        loom_free(w);
        aa_coeffs_free(c);
        return loom_err(LOOM_ERR_NOMEM, "resize %d -> %d: out of memory for weights", in, out);
    }
    c->ksize = ksize;
    double wmax = 0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5);
        int64_t lo = (int64_t)(center - support + 0.5);
        if (lo < 0) lo = 0;
        int64_t hi = (int64_t)(center + support + 0.5);
        if (hi > in) hi = in;
        int64_t n = hi - lo;
        n = n < 0 ? 0 : n > ksize ? ksize : n;
        double *wi = w + (size_t)i * ksize, total = 0;
        for (int64_t j = 0; j < n; j++) total += wi[j] = f((j + lo - center + 0.5) * invscale);
        if (total != 0)
            for (int64_t j = 0; j < n; j++) {
                wi[j] /= total;
                if (wi[j] > wmax) wmax = wi[j];
            }
        c->lo[i] = (int)lo;
        c->len[i] = (int)n;
    }
    int prec = 22;
    if (!pil)
        for (prec = 0; prec < 22; prec++)
            if ((int)(0.5 + wmax * (1 << (prec + 1))) >= (1 << 15)) break;
    c->prec = prec;
    for (size_t i = 0; i < (size_t)out * ksize; i++) {
        double v = w[i] * (1 << prec);
        c->k[i] = v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v);
    }
    loom_free(w);
    return LOOM_OK;
}

static inline uint8_t clip8(int32_t v, int prec) {
    v >>= prec;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* src (h, sw, 3) -> dst (h, c->out, 3) along x. */
static void resize_h(const uint8_t *src, int sw, int h, uint8_t *dst, int dw, const aa_coeffs *c) {
    int32_t half = c->prec ? 1 << (c->prec - 1) : 0;
    for (int y = 0; y < h; y++) {
        const uint8_t *s = src + (size_t)y * sw * 3;
        uint8_t *d = dst + (size_t)y * dw * 3;
        for (int x = 0; x < dw; x++) {
            const int32_t *k = c->k + (size_t)x * c->ksize;
            const uint8_t *p = s + (size_t)c->lo[x] * 3;
            int32_t r = half, g = half, b = half;
            for (int j = 0; j < c->len[x]; j++, p += 3) {
                r += p[0] * k[j];
                g += p[1] * k[j];
                b += p[2] * k[j];
            }
            d[3 * x] = clip8(r, c->prec);
            d[3 * x + 1] = clip8(g, c->prec);
            d[3 * x + 2] = clip8(b, c->prec);
        }
    }
}

/* src (sh, w, 3) -> dst (dh, w, 3) along y. */
static void resize_v(const uint8_t *src, int w, uint8_t *dst, int dh, const aa_coeffs *c) {
    int32_t half = c->prec ? 1 << (c->prec - 1) : 0;
    size_t stride = (size_t)w * 3;
    for (int y = 0; y < dh; y++) {
        const int32_t *k = c->k + (size_t)y * c->ksize;
        const uint8_t *s = src + (size_t)c->lo[y] * stride;
        uint8_t *d = dst + (size_t)y * stride;
        for (size_t i = 0; i < stride; i++) {
            int32_t v = half;
            for (int j = 0; j < c->len[y]; j++) v += s[(size_t)j * stride + i] * k[j];
            d[i] = clip8(v, c->prec);
        }
    }
}

loom_status loom_image_resize(const loom_image *img, int w, int h, int resample, loom_imgproc_backend backend,
                              loom_image *out) {
    memset(out, 0, sizeof *out);
    if (resample != LOOM_RESAMPLE_BILINEAR && resample != LOOM_RESAMPLE_BICUBIC)
        return loom_err(LOOM_ERR_UNSUPPORTED, "resize: resample %d is not bilinear (2) or bicubic (3)", resample);
    if (img->w <= 0 || img->h <= 0 || w <= 0 || h <= 0 ||
        (uint64_t)w * h > LOOM_IMAGE_MAX_PIXELS || (uint64_t)w * img->h > LOOM_IMAGE_MAX_PIXELS)
        return loom_err(LOOM_ERR_INVALID_ARG, "resize: %dx%d -> %dx%d is empty or over %llu pixels",
                        img->w, img->h, w, h, (unsigned long long)LOOM_IMAGE_MAX_PIXELS);
    out->rgb = loom_alloc_raw((size_t)w * h * 3);
    if (!out->rgb) return loom_err(LOOM_ERR_NOMEM, "resize: out of memory for %dx%d", w, h);
    out->w = w;
    out->h = h;
    const uint8_t *src = img->rgb;
    uint8_t *tmp = NULL;
    aa_coeffs c;
    loom_status s = LOOM_OK;
    if (w != img->w) {
        /* horizontal into the output when it is the only pass */
        uint8_t *dst = h == img->h ? out->rgb : (tmp = loom_alloc_raw((size_t)w * img->h * 3));
        if (!dst) {
            s = loom_err(LOOM_ERR_NOMEM, "resize: out of memory for %dx%d", w, img->h);
            goto done;
        }
        if ((s = aa_coeffs_make(img->w, w, resample, backend, &c)) != LOOM_OK) goto done;
        resize_h(img->rgb, img->w, img->h, dst, w, &c);
        aa_coeffs_free(&c);
        src = dst;
    }
    if (h != img->h) {
        if ((s = aa_coeffs_make(img->h, h, resample, backend, &c)) != LOOM_OK) goto done;
        resize_v(src, w, out->rgb, h, &c);
        aa_coeffs_free(&c);
    } else if (w == img->w) {
        memcpy(out->rgb, img->rgb, (size_t)w * h * 3);
    }
done:
    loom_free(tmp);
    if (s != LOOM_OK) image_release(out);
    return s;
}

/* ---- preprocessor_config.json ---- */

static const float clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
static const float clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};

/* What a JSON value is, for "found ..." in a message: its number, or its
 * kind. */
static const char *json_found(const cJSON *f, char *buf, size_t n) {
    if (cJSON_IsNumber(f)) snprintf(buf, n, "%.17g", f->valuedouble);
    else if (cJSON_IsString(f)) snprintf(buf, n, "a string");
    else if (cJSON_IsBool(f)) snprintf(buf, n, "%s", cJSON_IsTrue(f) ? "true" : "false");
    else if (cJSON_IsArray(f)) snprintf(buf, n, "an array");
    else snprintf(buf, n, "an object");
    return buf;
}

/* A number field; absent (or null) leaves *v. Not a number or out of
 * [lo, hi] is an error naming the field, the range and what was found. */
static loom_status get_num(const cJSON *o, const char *name, double lo, double hi, double *v) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    char buf[32];
    if (!f || cJSON_IsNull(f)) return LOOM_OK;
    if (!cJSON_IsNumber(f) || !(f->valuedouble >= lo && f->valuedouble <= hi))
        return loom_err(LOOM_ERR_FORMAT, "%s: expected a number in [%g, %g], found %s", name, lo, hi,
                        json_found(f, buf, sizeof buf));
    *v = f->valuedouble;
    return LOOM_OK;
}

/* The same for an integer; required: absent is an error too. */
static loom_status get_int(const cJSON *o, const char *name, int64_t lo, int64_t hi, int required,
                           int64_t *v) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    char buf[32];
    if (!f || cJSON_IsNull(f)) {
        if (required) return loom_err(LOOM_ERR_FORMAT, "%s: missing (expected an integer)", name);
        return LOOM_OK;
    }
    double d = f->valuedouble;
    if (!cJSON_IsNumber(f) || d != floor(d) || d < (double)lo || d > (double)hi)
        return loom_err(LOOM_ERR_FORMAT, "%s: expected an integer in [%lld, %lld], found %s", name,
                        (long long)lo, (long long)hi, json_found(f, buf, sizeof buf));
    *v = (int64_t)d;
    return LOOM_OK;
}

static loom_status get_bool(const cJSON *o, const char *name, int *v) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    char buf[32];
    if (!f || cJSON_IsNull(f)) return LOOM_OK;
    if (!cJSON_IsBool(f))
        return loom_err(LOOM_ERR_FORMAT, "%s: expected true or false, found %s", name,
                        json_found(f, buf, sizeof buf));
    *v = cJSON_IsTrue(f);
    return LOOM_OK;
}

/* image_mean / image_std: three numbers, or one for every channel. */
static loom_status get_rgb(const cJSON *o, const char *name, int nonzero, float v[3]) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!f || cJSON_IsNull(f)) return LOOM_OK;
    double d[3];
    if (cJSON_IsNumber(f)) {
        d[0] = d[1] = d[2] = f->valuedouble;
    } else if (cJSON_IsArray(f) && cJSON_GetArraySize(f) == 3) {
        for (int i = 0; i < 3; i++) {
            const cJSON *e = cJSON_GetArrayItem(f, i);
            if (!cJSON_IsNumber(e)) return loom_err(LOOM_ERR_FORMAT, "%s[%d]: expected a number", name, i);
            d[i] = e->valuedouble;
        }
    } else {
        return loom_err(LOOM_ERR_FORMAT, "%s: expected 3 numbers (R, G, B), found %s", name,
                        cJSON_IsArray(f) ? "an array of another length" : "another type");
    }
    for (int i = 0; i < 3; i++) {
        if (!isfinite(d[i]) || fabs(d[i]) > 1e6 || (nonzero && d[i] == 0))
            return loom_err(LOOM_ERR_FORMAT, "%s[%d]: expected a finite%s number, found %g", name, i,
                            nonzero ? " non-zero" : "", d[i]);
        v[i] = (float)d[i];
    }
    return LOOM_OK;
}

#define TRY(x) do { loom_status s_ = (x); if (s_ != LOOM_OK) return s_; } while (0)

static loom_status parse_qwen(const cJSON *j, loom_imgproc *p) {
    int64_t v;
    TRY(get_int(j, "patch_size", 1, 1024, 1, &v));
    p->patch_size = (int)v;
    TRY(get_int(j, "merge_size", 1, 64, 1, &v));
    p->merge_size = (int)v;
    TRY(get_int(j, "temporal_patch_size", 1, 64, 1, &v));
    p->temporal_patch_size = (int)v;
    /* HF's defaults; size holds both keys or is refused, and
     * min_pixels/max_pixels, where given, override it */
    p->min_pixels = 56 * 56;
    p->max_pixels = 28 * 28 * 1280;
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(j, "size");
    if (size && !cJSON_IsNull(size)) {
        if (!cJSON_IsObject(size) || !cJSON_GetObjectItemCaseSensitive(size, "shortest_edge") ||
            !cJSON_GetObjectItemCaseSensitive(size, "longest_edge"))
            return loom_err(LOOM_ERR_FORMAT, "size: expected {\"shortest_edge\": N, \"longest_edge\": N} "
                            "(minimum and maximum pixel counts)");
        if (get_int(size, "shortest_edge", 1, INT64_C(1) << 40, 1, &p->min_pixels) != LOOM_OK ||
            get_int(size, "longest_edge", 1, INT64_C(1) << 40, 1, &p->max_pixels) != LOOM_OK)
            return loom_err_wrap(LOOM_ERR_FORMAT, "size");
    }
    TRY(get_int(j, "min_pixels", 1, INT64_C(1) << 40, 0, &p->min_pixels));
    TRY(get_int(j, "max_pixels", 1, INT64_C(1) << 40, 0, &p->max_pixels));
    if (p->min_pixels > p->max_pixels)
        return loom_err(LOOM_ERR_FORMAT, "min_pixels %lld is above max_pixels %lld",
                        (long long)p->min_pixels, (long long)p->max_pixels);
    return LOOM_OK;
}

static loom_status parse_gemma(const cJSON *j, loom_imgproc *p) {
    int pan = 0;
    TRY(get_bool(j, "do_pan_and_scan", &pan));
    if (pan) return loom_err(LOOM_ERR_UNSUPPORTED, "do_pan_and_scan: true is not supported");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(j, "size");
    if (!cJSON_IsObject(size))
        return loom_err(LOOM_ERR_FORMAT, "size: %s (expected {\"height\": H, \"width\": W})",
                        size ? "not an object" : "missing");
    int64_t h, w;
    if (get_int(size, "height", 1, 8192, 1, &h) != LOOM_OK || get_int(size, "width", 1, 8192, 1, &w) != LOOM_OK)
        return loom_err_wrap(LOOM_ERR_FORMAT, "size");
    p->height = (int)h;
    p->width = (int)w;
    return LOOM_OK;
}

loom_status loom_imgproc_parse(const char *json, const char *config_json, loom_imgproc *out) {
    memset(out, 0, sizeof *out);
    cJSON *j = cJSON_Parse(json);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return loom_err(LOOM_ERR_FORMAT, "preprocessor_config.json: not a JSON object");
    }
    loom_imgproc p = {.do_resize = 1, .do_rescale = 1, .do_normalize = 1, .rescale_factor = 1.0 / 255};
    loom_status s = LOOM_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "image_processor_type");
    const char *type = cJSON_IsString(t) ? t->valuestring : NULL;
    if (!type) {
        s = loom_err(LOOM_ERR_FORMAT, "image_processor_type: %s (expected a string such as "
                     "\"Qwen2VLImageProcessor\")", t ? "not a string" : "missing");
        goto done;
    }
    if (!strcmp(type, "Qwen2VLImageProcessor") || !strcmp(type, "Qwen2VLImageProcessorFast")) {
        p.kind = LOOM_IMGPROC_QWEN2VL;
        p.resample = LOOM_RESAMPLE_BICUBIC;
        memcpy(p.image_mean, clip_mean, sizeof clip_mean);
        memcpy(p.image_std, clip_std, sizeof clip_std);
        s = parse_qwen(j, &p);
    } else if (!strcmp(type, "Gemma3ImageProcessor") || !strcmp(type, "Gemma3ImageProcessorFast")) {
        p.kind = LOOM_IMGPROC_GEMMA3;
        p.resample = LOOM_RESAMPLE_BILINEAR;
        for (int i = 0; i < 3; i++) p.image_mean[i] = p.image_std[i] = 0.5f;
        s = parse_gemma(j, &p);
    } else {
        s = loom_err(LOOM_ERR_UNSUPPORTED, "image_processor_type \"%s\" is not supported "
                     "(Qwen2VLImageProcessor, Gemma3ImageProcessor are)", type);
    }
    if (s != LOOM_OK) goto done;
    int64_t resample = p.resample;
    double rescale = p.rescale_factor;
    if ((s = get_bool(j, "do_resize", &p.do_resize)) != LOOM_OK ||
        (s = get_bool(j, "do_rescale", &p.do_rescale)) != LOOM_OK ||
        (s = get_bool(j, "do_normalize", &p.do_normalize)) != LOOM_OK ||
        (s = get_int(j, "resample", 0, 5, 0, &resample)) != LOOM_OK ||
        (s = get_num(j, "rescale_factor", 1e-12, 1e12, &rescale)) != LOOM_OK ||
        (s = get_rgb(j, "image_mean", 0, p.image_mean)) != LOOM_OK ||
        (s = get_rgb(j, "image_std", 1, p.image_std)) != LOOM_OK)
        goto done;
    if (resample != LOOM_RESAMPLE_BILINEAR && resample != LOOM_RESAMPLE_BICUBIC) {
        s = loom_err(LOOM_ERR_UNSUPPORTED, "resample: %lld is not supported (2 bilinear, 3 bicubic are)",
                     (long long)resample);
        goto done;
    }
    p.resample = (int)resample;
    p.rescale_factor = rescale;
    if (p.kind == LOOM_IMGPROC_GEMMA3 && config_json) {
        cJSON *c = cJSON_Parse(config_json);
        int64_t n = 0;
        if (!cJSON_IsObject(c))
            s = loom_err(LOOM_ERR_FORMAT, "config.json: not a JSON object");
        else
            s = get_int(c, "mm_tokens_per_image", 1, 1 << 20, 0, &n);
        cJSON_Delete(c);
        if (s != LOOM_OK) {
            s = loom_err_wrap(s, "config.json");
            goto done;
        }
        p.tokens_per_image = (int)n;
    }
    *out = p;
done:
    cJSON_Delete(j);
    return s == LOOM_OK ? s : loom_err_wrap(s, "preprocessor_config.json");
}

loom_status loom_imgproc_load(const char *model_dir, loom_imgproc *out) {
    memset(out, 0, sizeof *out);
    char path[4096];
    char *text = NULL, *config = NULL;
    if (loom_path_join(path, sizeof path, model_dir, "preprocessor_config.json") != LOOM_OK)
        return loom_err(LOOM_ERR_INVALID_ARG, "%s: path too long", model_dir);
    loom_status s = loom_read_file(path, &text, NULL);
    if (s != LOOM_OK) return s;
    if (loom_path_join(path, sizeof path, model_dir, "config.json") == LOOM_OK &&
        loom_read_file(path, &config, NULL) != LOOM_OK)
        loom_err_clear();  /* optional: only Gemma's token count is read from it */
    s = loom_imgproc_parse(text, config, out);
    free(text);
    free(config);
    if (s == LOOM_OK && out->kind == LOOM_IMGPROC_GEMMA3 && out->tokens_per_image <= 0)
        s = loom_err(LOOM_ERR_FORMAT, "config.json: mm_tokens_per_image: missing (the soft tokens an "
                     "image takes)");
    return s == LOOM_OK ? s : loom_err_wrap(s, "%s", model_dir);
}

/* ---- planning ---- */

/* transformers' smart_resize: the nearest multiples of factor (Python's
 * round, half to even), scaled down or up by sqrt of the pixel-count ratio
 * when outside [min_px, max_px]. */
static loom_status smart_resize(int h, int w, int factor, int64_t min_px, int64_t max_px, int *oh, int *ow) {
    int lo = LOOM_MIN(h, w), hi = LOOM_MAX(h, w);
    if ((double)hi / lo > 200)
        return loom_err(LOOM_ERR_INVALID_ARG, "image %dx%d: aspect ratio %.1f is over 200", w, h,
                        (double)hi / lo);
    double hb = rint((double)h / factor) * factor, wb = rint((double)w / factor) * factor;
    if (hb * wb > (double)max_px) {
        double beta = sqrt((double)h * w / (double)max_px);
        hb = LOOM_MAX((double)factor, floor(h / beta / factor) * factor);
        wb = LOOM_MAX((double)factor, floor(w / beta / factor) * factor);
    } else if (hb * wb < (double)min_px) {
        double beta = sqrt((double)min_px / ((double)h * w));
        hb = ceil(h * beta / factor) * factor;
        wb = ceil(w * beta / factor) * factor;
    }
    if (hb < factor || wb < factor || hb * wb > (double)LOOM_IMAGE_MAX_PIXELS)
        return loom_err(LOOM_ERR_INVALID_ARG, "image %dx%d: resized to %.0fx%.0f, outside [%d, %llu pixels]",
                        w, h, wb, hb, factor * factor, (unsigned long long)LOOM_IMAGE_MAX_PIXELS);
    *oh = (int)hb;
    *ow = (int)wb;
    return LOOM_OK;
}

loom_status loom_imgproc_plan_image(const loom_imgproc *p, int w, int h, loom_imgproc_plan *out) {
    memset(out, 0, sizeof *out);
    if (w <= 0 || h <= 0) return loom_err(LOOM_ERR_INVALID_ARG, "image %dx%d is empty", w, h);
    out->grid_t = out->grid_h = out->grid_w = 1;
    if (p->kind == LOOM_IMGPROC_GEMMA3) {
        out->resized_w = p->do_resize ? p->width : w;
        out->resized_h = p->do_resize ? p->height : h;
        out->n_tokens = p->tokens_per_image;
        out->ndim = 3;
        out->shape[0] = 3;
        out->shape[1] = out->resized_h;
        out->shape[2] = out->resized_w;
        return LOOM_OK;
    }
    int ps = p->patch_size, factor = ps * p->merge_size;
    if (p->do_resize) {
        TRY(smart_resize(h, w, factor, p->min_pixels, p->max_pixels, &out->resized_h, &out->resized_w));
    } else {
        if (h % factor || w % factor)
            return loom_err(LOOM_ERR_INVALID_ARG, "image %dx%d: without do_resize both sides must be "
                            "multiples of patch_size * merge_size = %d", w, h, factor);
        out->resized_h = h;
        out->resized_w = w;
    }
    /* one image is one frame, repeated temporal_patch_size times: one
     * temporal patch */
    out->grid_h = out->resized_h / ps;
    out->grid_w = out->resized_w / ps;
    out->n_tokens = out->grid_t * out->grid_h * out->grid_w / (p->merge_size * p->merge_size);
    out->ndim = 2;
    out->shape[0] = (int64_t)out->grid_t * out->grid_h * out->grid_w;
    out->shape[1] = (int64_t)3 * p->temporal_patch_size * ps * ps;
    return LOOM_OK;
}

/* ---- running ---- */

/* What each uint8 level of each channel becomes, computed as the chosen
 * processor computes it. torchvision: rescale and normalise fused into
 * (x - mean/r) / (std/r) in float32, the factors rounded to float32. PIL:
 * x * r in double rounded to float32, then (x - mean) / std in float32. */
static void level_table(const loom_imgproc *p, float lut[3][256]) {
    float inv = (float)(1.0 / p->rescale_factor), r = (float)p->rescale_factor;
    int pil = p->backend == LOOM_IMGPROC_PIL;
    for (int c = 0; c < 3; c++) {
        float m = p->image_mean[c], sd = p->image_std[c];
        if (p->do_rescale && p->do_normalize && !pil) {
            m *= inv;
            sd *= inv;
        }
        for (int u = 0; u < 256; u++) {
            float x = (float)u;
            if (pil && p->do_rescale) x = (float)(u * p->rescale_factor);
            else if (p->do_rescale && !p->do_normalize) x = x * r;
            lut[c][u] = p->do_normalize ? (x - m) / sd : x;
        }
    }
}

loom_status loom_imgproc_run(const loom_imgproc *p, const loom_image *img, loom_imgproc_out *out) {
    memset(out, 0, sizeof *out);
    if (!img || !img->rgb) return loom_err(LOOM_ERR_INVALID_ARG, "imgproc: no image");
    loom_imgproc_plan pl;
    TRY(loom_imgproc_plan_image(p, img->w, img->h, &pl));
    loom_image rs = {0};
    const loom_image *src = img;
    if (pl.resized_w != img->w || pl.resized_h != img->h) {
        TRY(loom_image_resize(img, pl.resized_w, pl.resized_h, p->resample, p->backend, &rs));
        src = &rs;
    }
    size_t n = (size_t)pl.shape[0] * pl.shape[1] * (pl.ndim == 3 ? pl.shape[2] : 1);
    float *o = loom_alloc_raw(n * sizeof *o);
    if (!o) {
        image_release(&rs);
        return loom_err(LOOM_ERR_NOMEM, "imgproc: out of memory for %zu pixel values", n);
    }
    float lut[3][256];
    level_table(p, lut);
    const uint8_t *px = src->rgb;
    int W = src->w, H = src->h;
    if (p->kind == LOOM_IMGPROC_GEMMA3) {
        for (int c = 0; c < 3; c++)
            for (size_t i = 0; i < (size_t)W * H; i++) o[c * (size_t)W * H + i] = lut[c][px[3 * i + c]];
    } else {
        /* rows: merge windows in row-major order, the merge x merge patches
         * of a window row-major; a row: channel, t, y, x */
        int P = p->patch_size, m = p->merge_size, T = p->temporal_patch_size;
        int gh = pl.grid_h, gw = pl.grid_w;
        size_t dim = (size_t)pl.shape[1], row = 0;
        for (int bh = 0; bh < gh / m; bh++)
            for (int bw = 0; bw < gw / m; bw++)
                for (int mh = 0; mh < m; mh++)
                    for (int mw = 0; mw < m; mw++, row++) {
                        int y0 = (bh * m + mh) * P, x0 = (bw * m + mw) * P;
                        float *r = o + row * dim;
                        for (int c = 0; c < 3; c++)
                            for (int t = 0; t < T; t++)
                                for (int y = 0; y < P; y++)
                                    for (int x = 0; x < P; x++)
                                        *r++ = lut[c][px[((size_t)(y0 + y) * W + x0 + x) * 3 + c]];
                    }
    }
    image_release(&rs);
    out->plan = pl;
    out->pixel_values = o;
    out->n = n;
    return LOOM_OK;
}

void loom_imgproc_out_free(loom_imgproc_out *o) {
    if (!o) return;
    loom_free(o->pixel_values);
    memset(o, 0, sizeof *o);
}
