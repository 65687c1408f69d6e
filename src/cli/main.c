/* loom command-line interface: dispatches to one command per file. */
#include <stdio.h>
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
};

static void usage(FILE *f) {
    fprintf(f, "usage: loom <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'loom <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
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
