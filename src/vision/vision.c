/* vision: the table of tower families, loading a tower beside its text
 * model, the prompt's M-RoPE positions and the prepared prompt (text
 * embeddings with image features spliced in). */
#include "vision/vision_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/matmul.h"

/* Each tower file's side of its row. */
#define TOWER(name)                                                                        \
    loom_status name##_family_load(loom_vision *v, const cJSON *root, const cJSON *vc);    \
    loom_status name##_family_encode(loom_vision *v, const loom_vision_image *img,         \
                                     float *embeds, float *deep);                          \
    void name##_family_free(void *tower);                                                  \
    double name##_family_flops(const loom_vision *v, const int grid[3])
TOWER(loom_qwen_vit);
TOWER(loom_qwen25_vit);
TOWER(loom_siglip);
#undef TOWER
#define ROW(arch, name, mrope, spans) \
    {arch, name##_family_load, name##_family_encode, name##_family_free, name##_family_flops, \
     mrope, spans}

/* One row per family; a new tower is its own file and a row here.
 * Qwen2.5-VL's images take the same get_rope_index positions as Qwen3-VL's
 * (its time axis only moves for video); Gemma 3 keeps plain positions and
 * makes each image's tokens one bidirectional span. */
static const loom_vision_family families[] = {
    ROW("Qwen3VLForConditionalGeneration", loom_qwen_vit, 1, 0),
    ROW("Qwen3_5ForConditionalGeneration", loom_qwen_vit, 1, 0),
    ROW("Qwen2_5_VLForConditionalGeneration", loom_qwen25_vit, 1, 0),
    ROW("Gemma3ForConditionalGeneration", loom_siglip, 0, 1),
};
#undef ROW

/* Integer field of a config object (def when absent). */
static int cfg_int(const cJSON *o, const char *k, int def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valueint : def;
}

/* ---- loading ------------------------------------------------------------- */

loom_status loom_vision_load(loom_model *m, const char *dir, loom_vision **out) {
    *out = NULL;
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    loom_status s = loom_read_file(path, &text, NULL);
    if (s) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_err(LOOM_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    if (!cJSON_IsObject(vc)) {
        cJSON_Delete(root);
        return LOOM_OK;
    }
    const loom_vision_family *fam = NULL;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(families); i++)
        if (!strcmp(families[i].arch, m->cfg.arch)) fam = &families[i];
    if (!fam) {
        cJSON_Delete(root);
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: architecture %s has a vision_config, but no "
                        "vision tower for it is built in", path, m->cfg.arch);
    }
    loom_vision *v = calloc(1, sizeof *v);
    if (!v) {
        cJSON_Delete(root);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    v->fam = fam;
    v->m = m;
    loom_vision_info *vi = &v->info;
    /* Gemma 3 spells them image_token_index, boi_token_index, eoi_token_index */
    vi->image_token = cfg_int(root, "image_token_id",
                                          cfg_int(root, "image_token_index", -1));
    vi->video_token = cfg_int(root, "video_token_id", -1);
    vi->vision_start = cfg_int(root, "vision_start_token_id",
                                           cfg_int(root, "boi_token_index", -1));
    vi->vision_end = cfg_int(root, "vision_end_token_id",
                                         cfg_int(root, "eoi_token_index", -1));
    vi->mrope = fam->mrope;
    vi->spans = fam->spans;
    if (vi->image_token < 0 || vi->image_token >= m->cfg.vocab_size)
        s = loom_err(LOOM_ERR_FORMAT, "%s: image_token_id %d is not in the vocabulary of %d",
                     path, vi->image_token, m->cfg.vocab_size);
    if (!s) s = fam->load(v, root, vc);
    if (!s && vi->out_hidden != m->cfg.hidden_size)
        s = loom_err(LOOM_ERR_FORMAT, "%s: vision out_hidden_size %d differs from the text "
                     "model's hidden_size %d", path, vi->out_hidden, m->cfg.hidden_size);
    cJSON_Delete(root);
    if (s) {
        loom_vision_free(v);
        return s;
    }
    *out = v;
    return LOOM_OK;
}

