/* The CLI end to end: `loom logits` and `loom generate` against the
 * reference fixtures (with --image on every vision family), --help on every command, and error exits. Runs the
 * binary at $LOOM_BUILD/loom. */
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "test.h"

static char loom[256];
static char tmpdir[] = "/tmp/loom-test-cli-XXXXXX";

/* Runs a shell command, captures stdout (and stderr when merge), returns the
 * exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *ids_csv(const loom_st_tensor *t) {
    int n = (int)t->shape[0];
    char *s = malloc((size_t)n * 12 + 1);
    size_t w = 0;
    for (int i = 0; i < n; i++)
        w += (size_t)sprintf(s + w, "%s%d", i ? "," : "", ((const int32_t *)t->data)[i]);
    return s;
}

static void check_fixture(const char *dir) {
    char path[512], cmd[8192], out[65536];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    CHECK(loom_st_open(path, &ref) == LOOM_OK);
    if (!ref) return;
    for (int i = 1; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *ids = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.logits", i);
        const loom_st_tensor *lg = loom_st_find(ref, name);
        snprintf(name, sizeof name, "prompt.%d.greedy", i);
        const loom_st_tensor *gr = loom_st_find(ref, name);
        char *csv = ids_csv(ids);
        /* logits */
        snprintf(path, sizeof path, "%s/logits.safetensors", tmpdir);
        snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens %s --out %s", loom, dir, csv, path);
        CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
        loom_safetensors *got = NULL;
        CHECK(loom_st_open(path, &got) == LOOM_OK);
        const loom_st_tensor *t = got ? loom_st_find(got, "logits") : NULL;
        CHECK(t && t->dtype == LOOM_DT_F32 && t->ndim == 2 && t->shape[0] == ids->shape[0] &&
              t->shape[1] == lg->shape[1]);
        if (t && t->nbytes == lg->nbytes) {
            double e = test_rel_err(t->data, lg->data, t->nbytes / 4);
            CHECKF(e <= 1e-5, "%s prompt %d: logits rel err %g", dir, i, e);
        }
        loom_st_close(got);
        /* greedy ids: the JSON array on the last line */
        snprintf(cmd, sizeof cmd,
                 "%s generate --model %s --tokens %s --max-tokens %d --temperature 0 --ids "
                 "--ignore-eos 2>/dev/null | tail -n 1",
                 loom, dir, csv, (int)gr->shape[0]);
        CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
        char want[4096] = "[";
        size_t w = 1;
        for (int k = 0; k < gr->shape[0]; k++)
            w += (size_t)snprintf(want + w, sizeof want - w, "%s%d", k ? ", " : "",
                                  ((const int32_t *)gr->data)[k]);
        snprintf(want + w, sizeof want - w, "]\n");
        CHECKF(!strcmp(out, want), "%s prompt %d: got %s want %s", dir, i, out, want);
        free(csv);
    }
    loom_st_close(ref);
}

