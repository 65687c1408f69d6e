/* MLX affine conversion (load/quantize.c, `loom convert`) and `loom bench`:
 * qwen3-tiny converted to 8 and 4 bits must match the checkpoints MLX wrote
 * for the same weights (qwen3-tiny-mlx8/-mlx4) tensor for tensor and bit
 * for bit, dequantize to within half a step of the originals, load, and
 * give logits close to the f32 model's and the fixtures' greedy tokens. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "load/quantize.h"
#include "load/safetensors.h"
#include "test.h"

#define FIX "tests/fixtures/models/"

static char tmpdir[] = "/tmp/loom-test-convert-XXXXXX";

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (!lstat(path, &st) && S_ISDIR(st.st_mode)) rm_tree(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static loom_safetensors *open_model(const char *dir) {
    loom_safetensors *st = NULL;
    loom_status s = loom_st_open_dir(dir, &st);
    CHECKF(s == LOOM_OK, "%s: %s", dir, loom_last_error());
    return st;
}

/* The fixture mlx8 was written from an untied copy of qwen3-tiny (its own
 * lm_head, tie_word_embeddings false); everything else is the same weights. */
static int skip_name(const char *name, int bits) {
    return bits == 8 && !strncmp(name, "lm_head.", 8);
}

/* Same tensor set, dtypes and shapes as the MLX fixture, and the same bytes. */
static void check_against_fixture(const char *got_dir, const char *ref_dir, int bits) {
    loom_safetensors *got = open_model(got_dir), *ref = open_model(ref_dir);
    if (!got || !ref) goto out;
    int n_ref = 0, differ = 0;
    for (int i = 0; i < loom_st_count(ref); i++) {
        const loom_st_tensor *r = loom_st_at(ref, i);
        if (skip_name(r->name, bits)) continue;
        n_ref++;
        const loom_st_tensor *g = loom_st_find(got, r->name);
        CHECKF(g != NULL, "%s: tensor %s missing", got_dir, r->name);
        if (!g) continue;
        char dg[96], dr[96];
        loom_st_describe(g, dg, sizeof dg);
        loom_st_describe(r, dr, sizeof dr);
        CHECKF(!strcmp(dg, dr), "tensor %s: expected %s, found %s", r->name, dr, dg);
        if (!strcmp(dg, dr) && memcmp(g->data, r->data, g->nbytes)) {
            differ++;
            fprintf(stderr, "tensor %s: bytes differ from MLX's\n", r->name);
        }
    }
    CHECK_EQ_INT(loom_st_count(got), n_ref);
    CHECK_EQ_INT(differ, 0);
    CHECK_STR(loom_st_metadata(got, "format") ? loom_st_metadata(got, "format") : "", "mlx");
out:
    loom_st_close(got);
    loom_st_close(ref);
}

/* config.json: the same keys and values as the fixture's (bar the tie). */
static void check_config(const char *got_dir, const char *ref_dir, int bits) {
    char pg[600], pr[600], *tg = NULL, *tr = NULL;
    size_t n;
    snprintf(pg, sizeof pg, "%s/config.json", got_dir);
    snprintf(pr, sizeof pr, "%s/config.json", ref_dir);
    CHECK(loom_read_file(pg, &tg, &n) == LOOM_OK && loom_read_file(pr, &tr, &n) == LOOM_OK);
    cJSON *g = tg ? cJSON_Parse(tg) : NULL, *r = tr ? cJSON_Parse(tr) : NULL;
    CHECK(g && r);
    if (g && r && bits == 8) {
        CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r, "tie_word_embeddings")));
        cJSON_ReplaceItemInObjectCaseSensitive(r, "tie_word_embeddings", cJSON_CreateTrue());
    }
    if (g && r) {
        CHECK_EQ_INT(cJSON_GetArraySize(g), cJSON_GetArraySize(r));
        for (cJSON *it = r->child; it; it = it->next) {
            cJSON *o = cJSON_GetObjectItemCaseSensitive(g, it->string);
            CHECKF(o && cJSON_Compare(o, it, 1), "config.json key %s differs from %s", it->string,
                   ref_dir);
        }
    }
    cJSON_Delete(g);
    cJSON_Delete(r);
    free(tg);
    free(tr);
}

