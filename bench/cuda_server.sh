#!/bin/sh
# bench/cuda_server.sh: `loom serve --device cuda` under load, and the same
# load on the CPU for scale, on a machine with an NVIDIA GPU.
#
#   sh bench/cuda_server.sh
#
# 1. builds loom with `make CUDA=1` (BUILD, default build/cu; DEPS=DIR for
#    the library's packages unpacked outside the system paths);
# 2. writes random bf16 Qwen3-0.6B-shaped weights (tools/gen_model) with the
#    qwen3 tokenizer from tests/fixtures/tokenizers;
# 3. serves them on the GPU and runs bench/server_load.py: 64 streaming
#    clients x 2 requests, prompts 100-4096 tokens (log-uniform), half of
#    the long ones behind one of 4 shared 1024-token prefixes, 64 tokens each
#    (ignore_eos), every stream validated (usage, [DONE]);
# 4. the same on the CPU with LOOM_SERVER_CPU_CLIENTS (default 8) clients
#    and a deadline, for scale;
# 5. prints a table: TTFT p50/p99, inter-token p50/p99, generated and
#    prompt tok/s.
# Environment: BUILD, DIR (default /tmp/loom-srv), CLIENTS (64), ROUNDS (2),
# LOOM_SERVER_CPU=0 skips the CPU run.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/cu}
DIR=${DIR:-/tmp/loom-srv}
CLIENTS=${CLIENTS:-64}
ROUNDS=${ROUNDS:-2}
PY=${PYTHON:-python3}
mkdir -p "$DIR"

echo "== environment"
date -u '+%Y-%m-%d %H:%M:%S UTC'
echo "commit: $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"

echo "== build"
make -s -j"$(nproc)" BUILD="$BUILD" CUDA=1 ${DEPS:+DEPS="$DEPS"} "$BUILD/loom" "$BUILD/tools/gen_model" \
  >"$DIR/build.log" 2>&1 || { tail -n 40 "$DIR/build.log"; echo "cuda_server: BUILD FAILED"; exit 2; }

md="$DIR/qwen3-0.6b"
if [ ! -f "$md/model.safetensors" ]; then
  "$BUILD/tools/gen_model" --preset qwen3-0.6b --dtype bf16 --seed 1 --out "$md"
fi
gzip -dc tests/fixtures/tokenizers/qwen3/tokenizer.json.gz >"$md/tokenizer.json"
cp tests/fixtures/tokenizers/qwen3/tokenizer_config.json "$md/"

pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; true' EXIT
# serve DEVICE CLIENTS DEADLINE LABEL [loom flags...]
serve() {
  dev=$1 n=$2 dl=$3 label=$4
  shift 4
  rm -f "$DIR/port"
  "$BUILD/loom" serve --model "$md" --device "$dev" --port 0 --port-file "$DIR/port" \
    --ctx-size 4352 --max-seqs 64 --served-model-name loom "$@" >"$DIR/serve-$label.log" 2>&1 &
  pid=$!
  i=0
  until [ -s "$DIR/port" ]; do
    i=$((i + 1))
    if [ "$i" -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$DIR/serve-$label.log"; echo "cuda_server: $label did not start"; pid=""; return 1
    fi
    sleep 0.1
  done
  head -n 3 "$DIR/serve-$label.log"
  url="http://127.0.0.1:$(cat "$DIR/port")"
  # a warm-up request: module load and graph capture stay out of the numbers
  $PY bench/server_load.py --url "$url" --clients 1 --rounds 1 --min-prompt 128 --max-prompt 128 \
    --prefixes 1 --prefix-len 64 --max-tokens 8 --seed 99 >/dev/null || true
  $PY bench/server_load.py --url "$url" --clients "$n" --rounds "$ROUNDS" --deadline "$dl" \
    | tee "$DIR/load-$label.json" || echo "cuda_server: $label: some requests failed"
  kill -TERM "$pid"; wait "$pid" || true; pid=""
}

echo "== GPU: $CLIENTS clients x $ROUNDS"
serve cuda "$CLIENTS" 400 gpu --kv-type bf16 --kv-memory 16G
if [ "${LOOM_SERVER_CPU:-1}" != 0 ]; then
  n=${LOOM_SERVER_CPU_CLIENTS:-8}
  echo "== CPU: $n clients x $ROUNDS, 120 s deadline"
  serve cpu "$n" 120 cpu --kv-type bf16
fi

echo "== table"
$PY - "$DIR" <<'EOF'
import json, os, sys
d = sys.argv[1]
f = lambda x, p=0: "-" if x is None else f"{x:,.{p}f}"
print("| device | clients | requests ok / asked | failures | TTFT p50 / p99 ms | inter-token p50 / p99 ms | generated tok/s | prompt tok/s |")
print("| --- | --: | --: | --: | --: | --: | --: | --: |")
for label in ("gpu", "cpu"):
    p = os.path.join(d, f"load-{label}.json")
    if not os.path.exists(p):
        continue
    r = json.loads(open(p).read().strip().splitlines()[-1])
    print(f"| {label} | {r['clients']} | {r['requests']} / {r['asked']} | {r['failures']} | "
          f"{f(r['ttft_ms_p50'])} / {f(r['ttft_ms_p99'])} | {f(r['itl_ms_p50'], 1)} / {f(r['itl_ms_p99'], 1)} | "
          f"{f(r['gen_tok_s'])} | {f(r['prompt_tok_s'])} |")
print()
print("random bf16 Qwen3-0.6B-shaped weights, qwen3 tokenizer; prompts 100-4096 token ids "
      "(log-uniform), half of those over 1024 behind one of 4 shared 1024-token prefixes; "
      "64 tokens each, greedy, ignore_eos; bf16 KV")
EOF
