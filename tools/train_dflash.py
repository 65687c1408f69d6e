#!/usr/bin/env python3
"""Trains a projected-context drafter (DFlashDraftModel, block drafting) for
a Qwen3 target such as tests/fixtures/trained/pycoder-16m, and writes it in
loom's layout (docs/dflash.md): config.json + model.safetensors.

Needs only PyTorch and safetensors (tokenizers is used when present, else a
plain-Python byte-level BPE reads tokenizer.json). No downloads: the
training text is the Python source found on this machine (sys.path), less
every file whose content appears in the held-out text (the evaluation
documents and bench/spec_heldout.py), by hash, by name and by probes.

The drafter learns the target's own greedy continuations: each training
sequence is a prompt from the corpus followed by the frozen target's greedy
tokens, so a block anchored anywhere after the prompt has the target's
exact greedy continuation as its labels.

Usage (from the repo root):
  python3 tools/train_dflash.py --target tests/fixtures/trained/pycoder-16m \\
      --out models/pycoder-16m-dflash [--budget 300] [--smoke]
"""
import argparse
import hashlib
import json
import math
import os
import random
import re
import sys
import time

EOS = "<|endoftext|>"


def log(*a):
    print(*a, flush=True)


# ---- tokenizer -------------------------------------------------------------


def _byte_map():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class PyBPE:
    """Byte-level BPE from tokenizer.json, for when tokenizers is absent."""

    def __init__(self, path):
        t = json.load(open(path, encoding="utf-8"))
        self.vocab = t["model"]["vocab"]
        merges = t["model"]["merges"]
        self.ranks = {}
        for i, m in enumerate(merges):
            a, b = m if isinstance(m, list) else m.split(" ", 1)
            self.ranks[(a, b)] = i
        self.bmap = _byte_map()
        self.cache = {}
        try:
            import regex
            self.pat = regex.compile(
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        except ImportError:  # letters as [^\W\d_], near enough for training text
            self.pat = re.compile(
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d|"
                r" ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

    def _word(self, w):
        ids = self.cache.get(w)
        if ids is not None:
            return ids
        parts = [self.bmap[b] for b in w.encode("utf-8")]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        ids = [self.vocab[p] for p in parts]
        if len(self.cache) < 500000:
            self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for m in self.pat.finditer(text):
            out.extend(self._word(m.group(0)))
        return out


def load_tokenizer(model_dir):
    path = os.path.join(model_dir, "tokenizer.json")
    try:
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(path)
        log("tokenizer: tokenizers", getattr(sys.modules.get("tokenizers"), "__version__", ""))
        return lambda s: tk.encode(s, add_special_tokens=False).ids
    except Exception as e:  # absent or unreadable: the plain one
        log("tokenizer: plain-Python BPE (%s)" % type(e).__name__)
        return PyBPE(path).encode


# ---- training text -----------------------------------------------------------


def _norm(s):
    return "\n".join(l.rstrip() for l in s.strip().splitlines())


class HeldOut:
    """The held-out text: what training must not contain."""

    def __init__(self, paths):
        self.text = ""
        self.hashes = set()
        self.names = set()
        for p in paths:
            if not os.path.isfile(p):
                sys.exit("held-out text: %s not found (run from the repo root)" % p)
            t = open(p, encoding="utf-8", errors="replace").read()
            self.names.add(os.path.basename(p))
            docs = t.split(EOS) if EOS in t else [t]
            for d in docs:
                if d.strip():
                    self.hashes.add(hashlib.sha256(_norm(d).encode()).hexdigest())
            self.text += "\n" + _norm(t) + "\n"
        log("held out: %d documents, %d chars, from %s" % (len(self.hashes), len(self.text), paths))

    def contains(self, name, content):
        if name in self.names:
            return True
        n = _norm(content)
        if hashlib.sha256(n.encode()).hexdigest() in self.hashes:
            return True
        if len(n) < 200:
            return n in self.text if n else False
        # three probes of 160 chars: a file shown in part is out as well
        for at in (0, len(n) // 2 - 80, len(n) - 160):
            if n[at:at + 160] in self.text:
                return True
        return False


def python_files(limit_bytes, seed):
    seen, files = set(), []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    for root in roots:
        for dp, dn, fn in os.walk(root, followlinks=False):
            dn[:] = [d for d in dn if d not in ("__pycache__",) and not d.startswith(".")]
            for f in fn:
                if not f.endswith(".py"):
                    continue
                p = os.path.realpath(os.path.join(dp, f))
                if p in seen:
                    continue
                seen.add(p)
                try:
                    sz = os.path.getsize(p)
                except OSError:
                    continue
                if 200 <= sz <= 400000:
                    files.append(p)
    random.Random(seed).shuffle(files)
    log("corpus: %d Python files under %d sys.path roots" % (len(files), len(roots)))
    return files


def build_corpus(files, held, encode, limit_bytes):
    """Token ids of the kept files, each followed by <|endoftext|> (id 0)."""
    ids, used, skipped, hashes = [], 0, 0, set()
    for p in files:
        if used >= limit_bytes:
            break
        try:
            t = open(p, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        h = hashlib.sha256(t.encode()).hexdigest()
        if h in hashes:
            continue
        hashes.add(h)
        if held.contains(os.path.basename(p), t):
            skipped += 1
            continue
        ids.extend(encode(t))
        ids.append(0)
        used += len(t)
    log("corpus: %d chars, %d tokens; %d files left out as held-out" % (used, len(ids), skipped))
    return ids


# ---- models --------------------------------------------------------------------


def build(torch):
    nn = torch.nn
    F = torch.nn.functional

    def rms(x, w, eps):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xf * w.float()).to(x.dtype)

    class Norm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return rms(x, self.weight, self.eps)

    def rope(x, pos, theta):
        """x [B, heads, T, hd], pos [B, T] (or [T]); rotate-half (Qwen3)."""
        hd = x.shape[-1]
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
        if pos.dim() == 1:
            pos = pos.unsqueeze(0)
        f = pos.float().unsqueeze(-1) * inv  # [B, T, hd/2]
        e = torch.cat([f, f], -1).unsqueeze(1)  # [B, 1, T, hd]
        cos, sin = e.cos(), e.sin()
        xf = x.float()
        x1, x2 = xf[..., : hd // 2], xf[..., hd // 2:]
        rot = torch.cat([-x2, x1], -1)
        return (xf * cos + rot * sin).to(x.dtype)

    class Layer(nn.Module):
        """A Qwen3 decoder layer's weights (names as in HF checkpoints)."""

        def __init__(self, H, nh, kvh, hd, inter, eps):
            super().__init__()
            self.nh, self.kvh, self.hd = nh, kvh, hd
            self.input_layernorm = Norm(H, eps)
            self.post_attention_layernorm = Norm(H, eps)
            a = nn.Module()
            a.q_proj = nn.Linear(H, nh * hd, bias=False)
            a.k_proj = nn.Linear(H, kvh * hd, bias=False)
            a.v_proj = nn.Linear(H, kvh * hd, bias=False)
            a.o_proj = nn.Linear(nh * hd, H, bias=False)
            a.q_norm = Norm(hd, eps)
            a.k_norm = Norm(hd, eps)
            self.self_attn = a
            m = nn.Module()
            m.gate_proj = nn.Linear(H, inter, bias=False)
            m.up_proj = nn.Linear(H, inter, bias=False)
            m.down_proj = nn.Linear(inter, H, bias=False)
            self.mlp = m

        def kv(self, h, pos, theta):
            """K (normed, roped) and V of rows h [B, T, H] at pos: [B, kvh, T, hd]."""
            B, T, _ = h.shape
            a = self.self_attn
            k = a.k_norm(a.k_proj(h).view(B, T, self.kvh, self.hd)).transpose(1, 2)
            v = a.v_proj(h).view(B, T, self.kvh, self.hd).transpose(1, 2)
            return rope(k, pos, theta), v

        def q(self, h, pos, theta):
            B, T, _ = h.shape
            a = self.self_attn
            q = a.q_norm(a.q_proj(h).view(B, T, self.nh, self.hd)).transpose(1, 2)
            return rope(q, pos, theta)

        def attend(self, q, k, v, mask, causal):
            g = self.nh // self.kvh
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            B, _, T, _ = o.shape
            return self.self_attn.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))

        def ffn(self, x):
            m = self.mlp
            h = self.post_attention_layernorm(x)
            return m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))

    class Target(nn.Module):
        """Qwen3ForCausalLM forward (tied or separate head), frozen."""

        def __init__(self, cfg):
            super().__init__()
            H = cfg["hidden_size"]
            self.H = H
            self.eps = cfg.get("rms_norm_eps", 1e-6)
            rp = cfg.get("rope_parameters") or {}
            self.theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
            hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
            self.embed = nn.Embedding(cfg["vocab_size"], H)
            self.layers = nn.ModuleList(
                Layer(H, cfg["num_attention_heads"], cfg["num_key_value_heads"], hd,
                      cfg["intermediate_size"], self.eps) for _ in range(cfg["num_hidden_layers"]))
            self.norm = Norm(H, self.eps)
            self.lm_head = None  # tied unless the checkpoint has one

        def head(self, h):
            w = self.embed.weight if self.lm_head is None else self.lm_head
            return h @ w.t().to(h.dtype)

        def forward(self, ids, taps=(), cache=None, start=0, head=True):
            """ids [B, T] at positions start.. (cache: per-layer [k, v] lists
            extended in place). Returns logits [B, T, V] and the taps'
            outputs concatenated [B, T, n_taps * H] (or None)."""
            B, T = ids.shape
            pos = torch.arange(start, start + T, device=ids.device)
            x = self.embed(ids)
            out = []
            for i, L in enumerate(self.layers):
                h = L.input_layernorm(x)
                q = L.q(h, pos, self.theta)
                k, v = L.kv(h, pos, self.theta)
                if cache is not None:
                    if len(cache) <= i:
                        cache.append([k, v])
                    else:
                        cache[i][0] = k = torch.cat([cache[i][0], k], 2)
                        cache[i][1] = v = torch.cat([cache[i][1], v], 2)
                x = x + L.attend(q, k, v, None, causal=(start == 0 and T > 1))
                x = x + L.ffn(x)
                if i in taps:
                    out.append((taps.index(i), x))
            out = [t for _, t in sorted(out, key=lambda p: p[0])]
            lg = self.head(self.norm(x)) if head else None
            return lg, (torch.cat(out, -1) if out else None)

    class Drafter(nn.Module):
        """The projected-context drafter (docs/dflash.md)."""

        def __init__(self, c):
            super().__init__()
            H = c["hidden_size"]
            self.c = c
            self.theta = float(c["rope_theta"])
            self.fc = nn.Linear(len(c["target_layer_ids"]) * c["target_hidden_size"], H, bias=False)
            self.hidden_norm = Norm(H, c["rms_norm_eps"])
            self.layers = nn.ModuleList(
                Layer(H, c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                      c["intermediate_size"], c["rms_norm_eps"]) for _ in range(c["num_hidden_layers"]))
            self.norm = Norm(H, c["rms_norm_eps"])

        def context(self, taps):
            return self.hidden_norm(self.fc(taps))

        def forward(self, x, pos, ctx, ctx_pos, mask):
            """x [B, Q, H] block rows (embedded) at pos [B, Q]; ctx [B, N, H]
            projected context rows at ctx_pos [B, N]; mask [B, 1, Q, N + Q]
            (True: may attend) or None. Returns the final-normed rows."""
            for L in self.layers:
                h = L.input_layernorm(x)
                q = L.q(h, pos, self.theta)
                kb, vb = L.kv(h, pos, self.theta)
                kc, vc = L.kv(ctx, ctx_pos, self.theta)
                k = torch.cat([kc, kb], 2)
                v = torch.cat([vc, vb], 2)
                x = x + L.attend(q, k, v, mask, causal=False)
                x = x + L.ffn(x)
            return self.norm(x)

    return Target, Drafter


