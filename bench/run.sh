#!/bin/sh
# bench/run.sh: the model benchmark table in one command.
#
# Builds bench_model and gen_model under $BUILD (default build/bench),
# generates the random-weight Qwen3-0.6B-shaped model(s) under
# $LOOM_BENCH_DIR (default /tmp/loom-bench) if missing, then runs bench_model
# on tests/fixtures/trained/pycoder-16m and those models. Extra arguments go
# to bench_model (-p 512 -n 128 --reps 5 --threads N --json).
#
#   bench/run.sh
#   LOOM_BENCH_DTYPES="bf16 f16 f32" bench/run.sh --reps 3
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/bench}
DIR=${LOOM_BENCH_DIR:-/tmp/loom-bench}
DTYPES=${LOOM_BENCH_DTYPES:-bf16}
SEED=1

make -s BUILD="$BUILD" "$BUILD/bench/bench_model" "$BUILD/tools/gen_model" >&2

set -- --model tests/fixtures/trained/pycoder-16m "$@"
for dt in $DTYPES; do
    out="$DIR/qwen3-0.6b-$dt"
    if [ ! -f "$out/model.safetensors" ] || [ ! -f "$out/config.json" ]; then
        "$BUILD/tools/gen_model" --preset qwen3-0.6b --dtype "$dt" --seed "$SEED" --out "$out"
    fi
    set -- "$@" --model "$out"
done
exec "$BUILD/bench/bench_model" "$@"
