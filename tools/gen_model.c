/* gen_model: writes a random-weight model directory with the exact shapes of
 * a real checkpoint, for benchmarks that need a model of realistic size but
 * not its trained weights.
 *
 *   gen_model --preset qwen3-0.6b --dtype bf16 --seed 1 --out DIR
 *             [--layers N --hidden N --heads N --kv-heads N --head-dim N
 *              --intermediate N --vocab N --max-pos N --untied]
 *
 * The output is a Hugging Face directory: config.json as transformers writes
 * it for the architecture, and model.safetensors with every tensor under its
 * Hugging Face name.
 *
 * Design
 * - A blueprint (gm_shape) comes from a preset, with per-field overrides.
 * - gm_tensors() turns the blueprint into the list of tensors (name, shape,
 *   how to initialise).
 * - Values are a pure function of (seed, tensor name, element index):
 *   gm_fill() can produce any slice of any tensor on its own. A writer for
 *   another file format (GGUF, for llama.cpp) walks the same list, calls
 *   gm_fill(), and gets the same numbers; only its layout and the dtype
 *   conversion differ. Writers live in the `writers` table.
 * - Writers stream: one chunk of GM_CHUNK elements is held at a time, so a
 *   1.2 GB model is written with a few MB of memory.
 *
 * Scales: matrices ~ N(0, 0.02) (the transformers initializer_range), norm
 * weights ~ 1 + N(0, 0.02). With RMSNorm before every projection the
 * activations stay O(1) through any number of layers. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"

#define GM_CHUNK ((size_t)1 << 20) /* elements generated per step */
#define GM_MATRIX_STD 0.02f
#define GM_NORM_STD 0.02f

/* ---- blueprint ---------------------------------------------------------- */

typedef struct gm_shape {
    const char *preset;
    const char *arch;          /* "Qwen3ForCausalLM" */
    const char *model_type;    /* "qwen3" */
    int vocab, hidden, layers, heads, kv_heads, head_dim, inter, max_pos;
    double rope_theta, rms_eps;
    int tie;                   /* tie_word_embeddings */
    int bos_id, eos_id;
} gm_shape;

static const gm_shape presets[] = {
    /* Same shapes and config as Qwen/Qwen3-0.6B. */
    {.preset = "qwen3-0.6b", .arch = "Qwen3ForCausalLM", .model_type = "qwen3",
     .vocab = 151936, .hidden = 1024, .layers = 28, .heads = 16, .kv_heads = 8,
     .head_dim = 128, .inter = 3072, .max_pos = 40960, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 151643, .eos_id = 151645},
    /* A few MB: for quick checks of the tool and the benchmark. */
    {.preset = "tiny", .arch = "Qwen3ForCausalLM", .model_type = "qwen3",
     .vocab = 512, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2,
     .head_dim = 16, .inter = 128, .max_pos = 2048, .rope_theta = 1000000.0,
     .rms_eps = 1e-6, .tie = 1, .bos_id = 1, .eos_id = 2},
};

/* ---- tensor list -------------------------------------------------------- */

enum { GM_INIT_MATRIX, GM_INIT_NORM };

typedef struct gm_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    int init;                  /* GM_INIT_* */
} gm_tensor;