def load_target(torch, Target, model_dir, device):
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch != "Qwen3ForCausalLM":
        sys.exit("target: expected Qwen3ForCausalLM, found %s" % arch)
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    t = Target(cfg)
    want = {}
    for k in sd:
        if k == "lm_head.weight":
            continue
        want[k.replace("model.embed_tokens.", "embed.").replace("model.layers.", "layers.")
              .replace("model.norm.", "norm.")] = sd[k].float()
    missing, unexpected = t.load_state_dict(want, strict=False)
    if missing or unexpected:
        sys.exit("target: weights do not match the config: missing %s, unexpected %s"
                 % (missing[:5], unexpected[:5]))
    t = t.to(device)
    if "lm_head.weight" in sd and not cfg.get("tie_word_embeddings", False):
        t.lm_head = sd["lm_head.weight"].float().to(device)
    t.eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t, cfg


def check_target(torch, t, model_dir, device):
    """The reimplemented forward against the checkpoint's reference logits."""
    from safetensors.torch import load_file
    path = os.path.join(model_dir, "reference.safetensors")
    if not os.path.isfile(path):
        log("target check: no reference.safetensors; skipped")
        return
    ref = load_file(path)
    worst = 0.0
    with torch.no_grad():
        for i in range(100):
            if "prompt.%d.ids" % i not in ref:
                break
            ids = ref["prompt.%d.ids" % i].long().to(device).unsqueeze(0)
            want = ref["prompt.%d.logits" % i].float().to(device)
            got, _ = t(ids)
            got = got[0].float()
            err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
            worst = max(worst, err)
            # an argmax may differ only where the reference itself is a near tie
            pick = want.gather(1, got.argmax(-1, keepdim=True)).squeeze(1)
            if (pick < want.max(-1).values - 1e-3).any():
                sys.exit("target check: prompt %d argmax differs from the reference" % i)
            g = "prompt.%d.greedy" % i
            if g in ref:
                seq = ids
                for _ in range(ref[g].numel()):
                    lg, _ = t(seq)
                    seq = torch.cat([seq, lg[:, -1].argmax(-1, keepdim=True)], 1)
                gen = seq[0, ids.shape[1]:].cpu()
                ok = (gen == ref[g].long()).long().cumprod(0).sum().item()
                log("target check: prompt %d greedy agrees for %d of %d tokens" % (i, ok, ref[g].numel()))
                if ok < min(8, ref[g].numel()):
                    sys.exit("target check: prompt %d greedy differs at token %d" % (i, ok))
    log("target check: logits within %.2e of the reference (relative to max)" % worst)
    if worst > 2e-3:
        sys.exit("target check: the forward does not reproduce the reference (%.3g)" % worst)


