#!/bin/sh
# Runs every test binary given, then the CLI scripts in tests/cli_*.sh.
# Prints one line per test and exits non-zero if any failed.
set -u
: "${LOOM_BUILD:=build}"
export LOOM_BUILD
fail=0
# Tokenizer fixtures are stored gzipped; tests read them unpacked from here.
for gz in tests/fixtures/tokenizers/*/tokenizer.json.gz; do
  [ -e "$gz" ] || continue
  d="$LOOM_BUILD/fixtures/tokenizers/$(basename "$(dirname "$gz")")"
  mkdir -p "$d"
  [ -s "$d/tokenizer.json" ] || gzip -dc "$gz" >"$d/tokenizer.json"
  cp -f "$(dirname "$gz")"/*.json "$d/"
done
for t in "$@"; do
  if "$t" >"$t.log" 2>&1; then
    echo "PASS $(basename "$t")"
  else
    echo "FAIL $(basename "$t") (log: $t.log)"; tail -n 20 "$t.log"; fail=1
  fi
done
for s in tests/cli_*.sh; do
  [ -e "$s" ] || continue
  log="$LOOM_BUILD/tests/$(basename "$s").log"
  if sh "$s" >"$log" 2>&1; then
    echo "PASS $(basename "$s")"
  else
    echo "FAIL $(basename "$s") (log: $log)"; tail -n 20 "$log"; fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "all tests passed"
exit "$fail"
