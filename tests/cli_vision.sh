#!/bin/sh
# loom generate / logits with --image on every vision family's fixture
# (Qwen3-VL, Qwen3.5-VL, Qwen2.5-VL, Gemma 3): the 8 greedy tokens of the
# two-image case from the image files themselves (test_cli checks its
# logits); a Gemma prompt whose image straddles the context's 512-token
# chunk is prefilled with the image whole; a placeholder count that does
# not match the images, and --image on a model without a vision tower,
# fail naming what they found.
set -u
LOOM="${LOOM_BUILD:-build}/loom"
fail=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# case 3's prompt of each fixture: two images (C, then D) between texts
QWEN3_IDS=500,320,198,272,155,502,504,504,504,504,503,39,112,353,502,504,504,504,504,504,504,504,504,504,504,504,504,503,91,266,421,258,501,198,500,321,198
GEMMA_IDS=2,105,300,107,272,155,108,505,507,507,507,507,507,507,507,507,507,507,507,507,507,507,507,507,506,108,39,112,353,108,505,507,507,507,507,507,507,507,507,507,507,507,507,507,507,507,507,506,108,91,266,421,258,106,107,105,301,107
QWEN25_IDS=500,320,198,272,155,502,504,504,504,504,503,39,112,353,502,504,504,504,504,504,504,504,504,504,504,504,504,504,504,504,503,91,266,421,258,501,198,500,321,198
run() {  # model-dir expected-ids [ids]
  d=tests/fixtures/models/$1
  IDS=${3:-$QWEN3_IDS}
  out=$("$LOOM" generate --model "$d" --tokens "$IDS" --image "$d/images/C_32x32_rgba.png" \
        --image "$d/images/D_300x200_rgb.png" --max-tokens 8 --temperature 0 --ids 2>/dev/null)
  [ "$out" = "$2" ] || { echo "generate $1 with images: got \"$out\", expected \"$2\""; fail=1; }
  if ! "$LOOM" logits --model "$d" --tokens "$IDS" --image "$d/images/C_32x32_rgba.png" \
       --image "$d/images/D_300x200_rgb.png" --out "$dir/$1.safetensors" >/dev/null 2>&1 ||
     [ ! -s "$dir/$1.safetensors" ]; then
    echo "logits $1 with images failed"; fail=1
  fi
}
run qwen3-vl-tiny "[327, 419, 133, 55, 465, 465, 465, 465]"
run qwen3.5-vl-tiny-hybrid "[390, 305, 49, 212, 390, 406, 350, 358]"
run qwen2.5-vl-tiny "[246, 201, 160, 385, 160, 385, 160, 385]" "$QWEN25_IDS"
run gemma3-vl-tiny "[155, 263, 263, 198, 258, 320, 184, 475]" "$GEMMA_IDS"
# 500 text tokens, then image A's 16 tokens over positions 500..515
d=tests/fixtures/models/gemma3-vl-tiny
long=2$(i=1; while [ $i -lt 500 ]; do printf ',%d' $((3 + i % 400)); i=$((i + 1)); done)
long="$long$(i=0; while [ $i -lt 16 ]; do printf ',507'; i=$((i + 1)); done),506,108"
if ! out=$("$LOOM" generate --model "$d" --tokens "$long" --image "$d/images/A_64x48_rgb.png" \
           --max-tokens 1 --temperature 0 --ids 2>&1); then
  echo "gemma image across the 512-token chunk: $out"; fail=1
fi
IDS=$QWEN3_IDS
# a PNG whose header claims 100000 x 100000: refused from the header, the
# message naming the file once and the size
printf '\211PNG\r\n\032\n\000\000\000\rIHDR\000\001\206\240\000\001\206\240\010\002\000\000\000\000\000\000\000' \
  >"$dir/claim.png"
err=$("$LOOM" generate --model "$d" --tokens "$GEMMA_IDS" --image "$dir/claim.png" \
      --image "$dir/claim.png" --max-tokens 1 2>&1)
case "$err" in
  *"claim.png: PNG: image is 100000x100000"*) ;;
  *) echo "a 100000x100000 PNG: no error naming its size in: $err"; fail=1 ;;
esac
d=tests/fixtures/models/qwen3-vl-tiny
err=$("$LOOM" generate --model "$d" --tokens "$IDS" --image "$d/images/C_32x32_rgba.png" \
      --max-tokens 1 2>&1)
case "$err" in
  *"16 image placeholder tokens"*"need 4"*) ;;
  *) echo "one image for 16 placeholders: no count error in: $err"; fail=1 ;;
esac
err=$("$LOOM" logits --model tests/fixtures/models/qwen3-tiny --tokens 1,2 \
      --image "$d/images/A_64x48_rgb.png" --out "$dir/x.safetensors" 2>&1)
case "$err" in
  *"no vision tower"*) ;;
  *) echo "--image on a text model: no error naming it in: $err"; fail=1 ;;
esac
exit $fail
