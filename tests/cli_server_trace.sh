#!/bin/sh
# loom serve tracing: with --trace-file every request's spans land in the
# file as one JSON line each; "loom_trace": true in the body or the header
# X-Loom-Trace: 1 returns one request's spans in the response (the JSON
# body's "trace", or the last chunk before [DONE] of a stream). Prompts of
# 40 tokens with --prefill-chunk 24 take two prefill chunks cold, and a
# second run hits the prefix cache (32 tokens: two full blocks).
set -u
. tests/js/server_lib.sh
command -v node >/dev/null || fail "node is required (scripts/install-deps.sh installs it)"

TF="$TMPD/trace.jsonl"
start_server trace --trace-file "$TF" --prefill-chunk 24 --cors

# check_spans FILE WHAT CHUNKS CACHED: FILE holds one JSON array of spans
# (or a {"spans": [...]} line per request, all checked); each has the seed's
# prefill span names, durations >= 0, chunks inside prefill.total, mechanism
# "continuous" on the tagged spans, at least CHUNKS prefill chunks (0 = any)
# and cache.lookup_restore's cachedTokens equal to CACHED (-1 = any).
check_spans() {
    node -e '
const fs = require("fs");
const [file, what, chunksWant, cachedWant] = process.argv.slice(1);
const text = fs.readFileSync(file, "utf8").trim();
const lists = text.startsWith("[") ? [JSON.parse(text)]
    : text.split("\n").map(l => JSON.parse(l).spans);
const need = ["cache.lookup_restore", "prefill.batch_setup", "prefill.row_sync", "prefill.chunk",
              "prefill.forward", "prefill.kv_maintenance", "prefill.evaluate", "prefill.complete",
              "prefill.total"];
const tagged = ["cache.lookup_restore", "prefill.batch_setup", "prefill.chunk", "prefill.total"];
const die = m => { console.log(`${what}: ${m}`); process.exit(1); };
if (!lists.length) die("no spans");
for (const spans of lists) {
    if (!Array.isArray(spans)) die("spans is not an array");
    for (const n of need) if (!spans.some(s => s.name === n)) die(`no ${n} span`);
    for (const s of spans) {
        if (!(s.dur_ms >= 0) || !(s.start_ms >= 0)) die(`${s.name}: start ${s.start_ms} ms, ${s.dur_ms} ms`);
        const m = tagged.includes(s.name) ? "continuous" : undefined;
        if (s.attrs.mechanism !== m) die(`${s.name}: mechanism ${s.attrs.mechanism}`);
    }
    const total = spans.find(s => s.name === "prefill.total");
    const chunks = spans.filter(s => s.name === "prefill.chunk");
    // each printed figure is rounded to 0.0005 ms: an end is a sum of two
    const eps = 2.5e-3;
    for (const c of chunks)
        if (c.start_ms < total.start_ms - eps || c.start_ms + c.dur_ms > total.start_ms + total.dur_ms + eps)
            die(`chunk at ${c.attrs.startToken} [${c.start_ms}, +${c.dur_ms}] is outside prefill.total`);
    if (+chunksWant && chunks.length < +chunksWant) die(`${chunks.length} prefill chunks, expected ${chunksWant}`);
    if (+chunksWant > 1 && (chunks[0].attrs.startToken !== 0 || chunks[1].attrs.startToken !== 24))
        die(`chunks start at ${chunks.map(c => c.attrs.startToken)}`);
    const cached = spans.find(s => s.name === "cache.lookup_restore").attrs.cachedTokens;
    if (+cachedWant >= 0 && cached !== +cachedWant) die(`cachedTokens ${cached}, expected ${cachedWant}`);
    if (total.attrs.cachedTokens !== cached) die(`prefill.total has cachedTokens ${total.attrs.cachedTokens}`);
}' "$1" "$2" "$3" "$4" || fail "$2: spans are wrong"
}

# body_trace: the "trace" of the last JSON body, into $TMPD/spans.
body_trace() {
    node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
if (!Array.isArray(b.trace)) { console.log("no trace array"); process.exit(1); }
console.log(JSON.stringify(b.trace));' "$TMPD/body" >"$TMPD/spans" || fail "$1: $(cat "$TMPD/spans") in $(head -c 300 "$TMPD/body")"
}

# stream_trace: the trace of the chunk before [DONE] of the last stream.
stream_trace() {
    grep '^data: ' "$TMPD/body" >"$TMPD/sse"
    [ "$(tail -n 1 "$TMPD/sse")" = "data: [DONE]" ] || fail "$1: the stream does not end with [DONE]"
    tail -n 2 "$TMPD/sse" | head -n 1 | sed 's/^data: //' >"$TMPD/last"
    node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
if (!Array.isArray(b.trace) || b.choices.length) { console.log("no trace in the last chunk"); process.exit(1); }
console.log(JSON.stringify(b.trace));' "$TMPD/last" >"$TMPD/spans" || fail "$1: $(cat "$TMPD/spans"): $(head -c 300 "$TMPD/last")"
}

