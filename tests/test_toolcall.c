/* Tool-call parsing: every syntax whole and split at every byte (the
 * streaming case), the streamed deltas, parameter typing by schema,
 * malformed calls (content, whole), unicode, and which syntax a model's
 * template and vocabulary select. */
#include <cjson/cJSON.h>

#include "serve/toolcall.h"
#include "stream/textstream.h"
#include "test.h"

/* Tokenizer fixtures, unpacked by tests/run.sh under $LOOM_BUILD. */
static char fixdir[512];

static const char *fixture(const char *name) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", fixdir, name);
    return dir;
}

/* The markers a syntax writes: none may reach content of a well-formed case. */
static const char *const MARKERS[] = {"<tool_call", "<|tool_call", "<function", "<parameter", "<|channel",
                                      "<|message", "<|start", "<|python_tag", "[TOOL_CALLS", "<channel|",
                                      NULL};

typedef struct out {
    loom_buf content, reasoning;
    loom_toolscan t;
    cJSON *deltas; /* every streamed tool_calls delta, in order */
} out;

static const char *str(const loom_buf *b) { return b->p ? b->p : ""; }

static void drain(out *o) {
    loom_buf d = {0};
    while (loom_toolscan_next_delta(&o->t, &d)) {
        cJSON *a = cJSON_Parse(d.p);
        CHECKF(cJSON_IsArray(a) && cJSON_GetArraySize(a) == 1, "delta %s", d.p);
        if (a) cJSON_AddItemToArray(o->deltas, cJSON_DetachItemFromArray(a, 0));
        cJSON_Delete(a);
        d.len = 0;
    }
    loom_buf_free(&d);
}

/* Feeds text in the given pieces (cuts: the offsets where a piece ends,
 * n_cuts of them, the last being strlen(text)), then finishes. */
static void run(out *o, loom_tc_syntax syn, int tools, int think, const char *tools_json, const char *prompt,
                const char *text, const size_t *cuts, int n_cuts, int clean) {
    memset(o, 0, sizeof *o);
    o->deltas = cJSON_CreateArray();
    loom_toolscan_init(&o->t, tools, think, prompt);
    loom_toolscan_set_syntax(&o->t, syn, tools_json, prompt);
    size_t at = 0;
    for (int i = 0; i < n_cuts; i++) {
        loom_toolscan_feed(&o->t, text + at, cuts[i] - at, 0, &o->content, &o->reasoning);
        at = cuts[i];
        drain(o);
        for (int k = 0; clean && MARKERS[k]; k++)
            CHECKF(!strstr(str(&o->content), MARKERS[k]), "leaked %s: \"%s\"", MARKERS[k], str(&o->content));
    }
    loom_toolscan_feed(&o->t, "", 0, 1, &o->content, &o->reasoning);
    drain(o);
}

static void out_free(out *o) {
    loom_buf_free(&o->content);
    loom_buf_free(&o->reasoning);
    loom_toolscan_free(&o->t);
    cJSON_Delete(o->deltas);
}

static int json_equal(const char *got, const char *want) {
    cJSON *a = cJSON_Parse(got), *b = cJSON_Parse(want);
    int eq = a && b && cJSON_Compare(a, b, 1);
    cJSON_Delete(a);
    cJSON_Delete(b);
    return eq;
}

typedef struct tcase {
    const char *what;
    loom_tc_syntax syn;
    int tools, think;
    const char *tools_json, *prompt, *text;
    const char *content, *reasoning;
    int n_calls;
    const char *names[3], *args[3]; /* args as JSON, compared as values */
} tcase;

/* The deltas must rebuild the calls: per call a header (index, id, type,
 * name, arguments "") first, then its arguments. */