static size_t gm_numel(const gm_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static void gm_add(gm_tensor *list, int *n, int init, int64_t rows, int64_t cols,
                   const char *fmt, int layer) {
    gm_tensor *t = &list[(*n)++];
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->init = init;
}

/* Fills list (capacity 3 + 11 * layers) in Hugging Face order; returns the
 * count. */
static int gm_tensors(const gm_shape *s, gm_tensor *list) {
    int n = 0;
    int64_t H = s->hidden, q = (int64_t)s->heads * s->head_dim;
    int64_t kv = (int64_t)s->kv_heads * s->head_dim, I = s->inter;
    gm_add(list, &n, GM_INIT_MATRIX, s->vocab, H, "model.embed_tokens.weight", 0);
    for (int l = 0; l < s->layers; l++) {
        gm_add(list, &n, GM_INIT_NORM, H, 0, "model.layers.%d.input_layernorm.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, q, H, "model.layers.%d.self_attn.q_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, kv, H, "model.layers.%d.self_attn.k_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, kv, H, "model.layers.%d.self_attn.v_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, H, q, "model.layers.%d.self_attn.o_proj.weight", l);
        gm_add(list, &n, GM_INIT_NORM, s->head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        gm_add(list, &n, GM_INIT_NORM, s->head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        gm_add(list, &n, GM_INIT_NORM, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        gm_add(list, &n, GM_INIT_MATRIX, H, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    gm_add(list, &n, GM_INIT_NORM, H, 0, "model.norm.weight", 0);
    if (!s->tie) gm_add(list, &n, GM_INIT_MATRIX, s->vocab, H, "lm_head.weight", 0);
    return n;
}

/* ---- values ------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Per-tensor stream key from the seed and the name (FNV-1a). */
static uint64_t gm_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return splitmix64(seed ^ splitmix64(h));
}

/* Values [start, start + n) of tensor t: unit normal-ish noise (sum of four
 * 16-bit uniforms, Irwin-Hall, rescaled to variance 1; bounded by +-3.5)
 * scaled by the tensor's init. */
static void gm_fill(const gm_tensor *t, uint64_t seed, size_t start, size_t n, float *out) {
    uint64_t key = gm_key(seed, t->name);
    const float scale = 1.7320508f / 65536.0f; /* sqrt(3) / 2^16 */
    for (size_t i = 0; i < n; i++) {
        uint64_t r = splitmix64(key + (uint64_t)(start + i));
        float sum = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) +
                    (float)((r >> 32) & 0xffff) + (float)(r >> 48);
        float z = (sum - 2.0f * 65535.0f) * scale;
        out[i] = t->init == GM_INIT_NORM ? 1.0f + GM_NORM_STD * z : GM_MATRIX_STD * z;
    }
}

/* Converts n f32 values to dtype in dst. */
static void gm_convert(loom_dtype dt, const float *src, size_t n, void *dst) {
    if (dt == LOOM_DT_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == LOOM_DT_BF16) {
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom_f32_to_bf16(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom_f32_to_f16(src[i]);
    }
}

/* ---- writers ------------------------------------------------------------ */

typedef struct gm_job {
    const gm_shape *shape;
    const gm_tensor *tensors;
    int n_tensors;
    loom_dtype dtype;
    uint64_t seed;
    const char *dir;
} gm_job;

/* Streams every tensor's data, in list order, to f. */
static int gm_write_data(const gm_job *j, FILE *f) {
    float *vals = malloc(GM_CHUNK * sizeof(float));
    void *conv = malloc(GM_CHUNK * loom_dtype_size(j->dtype));
    int ok = vals && conv;
    size_t es = loom_dtype_size(j->dtype);
    for (int i = 0; i < j->n_tensors && ok; i++) {
        size_t total = gm_numel(&j->tensors[i]);
        for (size_t off = 0; off < total && ok; off += GM_CHUNK) {
            size_t n = LOOM_MIN(GM_CHUNK, total - off);
            gm_fill(&j->tensors[i], j->seed, off, n, vals);
            gm_convert(j->dtype, vals, n, conv);
            ok = fwrite(conv, es, n, f) == n;
        }
    }
    free(vals);
    free(conv);
    return ok;
}

/* Appends to a growing string; returns 0 when out of memory. */
typedef struct gm_buf {
    char *p;
    size_t len, cap;
} gm_buf;

__attribute__((format(printf, 2, 3))) static int gm_printf(gm_buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (w < 0) return 0;
        if (b->p && b->len + (size_t)w < b->cap) {
            b->len += (size_t)w;
            return 1;
        }
        size_t cap = LOOM_MAX(b->cap * 2, b->len + (size_t)w + 4096);
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
}

/* Opens DIR/name.tmp for writing; the caller renames it into place once the
 * file is complete, so a crashed run never leaves a half file behind. */
static FILE *gm_open_tmp(const char *dir, const char *name, char *tmp, size_t n) {
    if (snprintf(tmp, n, "%s/%s.tmp", dir, name) >= (int)n) return NULL;
    FILE *f = fopen(tmp, "wb");
    if (!f) fprintf(stderr, "gen_model: %s: %s\n", tmp, strerror(errno));
    return f;
}

static int gm_commit(FILE *f, int ok, const char *tmp, const char *dir, const char *name) {
    char path[4096];
    ok = (fclose(f) == 0) && ok;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "gen_model: writing %s failed: %s\n", path, strerror(errno));
        unlink(tmp);
        return 0;
    }
    return 1;
}

/* model.safetensors: u64 little-endian header length, JSON header padded
 * with spaces to a multiple of 8 bytes (so the data section is 8-aligned),
 * then the tensors back to back in list order. */
static int gm_write_safetensors(const gm_job *j) {
    gm_buf h = {0};
    int ok = gm_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0, es = loom_dtype_size(j->dtype);
    for (int i = 0; i < j->n_tensors && ok; i++) {
        const gm_tensor *t = &j->tensors[i];
        size_t bytes = gm_numel(t) * es;
        ok = gm_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name,
                       loom_dtype_name(j->dtype), (long long)t->shape[0]);
        if (ok && t->ndim == 2) ok = gm_printf(&h, ",%lld", (long long)t->shape[1]);
        if (ok) ok = gm_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    if (ok) ok = gm_printf(&h, "}");
    while (ok && h.len % 8) ok = gm_printf(&h, " ");
    if (!ok) {
        free(h.p);
        fprintf(stderr, "gen_model: out of memory\n");
        return 0;
    }
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "model.safetensors", tmp, sizeof tmp);
    if (!f) {
        free(h.p);
        return 0;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h.p, 1, h.len, f) == h.len;
    free(h.p);
    if (ok) ok = gm_write_data(j, f);
    return gm_commit(f, ok, tmp, j->dir, "model.safetensors");
}

static const char *gm_torch_dtype(loom_dtype t) {
    return t == LOOM_DT_BF16 ? "bfloat16" : t == LOOM_DT_F16 ? "float16" : "float32";
}

/* config.json with the keys, order and spelling transformers 4.51 writes for
 * Qwen3ForCausalLM (the form of the published Qwen3 checkpoints). */
static int gm_write_config(const gm_job *j) {
    const gm_shape *s = j->shape;
    char tmp[4096];
    FILE *f = gm_open_tmp(j->dir, "config.json", tmp, sizeof tmp);
    if (!f) return 0;
    int w = fprintf(f,
        "{\n"
        "  \"architectures\": [\n"
        "    \"%s\"\n"
        "  ],\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"bos_token_id\": %d,\n"
        "  \"eos_token_id\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"max_window_layers\": %d,\n"
        "  \"model_type\": \"%s\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"rms_norm_eps\": %g,\n"
        "  \"rope_scaling\": null,\n"
        "  \"rope_theta\": %.0f,\n"
        "  \"sliding_window\": null,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"torch_dtype\": \"%s\",\n"
        "  \"transformers_version\": \"4.51.0\",\n"
        "  \"use_cache\": true,\n"
        "  \"use_sliding_window\": false,\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        s->arch, s->bos_id, s->eos_id, s->head_dim, s->hidden, s->inter, s->max_pos,
        s->layers, s->model_type, s->heads, s->layers, s->kv_heads, s->rms_eps,
        s->rope_theta, s->tie ? "true" : "false", gm_torch_dtype(j->dtype), s->vocab);
    return gm_commit(f, w > 0, tmp, j->dir, "config.json");
}

typedef struct gm_writer {
    const char *format;
    int (*write)(const gm_job *j);  /* returns 1 on success */
} gm_writer;

static int gm_write_hf(const gm_job *j) {
    return gm_write_config(j) && gm_write_safetensors(j);
}

static const gm_writer writers[] = {
    {"safetensors", gm_write_hf},  /* Hugging Face directory */
};

/* ---- command line ------------------------------------------------------- */

static int mkdir_p(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return 0;
    for (char *c = p + 1;; c++) {
        if (*c == '/' || !*c) {
            char save = *c;
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "gen_model: mkdir %s: %s\n", p, strerror(errno));
                return 0;
            }
            *c = save;
            if (!save) return 1;
        }
    }
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: gen_model --out DIR [--preset qwen3-0.6b|tiny] [--dtype bf16|f16|f32]\n"
        "                 [--seed N] [--format safetensors]\n"
        "                 [--layers N] [--hidden N] [--heads N] [--kv-heads N]\n"
        "                 [--head-dim N] [--intermediate N] [--vocab N] [--max-pos N]\n"
        "                 [--untied]\n"
        "Writes a random-weight model directory (config.json + model.safetensors).\n"
        "Values depend only on the seed and the tensor names, not on the dtype or\n"
        "the file format.\n");
}

