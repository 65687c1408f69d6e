#!/bin/sh
# loom serve through the official OpenAI Node client (tests/js: chat,
# completions, embeddings), then a
# bounded loopback load test: streaming clients, some hanging up
# mid-stream, some sending malformed JSON, oversized or trickled bodies;
# afterwards the KV pool must be idle. Needs node and `npm ci --prefix
# tests/js` (scripts/install-deps.sh runs it); without them this fails.
# LOOM_LOAD_CLIENTS / LOOM_LOAD_ROUNDS / LOOM_LOAD_TOKENS size the load
# test (default 64 x 1 x 16 here; bench/bench_server.sh runs a larger one).
set -u
. tests/js/server_lib.sh

command -v node >/dev/null || fail "node is not installed (scripts/install-deps.sh installs it)"
[ -f tests/js/node_modules/openai/package.json ] ||
    fail "the openai package is missing: run 'npm ci --prefix tests/js' (scripts/install-deps.sh does)"
echo "node $(node --version), openai $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' tests/js/node_modules/openai/package.json)"

start_server js --api-key test-key --max-body 100K --grace 5
JS_PID=$PID JS_LOG=$LOG JS_BASE=$BASE
start_server busy --api-key test-key --max-seqs 1 --max-queue 1
BUSY_PID=$PID BUSY_LOG=$LOG BUSY_BASE=$BASE

LOOM_URL=$JS_BASE LOOM_BUSY_URL=$BUSY_BASE LOOM_API_KEY=test-key node tests/js/openai.test.mjs ||
    fail "OpenAI client tests"
LOOM_URL=$JS_BASE LOOM_API_KEY=test-key node tests/js/embeddings.test.mjs || fail "embeddings client tests"
stop_server "$BUSY_PID" "$BUSY_LOG"

node tests/js/load.mjs --url "$JS_BASE" --key test-key --clients "${LOOM_LOAD_CLIENTS:-64}" \
    --rounds "${LOOM_LOAD_ROUNDS:-1}" --max-tokens "${LOOM_LOAD_TOKENS:-16}" \
    --oversize 150000 --slow-ms 1500 || fail "load test"
BASE=$JS_BASE
s=$(req GET /health); expect_status 200 "$s" "/health after the load test"
stop_server "$JS_PID" "$JS_LOG"
echo "all OpenAI client and load checks passed"