static void check_deltas(const tcase *c, const out *o, const char *how) {
    CHECKF(cJSON_GetArraySize(o->deltas) == 2 * o->t.n_calls, "%s %s: %d deltas for %d calls", c->what, how,
           cJSON_GetArraySize(o->deltas), o->t.n_calls);
    for (int i = 0; i < o->t.n_calls && cJSON_GetArraySize(o->deltas) == 2 * o->t.n_calls; i++) {
        /* a call's header comes before its arguments; calls in order */
        const cJSON *h = NULL, *a = NULL, *d;
        cJSON_ArrayForEach(d, o->deltas) {
            if (cJSON_GetObjectItem(d, "index")->valueint != i) continue;
            if (!h) h = d;
            else a = d;
        }
        if (!h || !a) {
            CHECKF(0, "%s %s: call %d lacks deltas", c->what, how, i);
            continue;
        }
        const cJSON *hf = cJSON_GetObjectItem(h, "function"), *af = cJSON_GetObjectItem(a, "function");
        CHECK_STR(cJSON_GetObjectItem(h, "id")->valuestring, o->t.calls[i].id);
        CHECK_STR(cJSON_GetObjectItem(h, "type")->valuestring, "function");
        CHECK_STR(cJSON_GetObjectItem(hf, "name")->valuestring, o->t.calls[i].name);
        CHECK_STR(cJSON_GetObjectItem(hf, "arguments")->valuestring, "");
        CHECK(!cJSON_GetObjectItem(a, "id") && !cJSON_GetObjectItem(af, "name"));
        CHECK_STR(cJSON_GetObjectItem(af, "arguments")->valuestring, o->t.calls[i].arguments);
    }
}

static void check_case(const tcase *c, const out *o, const char *how) {
    CHECKF(o->t.n_calls == c->n_calls, "%s %s: %d calls, expected %d", c->what, how, o->t.n_calls, c->n_calls);
    CHECKF(!strcmp(str(&o->content), c->content), "%s %s: content \"%s\", expected \"%s\"", c->what, how,
           str(&o->content), c->content);
    CHECKF(!strcmp(str(&o->reasoning), c->reasoning ? c->reasoning : ""), "%s %s: reasoning \"%s\"", c->what,
           how, str(&o->reasoning));
    for (int i = 0; i < c->n_calls && i < o->t.n_calls; i++) {
        CHECKF(!strcmp(o->t.calls[i].name, c->names[i]), "%s %s: name %s", c->what, how, o->t.calls[i].name);
        CHECKF(json_equal(o->t.calls[i].arguments, c->args[i]), "%s %s: call %d arguments %s, expected %s",
               c->what, how, i, o->t.calls[i].arguments, c->args[i]);
    }
    check_deltas(c, o, how);
}