# wait_lines N: the trace file holds N lines (the engine writes each as its
# request ends, just after the response's last event).
wait_lines() {
    i=0
    while [ "$(wc -l <"$TF" 2>/dev/null || echo 0)" -lt "$1" ]; do
        i=$((i + 1))
        [ "$i" -lt 200 ] || fail "the trace file has $(wc -l <"$TF") lines, expected $1"
        sleep 0.05
    done
}

# ---- --trace-file: every request, none of them asking ----
s=$(req POST /v1/completions '{"prompt":"def fib(n):","max_tokens":4,"temperature":0}')
expect_status 200 "$s" "completion"
grep -qF '"trace"' "$TMPD/body" && fail "an untraced response carries a trace: $(body)"
s=$(req POST /v1/chat/completions '{"messages":[{"role":"user","content":"write a function"}],"max_tokens":4,"temperature":0}')
expect_status 200 "$s" "chat"
wait_lines 2
check_spans "$TF" "trace file" 0 -1
ok "--trace-file: a line of spans for a completion and a chat request"

# ---- one request's trace over HTTP ----
A=$(seq -s, 100 139)
B=$(seq -s, 200 239)
s=$(req POST /v1/completions "{\"prompt\":[$A],\"max_tokens\":3,\"temperature\":0,\"loom_trace\":true}")
expect_status 200 "$s" "traced completion"
body_trace "traced completion"
check_spans "$TMPD/spans" "non-streaming, two chunks" 2 0
s=$(req POST /v1/completions "{\"prompt\":[$A],\"max_tokens\":3,\"temperature\":0,\"stream\":true}" -N -H 'X-Loom-Trace: 1')
expect_status 200 "$s" "traced stream (header)"
stream_trace "traced stream"
check_spans "$TMPD/spans" "streaming, prefix-cache hit" 1 32
ok "loom_trace: spans in the body (two chunks); X-Loom-Trace: spans before [DONE] (cache hit)"

s=$(req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$B\"}],\"max_tokens\":3,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"loom_trace\":true}" -N)
expect_status 200 "$s" "traced chat stream"
stream_trace "traced chat stream"
grep -qF '"usage":{' "$TMPD/last" || fail "traced chat stream: no usage in the last chunk: $(cat "$TMPD/last")"
check_spans "$TMPD/spans" "streaming chat, cold" 2 0
s=$(req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$B\"}],\"max_tokens\":3,\"temperature\":0}" -H 'X-Loom-Trace: 1')
expect_status 200 "$s" "traced chat (header)"
body_trace "traced chat"
check_spans "$TMPD/spans" "non-streaming chat, cache hit" 1 -1
node -e 'const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
process.exit(t.find(s => s.name === "cache.lookup_restore").attrs.cachedTokens > 0 ? 0 : 1)' "$TMPD/spans" ||
    fail "traced chat: the repeated prompt did not hit the prefix cache"
ok "streamed chat with usage and spans in the last chunk; a repeated chat hits the cache"

# n = 2: both choices' spans, each with its index; a stop string cancels the
# request in the engine, and its spans still close
s=$(req POST /v1/completions '{"prompt":"def fib(n):","max_tokens":3,"n":2,"loom_trace":true}')
expect_status 200 "$s" "traced n=2"
node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
for (const i of [0, 1]) if (!b.trace.some(s => s.index === i && s.name === "prefill.total")) process.exit(1);' \
    "$TMPD/body" || fail "traced n=2: not both choices in $(head -c 600 "$TMPD/body")"
s=$(req POST /v1/completions '{"prompt":"def fib(n):","max_tokens":30,"temperature":0,"stop":["return"],"loom_trace":true}')
expect_status 200 "$s" "traced stop string"
body_has '"finish_reason":"stop"' "traced stop string"
body_trace "traced stop string"
check_spans "$TMPD/spans" "stop string" 1 -1
ok "n = 2 gives each choice's spans with its index; a stop string's request closes its spans"

# a browser may send the header (CORS preflight)
h=$(curl -s --max-time 10 -D - -o /dev/null -X OPTIONS -H 'Origin: http://x' \
    -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: x-loom-trace' \
    "$BASE/v1/completions")
echo "$h" | grep -qi '^Access-Control-Allow-Headers:.*X-Loom-Trace' || fail "CORS preflight does not allow X-Loom-Trace: $h"

# traced requests also go to the file; a trace that is not a boolean is refused
wait_lines 9
check_spans "$TF" "trace file" 0 -1
s=$(req POST /v1/completions '{"prompt":"x","max_tokens":1,"loom_trace":"yes"}')
expect_status 400 "$s" "loom_trace not a boolean"
body_has '"param":"loom_trace"' "loom_trace error"
ok "traced requests are in the file too; a non-boolean loom_trace is a 400"

stop_server "$PID" "$LOG"
ok "server stopped cleanly"
