#include "vision/vit.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/matmul.h"

loom_status loom_vit_act_parse(const char *name, loom_vit_act *out) {
    static const struct { const char *name; loom_vit_act act; } acts[] = {
        {"silu", LOOM_VIT_SILU}, {"swish", LOOM_VIT_SILU},
        {"gelu_pytorch_tanh", LOOM_VIT_GELU_TANH}, {"gelu_new", LOOM_VIT_GELU_TANH},
        {"gelu", LOOM_VIT_GELU}, {"quick_gelu", LOOM_VIT_QUICK_GELU},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(acts); i++)
        if (!strcmp(acts[i].name, name)) {
            *out = acts[i].act;
            return LOOM_OK;
        }
    return loom_err(LOOM_ERR_UNSUPPORTED, "vision activation \"%s\" is not supported (expected "
                    "silu, gelu, gelu_pytorch_tanh, gelu_new or quick_gelu)", name);
}

static double act1(double x, loom_vit_act a) {
    switch (a) {
    case LOOM_VIT_SILU: return x / (1.0 + exp(-x));
    case LOOM_VIT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case LOOM_VIT_GELU: return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
    case LOOM_VIT_QUICK_GELU: return x / (1.0 + exp(-1.702 * x));
    }
    return x;
}

void loom_vit_act_apply(float *x, size_t n, loom_vit_act a) {
    for (size_t i = 0; i < n; i++) x[i] = (float)act1(x[i], a);
}

void loom_vit_act_mul(float *g, const float *u, size_t n, loom_vit_act a) {
    for (size_t i = 0; i < n; i++) g[i] = (float)act1(g[i], a) * u[i];
}

float *loom_vit_alloc(loom_vit_mem *mem, size_t n) {
    if (mem->n == mem->cap) {
        int cap = mem->cap ? mem->cap * 2 : 64;
        void **p = realloc(mem->p, (size_t)cap * sizeof *p);
        if (!p) {
            loom_err(LOOM_ERR_NOMEM, "out of memory");
            return NULL;
        }
        mem->p = p;
        mem->cap = cap;
    }
    float *f = loom_alloc(n * sizeof(float));
    if (!f) {
        loom_err(LOOM_ERR_NOMEM, "out of memory (%zu floats)", n);
        return NULL;
    }
    mem->p[mem->n++] = f;
    return f;
}

void loom_vit_mem_free(loom_vit_mem *mem) {
    for (int i = 0; i < mem->n; i++) loom_free(mem->p[i]);
    free(mem->p);
    *mem = (loom_vit_mem){0};
}

const loom_st_tensor *loom_vit_find(const loom_safetensors *st, const char *prefix,
                                    const char *name) {
    char full[320];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return loom_st_find(st, full);
}

static int is_float(loom_dtype t) {
    return t == LOOM_DT_F32 || t == LOOM_DT_F16 || t == LOOM_DT_BF16;
}

static loom_status shape_error(const char *prefix, const char *name, const char *want,
                               const loom_st_tensor *t) {
    char found[128];
    loom_st_describe(t, found, sizeof found);
    return loom_err(LOOM_ERR_FORMAT, "tensor %s%s: expected %s, found %s", prefix, name, want,
                    found);
}

loom_status loom_vit_weight(const loom_safetensors *st, const char *prefix, const char *name,
                            int rows, int cols, loom_weight *w) {
    const loom_st_tensor *t = loom_vit_find(st, prefix, name);
    char want[96];
    snprintf(want, sizeof want, "F32/F16/BF16 [%d, %d]", rows, cols);
    if (!t) return loom_err(LOOM_ERR_FORMAT, "tensor %s%s: missing (expected %s)", prefix, name,
                            want);
    int64_t inner = 1;
    for (int d = 1; d < t->ndim; d++) inner *= t->shape[d];
    if (!is_float(t->dtype) || t->ndim < 2 || t->shape[0] != rows || inner != cols)
        return shape_error(prefix, name, want, t);
    *w = (loom_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    return LOOM_OK;
}

loom_status loom_vit_vec(const loom_safetensors *st, loom_vit_mem *mem, const char *prefix,
                         const char *name, size_t n, int optional, const float **out) {
    *out = NULL;
    const loom_st_tensor *t = loom_vit_find(st, prefix, name);
    char want[64];
    snprintf(want, sizeof want, "F32/F16/BF16 of %zu values", n);
    if (!t) {
        if (optional) return LOOM_OK;
        return loom_err(LOOM_ERR_FORMAT, "tensor %s%s: missing (expected %s)", prefix, name, want);
    }
    if (!is_float(t->dtype) || t->nbytes != n * loom_dtype_size(t->dtype))
        return shape_error(prefix, name, want, t);
    float *v = loom_vit_alloc(mem, n);
    if (!v) return LOOM_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        v[i] = t->dtype == LOOM_DT_F32 ? ((const float *)t->data)[i]
               : t->dtype == LOOM_DT_F16 ? loom_f16_to_f32(((const uint16_t *)t->data)[i])
                                         : loom_bf16_to_f32(((const uint16_t *)t->data)[i]);
    *out = v;
    return LOOM_OK;
}

void loom_vit_linear(loom_model *m, float *y, const float *x, const loom_weight *w,
                     const float *b, int T) {
    loom_fwd_matmul(m, y, x, w, T);
    if (!b) return;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < w->rows; r++) y[(size_t)t * w->rows + r] += b[r];
}

