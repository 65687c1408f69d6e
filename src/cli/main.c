/* loom command-line interface: dispatches to one command per file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "continue a prompt"},
    {"logits", cmd_logits, "write the logits at every prompt position"},
    {"serve", cmd_serve, "serve an OpenAI-compatible HTTP API"},
    {"batch", cmd_batch, "run a file of requests (OpenAI Batch API lines)"},
    {"tokenize", cmd_tokenize, "text -> token ids"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"chat-template", cmd_chat_template, "render a conversation with the model's chat template"},
    {"chat", cmd_chat, "chat in the terminal"},
    {"perplexity", cmd_perplexity, "perplexity of a text file"},
    {"info", cmd_info, "describe a model: architecture, sizes, layer kinds"},
    {"convert", cmd_convert, "quantize a checkpoint (MLX affine, 8/4 bits)"},
    {"bench", cmd_bench, "prefill and decode throughput (llama-bench style)"},
    {"imgproc", cmd_imgproc, "run a vision model's image processor on image files"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: loom <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'loom <command> --help' describes a command's options. Commands that load a\n"
               "model also take --device cpu|cuda[:N] (CUDA builds: make CUDA=1; cuda:N,M,...\n"
               "or --tensor-parallel N splits the model over several GPUs) and --fast\n"
               "(CPU: activations rounded to 8 bits for quantized weights and to bf16 for bf16\n"
               "weights in the matmuls, where the CPU has instructions for it; logits then\n"
               "differ from the exact default by about 1e-3), and --quantize 8|4 (CPU: a float\n"
               "checkpoint quantized at load, as 'loom convert --bits N' writes it).\n");
}

/* "N" or "N,M,...": the first device, and a list of more than one the
 * ranks of a split model; 0 when it is neither. */
static int device_list(const char *v) {
    int n = 0;
    for (const char *p = v;; p++) {
        char *end = NULL;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d > 1023 || n == 8) return 0;
        cli_tp_devices[n++] = (int)d;
        p = end;
        if (*p == 0) break;
        if (*p != ',') return 0;
    }
    cli_device = cli_tp_devices[0];
    cli_tp_list = n > 1;
    if (n > 1) cli_tp = n;
    return 1;
}

/* Takes --tensor-parallel N out of argv (any position); returns 0 or a
 * usage error (N against a device list that names another count). */
static int take_tp(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--tensor-parallel")) continue;
        const char *v = i + 1 < *argc ? argv[i + 1] : "";
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (!*v || *end || n < 1 || n > 8 || (cli_tp_list && n != cli_tp)) {
            fprintf(stderr, "loom: --tensor-parallel: expected 1 to 8 ranks%s, found \"%s\"\n",
                    cli_tp_list ? " (as many as --device lists)" : "", v);
            return 2;
        }
        cli_tp = (int)n;
        memmove(&argv[i], &argv[i + 2], sizeof *argv * (size_t)(*argc - i - 1));
        *argc -= 2;
        i--;
    }
    return 0;
}

/* Takes --device out of argv (any position); returns 0 or a usage error. */
static int take_device(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--device")) continue;
        if (i + 1 >= *argc) {
            fprintf(stderr, "loom: --device needs a value (cpu, cuda or cuda:N)\n");
            return 2;
        }
        const char *v = argv[i + 1];
        if (!strcmp(v, "cpu")) cli_device = -1;
        else if (!strcmp(v, "cuda")) cli_device = 0;
        else if (!strncmp(v, "cuda:", 5) && device_list(v + 5)) {
        } else {
            fprintf(stderr, "loom: --device: expected cpu, cuda, cuda:N or cuda:N,M,... (at most 8), "
                    "found \"%s\"\n", v);
            return 2;
        }
        memmove(&argv[i], &argv[i + 2], sizeof *argv * (size_t)(*argc - i - 1));
        *argc -= 2;
        i--;
    }
    return 0;
}

/* Takes --fast out of argv (any position). */
static void take_fast(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--fast")) continue;
        cli_fast = 1;
        memmove(&argv[i], &argv[i + 1], sizeof *argv * (size_t)(*argc - i));
        (*argc)--;
        i--;
    }
}

/* Takes --quantize N out of argv (any position); returns 0 or a usage error. */
static int take_quantize(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--quantize")) continue;
        const char *v = i + 1 < *argc ? argv[i + 1] : "";
        if (strcmp(v, "8") && strcmp(v, "4")) {
            fprintf(stderr, "loom: --quantize: expected 8 or 4, found \"%s\"\n", v);
            return 2;
        }
        cli_quantize = atoi(v);
        memmove(&argv[i], &argv[i + 2], sizeof *argv * (size_t)(*argc - i - 1));
        *argc -= 2;
        i--;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (take_device(&argc, argv) || take_quantize(&argc, argv) || take_tp(&argc, argv)) return 2;
    take_fast(&argc, argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "loom: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
