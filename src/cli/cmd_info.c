/* loom info: what a model directory holds and how loom will run it. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "model/forward.h"
#include "model/model.h"

static const char usage[] =
    "usage: loom info --model DIR\n"
    "\n"
    "Loads the model and prints its architecture, parameter count, weight bytes\n"
    "by dtype, context length and, per layer, the token mixer (full attention,\n"
    "sliding(window), linear) and the MLP kind (MLP or MoE).\n"
    "\n"
    "  --model DIR     Hugging Face model directory (config.json + safetensors)\n";

/* Logical parameters of a tensor: packed quantized words count as the
 * values they hold; their scales and biases are bookkeeping. */
static double tensor_params(const loom_model *m, const loom_st_tensor *t) {
    size_t len = strlen(t->name);
    if (len > 7 && (!strcmp(t->name + len - 7, ".scales") || !strcmp(t->name + len - 7, ".biases")))
        return 0;
    if ((len > 17 && !strcmp(t->name + len - 17, ".weight_scale_inv")) ||
        (len > 13 && !strcmp(t->name + len - 13, ".weight_scale")))
        return 0;
    double n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (double)t->shape[d];
    if (t->dtype == LOOM_DT_U32 && m->cfg.quant_bits > 0) {
        char module[300];
        snprintf(module, sizeof module, "%.*s", (int)(len > 7 ? len - 7 : len), t->name);
        int bits = m->cfg.quant_bits;
        for (int i = 0; i < m->cfg.n_quant_overrides; i++)
            if (!strcmp(m->cfg.quant_overrides[i].path, module) && m->cfg.quant_overrides[i].bits)
                bits = m->cfg.quant_overrides[i].bits;
        n = n * 32.0 / bits;
    }
    return n;
}

static void layer_line(const loom_model *m, int l) {
    const loom_layer *L = &m->layers[l];
    char mixer[64], mlp[64];
    if (L->kind == LOOM_LAYER_LINEAR)
        snprintf(mixer, sizeof mixer, "linear");
    else if (L->kind == LOOM_LAYER_SLIDING)
        snprintf(mixer, sizeof mixer, "sliding(%d)", L->attn.window);
    else
        snprintf(mixer, sizeof mixer, "full");
    if (L->kind != LOOM_LAYER_LINEAR && L->attn.k_eq_v)
        snprintf(mixer + strlen(mixer), sizeof mixer - strlen(mixer), " v=k");
    if (L->kind != LOOM_LAYER_LINEAR && L->attn.kv_layer != l)
        snprintf(mixer + strlen(mixer), sizeof mixer - strlen(mixer), " kv<-%d", L->attn.kv_layer);
    if (L->is_moe)
        snprintf(mlp, sizeof mlp, "MoE(%d experts, top %d%s)", m->cfg.n_experts,
                 m->cfg.n_experts_used, L->moe.shared.gate.rows ? ", shared" : "");
    else if (L->moe_beside)
        snprintf(mlp, sizeof mlp, "MLP(%d) + MoE(%d experts, top %d)", L->mlp.gate.rows,
                 m->cfg.n_experts, m->cfg.n_experts_used);
    else
        snprintf(mlp, sizeof mlp, "MLP(%d)", L->mlp.gate.rows);
    printf("  layer %3d  %-18s %s\n", l, mixer, mlp);
}

/* The sampling defaults generation_config.json gives (generate, chat and
 * serve use them where no flag or request field does). */
static void sampling_line(const loom_model *m) {
    loom_sampling d;
    unsigned set = loom_model_sampling_defaults(m, &d);
    printf("sampling        ");
    if (!set) {
        printf("no defaults in generation_config.json\n");
        return;
    }
    const char *sep = "";
    if (set & LOOM_SAMPLING_TEMPERATURE) printf("%stemperature %g", sep, d.temperature), sep = ", ";
    if (set & LOOM_SAMPLING_TOP_P) printf("%stop_p %g", sep, d.top_p), sep = ", ";
    if (set & LOOM_SAMPLING_TOP_K) printf("%stop_k %d", sep, d.top_k), sep = ", ";
    if (set & LOOM_SAMPLING_MIN_P) printf("%smin_p %g", sep, d.min_p), sep = ", ";
    if (set & LOOM_SAMPLING_REPETITION_PENALTY)
        printf("%srepetition_penalty %g", sep, d.repetition_penalty);
    printf(" (generation_config.json)\n");
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--model")) return cli_usage_error("info", "unknown option \"%s\"", a);
        if (!(v = cli_value("info", argc, argv, &i))) return 2;
        dir = v;
    }
    if (!dir) return cli_usage_error("info", "--model is required");
    loom_model_params mp = loom_model_default_params();
    mp.no_copy = 1; /* metadata only */
    mp.n_threads = 1;
    loom_model *m = NULL;
    loom_status s = loom_model_load(dir, &mp, &m);
    if (s != LOOM_OK) return cli_fail("loading model", s);
    const loom_config *c = &m->cfg;

    double params = 0;
    size_t bytes[LOOM_DT_COUNT] = {0}, total = 0;
    for (int i = 0; i < loom_st_count(m->st); i++) {
        const loom_st_tensor *t = loom_st_at(m->st, i);
        params += tensor_params(m, t);
        bytes[t->dtype] += t->nbytes;
        total += t->nbytes;
    }
    printf("architecture    %s (%s)\n", c->arch, c->model_type);
    printf("parameters      %.0f (%.2fM)\n", params, params / 1e6);
    printf("weight bytes    %zu", total);
    for (int d = 0; d < LOOM_DT_COUNT; d++)
        if (bytes[d]) printf("  %s %zu", loom_dtype_name((loom_dtype)d), bytes[d]);
    printf("\n");
    if (c->quant_bits)
        printf("quantization    MLX affine, %d-bit, group %d (%d module overrides)\n", c->quant_bits,
               c->quant_group, c->n_quant_overrides);
    if (c->fp8 && c->fp8_block[0])
        printf("quantization    FP8 e4m3, %dx%d block scales (%d FP8 weights, %d modules not "
               "converted)\n", c->fp8_block[0], c->fp8_block[1], m->n_f8, c->n_quant_overrides);
    else if (c->fp8)
        printf("quantization    FP8 e4m3, per-channel or per-tensor scales (%d FP8 weights, %d "
               "modules not converted)\n", m->n_f8, c->n_quant_overrides);
    printf("context length  %d\n", c->max_positions);
    sampling_line(m);
    printf("hidden          %d, %d layers, %d heads / %d kv heads, head dim %d, vocab %d\n",
           c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size);
    if (m->n_linear)
        printf("linear attn     %d layers, %d key / %d value heads, dims %d/%d, conv %d, state "
               "%zu bytes per sequence\n", m->n_linear, c->lin_n_k_heads, c->lin_n_v_heads,
               c->lin_k_head_dim, c->lin_v_head_dim, c->lin_conv_kernel, loom_seq_state_bytes(m));
    printf("layers\n");
    for (int l = 0; l < c->n_layers; l++) layer_line(m, l);
    loom_model_free(m);
    return 0;
}