static void check_errors(void) {
    char cmd[1024], out[8192];
    const char *model = "tests/fixtures/models/qwen3-tiny";
    static const char *cmds[] = {"logits", "generate", "serve", "chat", "batch", "perplexity",
                                 "info", "convert", "bench"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cmds); i++) {
        snprintf(cmd, sizeof cmd, "%s %s --help", loom, cmds[i]);
        CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
        CHECK(strstr(out, "usage: loom") != NULL);
        snprintf(cmd, sizeof cmd, "%s %s --bogus 2>&1", loom, cmds[i]);
        CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
        CHECK(strstr(out, "unknown option \"--bogus\"") != NULL);
    }
    snprintf(cmd, sizeof cmd, "%s --help", loom);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s frobnicate 2>&1", loom);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s generate --model /nonexistent --tokens 1 2>&1", loom);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "/nonexistent") != NULL);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1,x,3 2>&1", loom, model);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
    CHECK(strstr(out, "expected comma-separated token ids") != NULL);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1,99999 2>&1", loom, model);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "token id 99999") != NULL && strstr(out, "out of range") != NULL);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1 --max-tokens -3 2>&1", loom, model);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens 1 2>&1", loom, model);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
    CHECK(strstr(out, "required") != NULL);
    /* sampling runs and is reproducible under a seed */
    char a[4096], b[4096];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1,2 --max-tokens 12 --temperature 1 "
             "--seed 7 --ids 2>/dev/null | tail -n 1", loom, model);
    CHECK_EQ_INT(run(cmd, a, sizeof a), 0);
    CHECK_EQ_INT(run(cmd, b, sizeof b), 0);
    CHECK(!strcmp(a, b) && a[0] == '[');
    /* --repeat-penalty: the window holds the prompt and every generated
     * token, so a prohibitive penalty makes each greedy token new (the
     * unpenalised run repeats itself on this model) */
    int seen_rep[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1,2,3 --max-tokens 24 "
                 "--temperature 0 %s --ids 2>/dev/null | tail -n 1", loom, model,
                 k ? "--repeat-penalty 100" : "");
        CHECK_EQ_INT(run(cmd, a, sizeof a), 0);
        int ids[64], n = 0;
        for (char *q = a; *q && n < 64; q++)
            if (*q >= '0' && *q <= '9') ids[n++] = (int)strtol(q, &q, 10);
        CHECKF(n == 24, "generate --ids gave %d ids: %s", n, a);
        for (int i = 0; i < n; i++) {
            seen_rep[k] |= ids[i] >= 1 && ids[i] <= 3;
            for (int j = 0; j < i; j++) seen_rep[k] |= ids[i] == ids[j];
        }
    }
    CHECKF(seen_rep[0] && !seen_rep[1], "repeats without / with --repeat-penalty 100: %d / %d",
           seen_rep[0], seen_rep[1]);
    /* --kv-config: a file naming every layer 8-bit equals --kv-type q8; a
     * bad one exits 1 naming the file and the problem */
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/kv8.json", tmpdir);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("[{\"layer_idx\": 0, \"bits\": 8}, {\"layer_idx\": 1, \"bits\": 8}, "
              "{\"layer_idx\": 2, \"bits\": 8}]", f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1,2,3 --max-tokens 8 --temperature 0 "
             "--kv-config %s --ids 2>/dev/null | tail -n 1", loom, model, cfg);
    CHECK_EQ_INT(run(cmd, a, sizeof a), 0);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1,2,3 --max-tokens 8 --temperature 0 "
             "--kv-type q8 --ids 2>/dev/null | tail -n 1", loom, model);
    CHECK_EQ_INT(run(cmd, b, sizeof b), 0);
    CHECKF(!strcmp(a, b) && a[0] == '[', "--kv-config all-8 gave %s, --kv-type q8 %s", a, b);
    f = fopen(cfg, "w");
    if (f) {
        fputs("[{\"layer_idx\": 7, \"bits\": 8}]", f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1 --kv-config %s 2>&1", loom, model, cfg);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 1);
    CHECK(strstr(out, cfg) && strstr(out, "layer_idx 7 is out of range (the model has 3 layers: 0..2)"));
}

/* generate's sampling defaults come from generation_config.json where no
 * flag gives them: a copy of pycoder-16m whose file says temperature 0
 * generates greedily, unless --temperature says otherwise; loom info
 * shows the file's defaults. */
static void check_gen_defaults(void) {
    const char *model = "tests/fixtures/trained/pycoder-16m";
    char dir[512], path[1024], from[4096], cwd[2048], cmd[2048], out[16384];
    snprintf(dir, sizeof dir, "%s/gen", tmpdir);
    mkdir(dir, 0700);
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s/%s", cwd, model, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECK(symlink(from, path) == 0);
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{\"temperature\": 0.0, \"top_k\": 3}", f);
        fclose(f);
    }
    char want[4096], got[4096];
    const char *gen = "--tokens 1,2 --max-tokens 16 --seed 7 --ids 2>/dev/null | tail -n 1";
    snprintf(cmd, sizeof cmd, "%s generate --model %s --temperature 0 %s", loom, model, gen);
    CHECK_EQ_INT(run(cmd, want, sizeof want), 0);
    snprintf(cmd, sizeof cmd, "%s generate --model %s %s", loom, dir, gen);
    CHECK_EQ_INT(run(cmd, got, sizeof got), 0);
    CHECKF(!strcmp(got, want), "generation_config temperature 0 gave %s, greedy is %s", got, want);
    /* the flags win, field by field */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --temperature 1 --top-k 3 %s", loom, model, gen);
    CHECK_EQ_INT(run(cmd, want, sizeof want), 0);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --temperature 1 %s", loom, dir, gen);
    CHECK_EQ_INT(run(cmd, got, sizeof got), 0);
    CHECKF(!strcmp(got, want) && got[0] == '[', "--temperature 1 over the file gave %s, want %s",
           got, want);
    snprintf(cmd, sizeof cmd, "%s info --model %s", loom, dir);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    CHECKF(strstr(out, "sampling        temperature 0, top_k 3 (generation_config.json)"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens 1 --top-p 0 2>&1", loom, model);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 2);
    CHECKF(strstr(out, "--top-p: expected a number in (0, 1], found \"0\""), "%s", out);
}

/* loom bench validates before it times: batched vs one-row logits, and
 * the engine's greedy tokens at batch 1 and 3 against the context's. */
static void check_bench(void) {
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "%s bench --model tests/fixtures/models/qwen3-tiny -p 8 -n 8 "
             "--batch 1,3 --tg-prompt 4 --reps 1 --json 2>&1", loom);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    CHECKF(strstr(out, "batch 3: 3 of 3 rows' first 8 greedy tokens equal the context's") &&
           strstr(out, "\"greedy_match\": 3}") && strstr(out, "\"tg_tok_s\": "),
           "loom bench: %s", out);
    /* --image: bench_vision's run through the CLI, for each model; a text model refuses */
    const char *g = "tests/fixtures/models/gemma3-vl-tiny";
    snprintf(cmd, sizeof cmd, "%s bench --model %s --model tests/fixtures/models/qwen3-vl-tiny --image "
             "%s/images/D_300x200_rgb.png --reps 1 --threads 2 --json 2>&1", loom, g, g);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    CHECKF(strstr(out, "{\"model\":\"tests/fixtures/models/gemma3-vl-tiny\"") &&
           strstr(out, "\"grid\":[1,1,1],\"tokens\":16,") && strstr(out, "\"grid\":[1,6,8],\"tokens\":12,") &&
           strstr(out, "\"ttft_s\":") && strstr(out, "\"matmul_peer_gflops\":"), "loom bench --image: %s", out);
    snprintf(cmd, sizeof cmd, "%s bench --model tests/fixtures/models/qwen3-tiny --image "
             "%s/images/D_300x200_rgb.png --reps 1 2>&1", loom, g);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "qwen3-tiny has no vision tower"));
}

