#!/bin/sh
# bench/bench_server.sh: `loom serve` against the engine it wraps.
#
# 1/2. In turns (the machine may be shared): bench_server, one greedy
#    stream of N tokens through loom_engine directly (validated:
#    repeatable), and the same prompt through `loom serve` (validated: the
#    same ids) timed by a client over loopback; decode tok/s, TTFT, ratio.
# 3. The full load test (tests/js/load.mjs): 64 concurrent streaming
#    clients x 3 rounds, some hanging up, some sending malformed JSON,
#    oversized or trickled bodies; requests/s, TTFT and inter-token
#    p50/p99 as the clients see them. LOOM_BENCH_LOAD=0 skips it.
#
#   bench/bench_server.sh [-n 128] [--reps 5] [--threads N]
# Needs node (v18+). BUILD (default build) and MODEL may be set.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MODEL=${MODEL:-tests/fixtures/trained/pycoder-16m}
N=128 REPS=5 THREADS=0
while [ $# -gt 0 ]; do
    case $1 in
    -n) N=$2 ;;
    --reps) REPS=$2 ;;
    --threads) THREADS=$2 ;;
    *) echo "usage: bench/bench_server.sh [-n N] [--reps R] [--threads T]" >&2; exit 2 ;;
    esac
    shift 2
done
PROMPT=${PROMPT:-325,287,610,602,327}   # "def fib(n):\n" for pycoder-16m

make -s BUILD="$BUILD" "$BUILD/loom" "$BUILD/bench/bench_server" >&2

tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
"$BUILD/loom" serve --model "$MODEL" --port 0 --port-file "$tmp/port" --threads "$THREADS" \
    --max-body 1M >"$tmp/log" 2>&1 &
pid=$!
i=0
until [ -s "$tmp/port" ] && curl -sf "http://127.0.0.1:$(cat "$tmp/port")/health" >/dev/null 2>&1; do
    i=$((i + 1)); [ "$i" -lt 300 ] || { cat "$tmp/log"; exit 1; }; sleep 0.1
done
url="http://127.0.0.1:$(cat "$tmp/port")"
node bench/bench_server.mjs --url "$url" --prompt "$PROMPT" --reps "$REPS" \
    --engine-cmd "$BUILD/bench/bench_server --model $MODEL --prompt $PROMPT -n $N --reps 1 --threads $THREADS"
if [ "${LOOM_BENCH_LOAD:-1}" != 0 ]; then
    echo "load test: node tests/js/load.mjs --url $url --clients 64 --rounds 3 --max-tokens 64 --oversize 1100000"
    node tests/js/load.mjs --url "$url" --clients 64 --rounds 3 --max-tokens 64 --oversize 1100000
fi
kill -TERM "$pid"
wait "$pid"
pid=""
