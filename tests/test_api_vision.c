/* Images on the server without HTTP: the image markers of a rendered
 * prompt expanded as each family's processor does (loom_imgprompt_expand),
 * and the Gemma 3 fixture made servable (a tokenizer whose tokens are the
 * fixture's ids, Gemma 3's own chat template) answering a chat with two
 * image_url parts with the fixture's prompt ids and greedy tokens, the
 * ones `loom generate --image` gives for the same text; an Anthropic image
 * block, a Responses input_image and `loom chat`'s /image answer as the
 * chat does. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"
#include "serve/server.h"
#include "test.h"
#include "tokenize/tokenizer.h"
#include "vision/imgprompt.h"

#define GEMMA "tests/fixtures/models/gemma3-vl-tiny"

/* ---- loom_imgprompt_expand ------------------------------------------------ */

static void expect_expand(const loom_imgprompt *ip, const char *text, const int *n_tok, int n_img,
                          const char *want) {
    char *out = NULL;
    size_t len = 0;
    loom_status s = loom_imgprompt_expand(ip, text, strlen(text), n_tok, n_img, &out, &len);
    if (!want) {
        CHECKF(s == LOOM_ERR_INVALID_ARG, "\"%s\": expanded to \"%s\", want a count error", text,
               out ? out : "");
    } else {
        CHECKF(s == LOOM_OK && out && !strcmp(out, want) && len == strlen(want),
               "\"%s\": got \"%s\" (%s), want \"%s\"", text, out ? out : "", loom_last_error(), want);
    }
    free(out);
    loom_err_clear();
}

static void test_expand(void) {
    loom_imgprompt qwen = {.image_token = 9, .boi_token = -1, .eoi_token = -1, .image = "<P>"};
    int two[2] = {2, 3}, one[2] = {1, 1};
    expect_expand(&qwen, "a<s><P><e>b<s><P><e>", two, 2, "a<s><P><P><e>b<s><P><P><P><e>");
    /* written out already: kept */
    expect_expand(&qwen, "<P><P><P><P><P>", two, 2, "<P><P><P><P><P>");
    expect_expand(&qwen, "<P><P>", one, 2, "<P><P>");
    expect_expand(&qwen, "<P><P><P>", two, 2, NULL);
    expect_expand(&qwen, "no image", two, 0, "no image");
    loom_imgprompt gemma = {.gemma = 1, .image_token = 7, .boi_token = 5, .eoi_token = 6,
                            .image = "<I>", .boi = "<B>", .eoi = "<E>"};
    expect_expand(&gemma, "u\nx<B>y<B>", two, 2, "u\nx\n\n<B><I><I><E>\n\ny\n\n<B><I><I><I><E>\n\n");
    /* the first written out, the second not */
    expect_expand(&gemma, "<B><I><I><E>z<B>", two, 2, "<B><I><I><E>z\n\n<B><I><I><I><E>\n\n");
    expect_expand(&gemma, "<B>", two, 2, NULL);
    char *out = NULL;
    size_t len;
    CHECK(loom_imgprompt_expand(&gemma, "<B><B>", 6, two, 1, &out, &len) == LOOM_ERR_INVALID_ARG);
    CHECKF(strstr(loom_last_error(), "has 2 image placeholders (<B>) for 1 images"), "%s",
           loom_last_error());
    loom_err_clear();
}

/* ---- the Gemma 3 fixture on the server -------------------------------------- */

/* GPT-2's byte-to-unicode table: byte b's character as UTF-8. */
static void byte_char(int b, char *out) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int n = 0;
        for (int x = 0; x < b; x++)
            n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static void add_token(cJSON *added, int id, const char *content, int special) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", 0);
    cJSON_AddBoolToObject(t, "lstrip", 0);
    cJSON_AddBoolToObject(t, "rstrip", 0);
    cJSON_AddBoolToObject(t, "normalized", 0);
    cJSON_AddBoolToObject(t, "special", special);
    cJSON_AddItemToArray(added, t);
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* dir: the fixture's files linked, tokenizer.json whose added tokens are
 * the fixture's special ids and "w<id>" for every other id (so text
 * spells ids), and tokenizer_config.json with Gemma 3's chat template. */
