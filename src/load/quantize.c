/* quantize: MLX affine quantization of a float checkpoint (the quantizer, a
 * streaming safetensors writer, and the directory-to-directory converter
 * behind `loom convert`).
 *
 * The quantizer reproduces MLX's affine rule bit for bit (checked against
 * checkpoints written by MLX): per group of `group` consecutive inputs,
 *   scale = max((max - min) / (2^bits - 1), 1e-7), negated unless |min| > |max|
 *   edge  = min if |min| > |max| else max
 *   q0    = rint(edge / scale); if q0 != 0: scale = edge / q0, bias = edge
 *           else bias = 0
 * scale and bias are stored rounded to the output dtype, and every element
 * gets
 *   q = clamp(rint((w - bias) / scale), 0, 2^bits - 1)
 * in f32. MLX's kernels (mlx/backend/cpu/quantized.cpp `quantize`, and the
 * Metal and CUDA ones) use the unrounded f32 scale and bias there; the MLX
 * checkpoints in tests/fixtures were packed with the stored (bf16-rounded)
 * ones, which is the default here (LOOM_QPACK_STORED: the levels are the
 * nearest for the scale the loader will use). LOOM_QPACK_F32 gives MLX's
 * kernels' rule. */
#include "load/quantize.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

static uint16_t to_half(float f, loom_dtype dt) {
    return dt == LOOM_DT_F16 ? loom_f32_to_f16(f) : loom_f32_to_bf16(f);
}
static float from_half(uint16_t h, loom_dtype dt) {
    return dt == LOOM_DT_F16 ? loom_f16_to_f32(h) : loom_bf16_to_f32(h);
}

int loom_quant_row(const float *w, int n, int bits, int group, loom_dtype out_dtype,
                   loom_quant_pack pack, uint32_t *packed, uint16_t *scales,
                   uint16_t *biases) {
    const float n_bins = (float)((1 << bits) - 1);
    const int per_word = 32 / bits;
    for (int g = 0; g < n / group; g++) {
        const float *x = w + (size_t)g * group;
        float hi = -INFINITY, lo = INFINITY;
        for (int j = 0; j < group; j++) {
            hi = x[j] > hi ? x[j] : hi;
            lo = x[j] < lo ? x[j] : lo;
        }
        if (!isfinite(hi) || !isfinite(lo)) return -1;
        int neg_edge = fabsf(lo) > fabsf(hi);
        float scale = (hi - lo) / n_bins;
        scale = scale > 1e-7f ? scale : 1e-7f;
        if (!neg_edge) scale = -scale;
        float edge = neg_edge ? lo : hi;
        float q0 = rintf(edge / scale), bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        scales[g] = to_half(scale, out_dtype);
        biases[g] = to_half(bias, out_dtype);
        float s = scale, b = bias;
        if (pack == LOOM_QPACK_STORED) {
            s = from_half(scales[g], out_dtype);
            b = from_half(biases[g], out_dtype);
        }
        uint32_t *out = packed + (size_t)g * group / per_word;
        for (int j = 0; j < group; j += per_word) {
            uint32_t word = 0;
            for (int k = 0; k < per_word; k++) {
                float q = rintf((x[j + k] - b) / s);
                q = q < 0.0f ? 0.0f : q > n_bins ? n_bins : q;
                word |= (uint32_t)q << (k * bits);
            }
            out[j / per_word] = word;
        }
    }
    return 0;
}

void loom_quant_dequant_row(const uint32_t *packed, const uint16_t *scales,
                            const uint16_t *biases, int n, int bits, int group,
                            loom_dtype scale_dtype, float *out) {
    const int per_word = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    for (int i = 0; i < n; i++) {
        uint32_t q = (packed[i / per_word] >> ((i % per_word) * bits)) & mask;
        float s = from_half(scales[i / group], scale_dtype);
        float b = from_half(biases[i / group], scale_dtype);
        out[i] = (float)q * s + b;
    }
}

