#!/bin/sh
# cuda_check: builds loom with the CUDA backend (make CUDA=1) and runs the
# GPU tests: tests/cuda/test_cuda_kernels.c (one PASS/FAIL line per kernel
# case with its largest error), tests/cuda/test_cuda_forward.c (GPU
# forward vs CPU forward logits on the tiny fixture models),
# test_cuda_engine.c, test_cuda_spec.c (speculative decoding) and
# test_cuda_vision.c (images, the tower on the CPU) and test_cuda_tp.c
# (tensor parallelism). Run from anywhere on a
# machine with an NVIDIA GPU and the CUDA toolkit:
#   sh tools/cuda_check.sh
# Environment: CUDA_HOME (default /usr/local/cuda, else where nvcc is),
# BUILD (default build/cuda), CUDA_ARCH (default -arch=sm_90),
# CUDA_CHECK_SANITIZE=1 also runs the tests under compute-sanitizer;
# CUDA_CHECK_MINIMAL=1 always takes the minimal build (make cuda-min);
# DEPS=DIR: the library's packages unpacked into DIR (README, CUDA).
# Exit status: 0 all passed, 1 a kernel case failed, 2 the build failed.
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD=${BUILD:-build/cuda}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] && command -v nvcc >/dev/null 2>&1; then
  CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
fi
NVCC="$CUDA_HOME/bin/nvcc"
CUDA_ARCH=${CUDA_ARCH:--arch=sm_90}
JOBS=$(nproc 2>/dev/null || echo 4)
if [ -z "${CC:-}" ]; then
  if command -v cc >/dev/null 2>&1; then CC=cc; else CC=gcc; fi
fi
export CC

echo "== environment"
date -u '+%Y-%m-%d %H:%M:%S UTC'
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader ||
    echo "nvidia-smi: query failed"
else
  echo "nvidia-smi: not found"
fi
if [ ! -x "$NVCC" ]; then
  echo "cuda_check: no nvcc at $NVCC (set CUDA_HOME)"
  exit 2
fi
"$NVCC" --version | tail -n 2

if ! command -v make >/dev/null 2>&1; then
  echo "cuda_check: make not found"
  exit 2
fi

# The library's own dependencies (scripts/install-deps.sh) are installed
# only when a header is missing. A GPU machine that has no network and lacks
# them still gets the GPU tests from `make cuda-min`: the library less the
# parts that need the packages, with stand-ins for <xxhash.h> and
# <utf8proc.h> (tests/cuda/shim); without cJSON only the kernel test.
missing=""
for h in ${CUDA_CHECK_HEADERS:-pcre2.h utf8proc.h cjson/cJSON.h microhttpd.h xxhash.h png.h jpeglib.h}; do
  printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\n' "$h" |
    $CC ${DEPS:+-I"$DEPS/usr/include"} -E -x c - >/dev/null 2>&1 || missing="$missing $h"
done
if [ "${CUDA_CHECK_MINIMAL:-0}" = 1 ]; then
  missing=" (CUDA_CHECK_MINIMAL=1)"
elif [ -n "$missing" ]; then
  echo "missing headers:$missing; trying scripts/install-deps.sh"
  # An offline machine fails here; do not let apt wait on the network.
  to=""
  command -v timeout >/dev/null 2>&1 && to="timeout 180"
  if $to sh scripts/install-deps.sh; then missing=""; else echo "install-deps failed"; fi
fi

mkdir -p "$BUILD"
log="$BUILD/cuda_check_build.log"
if [ -z "$missing" ]; then
  target="cuda-tests $BUILD/tools/gen_model"
  out="$BUILD"
  echo "== build: make BUILD=$BUILD CUDA=1 CUDA_HOME=$CUDA_HOME CUDA_ARCH=$CUDA_ARCH cuda-tests"
else
  target=cuda-min
  out="$BUILD/min"
  echo "== build (minimal, missing:$missing): make BUILD=$BUILD CUDA=1 CUDA_HOME=$CUDA_HOME CUDA_ARCH=$CUDA_ARCH cuda-min"
fi
# a test the minimal build can no longer make must not run from an old build
tests="$out/cuda-tests"
rm -f "$tests"/test_cuda_* "$out/tools/gen_model"
make_cuda() {
  # shellcheck disable=SC2086
  make -j"$JOBS" BUILD="$BUILD" CUDA=1 CUDA_HOME="$CUDA_HOME" NVCC="$NVCC" \
    CUDA_ARCH="$CUDA_ARCH" "$@" $target >"$log" 2>&1
}
if ! make_cuda; then
  grep -E "error|warning" "$log" | head -n 30
  echo "build failed; retrying with CUDA_WERROR= (nvcc warnings not fatal)"
  if ! make_cuda CUDA_WERROR=; then
    tail -n 60 "$log"
    echo "cuda_check: BUILD FAILED (full log: $log)"
    exit 2
  fi
  echo "NOTE: built without -Werror for the .cu files (warnings above)"
fi
bin="$tests/test_cuda_kernels"
echo "build ok"

