#!/usr/bin/env python3
"""cuda_peer: the GPU's physical limits and the PyTorch + transformers peer
for bench/cuda_bench.sh, one JSON object per line on stdout.

  cuda_peer.py limits
      device-to-device copy bandwidth (bytes read + written) and the bf16
      8192^3 GEMM rate, on random data, timed with CUDA events (medians).
  cuda_peer.py model DIR [--prefill 4096] [--batch 1,8,32,128]
                         [--prompt 128] [--gen 128] [--reps 3]
      builds the model of DIR/config.json with random weights in bf16 on the
      GPU (attn_implementation="sdpa"), then: prefill tok/s of one prompt
      (logits of the last position only), and decode tok/s at each batch
      size: a static KV cache (transformers' StaticCache), the prompt in one
      forward, then n - 1 one-token forwards each feeding back the argmax,
      timed over those n - 1 steps only. The loop is written out rather than
      generate(), whose per-step bookkeeping costs more than the forward of
      a small model; generate() is the fallback where StaticCache cannot be
      built. No torch.compile. --graphs also times the loop with the
      one-token forward replayed from a CUDA graph (the faster figure is
      kept); off by default: on transformers 5.17 the capture ended in a
      device-side assert (index_copy_ out of bounds in the cache update),
      which ends the process.
"""
import argparse
import json
import statistics
import sys
import time

import torch


def cuda_time(fn, reps, warm=1):
    """Median seconds of fn() over reps runs after warm runs, by CUDA events."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times), times


def limits():
    dev = torch.cuda.get_device_properties(0)
    # copy: 4 GiB source, random bytes (never zeros), several buffers so
    # nothing stays in the 60 MB L2
    n = 4 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t, _ = cuda_time(lambda: dst.copy_(src), reps=20, warm=3)
    assert torch.equal(dst[:1 << 20], src[:1 << 20])
    copy_bw = 2 * n / t
    del src, dst
    # GEMM: 8192^3 bf16, random normal inputs, three input sets rotated
    m = 8192
    sets = [(torch.randn(m, m, device="cuda", dtype=torch.bfloat16),
             torch.randn(m, m, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
    out = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    k = [0]

    def mm():
        a, b = sets[k[0] % 3]
        k[0] += 1
        torch.matmul(a, b, out=out)
    t, _ = cuda_time(mm, reps=20, warm=5)
    # check one product against f32 on a corner
    a, b = sets[0]
    ref = a[:256].float() @ b[:, :256].float()
    got = (a[:256] @ b[:, :256]).float()
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, rel
    print(json.dumps({"what": "limits", "gpu": dev.name, "sms": dev.multi_processor_count,
                      "copy_bytes_s": copy_bw, "gemm_flop_s": 2 * m ** 3 / t,
                      "gemm_rel_err": rel, "torch": torch.__version__}), flush=True)


def build(dir_):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(dir_)
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
    model.eval()
    return model, cfg, transformers.__version__


def gen(model, ids, n, state):
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
              do_sample=False, pad_token_id=0)
    if state.get("static", True):
        kw["cache_implementation"] = "static"
    if state.get("no_compile", True):
        kw["disable_compile"] = True
    try:
        return model.generate(ids, **kw)
    except (TypeError, ValueError) as e:
        if "disable_compile" in kw and state.get("no_compile", True):
            state["no_compile"] = False
            print(f"cuda_peer: generate without disable_compile ({e})", file=sys.stderr)
            return gen(model, ids, n, state)
        if state.get("static", True):
            state["static"] = False
            print(f"cuda_peer: static cache refused, dynamic cache ({e})", file=sys.stderr)
            return gen(model, ids, n, state)
        raise


def make_cache(cfg, B, n):
    """A StaticCache for B sequences of n positions, whatever the
    constructor's signature in this transformers version."""
    import inspect
    from transformers import StaticCache
    params = inspect.signature(StaticCache.__init__).parameters
    kw = {"config": cfg, "max_cache_len": n}
    if "max_batch_size" in params:
        kw["max_batch_size"] = B
    if "batch_size" in params:
        kw["batch_size"] = B
    if "device" in params:
        kw["device"] = "cuda"
    if "dtype" in params:
        kw["dtype"] = torch.bfloat16
    return StaticCache(**kw)


def decode_loop(model, cfg, ids, n):
    """Seconds of the n - 1 one-token steps after the prompt (CUDA events),
    and the tokens."""
    B, P = ids.shape
    cache = make_cache(cfg, B, P + n)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                cache_position=torch.arange(P, device="cuda"))
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    toks = [tok]
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(n - 1):
        out = model(input_ids=tok, past_key_values=cache, use_cache=True,
                    cache_position=torch.tensor([P + i], device="cuda"))
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(tok)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3, torch.cat(toks, 1)


