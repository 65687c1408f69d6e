#!/usr/bin/env python3
"""Writes tests/fixtures/models/qwen3-tiny-fp8: the qwen3-tiny fixture stored
as the Hugging Face FP8 checkpoints (Qwen3-*-FP8) store their weights, with
reference logits and greedy continuations from transformers.

Layout written, as the official FP8 releases have it:
  config.json        the source config plus
                     "quantization_config": {"quant_method": "fp8",
                     "fmt": "e4m3", "activation_scheme": "dynamic",
                     "weight_block_size": [128, 128],
                     "modules_to_not_convert": [...]}
  model.safetensors  every quantized linear as X.weight F8_E4M3 [out, in]
                     and X.weight_scale_inv [ceil(out/128), ceil(in/128)];
                     dequantized w[i][j] = float(q[i][j]) *
                     scale_inv[i/128][j/128]. Everything else (embeddings,
                     norms, the linears in modules_to_not_convert) BF16.
  reference.safetensors
                     prompt.i.ids / prompt.i.logits / prompt.i.greedy for the
                     same prompts as qwen3-tiny's reference, computed in
                     float64 by transformers' Qwen3ForCausalLM on the
                     dequantized weights (and the BF16-rounded others).

qwen3-tiny has hidden 64 and intermediate 192, so every block is partial in
at least one direction (64 of 128) and gate/up (two row blocks) and down
(two column blocks) index past the first block. Layer 1 stores its scales
as BF16 (some releases do), the other layers as F32; the reference uses the
scale exactly as stored. Layer 2's o_proj is left unquantized and listed in
modules_to_not_convert.

Checks made before writing: transformers on the source fixture's weights
reproduces qwen3-tiny's reference logits; torch's float8_e4m3fn decode equals
the E4M3 formula (bias 7, no infinities, 0x7f/0xff NaN); every code fits
the format (no NaN, |q| <= 448).

Needs torch (>= 2.1, for float8_e4m3fn), transformers (5.x) and
safetensors; CPU only. Usage, from the repo root:
  python3 tools/make_fp8_fixture.py [--src tests/fixtures/models/qwen3-tiny]
      [--out tests/fixtures/models/qwen3-tiny-fp8]
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

BLOCK = 128
E4M3_MAX = 448.0
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
           "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NOT_CONVERTED = ["lm_head", "model.layers.2.self_attn.o_proj"]
BF16_SCALE_LAYER = 1
GREEDY_STEPS = 20


def e4m3_decode(byte):
    """The E4M3 "fn" format by its definition: sign, 4 exponent bits
    (bias 7), 3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN
    and there are no infinities."""
    s = -1.0 if byte & 0x80 else 1.0
    e = (byte >> 3) & 0xF
    m = byte & 0x7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * (m / 8.0) * 2.0 ** -6
    return s * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def check_decode():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = codes.view(torch.float8_e4m3fn).to(torch.float64).tolist()
    for b in range(256):
        want = e4m3_decode(b)
        if math.isnan(want) != math.isnan(got[b]) or \
                (not math.isnan(want) and want != got[b]):
            sys.exit(f"E4M3 code 0x{b:02x}: torch gives {got[b]}, formula {want}")
    if max(abs(v) for v in got if not math.isnan(v)) != E4M3_MAX:
        sys.exit("E4M3 max is not 448")


def quantize_block_fp8(w, scale_dtype):
    """w: float32 [out, in]. Per 128x128 block (partial at the edges):
    scale = amax / 448, q = e4m3(w / scale), as the FP8 releases quantize.
    Returns (q float8_e4m3fn [out, in], scale_inv [bo, bi] in scale_dtype,
    dequantized float64 [out, in] from exactly the stored values)."""
    out_f, in_f = w.shape
    bo, bi = -(-out_f // BLOCK), -(-in_f // BLOCK)
    scale = torch.empty(bo, bi, dtype=torch.float32)
    for r in range(bo):
        for c in range(bi):
            blk = w[r * BLOCK:(r + 1) * BLOCK, c * BLOCK:(c + 1) * BLOCK]
            amax = blk.abs().max().item()
            scale[r, c] = max(amax, 1e-12) / E4M3_MAX
    # The stored scale is what dequantization multiplies by, so quantize
    # against the scale as stored (BF16-rounded where it is stored BF16).
    scale = scale.to(scale_dtype)
    full = scale.to(torch.float32).repeat_interleave(BLOCK, 0)[:out_f]
    full = full.repeat_interleave(BLOCK, 1)[:, :in_f]
    # Casting to float8_e4m3fn does not saturate: clamp first.
    q = (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    qf = q.to(torch.float64)
    if torch.isnan(qf).any():
        sys.exit("a quantized weight is NaN")
    deq = qf * full.to(torch.float64)
    # Scales as stored, widened exactly.
    deq_check = qf * scale.to(torch.float64).repeat_interleave(BLOCK, 0)[:out_f] \
        .repeat_interleave(BLOCK, 1)[:, :in_f]
    assert torch.equal(deq, deq_check)
    return q, scale.contiguous(), deq


def bf16_exact(t):
    return t.to(torch.bfloat16)


class Rope64(torch.nn.Module):
    """Default rotary embedding with cos/sin in float64 (transformers may
    compute them in float32); used when it reproduces the source reference
    better than the stock module does."""

    def __init__(self, theta, dim):
        super().__init__()
        self.inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def forward(self, x, position_ids, **kwargs):
        f = position_ids[..., None].to(torch.float64) * self.inv
        emb = torch.cat((f, f), -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def load_model(src, state64, cfg, rope64):
    from transformers import AutoConfig, Qwen3ForCausalLM
    conf = AutoConfig.from_pretrained(src)
    try:
        conf._attn_implementation = "eager"
    except Exception:
        pass
    model = Qwen3ForCausalLM(conf).to(torch.float64).eval()
    for name, p in model.named_parameters():
        key = name
        if name == "lm_head.weight" and key not in state64 and cfg.get("tie_word_embeddings"):
            key = "model.embed_tokens.weight"
        if key not in state64:
            sys.exit(f"no weight for parameter {name}")
        with torch.no_grad():
            p.copy_(state64[key])
    if cfg.get("tie_word_embeddings") and not torch.equal(
            model.lm_head.weight, model.model.embed_tokens.weight):
        sys.exit("lm_head is not tied to the embeddings")
    if rope64:
        rp = cfg.get("rope_parameters") or {}
        theta = rp.get("rope_theta", cfg.get("rope_theta"))
        if (rp.get("rope_type") or "default") != "default" or theta is None:
            return None
        model.model.rotary_emb = Rope64(float(theta), cfg["head_dim"])
    return model


@torch.no_grad()
def logits_of(model, ids):
    x = torch.tensor([ids], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0]


@torch.no_grad()
def greedy(model, ids, steps):
    seq = list(ids)
    out = []
    for _ in range(steps):
        nxt = int(logits_of(model, seq)[-1].argmax())
        out.append(nxt)
        seq.append(nxt)
    return out


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="tests/fixtures/models/qwen3-tiny")
    ap.add_argument("--out", default="tests/fixtures/models/qwen3-tiny-fp8")
    a = ap.parse_args()
    torch.manual_seed(0)
    check_decode()

    cfg = json.load(open(os.path.join(a.src, "config.json")))
    if cfg.get("model_type") != "qwen3":
        sys.exit(f"{a.src}: expected model_type qwen3, found {cfg.get('model_type')}")
    src_w = load_file(os.path.join(a.src, "model.safetensors"))
    ref = load_file(os.path.join(a.src, "reference.safetensors"))
    nprompt = sum(1 for k in ref if k.endswith(".ids"))

    # The forward setup reproduces the source reference before it is
    # trusted; of the stock rotary module and a float64 one, the one that
    # reproduces it better computes the new reference.
    src64 = {k: v.to(torch.float64) for k, v in src_w.items()}
    best = None
    for rope64 in (False, True):
        model = load_model(a.src, src64, cfg, rope64)
        if model is None:
            continue
        worst = 0.0
        for i in range(nprompt):
            ids = ref[f"prompt.{i}.ids"].tolist()
            worst = max(worst, rel_err(logits_of(model, ids).to(torch.float64),
                                       ref[f"prompt.{i}.logits"].to(torch.float64)))
        print(f"source reference reproduced ({'float64' if rope64 else 'stock'} rotary): "
              f"max rel err {worst:.3g}")
        if best is None or worst < best[0]:
            best = (worst, rope64)
    if best[0] > 1e-5:
        sys.exit("transformers does not reproduce the source fixture's reference; "
                 "refusing to write a reference from this setup")
    rope64 = best[1]

    stored = {}
    state64 = {}
    nq = 0
    for name, w in src_w.items():
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        quant = mod is not None and mod.split(".", 3)[-1] in LINEARS and mod not in NOT_CONVERTED
        if quant:
            layer = int(name.split(".")[2])
            sdt = torch.bfloat16 if layer == BF16_SCALE_LAYER else torch.float32
            q, s, deq = quantize_block_fp8(w.to(torch.float32), sdt)
            stored[name] = q
            stored[mod + ".weight_scale_inv"] = s
            state64[name] = deq
            nq += 1
        else:
            b = bf16_exact(w)
            stored[name] = b
            state64[name] = b.to(torch.float64)
    print(f"{nq} linears quantized to E4M3, 128x128 blocks")

    model = load_model(a.src, state64, cfg, rope64)
    out = {}
    for i in range(nprompt):
        ids = ref[f"prompt.{i}.ids"].tolist()
        lg = logits_of(model, ids)
        g = greedy(model, ids, GREEDY_STEPS)
        assert g[0] == int(lg[-1].argmax())
        out[f"prompt.{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
        out[f"prompt.{i}.logits"] = lg.to(torch.float32).contiguous()
        out[f"prompt.{i}.greedy"] = torch.tensor(g, dtype=torch.int32)
        print(f"prompt {i}: {len(ids)} tokens, greedy {g[:8]}...")

    os.makedirs(a.out, exist_ok=True)
    ocfg = dict(cfg)
    ocfg["dtype"] = "bfloat16"
    ocfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": NOT_CONVERTED,
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(ocfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(stored, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    import transformers
    save_file(out, os.path.join(a.out, "reference.safetensors"), metadata={
        "greedy": "argmax, full recompute each step",
        "transformers": transformers.__version__,
        "math": "float64 on the dequantized weights",
        "rotary": "float64" if rope64 else "transformers' own",
        "source": os.path.basename(os.path.normpath(a.src)),
    })
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "vocab.json", "merges.txt"):
        p = os.path.join(a.src, extra)
        if os.path.exists(p):
            shutil.copy(p, os.path.join(a.out, extra))

    # Read back what was written: dtypes as the format names them.
    import struct
    raw = open(os.path.join(a.out, "model.safetensors"), "rb").read()
    hdr = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    kinds = sorted({v["dtype"] for k, v in hdr.items() if k != "__metadata__"})
    print(f"wrote {a.out}: dtypes {kinds}")
    if "F8_E4M3" not in kinds:
        sys.exit("safetensors did not store F8_E4M3")


if __name__ == "__main__":
    main()
