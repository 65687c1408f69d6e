#!/bin/sh
# bench/cuda_prefill_times.sh: where one prefill (or one batched decode
# step) spends its time, kernel by kernel. Runs `loom bench` under Nsight
# Compute with only the kernel duration collected (clocks and caches left
# alone), then keeps the kernels of the last step of the run (from the last
# embedding gather on) and sums them by kernel name and grid. ncu runs the
# kernels one after another, so these are each kernel's own times, without
# launch gaps or overlap.
#
#   sh bench/cuda_prefill_times.sh LOOM MODEL_DIR prefill [tokens, default 4096]
#   sh bench/cuda_prefill_times.sh LOOM MODEL_DIR decode [batch, default 32]
#
# Environment: NCU (default: ncu on PATH, else under /usr/local/cuda/bin or
# /opt/nvidia).
set -u
LOOM=$1
MODEL=$2
MODE=${3:-prefill}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then
  echo "cuda_prefill_times: no ncu found"
  exit 2
fi
if [ "$MODE" = decode ]; then
  # a few decode steps after the prompts' prefill (which may come in two
  # parts, so that the steps after it are staggered): the last step of the
  # whole batch is kept
  ROWS=${4:-32}
  set -- bench --device cuda --model "$MODEL" -p 0 -n 6 --tg-prompt 128 --batch "$ROWS" \
    --reps 1 --kv-type bf16
else
  ROWS=""
  # the warm-up prefill, then the timed one (the last step)
  set -- bench --device cuda --model "$MODEL" -p "${4:-4096}" -n 0 --reps 1 --kv-type bf16
fi
tmp=${TMPDIR:-/tmp}/pt.$$
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --print-units base --log-file "$tmp.csv" "$LOOM" "$@" >"$tmp.out" 2>&1
rc=$?
tail -n 3 "$tmp.out"
python3 - "$tmp.csv" "$ROWS" <<'EOF'
import csv, sys
rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    try:
        ns = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    name = r["Kernel Name"].split("(")[0].replace("void ", "")
    rows.append((name[:60], r.get("Grid Size", ""), r.get("Block Size", ""), ns / 1e3))
if not rows:
    print("cuda_prefill_times: no kernel rows in the ncu output")
    sys.exit(1)
# a step starts at its embedding gather, whose grid is (x, tokens, 1)
want = sys.argv[2] if len(sys.argv) > 2 else ""
def tokens(grid):
    parts = grid.strip("()").split(",")
    return parts[1].strip() if len(parts) > 1 else ""
last = max((i for i, r in enumerate(rows)
            if "embed" in r[0] and (not want or tokens(r[1]) == want)), default=0)
ends = [i for i, r in enumerate(rows) if "embed" in r[0] and i > last]
rows = rows[last:ends[0]] if ends else rows[last:]
tot = sum(r[3] for r in rows)
print(f"{len(rows)} kernels in the last step, {tot / 1e3:.2f} ms of kernel time")
by = {}
for name, grid, block, us in rows:
    by.setdefault(name, []).append(us)
print("| kernel | launches | total ms | share |")
print("| --- | ---: | ---: | ---: |")
for name, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
    print(f"| {name} | {len(v)} | {sum(v) / 1e3:.3f} | {sum(v) / tot:.1%} |")
print()
groups = {}
for name, grid, block, us in rows:
    groups.setdefault((name, grid, block), []).append(us)
print("| kernel | grid | block | launches | mean us | total ms |")
print("| --- | --- | --- | ---: | ---: | ---: |")
for (name, grid, block), v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:25]:
    print(f"| {name} | {grid} | {block} | {len(v)} | {sum(v) / len(v):.1f} | {sum(v) / 1e3:.3f} |")
EOF
rm -f "$tmp.csv" "$tmp.out"
exit $rc
