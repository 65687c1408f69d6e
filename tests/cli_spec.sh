#!/bin/sh
# Speculative decoding from the command line: loom generate with a draft
# model or prompt lookup prints what plain greedy decoding prints; loom
# serve --draft-model answers a greedy completion with the plain server's
# text (a stop string inside an accepted run cut where the plain one is)
# and counts its proposals in /metrics; usage errors.
set -u
. tests/js/server_lib.sh
DRAFT=models/pycoder-draft-3m
P='import os
import sys


def main(argv):
    parser = argparse.ArgumentParser()
'
gen() { "$LOOM_BIN" generate --model "$MODEL" --prompt "$P" --temperature 0 --max-tokens 96 --threads 2 "$@"; }
plain=$(gen 2>/dev/null) || fail "plain generate"
for flags in "--draft-model $DRAFT" "--speculative ngram" "--draft-model $DRAFT --draft-tokens 3" \
             "--draft-model $DRAFT --draft-exact on" "--draft-model models/pycoder-16m-dflash" \
             "--draft-model models/pycoder-16m-dflash --draft-exact on"; do
  # shellcheck disable=SC2086
  got=$(gen $flags 2>"$TMPD/gen.err") || fail "generate $flags: $(cat "$TMPD/gen.err")"
  [ "$got" = "$plain" ] || fail "generate $flags differs from plain decoding"
  grep -q '^speculative: [0-9]* of [1-9][0-9]* proposals accepted' "$TMPD/gen.err" ||
    fail "generate $flags: no proposal count: $(cat "$TMPD/gen.err")"
done
ok "generate with a draft model and with prompt lookup prints plain decoding's text"

"$LOOM_BIN" generate --model "$MODEL" --prompt x --draft-model "$DRAFT" --draft-exact maybe >/dev/null 2>&1
[ $? -eq 2 ] || fail "--draft-exact maybe is not a usage error"

# --quantize 8: the bf16 model quantized at load prints what its
# conversion by loom convert prints
"$LOOM_BIN" convert --model "$MODEL" --bits 8 --out "$TMPD/q8" >/dev/null 2>&1 || fail "convert --bits 8"
q8=$("$LOOM_BIN" generate --model "$TMPD/q8" --prompt "$P" --temperature 0 --max-tokens 96 --threads 2 2>/dev/null) ||
  fail "generate on the converted model"
[ "$(gen --quantize 8 2>/dev/null)" = "$q8" ] || fail "generate --quantize 8 differs from the converted model"
"$LOOM_BIN" generate --model "$MODEL" --prompt x --quantize 5 >/dev/null 2>"$TMPD/e"
[ $? -eq 2 ] && grep -q 'expected 8 or 4, found "5"' "$TMPD/e" || fail "--quantize 5 is not a usage error naming it"
ok "generate --quantize 8 prints the converted model's text; --draft-exact and --quantize usage errors"

# --tensor-parallel and device lists: usage errors, and a split asked of the CPU refused by name
"$LOOM_BIN" generate --model "$MODEL" --prompt x --tensor-parallel 9 >/dev/null 2>"$TMPD/e"
[ $? -eq 2 ] && grep -q 'expected 1 to 8 ranks, found "9"' "$TMPD/e" || fail "--tensor-parallel 9 is not a usage error naming it"
"$LOOM_BIN" generate --model "$MODEL" --prompt x --device cuda:0,1 --tensor-parallel 3 >/dev/null 2>"$TMPD/e"
[ $? -eq 2 ] && grep -q 'as many as --device lists' "$TMPD/e" || fail "a device list against another --tensor-parallel is not a usage error"
"$LOOM_BIN" generate --model "$MODEL" --prompt x --device cuda:0,x >/dev/null 2>"$TMPD/e"
[ $? -eq 2 ] && grep -q 'cuda:N,M' "$TMPD/e" || fail "--device cuda:0,x is not a usage error"
"$LOOM_BIN" generate --model "$MODEL" --prompt x --tensor-parallel 2 >/dev/null 2>"$TMPD/e" &&
  fail "a split on the CPU ran"
grep -q 'tensor parallel over 2 ranks on the CPU' "$TMPD/e" || fail "a split on the CPU is not refused by name"
ok "--tensor-parallel and --device cuda:N,M: usage errors, and no split on the CPU"