static int gemma_dir(const char *dir) {
    static const char *files[] = {"config.json", "generation_config.json", "preprocessor_config.json",
                                  "model.safetensors"};
    char cwd[PATH_MAX], from[PATH_MAX + 64], to[PATH_MAX + 64];
    if (mkdir(dir, 0700) || !getcwd(cwd, sizeof cwd)) return 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(files); i++) {
        snprintf(from, sizeof from, "%s/" GEMMA "/%s", cwd, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        if (symlink(from, to)) return 0;
    }
    static const struct { int id; const char *s; int special; } named[] = {
        {0, "<pad>", 1}, {1, "<eos>", 1}, {2, "<bos>", 1}, {105, "<start_of_turn>", 1},
        {106, "<end_of_turn>", 1}, {107, "\n", 0}, {108, "\n\n", 0}, {300, "user", 0},
        {301, "model", 0}, {505, "<start_of_image>", 1}, {506, "<end_of_image>", 1},
        {507, "<image_soft_token>", 1}};
    /* the texts' ids are words; the bytes (for the BPE model) take the
     * first 256 ids left, and every other id is a word too */
    static const int text_ids[] = {272, 155, 39, 112, 353, 91, 266, 421, 258};
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *model = cJSON_CreateObject(), *vocab = cJSON_AddObjectToObject(model, "vocab");
    int kind[512] = {0}; /* 1 named, 2 word */
    for (size_t i = 0; i < LOOM_ARRAY_LEN(named); i++) {
        add_token(added, named[i].id, named[i].s, named[i].special);
        cJSON_AddNumberToObject(vocab, named[i].s, named[i].id);
        kind[named[i].id] = 1;
    }
    for (size_t i = 0; i < LOOM_ARRAY_LEN(text_ids); i++) kind[text_ids[i]] = 2;
    char s[16];
    for (int id = 0, b = 0; id < 512; id++) {
        if (kind[id] == 1) continue;
        if (kind[id] == 0 && b < 256) {
            byte_char(b++, s);
        } else {
            snprintf(s, sizeof s, "w%d", id);
            add_token(added, id, s, 0);
        }
        cJSON_AddNumberToObject(vocab, s, id);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddArrayToObject(model, "merges");
    cJSON_AddItemToObject(root, "model", model);
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    char *tj = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    snprintf(to, sizeof to, "%s/tokenizer.json", dir);
    int ok = tj && write_text(to, tj);
    free(tj);
    /* Gemma 3's own template, from the gemma3 tokenizer fixture */
    char *text = NULL;
    if (!ok || loom_read_file("tests/fixtures/tokenizers/gemma3/tokenizer_config.json", &text, NULL))
        return 0;
    cJSON *src = cJSON_Parse(text);
    free(text);
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(src, "chat_template");
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", cJSON_IsString(tpl) ? tpl->valuestring : "");
    cJSON_AddStringToObject(cfg, "bos_token", "<bos>");
    cJSON_AddStringToObject(cfg, "eos_token", "<end_of_turn>");
    cJSON_AddBoolToObject(cfg, "add_bos_token", 1);
    cJSON_Delete(src);
    char *cj = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    snprintf(to, sizeof to, "%s/tokenizer_config.json", dir);
    ok = cJSON_IsString(tpl) && cj && write_text(to, cj);
    free(cj);
    return ok;
}

/* The fixture's case 3: two images (C, then D) between texts. */
typedef struct gemma_case {
    int32_t ids[128];
    int n;
    int greedy[8];
} gemma_case;

static int load_case(gemma_case *c) {
    loom_safetensors *ref = NULL;
    if (loom_st_open(GEMMA "/reference.safetensors", &ref) != LOOM_OK) return 0;
    const loom_st_tensor *in = loom_st_find(ref, "case.3.input_ids");
    const loom_st_tensor *gr = loom_st_find(ref, "case.3.greedy");
    int ok = in && gr && in->shape[0] <= 128 && gr->shape[0] == 8;
    for (int i = 0; ok && i < in->shape[0]; i++) c->ids[i] = (int32_t)((const int64_t *)in->data)[i];
    for (int i = 0; ok && i < 8; i++) c->greedy[i] = (int)((const int64_t *)gr->data)[i];
    c->n = ok ? (int)in->shape[0] : 0;
    loom_st_close(ref);
    return ok;
}

/* The texts around case 3's images, spelled in the test tokenizer. */
static const char *const case_text[3] = {"w272w155", "w39w112w353", "w91w266w421w258"};

/* An int array field of j as a string "[a, b, ...]" (the CLI's --ids). */
static void ids_str(const cJSON *arr, char *out, size_t cap) {
    size_t w = (size_t)snprintf(out, cap, "[");
    for (const cJSON *x = arr ? arr->child : NULL; x && w < cap; x = x->next)
        w += (size_t)snprintf(out + w, cap - w, "%s%d", x == arr->child ? "" : ", ", x->valueint);
    if (w < cap) snprintf(out + w, cap - w, "]");
}

static char *post(loom_service *svc, const char *url, const char *body, int *status) {
    *status = 0;
    return loom_service_request(svc, url, body, strlen(body), status);
}

/* The answer text of a chat, /v1/messages or /v1/responses request (NULL
 * unless 200), malloc'd. */
static char *ask(loom_service *svc, const char *url, const char *body) {
    int status;
    char *resp = post(svc, url, body, &status);
    cJSON *j = resp && status == 200 ? cJSON_Parse(resp) : NULL;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "content"), 0); /* messages */
    if (!c) { /* responses */
        const cJSON *o = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "output"), 0);
        c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "content"), 0);
    }
    const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
    if (!c) /* chat */
        t = cJSON_GetStringValue(cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message"), "content"));
    char *out = t ? strdup(t) : NULL;
    if (!out) fprintf(stderr, "%s: %d %s\n", url, status, resp ? resp : "");
    cJSON_Delete(j);
    free(resp);
    return out;
}

