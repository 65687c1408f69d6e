#!/bin/sh
# loom info on the fixture families: architecture, layer kinds, MoE and
# quantization lines; a bad directory fails with a message.
set -u
LOOM="${LOOM_BUILD:-build}/loom"
fail=0
expect() {  # model-dir needle
  out=$("$LOOM" info --model "tests/fixtures/models/$1" 2>&1)
  case "$out" in
    *"$2"*) ;;
    *) echo "loom info $1: no \"$2\" in:"; echo "$out"; fail=1 ;;
  esac
}
expect gemma2-tiny "Gemma2ForCausalLM"
expect gemma2-tiny "layer   0  sliding(16)"
expect gemma3-tiny "layer   5  full"
expect mistral-tiny-swa "sliding(32)"
expect qwen3moe-tiny "MoE(8 experts, top 2)"
expect qwen3-tiny-mlx4 "MLX affine, 4-bit, group 64"
expect qwen3-tiny-mlx8 "U32"
expect qwen3-tiny-fp8 "FP8 e4m3, 128x128 block scales (20 FP8 weights, 2 modules not converted)"
expect qwen3-tiny-fp8 "F8_E4M3 176128"
expect qwen3.5-tiny-hybrid "layer   0  linear"
expect qwen3next-tiny-hybrid-moe "MoE(8 experts, top 2, shared)"
expect gemma4-tiny "context length  4096"
if "$LOOM" info --model tests/fixtures/models/nope >/dev/null 2>&1; then
  echo "loom info on a missing directory succeeded"; fail=1
fi
exit $fail