void loom_vision_free(loom_vision *v) {
    if (!v) return;
    if (v->tower) v->fam->free(v->tower);
    free(v);
}

const loom_vision_info *loom_vision_get_info(const loom_vision *v) { return &v->info; }

/* The error for a grid the tower cannot take. */
static loom_status grid_error(const loom_vision_info *vi, const char *what, const int g[3]) {
    if (vi->tokens_per_image > 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "%s: grid %dx%dx%d, expected 1x1x1 (one whole "
                        "image of %d tokens)", what, g[0], g[1], g[2], vi->tokens_per_image);
    return loom_err(LOOM_ERR_INVALID_ARG, "%s: grid %dx%dx%d is not a grid of %dx%d merge "
                    "blocks", what, g[0], g[1], g[2], vi->merge, vi->merge);
}

int loom_vision_tokens(const loom_vision_info *vi, const int grid[3]) {
    int t = grid[0], h = grid[1], w = grid[2], g = vi->merge;
    if (vi->tokens_per_image > 0) return t == 1 && h == 1 && w == 1 ? vi->tokens_per_image : 0;
    if (t <= 0 || h <= 0 || w <= 0 || g <= 0 || h % g || w % g) return 0;
    if ((long long)t * h * w > (1 << 24)) return 0;
    return t * (h / g) * (w / g);
}

loom_status loom_vision_encode(loom_vision *v, const loom_vision_image *img, float *embeds,
                               float *deep) {
    if (!loom_vision_tokens(&v->info, img->grid))
        return grid_error(&v->info, "vision", img->grid);
    return v->fam->encode(v, img, embeds, deep);
}

double loom_vision_flops(const loom_vision *v, const int grid[3]) {
    return loom_vision_tokens(&v->info, grid) ? v->fam->flops(v, grid) : 0;
}

/* ---- positions ----------------------------------------------------------- */


/* The error for placeholders that do not match the images. */
static loom_status count_error(const loom_vision_info *vi, const int32_t *ids, int n,
                               const int (*grids)[3], int n_img) {
    int have = 0, need = 0;
    for (int i = 0; i < n; i++) have += ids[i] == vi->image_token;
    for (int k = 0; k < n_img; k++) need += loom_vision_tokens(vi, grids[k]);
    if (have != need)
        return loom_err(LOOM_ERR_INVALID_ARG, "the prompt has %d image placeholder tokens (id %d), "
                        "but its %d image(s) need %d", have, vi->image_token, n_img, need);
    return loom_err(LOOM_ERR_INVALID_ARG, "the prompt's image placeholder tokens (id %d) do not "
                    "come in one run of each image's token count, in image order", vi->image_token);
}

/* Whether the placeholders come as one run per image, of its token count. */
static loom_status check_runs(const loom_vision_info *vi, const int32_t *ids, int n,
                              const int (*grids)[3], int n_img) {
    int st = 0;
    for (int k = 0; k < n_img; k++) {
        int cnt = loom_vision_tokens(vi, grids[k]), ed = st;
        char what[32];
        snprintf(what, sizeof what, "image %d", k + 1);
        if (!cnt) return grid_error(vi, what, grids[k]);
        while (ed < n && ids[ed] != vi->image_token) ed++;
        if (ed + cnt > n) return count_error(vi, ids, n, grids, n_img);
        for (int i = ed; i < ed + cnt; i++)
            if (ids[i] != vi->image_token) return count_error(vi, ids, n, grids, n_img);
        st = ed + cnt;
    }
    for (int i = st; i < n; i++)
        if (ids[i] == vi->image_token) return count_error(vi, ids, n, grids, n_img);
    return LOOM_OK;
}

