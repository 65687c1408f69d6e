#!/bin/sh
# Speculative decoding on pycoder-16m, greedy: plain decoding against
# prompt lookup (--speculative ngram), the draft model ($DRAFT) and the
# projected-context drafter ($DFLASH), at batch 1 and at batch 16.
#
# Batch 1: loom generate's decode tokens/s, the median of RUNS runs, the
# four modes alternating run by run (the machine is shared and noisy).
# Every speculative run is first checked to print exactly the plain run's
# token ids. Prompts (Python, which the models were trained on):
#   heldout   the first part of bench/spec_heldout.py, written for this
#             benchmark (no model has seen it; tools/train_dflash.py
#             leaves it out)
#   stdlib    the start of a module of /usr/lib/python3*/ (it may have been
#             in the training corpus)
#   valid     a slice of the trained models' validation text, when
#             $VALID (default /work/shared/fixtures/trained/eval/
#             python-validation.txt) exists
#   edit      edit-a-file: the whole held-out file, then a comment naming
#             a copy of it to edit and the copy's first 50 lines: what
#             follows is largely already in the prompt, which prompt lookup
#             finds
# PROMPTS picks them (default: heldout edit).
#
# Batch 16: loom bench's batched decode through the engine (16 requests
# of 64-token slices of bench/spec_heldout.py, BATCH_N tokens each), plain
# and speculating runs alternating inside one process (it checks first
# that both give the same greedy tokens), median of RUNS, once per
# drafter. The speculating engine keeps its gate (engine/gate.h) across
# the runs, as a server does; GATE=off runs it without the gate.
#
# Columns: tokens/s, the ratio to plain, t/st = tokens per verifying step
# (1 + the mean accepted run of a round that verified proposals), and at
# batch 16 the share of steps the gate kept plain.
#
# Usage: sh bench/spec.sh [RUNS] (env: N tokens at batch 1, default 192;
# BATCH_N, default 192; THREADS, default 2; DRAFT, default
# models/pycoder-draft-3m; DFLASH, default models/pycoder-16m-dflash (a
# better-trained drafter goes here); DRAFT_TOKENS, --draft-tokens of
# both; BATCH=0 skips batch 16, BATCH1=0 batch 1)
set -eu
: "${LOOM_BUILD:=build}"
LOOM="$LOOM_BUILD/loom"
MODEL=models/pycoder-16m
: "${DRAFT:=models/pycoder-draft-3m}" "${DFLASH:=models/pycoder-16m-dflash}"
RUNS=${1:-5}
: "${N:=192}" "${BATCH_N:=192}" "${THREADS:=2}" "${PROMPTS:=heldout edit}" "${GATE:=on}"
: "${BATCH:=1}" "${BATCH1:=1}"
: "${VALID:=/work/shared/fixtures/trained/eval/python-validation.txt}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-spec.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
[ -x "$LOOM" ] || { echo "$LOOM not built" >&2; exit 1; }
for d in "$DRAFT" "$DFLASH"; do [ -d "$d" ] || { echo "$d: no such drafter directory" >&2; exit 1; }; done

head -c 1400 bench/spec_heldout.py >"$TMP/heldout"
lib=$(ls /usr/lib/python3*/textwrap.py 2>/dev/null | head -n 1 || true)
[ -n "$lib" ] && head -c 1400 "$lib" >"$TMP/stdlib"
[ -f "$VALID" ] && tail -c +200001 "$VALID" | head -c 1400 >"$TMP/valid"
{
  cat bench/spec_heldout.py
  printf '\n\n# inventory2.py: the module above, to be edited for the v2 API.\n\n'
  head -n 50 bench/spec_heldout.py
} >"$TMP/edit"