static char *file_b64(const char *path) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *data = NULL;
    size_t n = 0;
    if (loom_read_file(path, &data, &n)) return NULL;
    char *out = malloc(n / 3 * 4 + 8), *w = out;
    const unsigned char *d = (const unsigned char *)data;
    for (size_t i = 0; out && i < n; i += 3) {
        unsigned v = d[i] << 16 | (i + 1 < n ? d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        *w++ = tab[v >> 18];
        *w++ = tab[v >> 12 & 63];
        *w++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? tab[v & 63] : '=';
    }
    if (out) *w = 0;
    free(data);
    return out;
}

static void test_gemma_server(const char *dir, const gemma_case *fc) {
    char media[PATH_MAX], body[3 * PATH_MAX];
    CHECK(realpath(GEMMA "/images", media) != NULL);
    loom_serve_params p = loom_serve_default_params();
    p.model_dir = dir;
    p.n_threads = 1;
    p.engine.n_ctx = 256;
    p.engine.max_seqs = 2;
    p.engine.model_dir = dir;
    p.allowed_media_dir = media;
    loom_service *svc = NULL;
    CHECKF(loom_service_open(&p, &svc) == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (!svc) return;
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": ["
             "{\"type\": \"text\", \"text\": \"%s\"},"
             "{\"type\": \"image_url\", \"image_url\": {\"url\": \"file://%s/C_32x32_rgba.png\"}},"
             "{\"type\": \"text\", \"text\": \"%s\"},"
             "{\"type\": \"image_url\", \"image_url\": {\"url\": \"file://%s/D_300x200_rgb.png\"}},"
             "{\"type\": \"text\", \"text\": \"%s\"}]}],"
             "\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"return_token_ids\": true}",
             case_text[0], media, case_text[1], media, case_text[2]);
    int status;
    char *resp = post(svc, "/v1/chat/completions", body, &status);
    cJSON *j = resp ? cJSON_Parse(resp) : NULL;
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const cJSON *pids = cJSON_GetObjectItem(ch, "prompt_token_ids"), *tids = cJSON_GetObjectItem(ch, "token_ids");
    CHECKF(status == 200 && cJSON_IsArray(pids) && cJSON_IsArray(tids), "chat with images: %d %s", status,
           resp ? resp : "");
    char got[2048], want[2048];
    ids_str(pids, got, sizeof got);
    size_t w = (size_t)snprintf(want, sizeof want, "[");
    for (int i = 0; i < fc->n; i++) w += (size_t)snprintf(want + w, sizeof want - w, "%s%d", i ? ", " : "", fc->ids[i]);
    snprintf(want + w, sizeof want - w, "]");
    CHECKF(!strcmp(got, want), "the chat's prompt ids:\n  %s\nthe fixture's:\n  %s", got, want);
    ids_str(tids, got, sizeof got);
    snprintf(want, sizeof want, "[%d, %d, %d, %d, %d, %d, %d, %d]", fc->greedy[0], fc->greedy[1],
             fc->greedy[2], fc->greedy[3], fc->greedy[4], fc->greedy[5], fc->greedy[6], fc->greedy[7]);
    CHECKF(!strcmp(got, want), "the chat's greedy tokens %s, the fixture's %s", got, want);

    /* the same question as one Anthropic image block and one Responses input_image */
    char *b64 = file_b64(GEMMA "/images/D_300x200_rgb.png");
    CHECK(b64 != NULL);
    size_t cap = strlen(b64 ? b64 : "") + 1024;
    char *mb = malloc(cap);
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": ["
             "{\"type\": \"image_url\", \"image_url\": {\"url\": \"file://%s/D_300x200_rgb.png\"}},"
             "{\"type\": \"text\", \"text\": \"w39\"}]}], \"max_tokens\": 6, \"temperature\": 0}", media);
    free(resp);
    cJSON_Delete(j);
    char *one = ask(svc, "/v1/chat/completions", body);
    CHECKF(one && *one, "one image: no answer text");
    snprintf(mb, cap,
             "{\"max_tokens\": 6, \"temperature\": 0, \"messages\": [{\"role\": \"user\","
             "\"content\": [{\"type\": \"image\", \"source\": {\"type\": \"base64\", \"media_type\":"
             "\"image/png\", \"data\": \"%s\"}}, {\"type\": \"text\", \"text\": \"w39\"}]}]}", b64 ? b64 : "");
    char *a = ask(svc, "/v1/messages", mb);
    CHECKF(a && one && !strcmp(a, one), "/v1/messages image block: \"%s\", the chat's \"%s\"", a ? a : "",
           one ? one : "");
    free(a);
    snprintf(mb, cap,
             "{\"max_output_tokens\": 6, \"temperature\": 0, \"input\": [{\"role\": \"user\", \"content\": ["
             "{\"type\": \"input_image\", \"image_url\": \"data:image/png;base64,%s\"},"
             "{\"type\": \"input_text\", \"text\": \"w39\"}]}]}", b64 ? b64 : "");
    a = ask(svc, "/v1/responses", mb);
    CHECKF(a && one && !strcmp(a, one), "/v1/responses input_image: \"%s\", the chat's \"%s\"", a ? a : "",
           one ? one : "");
    free(a);
    free(mb);
    free(b64);
    loom_service_close(svc);

    /* loom chat's /image (the image, then the text): the same reply */
    const char *b = getenv("LOOM_BUILD");
    char cmd[3 * PATH_MAX + 1024], out[512] = "";
    snprintf(cmd, sizeof cmd, "printf '/image %s/D_300x200_rgb.png\\nw39\\n' | %s/loom chat --model %s "
             "--temperature 0 --repeat-penalty 1 --max-tokens 6 --threads 1 2>/dev/null", media,
             b ? b : "build", dir);
    FILE *f = popen(cmd, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    int st = f ? pclose(f) : -1;
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
    CHECKF(st == 0 && one && !strcmp(out, one), "loom chat /image: \"%s\", the server's \"%s\"", out,
           one ? one : "");
    free(one);

    /* loom generate --image over the same text with its markers: the same answer */
    snprintf(cmd, sizeof cmd,
             "%s/loom generate --model %s --prompt '<start_of_turn>user\n%s<start_of_image>%s"
             "<start_of_image>%s<end_of_turn>\n<start_of_turn>model\n' --image %s/C_32x32_rgba.png "
             "--image %s/D_300x200_rgb.png --max-tokens 8 --temperature 0 --ignore-eos --threads 1 --ids "
             "2>/dev/null", b ? b : "build", dir, case_text[0], case_text[1], case_text[2], media, media);
    f = popen(cmd, "r");
    n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    st = f ? pclose(f) : -1;
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
    CHECKF(st == 0 && !strcmp(out, want), "loom generate --image: %s, want %s", out, want);
}

int main(void) {
    test_expand();
    char tmp[] = "/tmp/loom-test-api-vision-XXXXXX", dir[300];
    gemma_case fc;
    CHECK(load_case(&fc));
    if (mkdtemp(tmp)) {
        snprintf(dir, sizeof dir, "%s/gemma3-vl", tmp);
        CHECKF(gemma_dir(dir), "cannot make %s", dir);
        test_gemma_server(dir, &fc);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    return test_report("test_api_vision");
}
