#!/bin/sh
# loom serve's routes: every /v1 route and its unprefixed alias, and
# /metrics, need --api-key's bearer token (only /health is open); unknown
# paths 404, wrong methods 405, in OpenAI's error shape, counted under the
# route's label; a request's "model" must be a served name (or absent),
# else 404 model_not_found.
set -u
. tests/js/server_lib.sh

K='Authorization: Bearer sekrit'
C='{"prompt":"x","max_tokens":2}'
H='{"messages":[{"role":"user","content":"x"}],"max_tokens":2}'

start_server keyed --api-key sekrit --served-model-name coder,pycoder-16m,other
KEY_PID=$PID KEY_LOG=$LOG

# ---- the key, on every route but /health ----
s=$(req GET /health); expect_status 200 "$s" "/health without the key"
for r in "POST /completions $C" "POST /v1/completions $C" "POST /chat/completions $H" \
    "POST /v1/chat/completions $H" "GET /models" "GET /v1/models" "GET /metrics"; do
    # shellcheck disable=SC2086
    set -- $r
    s=$(req "$1" "$2" "${3:-}"); expect_status 401 "$s" "$1 $2 without the key"
    body_has '"type":"authentication_error"' "$1 $2 without the key"
    s=$(req "$1" "$2" "${3:-}" -H 'Authorization: Bearer wrong'); expect_status 401 "$s" "$1 $2 with a wrong key"
    s=$(req "$1" "$2" "${3:-}" -H "$K"); expect_status 200 "$s" "$1 $2 with the key"
done
body_has 'loom_requests_total{endpoint="completions",status="401"} 4' "401s counted under the route"
body_has 'loom_requests_total{endpoint="metrics",status="401"} 2' "401s of /metrics counted"
ok "401 without the key on /v1 routes, their aliases and /metrics; 200 with it; /health open"

# ---- 404 and 405, in OpenAI's shape ----
s=$(req GET /v1/nope "" -H "$K"); expect_status 404 "$s" "unknown /v1 path"
body_has '"error":{"message":"no route for GET /v1/nope"' 404; body_has '"type":"not_found_error"' 404
s=$(req GET /nope); expect_status 404 "$s" "unknown path without the key"
s=$(req POST /v1 "$C" -H "$K"); expect_status 404 "$s" "/v1 alone"
s=$(req GET /v1/health); expect_status 404 "$s" "/health has no /v1 alias"
s=$(req GET /completions "" -H "$K"); expect_status 405 "$s" "GET /completions"
body_has '"type":"invalid_request_error"' 405; body_has 'needs POST' 405
s=$(req POST /v1/models "$C" -H "$K"); expect_status 405 "$s" "POST /v1/models"
s=$(req DELETE /health); expect_status 405 "$s" "DELETE /health"
s=$(req GET /chat/completions); expect_status 401 "$s" "GET /chat/completions without the key"
s=$(req GET /metrics "" -H "$K")
body_has 'loom_requests_total{endpoint="models",status="405"} 1' "405 counted under models"
body_has 'loom_requests_total{endpoint="other",status="404"} 4' "404s counted as other"
body_has 'loom_requests_total{endpoint="health",status="200"} ' "health counted"
ok "404 for unknown paths, 405 for wrong methods"

# ---- model names ----
s=$(req GET /v1/models "" -H "$K"); expect_status 200 "$s" "models"
body_has '"data":[{"id":"coder","object":"model"' "the first served name is the id"
s=$(req POST /v1/completions '{"model":"gpt-4o","prompt":"x","max_tokens":2}' -H "$K")
expect_status 404 "$s" "unknown model"
body_has '"type":"invalid_request_error"' "unknown model"; body_has '"code":"model_not_found"' "unknown model"
body_has "'gpt-4o'" "the message names the model asked for"
body_has "'coder', 'pycoder-16m', 'other'" "the message names the served models"
s=$(req POST /chat/completions '{"model":"nope","messages":[{"role":"user","content":"x"}],"max_tokens":2}' -H "$K")
expect_status 404 "$s" "unknown model in chat"; body_has '"code":"model_not_found"' "unknown model in chat"
s=$(req POST /v1/completions '{"model":"coder","prompt":"x","max_tokens":2}' -H "$K")
expect_status 200 "$s" "the served name"; body_has '"model":"coder"' "responses report the id"
s=$(req POST /v1/completions '{"model":"other","prompt":"x","max_tokens":2}' -H "$K")
expect_status 200 "$s" "an alias"; body_has '"model":"coder"' "an alias answers with the id"
s=$(req POST /v1/chat/completions '{"model":"pycoder-16m","messages":[{"role":"user","content":"x"}],"max_tokens":2}' -H "$K")
expect_status 200 "$s" "an alias in chat"
s=$(req POST /v1/completions "$C" -H "$K"); expect_status 200 "$s" "no model"
ok "unknown models 404 model_not_found; the id, aliases and no model are served"
stop_server "$KEY_PID" "$KEY_LOG"

# ---- without --served-model-name: the directory's name ----
start_server plain
s=$(req POST /completions '{"model":"pycoder-16m","prompt":"x","max_tokens":2}'); expect_status 200 "$s" "the dir name"
s=$(req POST /completions '{"model":"coder","prompt":"x","max_tokens":2}'); expect_status 404 "$s" "another name"
body_has "this server serves 'pycoder-16m'" "the served name"
s=$(req GET /metrics); expect_status 200 "$s" "/metrics with no --api-key"
stop_server "$PID" "$LOG"
"$LOOM_BIN" serve --model "$MODEL" --served-model-name 'a,,b' >/dev/null 2>"$TMPD/err" &&
    fail "--served-model-name with an empty name accepted"
grep -q 'expected up to 16 comma-separated names' "$TMPD/err" || fail "empty name: $(cat "$TMPD/err")"
ok "the directory's name by default; empty names refused"
echo "all route checks passed"
