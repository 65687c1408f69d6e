#!/bin/sh
# bench/cuda_round.sh: one device call's worth of GPU work, in order of
# need, each step under its own time limit:
#   0. builds everything, then writes the random models in the background;
#   1. tools/cuda_check.sh (parity; its log in $OUT/check.txt);
#   2. with GEMV=1, bench/cuda_gemv (the decode GEMV's variants alone and
#      over whole layers; $OUT/gemv.txt); with DELTA=1, bench/cuda_delta
#      (the delta rule token by token against chunked; $OUT/delta.txt);
#   3. bench/cuda_bench.sh (loom only, LOOM_BENCH_BATCH default 1,32;
#      $OUT/bench.txt);
#   4. a 4096-token prefill (`loom bench -p 4096 -n 0 --reps 3`) under the
#      settings in AB (space-separated VAR=value groups, '|' between them),
#      on the models in AB_MODELS (default both); then decode (`loom bench
#      -p 0 -n 128 --tg-prompt 128 --batch 1 --reps 3`; batch list
#      AB_TG_BATCH) under the settings in AB_TG on the models in
#      AB_TG_MODELS (default both);
#   5. bench/cuda_kernel_times.sh on each model in KT_MODELS (batch-1
#      decode), PT_MODELS (prefill) and PT_DECODE (a batch-32 decode step).
# Steps 4 and 5 are skipped once ROUND_BUDGET seconds (default 400) would
# be overrun. CHECK=0 skips step 1 and BENCH=0 step 3; an AB or AB_TG group
# `default` runs without settings; STEP_TIMES=1 runs the AB_TG decodes with
# LOOM_CUDA_STEP_TIMES=1 and prints where their steps' wall time goes
# (forward_cuda.cu). Environment: OUT (default /tmp/loom-round), BUILD
# (build/cc), CC, LOOM_BENCH_* as bench/cuda_bench.sh.
#
#   CHECK=0 BENCH=0 STEP_TIMES=1 AB_TG_MODELS=qwen3-0.6b \
#     AB_TG="default|LOOM_CUDA_GEMV_PRE2=0" sh bench/cuda_round.sh
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/loom-round}
B=${BUILD:-build/cc}
BUDGET=${ROUND_BUDGET:-400}
DIR=${LOOM_BENCH_DIR:-/tmp/loom-cuda}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }

el "build"
make -s -j"$(nproc)" BUILD="$B" CUDA=1 cuda-tests "$B/loom" "$B/tools/gen_model" "$B/bench/cuda_gemv" \
  "$B/bench/cuda_delta" >"$OUT/make.txt" 2>&1 || tail -n 30 "$OUT/make.txt"
(
  for m in qwen3-0.6b llama3-8b; do
    [ -f "$DIR/$m/model.safetensors" ] ||
      "$B/tools/gen_model" --preset "$m" --dtype bf16 --seed 1 --out "$DIR/$m"
  done
) >"$OUT/gen.txt" 2>&1 &
gen=$!

if [ "${CHECK:-1}" = 1 ]; then
  el "check"
  BUILD=$B timeout 240 sh tools/cuda_check.sh >"$OUT/check.txt" 2>&1
  grep -E "^FAIL" "$OUT/check.txt" | head -n 20
  grep -E "cuda kernels:|passed|cuda_check:" "$OUT/check.txt" | tail -n 6
fi

if [ "${GEMV:-0}" = 1 ]; then
  el "gemv"
  timeout 100 "$B/bench/cuda_gemv" 30 >"$OUT/gemv.txt" 2>&1
  grep -E "^best|cuda_gemv:" "$OUT/gemv.txt"
fi

if [ "${DELTA:-0}" = 1 ]; then
  el "delta"
  timeout 100 "$B/bench/cuda_delta" 20 >"$OUT/delta.txt" 2>&1
  cat "$OUT/delta.txt"
fi

