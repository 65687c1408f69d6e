/* The engine with images (Qwen3-VL fixture): a request's images encoded
 * once on the engine thread, its prompt rows prepared, its decode rows
 * turned by the rope delta. Checks: the fixture's greedy tokens; image and
 * text requests batched (any budget and chunk) give every request the
 * tokens and log-probabilities, bit for bit, of its solo run; the prefix
 * cache hits the same image and text without rerunning the tower and
 * misses another image with the same tokens, in memory, through a
 * session and on disk; the errors, cancellation and the vision span. */
#include <stdint.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "test.h"
#include "vision/image.h"
#include "vision/imgproc.h"

#define DIR "tests/fixtures/models/qwen3-vl-tiny"
#define NG 8

/* case 3 of the fixture: image C (4 placeholders) and D (12) between texts */
static const int32_t IDS[] = {500, 320, 198, 272, 155, 502, 504, 504, 504, 504, 503, 39, 112,
                              353, 502, 504, 504, 504, 504, 504, 504, 504, 504, 504, 504, 504,
                              504, 503, 91, 266, 421, 258, 501, 198, 500, 321, 198};
#define N_IDS ((int)(sizeof IDS / sizeof IDS[0]))
static const int32_t GREEDY[NG] = {327, 419, 133, 55, 465, 465, 465, 465};
static const int32_t TEXT[] = {500, 320, 198, 17, 44, 301, 77, 12, 9, 250, 81, 33, 501, 198,
                               500, 321, 198};
#define N_TEXT ((int)(sizeof TEXT / sizeof TEXT[0]))

typedef struct pixels {
    loom_imgproc_out out;
    loom_request_image img;
} pixels;

static int load_pixels(const char *file, pixels *p) {
    loom_imgproc proc;
    loom_image im = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/images/%s", DIR, file);
    memset(p, 0, sizeof *p);
    if (loom_imgproc_load(DIR, &proc) || loom_image_load(path, &im) ||
        loom_imgproc_run(&proc, &im, &p->out)) {
        fprintf(stderr, "%s: %s\n", path, loom_last_error());
        loom_image_free(&im);
        return 0;
    }
    p->img = (loom_request_image){.pixels = p->out.pixel_values, .hash = loom_image_hash(&im),
                                  .grid = {p->out.plan.grid_t, p->out.plan.grid_h, p->out.plan.grid_w}};
    loom_image_free(&im);
    return 1;
}

typedef struct result {
    int32_t tok[NG + 1];
    float lp[NG + 1][21]; /* the token's, then the top 20 */
    int n, cached;
    loom_finish fin;
    char err[256];
} result;

static loom_engine *engine(loom_model *m, int budget, int chunk, int cache, const char *disk) {
    loom_engine_params ep = loom_engine_default_params();
    ep.max_batch_tokens = budget;
    ep.max_seqs = 8;
    ep.n_ctx = 256;
    ep.prefill_chunk = chunk;
    ep.prefix_cache = cache;
    ep.prefix_cache_dir = disk;
    ep.model_dir = DIR;
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(m, &ep, &e) == LOOM_OK, "%s", loom_last_error());
    return e;
}

static loom_request *submit(loom_engine *e, const int32_t *ids, int n, const loom_request_image *imgs,
                            int n_img, const char *save, const char *resume) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = NG;
    rp.ignore_eos = 1;
    rp.logprobs = 20;
    rp.images = imgs;
    rp.n_images = n_img;
    rp.save_id = save;
    rp.resume_id = resume;
    loom_request *r = NULL;
    CHECKF(loom_engine_submit(e, &rp, &r) == LOOM_OK, "submit: %s", loom_last_error());
    return r;
}

static void drain(loom_request *r, result *out) {
    memset(out, 0, sizeof *out);
    out->fin = LOOM_FINISH_ERROR;
    for (loom_event ev; r && loom_request_next(r, &ev, 60000) == LOOM_OK;) {
        if (ev.finish != LOOM_FINISH_NONE) {
            out->fin = ev.finish;
            out->cached = ev.n_cached;
            snprintf(out->err, sizeof out->err, "%s", loom_request_error(r));
            break;
        }
        if (out->n > NG) break;
        out->tok[out->n] = ev.token;
        out->lp[out->n][0] = ev.logprob;
        memcpy(&out->lp[out->n][1], ev.top_logprobs, sizeof ev.top_logprobs);
        out->n++;
    }
    loom_request_free(r);
}

static int same(const result *a, const result *b) {
    return a->n == b->n && !memcmp(a->tok, b->tok, sizeof a->tok[0] * (size_t)a->n) &&
           !memcmp(a->lp, b->lp, sizeof a->lp[0] * (size_t)a->n);
}

static uint64_t encodes(loom_engine *e) {
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    return st.vision_encodes;
}

