#!/bin/sh
# bench/cuda_kernel_times.sh: where a step's time goes, kernel by kernel.
# Runs `loom bench` under Nsight Compute with only the kernel duration
# collected (clocks and caches left alone), then sums the durations by
# kernel name and by (kernel, grid, block). ncu runs the kernels one after
# another, so these are each kernel's own times, without launch gaps or
# overlap (programmatic dependent launch): what each would cost if the step
# were only its kernels.
#
#   sh bench/cuda_kernel_times.sh LOOM MODEL_DIR tg [tokens, default 16]
#       batch-1 decode of that many tokens after a 128-token prompt, every
#       decode-path kernel of the run (KT_LAUNCHES, default 1500, at most)
#   sh bench/cuda_kernel_times.sh LOOM MODEL_DIR prefill [tokens, default 4096]
#       the last (timed) prefill of a prompt of that many tokens
#   sh bench/cuda_kernel_times.sh LOOM MODEL_DIR decode [batch, default 32]
#       the last decode step of the whole batch
#
# Environment: NCU (default: ncu on PATH, else under /usr/local/cuda/bin or
# /opt/nvidia), KT_LAUNCHES.
set -u
LOOM=$1
MODEL=$2
MODE=${3:-tg}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then
  echo "cuda_kernel_times: no ncu found"
  exit 2
fi
ROWS=""
KSEL=""
case $MODE in
tg)
  KSEL='regex:gemv|qkv_post|attn_decode|argmax|embed|combine'
  set -- -p 0 -n "${4:-16}" --tg-prompt 128 ;;
prefill)
  # the warm-up prefill, then the timed one (the last step)
  set -- -p "${4:-4096}" -n 0 ;;
decode)
  # a few decode steps after the prompts' prefill (which may come in two
  # parts, so that the steps after it are staggered): the last step of the
  # whole batch is kept
  ROWS=${4:-32}
  set -- -p 0 -n 6 --tg-prompt 128 --batch "$ROWS" ;;
*)
  echo "cuda_kernel_times: mode is tg, prefill or decode, not \"$MODE\""
  exit 2 ;;
esac
tmp=${TMPDIR:-/tmp}/kt.$$
if [ -n "$KSEL" ]; then
  set -- -k "$KSEL" --launch-count "${KT_LAUNCHES:-1500}" --log-file "$tmp.csv" \
    "$LOOM" bench --device cuda --model "$MODEL" "$@" --reps 1 --kv-type bf16
else
  set -- --log-file "$tmp.csv" "$LOOM" bench --device cuda --model "$MODEL" "$@" --reps 1 \
    --kv-type bf16
fi
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --print-units base "$@" >"$tmp.out" 2>&1
rc=$?
tail -n 3 "$tmp.out"
python3 "$(dirname "$0")/kernel_times.py" "$tmp.csv" "$MODE" "$ROWS"
rm -f "$tmp.csv" "$tmp.out"
exit $rc
