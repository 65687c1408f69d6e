#!/bin/sh
# loom serve's KV memory: the start-up line states the budget; /metrics
# splits the pool by holder (requests, prefix cache, sessions, free) and the
# parts sum to the pool before, during and after requests; the pool's pages
# are not touched at start; kept responses past the reuse cap are evicted
# and counted.
set -u
. tests/js/server_lib.sh

# the parts of the pool in one /metrics snapshot sum to it
check_sum() {
    curl -s --max-time 10 "$BASE/metrics" >"$TMPD/m"
    awk '$1 == "loom_kv_pool_bytes" { t = $2 } $1 ~ /^loom_kv_bytes\{/ { s += $2; n++ }
         END { exit !(n == 4 && t > 0 && s == t) }' "$TMPD/m" ||
        fail "$1: the KV parts do not sum to the pool: $(grep '^loom_kv' "$TMPD/m" | tr '\n' ' ')"
}
holder() { awk -v h="loom_kv_bytes{holder=\"$1\"}" '$1 == h { print $2 }' "$TMPD/m"; }
val() { awk -v n="$1" '$1 == n { print $2 }' "$TMPD/m"; }

# ---- the default budget: stated, and not resident until used ----
start_server big
grep -q "loom: KV pool [0-9.]* [GM]iB (--kv-memory): [0-9]* blocks of 16 tokens, 128 KiB a block, 8.0 KiB a token" "$LOG" ||
    fail "no KV budget line at start-up: $(cat "$LOG")"
check_sum "default pool at start"
[ "$(val loom_kv_touched_bytes)" = 0 ] || fail "pool touched at start: $(val loom_kv_touched_bytes)"
pool=$(val loom_kv_pool_bytes)
rss=$(awk '$1 == "VmRSS:" { print $2 * 1024 }' "/proc/$PID/status")
[ "$rss" -lt "$pool" ] || fail "resident $rss bytes at start, the KV pool is $pool"
stop_server "$PID" "$LOG" 20
ok "start-up line, KV pool of $pool bytes not resident at start ($rss bytes)"

# ---- a small pool: 512 blocks of 16 tokens (128 KiB each), 8 kept for reuse ----
start_server kv --kv-memory 64M --prefix-cache-bytes 1M
grep -qF "loom: KV pool 64.0 MiB (--kv-memory): 512 blocks of 16 tokens, 128 KiB a block, 8.0 KiB a token, 8192 tokens of context in all; kept for reuse: up to 1.0 MiB (--prefix-cache-bytes)" "$LOG" ||
    fail "KV budget line: $(grep 'KV pool' "$LOG")"
check_sum "at start"
[ "$(holder free)" = 67108864 ] || fail "at start: $(holder free) bytes free, want 67108864"
[ "$(val loom_kv_reuse_cap_bytes)" = 1048576 ] || fail "reuse cap $(val loom_kv_reuse_cap_bytes), want 1048576"

# while a request runs, its blocks are the requests' part (4000 tokens take
# seconds; hanging up cancels the rest)
curl -s -N --max-time 120 -H 'Content-Type: application/json' "$BASE/v1/completions" \
    -d '{"prompt":[5,6,7,8],"max_tokens":4000,"ignore_eos":true,"stream":true}' >"$TMPD/long" &
C1=$!
CHILD_PIDS="$CHILD_PIDS $C1"
wait_metric loom_running_sequences 1 20
check_sum "during a request"
[ "$(holder requests)" -gt 0 ] || fail "a running request holds no KV: $(grep '^loom_kv' "$TMPD/m" | tr '\n' ' ')"
kill "$C1"; wait "$C1" 2>/dev/null
wait_metric loom_running_sequences 0 10

# responses are kept (3 blocks each) until the 8-block cap evicts them
for i in 1 2 3 4 5; do
    P=$(seq -s, $((i * 100)) $((i * 100 + 39)))
    s=$(req POST /v1/completions "{\"prompt\":[$P],\"max_tokens\":8,\"ignore_eos\":true}")
    expect_status 200 "$s" "request $i"
done
wait_metric loom_running_sequences 0 5
check_sum "after requests"
[ "$(holder requests)" = 0 ] || fail "idle, yet requests hold $(holder requests) bytes"
kept=$(($(holder prefix_cache) + $(holder sessions)))
[ "$kept" -gt 0 ] && [ "$kept" -le 1048576 ] || fail "kept for reuse: $kept bytes, want 1..1048576"
[ "$(val loom_kv_touched_bytes)" -gt 0 ] || fail "no KV touched after requests"
[ "$(val loom_session_evictions_total)" -gt 0 ] || fail "sessions past the cap, none counted evicted"
ok "KV by holder sums to the pool before, during and after requests; $(val loom_session_evictions_total) sessions evicted"
stop_server "$PID" "$LOG" 20

# ---- a reuse cap below one block keeps one block, not the whole pool ----
start_server tiny --kv-memory 64M --prefix-cache-bytes 64K
grep -qF "kept for reuse: up to 128 KiB" "$LOG" || fail "64K cap: $(grep 'KV pool' "$LOG")"
curl -s --max-time 10 "$BASE/metrics" >"$TMPD/m"
[ "$(val loom_kv_reuse_cap_bytes)" = 131072 ] || fail "64K cap became $(val loom_kv_reuse_cap_bytes) bytes"
stop_server "$PID" "$LOG" 20
echo "all KV memory checks passed"
