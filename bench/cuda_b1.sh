#!/bin/sh
# bench/cuda_b1.sh: one device call on batch-1 decode of Qwen3-0.6B (random
# bf16 weights): build, parity, then
#   1. `loom bench -p 0 -n 128 --tg-prompt 128 --batch 1 --reps 3` under
#      each setting in B1_AB ('|' between space-separated VAR=value groups;
#      an empty group is the default), with LOOM_CUDA_STEP_TIMES=1 (the
#      forward's step times: wall period, device time, device idle between
#      steps, host time; forward_cuda.cu);
#   2. with KT=1, bench/cuda_kernel_times.sh tg (each kernel's own time).
# Logs under OUT (default /tmp/loom-b1). Environment: BUILD (build/cc),
# CHECK=0 skips the parity run, B1_MODELS (qwen3-0.6b), CC.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/loom-b1}
B=${BUILD:-build/cc}
DIR=${LOOM_BENCH_DIR:-/tmp/loom-cuda}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

el "build $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
make -s -j"$(nproc)" BUILD="$B" CUDA=1 cuda-tests "$B/loom" "$B/tools/gen_model" \
  >"$OUT/make.txt" 2>&1 || { tail -n 30 "$OUT/make.txt"; exit 2; }
(
  for m in ${B1_MODELS:-qwen3-0.6b}; do
    [ -f "$DIR/$m/model.safetensors" ] ||
      "$B/tools/gen_model" --preset "$m" --dtype bf16 --seed 1 --out "$DIR/$m"
  done
) >"$OUT/gen.txt" 2>&1 &
gen=$!
if [ "${CHECK:-1}" = 1 ]; then
  el "check"
  BUILD=$B timeout 300 sh tools/cuda_check.sh >"$OUT/check.txt" 2>&1
  grep -E "^FAIL" "$OUT/check.txt" | head -n 20
  grep -E "cuda kernels:|passed|cuda_check:" "$OUT/check.txt" | tail -n 6
fi
wait $gen
el "b1"
echo "${B1_AB:-}" | tr '|' '\n' | while IFS= read -r cfg; do
  for m in ${B1_MODELS:-qwen3-0.6b}; do
    r=$(env LOOM_CUDA_STEP_TIMES=1 $cfg timeout 90 "$B/loom" bench --device cuda \
        --model "$DIR/$m" -p 0 -n 128 --tg-prompt 128 --batch 1 --reps 3 --kv-type bf16 \
        --json 2>"$OUT/st.txt")
    echo "$m [$cfg] $r" >>"$OUT/b1.txt"
    cat "$OUT/st.txt" >>"$OUT/b1.txt"
    echo "$m [$cfg] b1 $(echo "$r" | sed -n 's/.*{"b": 1, "tok_s": \([0-9.]*\).*/\1/p')" \
      "tg $(echo "$r" | sed -n 's/.*"tg_tok_s": \([0-9.]*\).*/\1/p')"
    grep "step times" "$OUT/st.txt" | tail -n 3
    grep -iE "error|fail" "$OUT/st.txt" | head -n 3
  done
done
if [ "${KT:-0}" = 1 ]; then
  for m in ${B1_MODELS:-qwen3-0.6b}; do
    el "kernel times $m"
    timeout 150 sh bench/cuda_kernel_times.sh "$B/loom" "$DIR/$m" tg 16 >"$OUT/kt-$m.txt" 2>&1
    sed -n '/^[0-9]* kernels/,$p' "$OUT/kt-$m.txt" | head -n 40
  done
fi
el "done"
