/* loom tokenize / detokenize / chat-template against every fixture row
 * (through the binary at $LOOM_BUILD/loom), and logits/generate --prompt. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "test.h"

static char loom[256], fixdir[256];
static char tmpdir[] = "/tmp/loom-test-clitok-XXXXXX";

/* Runs argv (no shell), capturing stdout; returns the exit status. */
static int run_argv(char *const argv[], char **out, size_t *len) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        close(pipefd[1]);
        if (!freopen("/dev/null", "w", stderr)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = read(pipefd[0], buf + n, cap - n - 1)) > 0) {
        n += (size_t)r;
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    close(pipefd[0]);
    buf[n] = 0;
    int st = 0;
    waitpid(pid, &st, 0);
    *out = buf;
    if (len) *len = n;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *ids_json(const cJSON *ids) {
    size_t cap = 16 + (size_t)cJSON_GetArraySize(ids) * 12, w = 0;
    char *s = malloc(cap);
    w += (size_t)snprintf(s, cap, "[");
    int i = 0;
    for (const cJSON *e = ids->child; e; e = e->next, i++)
        w += (size_t)snprintf(s + w, cap - w, "%s%d", i ? ", " : "", e->valueint);
    snprintf(s + w, cap - w, "]\n");
    return s;
}

static void check_tokenizer(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", fixdir, name);
    /* encodings: a sample of rows through the binary (test_tokenizer checks
     * every row through the library), decode through detokenize */
    snprintf(path, sizeof path, "%s/encodings.json", dir);
    char *text = NULL;
    CHECK(loom_read_file(path, &text, NULL) == LOOM_OK);
    cJSON *enc = cJSON_Parse(text);
    free(text);
    const cJSON *rows = cJSON_GetObjectItem(enc, "rows");
    int k = 0, ok = 0, total = 0;
    for (const cJSON *r = rows ? rows->child : NULL; r; r = r->next, k++) {
        if (k % 16) continue;
        const char *s = cJSON_GetObjectItem(r, "text")->valuestring;
        char *want = ids_json(cJSON_GetObjectItem(r, "ids"));
        char *got = NULL;
        char *argv[] = {loom, "tokenize", "--tokenizer", dir, "--text", (char *)s, NULL};
        int rc = run_argv(argv, &got, NULL);
        total++;
        ok += rc == 0 && !strcmp(got, want);
        free(got);
        free(want);
    }
    CHECKF(ok == total, "%s: tokenize %d/%d rows", name, ok, total);
    /* detokenize of one row */
    const cJSON *r0 = cJSON_GetArrayItem(rows, 7);
    if (r0) {
        char *ids = ids_json(cJSON_GetObjectItem(r0, "ids"));
        ids[strlen(ids) - 2] = 0; /* drop "]\n" */
        for (char *p = ids; *p; p++)
            if (*p == ' ') memmove(p, p + 1, strlen(p));
        char *got = NULL;
        size_t len = 0;
        char *argv[] = {loom, "detokenize", "--tokenizer", dir, "--ids", ids + 1, NULL};
        int rc = run_argv(argv, &got, &len);
        const char *want = cJSON_GetObjectItem(r0, "decoded")->valuestring;
        CHECKF(rc == 0 && len == strlen(want) && !memcmp(got, want, len), "%s: detokenize", name);
        free(got);
        free(ids);
    }
    cJSON_Delete(enc);
    /* chat.json: every row rendered exactly, or refused where the reference raises */
    snprintf(path, sizeof path, "%s/chat.json", dir);
    CHECK(loom_read_file(path, &text, NULL) == LOOM_OK);
    cJSON *chat = cJSON_Parse(text);
    free(text);
    rows = cJSON_GetObjectItem(chat, "rows");
    ok = total = 0;
    for (const cJSON *r = rows ? rows->child : NULL; r; r = r->next) {
        char conv[600];
        snprintf(conv, sizeof conv, "%s/conv.json", tmpdir);
        char *c = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "conversation"));
        FILE *f = fopen(conv, "w");
        fputs(c, f);
        fclose(f);
        free(c);
        char *got = NULL;
        size_t len = 0;
        char *argv[] = {loom, "chat-template", "--tokenizer", dir, "--conversation-file", conv, NULL};
        int rc = run_argv(argv, &got, &len);
        const cJSON *want = cJSON_GetObjectItem(r, "rendered");
        total++;
        if (cJSON_GetObjectItem(r, "error")) ok += rc != 0;
        else ok += rc == 0 && cJSON_IsString(want) && len == strlen(want->valuestring) &&
                   !memcmp(got, want->valuestring, len);
        free(got);
    }
    CHECKF(ok == total, "%s: chat-template %d/%d rows", name, ok, total);
    cJSON_Delete(chat);
}

int main(void) {
    const char *b = getenv("LOOM_BUILD");
    snprintf(loom, sizeof loom, "%s/loom", b ? b : "build");
    snprintf(fixdir, sizeof fixdir, "%s/fixtures/tokenizers", b ? b : "build");
    if (access(loom, X_OK) != 0 || !mkdtemp(tmpdir)) return 1;
    static const char *names[] = {"qwen3", "llama3_1", "llama2", "gemma3", "deepseek_v3", "gptoss"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(names); i++) check_tokenizer(names[i]);
    /* logits --prompt writes the prompt's ids beside the logits */
    char out[600], *got = NULL;
    snprintf(out, sizeof out, "%s/l.safetensors", tmpdir);
    char *argv[] = {loom, "logits", "--model", "models/pycoder-16m", "--prompt", "def f(x):", "--out", out, NULL};
    CHECK(run_argv(argv, &got, NULL) == 0);
    free(got);
    loom_safetensors *st = NULL;
    CHECK(loom_st_open(out, &st) == LOOM_OK);
    if (st) {
        const loom_st_tensor *ids = loom_st_find(st, "ids"), *lg = loom_st_find(st, "logits");
        CHECK(ids && lg && lg->shape[0] == ids->shape[0] && lg->shape[1] == 8192);
        loom_st_close(st);
    }
    char *gen[] = {loom, "generate", "--model", "models/pycoder-16m", "--prompt", "hello", "--chat",
                   "--max-tokens", "4", "--temperature", "0", "--ids", NULL};
    CHECK(run_argv(gen, &got, NULL) == 0 && strchr(got, '['));
    free(got);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_report("test_cli_tokenize");
}