# ---- data and training -------------------------------------------------------------


def greedy_extend(torch, t, prompts, n_new, taps=()):
    """prompts [B, P] -> [B, P + n_new] with the target's greedy tokens."""
    cache = []
    with torch.no_grad():
        lg, _ = t(prompts, cache=cache, start=0)
        seq = [prompts, lg[:, -1].argmax(-1, keepdim=True)]
        at = prompts.shape[1]
        for _ in range(n_new - 1):
            lg, _ = t(seq[-1], cache=cache, start=at)
            at += 1
            seq.append(lg[:, -1].argmax(-1, keepdim=True))
    return torch.cat(seq, 1)


def make_pool(torch, t, corpus, n_seqs, P, G, gen_batch, device, deadline, seed):
    """Sequences: P corpus tokens (a random window) + G target-greedy tokens."""
    rng = random.Random(seed)
    data = torch.tensor(corpus, dtype=torch.long)
    out = []
    while sum(x.shape[0] for x in out) < n_seqs and time.time() < deadline:
        starts = [rng.randrange(0, len(corpus) - P) for _ in range(gen_batch)]
        pr = torch.stack([data[s:s + P] for s in starts]).to(device)
        out.append(greedy_extend(torch, t, pr, G))
    pool = torch.cat(out, 0)
    log("pool: %d sequences of %d tokens (%d prompt + %d target-greedy)" % (pool.shape[0], P + G, P, G))
    return pool