/* Whole, then split in two at every byte, then one byte at a time. */
static void check_all_splits(const tcase *c) {
    size_t n = strlen(c->text);
    int clean = c->n_calls > 0;
    out o;
    size_t whole[1] = {n};
    run(&o, c->syn, c->tools, c->think, c->tools_json, c->prompt, c->text, whole, 1, clean);
    check_case(c, &o, "whole");
    /* the OpenAI shape: arguments a JSON string of an object */
    loom_buf b = {0};
    loom_toolscan_put_calls(&o.t, &b, 0);
    cJSON *j = cJSON_Parse(b.p);
    CHECKF(cJSON_GetArraySize(j) == o.t.n_calls, "%s: %s", c->what, b.p);
    for (int i = 0; i < cJSON_GetArraySize(j); i++) {
        const cJSON *e = cJSON_GetArrayItem(j, i), *f = cJSON_GetObjectItem(e, "function");
        CHECK(!cJSON_GetObjectItem(e, "index"));
        CHECK(!strncmp(cJSON_GetObjectItem(e, "id")->valuestring, "call_", 5));
        cJSON *args = cJSON_Parse(cJSON_GetObjectItem(f, "arguments")->valuestring);
        CHECKF(cJSON_IsObject(args), "%s: arguments %s", c->what, cJSON_GetObjectItem(f, "arguments")->valuestring);
        cJSON_Delete(args);
    }
    cJSON_Delete(j);
    loom_buf_free(&b);
    out_free(&o);
    char how[32];
    for (size_t i = 0; i <= n; i++) {
        size_t cuts[2] = {i, n};
        snprintf(how, sizeof how, "split at %zu", i);
        run(&o, c->syn, c->tools, c->think, c->tools_json, c->prompt, c->text, cuts, 2, clean);
        check_case(c, &o, how);
        out_free(&o);
    }
    size_t *cuts = malloc(sizeof *cuts * (n + 1));
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    run(&o, c->syn, c->tools, c->think, c->tools_json, c->prompt, c->text, cuts, (int)n, clean);
    check_case(c, &o, "bytewise");
    out_free(&o);
    free(cuts);
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"n\":{\"type\":\"number\"},"
    "\"b\":{\"type\":\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},"
    "\"x\":{\"type\":[\"integer\",\"null\"]},\"u\":{\"description\":\"untyped\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"q\":{\"type\":\"string\"}}}}}]";

static const tcase CASES[] = {
    /* ---- Hermes / Qwen 2.5 / Qwen 3: JSON in tags ---- */
    {"qwen json", LOOM_TC_QWEN, 1, 0, NULL, NULL,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "", NULL, 1,
     {"get_weather"}, {"{\"city\":\"Paris\"}"}},
    {"qwen json, text and two calls", LOOM_TC_QWEN, 1, 0, NULL, NULL,
     "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
     "Let me look.\n", NULL, 2, {"a", "b"}, {"{\"x\":[1,2]}", "{}"}},
    {"qwen json, reasoning first", LOOM_TC_QWEN, 1, 1, NULL, "<|im_start|>assistant\n",
     "<think>\nweigh it\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"\\u00e9\"}}\n</tool_call>",
     "", "weigh it\n", 1, {"f"}, {"{\"s\":\"\xc3\xa9\"}"}},
    {"qwen json, text after the call", LOOM_TC_QWEN, 1, 0, NULL, NULL,
     "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone.", "Done.", NULL, 1, {"f"}, {"{}"}},
    {"qwen json, unicode", LOOM_TC_QWEN, 1, 0, NULL, NULL,
     "\xe5\xa5\xbd<tool_call>{\"name\": \"\xe5\xa4\xa9\xe6\xb0\x94\", \"arguments\": {\"city\": \"Z\xc3\xbcrich \xe6\x9d\xb1\xe4\xba\xac\"}}</tool_call>",
     "\xe5\xa5\xbd", NULL, 1, {"\xe5\xa4\xa9\xe6\xb0\x94"}, {"{\"city\":\"Z\xc3\xbcrich \xe6\x9d\xb1\xe4\xba\xac\"}"}},
    {"qwen json, malformed", LOOM_TC_QWEN, 1, 0, NULL, NULL, "a <tool_call>{\"name\": oops}</tool_call> b",
     "a <tool_call>{\"name\": oops}</tool_call> b", NULL, 0, {NULL}, {NULL}},
    {"qwen json, unclosed", LOOM_TC_QWEN, 1, 0, NULL, NULL, "<tool_call>{\"name\": \"f\", \"argu",
     "<tool_call>{\"name\": \"f\", \"argu", NULL, 0, {NULL}, {NULL}},
    {"qwen, tools off", LOOM_TC_QWEN, 0, 0, NULL, NULL, "<tool_call>{\"name\": \"f\"}</tool_call>",
     "<tool_call>{\"name\": \"f\"}</tool_call>", NULL, 0, {NULL}, {NULL}},
    {"qwen, a lone <", LOOM_TC_QWEN, 1, 0, NULL, NULL, "if a < b and c <tool", "if a < b and c <tool", NULL, 0,
     {NULL}, {NULL}},
    /* ---- Qwen3-Coder / Qwen 3.5: XML, typed by the schema ---- */
    {"xml, every type", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "<tool_call>\n<function=f>\n<parameter=s>\nhello\nworld\n</parameter>\n<parameter=i>\n42\n</parameter>\n"
     "<parameter=n>\n-1.5e3\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1, 2]}\n"
     "</parameter>\n<parameter=a>\n[\"x\", 2]\n</parameter>\n<parameter=x>\nnull\n</parameter>\n<parameter=u>\n7\n"
     "</parameter>\n<parameter=z>\n{}\n</parameter>\n</function>\n</tool_call>",
     "", NULL, 1, {"f"},
     {"{\"s\":\"hello\\nworld\",\"i\":42,\"n\":-1500,\"b\":true,\"o\":{\"k\":[1,2]},\"a\":[\"x\",2],\"x\":null,"
      "\"u\":\"7\",\"z\":\"{}\"}"}},
    {"xml, values that are not their type stay strings", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=i>\nforty\n</parameter>\n"
     "<parameter=n>\n1.5x\n</parameter>\n<parameter=b>\nmaybe\n</parameter>\n<parameter=o>\n{oops\n</parameter>\n"
     "<parameter=x>\n\"7\"\n</parameter>\n</function>\n</tool_call>",
     "", NULL, 1, {"f"},
     {"{\"s\":\"42\",\"i\":\"forty\",\"n\":\"1.5x\",\"b\":\"maybe\",\"o\":\"{oops\",\"x\":\"\\\"7\\\"\"}"}},
    {"xml, no schema: strings", LOOM_TC_QWEN, 1, 0, NULL, NULL,
     "<tool_call>\n<function=f>\n<parameter=i>\n42\n</parameter>\n</function>\n</tool_call>", "", NULL, 1, {"f"},
     {"{\"i\":\"42\"}"}},
    {"xml, text, two calls, unicode", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "Sure.\n\n<tool_call>\n<function=g>\n<parameter=q>\n\xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x8c\xa7 <b>&amp;\n"
     "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=f>\n<parameter=i>\n-3\n</parameter>\n"
     "</function>\n</tool_call>",
     "Sure.\n\n", NULL, 2, {"g", "f"}, {"{\"q\":\"\xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x8c\xa7 <b>&amp;\"}", "{\"i\":-3}"}},
    {"xml, no parameters", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "<tool_call>\n<function=g>\n</function>\n</tool_call>", "", NULL, 1, {"g"}, {"{}"}},
    {"xml, cut off at the end", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "<tool_call>\n<function=f>\n<parameter=i>\n5\n</parameter>\n<parameter=s>\nabc", "", NULL, 1, {"f"},
     {"{\"i\":5,\"s\":\"abc\"}"}},
    {"xml, malformed function tag", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "<tool_call>\n<function=f\n<parameter=s>\nx\n</parameter>\n</tool_call>",
     "<tool_call>\n<function=f\n<parameter=s>\nx\n</parameter>\n</tool_call>", NULL, 0, {NULL}, {NULL}},
    {"xml, stray text in the call", LOOM_TC_QWEN, 1, 0, TOOLS, NULL,
     "<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>",
     "<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>", NULL, 0, {NULL}, {NULL}},
    /* ---- Gemma 4 ---- */
    {"gemma4, every type", LOOM_TC_GEMMA4, 1, 0, NULL, NULL,
     "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,metric:true,tags:[<|\"|>a<|\"|>,<|\"|>b<|\"|>],"
     "opt:{x:1.5,y:null,z:False}}<tool_call|>",
     "", NULL, 1, {"get_weather"},
     {"{\"city\":\"Paris\",\"days\":3,\"metric\":true,\"tags\":[\"a\",\"b\"],\"opt\":{\"x\":1.5,\"y\":null,\"z\":false}}"}},
    {"gemma4, text and two calls", LOOM_TC_GEMMA4, 1, 0, NULL, NULL,
     "Checking.<|tool_call>call:a{}<tool_call|><|tool_call>call:b{q:<|\"|>x, y: {z} \"q\"<|\"|>,n:-2}<tool_call|>",
     "Checking.", NULL, 2, {"a", "b"}, {"{}", "{\"q\":\"x, y: {z} \\\"q\\\"\",\"n\":-2}"}},
    {"gemma4, unicode", LOOM_TC_GEMMA4, 1, 0, NULL, NULL,
     "<|tool_call>call:f{city:<|\"|>Z\xc3\xbcrich \xe6\x9d\xb1\xe4\xba\xac<|\"|>}<tool_call|>", "", NULL, 1, {"f"},
     {"{\"city\":\"Z\xc3\xbcrich \xe6\x9d\xb1\xe4\xba\xac\"}"}},
    {"gemma4, reasoning", LOOM_TC_GEMMA4, 0, 0, NULL, "<|turn>model\n",
     "<|channel>thought\nweigh it<channel|>The answer", "The answer", "weigh it", 0, {NULL}, {NULL}},
    {"gemma4, a call ends the reasoning", LOOM_TC_GEMMA4, 1, 0, NULL, "<|turn>model\n",
     "<|channel>thought\nneed the weather<|tool_call>call:f{}<tool_call|>", "", "need the weather", 1, {"f"},
     {"{}"}},
    {"gemma4, thinking off", LOOM_TC_GEMMA4, 0, 0, NULL, "<|turn>model\n<|channel>thought\n<channel|>",
     "Hello", "Hello", NULL, 0, {NULL}, {NULL}},
    {"gemma4, unterminated string", LOOM_TC_GEMMA4, 1, 0, NULL, NULL,
     "<|tool_call>call:f{a:<|\"|>open}<tool_call|>", "<|tool_call>call:f{a:<|\"|>open}<tool_call|>", NULL, 0,
     {NULL}, {NULL}},
    {"gemma4, not a call", LOOM_TC_GEMMA4, 1, 0, NULL, NULL, "<|tool_call>nonsense<tool_call|>",
     "<|tool_call>nonsense<tool_call|>", NULL, 0, {NULL}, {NULL}},
    {"gemma4, missing colon", LOOM_TC_GEMMA4, 1, 0, NULL, NULL, "<|tool_call>call:f{a 1}<tool_call|>",
     "<|tool_call>call:f{a 1}<tool_call|>", NULL, 0, {NULL}, {NULL}},
    /* ---- Llama 3, Mistral ---- */
    {"llama3 bare json", LOOM_TC_LLAMA3, 1, 0, NULL, NULL,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "", NULL, 1, {"get_weather"},
     {"{\"city\":\"Oslo\"}"}},
    {"llama3 python_tag", LOOM_TC_LLAMA3, 1, 0, NULL, NULL, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"a<b\"}}",
     "", NULL, 1, {"f"}, {"{\"q\":\"a<b\"}"}},
    {"llama3 json that is no call", LOOM_TC_LLAMA3, 1, 0, NULL, NULL, "[1, 2, 3] is the list",
     "[1, 2, 3] is the list", NULL, 0, {NULL}, {NULL}},
    {"mistral", LOOM_TC_MISTRAL, 1, 0, NULL, NULL,
     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": 1}}, {\"name\": \"b\", \"arguments\": \"{}\"}]", "", NULL,
     2, {"a", "b"}, {"{\"k\":1}", "{}"}},
    /* ---- gpt-oss harmony ---- */
    {"harmony call", LOOM_TC_HARMONY, 1, 0, NULL, NULL,
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
     "", "Need the weather.", 1, {"get_weather"}, {"{\"city\":\"Paris\"}"}},
    {"harmony call, recipient first", LOOM_TC_HARMONY, 1, 0, NULL, NULL,
     "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
     "<|message|>{\"n\": [1, {\"u\": \"\xe2\x82\xac\"}]}<|call|>",
     "", "x", 1, {"f"}, {"{\"n\":[1,{\"u\":\"\xe2\x82\xac\"}]}"}},
    {"harmony final", LOOM_TC_HARMONY, 1, 0, NULL, NULL,
     "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello, "
     "\xe4\xb8\x96\xe7\x95\x8c!<|return|>",
     "Hello, \xe4\xb8\x96\xe7\x95\x8c!", "Think.", 0, {NULL}, {NULL}},
    {"harmony final, stop token not in the text", LOOM_TC_HARMONY, 0, 0, NULL, NULL,
     "<|channel|>final<|message|>Hi <|there", "Hi <|there", NULL, 0, {NULL}, {NULL}},
    {"harmony preamble then call", LOOM_TC_HARMONY, 1, 0, NULL, NULL,
     "<|channel|>commentary<|message|>Looking it up.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.f <|constrain|>json<|message|>{}<|call|>",
     "Looking it up.", NULL, 1, {"f"}, {"{}"}},
    {"harmony malformed arguments", LOOM_TC_HARMONY, 1, 0, NULL, NULL,
     "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>", "{oops", NULL, 0, {NULL},
     {NULL}},
    {"harmony, tools off", LOOM_TC_HARMONY, 0, 0, NULL, NULL,
     "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", "{}", NULL, 0, {NULL}, {NULL}},
    {"harmony, no header", LOOM_TC_HARMONY, 1, 0, NULL, NULL, "just text", "just text", NULL, 0, {NULL}, {NULL}},
    /* ---- auto: every tag syntax ---- */
    {"auto, gemma4 call", LOOM_TC_AUTO, 1, 0, NULL, NULL, "<|tool_call>call:f{a:1}<tool_call|>", "", NULL, 1, {"f"},
     {"{\"a\":1}"}},
    {"auto, xml call", LOOM_TC_AUTO, 1, 0, NULL, NULL,
     "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>", "", NULL, 1, {"f"},
     {"{\"a\":\"1\"}"}},
};

static void test_cases(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) check_all_splits(&CASES[i]);
}

