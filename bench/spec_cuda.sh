#!/bin/sh
# Speculative decoding with the target on the GPU, batch 1, greedy:
# models/pycoder-16m decoding plainly against the same with prompt lookup
# (--speculative ngram), the DFlash drafter (--draft-model
# models/pycoder-16m-dflash) and the draft model (--draft-model
# models/pycoder-draft-3m). The target's forwards run on the device
# (verification rows included); the drafters run on the CPU (DFlash over
# the target's hidden states, copied back from the device each step).
# Each line is one `loom bench --device cuda --batch 1` run, which first
# checks that the speculative run gives exactly the plain run's greedy
# tokens, then times both (median of REPS, alternating). Prompts (Python):
#   heldout  the first PROMPT tokens of bench/spec_heldout.py
#   edit     the whole file, then a comment naming a copy of it to edit and
#            the copy's first 50 lines (what follows is largely in the prompt)
# Usage: sh bench/spec_cuda.sh (env: BUILD, default build/cuda; N tokens,
# default 256; PROMPT tokens, default 256; REPS, default 5; MODES, default
# "ngram dflash draft"; DEVICE, default cuda: cpu runs the same on the CPU,
# with BUILD=build and CUDA= to build without the backend; THREADS, default
# all cores; GATE, default on: off times the drafter itself, where the
# gate's choice from a few noisy early steps can keep a whole run plain;
# DRAFT_EXACT, default off: on runs the drafters in exact f32). Columns: the ratio of the medians, the median of each
# repeat's own ratio (plain and speculative back to back, so a load that
# drifts over the run cancels) and the ratio of tokens per CPU second of
# the process (descheduling leaves it alone; with one thread it is the
# work the engine does, with two it counts the workers' brief spins too).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/cuda}
N=${N:-256}
PROMPT=${PROMPT:-256}
REPS=${REPS:-5}
MODES=${MODES:-"ngram dflash draft"}
DEVICE=${DEVICE:-cuda}
THREADS=${THREADS:-0}
GATE=${GATE:-on}
DRAFT_EXACT=${DRAFT_EXACT:-off}
CUDA=${CUDA-1}
LOOM="$BUILD/loom"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-spec-cuda.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

make -s -j"$(nproc)" BUILD="$BUILD" CUDA="$CUDA" "$LOOM" >"$TMP/build.log" 2>&1 ||
  { tail -n 40 "$TMP/build.log"; echo "spec_cuda: BUILD FAILED"; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

cp bench/spec_heldout.py "$TMP/heldout"
{
  cat bench/spec_heldout.py
  printf '\n\n# inventory2.py: the module above, to be edited for the v2 API.\n\n'
  head -n 50 bench/spec_heldout.py
} >"$TMP/edit"
# the edit prompt whole: its token count (the JSON array's commas + 1)
edit_len=$(( $("$LOOM" tokenize --tokenizer models/pycoder-16m --text-file "$TMP/edit" | tr -cd , | wc -c) + 1 ))

printf '%-8s %-7s %10s %10s %8s %8s %8s %12s %14s\n' prompt mode "plain t/s" "spec t/s" speed-up "per rep" "per cpu" "tokens/step" "mean accepted"
for name in heldout edit; do
  for mode in $MODES; do
    case $mode in
      ngram) flag="--speculative ngram" ;;
      dflash) flag="--draft-model models/pycoder-16m-dflash --draft-exact $DRAFT_EXACT" ;;
      draft) flag="--draft-model models/pycoder-draft-3m --draft-exact $DRAFT_EXACT" ;;
      *) echo "spec_cuda: unknown mode $mode" >&2; exit 2 ;;
    esac
    len=$PROMPT
    [ "$name" = edit ] && len=$edit_len
    # shellcheck disable=SC2086
    if ! "$LOOM" bench --device "$DEVICE" --model models/pycoder-16m -p 0 -n "$N" --tg-prompt "$len" \
      --tg-text "$TMP/$name" --batch 1 --reps "$REPS" --threads "$THREADS" --spec-gate "$GATE" $flag >"$TMP/out" 2>"$TMP/err"; then
      echo "spec_cuda: $name $mode failed:" >&2
      tail -n 20 "$TMP/err" >&2
      exit 1
    fi
    line=$(grep 'loom bench: batch 1: speculative' "$TMP/err" || true)
    spec=$(echo "$line" | sed -n 's/.*speculative \([0-9.]*\) tok\/s vs plain.*/\1/p')
    plain=$(echo "$line" | sed -n 's/.*vs plain \([0-9.]*\) (.*/\1/p')
    x=$(echo "$line" | sed -n 's/.*vs plain [0-9.]* (\([0-9.]*x\)).*/\1/p')
    steps=$(echo "$line" | sed -n 's/.*, \([0-9.]*\) tokens per verifying step.*/\1/p')
    pair=$(echo "$line" | sed -n 's/.*per repeat \([0-9.]*x\).*/\1/p')
    cpux=$(echo "$line" | sed -n 's/.*per CPU second .*(\([0-9.]*x\)).*/\1/p')
    acc=$(echo "$steps" | awk '{ if ($1 != "") printf "%.2f", $1 - 1 }')
    printf '%-8s %-7s %10s %10s %8s %8s %8s %12s %14s\n' "$name" "$mode" "$plain" "$spec" "$x" "$pair" "$cpux" "$steps" "$acc"
  done
done
echo "(batch 1, greedy, $N tokens after $PROMPT prompt tokens (edit: $edit_len), medians of $REPS runs, threads $THREADS (0: all), gate $GATE; the target on"
echo " $DEVICE, the drafters on the CPU; tokens/step: 1 + the mean accepted run; every speculative run"
echo " first checked to give plain decoding's tokens, on a GPU up to near-ties)"