loom_status loom_vision_positions(const loom_vision_info *vi, const int32_t *ids, int n,
                                  const int (*grids)[3], int n_img, int32_t *pos3, int *delta) {
    if (!vi->mrope) {
        /* plain positions on all three streams */
        loom_status s = check_runs(vi, ids, n, grids, n_img);
        if (s) return s;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < 3; k++) pos3[(size_t)k * n + i] = i;
        *delta = 0;
        return LOOM_OK;
    }
    int st = 0, next = 0; /* next token to place; next free position */
    for (int k = 0; k < n_img; k++) {
        int cnt = loom_vision_tokens(vi, grids[k]);
        char what[32];
        snprintf(what, sizeof what, "image %d", k + 1);
        if (!cnt) return grid_error(vi, what, grids[k]);
        int ed = st;
        while (ed < n && ids[ed] != vi->image_token) ed++;
        if (ed + cnt > n) return count_error(vi, ids, n, grids, n_img);
        for (int i = ed; i < ed + cnt; i++)
            if (ids[i] != vi->image_token) return count_error(vi, ids, n, grids, n_img);
        for (int i = st; i < ed; i++, next++)
            for (int s = 0; s < 3; s++) pos3[(size_t)s * n + i] = next;
        /* t, h, w over the merged grid, all from the position after the text */
        int gh = grids[k][1] / vi->merge, gw = grids[k][2] / vi->merge, mx = 0;
        for (int i = 0; i < cnt; i++) {
            int t = i / (gh * gw), h = i / gw % gh, w = i % gw;
            pos3[ed + i] = next + t;
            pos3[(size_t)n + ed + i] = next + h;
            pos3[(size_t)2 * n + ed + i] = next + w;
            mx = LOOM_MAX(mx, LOOM_MAX(t, LOOM_MAX(h, w)));
        }
        next += mx + 1;
        st = ed + cnt;
    }
    for (int i = st; i < n; i++) {
        if (ids[i] == vi->image_token) return count_error(vi, ids, n, grids, n_img);
        for (int s = 0; s < 3; s++) pos3[(size_t)s * n + i] = next;
        next++;
    }
    *delta = next - n;
    return LOOM_OK;
}

/* ---- the prepared prompt ------------------------------------------------- */

void loom_vision_prompt_free(loom_vision_prompt *p) {
    if (!p) return;
    loom_free(p->embeds);
    loom_free(p->pos3);
    loom_free(p->deepstack);
    loom_free(p->groups);
    memset(p, 0, sizeof *p);
}

/* Whether a cut before token i splits a span of g. */
static int cuts_span(const int32_t *g, int i) { return g[i] >= 0 && g[i - 1] == g[i]; }

int loom_vision_prompt_batch(const loom_vision_prompt *p, int n_batch) {
    if (!p->groups || n_batch <= 0 || n_batch >= p->n) return n_batch;
    int longest = 0;
    for (int i = 0, run = 0; i < p->n; i++) {
        run = i > 0 && cuts_span(p->groups, i) ? run + 1 : p->groups[i] >= 0;
        longest = LOOM_MAX(longest, run);
    }
    for (int b = n_batch; b >= LOOM_MAX(longest, 1); b--) {
        int ok = 1;
        for (int i = b; ok && i < p->n; i += b) ok = !cuts_span(p->groups, i);
        if (ok) return b;
    }
    return p->n;
}

