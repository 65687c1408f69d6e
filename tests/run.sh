#!/bin/sh
# Runs every test binary given, then the CLI scripts (LOOM_TEST_SCRIPTS,
# default tests/cli_*.sh; empty: none). Each runs under a deadline of
# LOOM_TEST_TIMEOUT seconds (default 600), so a hang fails that test and
# the run goes on. Prints one line per test (PASS, FAIL, TIMEOUT or SKIP),
# then "N passed, N failed"; exits non-zero if any failed or timed out.
# Under LOOM_KERNELS (ref, avx2, avx512) the suite runs on that kernel
# table only where this machine can run it; elsewhere every test is
# skipped with the reason, instead of passing on another table.
set -u
: "${LOOM_BUILD:=build}"
: "${LOOM_TEST_TIMEOUT:=600}"
: "${LOOM_TEST_SCRIPTS=tests/cli_*.sh}"
export LOOM_BUILD
passed=0 failed=0 skipped=0 skip=""
# Tokenizer fixtures are stored gzipped; tests read them unpacked from here.
for gz in tests/fixtures/tokenizers/*/tokenizer.json.gz; do
  [ -e "$gz" ] || continue
  d="$LOOM_BUILD/fixtures/tokenizers/$(basename "$(dirname "$gz")")"
  mkdir -p "$d"
  [ -s "$d/tokenizer.json" ] || gzip -dc "$gz" >"$d/tokenizer.json"
  cp -f "$(dirname "$gz")"/*.json "$d/"
done
mkdir -p "$LOOM_BUILD/tests"

# The table LOOM_KERNELS names must be the one the library picks here
# (test_kernels --name prints it; the library's warning says why not).
if [ -n "${LOOM_KERNELS:-}" ]; then
  probe="$LOOM_BUILD/tests/test_kernels"
  klog="$LOOM_BUILD/tests/kernels.log"
  case $LOOM_KERNELS in
  ref | avx2 | avx512) ;;
  *) echo "FAIL LOOM_KERNELS=$LOOM_KERNELS: expected ref, avx2 or avx512"; failed=$((failed + 1)) ;;
  esac
  if [ "$failed" -gt 0 ]; then
    :
  elif [ ! -x "$probe" ]; then
    echo "FAIL LOOM_KERNELS=$LOOM_KERNELS: $probe is not built, so the kernel table cannot be checked"
    failed=$((failed + 1))
  else
    picked=$("$probe" --name 2>"$klog")
    if [ "$picked" != "$LOOM_KERNELS" ]; then
      skip=$(sed -n 's/^loom warn: //p' "$klog" | head -n 1)
      [ -n "$skip" ] || skip="LOOM_KERNELS=$LOOM_KERNELS: this machine runs the ${picked:-unknown} kernels"
    fi
  fi
fi

if command -v timeout >/dev/null 2>&1; then
  deadline() { timeout -k 10 "$LOOM_TEST_TIMEOUT" "$@"; }
else
  echo "note: no timeout command (coreutils); tests run without a deadline"
  deadline() { "$@"; }
fi

# run NAME LOG COMMAND...: one test under the deadline, its output in LOG.
run() {
  name=$1 log=$2
  shift 2
  if [ -n "$skip" ]; then
    echo "SKIP $name ($skip)"; skipped=$((skipped + 1)); return
  fi
  rc=0
  deadline "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name"; passed=$((passed + 1)); return
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "TIMEOUT $name after $LOOM_TEST_TIMEOUT s (log: $log)"
  else
    echo "FAIL $name (exit $rc, log: $log)"
  fi
  tail -n 20 "$log"
  failed=$((failed + 1))
}

for t in "$@"; do
  run "$(basename "$t")" "$t${LOOM_KERNELS:+.$LOOM_KERNELS}.log" "$t"
done
for s in $LOOM_TEST_SCRIPTS; do
  [ -e "$s" ] || continue
  run "$(basename "$s")" "$LOOM_BUILD/tests/$(basename "$s").log" sh "$s"
done
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