/* ---- streaming safetensors writer ------------------------------------- */

struct loom_st_stream {
    FILE *f;                 /* owned */
    char *path, *tmp;        /* owned */
    uint64_t *sizes;         /* owned [n]: planned bytes of each tensor */
    int n, cur;              /* tensors planned; the one being written */
    uint64_t done;           /* bytes of tensor cur written so far */
    char **names;            /* owned [n], for messages */
};

static void stream_free(loom_st_stream *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    for (int i = 0; w->names && i < w->n; i++) free(w->names[i]);
    free(w->names);
    free(w->sizes);
    free(w->path);
    free(w->tmp);
    free(w);
}

void loom_st_stream_abort(loom_st_stream *w) {
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
    }
    if (w->tmp) unlink(w->tmp);
    stream_free(w);
}

loom_status loom_st_stream_open(const char *path, const loom_st_write_entry *plan, int n,
                                const char *format, loom_st_stream **out) {
    *out = NULL;
    loom_st_stream *w = calloc(1, sizeof *w);
    cJSON *h = cJSON_CreateObject();
    char *json = NULL;
    loom_status s = LOOM_ERR_NOMEM;
    if (!w || !h) goto fail;
    w->n = n;
    w->sizes = calloc((size_t)n + 1, sizeof *w->sizes);
    w->names = calloc((size_t)n + 1, sizeof *w->names);
    w->path = strdup(path);
    size_t tl = strlen(path) + 32;
    w->tmp = malloc(tl);
    if (!w->sizes || !w->names || !w->path || !w->tmp) goto fail;
    snprintf(w->tmp, tl, "%s.tmp.%d", path, (int)getpid());
    if (format) {
        cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
        if (!meta || !cJSON_AddStringToObject(meta, "format", format)) goto fail;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!(w->names[i] = strdup(plan[i].name))) goto fail;
        if (cJSON_GetObjectItemCaseSensitive(h, plan[i].name)) {
            s = loom_err(LOOM_ERR_INVALID_ARG, "%s: tensor %s planned twice", path, plan[i].name);
            goto fail;
        }
        cJSON *t = cJSON_AddObjectToObject(h, plan[i].name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        if (!shape) goto fail;
        uint64_t count = 1;
        for (int d = 0; d < plan[i].ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)plan[i].shape[d]));
            count *= (uint64_t)plan[i].shape[d];
        }
        w->sizes[i] = count * loom_dtype_size(plan[i].dtype);
        cJSON_AddStringToObject(t, "dtype", loom_dtype_name(plan[i].dtype));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        if (!offs) goto fail;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + w->sizes[i])));
        off += w->sizes[i];
    }
    if (!(json = cJSON_PrintUnformatted(h))) goto fail;
    /* Pad the header with spaces to 8 bytes so the data section is aligned. */
    size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
    if (!(w->f = fopen(w->tmp, "wb"))) {
        s = loom_err(LOOM_ERR_IO, "%s: %s", w->tmp, strerror(errno));
        goto fail;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    int ok = fwrite(len8, 1, 8, w->f) == 8 && fwrite(json, 1, jl, w->f) == jl;
    for (size_t i = jl; i < hl && ok; i++) ok = fputc(' ', w->f) != EOF;
    if (!ok) {
        s = loom_err(LOOM_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    free(json);
    cJSON_Delete(h);
    /* Skip tensors with no bytes so cur always names one still owed. */
    while (w->cur < w->n && w->sizes[w->cur] == 0) w->cur++;
    *out = w;
    return LOOM_OK;
fail:
    if (s == LOOM_ERR_NOMEM) loom_err(s, "%s: out of memory planning the header", path);
    free(json);
    cJSON_Delete(h);
    loom_st_stream_abort(w);
    return s;
}

loom_status loom_st_stream_write(loom_st_stream *w, const void *data, size_t nbytes) {
    const char *p = data;
    while (nbytes) {
        if (w->cur >= w->n)
            return loom_err(LOOM_ERR_INVALID_ARG, "%s: %zu bytes beyond the planned tensors",
                            w->path, nbytes);
        uint64_t left = w->sizes[w->cur] - w->done;
        size_t take = nbytes < left ? nbytes : (size_t)left;
        if (fwrite(p, 1, take, w->f) != take)
            return loom_err(LOOM_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
        p += take;
        nbytes -= take;
        w->done += take;
        if (w->done == w->sizes[w->cur]) {
            w->done = 0;
            w->cur++;
            while (w->cur < w->n && w->sizes[w->cur] == 0) w->cur++;
        }
    }
    return LOOM_OK;
}

loom_status loom_st_stream_finish(loom_st_stream *w) {
    loom_status s = LOOM_OK;
    if (w->cur < w->n) {
        s = loom_err(LOOM_ERR_INVALID_ARG, "%s: tensor %s got %llu of %llu bytes", w->path,
                     w->names[w->cur], (unsigned long long)w->done,
                     (unsigned long long)w->sizes[w->cur]);
        loom_st_stream_abort(w);
        return s;
    }
    int ok = fclose(w->f) == 0;
    w->f = NULL;
    if (!ok || rename(w->tmp, w->path) != 0) {
        s = loom_err(LOOM_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        loom_st_stream_abort(w);
        return s;
    }
    stream_free(w);
    return LOOM_OK;
}

/* ---- checkpoint conversion -------------------------------------------- */

static int is_float_dtype(loom_dtype t) {
    return t == LOOM_DT_F32 || t == LOOM_DT_F16 || t == LOOM_DT_BF16 || t == LOOM_DT_F64;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* mlx_lm quantizes the Linear and Embedding modules whose input dim splits
 * into groups; in a checkpoint those are the 2-D float ".weight" tensors
 * (norms are 1-D; conv kernels are 3-D). */
static int quantizable(const loom_st_tensor *t, int group) {
    return is_float_dtype(t->dtype) && t->ndim == 2 && ends_with(t->name, ".weight") &&
           !strstr(t->name, "norm") && t->shape[1] % group == 0 && t->shape[0] > 0;
}

/* count elements of a float tensor from element `first` into f32. */
static void read_floats(const loom_st_tensor *t, size_t first, size_t count, float *out) {
    switch (t->dtype) {
    case LOOM_DT_F32:
        memcpy(out, (const float *)t->data + first, count * sizeof(float));
        break;
    case LOOM_DT_F64:
        for (size_t i = 0; i < count; i++) out[i] = (float)((const double *)t->data)[first + i];
        break;
    case LOOM_DT_F16:
        for (size_t i = 0; i < count; i++)
            out[i] = loom_f16_to_f32(((const uint16_t *)t->data)[first + i]);
        break;
    default:
        for (size_t i = 0; i < count; i++)
            out[i] = loom_bf16_to_f32(((const uint16_t *)t->data)[first + i]);
        break;
    }
}

/* The tensor's element count. */
static size_t n_elems(const loom_st_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

#define CHUNK_ELEMS ((size_t)1 << 20)

/* Writes a packed weight (row blocks, as produced), then its scales and
 * biases. */
static loom_status write_quantized(loom_st_stream *w, const loom_st_tensor *t, int bits,
                                   int group, loom_quant_pack pack, loom_dtype hd,
                                   loom_convert_stats *st) {
    size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    size_t words = cols * (size_t)bits / 32, ng = cols / (size_t)group;
    size_t block = CHUNK_ELEMS / cols ? CHUNK_ELEMS / cols : 1;
    block = block < rows ? block : rows;
    float *x = malloc(block * cols * sizeof *x);
    uint32_t *q = malloc(block * words * sizeof *q);
    uint16_t *sc = malloc(rows * ng * sizeof *sc), *bi = malloc(rows * ng * sizeof *bi);
    loom_status s = LOOM_OK;
    if (!x || !q || !sc || !bi) {
        s = loom_err(LOOM_ERR_NOMEM, "tensor %s: out of memory", t->name);
        goto done;
    }
    for (size_t r0 = 0; r0 < rows && !s; r0 += block) {
        size_t nr = rows - r0 < block ? rows - r0 : block;
        read_floats(t, r0 * cols, nr * cols, x);
        for (size_t r = 0; r < nr; r++) {
            if (loom_quant_row(x + r * cols, (int)cols, bits, group, hd, pack, q + r * words,
                               sc + (r0 + r) * ng, bi + (r0 + r) * ng)) {
                s = loom_err(LOOM_ERR_FORMAT, "tensor %s: row %zu holds a NaN or infinity",
                             t->name, r0 + r);
                goto done;
            }
        }
        s = loom_st_stream_write(w, q, nr * words * sizeof *q);
        size_t esz = loom_dtype_size(t->dtype);
        loom_st_release((const char *)t->data + r0 * cols * esz, nr * cols * esz);
    }
    if (!s) s = loom_st_stream_write(w, sc, rows * ng * sizeof *sc);
    if (!s) s = loom_st_stream_write(w, bi, rows * ng * sizeof *bi);
    if (!s) st->bytes_out += rows * (words * 4 + ng * 4);
done:
    free(x);
    free(q);
    free(sc);
    free(bi);
    return s;
}

/* Writes a tensor unchanged, or a float one as the half dtype hd. */
static loom_status write_copy(loom_st_stream *w, const loom_st_tensor *t, loom_dtype hd,
                              loom_convert_stats *st) {
    if (!is_float_dtype(t->dtype) || t->dtype == hd) {
        st->bytes_out += t->nbytes;
        return loom_st_stream_write(w, t->data, t->nbytes);
    }
    size_t n = n_elems(t);
    float *x = malloc(CHUNK_ELEMS * sizeof *x);
    uint16_t *h = malloc(CHUNK_ELEMS * sizeof *h);
    loom_status s = LOOM_OK;
    if (!x || !h) s = loom_err(LOOM_ERR_NOMEM, "tensor %s: out of memory", t->name);
    for (size_t i = 0; i < n && !s; i += CHUNK_ELEMS) {
        size_t c = n - i < CHUNK_ELEMS ? n - i : CHUNK_ELEMS;
        read_floats(t, i, c, x);
        for (size_t k = 0; k < c; k++) h[k] = to_half(x[k], hd);
        s = loom_st_stream_write(w, h, c * sizeof *h);
        size_t esz = loom_dtype_size(t->dtype);
        loom_st_release((const char *)t->data + i * esz, c * esz);
    }
    st->bytes_out += n * 2;
    free(x);
    free(h);
    return s;
}

/* Copies file src to dst (atomically: temp + rename). */
static loom_status copy_file(const char *src, const char *dst) {
    char *data = NULL;
    size_t len = 0;
    loom_status s = loom_read_file(src, &data, &len);
    if (s) return s;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dst, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    if (f) ok = (fclose(f) == 0) && ok;
    free(data);
    if (!ok || rename(tmp, dst) != 0) {
        unlink(tmp);
        return loom_err(LOOM_ERR_IO, "%s: write failed: %s", dst, strerror(errno));
    }
    return LOOM_OK;
}

/* The files mlx_lm carries over besides weights and config.json. */
static const char *const aux_files[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
    "tokenizer.model", "chat_template.jinja", "chat_template.json",
};

/* 1 if dir holds entries other than . and .., 0 if empty, -1 on error. */
static int dir_nonempty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int any = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) any = 1;
    closedir(d);
    return any;
}

/* Reads src/config.json, refuses quantized sources, adds the quantization
 * keys. Caller frees *out with cJSON_Delete. */
static loom_status quantized_config(const char *src, int bits, int group, cJSON **out) {
    char path[4096], *text = NULL;
    size_t len;
    loom_status s = loom_path_join(path, sizeof path, src, "config.json");
    if (s || (s = loom_read_file(path, &text, &len))) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_err(LOOM_ERR_FORMAT, "%s: not a JSON object", path);
    }
    static const char *const qkeys[] = {"quantization", "quantization_config"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(qkeys); i++)
        if (cJSON_GetObjectItemCaseSensitive(root, qkeys[i])) {
            cJSON_Delete(root);
            return loom_err(LOOM_ERR_UNSUPPORTED, "%s: the checkpoint is already quantized "
                            "(has \"%s\"); expected F32/F16/BF16 weights", path, qkeys[i]);
        }
    for (size_t i = 0; i < LOOM_ARRAY_LEN(qkeys); i++) {
        cJSON *q = cJSON_AddObjectToObject(root, qkeys[i]);
        if (!q || !cJSON_AddNumberToObject(q, "group_size", group) ||
            !cJSON_AddNumberToObject(q, "bits", bits)) {
            cJSON_Delete(root);
            return loom_err(LOOM_ERR_NOMEM, "out of memory");
        }
    }
    *out = root;
    return LOOM_OK;
}

loom_status loom_convert_model(const char *src, const char *dst, const loom_convert_params *p,
                               loom_convert_stats *stats) {
    loom_convert_stats dummy;
    loom_convert_stats *st = stats ? stats : &dummy;
    memset(st, 0, sizeof *st);
    if (p->bits != 2 && p->bits != 4 && p->bits != 8)
        return loom_err(LOOM_ERR_UNSUPPORTED, "convert: %d-bit quantization is not supported "
                        "(expected 2, 4 or 8)", p->bits);
    if (p->group != 32 && p->group != 64 && p->group != 128)
        return loom_err(LOOM_ERR_UNSUPPORTED, "convert: group size %d is not supported "
                        "(expected 32, 64 or 128)", p->group);
    char rs[PATH_MAX], rd[PATH_MAX];
    if (realpath(src, rs) && realpath(dst, rd) && !strcmp(rs, rd))
        return loom_err(LOOM_ERR_INVALID_ARG, "convert: the output directory is the input (%s)",
                        src);

    cJSON *cfg = NULL;
    loom_safetensors *in = NULL;
    loom_st_write_entry *plan = NULL;
    loom_st_stream *w = NULL;
    char *text = NULL;
    char path[4096];
    loom_status s = quantized_config(src, p->bits, p->group, &cfg);
    if (s) return s;
    if ((s = loom_st_open_dir(src, &in))) goto done;

    /* Refuse packed sources; pick the half dtype: F16 for an F16
     * checkpoint (mlx_lm keeps a float16 model float16), else BF16. */
    int n = loom_st_count(in), nq = 0;
    loom_dtype hd = LOOM_DT_BF16;
    int seen_float = 0;
    for (int i = 0; i < n; i++) {
        const loom_st_tensor *t = loom_st_at(in, i);
        if (t->dtype == LOOM_DT_U32 || ends_with(t->name, ".scales")) {
            char d[96];
            loom_st_describe(t, d, sizeof d);
            s = loom_err(LOOM_ERR_UNSUPPORTED, "tensor %s: expected F32/F16/BF16, found %s "
                         "(the checkpoint is already quantized)", t->name, d);
            goto done;
        }
        if (quantizable(t, p->group)) {
            nq++;
            if (!seen_float) hd = t->dtype == LOOM_DT_F16 ? LOOM_DT_F16 : LOOM_DT_BF16;
            seen_float = 1;
        }
    }
    if (!nq) {
        s = loom_err(LOOM_ERR_UNSUPPORTED, "convert: no 2-D float weight of %s has an input "
                     "dimension divisible by %d", src, p->group);
        goto done;
    }

    /* The plan: a packed weight is followed by its scales and biases. */
    plan = calloc((size_t)n + 2 * (size_t)nq, sizeof *plan);
    char (*names)[2][300] = calloc((size_t)n, sizeof *names);
    if (!plan || !names) {
        free(names);
        s = loom_err(LOOM_ERR_NOMEM, "out of memory");
        goto done;
    }
    int np = 0;
    for (int i = 0; i < n; i++) {
        const loom_st_tensor *t = loom_st_at(in, i);
        loom_st_write_entry e = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(e.shape, t->shape, sizeof e.shape);
        if (quantizable(t, p->group)) {
            size_t ml = strlen(t->name) - strlen(".weight");
            e.dtype = LOOM_DT_U32;
            e.shape[1] = t->shape[1] * p->bits / 32;
            plan[np++] = e;
            for (int k = 0; k < 2; k++) {
                snprintf(names[i][k], sizeof names[i][k], "%.*s.%s", (int)ml, t->name,
                         k ? "biases" : "scales");
                plan[np] = (loom_st_write_entry){.name = names[i][k], .dtype = hd, .ndim = 2,
                                                 .shape = {t->shape[0], t->shape[1] / p->group}};
                np++;
            }
        } else {
            if (is_float_dtype(t->dtype)) e.dtype = hd;
            plan[np++] = e;
        }
    }

    /* The destination: created if missing, empty unless forced. */
    if (mkdir(dst, 0777) && errno != EEXIST) {
        s = loom_err(LOOM_ERR_IO, "%s: %s", dst, strerror(errno));
    } else {
        int ne = dir_nonempty(dst);
        if (ne < 0) s = loom_err(LOOM_ERR_IO, "%s: not a directory (%s)", dst, strerror(errno));
        else if (ne && !p->force)
            s = loom_err(LOOM_ERR_INVALID_ARG, "%s: the output directory is not empty "
                         "(--force writes into it)", dst);
    }
    if (!s) s = loom_path_join(path, sizeof path, dst, "model.safetensors");
    if (!s) s = loom_st_stream_open(path, plan, np, "mlx", &w);
    for (int i = 0; i < n && !s; i++) {
        const loom_st_tensor *t = loom_st_at(in, i);
        st->bytes_in += t->nbytes;
        if (quantizable(t, p->group)) {
            s = write_quantized(w, t, p->bits, p->group, p->pack, hd, st);
            st->n_quantized++;
        } else {
            s = write_copy(w, t, hd, st);
            st->n_copied++;
        }
        loom_st_release(t->data, t->nbytes);
    }
    free(names);
    if (s) goto done;
    s = loom_st_stream_finish(w);
    w = NULL;
    if (s) goto done;
    /* A sharded index left by an earlier conversion would shadow the
     * single file the loader now finds. */
    if (p->force && !loom_path_join(path, sizeof path, dst, "model.safetensors.index.json"))
        unlink(path);

    for (size_t i = 0; i < LOOM_ARRAY_LEN(aux_files) && !s; i++) {
        char from[4096];
        if (loom_path_join(from, sizeof from, src, aux_files[i]) ||
            loom_path_join(path, sizeof path, dst, aux_files[i]))
            continue;
        if (access(from, R_OK) == 0) s = copy_file(from, path);
    }
    /* config.json last: a directory without it is visibly unfinished. */
    if (!s && !(text = cJSON_Print(cfg))) s = loom_err(LOOM_ERR_NOMEM, "out of memory");
    if (!s) {
        char tmp[4200];
        loom_path_join(path, sizeof path, dst, "config.json");
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        size_t tl = strlen(text);
        int ok = f && fwrite(text, 1, tl, f) == tl && fputc('\n', f) != EOF;
        if (f) ok = (fclose(f) == 0) && ok;
        if (!ok || rename(tmp, path) != 0) {
            unlink(tmp);
            s = loom_err(LOOM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
    }
done:
    loom_st_stream_abort(w);
    free(text);
    free(plan);
    loom_st_close(in);
    cJSON_Delete(cfg);
    return s;
}
