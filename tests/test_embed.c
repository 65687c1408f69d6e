/* Embeddings through the engine: the hidden states after the final norm
 * match transformers' last_hidden_state (tests/fixtures/models/qwen3-tiny/
 * embeddings.safetensors, float64 math), last-token and mean pooling match
 * its pooled vectors, many inputs batched in the same steps (with a
 * generation among them) give what each gives alone, a prefix-cache hit
 * gives the same vector as a miss, and the model directory's
 * sentence-transformers Pooling config picks the pooling; a forward row
 * asking for hidden states beside logits gets the same logits. */
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/kv.h"
#include "load/safetensors.h"
#include "model/forward.h"
#include "test.h"

#define DIR "tests/fixtures/models/qwen3-tiny"
#define NP 4
#define TOL 1e-5

typedef struct fixture {
    loom_safetensors *emb, *ref;
    loom_model *m;
    int H;
    const int32_t *ids[NP];
    int len[NP];
    const float *hidden[NP], *last[NP], *mean[NP];
} fixture;

static const void *tensor(loom_safetensors *st, const char *fmt, int i) {
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    const loom_st_tensor *t = loom_st_find(st, name);
    CHECKF(t != NULL, "%s: no tensor %s", DIR, name);
    return t ? t->data : NULL;
}

static int load(fixture *f) {
    memset(f, 0, sizeof *f);
    if (loom_st_open(DIR "/embeddings.safetensors", &f->emb) ||
        loom_st_open(DIR "/reference.safetensors", &f->ref) || loom_model_load(DIR, NULL, &f->m)) {
        fprintf(stderr, "%s: %s\n", DIR, loom_last_error());
        return 0;
    }
    f->H = loom_model_hidden_size(f->m);
    for (int i = 0; i < NP; i++) {
        f->ids[i] = tensor(f->emb, "prompt.%d.ids", i);
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        f->len[i] = (int)loom_st_find(f->emb, name)->shape[0];
        f->hidden[i] = tensor(f->emb, "prompt.%d.hidden", i);
        f->last[i] = tensor(f->emb, "prompt.%d.last_norm", i);
        f->mean[i] = tensor(f->emb, "prompt.%d.mean_norm", i);
    }
    return f->ids[NP - 1] && f->mean[NP - 1];
}

static void unload(fixture *f) {
    loom_model_free(f->m);
    loom_st_close(f->emb);
    loom_st_close(f->ref);
}

static loom_request *submit(loom_engine *e, const int32_t *ids, int n, loom_pooling pool, int norm) {
    loom_request_params rp = loom_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.pooling = pool;
    rp.normalize = norm;
    loom_request *r = NULL;
    loom_status s = loom_engine_submit(e, &rp, &r);
    CHECKF(s == LOOM_OK, "submit %d tokens: %s", n, loom_last_error());
    return r;
}

/* Waits for r's vector into out ([H]); returns the prompt tokens the
 * prefix cache served (-1 when it failed). */
static int wait_vec(loom_request *r, float *out, int H) {
    loom_event ev;
    int got = r ? loom_request_next(r, &ev, 60000) == LOOM_OK : 0;
    CHECKF(got && ev.finish == LOOM_FINISH_STOP && ev.n_generated == 0, "finish %d: %s",
           got ? (int)ev.finish : -1, r ? loom_request_error(r) : "no request");
    int dim = r ? loom_request_embedding(r, out, H) : 0;
    CHECK_EQ_INT(dim, H);
    loom_request_free(r);
    return got && dim == H ? ev.n_cached : -1;
}

/* Every request the checks make: per prompt, the last-token vector of each
 * prefix unnormalised (= last_hidden_state at that position), and of the
 * whole prompt: last and mean normalised, first unnormalised. */
typedef struct vecs {
    float *prefix[NP];            /* [len, H] */
    float *last[NP], *mean[NP], *cls[NP];
    int cached[NP];               /* the whole prompt's last-token request */
} vecs;

static void vecs_alloc(vecs *v, const fixture *f) {
    for (int i = 0; i < NP; i++) {
        v->prefix[i] = calloc((size_t)f->len[i] * f->H, sizeof(float));
        v->last[i] = calloc((size_t)f->H, sizeof(float));
        v->mean[i] = calloc((size_t)f->H, sizeof(float));
        v->cls[i] = calloc((size_t)f->H, sizeof(float));
    }
}

