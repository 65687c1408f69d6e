#!/bin/sh
# loom chat driven through a pipe: SIGINT (Ctrl-C) during a long reply stops
# it and the prompt comes back, the next line still gets a reply; an unknown
# /command is an error that never reaches the model; Ctrl-C at the prompt
# warns, a second one quits; EOF ends with a newline; the penalty window
# holds the conversation, so a greedy first reply is loom generate --chat's.
set -eu
LOOM="${LOOM_BUILD:-build}/loom"
MODEL=models/pycoder-16m
dir=$(mktemp -d /tmp/loom-chat-XXXXXX)
pid=""
trap 'if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi; rm -rf "$dir"' EXIT

fail() {
    echo "FAIL: $*"
    echo "--- stderr"; cat "$dir/err"
    echo "--- stdout (head)"; head -c 1000 "$dir/out"; echo
    exit 1
}
prompts() { grep -o '> ' "$dir/err" | wc -l; }
bytes() { wc -c <"$dir/out"; }
# until: waits (60 s at most) for the shell condition $1; $2 names it.
until_ok() {
    i=0
    while ! eval "$1"; do
        i=$((i + 1))
        [ "$i" -lt 600 ] || fail "$2 (not within 60 s)"
        kill -0 "$pid" 2>/dev/null || fail "$2 (loom chat exited)"
        sleep 0.1
    done
}

# ---- a session through a pipe: signals, commands ----
mkfifo "$dir/in"
"$LOOM" chat --model "$MODEL" --max-tokens 3000 --seed 5 --threads 2 <"$dir/in" >"$dir/out" 2>"$dir/err" &
pid=$!
exec 3>"$dir/in"
until_ok '[ "$(prompts)" -ge 1 ]' "first prompt"
echo "write a class with many methods" >&3
# seed 5 makes this reply run to the 3000-token limit (seconds): stop it early
until_ok '[ "$(bytes)" -ge 40 ]' "reply streaming"
kill -INT "$pid"
until_ok 'grep -q "(reply stopped)" "$dir/err" && [ "$(prompts)" -ge 2 ]' "reply stopped, prompt back"
# an unknown command: an error, the model sees nothing
before=$(bytes)
echo "/foo bar" >&3
until_ok '[ "$(prompts)" -ge 3 ]' "prompt after /foo"
grep -q "unknown command /foo; commands: /reset, /image FILE, /exit, /quit, /help" "$dir/err" || fail "no error for /foo"
[ "$(bytes)" -eq "$before" ] || fail "/foo reached the model"
# the next line gets a reply (stopped again, as it may be long)
echo "and a test for it" >&3
until_ok '[ "$(bytes)" -ge $((before + 40)) ] || [ "$(prompts)" -ge 4 ]' "second reply"
if [ "$(prompts)" -lt 4 ]; then kill -INT "$pid"; fi
until_ok '[ "$(prompts)" -ge 4 ]' "prompt after the second reply"
# Ctrl-C at the prompt warns; a second one quits, ending with a newline
echo "/help" >&3
until_ok '[ "$(prompts)" -ge 5 ]' "prompt after /help"
sleep 0.3 # into the read
kill -INT "$pid"
until_ok 'grep -q "Ctrl-C again or Ctrl-D to quit" "$dir/err" && [ "$(prompts)" -ge 6 ]' "warning at the prompt"
sleep 0.3
kill -INT "$pid"
i=0
while kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -lt 300 ] || fail "a second Ctrl-C at the prompt did not quit"
    sleep 0.1
done
rc=0
wait "$pid" || rc=$?
pid=""
exec 3>&-
[ "$rc" -eq 0 ] || fail "exit status $rc after Ctrl-C twice"
[ "$(tail -c 3 "$dir/err" | od -An -c | tr -d ' ')" = '>\n' ] || fail "quitting does not end the line"

# ---- EOF (Ctrl-D) quits and ends the prompt's line ----
printf '/help\n' | "$LOOM" chat --model "$MODEL" >/dev/null 2>"$dir/err"
[ "$(tail -c 3 "$dir/err" | od -An -c | tr -d ' ')" = '>\n' ] || fail "EOF does not end the line"

# ---- the penalty window holds the conversation, as the server's ----
printf 'hello\n' | "$LOOM" chat --model "$MODEL" --temperature 0 --repeat-penalty 1.5 --max-tokens 40 \
    >"$dir/chat.out" 2>/dev/null
"$LOOM" generate --model "$MODEL" --chat --prompt hello --temperature 0 --repeat-penalty 1.5 \
    --max-tokens 40 >"$dir/gen.out" 2>/dev/null
cmp -s "$dir/chat.out" "$dir/gen.out" || fail "greedy penalised reply differs from loom generate --chat:
$(cat "$dir/chat.out")
---
$(cat "$dir/gen.out")"
echo ok