"$LOOM_BIN" generate --model "$MODEL" --prompt x --speculative bigram >/dev/null 2>&1
[ $? -eq 2 ] || fail "--speculative bigram is not a usage error"
"$LOOM_BIN" generate --model "$MODEL" --prompt x --draft-model "$DRAFT" --draft-tokens 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--draft-tokens 0 is not a usage error"
"$LOOM_BIN" generate --model "$MODEL" --prompt x --draft-model /nonexistent 2>"$TMPD/e" >/dev/null
[ $? -eq 1 ] && grep -q 'draft model' "$TMPD/e" || fail "a missing draft model: $(cat "$TMPD/e")"
ok "usage errors"

# bench: the speculative decode's ratio per repeat and per CPU second, and
# the engine thread's CPU time per step by kind
"$LOOM_BIN" bench --model "$MODEL" -p 0 -n 16 --tg-prompt 32 --batch 1 --reps 2 --threads 1 \
  --speculative ngram --spec-gate off --json >"$TMPD/b.json" 2>"$TMPD/b.err" || fail "bench: $(cat "$TMPD/b.err")"
grep -q '"spec_speedup_per_repeat": [0-9]' "$TMPD/b.json" && grep -q '"spec_tok_per_cpu_s": [0-9]' "$TMPD/b.json" ||
  fail "bench --json: no per-repeat or per-CPU ratio: $(cat "$TMPD/b.json")"
grep -q 'per repeat [0-9.]*x (.*); per CPU second [0-9.]* vs [0-9.]*' "$TMPD/b.err" ||
  fail "bench: no per-repeat or per-CPU ratio: $(cat "$TMPD/b.err")"
grep -q 'engine thread CPU ms a step: plain forward [0-9.]*, commit [0-9.]* ([1-9][0-9]* steps); speculating: draft' "$TMPD/b.err" ||
  fail "bench: no CPU time per step: $(cat "$TMPD/b.err")"
ok "bench: per-repeat and per-CPU ratios, CPU time per step by kind"

# a grammar's rows decode plainly beside speculation: the plain output
printf '%s' '{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":5}},"required":["a","b"]}' >"$TMPD/s.json"
g0=$("$LOOM_BIN" generate --model "$MODEL" --prompt 'x = ' --json-schema "$TMPD/s.json" --max-tokens 40 --temperature 0 2>/dev/null) ||
  fail "--json-schema"
g1=$("$LOOM_BIN" generate --model "$MODEL" --prompt 'x = ' --json-schema "$TMPD/s.json" --max-tokens 40 --temperature 0 \
  --speculative ngram 2>/dev/null) || fail "--json-schema with --speculative ngram"
[ "$g0" = "$g1" ] || fail "under a schema, speculation changed the output: $g1 vs $g0"
ok "a schema with speculation: the plain output"

body='{"prompt": "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n", "max_tokens": 80, "temperature": 0}'
stop_body='{"prompt": "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n", "max_tokens": 80, "temperature": 0, "stop": ["help="]}'
start_server plain
a=$(curl -sf "$BASE/v1/completions" -d "$body") || fail "plain completion"
as=$(curl -sf "$BASE/v1/completions" -d "$stop_body") || fail "plain completion with a stop string"
stop_server "$PID" "$LOG"
start_server spec --draft-model "$DRAFT"
b=$(curl -sf "$BASE/v1/completions" -d "$body") || fail "speculative completion"
bs=$(curl -sf "$BASE/v1/completions" -d "$stop_body") || fail "speculative completion with a stop string"
text() { printf '%s' "$1" | sed 's/.*"text":"\(\([^"\\]\|\\.\)*\)".*/\1/'; }
[ "$(text "$a")" = "$(text "$b")" ] || fail "draft-model completion differs: $(text "$b") vs $(text "$a")"
[ "$(text "$as")" = "$(text "$bs")" ] || fail "stop string: $(text "$bs") vs $(text "$as")"
printf '%s' "$bs" | grep -q '"finish_reason":"stop"' || fail "no stop: $bs"
m=$(curl -sf "$BASE/metrics")
printf '%s\n' "$m" | grep -q '^loom_spec_drafted_tokens_total [1-9]' || fail "no drafted tokens in /metrics"
printf '%s\n' "$m" | grep -q '^loom_spec_accepted_tokens_total [1-9]' || fail "no accepted tokens in /metrics"
stop_server "$PID" "$LOG"
ok "serve --draft-model: the plain server's text, stop strings, /metrics counters"
