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
#   3. for each model (LOOM_BENCH_MODELS, default "qwen3-0.6b llama3-8b"):
#      writes random bf16 weights with the real shapes (tools/gen_model,
#      under LOOM_BENCH_DIR, default /tmp/loom-cuda), runs
#        loom bench --device cuda -p 4096 -n 128 --tg-prompt 128
#                   --batch 1,8,32,128 --kv-type bf16 --json
#      (which validates before timing: batched vs token-by-token logits,
#      and the batch's greedy tokens against the context's), then the peer
#      (bench/cuda_peer.py model DIR: same shapes, random init, bf16, sdpa,
#      static KV cache);
#   4. prints one table: loom, peer, ratio, and the physical bound of each
#      figure. Decode bound = copy bandwidth / (weight bytes + KV bytes read
#      per step); prefill bound = GEMM rate / FLOPs per token (matrices of
#      the layers plus causal attention, average position p/2).
#
# Environment: BUILD, LOOM_BENCH_MODELS, LOOM_BENCH_DIR, LOOM_BENCH_REPS
# (default 3), LOOM_BENCH_BATCH (default 1,8,32,128), LOOM_BENCH_GEN (128),
# LOOM_BENCH_PREFILL (4096), LOOM_BENCH_PEER=0 skips the peer,
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

for m in $MODELS; do
  md="$DIR/$m"
  if [ ! -f "$md/model.safetensors" ]; then
    "$BUILD/tools/gen_model" --preset "$m" --dtype bf16 --seed 1 --out "$md"
  fi
  echo "== loom: $m"
  "$BUILD/loom" bench --device cuda --model "$md" -p "$PREFILL" -n "$GEN" --tg-prompt "$PROMPT" \
    --batch "$BATCH" --kv-type bf16 --reps "$REPS" --json >"$OUTD/loom-$m.json" ||
    { echo "cuda_bench: loom bench failed on $m"; rm -f "$OUTD/loom-$m.json"; }
  cat "$OUTD/loom-$m.json" 2>/dev/null || true
  if [ "${LOOM_BENCH_PEER:-1}" = 1 ]; then
    echo "== peer: $m"
    $PY bench/cuda_peer.py model "$md" --prefill "$PREFILL" --batch "$BATCH" --prompt "$PROMPT" \
      --gen "$GEN" --reps "$REPS" >"$OUTD/peer-$m.json" ||
      { echo "cuda_bench: peer failed on $m"; rm -f "$OUTD/peer-$m.json"; }
  fi
done

echo "== table"
$PY - "$OUTD" "$DIR" "$MODELS" "$PROMPT" "$GEN" "$commit" <<'EOF'
import json, os, sys
outd, dir_, models, prompt, gen, commit = sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
def load(p):
    try:
        with open(p) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception:
        return None
lim = load(os.path.join(outd, "limits.json"))
bw, peak = lim["copy_bytes_s"], lim["gemm_flop_s"]
print(f"{lim['gpu']}: copy {bw / 1e12:.2f} TB/s (read + write), bf16 GEMM 8192^3 {peak / 1e12:.0f} TFLOP/s; commit {commit}")
print()
print("| model | figure | loom | peer | loom / peer | bound | loom / bound | peer / bound |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for m in models:
    cfg = json.load(open(os.path.join(dir_, m, "config.json")))
    H, L, V, I = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    tied = cfg.get("tie_word_embeddings", False)
    layer_mat = L * (H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 3 * H * I)
    layer_vec = L * (2 * H + (2 * hd if cfg["model_type"] == "qwen3" else 0))
    # bytes read per decode step: every layer matrix, the norms and the head
    # (the embedding table is read one row per token; tied, it is the head)
    wbytes = 2 * (layer_mat + layer_vec + H + V * H)
    kv_tok = L * 2 * nkv * hd * 2        # bf16 K and V of one position, all layers
    lo, pe = load(os.path.join(outd, f"loom-{m}.json")), load(os.path.join(outd, f"peer-{m}.json"))
    def row(fig, a, b, bound):
        f = lambda x: f"{x:,.0f}" if x else "-"
        r = lambda x, y: f"{x / y:.2f}" if x and y else "-"
        print(f"| {m} | {fig} | {f(a)} | {f(b)} | {r(a, b)} | {f(bound)} | {r(a, bound)} | {r(b, bound)} |")
    P = (lo or {}).get("p") or (pe or {}).get("prefill") or 4096
    flops_tok = 2 * layer_mat + 4 * nh * hd * (P / 2) * L
    row(f"prefill {P} tok/s", (lo or {}).get("pp_tok_s"), (pe or {}).get("prefill_tok_s"), peak / flops_tok)
    lb = {x["b"]: x for x in (lo or {}).get("batch", [])}
    pb = {x["b"]: x for x in (pe or {}).get("batch", [])}
    for B in sorted(set(lb) | set(pb)):
        avg_ctx = prompt + gen / 2
        step_bytes = wbytes + B * kv_tok * avg_ctx
        row(f"decode b{B} tok/s", lb.get(B, {}).get("tok_s"), pb.get(B, {}).get("tok_s"), B * bw / step_bytes)
    if lo:
        print(f"| {m} | (loom tg{lo['n']}, one context) | {lo['tg_tok_s']:,.0f} | | | | | |")
print()
print(f"decode: prompt {prompt} tokens, {gen} generated per sequence, greedy, bf16 KV; "
      "bound = copy bandwidth / (weights + KV read per step); "
      "prefill bound = GEMM rate / (2 * layer matrix params + causal attention FLOPs) per token")
EOF