loom_status loom_vision_prompt_build(loom_vision *v, const int32_t *ids, int n,
                                     const loom_vision_image *imgs, int n_img,
                                     loom_vision_prompt *out) {
    memset(out, 0, sizeof *out);
    const loom_vision_info *vi = &v->info;
    const loom_model *m = v->m;
    int H = m->cfg.hidden_size, D = vi->n_deep, V = m->cfg.vocab_size;
    if (n <= 0 || n_img < 0) return loom_err(LOOM_ERR_INVALID_ARG, "vision prompt: no tokens");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return loom_err(LOOM_ERR_RANGE, "token id %d at index %d is out of range (vocabulary "
                            "has %d tokens: 0..%d)", ids[i], i, V, V - 1);
    int (*grids)[3] = calloc((size_t)LOOM_MAX(n_img, 1), sizeof *grids);
    if (!grids) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n_img; k++) memcpy(grids[k], imgs[k].grid, sizeof grids[k]);
    out->n = n;
    out->embeds = loom_alloc(sizeof(float) * (size_t)n * H);
    out->pos3 = vi->mrope ? loom_alloc(sizeof(int32_t) * 3 * (size_t)n) : NULL;
    out->deepstack = D > 0 && n_img > 0 ? loom_alloc(sizeof(float) * (size_t)D * n * H) : NULL;
    loom_status s = LOOM_OK;
    if (!out->embeds || (vi->mrope && !out->pos3) || (D > 0 && n_img > 0 && !out->deepstack))
        s = loom_err(LOOM_ERR_NOMEM, "vision prompt: out of memory for %d tokens", n);
    int delta = 0;
    if (!s && vi->mrope) s = loom_vision_positions(vi, ids, n, (const int(*)[3])grids, n_img,
                                                   out->pos3, &delta);
    if (!s && !vi->mrope) s = check_runs(vi, ids, n, (const int(*)[3])grids, n_img);
    if (!s && vi->spans && n_img > 0) {
        /* image k's run of placeholders is span k */
        out->groups = loom_alloc(sizeof(int32_t) * (size_t)n);
        if (!out->groups) s = loom_err(LOOM_ERR_NOMEM, "vision prompt: out of memory");
        for (int i = 0, k = 0, left = 0; !s && i < n; i++) {
            if (ids[i] == vi->image_token && !left) left = loom_vision_tokens(vi, grids[k++]);
            out->groups[i] = ids[i] == vi->image_token ? k - 1 : -1;
            if (ids[i] == vi->image_token) left--;
        }
    }
    for (int i = 0; !s && i < n; i++) {
        float *x = out->embeds + (size_t)i * H;
        loom_fwd_weight_row(m, &m->embed, x, ids[i]);
        if (m->embed_scale != 1.0f)
            for (int j = 0; j < H; j++) x[j] *= m->embed_scale;
    }
    /* each image's features over its placeholders, in order */
    float *feat = NULL, *deep = NULL;
    for (int k = 0, at = 0; !s && k < n_img; k++) {
        int cnt = loom_vision_tokens(vi, grids[k]);
        const float *src = imgs[k].features, *dsrc = src ? src + (size_t)cnt * H : NULL;
        if (!imgs[k].pixels && !src) { /* not wanted: its rows keep the text embedding */
            for (int j = 0; j < cnt; j++, at++)
                while (ids[at] != vi->image_token) at++;
            continue;
        }
        if (!src) {
            free(feat);
            free(deep);
            feat = malloc(sizeof(float) * (size_t)cnt * H);
            deep = D > 0 ? malloc(sizeof(float) * (size_t)D * cnt * H) : NULL;
            if (!feat || (D > 0 && !deep)) {
                s = loom_err(LOOM_ERR_NOMEM, "vision prompt: out of memory");
                break;
            }
            if ((s = loom_vision_encode(v, &imgs[k], feat, deep))) break;
            src = feat;
            dsrc = deep;
        }
        for (int j = 0; j < cnt; j++, at++) {
            while (ids[at] != vi->image_token) at++;
            memcpy(out->embeds + (size_t)at * H, src + (size_t)j * H, sizeof(float) * (size_t)H);
            for (int d = 0; d < D; d++)
                memcpy(out->deepstack + ((size_t)d * n + at) * H, dsrc + ((size_t)d * cnt + j) * H,
                       sizeof(float) * (size_t)H);
        }
    }
    free(feat);
    free(deep);
    free(grids);
    if (s) {
        loom_vision_prompt_free(out);
        return s;
    }
    out->in = (loom_fwd_input){.embeds = out->embeds, .pos3 = out->pos3,
                               .deepstack = out->deepstack, .n_deep = out->deepstack ? D : 0,
                               .groups = out->groups, .pos_delta = delta};
    return LOOM_OK;
}
