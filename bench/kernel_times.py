"""Sums an Nsight Compute CSV (gpu__time_duration.sum per launch) by kernel
and by (kernel, grid, block), for bench/cuda_kernel_times.sh.

    python3 bench/kernel_times.py CSV MODE [ROWS]

MODE tg: every launch in the file. MODE prefill or decode: only the last
step, from the last embedding gather on (for decode, the last gather of
ROWS tokens: the whole batch's step)."""
import csv
import statistics
import sys


def tokens(grid):
    parts = grid.strip("()").split(",")
    return parts[1].strip() if len(parts) > 1 else ""


def main():
    path, mode = sys.argv[1], sys.argv[2]
    want = sys.argv[3] if len(sys.argv) > 3 else ""
    rows = []
    try:
        with open(path, newline="") as f:
            lines = [l for l in f if l.startswith('"')]
    except OSError as e:
        print(f"cuda_kernel_times: no ncu output: {e}")
        return 1
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            ns = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        name = r["Kernel Name"].split("(")[0].replace("void ", "")[:60]
        rows.append((name, r.get("Grid Size", ""), r.get("Block Size", ""), ns / 1e3))
    if not rows:
        print("cuda_kernel_times: no kernel rows in the ncu output")
        return 1
    if mode != "tg":
        # a step starts at its embedding gather, whose grid is (x, tokens, 1)
        last = max((i for i, r in enumerate(rows)
                    if "embed" in r[0] and (not want or tokens(r[1]) == want)), default=0)
        ends = [i for i, r in enumerate(rows) if "embed" in r[0] and i > last]
        rows = rows[last:ends[0]] if ends else rows[last:]
    tot = sum(r[3] for r in rows)
    what = "profiled" if mode == "tg" else "in the last step"
    print(f"{len(rows)} kernels {what}, {tot / 1e3:.3f} ms of kernel time")
    by = {}
    for name, grid, block, us in rows:
        by.setdefault(name, []).append(us)
    print("| kernel | launches | total ms | share | median us |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {name} | {len(v)} | {sum(v) / 1e3:.3f} | {sum(v) / tot:.1%} | "
              f"{statistics.median(v):.2f} |")
    print()
    groups = {}
    for name, grid, block, us in rows:
        groups.setdefault((name, grid, block), []).append(us)
    print("| kernel | grid | block | launches | median us | mean us | total ms |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for (name, grid, block), v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:25]:
        print(f"| {name} | {grid} | {block} | {len(v)} | {statistics.median(v):.2f} | "
              f"{statistics.mean(v):.2f} | {sum(v) / 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
