/* loom logits: logits at every prompt position, written as safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "load/safetensors.h"

static const char usage[] =
    "usage: loom logits --model DIR --tokens 1,2,3 --out FILE [--threads N]\n"
    "\n"
    "Runs the model over the token ids and writes FILE, a safetensors file with\n"
    "one tensor \"logits\", F32 [L, vocab]: the logits at every position.\n"
    "\n"
    "  --model DIR     Hugging Face model directory (config.json + safetensors)\n"
    "  --tokens LIST   comma-separated prompt token ids\n"
    "  --out FILE      output .safetensors path\n"
    "  --threads N     worker threads (default: all cores)\n";

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *out = NULL;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--model") && strcmp(a, "--tokens") && strcmp(a, "--out") &&
            strcmp(a, "--threads"))
            return cli_usage_error("logits", "unknown option \"%s\"", a);
        if (!(v = cli_value("logits", argc, argv, &i))) return 2;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (cli_int("logits", a, v, 0, 4096, &threads)) return 2;
    }
    if (!model || !tokens || !out)
        return cli_usage_error("logits", "--model, --tokens and --out are required");
    int32_t *ids;
    int n;
    if (cli_ids("logits", "--tokens", tokens, &ids, &n)) return 2;

    int rc = 1;
    loom_model *m = NULL;
    loom_context *c = NULL;
    float *logits = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    loom_status s = loom_model_load(model, &mp, &m);
    if (s != LOOM_OK) { rc = cli_fail("loading model", s); goto done; }
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n;
    if ((s = loom_context_create(m, &cp, &c))) { rc = cli_fail("creating context", s); goto done; }
    int V = loom_model_vocab_size(m);
    logits = malloc(sizeof(float) * (size_t)n * V);
    if (!logits) { fprintf(stderr, "loom: error: out of memory\n"); goto done; }
    if ((s = loom_context_eval(c, ids, n, 1, logits))) { rc = cli_fail("evaluating", s); goto done; }
    loom_st_write_entry e = {.name = "logits", .dtype = LOOM_DT_F32, .ndim = 2,
                             .shape = {n, V}, .data = logits};
    if ((s = loom_st_write(out, &e, 1))) { rc = cli_fail("writing logits", s); goto done; }
    rc = 0;
done:
    free(logits);
    free(ids);
    loom_context_free(c);
    loom_model_free(m);
    return rc;
}
