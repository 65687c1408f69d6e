# Shell helpers for tests/cli_server*.sh (sourced, POSIX sh): start a loom
# server on a free port, wait for /health, stop it with SIGTERM and check
# that it exited 0 with no sanitizer report in its log. Everything started
# here is killed and every temporary file removed on exit, pass or fail.
: "${LOOM_BUILD:=build}"
LOOM_BIN="$LOOM_BUILD/loom"
MODEL=tests/fixtures/trained/pycoder-16m
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/loom-srv.XXXXXX")
SERVER_PIDS=""
CHILD_PIDS=""

fail() {
    echo "FAIL: $*"
    for l in "$TMPD"/server*.log; do
        [ -e "$l" ] || continue
        echo "--- $l (last 30 lines)"
        tail -n 30 "$l"
    done
    exit 1
}
ok() { echo "ok: $*"; }

cleanup() {
    for p in $CHILD_PIDS $SERVER_PIDS; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$TMPD"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

[ -x "$LOOM_BIN" ] || fail "$LOOM_BIN not built"
command -v curl >/dev/null || fail "curl is required (scripts/install-deps.sh installs it)"

# start_server NAME [serve options...]: starts a server whose log is
# $TMPD/server-NAME.log; sets PORT, PID, LOG and BASE (http://127.0.0.1:PORT).
start_server() {
    name=$1
    shift
    LOG="$TMPD/server-$name.log"
    pf="$TMPD/port-$name"
    "$LOOM_BIN" serve --model "$MODEL" --port 0 --port-file "$pf" --threads 2 "$@" >"$LOG" 2>&1 &
    PID=$!
    SERVER_PIDS="$SERVER_PIDS $PID"
    i=0
    while :; do
        kill -0 "$PID" 2>/dev/null || fail "server $name exited during start-up"
        if [ -s "$pf" ]; then
            PORT=$(cat "$pf")
            BASE="http://127.0.0.1:$PORT"
            curl -sf --max-time 5 "$BASE/health" >/dev/null 2>&1 && break
        fi
        i=$((i + 1))
        [ "$i" -lt 600 ] || fail "server $name not ready after 60 s"
        sleep 0.1
    done
}

# check_log FILE: no sanitizer report, no crash message.
check_log() {
    if grep -qE 'ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:|SUMMARY: .*Sanitizer' "$1"; then
        fail "sanitizer report in $1: $(grep -m3 -E 'Sanitizer|runtime error' "$1")"
    fi
}

# stop_server PID LOG [timeout_s]: SIGTERM, waits for the exit, checks code
# 0 and the log. Sets STOP_SECONDS.
stop_server() {
    spid=$1
    slog=$2
    limit=${3:-30}
    t0=$(date +%s)
    kill -TERM "$spid" 2>/dev/null || fail "server $spid is not running"
    i=0
    while kill -0 "$spid" 2>/dev/null; do
        i=$((i + 1))
        [ "$i" -lt $((limit * 10)) ] || fail "server $spid still running ${limit} s after SIGTERM"
        sleep 0.1
    done
    rc=0
    wait "$spid" || rc=$?
    STOP_SECONDS=$(($(date +%s) - t0))
    SERVER_PIDS=$(echo "$SERVER_PIDS" | sed "s/ $spid\b//")
    [ "$rc" -eq 0 ] || fail "server exited with $rc after SIGTERM"
    check_log "$slog"
}

# req METHOD PATH [BODY [curl args...]]: an empty BODY sends none. The
# response body goes to $TMPD/body, the status code to stdout.
req() {
    m=$1
    p=$2
    b=${3:-}
    [ $# -ge 3 ] && shift 3 || shift $#
    if [ -n "$b" ]; then
        curl -s --max-time 120 -X "$m" -o "$TMPD/body" -w '%{http_code}' \
            -H 'Content-Type: application/json' --data-binary "$b" "$@" "$BASE$p"
    else
        curl -s --max-time 120 -X "$m" -o "$TMPD/body" -w '%{http_code}' "$@" "$BASE$p"
    fi
}

body() { cat "$TMPD/body"; }

# expect_status WANT GOT WHAT
expect_status() {
    [ "$2" = "$1" ] || fail "$3: expected HTTP $1, got $2: $(head -c 400 "$TMPD/body")"
}

# body_has STRING WHAT: fixed-string match in the last body.
body_has() {
    grep -qF -- "$1" "$TMPD/body" || fail "$2: expected $1 in $(head -c 600 "$TMPD/body")"
}

# metric NAME: the value of an unlabelled metric from /metrics (which
# needs the key of a server started with --api-key: set API_KEY).
metric() {
    curl -s --max-time 10 ${API_KEY:+-H} ${API_KEY:+"Authorization: Bearer $API_KEY"} "$BASE/metrics" |
        awk -v n="$1" '$1 == n { print $2 }'
}

# wait_metric NAME VALUE SECONDS: polls /metrics until NAME equals VALUE.
wait_metric() {
    i=0
    while [ "$(metric "$1")" != "$2" ]; do
        i=$((i + 1))
        [ "$i" -lt $(($3 * 20)) ] || fail "$1 is $(metric "$1"), expected $2 within $3 s"
        sleep 0.05
    done
}