static void vecs_free(vecs *v) {
    for (int i = 0; i < NP; i++) {
        free(v->prefix[i]);
        free(v->last[i]);
        free(v->mean[i]);
        free(v->cls[i]);
    }
}

#define PER_PROMPT(f, i) ((f)->len[i] + 3)

/* Request k of prompt i: prefixes 1..len, then last, mean, first. */
static loom_request *submit_k(loom_engine *e, const fixture *f, int i, int k) {
    int L = f->len[i];
    if (k < L) return submit(e, f->ids[i], k + 1, LOOM_POOLING_LAST, 0);
    static const loom_pooling pools[] = {LOOM_POOLING_LAST, LOOM_POOLING_MEAN, LOOM_POOLING_CLS};
    return submit(e, f->ids[i], L, pools[k - L], k - L < 2);
}

static int wait_k(loom_request *r, const fixture *f, vecs *v, int i, int k) {
    int L = f->len[i], H = f->H;
    float *dst = k < L ? v->prefix[i] + (size_t)k * H : k == L ? v->last[i] : k == L + 1 ? v->mean[i] : v->cls[i];
    int cached = wait_vec(r, dst, H);
    if (k == L) v->cached[i] = cached;
    return cached;
}

/* One at a time: each request alone in its steps. */
static void run_solo(loom_engine *e, const fixture *f, vecs *v) {
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < PER_PROMPT(f, i); k++) wait_k(submit_k(e, f, i, k), f, v, i, k);
}

/* Everything at once, with a greedy generation of the longest reference
 * prompt among them; checks its tokens against the reference. */
static void run_batched(loom_engine *e, const fixture *f, vecs *v) {
    int total = 0;
    for (int i = 0; i < NP; i++) total += PER_PROMPT(f, i);
    loom_request **rs = calloc((size_t)total, sizeof *rs);
    const loom_st_tensor *gi = loom_st_find(f->ref, "prompt.2.ids");
    const int32_t *greedy = tensor(f->ref, "prompt.%d.greedy", 2);
    loom_request_params gp = loom_request_default_params();
    gp.prompt = gi->data;
    gp.n_prompt = (int)gi->shape[0];
    gp.max_tokens = 20;
    gp.ignore_eos = 1;
    gp.sampling.temperature = 0;
    loom_request *g = NULL;
    CHECK(loom_engine_submit(e, &gp, &g) == LOOM_OK);
    for (int i = 0, n = 0; i < NP; i++)
        for (int k = 0; k < PER_PROMPT(f, i); k++) rs[n++] = submit_k(e, f, i, k);
    for (int i = 0, n = 0; i < NP; i++)
        for (int k = 0; k < PER_PROMPT(f, i); k++) wait_k(rs[n++], f, v, i, k);
    int32_t toks[21];
    int nt = 0;
    for (loom_event ev; g && loom_request_next(g, &ev, 60000) == LOOM_OK && !ev.finish;) toks[nt++] = ev.token;
    CHECK_EQ_INT(nt, 20);
    CHECKF(nt == 20 && !memcmp(toks, greedy, sizeof toks[0] * 20), "greedy tokens beside embeddings differ");
    loom_request_free(g);
    free(rs);
}

static double rel_err(const float *a, const float *ref, size_t n) { return test_rel_err(a, ref, n); }

static double norm(const float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)v[i] * v[i];
    return sqrt(s);
}