void loom_vit_layernorm(float *y, const float *x, const float *w, const float *b, int T, int n,
                        float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        double mean = 0, var = 0;
        for (int i = 0; i < n; i++) mean += xr[i];
        mean /= n;
        for (int i = 0; i < n; i++) var += (xr[i] - mean) * (xr[i] - mean);
        double inv = 1.0 / sqrt(var / n + eps);
        for (int i = 0; i < n; i++)
            yr[i] = (float)((xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0));
    }
}

void loom_vit_rmsnorm(float *y, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) yr[i] = (float)(xr[i] * inv * w[i]);
    }
}

void loom_vit_rope(float *x, int ld, int T, int heads, int hd, const float *cs, const float *sn) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            float *r = x + (size_t)t * ld + (size_t)h * hd;
            const float *c = cs + (size_t)t * half, *s = sn + (size_t)t * half;
            for (int i = 0; i < half; i++) {
                float a = r[i], b = r[i + half];
                r[i] = a * c[i] - b * s[i];
                r[i + half] = b * c[i] + a * s[i];
            }
        }
}

const char *loom_vit_prefix(const loom_safetensors *st, const char *const *list, size_t n,
                            const char *probe) {
    for (size_t i = 0; i < n; i++)
        if (loom_vit_find(st, list[i], probe)) return list[i];
    return NULL;
}

/* Queries one attention task covers: the segment's keys are read once per
 * task for all of them. */
#define VIT_ATT_Q 16

typedef struct att_job {
    const loom_kernels *k;
    float *out;
    const float *q;
    const float *kh;   /* per segment s at cu[s] * dim: (heads, len, hd) keys */
    const float *vt;   /* per segment s at cu[s] * dim: (heads, hd, len) values */
    int ld, n_heads, hd, ldo;
    const int *cu;
    const int *task0;  /* [n_seg + 1]: first task of each segment */
    float scale;
    float *scratch;    /* per thread: VIT_ATT_Q * max segment length */
    size_t per_thread;
} att_job;

/* One task = one head of one segment and a run of VIT_ATT_Q queries:
 * softmax(q k^T * scale) v over the segment, both products on the matmul
 * kernel. */
static void att_task(void *ctx, int task, int thread) {
    const att_job *j = ctx;
    int s = 0;
    while (task >= j->task0[s + 1]) s++;
    int s0 = j->cu[s], len = j->cu[s + 1] - s0, hd = j->hd, D = j->ldo;
    int nb = (len + VIT_ATT_Q - 1) / VIT_ATT_Q, local = task - j->task0[s];
    int h = local / nb, i0 = (local % nb) * VIT_ATT_Q, rows = LOOM_MIN(VIT_ATT_Q, len - i0);
    float *sc = j->scratch + (size_t)thread * j->per_thread;
    const float *seg_k = j->kh + (size_t)s0 * D + (size_t)h * len * hd;
    const float *seg_v = j->vt + (size_t)s0 * D + (size_t)h * hd * len;
    j->k->matmul_f32(sc, len, j->q + (size_t)(s0 + i0) * j->ld + (size_t)h * hd, j->ld, seg_k, hd,
                     rows, 0, len);
    for (int i = 0; i < rows; i++) {
        float *row = sc + (size_t)i * len, mx = -INFINITY;
        for (int p = 0; p < len; p++) {
            row[p] *= j->scale;
            mx = LOOM_MAX(mx, row[p]);
        }
        double sum = 0;
        for (int p = 0; p < len; p++) sum += row[p] = expf(row[p] - mx);
        float inv = (float)(1.0 / sum);
        for (int p = 0; p < len; p++) row[p] *= inv;
    }
    j->k->matmul_f32(j->out + (size_t)(s0 + i0) * D + (size_t)h * hd, D, sc, len, seg_v, len, rows,
                     0, hd);
}

