#!/usr/bin/env python3
"""schema_coverage: loom's JSON Schema compiler over a folder of real-world
schemas (JSONSchemaBench's data/, one folder per source), then generation
under a sample of the schemas that compile, each output validated by ajv.

  python3 bench/schema_coverage.py DIR [--sample N] [--max-tokens T] [--vocab TOKENIZER_DIR]

DIR holds *.json schemas, directly or in subfolders (each subfolder is
reported apart). Compiling uses build/bench/schema_compile over qwen3's
vocabulary (the grammar must also allow a first token); generation uses
`build/loom generate --json-schema` with the bundled pycoder-16m, and the
outputs are validated with ajv from tests/js (draft 2020 for schemas that
say so, else draft 7; formats are not checked by ajv here: loom writes the
formats it knows by construction). An output that is not whole JSON ran
into --max-tokens (the grammar cut nothing: it is a prefix), and is counted
apart. Python 3 standard library only.
"""
import argparse
import collections
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("LOOM_BUILD", os.path.join(ROOT, "build"))

VALIDATE_JS = r"""
const path = require('path');
const mod = (p) => require(path.join(process.env.JSDIR, 'node_modules', p));
const Ajv = mod('ajv').default, Ajv2020 = mod('ajv/dist/2020').default;
const fs = require('fs');
const out = [];
for (const line of fs.readFileSync(process.argv[process.argv.length - 1], 'utf8').split('\n')) {
  if (!line) continue;
  const { schema, text } = JSON.parse(line);
  let doc;
  try { doc = JSON.parse(text); } catch (e) { out.push({ result: 'incomplete' }); continue; }
  let s = JSON.parse(fs.readFileSync(schema, 'utf8'));
  const v2020 = typeof s.$schema === 'string' && s.$schema.includes('2020-12');
  delete s.$schema;
  const ajv = new (v2020 ? Ajv2020 : Ajv)({ strict: false, validateSchema: false, validateFormats: false,
                                             logger: false, allErrors: false, multipleOfPrecision: 9 });
  let validate;
  try { validate = ajv.compile(s); } catch (e) { out.push({ result: 'ajv-cannot-compile', error: String(e.message) }); continue; }
  const ok = validate(doc);
  out.push({ result: ok ? 'valid' : 'invalid', error: ok ? null : JSON.stringify(validate.errors.slice(0, 2)) });
}
console.log(JSON.stringify(out));
"""


def collect(folder):
    files = []
    for base, _, names in os.walk(folder):
        files += [os.path.join(base, n) for n in names if n.endswith(".json")]
    return sorted(files)


def feature(msg):
    """The unsupported feature an error names, for the tally."""
    m = re.match(r"'([^']+)' (is not supported|together with '([^']+)')", msg)
    if m:
        return m.group(1) + (" + " + m.group(3) if m.group(3) else "")
    m = re.match(r"'([^']+)' is supported for object schemas only", msg)
    if m:
        return "allOf of non-objects"
    if msg.startswith("regex"):
        m = re.search(r": ([^:]+?)(?: \(at|$)", msg)
        return "regex: " + (m.group(1) if m else msg)
    if msg.startswith("property '") and "also matches" in msg:
        return "patternProperties over a listed property"
    if "left-recursive" in msg:
        return "left-recursive $ref"
    return re.sub(r"'[^']*'", "'..'", msg.split(" (at #")[0])[:80]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--sample", type=int, default=40, help="schemas generated under (default 40)")
    ap.add_argument("--max-tokens", type=int, default=800)
    ap.add_argument("--vocab", default=os.path.join(BUILD, "fixtures/tokenizers/qwen3"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/pycoder-16m"))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    files = collect(a.dir)
    if not files:
        sys.exit(f"schema_coverage: no *.json under {a.dir}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as lf:
        lf.write("\n".join(files) + "\n")
    cmd = [os.path.join(BUILD, "bench/schema_compile"), "--vocab", a.vocab, "--list", lf.name]
    res = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(lf.name)
    if res.returncode:
        sys.exit(f"schema_compile failed: {res.stderr}")
    rows = []
    for line in res.stdout.splitlines():
        f = line.split("\t")
        rows.append({"ok": f[0] == "ok", "ms": float(f[1]), "path": f[2], "msg": f[3] if len(f) > 3 else ""})

    # compile share per source folder
    by = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        src = os.path.relpath(os.path.dirname(r["path"]), a.dir) or "."
        by[src][0] += r["ok"]
        by[src][1] += 1
    print(f"{'source':<20} {'schemas':>8} {'compile':>8} {'share':>7}")
    for src in sorted(by):
        ok, n = by[src]
        print(f"{src:<20} {n:>8} {ok:>8} {100.0 * ok / n:>6.1f}%")
    ok = sum(r["ok"] for r in rows)
    print(f"{'all':<20} {len(rows):>8} {ok:>8} {100.0 * ok / len(rows):>6.1f}%")
    ms = sorted(r["ms"] for r in rows if r["ok"])
    if ms:
        print(f"\ncompile time over qwen3's vocabulary (schemas that compile): median {ms[len(ms) // 2]:.2f} ms, "
              f"p90 {ms[int(len(ms) * 0.9)]:.2f} ms, max {ms[-1]:.1f} ms")
    tally = collections.Counter(feature(r["msg"]) for r in rows if not r["ok"])
    print("\nwhy the others do not compile (first error of each):")
    for k, n in tally.most_common(15):
        print(f"  {n:>5}  {k}")

    # generation under a sample, validated by ajv
    good = [r["path"] for r in rows if r["ok"]]
    random.Random(a.seed).shuffle(good)
    sample = good[: a.sample]
    if not sample:
        return
    print(f"\ngenerating under {len(sample)} schemas (pycoder-16m, temperature 1, max {a.max_tokens} tokens)...")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as gf:
        for i, path in enumerate(sample):
            g = subprocess.run([os.path.join(BUILD, "loom"), "generate", "--model", a.model, "--prompt", "data = ",
                                "--max-tokens", str(a.max_tokens), "--temperature", "1", "--seed", str(a.seed + i),
                                "--json-schema", path], capture_output=True, text=True, errors="replace")
            gf.write(json.dumps({"schema": path, "text": g.stdout}) + "\n")
    env = dict(os.environ, JSDIR=os.path.join(ROOT, "tests/js"))
    v = subprocess.run(["node", "-e", VALIDATE_JS, gf.name], capture_output=True, text=True, env=env)
    os.unlink(gf.name)
    if v.returncode:
        sys.exit(f"validation failed: {v.stderr}")
    out = json.loads(v.stdout)
    counts = collections.Counter(o["result"] for o in out)
    whole = counts["valid"] + counts["invalid"]
    print(f"  whole JSON: {whole}, valid {counts['valid']} ({100.0 * counts['valid'] / max(whole, 1):.1f}%), "
          f"invalid {counts['invalid']}")
    print(f"  cut by --max-tokens (a prefix, not whole): {counts['incomplete']}")
    print(f"  ajv could not compile the schema: {counts['ajv-cannot-compile']}")
    for path, o in zip(sample, out):
        if o["result"] == "invalid":
            print(f"  INVALID {path}: {o['error']}")
    if counts["invalid"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
