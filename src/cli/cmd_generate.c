/* loom generate: continue a prompt with the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "engine/context.h"
#include "sample/sample.h"
#include "stream/textstream.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"

static const char usage[] =
    "usage: loom generate --model DIR (--prompt TEXT | --tokens 1,2,3) [options]\n"
    "\n"
    "Generates a continuation of the prompt. With --prompt the text streams to\n"
    "stdout as it is produced; with --tokens the ids do. With --ids the\n"
    "generated ids are printed as one JSON array on the last line of stdout.\n"
    "Timings go to stderr.\n"
    "\n"
    "  --model DIR        Hugging Face model directory\n"
    "  --prompt TEXT      prompt text (tokenized with the model's tokenizer)\n"
    "  --chat             send --prompt as a user message through the chat template\n"
    "  --tokens LIST      comma-separated prompt token ids\n"
    "  --stop TEXT        stop when TEXT is generated (repeatable)\n"
    "  --max-tokens N     tokens to generate (default 64)\n"
    "  --temperature T    0 = greedy (default 0.8)\n"
    "  --top-k K          keep the K most likely tokens (default 40, 0 = off)\n"
    "  --top-p P          nucleus sampling mass (default 0.95)\n"
    "  --min-p P          drop tokens under P x the top probability (default 0)\n"
    "  --repeat-penalty R penalise tokens of the last 64 (default 1 = off)\n"
    "                     (the five defaults: the model's generation_config.json\n"
    "                     where it gives them, else the values above)\n"
    "  --seed S           random seed (default 1)\n"
    "  --ignore-eos       do not stop at end-of-sequence ids\n"
    "  --ids              print the generated ids as a JSON array\n"
    "  --ctx-size N       context length (default: prompt + max tokens)\n"
    "  --kv-type T        KV cache type: f32 (default), f16, bf16, q8, q4\n"
    "  --kv-config FILE   per-layer KV bits (see loom serve --help; default: the\n"
    "                     model directory's kv_config.json, if any)\n"
    "  --image FILE       a PNG or JPEG for a vision-language model, once per image\n"
    "                     in prompt order; the prompt holds each image's placeholders\n"
    "  --threads N        worker threads (default: all cores)\n";

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *prompt_text = NULL;
    const char *stops[16];
    int n_stops = 0, n_images = 0;
    const char *images[CLI_MAX_IMAGES];
    int threads = 0, max_tokens = 64, ignore_eos = 0, json_ids = 0, n_ctx = 0, seed = 1, chat = 0;
    loom_kv_type kv_type = LOOM_KV_F32;
    const char *kv_config = NULL;
    char kvc[4096];
    loom_sampling sp = loom_sampling_default();
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    unsigned sp_set = 0;  /* LOOM_SAMPLING_* bits the flags give */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--ignore-eos")) { ignore_eos = 1; continue; }
        if (!strcmp(a, "--ids")) { json_ids = 1; continue; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        static const char *valued[] = {"--model", "--tokens", "--max-tokens", "--temperature",
                                       "--top-k", "--top-p", "--min-p", "--seed", "--ctx-size",
                                       "--threads", "--prompt", "--stop", "--repeat-penalty",
                                       "--kv-type", "--kv-config", "--image"};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("generate", "unknown option \"%s\"", a);
        if (!(v = cli_value("generate", argc, argv, &i))) return 2;
        int bad = cli_sampling_flag("generate", a, v, &sp, &sp_set);
        if (bad >= 0) {
            if (bad) return 2;
            continue;
        }
        bad = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--prompt")) prompt_text = v;
        else if (!strcmp(a, "--stop")) {
            if (n_stops == 16) return cli_usage_error("generate", "at most 16 --stop strings");
            stops[n_stops++] = v;
        }
        else if (!strcmp(a, "--max-tokens")) bad = cli_int("generate", a, v, 0, 1 << 24, &max_tokens);
        else if (!strcmp(a, "--seed")) bad = cli_int("generate", a, v, 0, 1 << 30, &seed);
        else if (!strcmp(a, "--ctx-size")) bad = cli_int("generate", a, v, 1, 1 << 24, &n_ctx);
        else if (!strcmp(a, "--kv-type")) bad = cli_kv_type("generate", v, &kv_type);
        else if (!strcmp(a, "--kv-config")) kv_config = v;
        else if (!strcmp(a, "--image")) {
            if (n_images == CLI_MAX_IMAGES)
                return cli_usage_error("generate", "at most %d --image", CLI_MAX_IMAGES);
            images[n_images++] = v;
        }
        else bad = cli_int("generate", a, v, 0, 4096, &threads);
        if (bad) return 2;
    }
    if (!model || !tokens == !prompt_text)
        return cli_usage_error("generate", "--model and one of --prompt or --tokens are required");
    sp.seed = (uint64_t)seed;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (tokens && cli_ids("generate", "--tokens", tokens, &prompt, &n_prompt)) return 2;

    int rc = 1;
    loom_tok *tok = NULL;
    loom_textstream *ts = NULL;
    loom_model *m = NULL;
    loom_context *c = NULL;
    loom_sampler smp = {0};
    float *logits = NULL;
    cli_vision cv = {0};
    int32_t *out = malloc(sizeof *out * (size_t)(max_tokens + 1));
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    mp.device = cli_device;
    mp.fast_matmul = cli_fast;
    loom_status s = loom_model_load(model, &mp, &m);
    if (s != LOOM_OK) { rc = cli_fail("loading model", s); goto done; }
    loom_sampling gen;
    loom_sampling_apply(&sp, &gen, loom_model_sampling_defaults(m, &gen) & ~sp_set);
    if (prompt_text || n_stops) {
        if ((s = loom_tok_load_dir(model, &tok))) { rc = cli_fail("loading tokenizer", s); goto done; }
        if ((s = loom_ts_create(tok, stops, n_stops, 1, &ts))) { rc = cli_fail("stop strings", s); goto done; }
    }
    if (chat && !prompt_text) {
        rc = cli_usage_error("generate", "--chat needs --prompt");
        goto done;
    }
    int32_t turn_end[8];
    int n_turn_end = 0;
    if (prompt_text) {
        size_t n = 0;
        char *rendered = NULL;
        if (chat) {
            if ((s = cli_render_user_turn(model, prompt_text, &rendered))) { rc = cli_fail("chat template", s); goto done; }
            n_turn_end = loom_tok_turn_end_ids(tok, turn_end, 8);
        }
        s = rendered ? loom_tok_encode(tok, rendered, strlen(rendered), LOOM_TOK_NO_SPECIAL, &prompt, &n)
                     : loom_tok_encode(tok, prompt_text, strlen(prompt_text), LOOM_TOK_ADD_SPECIAL_CONFIG, &prompt, &n);
        free(rendered);
        if (s) { rc = cli_fail("tokenizing the prompt", s); goto done; }
        n_prompt = (int)n;
        if (!n_prompt) { fprintf(stderr, "loom: error: the prompt encodes to no tokens\n"); goto done; }
        int ctx = LOOM_MIN(n_prompt, 4);
        loom_ts_prime(ts, prompt + n_prompt - ctx, (size_t)ctx);
    }
    double t_img = loom_now();
    if (n_images && (s = cli_vision_prompt(m, model, prompt, n_prompt, images, n_images, &cv))) {
        rc = cli_fail("preparing the images", s);
        goto done;
    }
    t_img = loom_now() - t_img;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n_ctx ? n_ctx : n_prompt + max_tokens;
    cp.n_batch = cli_vision_n_batch(&cv);
    cp.kv_type = kv_type;
    cp.kv_config = cli_kv_config(kv_config, model, kvc, sizeof kvc);
    if ((s = loom_context_create(m, &cp, &c))) { rc = cli_fail("creating context", s); goto done; }
    int V = loom_model_vocab_size(m);
    int32_t eos[16];
    int n_eos = ignore_eos ? 0 : LOOM_MIN(loom_model_eos_ids(m, eos, 16), 16);
    logits = malloc(sizeof(float) * (size_t)V);
    if (!logits || !out) {
        fprintf(stderr, "loom: error: out of memory\n");
        goto done;
    }
    if ((s = loom_sampler_init(&smp, &sp, V))) { rc = cli_fail("sampling", s); goto done; }
    /* the penalty window sees the prompt, then each token, as the server's */
    for (int k = 0; k < n_prompt; k++) loom_sampler_accept(&smp, prompt[k], 0);
    double t0 = loom_now();
    int32_t id = 0;
    if (n_images) loom_context_prepare(c, &cv.p.in);
    /* with no token to make, the prompt still runs (its timing is reported) */
    s = max_tokens > 0 ? loom_context_eval_next(c, prompt, n_prompt, &smp, logits, &id)
                       : loom_context_eval(c, prompt, n_prompt, 0, NULL);
    if (s) { rc = cli_fail("prompt", s); goto done; }
    double t1 = loom_now();
    int n_out = 0;
    while (n_out < max_tokens) {
        loom_sampler_accept(&smp, id, 1);
        out[n_out++] = id;
        int stop = 0;
        if (ts) {
            const char *text;
            size_t len;
            loom_ts_push(ts, id, &text, &len, &stop);
            if (prompt_text && !json_ids) fwrite(text, 1, len, stdout);
            fflush(stdout);
        } else if (!json_ids) {
            printf("%s%d", n_out > 1 ? " " : "", id);
            fflush(stdout);
        }
        for (int k = 0; k < n_eos; k++) stop |= eos[k] == id;
        for (int k = 0; k < n_turn_end && !ignore_eos; k++) stop |= turn_end[k] == id;
        if (stop || n_out == max_tokens) break;
        if ((s = loom_context_eval_next(c, &id, 1, &smp, logits, &id))) { rc = cli_fail("decode", s); goto done; }
    }
    double t2 = loom_now();
    if (ts) {
        const char *text;
        size_t len;
        int stopped;
        loom_ts_finish(ts, &text, &len, &stopped);
        if (prompt_text && !json_ids) fwrite(text, 1, len, stdout);
    }
    if (prompt_text && !json_ids) {
        printf("\n");
    } else if (json_ids) {
        printf("[");
        for (int k = 0; k < n_out; k++) printf("%s%d", k ? ", " : "", out[k]);
        printf("]\n");
    } else if (!prompt_text) {
        printf("\n");
    }
    fflush(stdout);
    if (n_images) fprintf(stderr, "images: %d decoded, preprocessed and encoded in %.3f s\n", n_images, t_img);
    fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s "
            "(%.1f tok/s)\n", n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-12), n_out, t2 - t1,
            n_out > 1 ? (n_out - 1) / (t2 - t1 + 1e-12) : 0.0);
    rc = 0;
done:
    cli_vision_free(&cv);
    loom_ts_free(ts);
    loom_tok_free(tok);
    loom_sampler_free(&smp);
    free(logits);
    free(out);
    free(prompt);
    loom_context_free(c);
    loom_model_free(m);
    return rc;
}
