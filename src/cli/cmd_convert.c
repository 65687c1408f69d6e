/* loom convert: MLX affine quantization of a Hugging Face checkpoint. */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "load/quantize.h"

static const char usage[] =
    "usage: loom convert --model DIR --bits 8|4 [--group-size 64] --out DIR2 [--force]\n"
    "                    [--pack-f32]\n"
    "\n"
    "Writes an MLX-format affine-quantized copy of an F32/F16/BF16 checkpoint,\n"
    "laid out as `mlx_lm.convert -q` writes it: every 2-D weight of a linear\n"
    "layer or embedding whose input dimension divides into groups becomes a\n"
    "packed U32 .weight with BF16 .scales and .biases (F16 for an F16\n"
    "checkpoint); other float tensors are written as BF16 (F16); config.json\n"
    "gains \"quantization\" and \"quantization_config\"; tokenizer files and\n"
    "generation_config.json are copied.\n"
    "\n"
    "  --model DIR        source model directory\n"
    "  --out DIR2         output directory (created; must be empty)\n"
    "  --bits B           bits per weight: 8, 4 or 2\n"
    "  --group-size G     weights per scale/bias: 32, 64 (default) or 128\n"
    "  --force            write into a non-empty output directory\n"
    "  --pack-f32         compute the levels with the unrounded f32 scale and bias,\n"
    "                     as MLX's quantize kernels do (default: with the stored\n"
    "                     BF16 scale and bias, as the MLX checkpoints in\n"
    "                     tests/fixtures are packed; they differ for values near\n"
    "                     a half step)\n";

int cmd_convert(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    loom_convert_params p = {.bits = 0, .group = 64, .force = 0, .pack = LOOM_QPACK_STORED};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--force")) { p.force = 1; continue; }
        if (!strcmp(a, "--pack-f32")) { p.pack = LOOM_QPACK_F32; continue; }
        static const char *valued[] = {"--model", "--out", "--bits", "--group-size"};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("convert", "unknown option \"%s\"", a);
        if (!(v = cli_value("convert", argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--bits")) bad = cli_int("convert", a, v, 1, 64, &p.bits);
        else bad = cli_int("convert", a, v, 1, 1 << 20, &p.group);
        if (bad) return 2;
    }
    if (!model || !out || !p.bits)
        return cli_usage_error("convert", "--model, --bits and --out are required");
    if (p.bits != 2 && p.bits != 4 && p.bits != 8)
        return cli_usage_error("convert", "--bits must be 8, 4 or 2 (got %d)", p.bits);
    if (p.group != 32 && p.group != 64 && p.group != 128)
        return cli_usage_error("convert", "--group-size must be 32, 64 or 128 (got %d)", p.group);
    loom_convert_stats st;
    double t0 = loom_now();
    loom_status s = loom_convert_model(model, out, &p, &st);
    if (s) return cli_fail("convert", s);
    fprintf(stderr, "loom: %s -> %s: %d weights packed at %d bits (group %d), %d tensors "
            "copied; %.1f MiB -> %.1f MiB in %.2f s\n", model, out, st.n_quantized, p.bits,
            p.group, st.n_copied, (double)st.bytes_in / (1 << 20),
            (double)st.bytes_out / (1 << 20), loom_now() - t0);
    return 0;
}