echo "== kernel tests"
"$bin"
rc=$?
# The forward test loads the tiny fixture models; the minimal build makes
# it only where cJSON is installed.
fwd="$tests/test_cuda_forward"
# Random bf16 models for the paths the f32 fixtures never take, where
# gen_model was built: qwen3 and llama layouts at head_dim 64, and at head_dim
# 128 with the GEMV widths of the real models (groups of 4 and 2), gemma2
# and gemma3 layouts at head_dim 256 (sandwich norms, softcaps, windows),
# gemma4's (per-layer inputs of 256, one KV head, sliding heads of 256 and
# full ones of 512, the last two layers sharing KV, layer scalars; and with
# its MoE block beside every MLP, all 8 experts taken as for bf16 Qwen3-MoE
# below), and
# Qwen3-MoE: 64 experts, top 8, width 256 in f32 (bf16 rounding of the
# attention inputs would move near-tied routing choices, a jump no tolerance
# bounds), and in bf16 with top k = all 16 experts (routing then moves
# smoothly) and a shared expert; the Qwen3.5 and Qwen3-Next hybrid layouts
# with the real linear-attention heads (16/32 of 128) and gated attention of
# head_dim 256, Qwen3-Next with all 16 of its experts. A model that fails to
# generate is left out, not the others.
gm="$out/tools/gen_model"
if [ -x "$gm" ] && [ -z "${LOOM_CUDA_TEST_MODELS:-}" ]; then
  small="--hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 512 --vocab 512 --layers 3"
  wide="--hidden 1024 --heads 8 --head-dim 128 --intermediate 2048 --vocab 512 --layers 2"
  LOOM_CUDA_TEST_MODELS=""
  for spec in "qwen3-bf16 qwen3-0.6b 7 $small" "llama-bf16 llama3-8b 8 $small" \
              "qwen3-wide qwen3-0.6b 9 $wide --kv-heads 2" "llama-wide llama3-8b 10 $wide --kv-heads 4" \
              "gemma2-bf16 gemma2 11" "gemma3-bf16 gemma3 12" "gemma4-bf16 gemma4 17" \
              "gemma4-moe-bf16 gemma4 18 --experts 8 --experts-used 8 --moe-intermediate 128" \
              "moe-f32 qwen3moe 13 --dtype f32" \
              "moe-all-bf16 qwen3moe 14 --experts 16 --experts-used 16 --shared-intermediate 384" \
              "qwen35-bf16 qwen3.5 15" "next-all-bf16 qwen3next 16 --experts-used 16"; do
    # shellcheck disable=SC2086
    set -- $spec
    name=$1 preset=$2 seed=$3
    shift 3
    if "$gm" --preset "$preset" --dtype bf16 "$@" --seed "$seed" --out "$BUILD/rand-$name" 2>/dev/null; then
      LOOM_CUDA_TEST_MODELS="$LOOM_CUDA_TEST_MODELS $BUILD/rand-$name"
    else
      echo "gen_model $name failed: left out of the forward tests"
    fi
  done
  export LOOM_CUDA_TEST_MODELS
fi
if [ -x "$fwd" ]; then
  echo "== forward tests (GPU vs CPU logits on tests/fixtures/models)"
  "$fwd" || rc=1
else
  echo "== forward tests SKIPPED: not built (minimal build without cjson/cJSON.h; see $log)"
fi
eng="$tests/test_cuda_engine"
if [ -x "$eng" ]; then
  echo "== context and engine on the device (reference logits and greedy tokens)"
  "$eng" || rc=1
else
  echo "== engine tests SKIPPED: not built (see $log)"
fi
spec="$tests/test_cuda_spec"
if [ -x "$spec" ]; then
  echo "== speculative decoding with the target on the device (greedy tokens as plain decoding's)"
  "$spec" || rc=1
else
  echo "== speculative decoding tests SKIPPED: not built (see $log)"
fi
vis="$tests/test_cuda_vision"
if [ -x "$vis" ]; then
  echo "== images with the language model on the device (reference greedy tokens)"
  "$vis" || rc=1
else
  echo "== vision tests SKIPPED: not built (see $log)"
fi
tpt="$tests/test_cuda_tp"
if [ -x "$tpt" ]; then
  echo "== tensor parallelism: splits over ranks sharing the GPU, and one rank (NCCL)"
  "$tpt" || rc=1
else
  echo "== tensor-parallel tests SKIPPED: not built (see $log)"
fi
if [ "${CUDA_CHECK_SANITIZE:-0}" = 1 ]; then
  echo "== compute-sanitizer (memcheck)"
  if [ -x "$CUDA_HOME/bin/compute-sanitizer" ]; then
    "$CUDA_HOME/bin/compute-sanitizer" --tool memcheck --error-exitcode 3 "$bin" >"$BUILD/sanitizer.log" 2>&1
    src=$?
    grep -E "ERROR SUMMARY|Invalid|out of bounds|cuda kernels:" "$BUILD/sanitizer.log" | head -n 20
    [ $src -ne 0 ] && [ $rc -eq 0 ] && rc=1
  else
    echo "compute-sanitizer: not found"
  fi
fi
if [ $rc -eq 0 ]; then echo "cuda_check: PASS"; else echo "cuda_check: FAIL (exit $rc)"; fi
exit $rc
