/* Chat templates against transformers' apply_chat_template renderings: every
 * row of tests/fixtures/tokenizers/NAME/chat.json, plus the API's edges
 * (named templates, kwargs, continue_final_message, bad input). */
#include <cjson/cJSON.h>
#include <pthread.h>

#include "base/base.h"
#include "template/chat.h"
#include "template/jinja.h"
#include "test.h"

static const char *const TOKENIZERS[] = {
    "qwen3", "llama3_1", "llama2", "gemma3", "deepseek_v3", "gptoss",
};

/* The fixture conversations are handed to the template as their raw JSON
 * text: a cJSON round trip would print 1.0 as 1, and tool schemas must reach
 * the template exactly as Python's json.loads saw them. */
static size_t json_ws(const char *s, size_t i) {
    while (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') i++;
    return i;
}

/* Index just past the JSON value starting at s[i] (after whitespace). */
static size_t json_skip(const char *s, size_t i) {
    i = json_ws(s, i);
    if (s[i] == '"') {
        for (i++; s[i] && s[i] != '"'; i++)
            if (s[i] == '\\' && s[i + 1]) i++;
        return s[i] ? i + 1 : i;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; s[i]; i++) {
            if (s[i] == '"') {
                i = json_skip(s, i) - 1;
                continue;
            }
            if (s[i] == '{' || s[i] == '[') depth++;
            if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
        }
        return i;
    }
    while (s[i] && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\n') i++;
    return i;
}

typedef struct span {
    size_t b, e;   /* value text is s[b..e) */
} span;

/* Calls fn for each member of the object at s[i]. */
static void json_members(const char *s, size_t i, void (*fn)(const char *s, span key, span val, void *ud),
                         void *ud) {
    i = json_ws(s, i);
    if (s[i] != '{') return;
    i = json_ws(s, i + 1);
    while (s[i] == '"') {
        span k = {i + 1, json_skip(s, i) - 1};
        i = json_ws(s, k.e + 1);
        if (s[i] != ':') return;
        span v = {json_ws(s, i + 1), json_skip(s, i + 1)};
        fn(s, k, v, ud);
        i = json_ws(s, v.e);
        if (s[i] == ',') i = json_ws(s, i + 1);
    }
}

static int key_is(const char *s, span k, const char *name) {
    return k.e - k.b == strlen(name) && !memcmp(s + k.b, name, k.e - k.b);
}

static char *span_dup(const char *s, span v) {
    char *r = malloc(v.e - v.b + 1);
    if (!r) return NULL;
    memcpy(r, s + v.b, v.e - v.b);
    r[v.e - v.b] = 0;
    return r;
}

typedef struct conv_parts {
    char *messages, *tools, *documents;
    int agp, cont;          /* -1 when absent */
    char kwargs[65536];     /* {"enable_thinking": false, ...} */
    size_t kn;
} conv_parts;

static void conv_member(const char *s, span k, span v, void *ud) {
    conv_parts *c = ud;
    int is_true = v.e - v.b == 4 && !memcmp(s + v.b, "true", 4);
    if (key_is(s, k, "messages")) c->messages = span_dup(s, v);
    else if (key_is(s, k, "tools")) c->tools = span_dup(s, v);
    else if (key_is(s, k, "documents")) c->documents = span_dup(s, v);
    else if (key_is(s, k, "add_generation_prompt")) c->agp = is_true;
    else if (key_is(s, k, "continue_final_message")) c->cont = is_true;
    else if (c->kn + (v.e - k.b) + 8 < sizeof c->kwargs) {
        /* everything else is a template keyword (enable_thinking, ...) */
        c->kn += (size_t)snprintf(c->kwargs + c->kn, sizeof c->kwargs - c->kn, "%s%.*s",
                                  c->kn > 1 ? ", " : "", (int)(v.e - k.b + 1), s + k.b - 1);
    }
}

/* Renders one fixture conversation (raw JSON object text at s[i]). */
static loom_status render_row(const loom_chat_template *t, const char *s, size_t i, char **out) {
    conv_parts *c = calloc(1, sizeof *c);
    if (!c) return LOOM_ERR_NOMEM;
    c->agp = c->cont = -1;
    c->kwargs[0] = '{';
    c->kn = 1;
    json_members(s, i, conv_member, c);
    snprintf(c->kwargs + c->kn, sizeof c->kwargs - c->kn, "}");
    loom_chat_params p = loom_chat_default_params();
    p.messages_json = c->messages;
    p.tools_json = c->tools;
    p.documents_json = c->documents;
    p.kwargs_json = c->kwargs;
    /* the fixtures were made with add_generation_prompt on unless stated */
    p.continue_final_message = c->cont == 1;
    p.add_generation_prompt = c->agp >= 0 ? c->agp : c->cont != 1;
    loom_status st = loom_chat_apply(t, &p, out, NULL);
    free(c->messages);
    free(c->tools);
    free(c->documents);
    free(c);
    return st;
}

/* Start offsets of each row's "conversation" object, in order. */
typedef struct row_offsets {
    size_t at[4096];
    int n;
} row_offsets;

static void row_member(const char *s, span k, span v, void *ud) {
    row_offsets *r = ud;
    if (key_is(s, k, "conversation") && r->n < (int)LOOM_ARRAY_LEN(r->at)) r->at[r->n++] = v.b;
}

static void root_member(const char *s, span k, span v, void *ud) {
    if (!key_is(s, k, "rows")) return;
    size_t i = json_ws(s, v.b + 1);
    while (i < v.e && s[i] == '{') {
        row_offsets *r = ud;
        int before = r->n;
        json_members(s, i, row_member, ud);
        if (r->n == before && r->n < (int)LOOM_ARRAY_LEN(r->at)) r->at[r->n++] = 0;
        i = json_ws(s, json_skip(s, i));
        if (s[i] == ',') i = json_ws(s, i + 1);
    }
}

static void test_fixtures(void) {
    for (size_t k = 0; k < LOOM_ARRAY_LEN(TOKENIZERS); k++) {
        char dir[256], path[300];
        snprintf(dir, sizeof dir, "tests/fixtures/tokenizers/%s", TOKENIZERS[k]);
        snprintf(path, sizeof path, "%s/chat.json", dir);
        char *text = NULL;
        if (loom_read_file(path, &text, NULL) != LOOM_OK) {
            CHECKF(0, "%s: %s", path, loom_last_error());
            continue;
        }
        cJSON *doc = cJSON_Parse(text);
        const cJSON *rows = cJSON_GetObjectItemCaseSensitive(doc, "rows");
        CHECK(cJSON_IsArray(rows));
        static row_offsets offs;
        offs.n = 0;
        json_members(text, 0, root_member, &offs);
        CHECK_EQ_INT(offs.n, cJSON_GetArraySize(rows));
        loom_chat_template *t = NULL;
        loom_status lst = loom_chat_template_load(dir, &t);
        char load_err[1024];
        snprintf(load_err, sizeof load_err, "%s", loom_last_error());
        int pass = 0, total = 0, i = 0;
        const cJSON *row;
        cJSON_ArrayForEach(row, rows) {
            total++;
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(row, "rendered");
            const cJSON *err = cJSON_GetObjectItemCaseSensitive(row, "error");
            char *got = NULL;
            loom_status st = lst;
            if (lst == LOOM_OK && i < offs.n && offs.at[i]) st = render_row(t, text, offs.at[i], &got);
            else if (lst == LOOM_OK) st = LOOM_ERR_FORMAT;
            if (err) {
                /* transformers refused: loading or rendering must fail too */
                CHECKF(st != LOOM_OK, "%s row %d: expected an error (%s), rendered \"%s\"",
                       TOKENIZERS[k], i, err->valuestring, got ? got : "");
                pass += st != LOOM_OK;
            } else {
                int ok = st == LOOM_OK && cJSON_IsString(want) && !strcmp(got, want->valuestring);
                CHECKF(ok, "%s row %d: %s\n  want: %s\n  got:  %s", TOKENIZERS[k], i,
                       st == LOOM_OK ? "mismatch" : (lst != LOOM_OK ? load_err : loom_last_error()),
                       cJSON_IsString(want) ? want->valuestring : "?", got ? got : "(error)");
                pass += ok;
            }
            free(got);
            i++;
        }
        fprintf(stderr, "chat %-12s %d/%d rows match\n", TOKENIZERS[k], pass, total);
        loom_chat_template_free(t);
        cJSON_Delete(doc);
        free(text);
    }
}

static char *apply(const loom_chat_template *t, const char *messages, const char *tools,
                   int agp, const char *kwargs, loom_status *st) {
    loom_chat_params p = loom_chat_default_params();
    p.messages_json = messages;
    p.tools_json = tools;
    p.add_generation_prompt = agp;
    p.kwargs_json = kwargs;
    char *out = NULL;
    *st = loom_chat_apply(t, &p, &out, NULL);
    return out;
}

static void test_api(void) {
    loom_chat_template *t = NULL;
    loom_status st;
    /* named templates: tool_use is picked when tools are given */
    const char *cfg =
        "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
        " \"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ eos_token }}\"},"
        " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}";
    CHECK_EQ_INT(loom_chat_template_from_config(cfg, NULL, &t), LOOM_OK);
    int n = 0;
    const char *const *names = loom_chat_template_names(t, &n);
    CHECK_EQ_INT(n, 2);
    if (n == 2) CHECK_STR(names[1], "tool_use");
    char *out = apply(t, "[]", NULL, 0, NULL, &st);
    CHECK(st == LOOM_OK && out && !strcmp(out, "D<s></s>"));
    free(out);
    out = apply(t, "[]", "[{\"a\": 1}, {}]", 0, NULL, &st);
    CHECK(st == LOOM_OK && out && !strcmp(out, "T2"));
    free(out);
    loom_chat_template_free(t);

    /* kwargs override special tokens; tools default to None */
    const char *src =
        "{{ bos_token }}|{{ tools is none }}|{{ enable_thinking }}|{{ add_generation_prompt }}|"
        "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}";
    CHECK_EQ_INT(loom_chat_template_from_config("{\"bos_token\": \"<b>\"}", src, &t), LOOM_OK);
    out = apply(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, 1,
                "{\"enable_thinking\": false, \"bos_token\": \"B\"}", &st);
    CHECK(st == LOOM_OK && out && !strcmp(out, "B|True|False|True|user:hi;"));
    free(out);
    /* malformed inputs are caller errors */
    out = apply(t, "{\"role\": 1}", NULL, 0, NULL, &st);
    CHECK_EQ_INT(st, LOOM_ERR_INVALID_ARG);
    out = apply(t, "[{\"role\": ", NULL, 0, NULL, &st);
    CHECK_EQ_INT(st, LOOM_ERR_INVALID_ARG);
    CHECK(out == NULL);
    loom_chat_template_free(t);

    /* continue_final_message ends inside the last message */
    src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}";
    CHECK_EQ_INT(loom_chat_template_from_config(NULL, src, &t), LOOM_OK);
    loom_chat_params p = loom_chat_default_params();
    p.messages_json = "[{\"role\": \"user\", \"content\": \"Hi\"},"
                      " {\"role\": \"assistant\", \"content\": \"The answer is\"}]";
    p.continue_final_message = 1;
    out = NULL;
    CHECK_EQ_INT(loom_chat_apply(t, &p, &out, NULL), LOOM_OK);
    if (out) CHECK_STR(out, "<user>Hi</user><assistant>The answer is");
    free(out);
    loom_chat_template_free(t);

    /* raise_exception surfaces the template's message */
    src = "{% if messages|length == 0 %}{{ raise_exception('No messages given') }}{% endif %}ok";
    CHECK_EQ_INT(loom_chat_template_from_config(NULL, src, &t), LOOM_OK);
    out = apply(t, "[]", NULL, 0, NULL, &st);
    CHECK_EQ_INT(st, LOOM_ERR_INVALID_ARG);
    CHECK_STR(loom_last_error(), "No messages given");
    CHECK(loom_jinja_last_error_raised());
    CHECK(out == NULL);
    loom_chat_template_free(t);

    /* no template at all, and a broken one */
    CHECK_EQ_INT(loom_chat_template_from_config("{\"bos_token\": \"<s>\"}", NULL, &t),
                 LOOM_ERR_UNSUPPORTED);
    CHECK(t == NULL);
    CHECK_EQ_INT(loom_chat_template_from_config(NULL, "{% if x %}", &t), LOOM_ERR_FORMAT);
    CHECK(strstr(loom_last_error(), "line 1") != NULL);
    CHECK_EQ_INT(loom_chat_template_load("tests/fixtures/tokenizers/gptoss", &t),
                 LOOM_ERR_UNSUPPORTED);
    CHECK_EQ_INT(loom_chat_template_load("/nonexistent/dir", &t), LOOM_ERR_UNSUPPORTED);
}

