/* loom tokenize / detokenize / chat-template: the tokenizer and the chat
 * template on their own, for checking parity with the reference. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"

static const char tokenize_usage[] =
    "usage: loom tokenize --tokenizer DIR (--text STR | --text-file F) [--special]\n"
    "\n"
    "Prints the token ids of the text as one JSON array. DIR holds tokenizer.json\n"
    "(and tokenizer_config.json); a model directory works too.\n"
    "\n"
    "  --special   add special tokens (BOS and the like), as add_special_tokens=True\n";

static const char detokenize_usage[] =
    "usage: loom detokenize --tokenizer DIR --ids 1,2,3 [--skip-special]\n"
    "\n"
    "Prints the text of the token ids (decode), without a trailing newline.\n";

static const char template_usage[] =
    "usage: loom chat-template --tokenizer DIR --conversation-file F\n"
    "\n"
    "Renders the model's chat template for the conversation in F, a JSON object\n"
    "{\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, ...}; every\n"
    "other key (enable_thinking, ...) is passed to the template as a variable.\n"
    "add_generation_prompt is true unless given (or continue_final_message is).\n"
    "Prints the rendered text exactly, or exits 1 with the template's error.\n";

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *file = NULL;
    int special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (is_help(a)) {
            fputs(tokenize_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--special")) { special = 1; continue; }
        if (strcmp(a, "--tokenizer") && strcmp(a, "--model") && strcmp(a, "--text") && strcmp(a, "--text-file"))
            return cli_usage_error("tokenize", "unknown option \"%s\"", a);
        if (!(v = cli_value("tokenize", argc, argv, &i))) return 2;
        if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--text-file")) file = v;
        else dir = v;
    }
    if (!dir || !text == !file)
        return cli_usage_error("tokenize", "--tokenizer and one of --text or --text-file are required");
    char *buf = NULL;
    size_t len = text ? strlen(text) : 0;
    loom_status s;
    if (file && (s = loom_read_file(file, &buf, &len))) return cli_fail("reading the text", s);
    loom_tok *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if ((s = loom_tok_load_dir(dir, &tok))) {
        rc = cli_fail("loading the tokenizer", s);
    } else if ((s = loom_tok_encode(tok, file ? buf : text, len, special ? LOOM_TOK_ADD_SPECIAL : LOOM_TOK_NO_SPECIAL,
                                    &ids, &n))) {
        rc = cli_fail("encoding", s);
    } else {
        printf("[");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
        rc = 0;
    }
    free(ids);
    free(buf);
    loom_tok_free(tok);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *ids_text = NULL;
    int skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (is_help(a)) {
            fputs(detokenize_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--skip-special")) { skip = 1; continue; }
        if (strcmp(a, "--tokenizer") && strcmp(a, "--model") && strcmp(a, "--ids"))
            return cli_usage_error("detokenize", "unknown option \"%s\"", a);
        if (!(v = cli_value("detokenize", argc, argv, &i))) return 2;
        if (!strcmp(a, "--ids")) ids_text = v;
        else dir = v;
    }
    if (!dir || !ids_text) return cli_usage_error("detokenize", "--tokenizer and --ids are required");
    int32_t *ids = NULL;
    int n = 0;
    if (ids_text[0] && cli_ids("detokenize", "--ids", ids_text, &ids, &n)) return 2;
    loom_tok *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = 1;
    loom_status s;
    if ((s = loom_tok_load_dir(dir, &tok))) {
        rc = cli_fail("loading the tokenizer", s);
    } else if ((s = loom_tok_decode(tok, ids, (size_t)n, skip, &text, &len))) {
        rc = cli_fail("decoding", s);
    } else {
        fwrite(text, 1, len, stdout);
        rc = 0;
    }
    free(text);
    free(ids);
    loom_tok_free(tok);
    return rc;
}

int cmd_chat_template(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (is_help(a)) {
            fputs(template_usage, stdout);
            return 0;
        }
        if (strcmp(a, "--tokenizer") && strcmp(a, "--model") && strcmp(a, "--conversation-file"))
            return cli_usage_error("chat-template", "unknown option \"%s\"", a);
        if (!(v = cli_value("chat-template", argc, argv, &i))) return 2;
        if (!strcmp(a, "--conversation-file")) file = v;
        else dir = v;
    }
    if (!dir || !file)
        return cli_usage_error("chat-template", "--tokenizer and --conversation-file are required");
    char *text = NULL;
    loom_status s = loom_read_file(file, &text, NULL);
    if (s) return cli_fail("reading the conversation", s);
    cJSON *conv = cJSON_Parse(text);
    free(text);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(conv, "messages");
    if (!cJSON_IsObject(conv) || !cJSON_IsArray(msgs)) {
        cJSON_Delete(conv);
        fprintf(stderr, "loom: error: %s: expected a JSON object with a \"messages\" array\n", file);
        return 1;
    }
    loom_chat_params cp = loom_chat_default_params();
    char *messages = cJSON_PrintUnformatted(msgs);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(conv, "tools");
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(conv, "documents");
    char *tools_json = tools && !cJSON_IsNull(tools) ? cJSON_PrintUnformatted(tools) : NULL;
    char *docs_json = docs && !cJSON_IsNull(docs) ? cJSON_PrintUnformatted(docs) : NULL;
    cp.messages_json = messages;
    cp.tools_json = tools_json;
    cp.documents_json = docs_json;
    /* add_generation_prompt is on unless the file says otherwise (or asks
     * to continue the final message) */
    const cJSON *agp = cJSON_GetObjectItemCaseSensitive(conv, "add_generation_prompt");
    cp.continue_final_message = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conv, "continue_final_message"));
    cp.add_generation_prompt = cJSON_IsBool(agp) ? cJSON_IsTrue(agp) : !cp.continue_final_message;
    /* every other key is a template variable (enable_thinking, ...) */
    cJSON *kw = cJSON_CreateObject();
    for (const cJSON *e = conv->child; e; e = e->next) {
        static const char *known[] = {"messages", "tools", "documents", "add_generation_prompt",
                                      "continue_final_message"};
        int skip = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(known); k++) skip |= !strcmp(e->string, known[k]);
        if (!skip) cJSON_AddItemToObject(kw, e->string, cJSON_Duplicate(e, 1));
    }
    char *kwargs = cJSON_PrintUnformatted(kw);
    cp.kwargs_json = kwargs;
    loom_chat_template *t = NULL;
    char *out = NULL;
    size_t len = 0;
    int rc = 1;
    if ((s = loom_chat_template_load(dir, &t))) {
        rc = cli_fail("loading the chat template", s);
    } else if ((s = loom_chat_apply(t, &cp, &out, &len))) {
        fprintf(stderr, "loom: error: %s\n", loom_last_error());
    } else {
        fwrite(out, 1, len, stdout);
        rc = 0;
    }
    free(out);
    loom_chat_template_free(t);
    free(kwargs);
    cJSON_Delete(kw);
    free(messages);
    free(tools_json);
    free(docs_json);
    cJSON_Delete(conv);
    return rc;
}