def train_batch(torch, t, d, seqs, c, P, anchors, gamma):
    """Loss on one batch: seqs [S, N]; `anchors` blocks per sequence, each
    anchored at a random p in [P - 1, N - block]: the block is [seq[p],
    mask...] at positions p.., attending to context rows < p and to its own
    block; its rows 1.. are scored against seq[p + 1 ..]."""
    F = torch.nn.functional
    S, N = seqs.shape
    B = c["block_size"]
    dev = seqs.device
    with torch.no_grad():
        _, taps = t(seqs, taps=c["target_layer_ids"], head=False)
    p = torch.randint(P - 1, N - B + 1, (S, anchors), device=dev)  # [S, A]
    off = torch.arange(B, device=dev)
    pos = (p.unsqueeze(-1) + off).reshape(S, anchors * B)  # [S, A*B]
    blk = torch.full((S, anchors, B), c["mask_token_id"], dtype=torch.long, device=dev)
    blk[:, :, 0] = torch.gather(seqs, 1, p)
    lab = torch.gather(seqs, 1, pos.clamp(max=N - 1)).view(S, anchors, B)[:, :, 1:]
    x = t.embed(blk.view(S, anchors * B))
    ctx_pos = torch.arange(N, device=dev).unsqueeze(0).expand(S, N)
    # query in block a: context rows j < p_a, and block a's own rows
    qa = torch.arange(anchors, device=dev).repeat_interleave(B)  # [A*B]
    cmask = ctx_pos.unsqueeze(1) < p.repeat_interleave(B, 1).unsqueeze(-1)  # [S, A*B, N]
    bmask = (qa.unsqueeze(1) == qa.unsqueeze(0)).unsqueeze(0).expand(S, -1, -1)  # [S, A*B, A*B]
    mask = torch.cat([cmask, bmask], -1).unsqueeze(1)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        ctx = d.context(taps)
        h = d(x, pos, ctx, ctx_pos, mask)
        h = h.view(S, anchors, B, -1)[:, :, 1:]
        logits = t.head(h).float()  # [S, A, B-1, V]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1),
                         reduction="none").view(S, anchors, B - 1)
    w = torch.exp(-torch.arange(B - 1, device=dev, dtype=torch.float32) / gamma)
    loss = (ce * w).sum(-1).mean() / w.sum()
    acc = (logits.argmax(-1) == lab).float().mean(dim=(0, 1))
    return loss, acc


