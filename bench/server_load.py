#!/usr/bin/env python3
"""Closed-loop load on `loom serve`: N concurrent streaming clients over
/v1/completions with token-id prompts of mixed lengths, some sharing long
prefixes (so the prefix cache has something to find). Python's standard
library only, so it runs where node is not installed (the GPU machine).

  python3 bench/server_load.py --url http://127.0.0.1:PORT [--clients 64]
      [--rounds 2] [--min-prompt 100] [--max-prompt 4096] [--max-tokens 64]
      [--prefixes 4] [--prefix-len 1024] [--vocab 151936] [--deadline S]

Each client sends --rounds requests one after another. Prompt lengths are
drawn log-uniformly in [min, max]; half the prompts start with one of
--prefixes shared prefixes of --prefix-len tokens (when they are that long).
Every stream is checked: it must end with [DONE], and the usage chunk must
report the prompt length sent and as many completion tokens as text chunks
arrived (ignore_eos keeps the length fixed). Prints one JSON line: requests,
failures, TTFT and inter-token p50/p99 (ms), total generated tok/s over the
wall time, prompt tok/s.
"""
import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q / 100.0 * len(xs))) - 1)]


def one(url, body, deadline):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=max(5.0, deadline - time.time()))
    t0 = time.time()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:200]))
    stamps, usage, done = [], None, False
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("choices"):
            stamps.append(time.time())
    c.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    if not usage:
        raise RuntimeError("no usage chunk")
    if usage.get("prompt_tokens") != len(body["prompt"]):
        raise RuntimeError("usage.prompt_tokens %s, sent %d" % (usage.get("prompt_tokens"), len(body["prompt"])))
    if usage.get("completion_tokens") != body["max_tokens"]:
        raise RuntimeError("usage.completion_tokens %s, asked %d" % (usage.get("completion_tokens"), body["max_tokens"]))
    if not stamps:
        raise RuntimeError("no token chunks")
    return t0, stamps, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="loom", help="the request's model name")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-prompt", type=int, default=100)
    ap.add_argument("--max-prompt", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--deadline", type=float, default=500, help="seconds; requests not started by then are skipped")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # ids below 1000 stay clear of any special tokens at the top of the vocabulary
    tok = lambda n: [rng.randrange(1000, min(a.vocab, 100000)) for _ in range(n)]
    prefixes = [tok(a.prefix_len) for _ in range(a.prefixes)]
    jobs = []
    for c in range(a.clients):
        mine = []
        for _ in range(a.rounds):
            n = int(round(math.exp(rng.uniform(math.log(a.min_prompt), math.log(a.max_prompt)))))
            if n > a.prefix_len and rng.random() < 0.5:
                ids = prefixes[rng.randrange(a.prefixes)] + tok(n - a.prefix_len)
            else:
                ids = tok(n)
            mine.append({"model": a.model, "prompt": ids, "max_tokens": a.max_tokens, "temperature": 0,
                         "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        jobs.append(mine)
    t_start = time.time()
    deadline = t_start + a.deadline
    lock = threading.Lock()
    ttft, itl, fails, done = [], [], [], [0, 0, 0]  # requests, generated, prompt tokens

    def client(mine):
        for body in mine:
            if time.time() > deadline:
                return
            try:
                t0, stamps, usage = one(a.url, body, deadline)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with lock:
                    fails.append(str(e)[:200])
                continue
            with lock:
                ttft.append((stamps[0] - t0) * 1e3)
                itl.extend((y - x) * 1e3 for x, y in zip(stamps, stamps[1:]))
                done[0] += 1
                done[1] += usage["completion_tokens"]
                done[2] += usage["prompt_tokens"]

    th = [threading.Thread(target=client, args=(m,)) for m in jobs]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t_start
    out = {"clients": a.clients, "requests": done[0], "asked": a.clients * a.rounds, "failures": len(fails),
           "wall_s": round(wall, 2), "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
           "itl_ms_p50": pct(itl, 50), "itl_ms_p99": pct(itl, 99),
           "gen_tok_s": done[1] / wall, "prompt_tok_s": done[2] / wall,
           "mean_prompt": statistics.mean(len(b["prompt"]) for m in jobs for b in m)}
    if fails:
        out["first_failure"] = fails[0]
    print(json.dumps(out))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
