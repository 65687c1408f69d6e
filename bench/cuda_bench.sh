#!/bin/sh
# bench/cuda_bench.sh: loom's CUDA backend against the GPU's physical limits
# and against PyTorch + transformers, in one run on a machine with an NVIDIA
# GPU (written for the H200: sm_90).
#
#   sh bench/cuda_bench.sh
#
# In order:
#   1. builds loom and gen_model with `make CUDA=1` (BUILD, default build/cu);
#   2. measures the limits (bench/cuda_peer.py limits): device-to-device
#      copy bandwidth (bytes read + written) and the bf16 8192^3 GEMM rate;
#   3. for each model (LOOM_BENCH_MODELS, default "qwen3-0.6b llama3-8b";
#      shape() below has one of each family):
#      writes random bf16 weights with the real shapes (tools/gen_model,
#      under LOOM_BENCH_DIR, default /tmp/loom-cuda), runs
#        loom bench --device cuda -p 4096 -n 128 --tg-prompt 128
#                   --batch 1,8,32,128 --kv-type bf16 --json
#      (which validates before timing: batched vs token-by-token logits,
#      and the batch's greedy tokens against the context's), then the peer
#      (bench/cuda_peer.py model DIR: same shapes, random init, bf16, sdpa,
#      static KV cache);
#   4. prints one table (bench/cuda_table.py): loom, peer, ratio, and the
#      physical bound of each figure, counted from the model's own tensors:
#      decode bound = copy bandwidth / (weight bytes, routed experts where
#      picked, + KV and recurrent state per step); prefill bound = GEMM rate
#      / FLOPs per token (the layers' matrices, causal attention at average
#      position p/2, sliding layers at most their window).
#
# Every family: LOOM_BENCH_MODELS="gemma2-2b gemma3-1b gemma4-e2b
# qwen3-30b-a3b-8l qwen3.5-h2048 qwen3next-80b-a3b-4l".
# Environment: BUILD, LOOM_BENCH_MODELS, LOOM_BENCH_DIR, LOOM_BENCH_REPS
# (default 3), LOOM_BENCH_BATCH (default 1,8,32,128), LOOM_BENCH_GEN (128),
# LOOM_BENCH_PREFILL (4096), LOOM_BENCH_PEER=0 skips the peer,
# LOOM_BENCH_PEER_GRAPHS=1 also times the peer's decode replayed from a CUDA
# graph (its faster figure is the peer's; on transformers 5.17 the capture
# hit a device-side assert, which leaves the peer's process unusable),
# LOOM_BENCH_OUT (where the JSON results go; default $LOOM_BENCH_DIR/results),
# CC (e.g. with -I/-L for libraries installed outside the system paths).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/cu}
MODELS=${LOOM_BENCH_MODELS:-"qwen3-0.6b llama3-8b"}
DIR=${LOOM_BENCH_DIR:-/tmp/loom-cuda}
OUTD=${LOOM_BENCH_OUT:-$DIR/results}
REPS=${LOOM_BENCH_REPS:-3}
BATCH=${LOOM_BENCH_BATCH:-1,8,32,128}
GEN=${LOOM_BENCH_GEN:-128}
PREFILL=${LOOM_BENCH_PREFILL:-4096}
PROMPT=128
PY=${PYTHON:-python3}
mkdir -p "$DIR" "$OUTD"

echo "== environment"
date -u '+%Y-%m-%d %H:%M:%S UTC'
# COMMIT: written beside a source snapshot taken out of git (git archive)
commit=$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit: $commit"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true

echo "== build"
t0=$(date +%s)
make -s -j"$(nproc)" BUILD="$BUILD" CUDA=1 "$BUILD/loom" "$BUILD/tools/gen_model" \
  >"$OUTD/build.log" 2>&1 || { tail -n 40 "$OUTD/build.log"; echo "cuda_bench: BUILD FAILED"; exit 2; }
echo "built in $(( $(date +%s) - t0 )) s"

echo "== limits"
$PY bench/cuda_peer.py limits | tee "$OUTD/limits.json"