/* Every packed weight dequantizes to the level of its group nearest the
 * original: within half a step (plus the bf16 rounding of scale and bias,
 * which moves a level by at most 2^-8 of |bias| + levels x |scale|), or,
 * for values past the grid's end, to that end. (MLX snaps the edge farther
 * from zero onto a level, so the grid can fall a little short of the
 * other end: those values clamp.) */
static void check_dequant(const char *got_dir, int bits) {
    loom_safetensors *src = open_model(FIX "qwen3-tiny"), *got = open_model(got_dir);
    if (!src || !got) goto out;
    int n_checked = 0, n_clamped = 0;
    double worst_steps = 0;
    for (int i = 0; i < loom_st_count(src); i++) {
        const loom_st_tensor *t = loom_st_at(src, i);
        char mod[256], name[300];
        size_t l = strlen(t->name);
        if (l < 8 || strcmp(t->name + l - 7, ".weight")) continue;
        snprintf(mod, sizeof mod, "%.*s", (int)(l - 7), t->name);
        const loom_st_tensor *q = loom_st_find(got, t->name);
        snprintf(name, sizeof name, "%s.scales", mod);
        const loom_st_tensor *sc = loom_st_find(got, name);
        snprintf(name, sizeof name, "%s.biases", mod);
        const loom_st_tensor *bi = loom_st_find(got, name);
        if (!q || q->dtype != LOOM_DT_U32) continue;
        CHECK(sc && bi && t->dtype == LOOM_DT_F32);
        if (!sc || !bi) continue;
        int rows = (int)t->shape[0], cols = (int)t->shape[1], G = cols / (int)sc->shape[1];
        CHECK_EQ_INT(G, 64);
        float *row = malloc(sizeof(float) * (size_t)cols);
        int bad = 0;
        for (int r = 0; r < rows; r++) {
            const uint32_t *qw = (const uint32_t *)q->data + (size_t)r * cols * bits / 32;
            const uint16_t *s = (const uint16_t *)sc->data + (size_t)r * (cols / G);
            const uint16_t *b = (const uint16_t *)bi->data + (size_t)r * (cols / G);
            loom_quant_dequant_row(qw, s, b, cols, bits, G, LOOM_DT_BF16, row);
            const float *w = (const float *)t->data + (size_t)r * cols;
            for (int c = 0; c < cols; c++) {
                double step = fabs(loom_bf16_to_f32(s[c / G]));
                double slack = (fabs(loom_bf16_to_f32(b[c / G])) + ((1 << bits) - 1) * step) /
                               256.0;
                double e = fabs((double)row[c] - w[c]);
                uint32_t qv = (qw[c * bits / 32] >> ((c % (32 / bits)) * bits)) &
                              ((1u << bits) - 1);
                /* the grid's ends: level 0 and level 2^bits - 1 */
                double end0 = loom_bf16_to_f32(b[c / G]);
                double end1 = end0 + ((1 << bits) - 1) * (double)loom_bf16_to_f32(s[c / G]);
                double dir = end1 >= end0 ? 1 : -1;
                int clamped = (qv == 0 && (w[c] - end0) * dir < 0) ||
                              (qv == (1u << bits) - 1 && (w[c] - end1) * dir > 0);
                n_clamped += clamped && e > 0.5 * step + slack + 1e-7;
                bad += !clamped && e > 0.5 * step + slack + 1e-7;
                worst_steps = test_max(worst_steps, e / step);
            }
        }
        CHECKF(bad == 0, "%s: %d values over half a step", t->name, bad);
        free(row);
        n_checked++;
    }
    CHECK_EQ_INT(n_checked, 22);
    fprintf(stderr, "%d-bit: worst dequantization error %.3f steps (%d values past a grid "
            "end, clamped)\n", bits, worst_steps, n_clamped);
out:
    loom_st_close(src);
    loom_st_close(got);
}

