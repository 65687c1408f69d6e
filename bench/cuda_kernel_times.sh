#!/bin/sh
# bench/cuda_kernel_times.sh: where a batch-1 decode step's time goes, one
# kernel at a time. Runs `loom bench` (one context, -p 0) under Nsight
# Compute with only the kernel duration collected (one pass, clocks and
# caches left alone), then sums the durations by kernel and grid. ncu runs
# the kernels one after another, so these are each kernel's own times: no
# overlap with its neighbours (programmatic dependent launch) and no launch
# gaps, i.e. what each would cost if the step were only its kernels.
#
#   sh bench/cuda_kernel_times.sh LOOM MODEL_DIR [tokens, default 16]
#
# Environment: NCU (default: ncu on PATH, else under /usr/local/cuda/bin or
# /opt/nvidia), KT_LAUNCHES (kernels profiled, default 1500).
set -u
LOOM=$1
MODEL=$2
N=${3:-16}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then
  echo "cuda_kernel_times: no ncu found"
  exit 2
fi
tmp=${TMPDIR:-/tmp}/kt.$$
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --print-units base -k 'regex:gemv|qkv_post|attn_decode|argmax|embed|combine' \
  --launch-count "${KT_LAUNCHES:-1500}" --log-file "$tmp.csv" \
  "$LOOM" bench --device cuda --model "$MODEL" -p 0 -n "$N" --tg-prompt 128 --reps 1 \
  --kv-type bf16 >"$tmp.out" 2>&1
rc=$?
tail -n 3 "$tmp.out"
python3 - "$tmp.csv" <<'EOF'
import csv, sys, statistics
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
    rows.append((name, r.get("Grid Size", ""), r.get("Block Size", ""), ns / 1e3))
if not rows:
    print("cuda_kernel_times: no kernel rows in the ncu output")
    sys.exit(1)
print(f"{len(rows)} kernels profiled")
by = {}
for name, grid, block, us in rows:
    by.setdefault(name, []).append(us)
print("| kernel | launches | total us | median us |")
print("| --- | ---: | ---: | ---: |")
for name, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
    print(f"| {name} | {len(v)} | {sum(v):.0f} | {statistics.median(v):.2f} |")
print()
groups = {}
for name, grid, block, us in rows:
    groups.setdefault((name, grid, block), []).append(us)
print("| kernel | grid | block | launches | median us | mean us |")
print("| --- | --- | --- | ---: | ---: | ---: |")
for (name, grid, block), v in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
    print(f"| {name} | {grid} | {block} | {len(v)} | {statistics.median(v):.2f} | "
          f"{statistics.mean(v):.2f} |")
EOF
rm -f "$tmp.csv" "$tmp.out"
exit $rc
