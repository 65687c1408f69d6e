#!/bin/sh
# loom serve against slow clients: 700 connections from 127.0.0.2 that
# trickle a header line every 2 s must not starve /health from 127.0.0.1
# (the per-address limit takes 64 of them, the rest are refused), and each
# one held is disconnected at the header deadline however it trickles; a
# trickled body meets its own deadline, and a stream that outlives both is
# not cut, nor a kept-alive connection idle between requests. Bounded
# to about 15 s.
set -u
. tests/js/server_lib.sh
command -v python3 >/dev/null || fail "python3 is required"
[ "$(ulimit -n)" -ge 2048 ] || ulimit -n 2048 || fail "cannot raise the open file limit to 2048"

HT=4 # --header-timeout and --body-timeout
start_server slow --header-timeout $HT --body-timeout $HT --max-connections-per-ip 64

# The tricklers: every connection sends a request line, then a header line
# every 2 s; a closed one notes when. Times count from the end of the
# connecting (which a loaded machine may slow down): prints how many were
# made, how many were held open 0.5 s and HT+3 s after, and when the body
# trickler was closed after its headers.
cat >"$TMPD/slow.py" <<'EOF'
import select, socket, sys, time
port, n, ht, ready = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
socks = []
def opened(src):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(1)
    s.connect(('127.0.0.1', port))
    s.setblocking(False)
    return s
t0 = time.monotonic()
while len(socks) < n and time.monotonic() - t0 < 8:
    try:
        s = opened('127.0.0.2')
        s.send(b'GET /health HTTP/1.1\r\nHost: x\r\n')
        socks.append(s)
    except OSError:
        pass
made = len(socks)
body = opened('127.0.0.3')  # headers at once, then a byte of the body a second
body.send(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
          b'Content-Length: 100\r\n\r\n{')
t_done = time.monotonic()
body_closed = None
open(ready, 'w').close()
held_early = None
live = set(socks)
last, tick = t_done, 0
while time.monotonic() - t_done < ht + 3:
    watch = {s.fileno(): s for s in live | ({body} if body_closed is None else set())}
    p = select.poll()  # select() stops at fd 1024
    for fd in watch:
        p.register(fd, select.POLLIN)
    for fd, _ in p.poll(100):
        s = watch[fd]
        try:
            gone = s.recv(4096) == b''
        except OSError:
            gone = True
        if gone and s is body:
            body_closed = time.monotonic() - t_done
        elif gone:
            live.discard(s)
    now = time.monotonic()
    if held_early is None and now - t_done >= 0.5:
        held_early = len(live)
    if now - last >= 1:
        last, tick = now, tick + 1
        for s in list(live) if tick % 2 == 0 else []:
            try:
                s.send(b'X-Slow-%d: x\r\n' % tick)
            except OSError:
                live.discard(s)
        if body_closed is None:
            try:
                body.send(b' ')
            except OSError:
                body_closed = now - t_done
print('made=%d held_early=%d held_late=%d body_closed=%s' %
      (made, held_early, len(live), '%.1f' % body_closed if body_closed else 'never'))
EOF
python3 "$TMPD/slow.py" "$PORT" 700 $HT "$TMPD/ready" >"$TMPD/slow.out" 2>&1 &
SLOW=$!
CHILD_PIDS="$CHILD_PIDS $SLOW"
i=0
while [ ! -e "$TMPD/ready" ]; do
    kill -0 "$SLOW" 2>/dev/null || fail "the slow clients stopped: $(cat "$TMPD/slow.out")"
    i=$((i + 1)); [ "$i" -lt 200 ] || fail "700 connections not made in 20 s"; sleep 0.1
done

# a stream that outlives the deadlines: 8 choices of 4000 tokens
curl -s -N --max-time $((HT + 3)) -o "$TMPD/stream" -H 'Content-Type: application/json' \
    "$BASE/v1/completions" -d '{"prompt":"def","max_tokens":4000,"n":8,"ignore_eos":true,"stream":true}' &
STREAM=$!
CHILD_PIDS="$CHILD_PIDS $STREAM"

# /health from another address answers while the tricklers are held
for k in 1 2 3; do
    t=$(date +%s%N)
    s=$(curl -s --max-time 5 -o "$TMPD/body" -w '%{http_code}' "$BASE/health")
    ms=$((($(date +%s%N) - t) / 1000000))
    expect_status 200 "$s" "/health with 700 slow clients open (try $k, $ms ms)"
    sleep 0.5
done
ok "/health answers with 700 slow clients open"

rc=0
wait "$STREAM" || rc=$?
wait "$SLOW" || fail "the slow clients failed: $(cat "$TMPD/slow.out")"
out=$(cat "$TMPD/slow.out")
echo "slow clients: $out"
made=$(echo "$out" | sed -n 's/.*made=\([0-9]*\).*/\1/p')
early=$(echo "$out" | sed -n 's/.*held_early=\([0-9-]*\).*/\1/p')
late=$(echo "$out" | sed -n 's/.*held_late=\([0-9-]*\).*/\1/p')
bclosed=$(echo "$out" | sed -n 's/.*body_closed=\([0-9.a-z]*\).*/\1/p')
[ -n "$made" ] && [ "$made" -ge 200 ] || fail "only $made slow connections made in 8 s"
[ -n "$early" ] && [ "$early" -ge 1 ] && [ "$early" -le 64 ] ||
    fail "$early slow connections held before the deadline, expected 1 to 64 (the per-address limit)"
[ "$late" = 0 ] || fail "$late slow connections still open $((HT + 3)) s after the last connected (header timeout $HT s)"
case $bclosed in
never) fail "a trickled body was never cut (body timeout $HT s)" ;;
esac
awk -v t="$bclosed" -v h=$HT 'BEGIN { exit !(t >= h - 0.5 && t <= h + 3) }' ||
    fail "a trickled body was cut after $bclosed s, expected about $HT s"
ok "slow headers cut at the $HT s deadline, the per-address limit holds them to 64, a slow body cut after $bclosed s"

# the stream ran past both deadlines and was ended by curl's --max-time only
[ "$rc" = 28 ] || fail "the stream ended with curl status $rc before $((HT + 3)) s (28: timed out, as expected): $(tail -c 300 "$TMPD/stream")"
grep -q '"text"' "$TMPD/stream" || fail "the stream sent no text"
ok "a stream longer than the deadlines is not cut"
# a kept-alive connection may wait longer than the header deadline between
# requests (--timeout bounds that wait); its next request then has its own
cat >"$TMPD/keep.py" <<'EOF'
import socket, sys, time
s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))
for k in range(2):
    if k: time.sleep(float(sys.argv[2]) + 1.5)
    s.sendall(b'GET /health HTTP/1.1\r\nHost: x\r\n\r\n')
    got = b''
    while b'"status":"ok"' not in got:
        d = s.recv(4096)
        if not d: sys.exit('request %d: closed after %r' % (k + 1, got))
        got += d
    assert got.startswith(b'HTTP/1.1 200'), got
EOF
python3 "$TMPD/keep.py" "$PORT" $HT || fail "a kept-alive connection idle past the header deadline"
ok "a kept-alive connection idle for $((HT + 1)).5 s serves its next request"
s=$(req GET /health); expect_status 200 "$s" "/health afterwards"
stop_server "$PID" "$LOG"
echo "all slow-client checks passed"