wait $gen
if [ "${BENCH:-1}" = 1 ]; then
  el "bench"
  BUILD=$B LOOM_BENCH_PEER=0 LOOM_BENCH_REPS=${LOOM_BENCH_REPS:-3} \
    LOOM_BENCH_BATCH=${LOOM_BENCH_BATCH:-1,32} timeout 260 sh bench/cuda_bench.sh \
    >"$OUT/bench.txt" 2>&1
  sed -n '/== table/,$p' "$OUT/bench.txt" | grep -E "^\||copy"
fi

el "prefill under other settings"
echo "${AB:-}" | tr '|' '\n' | while read -r cfg; do
  [ -n "$cfg" ] || continue
  [ "$cfg" = default ] && cfg=
  for m in ${AB_MODELS:-qwen3-0.6b llama3-8b}; do
    [ "$(left)" -gt 40 ] || { echo "skipped: $m [$cfg] (time)"; continue; }
    r=$(env $cfg timeout 90 "$B/loom" bench --device cuda --model "$DIR/$m" -p 4096 -n 0 \
        --reps 3 --kv-type bf16 --json 2>&1)
    echo "$m [$cfg] $r" >>"$OUT/ab.txt"
    echo "$m [$cfg] pp $(echo "$r" | sed -n 's/.*"pp_tok_s": \([0-9.]*\).*/\1/p')" \
      "$(echo "$r" | grep -o 'max |diff| [0-9.e+-]*')"
  done
done

echo "${AB_TG:-}" | tr '|' '\n' | while read -r cfg; do
  [ -n "$cfg" ] || continue
  [ "$cfg" = default ] && cfg=
  for m in ${AB_TG_MODELS:-qwen3-0.6b llama3-8b}; do
    [ "$(left)" -gt 30 ] || { echo "skipped: tg $m [$cfg] (time)"; continue; }
    r=$(env LOOM_CUDA_STEP_TIMES="${STEP_TIMES:-0}" $cfg timeout 60 "$B/loom" bench \
        --device cuda --model "$DIR/$m" -p 0 -n 128 --tg-prompt 128 \
        --batch "${AB_TG_BATCH:-1}" --reps 3 --kv-type bf16 --json 2>"$OUT/tg-err.txt")
    echo "$m tg [$cfg] $r" >>"$OUT/ab.txt"
    cat "$OUT/tg-err.txt" >>"$OUT/ab.txt"
    echo "$m [$cfg] b1 $(echo "$r" | sed -n 's/.*{"b": 1, "tok_s": \([0-9.]*\).*/\1/p')" \
      "tg $(echo "$r" | sed -n 's/.*"tg_tok_s": \([0-9.]*\).*/\1/p')"
    grep "step times" "$OUT/tg-err.txt" | tail -n 3
    grep -iE "error|fail" "$OUT/tg-err.txt" | head -n 3
  done
done

el "kernel times"
# kt MODE N NEED MODELS...: cuda_kernel_times.sh on each model while NEED
# seconds are left; logs in $OUT/MODE-<model>.txt
kt() {
  mode=$1 n=$2 need=$3
  shift 3
  for m in "$@"; do
    [ "$(left)" -gt "$need" ] || { echo "skipped: $mode times $m (time)"; continue; }
    timeout $(( $(left) - 5 )) sh bench/cuda_kernel_times.sh "$B/loom" "$DIR/$m" "$mode" "$n" \
      >"$OUT/$mode-$m.txt" 2>&1
    echo "$m $mode:"
    sed -n '/^[0-9]* kernels/,/^$/p' "$OUT/$mode-$m.txt"
  done
}
# shellcheck disable=SC2086
kt tg 16 30 ${KT_MODELS:-}
# shellcheck disable=SC2086
kt prefill 4096 60 ${PT_MODELS:-}
# shellcheck disable=SC2086
kt decode 32 60 ${PT_DECODE:-}
el "done"
