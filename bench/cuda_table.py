#!/usr/bin/env python3
"""cuda_table: bench/cuda_bench.sh's table, one block of rows per model:
loom, the peer, their ratio, and the physical bound of each figure.

  cuda_table.py OUTD DIR "MODELS" PROMPT GEN COMMIT

The bound is counted from the model itself (DIR/NAME/config.json and the
safetensors header), so it holds for every family:
  decode, batch B: copy bandwidth * B / bytes one step must move, where the
    bytes are every weight read once (an embedding table one row per token
    unless it is also the head; a routed expert only where some token of
    the step picks it: E * (1 - (1 - k/E)^B) experts of E at top k, routing
    taken as uniform), plus each sequence's K and V (bf16, layers that own
    their KV; a sliding layer at most its window) at the average context,
    plus each linear-attention layer's f32 recurrent state read and written;
  prefill of P tokens: GEMM rate / FLOPs per token, where FLOPs are twice
    the weights a token multiplies (experts at k of E; embeddings and the
    head, which runs on the last position only, left out), plus causal
    attention (4 * heads * head_dim * average span per attention layer) and
    the delta rule's 4 * value heads * key dim * value dim per linear layer.
"""
import json
import os
import re
import struct
import sys

DT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U32": 4, "I32": 4, "U8": 1}


def load(p):
    try:
        with open(p) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception:
        return None


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def text_cfg(cfg):
    return cfg.get("text_config", cfg)


class Shape:
    """What the bound needs of one model directory."""

    def __init__(self, d):
        cfg = text_cfg(json.load(open(os.path.join(d, "config.json"))))
        h = header(os.path.join(d, "model.safetensors"))
        self.H = cfg["hidden_size"]
        self.L = cfg["num_hidden_layers"]
        nh = cfg["num_attention_heads"]
        self.nh = nh
        self.nkv = cfg.get("num_key_value_heads", nh)
        hd = cfg.get("head_dim") or self.H // nh
        types = cfg.get("layer_types") or ["full_attention"] * self.L
        self.types = types
        ghd = cfg.get("global_head_dim") or hd
        self.hd = [ghd if t == "full_attention" else hd for t in types]
        self.window = cfg.get("sliding_window") or 0
        self.shared = cfg.get("num_kv_shared_layers") or 0
        E = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        self.E, self.k = E, cfg.get("num_experts_per_tok") or cfg.get("top_k_experts") or 0
        self.tied = "lm_head.weight" not in h
        self.dense = 0      # bytes read whole every step
        self.expert = 0     # bytes of one routed expert, summed over layers
        self.flop_w = 0     # weights a prompt token multiplies (experts at k/E)
        self.row = 0        # bytes of one token's embedding rows
        for name, t in h.items():
            n = 1
            for s in t["shape"]:
                n *= s
            b = n * DT_BYTES.get(t["dtype"], 2)
            if name.endswith("embed_tokens.weight") and "per_layer" not in name:
                self.row += b // max(t["shape"][0], 1)
                if self.tied:
                    self.dense += b
                continue
            if "embed_tokens_per_layer" in name:
                self.row += b // max(t["shape"][0], 1)
                continue
            if name == "lm_head.weight":
                self.dense += b
                continue
            if re.search(r"\.experts\.\d+\.", name):
                self.expert += b / max(E, 1)
                self.flop_w += n * self.k / max(E, 1)
                continue
            self.dense += b
            if len(t["shape"]) == 2:
                self.flop_w += n
        nv = cfg.get("linear_num_value_heads") or 0
        dk = cfg.get("linear_key_head_dim") or 0
        dv = cfg.get("linear_value_head_dim") or 0
        self.n_lin = sum(t == "linear_attention" for t in types)
        self.lin_state = nv * dk * dv * 4
        self.lin_flops = 4 * nv * dk * dv

    def own_kv(self, l):
        return self.types[l] != "linear_attention" and l < self.L - self.shared

    def span(self, l, ctx):
        if self.types[l] == "sliding_attention" and self.window:
            return min(ctx, self.window)
        return ctx

    def step_bytes(self, B, ctx):
        touched = self.E * (1 - (1 - self.k / self.E) ** B) if self.E else 0
        kv = sum(2 * self.nkv * self.hd[l] * 2 * self.span(l, ctx)
                 for l in range(self.L) if self.own_kv(l))
        return (self.dense + touched * self.expert + B * self.row + B * kv +
                B * self.n_lin * 2 * self.lin_state)

    def prefill_flops(self, P):
        att = sum(4 * self.nh * self.hd[l] * self.span(l, P / 2)
                  for l in range(self.L) if self.types[l] != "linear_attention")
        return 2 * self.flop_w + att + self.n_lin * self.lin_flops


def main():
    outd, dir_, models, prompt, gen, commit = sys.argv[1:7]
    models, prompt, gen = models.split(), int(prompt), int(gen)
    lim = load(os.path.join(outd, "limits.json"))
    bw, peak = lim["copy_bytes_s"], lim["gemm_flop_s"]
    print(f"{lim['gpu']}: copy {bw / 1e12:.2f} TB/s (read + write), bf16 GEMM 8192^3 "
          f"{peak / 1e12:.0f} TFLOP/s; commit {commit}")
    print()
    print("| model | figure | loom | peer | loom / peer | bound | loom / bound | peer / bound |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in models:
        if not os.path.exists(os.path.join(dir_, m, "model.safetensors")):
            print(f"| {m} | (not written, see the log) | | | | | | |")
            continue
        s = Shape(os.path.join(dir_, m))
        lo = load(os.path.join(outd, f"loom-{m}.json"))
        pe = load(os.path.join(outd, f"peer-{m}.json"))

        def row(fig, a, b, bound):
            f = lambda x: f"{x:,.0f}" if x else "-"
            r = lambda x, y: f"{x / y:.2f}" if x and y else "-"
            print(f"| {m} | {fig} | {f(a)} | {f(b)} | {r(a, b)} | {f(bound)} | {r(a, bound)} | "
                  f"{r(b, bound)} |")
        P = (lo or {}).get("p") or (pe or {}).get("prefill") or 4096
        row(f"prefill {P} tok/s", (lo or {}).get("pp_tok_s"), (pe or {}).get("prefill_tok_s"),
            peak / s.prefill_flops(P))
        lb = {x["b"]: x for x in (lo or {}).get("batch", [])}
        pb = {x["b"]: x for x in (pe or {}).get("batch", [])}
        for B in sorted(set(lb) | set(pb)):
            bound = B * bw / s.step_bytes(B, prompt + gen / 2)
            how = pb.get(B, {}).get("how", "")
            fig = f"decode b{B} tok/s" + (" (peer: generate)" if how == "generate" else "")
            row(fig, lb.get(B, {}).get("tok_s"), pb.get(B, {}).get("tok_s"), bound)
        if lo:
            print(f"| {m} | (loom tg{lo['n']}, one context) | {lo['tg_tok_s']:,.0f} | | | | | |")
        if pe is None:
            print(f"| {m} | (peer: did not run, see the log) | | | | | | |")
    print()
    print(f"decode: prompt {prompt} tokens, {gen} generated per sequence, greedy, bf16 KV; "
          "bounds as bench/cuda_table.py's docstring counts them")


if __name__ == "__main__":
    main()
