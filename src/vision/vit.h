/* vit: the pieces the vision towers (qwen_vit.c, qwen25_vit.c, siglip.c)
 * share:
 * weight binding by Hugging Face name under one of several prefixes,
 * owned f32 vectors, linear layers over the model's matmul, norms,
 * activations, rotary and bidirectional attention inside segments of a
 * sequence.
 * Not part of the model API.
 *
 * A tower's matrices are borrowed from the mapping (F32, F16 or BF16) and
 * multiplied through loom_fwd_matmul, so only m->pool and m->k of the
 * loom_model they are given are read. Vectors (biases, norms, position
 * tables) are converted to f32 once and owned by the tower's loom_vit_mem.
 * Everything a forward computes is f32; reductions that set a row's scale
 * (layer norm statistics, activations) go through double. */
#ifndef LOOM_VIT_H
#define LOOM_VIT_H

#include <cjson/cJSON.h>

#include "model/model.h"

typedef enum loom_vit_act {
    LOOM_VIT_SILU,        /* "silu" */
    LOOM_VIT_GELU_TANH,   /* "gelu_pytorch_tanh", "gelu_new" */
    LOOM_VIT_GELU,        /* "gelu": the erf form */
    LOOM_VIT_QUICK_GELU,  /* "quick_gelu": x * sigmoid(1.702 x) */
} loom_vit_act;

/* The activation a config names; an unknown name is an error naming it. */
loom_status loom_vit_act_parse(const char *name, loom_vit_act *out);
/* x = act(x) over n values. */
void loom_vit_act_apply(float *x, size_t n, loom_vit_act a);
/* g = act(g) * u over n values. */
void loom_vit_act_mul(float *g, const float *u, size_t n, loom_vit_act a);

/* Owned allocations of one tower, freed together. */
typedef struct loom_vit_mem {
    void **p;
    int n, cap;
} loom_vit_mem;

/* n zeroed floats owned by mem; NULL (error set) when out of memory. */
float *loom_vit_alloc(loom_vit_mem *mem, size_t n);
void loom_vit_mem_free(loom_vit_mem *mem);

/* The tensor prefix + name, or NULL. */
const loom_st_tensor *loom_vit_find(const loom_safetensors *st, const char *prefix,
                                    const char *name);

/* Binds prefix + name as a (rows, cols) matrix: a float tensor whose first
 * dimension is rows and whose other dimensions multiply to cols (a
 * convolution kernel [out, in, kh, kw] is a matrix over its flattened
 * patch). Borrowed from the mapping. */
loom_status loom_vit_weight(const loom_safetensors *st, const char *prefix, const char *name,
                            int rows, int cols, loom_weight *w);
/* Reads prefix + name, a float tensor of n values in any shape, into an
 * owned f32 vector. A missing tensor is an error unless optional (then
 * *out is NULL). */
loom_status loom_vit_vec(const loom_safetensors *st, loom_vit_mem *mem, const char *prefix,
                         const char *name, size_t n, int optional, const float **out);

/* y (T, w->rows) = x (T, w->cols) @ w^T (+ b when not NULL). */
void loom_vit_linear(loom_model *m, float *y, const float *x, const loom_weight *w,
                     const float *b, int T);
/* y (T, n) = layernorm(x) * w + b, row by row; y may alias x. */
void loom_vit_layernorm(float *y, const float *x, const float *w, const float *b, int T, int n,
                        float eps);
/* y (T, n) = x / rms(x) * w, row by row, in double; y may alias x. */
void loom_vit_rmsnorm(float *y, const float *x, const float *w, int T, int n, float eps);

/* Rotate-half rotary: in each of T rows (stride ld), each of heads heads
 * of hd values turns pair (i, i + hd / 2) by the row's angle, given as
 * cos and sin tables (T, hd / 2). */
void loom_vit_rope(float *x, int ld, int T, int heads, int hd, const float *cs, const float *sn);

/* The first prefix of list under which tensor probe exists, or NULL. */
const char *loom_vit_prefix(const loom_safetensors *st, const char *const *list, size_t n,
                            const char *probe);

/* Bidirectional softmax attention inside segments: the rows of segment s
 * are [cu[s], cu[s + 1]) and attend to every row of their segment, no
 * other. q, k and v are (T, n_heads * hd) with row stride ld; out (T,
 * n_heads * hd) is dense. Both products run on the matmul kernel, over
 * m's pool. */
loom_status loom_vit_attention(loom_model *m, float *out, const float *q, const float *k,
                               const float *v, int ld, int n_heads, int hd, const int *cu,
                               int n_seg, float scale);

/* Config helpers: an integer or number field of o (def when absent); a
 * present field of the wrong kind or outside [lo, hi] is an error naming
 * where.key. */
loom_status loom_vit_int(const cJSON *o, const char *where, const char *key, int def, int lo,
                         int hi, int *out);
loom_status loom_vit_num(const cJSON *o, const char *where, const char *key, double def,
                         double *out);

#endif
