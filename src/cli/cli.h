/* cli: shared helpers for the loom commands. Commands print results to
 * stdout, diagnostics to stderr, and return the process exit code:
 * 0 ok, 1 runtime error, 2 usage error. */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "tokenize/tokenizer.h"
#include "vision/vision.h"

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_imgproc(int argc, char **argv);

/* --device, taken out of argv by main before a command runs: -1 = CPU,
 * n = CUDA device n. Commands that load a model pass it on. */
extern int cli_device;
/* --fast, taken out of argv by main: loom_model_params.fast_matmul. */
extern int cli_fast;
/* --quantize N, taken out of argv by main: loom_model_params.quantize_bits. */
extern int cli_quantize;
/* --tensor-parallel N or --device cuda:A,B,...: loom_model_params'
 * tensor_parallel and (for a list) tp_devices; 0 = one device. */
extern int cli_tp;
extern int cli_tp_list;          /* 1: the devices came as a list */
extern int cli_tp_devices[8];
/* The model parameters of a command that runs the model: threads, with
 * --device and --fast as main took them. */
loom_model_params cli_model_params(int threads);

/* Reports a failed loom call ("loom: error: <what>: <last error>"), returns 1. */
int cli_fail(const char *what, loom_status s);
/* Reports a usage error for command cmd, returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Option value parsing; each reports a usage error and returns nonzero
 * when the text is not a valid value. */
int cli_int(const char *cmd, const char *opt, const char *text, int lo, int hi, int *out);
int cli_float(const char *cmd, const char *opt, const char *text, float *out);
/* --temperature, --top-p, --top-k, --min-p or --repeat-penalty: parses text
 * into its field of sp, range-checked as the sampler checks it, and sets the
 * field's LOOM_SAMPLING_* bit in *set. Returns -1 when opt is none of them. */
int cli_sampling_flag(const char *cmd, const char *opt, const char *text, loom_sampling *sp,
                      unsigned *set);
/* --speculative ngram, --draft-model DIR or --draft-tokens K: sets p's
 * speculative and draft_tokens, and *draft_dir for the caller to load (it
 * then sets draft_model). Returns -1 when opt is none of them, else 0 or
 * a usage error's 2. */
int cli_spec_flag(const char *cmd, const char *opt, const char *text, loom_engine_params *p,
                  const char **draft_dir);
#define CLI_SPEC_FLAGS "--speculative", "--draft-model", "--draft-tokens", "--spec-gate", "--draft-exact"
#define CLI_SPEC_USAGE                                                                     \
    "  --speculative ngram  speculative decoding by prompt lookup: proposals copied\n"     \
    "                     from what followed the last 3, 2 or 1 tokens earlier on\n"      \
    "  --draft-model DIR  speculative decoding with a draft model (same tokenizer)\n"    \
    "  --draft-tokens K   proposals a sequence verifies per step at most (default 8);\n" \
    "                     the output is that of plain decoding (CPU only)\n"        \
    "  --spec-gate on|off on (default): steps at a batch size where speculating\n"     \
    "                     measured slower than plain decoding carry no proposals\n"     \
    "  --draft-exact on|off off (default): the drafter (a draft model or a DFlash\n"     \
    "                     drafter) multiplies over 8-bit copies with the integer\n"       \
    "                     kernels where the CPU has them\n"


/* Parses "1,2,3" into a malloc'd array. */
int cli_ids(const char *cmd, const char *opt, const char *text, int32_t **out, int *n);

/* Parses a KV type name (f32, f16, bf16, q8, q4). */
int cli_kv_type(const char *cmd, const char *text, loom_kv_type *out);

/* The per-layer KV config to use: the --kv-config path when given, else
 * model_dir/kv_config.json when that exists (joined into buf), else NULL. */
const char *cli_kv_config(const char *given, const char *model_dir, char *buf, size_t cap);

/* Renders one user message through the model directory's chat template
 * (with the generation prompt) into a heap string. */
loom_status cli_render_user_turn(const char *model_dir, const char *text, char **out);

/* --image FILE ... for a vision-language model: the tower and the
 * prepared prompt of ids (placeholders already repeated) with the images
 * spliced in (vision/vision.h). */
typedef struct cli_vision {
    loom_vision *v;
    loom_vision_prompt p;
} cli_vision;
#define CLI_MAX_IMAGES 16
loom_status cli_vision_prompt(loom_model *m, const char *model_dir, const int32_t *ids, int n,
                              const char *const *files, int n_files, cli_vision *out);
void cli_vision_free(cli_vision *cv);
/* text with each image's marker (as the chat template writes it) expanded
 * to the image's tokens, as the server does (vision/imgprompt.h), into
 * *out (malloc'd); markers already expanded are kept. */
loom_status cli_vision_expand(const char *model_dir, const loom_tok *tok, const char *const *files,
                              int n_files, const char *text, char **out, size_t *out_len);
/* The n_batch a context prefilling cv's prompt takes: 0 (the default)
 * unless the default's chunks would cut an image's bidirectional span. */
int cli_vision_n_batch(const cli_vision *cv);

/* Returns the value of option argv[*i] (advancing *i), or NULL after
 * reporting that it is missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

#endif
