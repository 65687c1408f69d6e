/* loom perplexity: exp(mean negative log-likelihood) of a text file under
 * the model, over independent windows of ctx tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "engine/kv.h"
#include "engine/kvconfig.h"
#include "model/model.h"
#include "tokenize/tokenizer.h"

static const char usage[] =
    "usage: loom perplexity --model DIR --text-file FILE [--ctx N] [--windows N]\n"
    "\n"
    "Tokenizes FILE without special tokens, cuts the first windows x ctx tokens\n"
    "into independent windows, scores tokens 1..ctx-1 of each given its prefix,\n"
    "and prints exp(mean NLL).\n"
    "\n"
    "  --model DIR       Hugging Face model directory\n"
    "  --text-file FILE  UTF-8 text\n"
    "  --ctx N           window length in tokens (default 512)\n"
    "  --windows N       number of windows (default 64; fewer if the text is short)\n"
    "  --kv-type T       KV cache type: f32 (default), f16, bf16, q8, q4\n"
    "  --kv-config FILE  per-layer KV bits (see loom serve --help; default: the\n"
    "                    model directory's kv_config.json, if any)\n"
    "  --threads N       worker threads (default: all cores)\n";

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int ctx = 512, windows = 64, threads = 0;
    loom_kv_type kv_type = LOOM_KV_F32;
    const char *kv_config = NULL;
    char kvc[4096];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--model") && strcmp(a, "--text-file") && strcmp(a, "--ctx") &&
            strcmp(a, "--windows") && strcmp(a, "--threads") && strcmp(a, "--kv-type") &&
            strcmp(a, "--kv-config"))
            return cli_usage_error("perplexity", "unknown option \"%s\"", a);
        if (!(v = cli_value("perplexity", argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--text-file")) file = v;
        else if (!strcmp(a, "--ctx")) bad = cli_int("perplexity", a, v, 2, 1 << 20, &ctx);
        else if (!strcmp(a, "--windows")) bad = cli_int("perplexity", a, v, 1, 1 << 20, &windows);
        else if (!strcmp(a, "--kv-type")) bad = cli_kv_type("perplexity", v, &kv_type);
        else if (!strcmp(a, "--kv-config")) kv_config = v;
        else bad = cli_int("perplexity", a, v, 0, 4096, &threads);
        if (bad) return 2;
    }
    if (!model || !file) return cli_usage_error("perplexity", "--model and --text-file are required");
    kv_config = cli_kv_config(kv_config, model, kvc, sizeof kvc);
    int rc = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    loom_model *m = NULL;
    loom_tok *tok = NULL;
    loom_context *c = NULL;
    size_t len = 0, n = 0;
    loom_status s = loom_read_file(file, &text, &len);
    if (s) { rc = cli_fail("reading text", s); goto done; }
    loom_model_params mp = cli_model_params(threads);
    if ((s = loom_model_load(model, &mp, &m))) { rc = cli_fail("loading model", s); goto done; }
    if ((s = loom_tok_load_dir(model, &tok))) { rc = cli_fail("loading tokenizer", s); goto done; }
    double t0 = loom_now();
    if ((s = loom_tok_encode(tok, text, len, LOOM_TOK_NO_SPECIAL, &ids, &n))) {
        rc = cli_fail("tokenizing", s);
        goto done;
    }
    double t1 = loom_now();
    if ((size_t)windows * (size_t)ctx > n) windows = (int)(n / (size_t)ctx);
    if (windows < 1) {
        fprintf(stderr, "loom: error: %zu tokens is less than one window of %d\n", n, ctx);
        goto done;
    }
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = ctx;
    cp.n_batch = ctx;
    cp.kv_type = kv_type;
    cp.kv_config = kv_config;
    if ((s = loom_context_create(m, &cp, &c))) { rc = cli_fail("context", s); goto done; }
    int V = loom_model_vocab_size(m);
    logits = malloc(sizeof(float) * (size_t)ctx * (size_t)V);
    if (!logits) goto done;
    double nll = 0;
    long count = 0;
    for (int w = 0; w < windows; w++) {
        const int32_t *win = ids + (size_t)w * ctx;
        loom_context_truncate(c, 0);
        if ((s = loom_context_eval(c, win, ctx, 1, logits))) { rc = cli_fail("evaluating", s); goto done; }
        for (int t = 1; t < ctx; t++) {
            const float *row = logits + (size_t)(t - 1) * V;
            double mx = row[0], sum = 0;
            for (int k = 1; k < V; k++) mx = fmax(mx, row[k]);
            for (int k = 0; k < V; k++) sum += exp(row[k] - mx);
            nll += mx + log(sum) - row[win[t]];
            count++;
        }
    }
    double t2 = loom_now();
    size_t per_token = loom_kv_block_bytes(m->cfg.n_layers, loom_model_kv_dim(m), 1, kv_type);
    loom_kv_spec *spec = kv_config ? calloc((size_t)m->cfg.n_layers, sizeof *spec) : NULL;
    if (spec && loom_kv_config_load(kv_config, m->cfg.n_layers, loom_model_kv_dim(m), kv_type, spec) == LOOM_OK)
        per_token = loom_kv_spec_block_bytes(spec, m->cfg.n_layers, loom_model_kv_dim(m), 1);
    free(spec);
    printf("perplexity %.4f over %ld tokens (%d windows of %d), KV %s%s%s: %zu bytes per token\n",
           exp(nll / count), count, windows, ctx, loom_kv_type_name(kv_type),
           kv_config ? " with per-layer " : "", kv_config ? kv_config : "", per_token);
    fprintf(stderr, "tokenized %zu tokens in %.2f s; scored in %.2f s (%.0f tok/s)\n", n, t1 - t0,
            t2 - t1, (double)windows * ctx / (t2 - t1));
    rc = 0;
done:
    free(text);
    free(ids);
    free(logits);
    loom_context_free(c);
    loom_tok_free(tok);
    loom_model_free(m);
    return rc;
}
