/* loom logits: logits at every prompt position, written as safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/context.h"
#include "load/safetensors.h"
#include "tokenize/tokenizer.h"

static const char usage[] =
    "usage: loom logits --model DIR (--tokens 1,2,3 | --prompt TEXT [--chat]) [--image F ...]\n"
    "                   --out FILE\n"
    "\n"
    "Runs the model over the prompt and writes FILE, a safetensors file with\n"
    "one tensor \"logits\", F32 [L, vocab]: the logits at every position (and\n"
    "\"ids\", I32 [L], the prompt's token ids).\n"
    "\n"
    "  --model DIR     Hugging Face model directory (config.json + safetensors)\n"
    "  --tokens LIST   comma-separated prompt token ids\n"
    "  --prompt TEXT   prompt text, tokenized with the model's tokenizer\n"
    "  --chat          send --prompt as a user message through the chat template\n"
    "  --image FILE    a PNG or JPEG for a vision-language model, once per image in\n"
    "                  prompt order; the prompt holds each image's placeholder tokens\n"
    "  --out FILE      output .safetensors path\n"
    "  --threads N     worker threads (default: all cores)\n";

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *out = NULL, *prompt = NULL;
    int threads = 0, chat = 0, n_images = 0;
    const char *images[CLI_MAX_IMAGES];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        if (strcmp(a, "--model") && strcmp(a, "--tokens") && strcmp(a, "--out") &&
            strcmp(a, "--threads") && strcmp(a, "--prompt") && strcmp(a, "--image"))
            return cli_usage_error("logits", "unknown option \"%s\"", a);
        if (!(v = cli_value("logits", argc, argv, &i))) return 2;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--image")) {
            if (n_images == CLI_MAX_IMAGES)
                return cli_usage_error("logits", "at most %d --image", CLI_MAX_IMAGES);
            images[n_images++] = v;
        }
        else if (cli_int("logits", a, v, 0, 4096, &threads)) return 2;
    }
    if (!model || !out || !tokens == !prompt)
        return cli_usage_error("logits", "--model, --out and one of --tokens or --prompt are required");
    if (chat && !prompt) return cli_usage_error("logits", "--chat needs --prompt");
    int32_t *ids = NULL;
    int n = 0;
    if (tokens && cli_ids("logits", "--tokens", tokens, &ids, &n)) return 2;
    if (prompt) {
        loom_tok *tok = NULL;
        char *rendered = NULL;
        size_t cnt = 0;
        loom_status ts = loom_tok_load_dir(model, &tok);
        char *expanded = NULL;
        size_t len = 0;
        if (!ts && chat) ts = cli_render_user_turn(model, prompt, &rendered);
        if (!ts && n_images)
            ts = cli_vision_expand(model, tok, images, n_images, rendered ? rendered : prompt, &expanded, &len);
        const char *text = expanded ? expanded : rendered ? rendered : prompt;
        if (!ts)
            ts = loom_tok_encode(tok, text, strlen(text), rendered ? LOOM_TOK_NO_SPECIAL : LOOM_TOK_ADD_SPECIAL_CONFIG,
                                 &ids, &cnt);
        free(rendered);
        free(expanded);
        loom_tok_free(tok);
        if (ts) return cli_fail("tokenizing the prompt", ts);
        n = (int)cnt;
        if (!n) {
            free(ids);
            fprintf(stderr, "loom: error: the prompt encodes to no tokens\n");
            return 1;
        }
    }

    int rc = 1;
    loom_model *m = NULL;
    loom_context *c = NULL;
    float *logits = NULL;
    cli_vision cv = {0};
    loom_model_params mp = cli_model_params(threads);
    loom_status s = loom_model_load(model, &mp, &m);
    if (s != LOOM_OK) { rc = cli_fail("loading model", s); goto done; }
    if (n_images && (s = cli_vision_prompt(m, model, ids, n, images, n_images, &cv))) {
        rc = cli_fail("preparing the images", s);
        goto done;
    }
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n;
    cp.n_batch = cli_vision_n_batch(&cv);
    if ((s = loom_context_create(m, &cp, &c))) { rc = cli_fail("creating context", s); goto done; }
    int V = loom_model_vocab_size(m);
    logits = malloc(sizeof(float) * (size_t)n * V);
    if (!logits) { fprintf(stderr, "loom: error: out of memory\n"); goto done; }
    if (n_images) loom_context_prepare(c, &cv.p.in);
    if ((s = loom_context_eval(c, ids, n, 1, logits))) { rc = cli_fail("evaluating", s); goto done; }
    loom_st_write_entry e[2] = {
        {.name = "logits", .dtype = LOOM_DT_F32, .ndim = 2, .shape = {n, V}, .data = logits},
        {.name = "ids", .dtype = LOOM_DT_I32, .ndim = 1, .shape = {n}, .data = ids},
    };
    if ((s = loom_st_write(out, e, 2))) { rc = cli_fail("writing logits", s); goto done; }
    rc = 0;
done:
    cli_vision_free(&cv);
    free(logits);
    free(ids);
    loom_context_free(c);
    loom_model_free(m);
    return rc;
}