def draft_block(torch, t, d, c, ctx_taps, last, p):
    """The drafter's block-1 proposals after context taps [1, p, n*H] and the
    last accepted token `last` at position p."""
    dev = ctx_taps.device
    B = c["block_size"]
    blk = torch.full((1, B), c["mask_token_id"], dtype=torch.long, device=dev)
    blk[0, 0] = last
    pos = torch.arange(p, p + B, device=dev).unsqueeze(0)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        ctx = d.context(ctx_taps)
        h = d(t.embed(blk), pos, ctx, torch.arange(p, device=dev).unsqueeze(0), None)
        lg = t.head(h[:, 1:]).float()
    return lg.argmax(-1)[0]


def acceptance(torch, t, d, c, prompts, n_new, deadline):
    """Greedy speculative decoding at block c.block_size: mean proposals
    accepted per round, and tokens per target forward."""
    rounds = acc = 0
    with torch.no_grad():
        for pr in prompts:
            seq = pr.unsqueeze(0)
            lg, taps = t(seq, taps=c["target_layer_ids"])
            nxt = lg[0, -1].argmax()
            made = 0
            while made < n_new and time.time() < deadline:
                p = seq.shape[1]  # position of nxt, the last accepted token
                prop = draft_block(torch, t, d, c, taps[:, :p], nxt, p)
                seq = torch.cat([seq, nxt.view(1, 1), prop.view(1, -1)], 1)
                lg, taps = t(seq, taps=c["target_layer_ids"])
                y = lg[0, p:].argmax(-1)  # target's picks after nxt, prop[0], ...
                a = int((prop == y[:-1]).long().cumprod(0).sum().item())
                seq = seq[:, : p + 1 + a]
                nxt = y[a]
                rounds += 1
                acc += a
                made += a + 1
    if not rounds:
        return 0.0, 0.0
    return acc / rounds, (acc + rounds) / rounds


def save(torch, d, c, out_dir, extra):
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in d.state_dict().items()}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "training.json"), "w") as f:
        json.dump(extra, f, indent=2)
        f.write("\n")
    log("wrote %s (%d tensors)" % (out_dir, len(sd)))


def write_reference(torch, t, d, c, ids, out_dir):
    """reference.safetensors: a held-out prompt's ids [p + 1] and the block
    logits [block - 1, vocab] after ids[:p] with ids[p] as the last token,
    in f32 from the saved (bf16) weights, for loom to check its forward."""
    import copy
    from safetensors.torch import save_file
    ids = ids[:65]
    p = ids.numel() - 1
    d2 = copy.deepcopy(d).float()
    with torch.no_grad():
        for q in d2.parameters():
            q.copy_(q.to(torch.bfloat16).float())
        _, taps = t(ids[:p].unsqueeze(0), taps=c["target_layer_ids"], head=False)
        B = c["block_size"]
        blk = torch.full((1, B), c["mask_token_id"], dtype=torch.long, device=ids.device)
        blk[0, 0] = ids[p]
        pos = torch.arange(p, p + B, device=ids.device).unsqueeze(0)
        h = d2(t.embed(blk), pos, d2.context(taps), torch.arange(p, device=ids.device).unsqueeze(0), None)
        lg = t.head(h[:, 1:])[0].float()
    save_file({"ids": ids.to(torch.int32).cpu().contiguous(), "block_logits": lg.cpu().contiguous()},
              os.path.join(out_dir, "reference.safetensors"), metadata={"format": "pt"})
    log("reference: block logits after %d held-out tokens; proposals %s" % (p, lg.argmax(-1).tolist()))