/* Logits of every position of a prompt, the model loaded with mp. */
static float *prompt_logits_mp(const char *dir, loom_model_params mp, const int32_t *ids, int L, int *V) {
    loom_model *m = NULL;
    loom_status s = loom_model_load(dir, &mp, &m);
    CHECKF(s == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (!m) return NULL;
    *V = loom_model_vocab_size(m);
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = L;
    float *out = malloc(sizeof(float) * (size_t)L * *V);
    CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
    if (c) CHECK(loom_context_eval(c, ids, L, 1, out) == LOOM_OK);
    loom_context_free(c);
    loom_model_free(m);
    return out;
}

static float *prompt_logits(const char *dir, const int32_t *ids, int L, int *V) {
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    return prompt_logits_mp(dir, mp, ids, L, V);
}

/* dst: the f32 model in src with every tensor in bf16 (as `loom convert`
 * leaves the ones it does not quantize). */
static void write_bf16_copy(const char *src, const char *dst) {
    char cmd[2400], path[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/*.json '%s'/", dst, src, dst);
    CHECK(system(cmd) == 0);
    loom_safetensors *in = open_model(src);
    if (!in) return;
    int n = loom_st_count(in);
    loom_st_write_entry *e = calloc((size_t)n, sizeof *e);
    uint16_t **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        const loom_st_tensor *t = loom_st_at(in, i);
        CHECK(t->dtype == LOOM_DT_F32);
        size_t cnt = t->nbytes / 4;
        bufs[i] = malloc(cnt * 2);
        for (size_t k = 0; k < cnt; k++) bufs[i][k] = loom_f32_to_bf16(((const float *)t->data)[k]);
        e[i] = (loom_st_write_entry){.name = t->name, .dtype = LOOM_DT_BF16, .ndim = t->ndim, .data = bufs[i]};
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    CHECK(loom_st_write(path, e, n) == LOOM_OK);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(e);
    loom_st_close(in);
}

/* The bf16 model in src quantized at load (quantize_bits) computes the
 * very logits of its conversion in converted, exact and --fast. */
static void check_load_quantized(const char *src, const char *converted, int bits) {
    loom_safetensors *ref = NULL;
    CHECK(loom_st_open(FIX "qwen3-tiny/reference.safetensors", &ref) == LOOM_OK);
    const loom_st_tensor *ids = ref ? loom_st_find(ref, "prompt.2.ids") : NULL;
    for (int fast = 0; ids && fast < 2; fast++) {
        int L = (int)ids->shape[0], V = 0, V2 = 0;
        loom_model_params mp = loom_model_default_params();
        mp.n_threads = 1;
        mp.fast_matmul = fast;
        float *a = prompt_logits_mp(converted, mp, ids->data, L, &V);
        mp.quantize_bits = bits;
        float *b = prompt_logits_mp(src, mp, ids->data, L, &V2);
        CHECKF(a && b && V == V2 && !memcmp(a, b, sizeof(float) * (size_t)L * V),
               "%s quantized to %d bits at load (fast %d): not the logits of its conversion", src, bits, fast);
        free(a);
        free(b);
    }
    loom_st_close(ref);
}

/* quantize_bits refusals: a width other than 8 or 4, and no copy to make. */
static void check_load_quantized_refusals(void) {
    loom_model_params mp = loom_model_default_params();
    loom_model *m = NULL;
    mp.quantize_bits = 5;
    CHECK(loom_model_load(FIX "qwen3-tiny", &mp, &m) == LOOM_ERR_INVALID_ARG && !m);
    CHECK(strstr(loom_last_error(), "expected 0, 4 or 8, found 5") != NULL);
    mp.quantize_bits = 8;
    mp.no_copy = 1;
    CHECK(loom_model_load(FIX "qwen3-tiny", &mp, &m) == LOOM_ERR_UNSUPPORTED && !m);
}

/* Converted logits vs the f32 model's on a 45-token prompt: the error
 * relative to the logit range stays under the bound for the bit width. */
static void check_logits(const char *dir, int bits, double bound) {
    loom_safetensors *ref = NULL;
    CHECK(loom_st_open(FIX "qwen3-tiny/reference.safetensors", &ref) == LOOM_OK);
    const loom_st_tensor *ids = ref ? loom_st_find(ref, "prompt.2.ids") : NULL;
    CHECK(ids != NULL);
    if (ids) {
        int L = (int)ids->shape[0], V = 0, V2 = 0;
        float *a = prompt_logits(FIX "qwen3-tiny", ids->data, L, &V);
        float *b = prompt_logits(dir, ids->data, L, &V2);
        CHECK_EQ_INT(V, V2);
        if (a && b && V == V2) {
            double md = 0, ma = 0;
            int agree = 0;
            for (int i = 0; i < L; i++) {
                int ia = 0, ib = 0;
                for (int v = 0; v < V; v++) {
                    size_t k = (size_t)i * V + v;
                    CHECK(isfinite(b[k]));
                    md = test_max(md, fabs(a[k] - b[k]));
                    ma = test_max(ma, fabs(a[k]));
                    if (a[k] > a[(size_t)i * V + ia]) ia = v;
                    if (b[k] > b[(size_t)i * V + ib]) ib = v;
                }
                agree += ia == ib;
            }
            fprintf(stderr, "%d-bit vs f32: max |diff| %.4f (max |logit| %.3f), argmax agrees "
                    "at %d of %d positions\n", bits, md, ma, agree, L);
            CHECKF(md <= bound * ma, "%d-bit: max |diff| %.4f over %.3f x %.3f", bits, md,
                   bound, ma);
            CHECKF(agree >= L * (bits == 8 ? 85 : 50) / 100, "%d-bit: argmax agrees at %d of %d",
                   bits, agree, L);
        }
        free(a);
        free(b);
    }
    loom_st_close(ref);
}

/* Greedy tokens of the model in dir on the fixture's prompts equal the
 * fixture's reference greedy (computed in float64 from the MLX weights). */
static void check_greedy(const char *dir, const char *ref_dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", ref_dir);
    loom_safetensors *ref = NULL;
    CHECK(loom_st_open(path, &ref) == LOOM_OK);
    loom_model *m = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    loom_status s = loom_model_load(dir, &mp, &m);
    CHECKF(s == LOOM_OK, "%s: %s", dir, loom_last_error());
    for (int i = 0; ref && m && i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *ids = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.greedy", i);
        const loom_st_tensor *gr = loom_st_find(ref, name);
        CHECK(ids && gr);
        if (!ids || !gr) continue;
        int L = (int)ids->shape[0], ng = (int)gr->shape[0], n_out = 0;
        int32_t out[64];
        loom_context *c = NULL;
        loom_context_params cp = loom_context_default_params();
        cp.n_ctx = L + ng;
        CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
        if (!c) continue;
        /* The logits, too: the reference is float64 math on these weights. */
        snprintf(name, sizeof name, "prompt.%d.logits", i);
        const loom_st_tensor *lg = loom_st_find(ref, name);
        int V = loom_model_vocab_size(m);
        float *got = malloc(sizeof(float) * (size_t)L * V);
        CHECK(lg && loom_context_eval(c, ids->data, L, 1, got) == LOOM_OK);
        if (lg) {
            double md = 0, ma = 0;
            for (size_t k = 0; k < (size_t)L * V; k++) {
                md = test_max(md, fabs(got[k] - ((const float *)lg->data)[k]));
                ma = test_max(ma, fabs(((const float *)lg->data)[k]));
            }
            CHECKF(md <= 1e-4 * ma, "%s prompt %d: logits off the reference by %.3g (max %.3g)",
                   dir, i, md, ma);
        }
        free(got);
        CHECK(loom_context_truncate(c, 0) == LOOM_OK);
        CHECK(loom_generate_greedy(c, ids->data, L, ng, NULL, 0, out, &n_out) == LOOM_OK);
        CHECK_EQ_INT(n_out, ng);
        CHECKF(n_out == ng && !memcmp(out, gr->data, sizeof(int32_t) * (size_t)ng),
               "%s prompt %d: greedy tokens differ from %s", dir, i, ref_dir);
        loom_context_free(c);
    }
    loom_model_free(m);
    loom_st_close(ref);
}

/* The 8-bit conversion plus the fixture's own lm_head (and its untied
 * config) is the fixture's model: its greedy must be the fixture's. */
static void check_greedy8(const char *dir8) {
    char hyb[512], path[600];
    snprintf(hyb, sizeof hyb, "%s/hybrid8", tmpdir);
    CHECK(mkdir(hyb, 0777) == 0);
    loom_safetensors *got = open_model(dir8), *fix = open_model(FIX "qwen3-tiny-mlx8");
    if (!got || !fix) goto out;
    int n = loom_st_count(got), k = 0;
    loom_st_write_entry *e = calloc((size_t)n + 3, sizeof *e);
    for (int i = 0; i < n + 3; i++) {
        const loom_st_tensor *t = i < n ? loom_st_at(got, i) : NULL;
        if (!t) {
            static const char *lm[] = {"lm_head.weight", "lm_head.scales", "lm_head.biases"};
            t = loom_st_find(fix, lm[i - n]);
        }
        CHECK(t != NULL);
        if (!t) continue;
        e[k] = (loom_st_write_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                     .data = t->data};
        memcpy(e[k].shape, t->shape, sizeof e[k].shape);
        k++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", hyb);
    CHECK(loom_st_write(path, e, k) == LOOM_OK);
    free(e);
    char *cfg = NULL;
    size_t len = 0;
    CHECK(loom_read_file(FIX "qwen3-tiny-mlx8/config.json", &cfg, &len) == LOOM_OK);
    snprintf(path, sizeof path, "%s/config.json", hyb);
    FILE *f = fopen(path, "wb");
    CHECK(f && cfg && fwrite(cfg, 1, len, f) == len);
    if (f) fclose(f);
    free(cfg);
    check_greedy(hyb, FIX "qwen3-tiny-mlx8");
out:
    loom_st_close(got);
    loom_st_close(fix);
}

static void check_refusals(void) {
    char dst[512];
    loom_convert_params p = {.bits = 8, .group = 64};
    snprintf(dst, sizeof dst, "%s/refused", tmpdir);
    /* already quantized */
    loom_status s = loom_convert_model(FIX "qwen3-tiny-mlx4", dst, &p, NULL);
    CHECKF(s == LOOM_ERR_UNSUPPORTED && strstr(loom_last_error(), "already quantized"), "%s: %s",
           loom_status_str(s), loom_last_error());
    /* unsupported bits and group */
    p.bits = 3;
    CHECK_EQ_INT(loom_convert_model(FIX "qwen3-tiny", dst, &p, NULL), LOOM_ERR_UNSUPPORTED);
    p.bits = 4;
    p.group = 48;
    CHECK_EQ_INT(loom_convert_model(FIX "qwen3-tiny", dst, &p, NULL), LOOM_ERR_UNSUPPORTED);
    /* a non-empty destination, unless forced */
    p.group = 64;
    snprintf(dst, sizeof dst, "%s/q4", tmpdir);
    s = loom_convert_model(FIX "qwen3-tiny", dst, &p, NULL);
    CHECKF(s == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(), "not empty"), "%s: %s",
           loom_status_str(s), loom_last_error());
    p.force = 1;
    CHECK_EQ_INT(loom_convert_model(FIX "qwen3-tiny", dst, &p, NULL), LOOM_OK);
    /* onto itself */
    CHECK_EQ_INT(loom_convert_model(dst, dst, &p, NULL), LOOM_ERR_INVALID_ARG);
}

/* Runs a shell command, captures stdout, returns the exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *pp = popen(cmd, "r");
    if (!pp) return -1;
    size_t n = fread(out, 1, cap - 1, pp);
    out[n] = 0;
    int st = pclose(pp);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The commands end to end, when the binary is built. */
static void check_cli(void) {
    const char *b = getenv("LOOM_BUILD");
    char loom[256], cmd[2048], out[8192];
    snprintf(loom, sizeof loom, "%s/loom", b ? b : "build");
    if (access(loom, X_OK)) {
        fprintf(stderr, "skipping CLI checks: no %s\n", loom);
        return;
    }
    snprintf(cmd, sizeof cmd, "%s convert --help", loom);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "--group-size") != NULL);
    snprintf(cmd, sizeof cmd, "%s bench --help", loom);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s convert --model " FIX "qwen3-tiny --bits 3 --out %s/x 2>&1",
             loom, tmpdir);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s convert --model " FIX "qwen3-tiny-mlx8 --bits 4 --out %s/x 2>&1",
             loom, tmpdir);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "already quantized") != NULL);
    snprintf(cmd, sizeof cmd, "%s convert --model " FIX "qwen3-tiny --bits 4 --out %s/cli4 2>&1",
             loom, tmpdir);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s bench --model %s/cli4 -p 16 -n 4 --reps 2 --threads 1 --json",
             loom, tmpdir);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    CHECKF(strstr(out, "\"pp_tok_s\": ") && strstr(out, "\"tg_tok_s\": ") &&
           strstr(out, "\"reps\": 2"), "bench --json printed: %s", out);
    snprintf(cmd, sizeof cmd, "%s bench --model %s/cli4 -p 0 -n 0 2>&1", loom, tmpdir);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
}

