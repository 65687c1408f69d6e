#!/bin/sh
# bench/cuda_attn_round.sh: one device call for the decode attention's two
# paths (the split kernel, LOOM_CUDA_ATTN_CLUSTER=0, and the cluster
# kernel): builds, runs tools/cuda_check.sh, then `loom bench -p 0 -n 128
# --tg-prompt 128 --batch 1,8,32` on both benchmark models with each path,
# alternating, then (while ROUND_BUDGET seconds, default 340, allow) batch 1
# again and the kernel times under ncu with the cluster kernel.
# Environment: OUT (default /tmp/loom-round), BUILD (build/cc), CC,
# LOOM_BENCH_DIR (/tmp/loom-cuda), LOOM_BENCH_REPS (3).
# Logs in $OUT: make.txt, gen.txt, check.txt, ab.txt, kernels-<model>.txt.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/loom-round}
B=${BUILD:-build/cc}
BUDGET=${ROUND_BUDGET:-340}
DIR=${LOOM_BENCH_DIR:-/tmp/loom-cuda}
REPS=${LOOM_BENCH_REPS:-3}
mkdir -p "$OUT" "$DIR"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }

el "build"
make -s -j"$(nproc)" BUILD="$B" CUDA=1 cuda-tests "$B/loom" "$B/tools/gen_model" \
  >"$OUT/make.txt" 2>&1 || tail -n 30 "$OUT/make.txt"
(
  for m in qwen3-0.6b llama3-8b; do
    [ -f "$DIR/$m/model.safetensors" ] ||
      "$B/tools/gen_model" --preset "$m" --dtype bf16 --seed 1 --out "$DIR/$m"
  done
) >"$OUT/gen.txt" 2>&1 &
gen=$!

el "check"
BUILD=$B timeout 180 sh tools/cuda_check.sh >"$OUT/check.txt" 2>&1
grep -E "^FAIL" "$OUT/check.txt" | head -n 20
grep -E "attn_decode.*(cluster|split)" "$OUT/check.txt" | grep -c PASS | sed 's/^/attn_decode variant cases passed: /'
grep -iE "cluster of|warn" "$OUT/check.txt" | head -n 5
grep -E "cuda kernels:|passed|cuda_check:" "$OUT/check.txt" | tail -n 6
wait $gen

# one `loom bench` under a setting: its JSON line, labelled, into ab.txt
ab() {  # model setting batches
  to=$(( $(left) - 5 ))
  [ $to -gt 70 ] && to=70
  [ $to -gt 20 ] || { echo "skipped: $1 [$2] (time)"; return; }
  r=$(env $2 timeout $to "$B/loom" bench --device cuda --model "$DIR/$1" -p 0 -n 128 \
      --tg-prompt 128 --batch "$3" --kv-type bf16 --reps "$REPS" --json 2>&1 | tail -n 1)
  echo "$1 [$2] $r" >>"$OUT/ab.txt"
  echo "$1 [$2] $r" | python3 -c 'import sys,json
l=sys.stdin.read(); h,_,j=l.partition("] ")
try:
    d=json.loads(j); print(h+"]", " ".join("b%d %.1f (sd %.1f)" % (x["b"], x["tok_s"], x["sd"]) for x in d["batch"]))
except Exception: print(l[:300])'
}
el "bench"
for m in qwen3-0.6b llama3-8b; do
  ab "$m" LOOM_CUDA_ATTN_CLUSTER=0 1,8,32
  ab "$m" LOOM_CUDA_ATTN_CLUSTER=8 1,8,32
done
el "batch 1 again"
for m in qwen3-0.6b llama3-8b; do
  ab "$m" LOOM_CUDA_ATTN_CLUSTER=8 1
  ab "$m" LOOM_CUDA_ATTN_CLUSTER=0 1
done

el "kernel times (cluster kernel)"
for m in llama3-8b qwen3-0.6b; do
  if [ "$(left)" -gt 40 ]; then
    LOOM_CUDA_ATTN_CLUSTER=8 KT_LAUNCHES=600 timeout $(( $(left) - 10 )) \
      sh bench/cuda_kernel_times.sh "$B/loom" "$DIR/$m" 8 >"$OUT/kernels-$m.txt" 2>&1
    echo "$m:"
    grep -E "attn_decode|qkv_post|profiled" "$OUT/kernels-$m.txt" | head -n 6
  fi
done
el "done"
