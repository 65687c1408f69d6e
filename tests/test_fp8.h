/* Writes FP8 checkpoints from a float one, for tests (test_fp8.c and the
 * GPU forward test): every linear of the decoder layers ("*_proj.weight"
 * under ".layers.") quantized to e4m3 the way the Hugging Face FP8
 * checkpoints store them, the other tensors copied, config.json given a
 * quantization_config; and optionally the "dequantized twin": the same
 * model with those weights stored as F32 code * scale, the weights the FP8
 * model must behave as. */
#ifndef LOOM_TEST_FP8_H
#define LOOM_TEST_FP8_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "load/safetensors.h"

enum { TEST_FP8_BLOCK, TEST_FP8_CHANNEL, TEST_FP8_TENSOR };

typedef struct test_fp8_variant {
    const char *name;
    int layout;            /* TEST_FP8_BLOCK (128 x 128), _CHANNEL, _TENSOR */
    int bf16_layer;        /* layer whose scales are BF16 (-1: none) */
    const char *scale_suffix; /* "_scale_inv" or "_scale" after ".weight" */
    const char *qcfg;      /* quantization_config, JSON */
    /* damage for the refusal cases */
    const char *drop;      /* a tensor left out */
    const char *bad_shape; /* a scale written one column too wide */
    int no_qcfg;           /* config.json without quantization_config */
} test_fp8_variant;

#define TEST_FP8_HF "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": " \
                    "\"dynamic\", \"weight_block_size\": [128, 128]}"

static inline int test_fp8_is_linear(const char *name) {
    size_t n = strlen(name);
    return strstr(name, ".layers.") && n > 12 && !strcmp(name + n - 12, "_proj.weight");
}

/* Quantizes w [rows, cols] as the FP8 checkpoints do: per block, scale =
 * amax / 448 (stored as F32, or BF16 when bf16), codes = e4m3(w / scale
 * as stored); deq gets code * scale rounded to f32. */
static inline void test_fp8_quantize(const float *w, int rows, int cols, int br, int bc, int bf16,
                                     uint8_t *q, void *scales, float *deq) {
    int sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    for (int a = 0; a < sr; a++)
        for (int b = 0; b < sc; b++) {
            float amax = 0;
            for (int i = a * br; i < LOOM_MIN(rows, (a + 1) * br); i++)
                for (int j = b * bc; j < LOOM_MIN(cols, (b + 1) * bc); j++)
                    amax = fmaxf(amax, fabsf(w[(size_t)i * cols + j]));
            float s = fmaxf(amax, 1e-12f) / 448.0f;
            if (bf16) {
                uint16_t h = loom_f32_to_bf16(s);
                ((uint16_t *)scales)[a * sc + b] = h;
                s = loom_bf16_to_f32(h);
            } else {
                ((float *)scales)[a * sc + b] = s;
            }
            for (int i = a * br; i < LOOM_MIN(rows, (a + 1) * br); i++)
                for (int j = b * bc; j < LOOM_MIN(cols, (b + 1) * bc); j++) {
                    size_t k = (size_t)i * cols + j;
                    q[k] = loom_f32_to_e4m3(w[k] / s);
                    deq[k] = loom_e4m3_to_f32(q[k]) * s;
                }
        }
}

/* src's config.json into dir, with quantization_config qcfg (NULL: as is). */
static inline int test_fp8_config(const char *src, const char *dir, const char *qcfg) {
    char path[4096], *text = NULL;
    size_t n;
    snprintf(path, sizeof path, "%s/config.json", src);
    if (loom_read_file(path, &text, &n) != LOOM_OK || !text) return 0;
    char *end = strrchr(text, '}');
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (f && qcfg) fprintf(f, "%.*s, \"quantization_config\": %s}\n", (int)(end - text), text, qcfg);
    else if (f) fputs(text, f);
    int ok = f && fclose(f) == 0;
    free(text);
    return ok;
}

/* fp8_dir: the FP8 checkpoint of src as v says; deq_dir (when not NULL):
 * its dequantized twin. 1 when both were written. */