static void wait_idle(loom_engine *e) {
    loom_engine_stats st;
    for (int i = 0; i < 5000; i++) {
        loom_engine_get_stats(e, &st);
        if (!st.running && !st.waiting && st.kv_blocks_free == st.kv_blocks_total) break;
        usleep(1000);
    }
    CHECKF(!st.running && !st.waiting && st.kv_blocks_free == st.kv_blocks_total,
           "not idle: %d running, %d waiting, %d of %d blocks free", st.running, st.waiting,
           st.kv_blocks_free, st.kv_blocks_total);
}

/* One request alone on a fresh engine without a prefix cache. */
static void solo(loom_model *m, const int32_t *ids, int n, const loom_request_image *imgs, int n_img,
                 result *out) {
    loom_engine *e = engine(m, 2048, 0, 0, NULL);
    drain(submit(e, ids, n, imgs, n_img, NULL, NULL), out);
    CHECKF(out->fin == LOOM_FINISH_LENGTH && out->n == NG, "solo: finish %d, %d tokens: %s",
           out->fin, out->n, out->err);
    CHECK_EQ_INT(encodes(e), n_img);
    loom_engine_free(e);
}

static void batched_equals_solo(loom_model *m, const loom_request_image cd[2],
                                const loom_request_image cd2[2]) {
    result ref[3];
    solo(m, IDS, N_IDS, cd, 2, &ref[0]);
    CHECKF(!memcmp(ref[0].tok, GREEDY, sizeof GREEDY), "greedy tokens differ from the fixture's: "
           "%d %d %d %d", ref[0].tok[0], ref[0].tok[1], ref[0].tok[2], ref[0].tok[3]);
    solo(m, IDS, N_IDS, cd2, 2, &ref[1]);
    solo(m, TEXT, N_TEXT, NULL, 0, &ref[2]);
    CHECKF(!same(&ref[0], &ref[1]), "another image gave the same output");
    static const int budgets[] = {8, 20, 2048}, chunks[] = {1, 5, 0};
    for (size_t b = 0; b < LOOM_ARRAY_LEN(budgets); b++)
        for (size_t c = 0; c < LOOM_ARRAY_LEN(chunks); c++) {
            loom_engine *e = engine(m, budgets[b], chunks[c], 0, NULL);
            if (!e) continue;
            /* text first, so image rows batch with its decode rows */
            loom_request *r[4];
            r[0] = submit(e, TEXT, N_TEXT, NULL, 0, NULL, NULL);
            loom_event ev;
            CHECK(loom_request_next(r[0], &ev, 60000) == LOOM_OK);
            result first = {.n = 1, .tok = {ev.token}};
            first.lp[0][0] = ev.logprob;
            memcpy(&first.lp[0][1], ev.top_logprobs, sizeof ev.top_logprobs);
            r[1] = submit(e, IDS, N_IDS, cd, 2, NULL, NULL);
            r[2] = submit(e, IDS, N_IDS, cd2, 2, NULL, NULL);
            r[3] = submit(e, TEXT, N_TEXT, NULL, 0, NULL, NULL);
            result got[4];
            drain(r[0], &got[0]);
            memmove(&got[0].tok[1], &got[0].tok[0], sizeof got[0].tok[0] * NG);
            memmove(&got[0].lp[1], &got[0].lp[0], sizeof got[0].lp[0] * NG);
            got[0].tok[0] = first.tok[0];
            memcpy(got[0].lp[0], first.lp[0], sizeof first.lp[0]);
            got[0].n++;
            for (int i = 1; i < 4; i++) drain(r[i], &got[i]);
            static const int which[4] = {2, 0, 1, 2};
            for (int i = 0; i < 4; i++)
                CHECKF(same(&got[i], &ref[which[i]]), "budget %d chunk %d request %d: %d tokens "
                       "(%s), not bit-equal to its solo run", budgets[b], chunks[c], i, got[i].n,
                       got[i].err);
            CHECK_EQ_INT(encodes(e), 4);
            wait_idle(e);
            loom_engine_free(e);
        }
}

/* A KV pool too small for all four: requests are preempted and
 * recomputed with the tokens they made so far, and still give their solo
 * output. A prepared prompt is freed once its rows are done (it holds
 * every prompt token's embedding and deepstack rows), but each image's
 * tower output stays with the request: a recompute runs no tower, even
 * with the prefix cache off (as here). */
