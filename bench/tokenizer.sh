#!/bin/sh
# bench/tokenizer.sh: loom's tokenizer encode against Hugging Face
# `tokenizers` (Rust, as the Node addon pinned in bench/tokenizer_peer/),
# single thread, on the same tokenizer.json files and the same texts.
#
# 1. Texts, under $BUILD/bench-tokenizer/: licences.txt (every regular file
#    of /usr/share/common-licenses, concatenated in name order) and
#    python.txt (the Python standard library's top-level .py files, in name
#    order, until TOKB_PY_BYTES bytes, default 1000000).
# 2. Validation, before timing: for each tokenizer, bench_tokenizer checks
#    decode(encode(text)) == text and writes its ids; the peer encodes the
#    same texts and must produce exactly those ids. The first difference is
#    printed and nothing is timed (exit 1).
# 3. TOKB_ROUNDS rounds (default 5); in each, for each tokenizer, one
#    bench_tokenizer process and one peer process, each loading the
#    tokenizer TOKB_LOAD_REPS times (default 3) and encoding each text once
#    untimed then TOKB_REPS times (default 3). Odd rounds run loom first,
#    even rounds the peer first.
# 4. Table: MB/s (10^6 bytes of UTF-8 text per second) from the median
#    time over every repetition of every round; ratio = loom / peer (above 1
#    when loom is faster). Then the load time of each tokenizer.json, median
#    of every load, ratio = peer ms / loom ms.
#
#   bench/tokenizer.sh [TOKENIZER_NAME...]   (default: qwen3 llama3_1)
# BUILD (default build) may be set. Needs node (v18+); the peer is installed
# with `npm ci` on first use (needs the npm registry once).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${TOKB_ROUNDS:-5}
REPS=${TOKB_REPS:-3}
LOAD_REPS=${TOKB_LOAD_REPS:-3}
PY_BYTES=${TOKB_PY_BYTES:-1000000}
NAMES=${*:-qwen3 llama3_1}
PEER=bench/tokenizer_peer
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

make -s BUILD="$BUILD" "$BUILD/bench/bench_tokenizer" >&2
want=$(sed -n 's/.*"tokenizers": *"\([0-9][^"]*\)".*/\1/p' $PEER/package.json)
have=$(sed -n 's/^  "version": *"\([^"]*\)".*/\1/p' $PEER/node_modules/tokenizers/package.json 2>/dev/null || true)
if [ "$want" != "$have" ]; then
    echo "installing the peer: npm ci --prefix $PEER" >&2
    npm ci --prefix $PEER --no-audit --no-fund --loglevel=error >&2
fi

dir=$BUILD/bench-tokenizer
mkdir -p "$dir/ids"
texts="$dir/licences.txt $dir/python.txt"
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | while read -r f; do cat "$f"; done \
    >"$dir/licences.txt"
: >"$dir/python.txt"
for f in $(ls /usr/lib/python3*/*.py 2>/dev/null | LC_ALL=C sort); do
    [ "$(wc -c <"$dir/python.txt")" -lt "$PY_BYTES" ] || break
    iconv -f UTF-8 -t UTF-8 "$f" >/dev/null 2>&1 && cat "$f" >>"$dir/python.txt"
done
for t in $texts; do
    [ -s "$t" ] || { echo "tokenizer.sh: $t is empty (no such files on this machine)" >&2; exit 1; }
done

for n in $NAMES; do
    gz=tests/fixtures/tokenizers/$n/tokenizer.json.gz
    [ -f "$gz" ] || { echo "tokenizer.sh: no $gz" >&2; exit 1; }
    mkdir -p "$BUILD/fixtures/tokenizers/$n"
    [ -s "$BUILD/fixtures/tokenizers/$n/tokenizer.json" ] ||
        gzip -dc "$gz" >"$BUILD/fixtures/tokenizers/$n/tokenizer.json"
done
json() { echo "$BUILD/fixtures/tokenizers/$1/tokenizer.json"; }

# --- validation -----------------------------------------------------------
for n in $NAMES; do
    rm -f "$dir"/ids/*.ids
    "$BUILD/bench/bench_tokenizer" "$(json "$n")" --ids-out "$dir/ids" $texts >/dev/null
    if ! node $PEER/encode.mjs "$(json "$n")" --check-ids "$dir/ids" $texts >/dev/null; then
        echo "tokenizer.sh: $n: loom and the peer disagree (above); nothing timed" >&2
        exit 1
    fi
    echo "validated $n: identical ids on $(for t in $texts; do printf '%s ' "$(basename "$t")"; done)" >&2
done

# --- timing ---------------------------------------------------------------
raw=$dir/raw
rm -rf "$raw"
mkdir -p "$raw"
run_loom() { "$BUILD/bench/bench_tokenizer" "$(json "$1")" --reps "$REPS" --load-reps "$LOAD_REPS" $texts >>"$raw/loom.$1"; }
run_peer() { node $PEER/encode.mjs "$(json "$1")" --reps "$REPS" --load-reps "$LOAD_REPS" $texts >>"$raw/peer.$1"; }
r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "round $r/$ROUNDS (load average $(cut -d' ' -f1 /proc/loadavg))" >&2
    for n in $NAMES; do
        if [ $((r % 2)) = 1 ]; then run_loom "$n"; run_peer "$n"; else run_peer "$n"; run_loom "$n"; fi
    done
    r=$((r + 1))
done

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
enc_sec() { awk -v f="$2" '$1 == "enc" && $2 == f { print $5 }' "$1" | median; }
load_ms() { awk '$1 == "load" { print $2 }' "$1" | median; }

peer=$(sed -n 's/^peer //p' "$raw/peer.$(echo $NAMES | cut -d' ' -f1)" | head -n 1)
echo
echo "loom bench_tokenizer vs Hugging Face $peer (npm; Rust as a native Node $(node --version) addon), single thread"
echo "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); load average now $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ROUNDS rounds x $REPS encodes, alternating; median; MB = 10^6 bytes of text"
echo
printf '| %-9s | %-12s | %9s | %8s | %9s | %9s | %6s |\n' tokenizer text bytes ids "loom MB/s" "peer MB/s" ratio
echo '| --- | --- | ---: | ---: | ---: | ---: | ---: |'
for n in $NAMES; do
    for t in $texts; do
        b=$(basename "$t")
        bytes=$(wc -c <"$t")
        ids=$(awk -v f="$b" '$1 == "enc" && $2 == f { print $4; exit }' "$raw/loom.$n")
        ls=$(enc_sec "$raw/loom.$n" "$b")
        ps=$(enc_sec "$raw/peer.$n" "$b")
        awk -v n="$n" -v b="$b" -v by="$bytes" -v ids="$ids" -v ls="$ls" -v ps="$ps" 'BEGIN {
            printf "| %-9s | %-12s | %9d | %8d | %9.2f | %9.2f | %5.2fx |\n", n, b, by, ids, by / 1e6 / ls, by / 1e6 / ps, ps / ls }'
    done
done
echo
printf '| %-9s | %12s | %12s | %6s |\n' tokenizer "loom load ms" "peer load ms" ratio
echo '| --- | ---: | ---: | ---: |'
for n in $NAMES; do
    awk -v n="$n" -v l="$(load_ms "$raw/loom.$n")" -v p="$(load_ms "$raw/peer.$n")" 'BEGIN {
        printf "| %-9s | %12.1f | %12.1f | %5.2fx |\n", n, l, p, p / l }'
done
echo
echo "raw lines: $raw/"