static inline int test_fp8_write(const char *src_dir, const char *fp8_dir, const char *deq_dir,
                                 const test_fp8_variant *v) {
    mkdir(fp8_dir, 0700);
    if (deq_dir) mkdir(deq_dir, 0700);
    int ok = test_fp8_config(src_dir, fp8_dir, v->no_qcfg ? NULL : v->qcfg);
    if (deq_dir) ok = ok && test_fp8_config(src_dir, deq_dir, NULL);
    loom_safetensors *src = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    if (!ok || loom_st_open(path, &src) != LOOM_OK) return 0;
    int cnt = loom_st_count(src), k = 0, kd = 0, no = 0;
    loom_st_write_entry *e = calloc((size_t)cnt * 2, sizeof *e), *d = calloc((size_t)cnt, sizeof *d);
    void **owned = calloc((size_t)cnt * 5, sizeof *owned);
    for (int i = 0; i < cnt; i++) {
        const loom_st_tensor *t = loom_st_at(src, i);
        loom_st_write_entry ent = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                   .data = t->data};
        memcpy(ent.shape, t->shape, sizeof t->shape);
        int fl = t->dtype == LOOM_DT_F32 || t->dtype == LOOM_DT_BF16 || t->dtype == LOOM_DT_F16;
        if (!test_fp8_is_linear(t->name) || t->ndim != 2 || !fl) {
            if (!v->drop || strcmp(v->drop, t->name)) e[k++] = ent;
            d[kd++] = ent;
            continue;
        }
        int rows = (int)t->shape[0], cols = (int)t->shape[1];
        size_t nw = (size_t)rows * cols;
        int layer = atoi(strstr(t->name, ".layers.") + 8);
        int br = v->layout == TEST_FP8_BLOCK ? 128 : v->layout == TEST_FP8_CHANNEL ? 1 : rows;
        int bc = v->layout == TEST_FP8_BLOCK ? 128 : cols;
        int sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc, bf16 = layer == v->bf16_layer;
        float *wf = malloc(sizeof(float) * nw), *deq = malloc(sizeof(float) * nw);
        for (size_t j = 0; j < nw; j++)
            wf[j] = t->dtype == LOOM_DT_F32 ? ((const float *)t->data)[j]
                    : t->dtype == LOOM_DT_BF16 ? loom_bf16_to_f32(((const uint16_t *)t->data)[j])
                                               : loom_f16_to_f32(((const uint16_t *)t->data)[j]);
        uint8_t *q = malloc(nw);
        void *s = calloc((size_t)sr * (sc + 1), 4);
        test_fp8_quantize(wf, rows, cols, br, bc, bf16, q, s, deq);
        free(wf);
        char *sname = malloc(strlen(t->name) + 32);
        snprintf(sname, strlen(t->name) + 32, "%s%s", t->name, v->scale_suffix);
        owned[no++] = q, owned[no++] = s, owned[no++] = deq, owned[no++] = sname;
        loom_st_write_entry qe = ent, se = {.name = sname, .dtype = bf16 ? LOOM_DT_BF16 : LOOM_DT_F32,
                                            .data = s};
        qe.dtype = LOOM_DT_F8_E4M3;
        qe.data = q;
        if (v->layout == TEST_FP8_TENSOR) {
            se.ndim = 1, se.shape[0] = 1;
        } else {
            se.ndim = 2, se.shape[0] = sr, se.shape[1] = sc;
            if (v->bad_shape && !strcmp(v->bad_shape, sname)) se.shape[1] = sc + 1;
        }
        if (!v->drop || strcmp(v->drop, qe.name)) e[k++] = qe;
        if (!v->drop || strcmp(v->drop, sname)) e[k++] = se;
        loom_st_write_entry de = ent;
        de.dtype = LOOM_DT_F32;
        de.data = deq;
        d[kd++] = de;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", fp8_dir);
    ok = loom_st_write(path, e, k) == LOOM_OK;
    if (deq_dir) {
        snprintf(path, sizeof path, "%s/model.safetensors", deq_dir);
        ok = ok && loom_st_write(path, d, kd) == LOOM_OK;
    }
    for (int i = 0; i < no; i++) free(owned[i]);
    free(owned);
    free(e);
    free(d);
    loom_st_close(src);
    return ok;
}

#endif