static void check_reference(const fixture *f, const vecs *v, const char *what) {
    int H = f->H;
    double worst_h = 0, worst_last = 0, worst_mean = 0;
    for (int i = 0; i < NP; i++) {
        size_t n = (size_t)f->len[i] * H;
        double eh = rel_err(v->prefix[i], f->hidden[i], n);
        double el = rel_err(v->last[i], f->last[i], (size_t)H);
        double em = rel_err(v->mean[i], f->mean[i], (size_t)H);
        double ec = rel_err(v->cls[i], f->hidden[i], (size_t)H);
        CHECKF(eh < TOL, "%s prompt %d: hidden states off by %g of max |h|", what, i, eh);
        CHECKF(el < TOL, "%s prompt %d: last-token vector off by %g", what, i, el);
        CHECKF(em < TOL, "%s prompt %d: mean vector off by %g", what, i, em);
        CHECKF(ec < TOL, "%s prompt %d: first-token vector off by %g", what, i, ec);
        CHECKF(fabs(norm(v->last[i], H) - 1) < 1e-6 && fabs(norm(v->mean[i], H) - 1) < 1e-6,
               "%s prompt %d: normalised vectors have norms %g and %g", what, i, norm(v->last[i], H),
               norm(v->mean[i], H));
        worst_h = test_max(worst_h, eh);
        worst_last = test_max(worst_last, el);
        worst_mean = test_max(worst_mean, em);
    }
    fprintf(stderr, "%s: hidden %.2g, last %.2g, mean %.2g (max error over max |ref|)\n", what, worst_h,
            worst_last, worst_mean);
}

/* a and b hold the same bits. */
static void check_same(const fixture *f, const vecs *a, const vecs *b, const char *what) {
    int H = f->H, diff = 0;
    for (int i = 0; i < NP; i++) {
        diff += memcmp(a->prefix[i], b->prefix[i], sizeof(float) * (size_t)f->len[i] * H) != 0;
        diff += memcmp(a->last[i], b->last[i], sizeof(float) * (size_t)H) != 0;
        diff += memcmp(a->mean[i], b->mean[i], sizeof(float) * (size_t)H) != 0;
        diff += memcmp(a->cls[i], b->cls[i], sizeof(float) * (size_t)H) != 0;
    }
    CHECKF(diff == 0, "%s: %d vectors differ", what, diff);
}

static loom_engine *engine(const fixture *f, int budget, int cache, int block) {
    loom_engine_params ep = loom_engine_default_params();
    ep.max_batch_tokens = budget;
    ep.max_seqs = 16;
    ep.block_size = block;
    ep.n_ctx = 128;
    ep.prefix_cache = cache;
    loom_engine *e = NULL;
    CHECKF(loom_engine_create(f->m, &ep, &e) == LOOM_OK, "%s", loom_last_error());
    return e;
}

static void check_idle(loom_engine *e) {
    loom_engine_stats st;
    for (int i = 0; i < 2000; i++) {
        loom_engine_get_stats(e, &st);
        if (st.running == 0 && st.waiting == 0 && st.kv_blocks_free == st.kv_blocks_total) break;
        usleep(1000);
    }
    CHECKF(st.running == 0 && st.waiting == 0 && st.kv_blocks_free == st.kv_blocks_total,
           "engine not idle: %d running, %d waiting, %d of %d blocks free", st.running, st.waiting,
           st.kv_blocks_free, st.kv_blocks_total);
}

static void reference_and_batching(void) {
    fixture f;
    if (!load(&f)) {
        CHECK(0);
        unload(&f);
        return;
    }
    CHECK_EQ_INT(loom_model_pooling(f.m), LOOM_POOLING_LAST);
    vecs solo, batched, cached;
    vecs_alloc(&solo, &f);
    vecs_alloc(&batched, &f);
    vecs_alloc(&cached, &f);

    loom_engine *e = engine(&f, 2048, 0, 16);
    if (e) run_solo(e, &f, &solo);
    check_idle(e);
    loom_engine_free(e);
    check_reference(&f, &solo, "solo");

    /* a small budget: prompts go in pieces, many rows a step */
    e = engine(&f, 24, 0, 16);
    if (e) run_batched(e, &f, &batched);
    check_idle(e);
    loom_engine_free(e);
    check_reference(&f, &batched, "batched");
    check_same(&f, &solo, &batched, "batched against solo");

    /* the prefix cache on, blocks of 4: each prefix finds the shorter ones'
     * blocks; solo first (every prefix request hits), then batched */
    e = engine(&f, 2048, 1, 4);
    if (e) run_solo(e, &f, &cached);
    for (int i = 1; i < NP; i++)
        CHECKF(cached.cached[i] > 0, "prompt %d: the prefix cache served %d tokens", i, cached.cached[i]);
    check_same(&f, &solo, &cached, "cache hits against misses");
    if (e) run_batched(e, &f, &cached);
    check_same(&f, &solo, &cached, "batched cache hits against misses");
    check_idle(e);
    loom_engine_free(e);

    vecs_free(&solo);
    vecs_free(&batched);
    vecs_free(&cached);
    unload(&f);
}