/* loom logits / generate --image on each vision family's two-image case
 * (images C then D from their files): logits within tol of the fixture's,
 * its 8 greedy tokens. */
static void check_vision_fixture(const char *dir, double tol) {
    char path[512], cmd[8192], out[65536];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    loom_safetensors *ref = NULL;
    CHECK(loom_st_open(path, &ref) == LOOM_OK);
    if (!ref) return;
    const loom_st_tensor *ids = loom_st_find(ref, "case.3.input_ids");
    const loom_st_tensor *lg = loom_st_find(ref, "case.3.logits");
    const loom_st_tensor *gr = loom_st_find(ref, "case.3.greedy");
    CHECK(ids && lg && gr);
    if (!ids || !lg || !gr) {
        loom_st_close(ref);
        return;
    }
    char csv[4096], imgs[1200];
    size_t w = 0;
    for (int i = 0; i < ids->shape[0]; i++)
        w += (size_t)snprintf(csv + w, sizeof csv - w, "%s%d", i ? "," : "",
                              (int)((const int64_t *)ids->data)[i]);
    snprintf(imgs, sizeof imgs, "--image %s/images/C_32x32_rgba.png --image "
             "%s/images/D_300x200_rgb.png", dir, dir);
    snprintf(path, sizeof path, "%s/vlogits.safetensors", tmpdir);
    snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens %s %s --out %s 2>&1", loom, dir, csv,
             imgs, path);
    CHECKF(run(cmd, out, sizeof out) == 0, "%s: %s", dir, out);
    loom_safetensors *got = NULL;
    CHECK(loom_st_open(path, &got) == LOOM_OK);
    const loom_st_tensor *t = got ? loom_st_find(got, "logits") : NULL;
    CHECK(t && t->nbytes == lg->nbytes);
    if (t && t->nbytes == lg->nbytes) {
        double e = test_rel_err(t->data, lg->data, t->nbytes / 4);
        printf("  %s --image logits: %.2e\n", dir, e);
        CHECKF(e <= tol, "%s with images: logits rel err %g (tolerance %g)", dir, e, tol);
    }
    loom_st_close(got);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokens %s %s --max-tokens 8 "
             "--temperature 0 --ids --ignore-eos 2>/dev/null | tail -n 1", loom, dir, csv, imgs);
    CHECK_EQ_INT(run(cmd, out, sizeof out), 0);
    char want[256] = "[";
    w = 1;
    for (int k = 0; k < gr->shape[0]; k++)
        w += (size_t)snprintf(want + w, sizeof want - w, "%s%d", k ? ", " : "",
                              (int)((const int64_t *)gr->data)[k]);
    snprintf(want + w, sizeof want - w, "]\n");
    CHECKF(!strcmp(out, want), "%s with images: got %s want %s", dir, out, want);
    loom_st_close(ref);
}

int main(void) {
    const char *b = getenv("LOOM_BUILD");
    snprintf(loom, sizeof loom, "%s/loom", b ? b : "build");
    if (access(loom, X_OK) != 0) {
        fprintf(stderr, "%s not built\n", loom);
        return 1;
    }
    if (!mkdtemp(tmpdir)) return 1;
    check_fixture("tests/fixtures/models/llama3-tiny");
    check_fixture("tests/fixtures/models/qwen2-tiny");
    check_fixture("tests/fixtures/models/qwen3-tiny");
    check_vision_fixture("tests/fixtures/models/qwen3-vl-tiny", 1e-5);
    /* the reference computes the delta rule in float32 (test_vision) */
    check_vision_fixture("tests/fixtures/models/qwen3.5-vl-tiny-hybrid", 2e-5);
    check_vision_fixture("tests/fixtures/models/qwen2.5-vl-tiny", 1e-5);
    check_vision_fixture("tests/fixtures/models/gemma3-vl-tiny", 1e-5);
    check_errors();
    check_gen_defaults();
    check_bench();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_report("test_cli");
}