static void preemption(loom_model *m, const loom_request_image cd[2], const loom_request_image cd2[2]) {
    result ref[2];
    solo(m, IDS, N_IDS, cd, 2, &ref[0]);
    solo(m, IDS, N_IDS, cd2, 2, &ref[1]);
    loom_engine_params ep = loom_engine_default_params();
    ep.max_seqs = 4;
    ep.n_ctx = 64;
    ep.block_size = 4;
    ep.prefix_cache = 0;
    ep.model_dir = DIR;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(m, &ep, &e) == LOOM_OK);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st);
    loom_engine_free(e);
    ep.kv_memory = st.kv_block_bytes * 21; /* two prompts of 10 blocks, not their decodes */
    CHECK(loom_engine_create(m, &ep, &e) == LOOM_OK);
    if (!e) return;
    loom_request *r[4];
    for (int i = 0; i < 4; i++) r[i] = submit(e, IDS, N_IDS, i % 2 ? cd2 : cd, 2, NULL, NULL);
    for (int i = 0; i < 4; i++) {
        result got;
        drain(r[i], &got);
        CHECKF(same(&got, &ref[i % 2]), "request %d under preemption: %d tokens (%s)", i, got.n, got.err);
    }
    loom_engine_get_stats(e, &st);
    CHECKF(st.preemptions > 0, "no preemption happened");
    CHECKF(st.vision_encodes == 8, "%llu tower runs for 8 images and %llu preemptions",
           (unsigned long long)st.vision_encodes,
           (unsigned long long)st.preemptions);
    wait_idle(e);
    loom_engine_free(e);
}

/* The same image and text hit without the tower; another image with the
 * same tokens misses; a session resumes over the image; the disk tier
 * keeps the two apart across engines. */
static void prefix_cache(loom_model *m, const loom_request_image cd[2],
                         const loom_request_image cd2[2]) {
    result cold, cold2, got;
    solo(m, IDS, N_IDS, cd, 2, &cold);
    solo(m, IDS, N_IDS, cd2, 2, &cold2);
    char disk[] = "/tmp/loom-test-vision-XXXXXX";
    CHECK(mkdtemp(disk) != NULL);
    loom_engine *e = engine(m, 2048, 0, 1, disk);
    if (!e) return;
    drain(submit(e, IDS, N_IDS, cd, 2, "turn1", NULL), &got);
    CHECK(same(&got, &cold));
    CHECK_EQ_INT(got.cached, 0);
    CHECK_EQ_INT(encodes(e), 2);
    /* both images lie in the first two blocks (placeholders 6..26): a hit
     * of 32 tokens runs no tower, and decode still turns by the delta */
    drain(submit(e, IDS, N_IDS, cd, 2, NULL, NULL), &got);
    CHECKF(same(&got, &cold), "a cache hit changed the output (%d tokens, %s)", got.n, got.err);
    CHECK_EQ_INT(got.cached, 32);
    CHECK_EQ_INT(encodes(e), 2);
    /* image D differs (same grid): the chain differs from its first block */
    drain(submit(e, IDS, N_IDS, cd2, 2, NULL, NULL), &got);
    CHECKF(same(&got, &cold2), "another image: output is not its cold one");
    CHECK_EQ_INT(got.cached, 0);
    CHECK_EQ_INT(encodes(e), 4);
    /* a session continued: turn 1's prompt and answer, then more text */
    int32_t next[N_IDS + NG + 4];
    memcpy(next, IDS, sizeof IDS);
    memcpy(next + N_IDS, cold.tok, sizeof cold.tok[0] * NG);
    memcpy(next + N_IDS + NG, (const int32_t[]){501, 198, 500, 320}, 4 * sizeof(int32_t));
    int n_next = N_IDS + NG + 4;
    result sess_cold;
    solo(m, next, n_next, cd, 2, &sess_cold);
    drain(submit(e, next, n_next, cd, 2, NULL, "turn1"), &got);
    CHECKF(same(&got, &sess_cold), "a session resume changed the output");
    CHECK_EQ_INT(got.cached, N_IDS + NG - 1); /* the last token was never fed */
    CHECK_EQ_INT(encodes(e), 4);
    /* the session with the other image D': resumed up to D's first
     * placeholder, so only D' is encoded */
    drain(submit(e, next, n_next, cd2, 2, "turn1b", "turn1"), &got);
    CHECK_EQ_INT(got.cached, 15);
    CHECK_EQ_INT(encodes(e), 5);
    result sess_cold2;
    solo(m, next, n_next, cd2, 2, &sess_cold2);
    CHECKF(same(&got, &sess_cold2), "a session resume up to another image changed its output");
    wait_idle(e);
    loom_engine_free(e); /* the cache spills to disk */
    e = engine(m, 2048, 0, 1, disk);
    if (e) {
        loom_request_image only_c[2] = {cd[0], cd2[1]};
        only_c[1].hash ^= 0x5555; /* pixels of D', hash of neither */
        drain(submit(e, IDS, N_IDS, only_c, 2, NULL, NULL), &got);
        CHECK_EQ_INT(got.cached, 0);
        drain(submit(e, IDS, N_IDS, cd, 2, NULL, NULL), &got);
        CHECKF(same(&got, &cold), "a disk hit changed the output");
        CHECK_EQ_INT(got.cached, 32);
        CHECK_EQ_INT(encodes(e), 2);
        loom_engine_stats st;
        loom_engine_get_stats(e, &st);
        CHECKF(st.disk_hit_tokens >= 32, "disk hit tokens %llu", (unsigned long long)st.disk_hit_tokens);
        wait_idle(e);
        loom_engine_free(e);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0);
}