/* More calls than the array holds: the rest stay content, nothing overflows. */
static void test_many_calls(void) {
    loom_buf text = {0};
    for (int i = 0; i < LOOM_MAX_TOOL_CALLS + 4; i++)
        loom_buf_printf(&text, "<tool_call>{\"name\": \"f%d\", \"arguments\": {}}</tool_call>\n", i);
    out o;
    size_t cuts[1] = {text.len};
    run(&o, LOOM_TC_QWEN, 1, 0, NULL, NULL, text.p, cuts, 1, 0);
    CHECK_EQ_INT(o.t.n_calls, LOOM_MAX_TOOL_CALLS);
    CHECK_STR(o.t.calls[LOOM_MAX_TOOL_CALLS - 1].name, "f15");
    CHECK(strstr(str(&o.content), "\"f16\"") && strstr(str(&o.content), "\"f19\"") &&
          !strstr(str(&o.content), "\"f15\""));
    for (int i = 1; i < o.t.n_calls; i++) CHECK(strcmp(o.t.calls[i].id, o.t.calls[i - 1].id) != 0);
    out_free(&o);
    loom_buf_free(&text);
}

/* Deep nesting and odd bytes never crash; what does not parse is content. */
static void test_garbage(void) {
    loom_buf text = {0};
    loom_buf_puts(&text, "<|tool_call>call:f{a:");
    for (int i = 0; i < 200; i++) loom_buf_puts(&text, "[");
    loom_buf_puts(&text, "<tool_call|>");
    out o;
    size_t cuts[1] = {text.len};
    run(&o, LOOM_TC_GEMMA4, 1, 0, NULL, NULL, text.p, cuts, 1, 0);
    CHECK_EQ_INT(o.t.n_calls, 0);
    CHECK_STR(str(&o.content), text.p);
    out_free(&o);
    loom_buf_free(&text);
    static const char *const bad[] = {
        "<tool_call>", "<tool_call></tool_call>", "<tool_call>\n<function=>\n</function></tool_call>",
        "<tool_call><function=f><parameter=>x</parameter></function></tool_call>",
        "<|tool_call>call:{}<tool_call|>", "<|tool_call>call:f{a:[1,}<tool_call|>", "<|tool_call>call:f{<tool_call|>",
        "<|tool_call>call:f{a:<|\"|>", "\xff\xfe<tool_call>\xc3</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        for (loom_tc_syntax s = LOOM_TC_AUTO; s <= LOOM_TC_HARMONY; s++) {
            size_t c1[1] = {strlen(bad[i])};
            run(&o, s, 1, 1, TOOLS, NULL, bad[i], c1, 1, 0);
            CHECKF(o.t.n_calls == 0, "%s: %d calls", bad[i], o.t.n_calls);
            out_free(&o);
        }
}