/* A prompt may fill the whole context (no token is generated); one token
 * more is refused, naming both numbers; bad parameters are refused. */
static void limits(void) {
    fixture f;
    if (!load(&f)) {
        CHECK(0);
        unload(&f);
        return;
    }
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = f.len[2];
    ep.prefix_cache = 0;
    loom_engine *e = NULL;
    CHECK(loom_engine_create(f.m, &ep, &e) == LOOM_OK);
    float *v = calloc((size_t)f.H, sizeof(float));
    if (e) {
        wait_vec(submit(e, f.ids[2], f.len[2], LOOM_POOLING_LAST, 1), v, f.H);
        CHECKF(rel_err(v, f.last[2], (size_t)f.H) < TOL, "a prompt filling the context: off by %g",
               rel_err(v, f.last[2], (size_t)f.H));
        loom_request_params rp = loom_request_default_params();
        rp.prompt = f.ids[3];
        rp.n_prompt = f.len[2] + 1;
        rp.pooling = LOOM_POOLING_MEAN;
        loom_request *r = NULL;
        char want[128];
        snprintf(want, sizeof want, "the input has %d tokens; the context holds %d", f.len[2] + 1, f.len[2]);
        CHECK(loom_engine_submit(e, &rp, &r) == LOOM_ERR_RANGE && r == NULL);
        CHECKF(strstr(loom_last_error(), want) != NULL, "error \"%s\"", loom_last_error());
        rp.n_prompt = 3;
        rp.pooling = (loom_pooling)7;
        CHECK(loom_engine_submit(e, &rp, &r) == LOOM_ERR_INVALID_ARG);
        rp.pooling = LOOM_POOLING_LAST;
        rp.prompt_logprobs = 2;
        CHECK(loom_engine_submit(e, &rp, &r) == LOOM_ERR_INVALID_ARG);
        /* a generation request has no vector */
        rp.pooling = LOOM_POOLING_NONE;
        rp.prompt_logprobs = -1;
        rp.max_tokens = 2;
        CHECK(loom_engine_submit(e, &rp, &r) == LOOM_OK);
        for (loom_event ev; r && loom_request_next(r, &ev, 60000) == LOOM_OK && !ev.finish;) {}
        CHECK_EQ_INT(r ? loom_request_embedding(r, v, f.H) : -1, 0);
        loom_request_free(r);
    }
    check_idle(e);
    loom_engine_free(e);
    free(v);
    unload(&f);
}

/* A sentence-transformers directory: modules.json names the Pooling
 * module, whose config.json says which mode. */