loom_status loom_vit_attention(loom_model *m, float *out, const float *q, const float *k,
                               const float *v, int ld, int n_heads, int hd, const int *cu,
                               int n_seg, float scale) {
    int max_len = 0, D = n_heads * hd, N = cu[n_seg];
    int *task0 = malloc(((size_t)n_seg + 1) * sizeof *task0);
    if (!task0) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    task0[0] = 0;
    for (int s = 0; s < n_seg; s++) {
        int len = cu[s + 1] - cu[s];
        max_len = LOOM_MAX(max_len, len);
        task0[s + 1] = task0[s] + n_heads * ((len + VIT_ATT_Q - 1) / VIT_ATT_Q);
    }
    int n_thr = loom_pool_size(m->pool);
    size_t per = (size_t)VIT_ATT_Q * (size_t)LOOM_MAX(max_len, 1);
    float *scratch = loom_alloc_raw((size_t)n_thr * per * sizeof(float));
    float *kh = loom_alloc_raw((size_t)N * D * sizeof(float));
    float *vt = loom_alloc_raw((size_t)N * D * sizeof(float));
    if (!scratch || !kh || !vt) {
        loom_free(scratch), loom_free(kh), loom_free(vt);
        free(task0);
        return loom_err(LOOM_ERR_NOMEM, "out of memory (attention over %d rows)", N);
    }
    /* keys head by head and values transposed, segment by segment, so that
     * each product is one matmul over contiguous rows */
    for (int s = 0; s < n_seg; s++) {
        int s0 = cu[s], len = cu[s + 1] - s0;
        for (int p = 0; p < len; p++)
            for (int h = 0; h < n_heads; h++) {
                const float *kr = k + (size_t)(s0 + p) * ld + (size_t)h * hd;
                const float *vr = v + (size_t)(s0 + p) * ld + (size_t)h * hd;
                memcpy(kh + (size_t)s0 * D + ((size_t)h * len + p) * hd, kr, (size_t)hd * 4);
                float *vc = vt + (size_t)s0 * D + (size_t)h * hd * len + p;
                for (int e = 0; e < hd; e++) vc[(size_t)e * len] = vr[e];
            }
    }
    att_job j = {.k = m->k, .out = out, .q = q, .kh = kh, .vt = vt, .ld = ld, .n_heads = n_heads,
                 .hd = hd, .ldo = D, .cu = cu, .task0 = task0, .scale = scale,
                 .scratch = scratch, .per_thread = per};
    if (n_thr == 1)
        for (int t = 0; t < task0[n_seg]; t++) att_task(&j, t, 0);
    else
        loom_pool_run(m->pool, task0[n_seg], att_task, &j);
    loom_free(scratch), loom_free(kh), loom_free(vt);
    free(task0);
    return LOOM_OK;
}

/* A JSON value for messages: the number, or what kind of value it is. */
static const char *found(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsNumber(v)) snprintf(buf, n, "%g", v->valuedouble);
    else snprintf(buf, n, "%s", cJSON_IsString(v) ? "a string" : cJSON_IsArray(v) ? "an array"
                                : cJSON_IsObject(v) ? "an object" : "a boolean");
    return buf;
}

loom_status loom_vit_int(const cJSON *o, const char *where, const char *key, int def, int lo,
                         int hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    char buf[64];
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return loom_err(LOOM_ERR_FORMAT, "config.json: %s.%s must be an integer in [%d, %d], "
                        "found %s", where, key, lo, hi, found(v, buf, sizeof buf));
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

loom_status loom_vit_num(const cJSON *o, const char *where, const char *key, double def,
                         double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    char buf[64];
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v))
        return loom_err(LOOM_ERR_FORMAT, "config.json: %s.%s must be a number, found %s", where,
                        key, found(v, buf, sizeof buf));
    *out = v->valuedouble;
    return LOOM_OK;
}