/* A template rendering one call in history, or a vocabulary, picks the syntax. */
static void test_detect(void) {
    static const struct {
        const char *dir;
        loom_tc_syntax want;
    } dirs[] = {
        {"qwen3", LOOM_TC_QWEN},      /* template: <tool_call>{json} */
        {"gptoss", LOOM_TC_HARMONY},  /* no template: its vocabulary */
        {"gemma3", LOOM_TC_AUTO},     /* no tool syntax at all */
        {"llama2", LOOM_TC_AUTO},
    };
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        loom_tok *tok = NULL;
        loom_chat_template *chat = NULL;
        CHECKF(loom_tok_load_dir(fixture(dirs[i].dir), &tok) == LOOM_OK, "%s", loom_last_error());
        if (loom_chat_template_load(fixture(dirs[i].dir), &chat) != LOOM_OK) chat = NULL;
        loom_tc_syntax got = loom_toolcall_detect(chat, tok);
        CHECKF(got == dirs[i].want, "%s: %s, expected %s", dirs[i].dir, loom_toolcall_syntax_name(got),
               loom_toolcall_syntax_name(dirs[i].want));
        loom_chat_template_free(chat);
        loom_tok_free(tok);
    }
    /* the tool-call lines of each family's template, on their own */
    static const struct {
        const char *tpl;
        loom_tc_syntax want;
    } tpls[] = {
        {"{%- for m in messages %}{%- if m.tool_calls %}{%- for tc in m.tool_calls %}"
         "{{- '<tool_call>\\n<function=' + tc.function.name + '>\\n' }}"
         "{%- for k, v in tc.function.arguments|items %}{{- '<parameter=' + k + '>\\n' + v|string + "
         "'\\n</parameter>\\n' }}{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}"
         "{%- else %}{{ m.content }}{%- endif %}{%- endfor %}",
         LOOM_TC_QWEN},
        {"{%- for m in messages %}{%- for tc in m.tool_calls or [] %}"
         "{{- '<|tool_call>call:' + tc.function.name + '{' -}}{%- for k, v in tc.function.arguments|dictsort -%}"
         "{{- k -}}:<|\"|>{{- v -}}<|\"|>{%- endfor -%}{{- '}<tool_call|>' -}}{%- endfor %}{%- endfor %}",
         LOOM_TC_GEMMA4},
        {"{%- for m in messages %}{%- for tc in m.tool_calls or [] %}{{- '<|start|>assistant to=functions.' + "
         "tc.function.name + '<|channel|>commentary json<|message|>' + tc.function.arguments|tojson + "
         "'<|call|>' }}{%- endfor %}{%- endfor %}",
         LOOM_TC_HARMONY},
        {"{%- for m in messages %}{%- for tc in m.tool_calls or [] %}{{- '{\"name\": \"' + tc.function.name + "
         "'\", \"parameters\": ' + tc.function.arguments|tojson + '}' }}{%- endfor %}{%- endfor %}",
         LOOM_TC_LLAMA3},
        {"{%- for m in messages %}{%- if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls|map(attribute='function')|list|tojson }}"
         "{%- endif %}{%- endfor %}",
         LOOM_TC_MISTRAL},
        {"{%- for m in messages %}{{ m.content }}{%- endfor %}", LOOM_TC_AUTO},
    };
    for (size_t i = 0; i < sizeof tpls / sizeof *tpls; i++) {
        loom_chat_template *chat = NULL;
        CHECK(loom_chat_template_from_config(NULL, tpls[i].tpl, &chat) == LOOM_OK);
        loom_tc_syntax got = loom_toolcall_detect(chat, NULL);
        CHECKF(got == tpls[i].want, "template %zu: %s, expected %s", i, loom_toolcall_syntax_name(got),
               loom_toolcall_syntax_name(tpls[i].want));
        loom_chat_template_free(chat);
    }
}