/* One compiled template rendered from several threads at once (the server
 * shares it between requests): every rendering must be identical. */
typedef struct thread_job {
    const loom_chat_template *t;
    const char *want;
    int bad;
} thread_job;

static const char *const THREAD_MESSAGES =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\", \"days\": [1, 2.5]}}}]},"
    " {\"role\": \"tool\", \"content\": \"sunny\"}]";
static const char *const THREAD_TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"type\": \"object\"}}}]";

static void *thread_main(void *arg) {
    thread_job *j = arg;
    for (int i = 0; i < 200; i++) {
        loom_status st;
        char *out = apply(j->t, THREAD_MESSAGES, THREAD_TOOLS, 1, "{\"enable_thinking\": false}", &st);
        if (st != LOOM_OK || !out || strcmp(out, j->want)) j->bad++;
        free(out);
    }
    return NULL;
}

static void test_threads(void) {
    loom_chat_template *t = NULL;
    CHECK_EQ_INT(loom_chat_template_load("tests/fixtures/tokenizers/qwen3", &t), LOOM_OK);
    if (!t) return;
    loom_status st;
    char *want = apply(t, THREAD_MESSAGES, THREAD_TOOLS, 1, "{\"enable_thinking\": false}", &st);
    CHECK(st == LOOM_OK && want && strstr(want, "<tool_response>\nsunny\n</tool_response>"));
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, want ? want : "", 0};
        pthread_create(&th[i], NULL, thread_main, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(jobs[i].bad, 0);
    }
    free(want);
    loom_chat_template_free(t);
}

int main(void) {
    test_fixtures();
    test_api();
    test_threads();
    return test_report("test_chat_template");
}
