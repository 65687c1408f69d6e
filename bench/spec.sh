#!/bin/sh
# Speculative decoding at batch 1, greedy: loom generate's decode tokens/s
# plain (the one-sequence context), with prompt lookup (--speculative
# ngram) and with the draft model (--draft-model models/pycoder-draft-3m),
# each the median of RUNS runs, the three modes alternating run by run (the
# machine is shared and noisy). Every speculative run is first checked to
# print exactly the plain run's token ids. Prompts (Python, which the
# models were trained on):
#   heldout   the first part of bench/spec_heldout.py, written for this
#             benchmark (no model has seen it)
#   stdlib    the start of a module of /usr/lib/python3*/ (it may have been
#             in the training corpus)
#   valid     a slice of the trained models' validation text, when
#             $VALID (default /work/shared/fixtures/trained/eval/
#             python-validation.txt) exists
#   edit      edit-a-file: the whole held-out file, then a comment naming
#             a copy of it to edit and the copy's first 50 lines: what
#             follows is largely already in the prompt, which prompt lookup
#             finds (pycoder-16m copies only in part: it drifts into
#             patterns of its own)
# Usage: sh bench/spec.sh [RUNS] (env: N tokens, default 192; THREADS, default 2;
# DRAFT, the draft model's directory; DRAFT_TOKENS, its --draft-tokens)
set -eu
: "${LOOM_BUILD:=build}"
LOOM="$LOOM_BUILD/loom"
MODEL=models/pycoder-16m
: "${DRAFT:=models/pycoder-draft-3m}" # or a DFlashDraftModel, e.g. models/pycoder-16m-dflash
RUNS=${1:-5}
: "${N:=192}" "${THREADS:=2}"
: "${VALID:=/work/shared/fixtures/trained/eval/python-validation.txt}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-spec.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
[ -x "$LOOM" ] || { echo "$LOOM not built" >&2; exit 1; }

head -c 1400 bench/spec_heldout.py >"$TMP/heldout"
lib=$(ls /usr/lib/python3*/textwrap.py 2>/dev/null | head -n 1 || true)
[ -n "$lib" ] && head -c 1400 "$lib" >"$TMP/stdlib"
[ -f "$VALID" ] && tail -c +200001 "$VALID" | head -c 1400 >"$TMP/valid"
{
  cat bench/spec_heldout.py
  printf '\n\n# inventory2.py: the module above, to be edited for the v2 API.\n\n'
  head -n 50 bench/spec_heldout.py
} >"$TMP/edit"

gen() { # gen PROMPT_FILE OUT_PREFIX [flags]
  p=$1 o=$2
  shift 2
  "$LOOM" generate --model "$MODEL" --prompt "$(cat "$p")" --temperature 0 --ignore-eos \
    --max-tokens "$N" --threads "$THREADS" --ids "$@" >"$o.ids" 2>"$o.err"
}
rate() { sed -n 's/.*generated: .* (\([0-9.]*\) tok\/s).*/\1/p' "$1"; }
steps() { sed -n 's/.*; \([0-9.]*\) tokens per verifying step/\1/p' "$1"; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }

printf '%-8s %10s %10s %10s %8s %8s %8s %8s\n' prompt plain ngram draft "ngram x" "draft x" "ng t/st" "dr t/st"
for name in heldout stdlib valid edit; do
  [ -f "$TMP/$name" ] || continue
  : >"$TMP/plain.r"; : >"$TMP/ngram.r"; : >"$TMP/draft.r"; : >"$TMP/ngram.s"; : >"$TMP/draft.s"
  r=0
  while [ "$r" -lt "$RUNS" ]; do
    gen "$TMP/$name" "$TMP/plain"
    gen "$TMP/$name" "$TMP/ngram" --speculative ngram
    gen "$TMP/$name" "$TMP/draft" --draft-model "$DRAFT" ${DRAFT_TOKENS:+--draft-tokens "$DRAFT_TOKENS"}
    for m in ngram draft; do
      cmp -s "$TMP/plain.ids" "$TMP/$m.ids" || { echo "$name: $m output differs from plain decoding" >&2; exit 1; }
      steps "$TMP/$m.err" >>"$TMP/$m.s"
    done
    for m in plain ngram draft; do rate "$TMP/$m.err" >>"$TMP/$m.r"; done
    r=$((r + 1))
  done
  p=$(median <"$TMP/plain.r") g=$(median <"$TMP/ngram.r") d=$(median <"$TMP/draft.r")
  printf '%-8s %10s %10s %10s %7.2fx %7.2fx %8s %8s\n' "$name" "$p" "$g" "$d" \
    "$(echo "$g / $p" | bc -l)" "$(echo "$d / $p" | bc -l)" "$(median <"$TMP/ngram.s")" "$(median <"$TMP/draft.s")"
done
echo "(decode tokens/s at batch 1, greedy, $N tokens, medians of $RUNS alternating runs, $THREADS threads;"
echo " t/st: tokens per verifying step, 1 + the mean accepted run)"