static void pooling_config(void) {
    char dir[] = "/tmp/loom-test-pooling-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], src[512];
    static const char *links[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, links[i]);
        snprintf(src, sizeof src, "%s/%s/%s", getcwd((char[256]){0}, 256), DIR, links[i]);
        CHECK(symlink(src, path) == 0);
    }
    snprintf(path, sizeof path, "%s/modules.json", dir);
    FILE *fp = fopen(path, "w");
    fputs("[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
          "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
          "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}]",
          fp);
    fclose(fp);
    snprintf(path, sizeof path, "%s/1_Pooling", dir);
    CHECK(mkdir(path, 0700) == 0);
    static const struct { const char *json; loom_pooling want; } cases[] = {
        {"{\"word_embedding_dimension\":64,\"pooling_mode_cls_token\":false,"
         "\"pooling_mode_mean_tokens\":true,\"pooling_mode_lasttoken\":false}", LOOM_POOLING_MEAN},
        {"{\"pooling_mode_cls_token\":true}", LOOM_POOLING_CLS},
        {"{\"pooling_mode_lasttoken\":true,\"pooling_mode_mean_tokens\":false}", LOOM_POOLING_LAST},
        /* a mode loom does not pool by: the default, with a warning */
        {"{\"pooling_mode_max_tokens\":true}", LOOM_POOLING_LAST},
    };
    snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++) {
        fp = fopen(path, "w");
        fputs(cases[i].json, fp);
        fclose(fp);
        loom_model_params mp = loom_model_default_params();
        mp.no_copy = 1;
        loom_model *m = NULL;
        CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s", loom_last_error());
        CHECKF(m && loom_model_pooling(m) == cases[i].want, "%s: pooling %d, want %d", cases[i].json,
               m ? (int)loom_model_pooling(m) : -1, (int)cases[i].want);
        loom_model_free(m);
    }
    /* a broken file is an error, as a broken config.json is */
    fp = fopen(path, "w");
    fputs("{\"pooling_mode_", fp);
    fclose(fp);
    loom_model *m = NULL;
    CHECK(loom_model_load(dir, NULL, &m) == LOOM_ERR_FORMAT && m == NULL);
    CHECKF(strstr(loom_last_error(), "1_Pooling/config.json") != NULL, "error \"%s\"", loom_last_error());
    unlink(path);
    snprintf(path, sizeof path, "%s/1_Pooling", dir);
    rmdir(path);
    const char *files[] = {"config.json", "model.safetensors", "modules.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* The forward itself: a row asking for logits and hidden states gets the
 * reference hidden states and the same logits as a row asking for logits
 * alone, beside another sequence's row. */
static void forward_rows(void) {
    fixture f;
    if (!load(&f)) {
        CHECK(0);
        unload(&f);
        return;
    }
    loom_model *m = f.m;
    int V = loom_model_vocab_size(m), H = f.H, L = f.len[3];
    loom_kv_pool *kv = NULL;
    loom_fwd_state *fs = NULL;
    CHECK(loom_kv_pool_create(m->cfg.n_layers, loom_model_kv_dim(m), 16, 32, LOOM_KV_F32, &kv) == LOOM_OK);
    CHECK(loom_fwd_state_create(m, 256, 256, &fs) == LOOM_OK);
    loom_kv_seq seq[3] = {{0}};
    for (int i = 0; i < 3 && kv; i++) CHECK(loom_kv_seq_reserve(kv, &seq[i], L) == LOOM_OK);
    float *lg[2] = {malloc(sizeof(float) * (size_t)L * V), malloc(sizeof(float) * (size_t)L * V)};
    float *hid = malloc(sizeof(float) * (size_t)L * H), *other = malloc(sizeof(float) * (size_t)f.len[2] * H);
    loom_fwd_row rows[2] = {
        {.tokens = f.ids[3], .n = L, .seq = &seq[0], .logits = LOOM_LOGITS_ALL, .out = lg[0], .hidden = hid},
        {.tokens = f.ids[2], .n = f.len[2], .seq = &seq[1], .hidden = other},
    };
    loom_fwd_row alone = {.tokens = f.ids[3], .n = L, .seq = &seq[2], .logits = LOOM_LOGITS_ALL, .out = lg[1]};
    if (kv && fs) {
        CHECKF(loom_forward(m, fs, &kv->lay, rows, 2) == LOOM_OK, "%s", loom_last_error());
        CHECKF(loom_forward(m, fs, &kv->lay, &alone, 1) == LOOM_OK, "%s", loom_last_error());
        double eh = test_rel_err(hid, f.hidden[3], (size_t)L * H);
        double eo = test_rel_err(other, f.hidden[2], (size_t)f.len[2] * H);
        CHECKF(eh < TOL && eo < TOL, "forward hidden states off by %g and %g", eh, eo);
        CHECKF(!memcmp(lg[0], lg[1], sizeof(float) * (size_t)L * V), "logits beside hidden states differ");
    }
    for (int i = 0; i < 3 && kv; i++) loom_kv_seq_release(kv, &seq[i]);
    free(lg[0]);
    free(lg[1]);
    free(hid);
    free(other);
    loom_fwd_state_free(fs);
    loom_kv_pool_free(kv);
    unload(&f);
}

int main(void) {
    forward_rows();
    reference_and_batching();
    limits();
    pooling_config();
    return test_report("test_embed");
}