/* gpt-oss end to end over its real tokenizer: the channel markers are
 * special tokens, which the text stream keeps only when told; a turn ends
 * at <|return|> or <|call|>, not at <|end|>. */
static void test_harmony_tokens(void) {
    loom_tok *tok = NULL;
    CHECKF(loom_tok_load_dir(fixture("gptoss"), &tok) == LOOM_OK, "%s", loom_last_error());
    if (!tok) return;
    int32_t keep[LOOM_DETOK_MAX_KEEP], ends[8];
    int n_keep = loom_toolcall_keep_ids(LOOM_TC_HARMONY, tok, 0, keep, LOOM_DETOK_MAX_KEEP);
    CHECK_EQ_INT(n_keep, 7);
    int n_end = loom_toolcall_turn_end_ids(LOOM_TC_HARMONY, tok, ends, 8);
    int32_t end_id = loom_tok_token_to_id(tok, "<|end|>", 7), call_id = loom_tok_token_to_id(tok, "<|call|>", 8);
    int has_end = 0, has_call = 0;
    for (int i = 0; i < n_end; i++) has_end |= ends[i] == end_id, has_call |= ends[i] == call_id;
    CHECK(!has_end && has_call);
    static const char text[] = "<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant"
                               "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                               "{\"city\":\"K\xc3\xb8" "benhavn\"}<|call|>";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(loom_tok_encode(tok, text, strlen(text), LOOM_TOK_NO_SPECIAL, &ids, &n) == LOOM_OK);
    for (int with_keep = 0; with_keep < 2; with_keep++) {
        loom_textstream *ts = NULL;
        CHECK(loom_ts_create(tok, NULL, 0, 1, &ts) == LOOM_OK);
        if (with_keep) CHECK(loom_ts_keep_special(ts, keep, n_keep) == LOOM_OK);
        out o;
        memset(&o, 0, sizeof o);
        o.deltas = cJSON_CreateArray();
        loom_toolscan_init(&o.t, 1, 0, NULL);
        loom_toolscan_set_syntax(&o.t, LOOM_TC_HARMONY, NULL, NULL);
        for (size_t i = 0; i < n; i++) {
            const char *piece;
            size_t len;
            int stopped;
            CHECK(loom_ts_push(ts, ids[i], &piece, &len, &stopped) == LOOM_OK);
            loom_toolscan_feed(&o.t, piece, len, 0, &o.content, &o.reasoning);
        }
        const char *piece;
        size_t len;
        int stopped;
        CHECK(loom_ts_finish(ts, &piece, &len, &stopped) == LOOM_OK);
        loom_toolscan_feed(&o.t, piece, len, 1, &o.content, &o.reasoning);
        if (with_keep) {
            CHECK_EQ_INT(o.t.n_calls, 1);
            if (o.t.n_calls == 1) {
                CHECK_STR(o.t.calls[0].name, "get_weather");
                CHECK(json_equal(o.t.calls[0].arguments, "{\"city\":\"K\xc3\xb8" "benhavn\"}"));
            }
            CHECK_STR(str(&o.reasoning), "User wants weather.");
            CHECK_STR(str(&o.content), "");
        } else {
            /* skipped markers: the channels run together into one text */
            CHECK_EQ_INT(o.t.n_calls, 0);
        }
        out_free(&o);
        loom_ts_free(ts);
    }
    /* the keep list is bounded */
    loom_textstream *ts = NULL;
    CHECK(loom_ts_create(tok, NULL, 0, 1, &ts) == LOOM_OK);
    CHECK(loom_ts_keep_special(ts, keep, LOOM_DETOK_MAX_KEEP + 1) == LOOM_ERR_INVALID_ARG);
    loom_ts_free(ts);
    free(ids);
    loom_tok_free(tok);
}

/* tool_choice "none" bans the tokens that open a call: the syntax's own
 * marker, every syntax's under AUTO, none where the vocabulary has no
 * such token. */
static void test_open_ids(void) {
    loom_tok *tok = NULL;
    CHECKF(loom_tok_load_dir(fixture("qwen3"), &tok) == LOOM_OK, "%s", loom_last_error());
    if (!tok) return;
    int32_t ids[8];
    int n = loom_toolcall_open_ids(LOOM_TC_QWEN, tok, ids, 8);
    CHECK_EQ_INT(n, 1);
    CHECK(n == 1 && ids[0] == loom_tok_token_to_id(tok, "<tool_call>", 11));
    CHECK(loom_toolcall_open_ids(LOOM_TC_AUTO, tok, ids, 8) >= 1);
    CHECK_EQ_INT(loom_toolcall_open_ids(LOOM_TC_MISTRAL, tok, ids, 8), 0);
    loom_tok_free(tok);
}

int main(void) {
    const char *b = getenv("LOOM_BUILD");
    snprintf(fixdir, sizeof fixdir, "%s/fixtures/tokenizers", b && *b ? b : "build");
    test_cases();
    test_many_calls();
    test_garbage();
    test_detect();
    test_harmony_tokens();
    test_open_ids();
    return test_report("test_toolcall");
}
