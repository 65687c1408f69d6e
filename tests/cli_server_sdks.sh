#!/bin/sh
# loom serve through the official clients of two more APIs: Anthropic's
# Messages API (@anthropic-ai/sdk, tests/js/anthropic.test.mjs)
# and OpenAI's Responses API (openai, tests/js/responses.test.mjs). A
# second server runs the same model under a chat template that renders
# tools (tests/fixtures/templates/hermes-tools.jinja), for the tool round
# trips. Needs node and `npm ci --prefix tests/js` (scripts/install-deps.sh).
set -u
. tests/js/server_lib.sh

command -v node >/dev/null || fail "node is not installed (scripts/install-deps.sh installs it)"
for p in openai @anthropic-ai/sdk; do
    [ -f "tests/js/node_modules/$p/package.json" ] ||
        fail "the $p package is missing: run 'npm ci --prefix tests/js' (scripts/install-deps.sh does)"
done

# the model with a tool-rendering template: its files, and the template beside them
TOOLS_MODEL="$TMPD/pycoder-16m"
mkdir -p "$TOOLS_MODEL"
for f in "$MODEL"/*; do ln -s "$PWD/$f" "$TOOLS_MODEL/"; done
cp tests/fixtures/templates/hermes-tools.jinja "$TOOLS_MODEL/chat_template.jinja"

start_server sdk --api-key test-key
SDK_PID=$PID SDK_LOG=$LOG SDK_BASE=$BASE
PLAIN_MODEL=$MODEL MODEL=$TOOLS_MODEL
start_server tools --api-key test-key
MODEL=$PLAIN_MODEL
TOOLS_PID=$PID TOOLS_LOG=$LOG TOOLS_BASE=$BASE
grep -q "loom: pycoder-16m" "$TOOLS_LOG" || fail "the tools server does not serve pycoder-16m: $(tail -n 3 "$TOOLS_LOG")"

LOOM_URL=$SDK_BASE LOOM_TOOLS_URL=$TOOLS_BASE LOOM_API_KEY=test-key node tests/js/anthropic.test.mjs ||
    fail "Anthropic client tests"
LOOM_URL=$SDK_BASE LOOM_TOOLS_URL=$TOOLS_BASE LOOM_API_KEY=test-key node tests/js/responses.test.mjs ||
    fail "OpenAI Responses client tests"
stop_server "$TOOLS_PID" "$TOOLS_LOG"
stop_server "$SDK_PID" "$SDK_LOG"
echo "all Anthropic and Responses client checks passed"