static void errors_cancel_trace(loom_model *m, const loom_request_image cd[2]) {
    loom_engine *e = engine(m, 2048, 0, 1, NULL);
    if (!e) return;
    loom_request_params rp = loom_request_default_params();
    rp.prompt = IDS;
    rp.n_prompt = N_IDS;
    rp.images = cd;
    rp.n_images = 1;
    loom_request *r = NULL;
    CHECK(loom_engine_submit(e, &rp, &r) == LOOM_ERR_INVALID_ARG);
    CHECKF(strstr(loom_last_error(), "16 image placeholder tokens") &&
           strstr(loom_last_error(), "need 4"), "%s", loom_last_error());
    rp.n_images = 0; /* placeholders without images */
    CHECK(loom_engine_submit(e, &rp, &r) == LOOM_ERR_INVALID_ARG);
    CHECKF(strstr(loom_last_error(), "16 image placeholder tokens") &&
           strstr(loom_last_error(), "0 image(s) need 0"), "%s", loom_last_error());
    /* cancelled at once and while running: nothing leaks */
    for (int k = 0; k < 4; k++) {
        r = submit(e, IDS, N_IDS, cd, 2, NULL, NULL);
        if (k) usleep(200 * k);
        loom_request_cancel(r);
        result res;
        drain(r, &res);
    }
    wait_idle(e);
    /* a traced request records the tower's span (a hit of 32 tokens: no
     * image is encoded) */
    rp.n_images = 2;
    rp.trace = 1;
    rp.max_tokens = 2;
    rp.prompt = IDS;
    r = NULL;
    CHECK(loom_engine_submit(e, &rp, &r) == LOOM_OK);
    for (loom_event ev; r && loom_request_next(r, &ev, 60000) == LOOM_OK && !ev.finish;) {
    }
    char *tr = r ? loom_request_trace_json(r) : NULL;
    CHECKF(tr && strstr(tr, "\"prefill.vision\"") && strstr(tr, "\"encoded\":0,\"startToken\":32"), "trace: %s",
           tr ? tr : "(none)");
    free(tr);
    loom_request_free(r);
    loom_engine_free(e);
}

/* Images for a model without a vision tower: refused, naming the model. */
static void text_model(const loom_request_image cd[2]) {
    loom_model *m = NULL;
    if (loom_model_load("tests/fixtures/models/qwen3-tiny", NULL, &m)) {
        CHECK(0);
        return;
    }
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 256;
    ep.model_dir = "tests/fixtures/models/qwen3-tiny";
    loom_engine *e = NULL;
    CHECK(loom_engine_create(m, &ep, &e) == LOOM_OK);
    loom_request_params rp = loom_request_default_params();
    rp.prompt = IDS;
    rp.n_prompt = N_IDS;
    rp.images = cd;
    rp.n_images = 2;
    loom_request *r = NULL;
    CHECK(e && loom_engine_submit(e, &rp, &r) == LOOM_ERR_INVALID_ARG);
    CHECKF(strstr(loom_last_error(), "Qwen3ForCausalLM") && strstr(loom_last_error(), "no vision"),
           "%s", loom_last_error());
    loom_engine_free(e);
    loom_model_free(m);
}

int main(void) {
    loom_model *m = NULL;
    if (loom_model_load(DIR, NULL, &m)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    pixels c, d;
    if (!load_pixels("C_32x32_rgba.png", &c) || !load_pixels("D_300x200_rgb.png", &d)) return 1;
    /* D': D's pixels mirrored, another image on the same grid */
    loom_imgproc_out d2 = d.out;
    d2.pixel_values = malloc(sizeof(float) * d.out.n);
    for (size_t i = 0; i < d.out.n; i++) d2.pixel_values[i] = d.out.pixel_values[d.out.n - 1 - i];
    loom_request_image cd[2] = {c.img, d.img}, cd2[2] = {c.img, d.img};
    cd2[1].pixels = d2.pixel_values;
    cd2[1].hash = d.img.hash * 31 + 7;
    batched_equals_solo(m, cd, cd2);
    prefix_cache(m, cd, cd2);
    preemption(m, cd, cd2);
    errors_cancel_trace(m, cd);
    text_model(cd);
    free(d2.pixel_values);
    loom_imgproc_out_free(&c.out);
    loom_imgproc_out_free(&d.out);
    loom_model_free(m);
    return test_report("test_engine_vision");
}