def resume(torch, d, c, src):
    """Starts from the weights of an earlier run in src (same layout)."""
    from safetensors.torch import load_file
    with open(os.path.join(src, "config.json")) as f:
        old = json.load(f)
    for k in ("num_hidden_layers", "hidden_size", "block_size", "target_layer_ids", "mask_token_id"):
        if old.get(k) != c[k]:
            sys.exit("--resume: %s is %s in %s, expected %s" % (k, old.get(k), src, c[k]))
    sd = load_file(os.path.join(src, "model.safetensors"))
    d.load_state_dict({k: v.float() for k, v in sd.items()})
    log("resumed from %s" % src)


def run(args, torch, Target, Drafter, t, tcfg, corpus, held_prompts, smoke):
    dev = next(t.parameters()).device
    t0 = time.time()
    budget = 60 if smoke else args.budget
    deadline = t0 + budget
    H = tcfg["hidden_size"]
    taps = [int(x) for x in args.taps.split(",")]
    for x in taps:
        if not 0 <= x < tcfg["num_hidden_layers"]:
            sys.exit("--taps: expected layers in [0, %d), found %d" % (tcfg["num_hidden_layers"], x))
    c = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "dflash",
        "target_layer_ids": taps,
        "block_size": args.block,
        "mask_token_id": args.mask_token,
        "hidden_size": H,
        "num_hidden_layers": args.layers,
        "num_attention_heads": tcfg["num_attention_heads"],
        "num_key_value_heads": tcfg["num_key_value_heads"],
        "head_dim": tcfg.get("head_dim") or H // tcfg["num_attention_heads"],
        "intermediate_size": tcfg["intermediate_size"],
        "rms_norm_eps": tcfg.get("rms_norm_eps", 1e-6),
        "rope_theta": t.theta,
        "vocab_size": tcfg["vocab_size"],
        "target_hidden_size": H,
        "target_num_hidden_layers": tcfg["num_hidden_layers"],
        "hidden_act": "silu",
        "dtype": "bfloat16",
    }
    torch.manual_seed(args.seed)
    d = Drafter(c).to(dev)
    if args.resume:
        resume(torch, d, c, args.resume)
    n_par = sum(p.numel() for p in d.parameters())
    log("drafter: %d parameters, %d layers, taps %s, block %d" % (n_par, args.layers, taps, args.block))
    P, G = (32, 48) if smoke else (args.prompt_len, args.gen_len)
    n_pool = 8 if smoke else args.pool
    pool = make_pool(torch, t, corpus, n_pool, P, G, min(args.gen_batch, n_pool), dev,
                     t0 + budget * args.gen_frac, args.seed)
    opt = torch.optim.AdamW(d.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    steps_est = 5 if smoke else args.max_steps
    S = min(args.batch, pool.shape[0])
    A = 2 if smoke else args.anchors
    step, t_train, loss_avg = 0, time.time(), None
    while step < steps_est and time.time() < deadline:
        frac = min((time.time() - t_train) / max(deadline - t_train, 1e-3), 1.0)
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, pool.shape[0], (S,), device=dev)
        loss, acc = train_batch(torch, t, d, pool[idx], c, P, A, args.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
        opt.step()
        step += 1
        lv = loss.item() if (step % 20 == 0 or smoke) else None
        if lv is not None:
            loss_avg = lv if loss_avg is None else 0.9 * loss_avg + 0.1 * lv
            log("step %d  %.0fs  lr %.2e  loss %.4f  acc@1 %.3f  acc@4 %.3f  acc@15 %.3f"
                % (step, time.time() - t0, lr, lv, acc[0].item(), acc[min(3, len(acc) - 1)].item(),
                   acc[-1].item()))
    out = os.path.join(args.out, "smoke") if smoke else args.out
    d.eval()
    info = {"steps": step, "seconds": round(time.time() - t0, 1), "batch": S, "anchors": A,
            "lr": args.lr, "pool": int(pool.shape[0]), "prompt_len": P, "gen_len": G, "loss": loss_avg}
    if args.resume:
        info["resumed_from"] = args.resume
    save(torch, d, c, out, info)  # first: whatever follows, the weights are kept
    write_reference(torch, t, d, c, held_prompts[0], out)
    n_new = 16 if smoke else args.eval_tokens
    prs = held_prompts[:1] if smoke else held_prompts
    mean_acc, per_fwd = acceptance(torch, t, d, c, prs, n_new, time.time() + (30 if smoke else args.eval_s))
    log("held-out acceptance (greedy, block %d, %d prompts): %.2f proposals accepted per round, "
        "%.2f tokens per target forward" % (args.block, len(prs), mean_acc, per_fwd))
    info.update(heldout_accepted_per_round=mean_acc, heldout_tokens_per_forward=per_fwd)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="tests/fixtures/trained/pycoder-16m")
    ap.add_argument("--out", default="models/pycoder-16m-dflash")
    ap.add_argument("--budget", type=float, default=300, help="wall-clock seconds before saving")
    ap.add_argument("--smoke", action="store_true", help="first a 5-step run on tiny data (written, then removed)")
    ap.add_argument("--heldout", default="tests/fixtures/trained/eval/python-validation.txt,bench/spec_heldout.py")
    ap.add_argument("--taps", default="1,4,7", help="target layers whose outputs the drafter reads")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--mask-token", type=int, default=1)
    ap.add_argument("--corpus-mb", type=float, default=12)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--gen-len", type=int, default=96)
    ap.add_argument("--pool", type=int, default=32768, help="training sequences (at most)")
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--gen-frac", type=float, default=0.3, help="share of the budget for the pool")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=16, help="blocks per sequence per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--gamma", type=float, default=7.0, help="loss decay over block positions")
    ap.add_argument("--max-steps", type=int, default=1000000)
    ap.add_argument("--eval-prompts", type=int, default=8)
    ap.add_argument("--eval-tokens", type=int, default=128)
    ap.add_argument("--eval-s", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--resume", help="a drafter directory to continue training from")
    ap.add_argument("--data-only", action="store_true", help="build the corpus and stop (no torch)")
    args = ap.parse_args()

    encode = load_tokenizer(args.target)
    held = HeldOut([p for p in args.heldout.split(",") if p])
    if not held.hashes:
        sys.exit("held-out text: none found in %s" % args.heldout)
    files = python_files(int(args.corpus_mb * 1e6), args.seed)
    corpus = build_corpus(files, held, encode, int(args.corpus_mb * 1e6))
    if len(corpus) < 100000:
        sys.exit("corpus: expected at least 100000 tokens, found %d" % len(corpus))
    # held-out prompts: the start of evaluation documents
    docs = [x for x in held.text.split(EOS) if len(x) > 2000] or [held.text]
    rng = random.Random(args.seed + 7)
    held_ids = [encode(doc.strip())[: args.prompt_len] for doc in rng.sample(docs, min(args.eval_prompts, len(docs)))]
    log("held-out prompts: %d of %s tokens" % (len(held_ids), [len(x) for x in held_ids]))
    if args.data_only:
        return

    import torch
    Target, Drafter = build(torch)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # the target's greedy picks as loom's f32 gives them
    torch.backends.cudnn.allow_tf32 = False
    log("device: %s, torch %s" % (dev, torch.__version__))
    t, tcfg = load_target(torch, Target, args.target, dev)
    check_target(torch, t, args.target, dev)
    if args.mask_token < 0 or args.mask_token >= tcfg["vocab_size"]:
        sys.exit("--mask-token: expected an id below %d" % tcfg["vocab_size"])
    held_prompts = [torch.tensor(x, dtype=torch.long, device=dev) for x in held_ids]
    if args.smoke:
        run(args, torch, Target, Drafter, t, tcfg, corpus, held_prompts, True)
        import shutil
        shutil.rmtree(os.path.join(args.out, "smoke"), ignore_errors=True)
        log("smoke run done")
    run(args, torch, Target, Drafter, t, tcfg, corpus, held_prompts, False)


if __name__ == "__main__":
    main()