/* The streaming writer: pieces of any size in plan order give the file
 * loom_st_write gives; a short tensor or an overrun is refused and leaves
 * no file behind. */
static void check_stream(void) {
    char path[600], path2[600];
    snprintf(path, sizeof path, "%s/stream.safetensors", tmpdir);
    snprintf(path2, sizeof path2, "%s/whole.safetensors", tmpdir);
    float a[6] = {1, -2, 3.5f, 4, 5, 6};
    uint16_t b[3] = {7, 8, 9};
    loom_st_write_entry e[3] = {
        {.name = "a", .dtype = LOOM_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "empty", .dtype = LOOM_DT_F32, .ndim = 1, .shape = {0}, .data = a},
        {.name = "b", .dtype = LOOM_DT_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    loom_st_stream *w = NULL;
    CHECK(loom_st_stream_open(path, e, 3, "mlx", &w) == LOOM_OK);
    if (w) {
        const char *pa = (const char *)a;
        CHECK(loom_st_stream_write(w, pa, 5) == LOOM_OK);
        CHECK(loom_st_stream_write(w, pa + 5, 19) == LOOM_OK);
        CHECK(loom_st_stream_write(w, b, 2) == LOOM_OK);  /* "empty" takes no bytes */
        CHECK(loom_st_stream_write(w, (const char *)b + 2, 4) == LOOM_OK);
        CHECK(loom_st_stream_write(w, b, 1) == LOOM_ERR_INVALID_ARG);
        CHECK(loom_st_stream_finish(w) == LOOM_OK);
    }
    CHECK(loom_st_write(path2, e, 3) == LOOM_OK);
    loom_safetensors *x = NULL, *y = NULL;
    CHECK(loom_st_open(path, &x) == LOOM_OK && loom_st_open(path2, &y) == LOOM_OK);
    for (int i = 0; x && y && i < 3; i++) {
        const loom_st_tensor *t = loom_st_find(x, e[i].name), *u = loom_st_find(y, e[i].name);
        CHECK(t && u && t->nbytes == u->nbytes && !memcmp(t->data, u->data, t->nbytes));
    }
    CHECK_STR(x && loom_st_metadata(x, "format") ? loom_st_metadata(x, "format") : "", "mlx");
    loom_st_close(x);
    loom_st_close(y);
    /* short: b never arrives */
    snprintf(path, sizeof path, "%s/short.safetensors", tmpdir);
    CHECK(loom_st_stream_open(path, e, 3, NULL, &w) == LOOM_OK);
    if (w) {
        CHECK(loom_st_stream_write(w, a, sizeof a) == LOOM_OK);
        CHECK(loom_st_stream_finish(w) == LOOM_ERR_INVALID_ARG);
    }
    CHECK(access(path, F_OK) != 0);
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    int tmps = 0;
    while (d && (de = readdir(d))) tmps += strstr(de->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK_EQ_INT(tmps, 0);
}

/* --pack-f32 (MLX's kernels' rule): the same scales and biases, levels
 * close to the default's (bf16 rounding moves the scale by up to 2^-9 of
 * itself, so the top of an 8-bit grid by up to 255 x 2^-9 of a step, plus
 * the bias's share: at most two levels), and the model loads. */
static void check_pack_f32(const char *stored_dir, int bits) {
    char dst[512];
    snprintf(dst, sizeof dst, "%s/f32pack%d", tmpdir, bits);
    loom_convert_params p = {.bits = bits, .group = 64, .pack = LOOM_QPACK_F32};
    CHECK_EQ_INT(loom_convert_model(FIX "qwen3-tiny", dst, &p, NULL), LOOM_OK);
    loom_safetensors *a = open_model(stored_dir), *b = open_model(dst);
    int moved = 0, far = 0, total = 0;
    for (int i = 0; a && b && i < loom_st_count(a); i++) {
        const loom_st_tensor *x = loom_st_at(a, i), *y = loom_st_find(b, x->name);
        CHECK(y && y->nbytes == x->nbytes);
        if (!y || y->nbytes != x->nbytes) continue;
        if (x->dtype != LOOM_DT_U32) {
            CHECKF(!memcmp(x->data, y->data, x->nbytes), "%s differs", x->name);
            continue;
        }
        const uint32_t *wx = x->data, *wy = y->data;
        for (size_t k = 0; k < x->nbytes / 4; k++)
            for (int e = 0; e < 32 / bits; e++) {
                int qx = (int)((wx[k] >> (e * bits)) & ((1u << bits) - 1));
                int qy = (int)((wy[k] >> (e * bits)) & ((1u << bits) - 1));
                moved += qx != qy;
                far += abs(qx - qy) > 2;
                total++;
            }
    }
    fprintf(stderr, "%d-bit: --pack-f32 moves %d of %d levels\n", bits, moved, total);
    CHECK(moved > 0);
    CHECK_EQ_INT(far, 0);
    loom_st_close(a);
    loom_st_close(b);
    loom_model *m = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    CHECK(loom_model_load(dst, &mp, &m) == LOOM_OK);
    loom_model_free(m);
}

int main(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const int bits[2] = {8, 4};
    /* These random-weight fixtures are harsh on quantization (uniform
     * weights, 64-wide groups spanning the whole range): 8-bit logits land
     * within ~2.5% of the f32 logit range, 4-bit within ~30%. */
    const double bound[2] = {0.05, 0.5};
    for (int k = 0; k < 2; k++) {
        char dst[512], ref[256];
        snprintf(dst, sizeof dst, "%s/q%d", tmpdir, bits[k]);
        snprintf(ref, sizeof ref, FIX "qwen3-tiny-mlx%d", bits[k]);
        loom_convert_params p = {.bits = bits[k], .group = 64};
        loom_convert_stats st;
        loom_status s = loom_convert_model(FIX "qwen3-tiny", dst, &p, &st);
        CHECKF(s == LOOM_OK, "convert %d-bit: %s", bits[k], loom_last_error());
        if (s) continue;
        CHECK_EQ_INT(st.n_quantized, 22);
        CHECK_EQ_INT(st.n_copied, 13);
        check_against_fixture(dst, ref, bits[k]);
        check_config(dst, ref, bits[k]);
        check_dequant(dst, bits[k]);
        check_logits(dst, bits[k], bound[k]);
        /* Bit-identical to the fixture, so the fixture's greedy holds. */
        if (bits[k] == 4) check_greedy(dst, ref);
        else check_greedy8(dst);
        check_pack_f32(dst, bits[k]);
        /* from bf16 copies (convert rounds what it does not quantize to
         * bf16; quantize_bits keeps it as stored); untied embeddings too */
        const char *fams[2] = {"qwen3-tiny", "llama3-tiny"};
        for (int f = 0; f < 2; f++) {
            char half[512], fix[256];
            snprintf(fix, sizeof fix, FIX "%s", fams[f]);
            snprintf(half, sizeof half, "%s/%s-bf16", tmpdir, fams[f]);
            if (k == 0) write_bf16_copy(fix, half);
            snprintf(dst, sizeof dst, "%s/%s-q%d", tmpdir, fams[f], bits[k]);
            CHECK(loom_convert_model(half, dst, &p, &st) == LOOM_OK);
            check_load_quantized(half, dst, bits[k]);
        }
    }
    check_load_quantized_refusals();
    check_stream();
    check_refusals();
    check_cli();
    rm_tree(tmpdir);
    return test_report("test_convert");
}