MODES="plain ngram draft dflash"
flags() { # the generate/bench flags of a mode
  case $1 in
    plain) ;;
    ngram) echo "--speculative ngram" ;;
    draft) echo "--draft-model $DRAFT" ;;
    dflash) echo "--draft-model $DFLASH" ;;
  esac
  [ "$1" = plain ] || [ -z "${DRAFT_TOKENS:-}" ] || echo "--draft-tokens $DRAFT_TOKENS"
}
gen() { # gen PROMPT_FILE OUT_PREFIX MODE
  # shellcheck disable=SC2046
  "$LOOM" generate --model "$MODEL" --prompt "$(cat "$1")" --temperature 0 --ignore-eos \
    --max-tokens "$N" --threads "$THREADS" --ids --spec-gate "$GATE" $(flags "$3") >"$2.ids" 2>"$2.err"
}
rate() { sed -n 's/.*generated: .* (\([0-9.]*\) tok\/s).*/\1/p' "$1"; }
steps() { sed -n 's/.*; \([0-9.]*\) tokens per verifying step.*/\1/p' "$1"; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { echo "$1 $2" | awk '{if ($1 == "-" || $2 == "-" || $2 == 0) print "-"; else printf "%.2fx", $1 / $2}'; }

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); drafters: $DRAFT, $DFLASH; gate $GATE"
if [ "$BATCH1" != 0 ]; then
  printf '%-8s %8s %8s %8s %8s %7s %7s %7s %7s %7s %7s\n' prompt plain ngram draft dflash \
    "ngram x" "draft x" "dfl x" "ng t/st" "dr t/st" "df t/st"
  for name in $PROMPTS; do
    [ -f "$TMP/$name" ] || continue
    for m in $MODES; do : >"$TMP/$m.r"; : >"$TMP/$m.s"; done
    r=0
    while [ "$r" -lt "$RUNS" ]; do
      for m in $MODES; do gen "$TMP/$name" "$TMP/$m" "$m"; done
      for m in ngram draft dflash; do
        cmp -s "$TMP/plain.ids" "$TMP/$m.ids" || { echo "$name: $m output differs from plain decoding" >&2; exit 1; }
        steps "$TMP/$m.err" >>"$TMP/$m.s"
      done
      for m in $MODES; do rate "$TMP/$m.err" >>"$TMP/$m.r"; done
      r=$((r + 1))
    done
    p=$(median <"$TMP/plain.r") g=$(median <"$TMP/ngram.r") d=$(median <"$TMP/draft.r") f=$(median <"$TMP/dflash.r")
    printf '%-8s %8s %8s %8s %8s %7s %7s %7s %7s %7s %7s\n' "$name" "$p" "$g" "$d" "$f" \
      "$(ratio "$g" "$p")" "$(ratio "$d" "$p")" "$(ratio "$f" "$p")" \
      "$(median <"$TMP/ngram.s")" "$(median <"$TMP/draft.s")" "$(median <"$TMP/dflash.s")"
  done
  echo "(batch 1: decode tokens/s, greedy, $N tokens, medians of $RUNS alternating runs, $THREADS threads)"
fi

if [ "$BATCH" != 0 ]; then
  printf '\n%-8s %9s %9s %7s %7s %9s\n' drafter plain spec ratio "t/st" gated
  for m in ngram draft dflash; do
    # shellcheck disable=SC2046
    "$LOOM" bench --model "$MODEL" -p 0 -n "$BATCH_N" --batch 16 --reps "$RUNS" --tg-prompt 64 \
      --tg-text bench/spec_heldout.py --threads "$THREADS" --spec-gate "$GATE" $(flags "$m") \
      >"$TMP/b.out" 2>"$TMP/b.err" || { cat "$TMP/b.err" >&2; exit 1; }
    line=$(grep 'batch 16: speculative' "$TMP/b.err")
    echo "$line" | awk -v m="$m" '{
      for (i = 1; i <= NF; i++) {
        if ($i == "speculative") s = $(i + 1);
        if ($i == "plain") { p = $(i + 1); r = $(i + 2) }
        if ($i == "tokens" && $(i + 1) == "per") t = $(i - 1);
        if ($i == "steps" && $(i + 1) == "gated") { g = $(i - 3); n = $(i - 1) }
      }
      gsub(/[(),]/, "", r); gsub(/,/, "", p)
      printf "%-8s %9s %9s %7s %7s %8.0f%%\n", m, p, s, r, t, n ? 100 * g / n : 0
    }'
  done
  echo "(batch 16: aggregate decode tokens/s through the engine, $BATCH_N tokens a request, medians of $RUNS"
  echo " alternating runs, $THREADS threads; gated: steps the gate kept plain)"
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