# A model of each family with the shapes of a released one: gen_model's
# arguments, then the config's sliding window where the preset's (a few
# tokens, for the forward tests) is not the release's. The MoE releases are
# too large to write and load whole here: a slice of their layers (the
# bound is counted for the slice).
shape() {
  case $1 in
    gemma2-2b) echo "--preset gemma2 --vocab 256000 --hidden 2304 --layers 26 --heads 8 --kv-heads 4 --head-dim 256 --intermediate 9216 window=4096" ;;
    gemma3-1b) echo "--preset gemma3 --vocab 262144 --hidden 1152 --layers 26 --heads 4 --kv-heads 1 --head-dim 256 --intermediate 6912 window=512" ;;
    # Gemma 3n/4 E2B's widths; its last 2 layers share KV (E2B: 20)
    gemma4-e2b) echo "--preset gemma4 --vocab 262144 --hidden 1536 --layers 35 --heads 8 --kv-heads 1 --head-dim 256 --intermediate 6144 window=512" ;;
    qwen3-30b-a3b-8l) echo "--preset qwen3moe --vocab 151936 --hidden 2048 --layers 8 --heads 32 --kv-heads 4 --head-dim 128 --intermediate 6144 --experts 128 --experts-used 8 --moe-intermediate 768" ;;
    qwen3next-80b-a3b-4l) echo "--preset qwen3next --vocab 151936 --hidden 2048 --layers 4 --heads 16 --kv-heads 2 --head-dim 256 --intermediate 5120 --experts 512 --experts-used 10 --moe-intermediate 512 --shared-intermediate 512" ;;
    # Qwen3.5's hybrid layout (3 linear-attention layers to 1 full) at 2048 wide
    qwen3.5-h2048) echo "--preset qwen3.5 --vocab 151936 --hidden 2048 --layers 24 --heads 8 --kv-heads 2 --head-dim 256 --intermediate 6144" ;;
    *) echo "--preset $1" ;;
  esac
}

# the models are written in parallel (gen_model is one thread each)
echo "== models"
for m in $MODELS; do
  md="$DIR/$m"
  [ -f "$md/model.safetensors" ] && continue
  (
    args=$(shape "$m")
    # shellcheck disable=SC2086
    "$BUILD/tools/gen_model" $(echo "$args" | sed 's/ window=[0-9]*//') --dtype bf16 --seed 1 --out "$md" ||
      { echo "cuda_bench: gen_model failed on $m"; rm -rf "$md"; exit 1; }
    w=$(echo "$args" | sed -n 's/.* window=\([0-9]*\).*/\1/p')
    [ -z "$w" ] || $PY -c "import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); c['sliding_window']=int(sys.argv[2]); json.dump(c,open(p,'w'),indent=1)" "$md" "$w"
  ) &
done
wait

for m in $MODELS; do
  md="$DIR/$m"
  [ -f "$md/model.safetensors" ] || continue
  echo "== loom: $m"
  "$BUILD/loom" bench --device cuda --model "$md" -p "$PREFILL" -n "$GEN" --tg-prompt "$PROMPT" \
    --batch "$BATCH" --kv-type bf16 --reps "$REPS" --json >"$OUTD/loom-$m.json" ||
    { echo "cuda_bench: loom bench failed on $m"; rm -f "$OUTD/loom-$m.json"; }
  cat "$OUTD/loom-$m.json" 2>/dev/null || true
  if [ "${LOOM_BENCH_PEER:-1}" = 1 ]; then
    echo "== peer: $m"
    $PY bench/cuda_peer.py model "$md" --prefill "$PREFILL" --batch "$BATCH" --prompt "$PROMPT" \
      --gen "$GEN" --reps "$REPS" ${LOOM_BENCH_PEER_GRAPHS:+--graphs} >"$OUTD/peer-$m.json" ||
      { echo "cuda_bench: peer failed on $m"; rm -f "$OUTD/peer-$m.json"; }
  fi
done

echo "== table"
$PY bench/cuda_table.py "$OUTD" "$DIR" "$MODELS" "$PROMPT" "$GEN" "$commit"
