#!/bin/sh
# bench/cuda_round.sh: one device call's worth of decode work, in order of
# need, each step under its own time limit:
#   0. builds everything, then writes the random models in the background;
#   1. tools/cuda_check.sh (parity; its log in $OUT/check.txt);
#   2. bench/cuda_gemv (the GEMV's variants alone and over whole layers);
#   3. bench/cuda_bench.sh (loom only; $OUT/bench.txt);
#   4. batch-1 decode (`loom bench -p 0 -n 128 --tg-prompt 128`) under the
#      settings in AB_<model> ($OUT/ab.txt);
#   5. bench/cuda_kernel_times.sh on each model ($OUT/kernels-<model>.txt).
# Steps 4 and 5 are skipped once ROUND_BUDGET seconds (default 400) would
# be overrun. Environment: OUT (default /tmp/loom-round), BUILD (build/cc),
# CC, LOOM_BENCH_* as bench/cuda_bench.sh.
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
make -s -j"$(nproc)" BUILD="$B" CUDA=1 cuda-tests "$B/bench/cuda_gemv" "$B/loom" \
  "$B/tools/gen_model" >"$OUT/make.txt" 2>&1 || tail -n 30 "$OUT/make.txt"
# the benchmark's random models are written while the tests run
(
  for m in qwen3-0.6b llama3-8b; do
    [ -f "$DIR/$m/model.safetensors" ] ||
      "$B/tools/gen_model" --preset "$m" --dtype bf16 --seed 1 --out "$DIR/$m"
  done
) >"$OUT/gen.txt" 2>&1 &
gen=$!

el "check"
BUILD=$B timeout 240 sh tools/cuda_check.sh >"$OUT/check.txt" 2>&1
grep -E "^FAIL" "$OUT/check.txt" | head -n 20
grep -E "cuda kernels:|passed|cuda_check:" "$OUT/check.txt" | tail -n 6

el "gemv"
timeout 100 "$B/bench/cuda_gemv" 30 >"$OUT/gemv.txt" 2>&1
grep -E "^best|cuda_gemv:" "$OUT/gemv.txt"

wait $gen
el "bench"
BUILD=$B LOOM_BENCH_PEER=0 LOOM_BENCH_REPS=${LOOM_BENCH_REPS:-3} \
  LOOM_BENCH_BATCH=${LOOM_BENCH_BATCH:-1,8,32} timeout 260 sh bench/cuda_bench.sh \
  >"$OUT/bench.txt" 2>&1
sed -n '/== table/,$p' "$OUT/bench.txt" | grep -E "^\||copy"

el "batch 1 under other settings"
# settings a batch-1 decode is also run with, per model ('|' between them;
# an empty one is the default)
AB_qwen3_0_6b=${AB_qwen3_0_6b:-"|LOOM_CUDA_ATTN_SPLIT=16|LOOM_CUDA_GEMV_KS=0 LOOM_CUDA_ATTN_SPLIT=16"}
AB_llama3_8b=${AB_llama3_8b:-"|LOOM_CUDA_GEMV_KS=0|LOOM_CUDA_GEMV_KS=0 LOOM_CUDA_ATTN_SPLIT=16"}
for m in qwen3-0.6b llama3-8b; do
  [ -f "$DIR/$m/model.safetensors" ] || continue
  cfgs=$(eval echo "\"\${AB_$(echo "$m" | tr '.-' '__')}\"")
  echo "$cfgs" | tr '|' '\n' | while read -r cfg; do
    [ "$(left)" -gt 30 ] || { echo "skipped: $m [$cfg] (time)"; continue; }
    r=$(env $cfg timeout 60 "$B/loom" bench --device cuda --model "$DIR/$m" -p 0 -n 128 \
        --tg-prompt 128 --batch 1 --kv-type bf16 --reps 3 --json 2>&1 | tail -n 1)
    echo "$m [${cfg:-default}] $r" | tee -a "$OUT/ab.txt" |
      python3 -c 'import sys,json
l=sys.stdin.read(); h,_,j=l.partition("] ")
try:
    d=json.loads(j); print(h+"]", "tg", round(d["tg_tok_s"]), "b1", round(d["batch"][0]["tok_s"], 1))
except Exception: print(l[:300])'
  done
done

el "kernel times"
for m in ${KT_MODELS:-qwen3-0.6b llama3-8b}; do
  if [ "$(left)" -gt 30 ] && [ -f "$DIR/$m/model.safetensors" ]; then
    timeout $(( $(left) - 5 )) sh bench/cuda_kernel_times.sh "$B/loom" "$DIR/$m" 16 \
      >"$OUT/kernels-$m.txt" 2>&1
    echo "$m:"
    sed -n '/profiled/,/^$/p' "$OUT/kernels-$m.txt"
  fi
done
el "done"