def decode_graph(model, cfg, ids, n):
    """decode_loop with each one-token forward replayed from a CUDA graph
    (torch.cuda.CUDAGraph over the eager forward, static cache, fixed
    input buffers): what loom does, and what torch.compile's
    reduce-overhead mode would add to eager. Raises if the forward cannot
    be captured."""
    B, P = ids.shape
    cache = make_cache(cfg, B, P + n)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                cache_position=torch.arange(P, device="cuda"))
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    static_tok = tok.clone()
    static_pos = torch.full((1,), P, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream; rewrites position P only
        for _ in range(2):
            model(input_ids=static_tok, past_key_values=cache, use_cache=True,
                  cache_position=static_pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = model(input_ids=static_tok, past_key_values=cache, use_cache=True,
                  cache_position=static_pos)
        nxt = o.logits[:, -1].argmax(-1, keepdim=True)
    toks = torch.empty(B, n, dtype=torch.long, device="cuda")
    toks[:, :1] = tok
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(n - 1):
        static_pos.fill_(P + i)
        graph.replay()
        static_tok.copy_(nxt)
        toks[:, i + 1:i + 2] = nxt
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3, toks


def run_model(a):
    model, cfg, tv = build(a.dir)
    V = cfg.vocab_size
    g = torch.Generator(device="cuda").manual_seed(1)
    res = {"what": "peer", "dir": a.dir, "arch": cfg.architectures[0], "transformers": tv,
           "torch": torch.__version__}
    with torch.inference_mode():
        if a.prefill:
            ids = torch.randint(1, V, (1, a.prefill), device="cuda", generator=g)

            def pf():
                return model(ids, use_cache=False, logits_to_keep=1).logits
            lg = pf()
            assert torch.isfinite(lg.float()).all(), "prefill logits not finite"
            t, ts = cuda_time(pf, reps=a.reps, warm=1)
            res["prefill"] = a.prefill
            res["prefill_tok_s"] = a.prefill / t
            res["prefill_s"] = ts
            print(f"cuda_peer: prefill {a.prefill}: {a.prefill / t:.0f} tok/s", file=sys.stderr,
                  flush=True)
        state = {}
        res["batch"] = []
        loop = True
        graphs = a.graphs
        for B in a.batch:
            ids = torch.randint(1, V, (B, a.prompt), device="cuda", generator=g)
            if loop:
                try:
                    _, toks = decode_loop(model, cfg, ids, a.gen)  # warm-up, and the check
                    assert toks.shape == (B, a.gen), toks.shape
                    ts = sorted(decode_loop(model, cfg, ids, a.gen)[0] for _ in range(a.reps))
                    eager = B * (a.gen - 1) / ts[len(ts) // 2]
                    row = {"b": B, "tok_s": eager, "how": "static-cache loop", "eager_tok_s": eager,
                           "t_steps_s": ts}
                    if graphs:
                        try:
                            _, gt = decode_graph(model, cfg, ids, a.gen)
                            same = int((gt[:, :8] == toks[:, :8]).all(1).sum())
                            tg = sorted(decode_graph(model, cfg, ids, a.gen)[0] for _ in range(a.reps))
                            row["graph_tok_s"] = B * (a.gen - 1) / tg[len(tg) // 2]
                            row["graph_rows_match_eager"] = same
                            if row["graph_tok_s"] > eager:
                                row["tok_s"], row["how"] = row["graph_tok_s"], "static cache + CUDA graph"
                        except Exception as e:
                            graphs = False
                            print(f"cuda_peer: CUDA graph capture failed ({e!r}); eager only",
                                  file=sys.stderr, flush=True)
                    res["batch"].append(row)
                    print(f"cuda_peer: batch {B}: eager {eager:.1f} tok/s, graph "
                          f"{row.get('graph_tok_s', 0):.1f} tok/s", file=sys.stderr, flush=True)
                    continue
                except Exception as e:
                    loop = False
                    print(f"cuda_peer: the static-cache loop failed ({e!r}); generate()",
                          file=sys.stderr, flush=True)
            out = gen(model, ids, a.gen, state)  # warm-up, and the check
            assert out.shape == (B, a.prompt + a.gen), out.shape
            t_n, _ = cuda_time(lambda: gen(model, ids, a.gen, state), reps=a.reps, warm=0)
            t_1, _ = cuda_time(lambda: gen(model, ids, 1, state), reps=a.reps, warm=1)
            tok_s = B * (a.gen - 1) / (t_n - t_1)
            res["batch"].append({"b": B, "tok_s": tok_s, "how": "generate", "t_gen_s": t_n,
                                 "t_first_s": t_1})
            print(f"cuda_peer: batch {B}: {tok_s:.1f} tok/s (generate)", file=sys.stderr, flush=True)
        res["static_cache"] = state.get("static", True)
    print(json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("limits")
    m = sub.add_parser("model")
    m.add_argument("dir")
    m.add_argument("--prefill", type=int, default=4096)
    m.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",") if x],
                   default=[1, 8, 32, 128])
    m.add_argument("--prompt", type=int, default=128)
    m.add_argument("--gen", type=int, default=128)
    m.add_argument("--reps", type=int, default=3)
    m.add_argument("--graphs", action="store_true")
    a = ap.parse_args()
    if a.cmd == "limits":
        limits()
    else:
        run_model(a)


if __name__ == "__main__":
    main()
