#!/bin/sh
# loom serve keeps prefix-cache tenants apart: requests under one
# cache_session_id reuse each other's cached KV blocks, never another
# session's nor those of requests without one (completions with token ids
# and chat), and the same holds for blocks read back from --prefix-cache-dir
# after a restart. usage.prompt_tokens_details.cached_tokens tells.
set -u
. tests/js/server_lib.sh

KV="$TMPD/kv"
P=$(seq -s, 200 299)                 # 100 tokens: 6 full blocks of 16 cached
FULL=96
LONG='write a function that parses a date in the form year-month-day, checks every field, and returns the day of the week; then write the tests for it, one per month, including the leap years'

# cached_tokens of the last body
cached() { sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' "$TMPD/body"; }

# cmpl SESSION miss|hit: a completion of P under SESSION ("" = none) must
# report no cached prompt tokens (miss), or at least the 96 of its full
# blocks (hit: a session may resume its latest turn further, to 99).
cmpl() {
    sid=""
    [ -n "$1" ] && sid=",\"cache_session_id\":\"$1\""
    s=$(req POST /v1/completions "{\"prompt\":[$P],\"max_tokens\":4,\"temperature\":0$sid}")
    expect_status 200 "$s" "completion (session '${1:-none}')"
    c=$(cached)
    case $2 in
    miss) [ "$c" = 0 ] || fail "completion under session '${1:-none}': $c cached tokens, expected 0" ;;
    *) [ -n "$c" ] && [ "$c" -ge $FULL ] && [ "$c" -lt 100 ] ||
        fail "completion under session '${1:-none}': '$c' cached tokens, expected $FULL..99" ;;
    esac
}

# chat SESSION: a chat of LONG under SESSION ("" = none); sets C (its
# cached tokens) and CHAT_FULL (the tokens of its prompt's full blocks).
chat() {
    sid=""
    [ -n "$1" ] && sid=",\"cache_session_id\":\"$1\""
    s=$(req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}],\"max_tokens\":4,\"temperature\":0$sid}")
    expect_status 200 "$s" "chat (session '${1:-none}')"
    C=$(cached)
    CHAT_FULL=$(( ($(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$TMPD/body") - 1) / 16 * 16 ))
    [ -n "$C" ] || fail "chat under session '${1:-none}': no cached_tokens in $(head -c 400 "$TMPD/body")"
}

start_server iso --prefix-cache-dir "$KV"
cmpl alice miss
cmpl bob miss
cmpl "" miss
cmpl alice-2 miss                    # a session id extending another is another
cmpl alice hit
cmpl bob hit
cmpl "" hit
ok "completions: a session hits its own blocks only, none shares with a session"

chat carol
[ "$C" = 0 ] || fail "chat, first of session carol: $C cached tokens, expected 0"
chat dave
[ "$C" = 0 ] || fail "chat, session dave after carol: $C cached tokens, expected 0"
chat ""
[ "$C" = 0 ] || fail "chat without a session after carol and dave: $C cached tokens, expected 0"
chat carol
[ "$CHAT_FULL" -ge 16 ] && [ "$C" -ge "$CHAT_FULL" ] ||
    fail "chat, carol again: $C cached tokens, expected at least $CHAT_FULL"
ok "chat: the same messages under another session or none compute every token"
stop_server "$PID" "$LOG" 20        # spills the cached blocks to $KV

ls "$KV"/*.lkv >/dev/null 2>&1 || fail "no block files in $KV after the shutdown"
start_server iso2 --prefix-cache-dir "$KV"
cmpl erin miss
chat erin
[ "$C" = 0 ] || fail "chat, new session erin after the restart: $C cached tokens, expected 0"
[ "$(metric loom_prefix_cache_disk_hit_tokens_total)" = 0 ] ||
    fail "a new session read $(metric loom_prefix_cache_disk_hit_tokens_total) tokens from disk"
cmpl alice hit
cmpl "" hit
chat carol
[ "$C" = "$CHAT_FULL" ] || fail "chat, carol after the restart: $C cached tokens, expected $CHAT_FULL"
[ "$(metric loom_prefix_cache_disk_hit_tokens_total)" -ge $((2 * FULL + CHAT_FULL)) ] ||
    fail "only $(metric loom_prefix_cache_disk_hit_tokens_total) tokens read from disk"
ok "after a restart over --prefix-cache-dir: each session reads only its own blocks"
stop_server "$PID" "$LOG" 20
echo "all isolation checks passed"
