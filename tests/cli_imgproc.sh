#!/bin/sh
# loom imgproc on the vision fixtures: sizes, grids and token counts as the
# HF processors give them; --out writes the tensors; bad input fails with
# a message and exit code 1, a usage error with 2.
set -u
LOOM="${LOOM_BUILD:-build}/loom"
V=tests/fixtures/vision
fail=0
expect() {  # model image needle
  out=$("$LOOM" imgproc --model "$V/$1" --image "$V/images/$2" 2>&1)
  case "$out" in
    *"$3"*) ;;
    *) echo "loom imgproc $1 $2: no \"$3\" in:"; echo "$out"; fail=1 ;;
  esac
}
expect qwen3-vl D_300x200_rgb.png "300x200 -> 128x96, grid 1x6x8, 12 tokens, pixel_values [48, 1536]"
expect qwen2.5-vl B_100x70_noisy_q90.jpg "100x70 -> 112x56, grid 1x4x8, 8 tokens, pixel_values [32, 1176]"
expect gemma3-vl C_32x32_rgba.png "32x32 -> 112x112, grid 1x1x1, 16 tokens, pixel_values [3, 112, 112]"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$LOOM" imgproc --model "$V/qwen3-vl" --image "$V/images/C_32x32_rgba.png" \
    --image "$V/images/D_300x200_rgb.png" --out "$tmp/pv.safetensors" >/dev/null; then
  echo "loom imgproc --out failed"; fail=1
fi
# 64 rows of 1536 floats and a [2, 3] grid after the header
size=$(wc -c <"$tmp/pv.safetensors" 2>/dev/null || echo 0)
if [ "$size" -lt $((64 * 1536 * 4 + 48)) ] || [ "$size" -gt $((64 * 1536 * 4 + 48 + 512)) ]; then
  echo "loom imgproc --out: $size bytes"; fail=1
fi
# --pil: the PIL processor's values, a level off here and there for A
"$LOOM" imgproc --model "$V/gemma3-vl" --image "$V/images/A_64x48_rgb.png" --out "$tmp/tv.st" >/dev/null &&
  "$LOOM" imgproc --model "$V/gemma3-vl" --image "$V/images/A_64x48_rgb.png" --out "$tmp/pil.st" --pil >/dev/null ||
  { echo "loom imgproc --pil failed"; fail=1; }
if cmp -s "$tmp/tv.st" "$tmp/pil.st"; then echo "loom imgproc --pil wrote the torchvision values"; fail=1; fi
printf 'not an image' >"$tmp/x.png"
out=$("$LOOM" imgproc --model "$V/qwen3-vl" --image "$tmp/x.png" 2>&1)
[ $? -eq 1 ] && case "$out" in *"expected PNG"*) ;; *) false ;; esac || { echo "bad image: $out"; fail=1; }
out=$("$LOOM" imgproc --model "$V/images" --image "$V/images/A_64x48_rgb.png" 2>&1)
[ $? -eq 1 ] && case "$out" in *preprocessor_config.json*) ;; *) false ;; esac || { echo "no config: $out"; fail=1; }
"$LOOM" imgproc --model "$V/qwen3-vl" >/dev/null 2>&1
[ $? -eq 2 ] || { echo "no --image: not a usage error"; fail=1; }
exit $fail