static int parse_pos_int(const char *flag, const char *v, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x <= 0 || x > 1 << 30) {
        fprintf(stderr, "gen_model: %s: expected a positive integer, got \"%s\"\n", flag, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int main(int argc, char **argv) {
    const char *preset = "qwen3-0.6b", *dtype_s = "bf16", *out = NULL, *format = "safetensors";
    uint64_t seed = 1;
    int ov[8] = {0}, untied = 0;
    static const char *ov_flags[8] = {"--layers", "--hidden", "--heads", "--kv-heads",
                                      "--head-dim", "--intermediate", "--vocab", "--max-pos"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--untied")) {
            untied = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gen_model: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int k = -1;
        for (int o = 0; o < 8; o++)
            if (!strcmp(a, ov_flags[o])) k = o;
        if (k >= 0) {
            if (!parse_pos_int(a, v, &ov[k])) return 2;
        } else if (!strcmp(a, "--preset")) {
            preset = v;
        } else if (!strcmp(a, "--dtype")) {
            dtype_s = v;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            seed = strtoull(v, &end, 10);
            if (*end || !*v) {
                fprintf(stderr, "gen_model: --seed: expected an integer, got \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--out")) {
            out = v;
        } else if (!strcmp(a, "--format")) {
            format = v;
        } else {
            fprintf(stderr, "gen_model: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "gen_model: --out DIR is required\n");
        usage(stderr);
        return 2;
    }
    gm_shape s;
    const gm_shape *p = NULL;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(presets); i++)
        if (!strcmp(presets[i].preset, preset)) p = &presets[i];
    if (!p) {
        fprintf(stderr, "gen_model: unknown preset \"%s\" (expected qwen3-0.6b or tiny)\n", preset);
        return 2;
    }
    s = *p;
    int *fields[8] = {&s.layers, &s.hidden, &s.heads, &s.kv_heads,
                      &s.head_dim, &s.inter, &s.vocab, &s.max_pos};
    for (int o = 0; o < 8; o++)
        if (ov[o]) *fields[o] = ov[o];
    if (untied) s.tie = 0;
    if (s.heads % s.kv_heads || s.head_dim % 2) {
        fprintf(stderr, "gen_model: heads (%d) must be a multiple of kv-heads (%d) and "
                "head-dim (%d) even\n", s.heads, s.kv_heads, s.head_dim);
        return 2;
    }
    if (s.bos_id >= s.vocab) s.bos_id = 0;
    if (s.eos_id >= s.vocab) s.eos_id = 0;
    loom_dtype dt;
    if (!strcmp(dtype_s, "bf16")) dt = LOOM_DT_BF16;
    else if (!strcmp(dtype_s, "f16")) dt = LOOM_DT_F16;
    else if (!strcmp(dtype_s, "f32")) dt = LOOM_DT_F32;
    else {
        fprintf(stderr, "gen_model: --dtype: expected bf16, f16 or f32, got \"%s\"\n", dtype_s);
        return 2;
    }
    const gm_writer *wr = NULL;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(writers); i++)
        if (!strcmp(writers[i].format, format)) wr = &writers[i];
    if (!wr) {
        fprintf(stderr, "gen_model: --format: expected safetensors, got \"%s\"\n", format);
        return 2;
    }

    gm_tensor *list = calloc(3 + 11 * (size_t)s.layers, sizeof *list);
    if (!list) {
        fprintf(stderr, "gen_model: out of memory\n");
        return 1;
    }
    gm_job j = {.shape = &s, .tensors = list, .n_tensors = gm_tensors(&s, list),
                .dtype = dt, .seed = seed, .dir = out};
    size_t params = 0;
    for (int i = 0; i < j.n_tensors; i++) params += gm_numel(&list[i]);
    double t0 = loom_now();
    int ok = mkdir_p(out) && wr->write(&j);
    if (ok)
        fprintf(stderr, "gen_model: %s %s seed %llu: %d tensors, %.1fM params, %.2f GB in %s "
                "(%.1f s)\n", s.preset, dtype_s, (unsigned long long)seed, j.n_tensors,
                (double)params / 1e6, (double)(params * loom_dtype_size(dt)) / 1e9, out,
                loom_now() - t0);
    free(list);
    return ok ? 0 : 1;
}
