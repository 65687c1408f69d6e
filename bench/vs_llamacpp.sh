#!/bin/sh
# bench/vs_llamacpp.sh: loom and llama.cpp side by side on the CPU, on the
# same random Qwen3-0.6B-shaped weights, in the same run.
#
#   bench/vs_llamacpp.sh
#   VS_FORMATS="bf16 q8_0" VS_ROUNDS=5 bench/vs_llamacpp.sh
#
# 1. Models (once, under $VS_DIR, default /tmp/loom-vs-llamacpp/qwen3-0.6b-seed1): from
#    one seed, gen_model writes the bf16 and f16 safetensors models (loom) and
#    the bf16, f16, q8_0 and q4_0 GGUF files (llama.cpp); `loom convert
#    --bits 8|4` turns the bf16 model into loom's MLX-format 8- and 4-bit
#    models. Every value comes from the same (seed, tensor, index) function;
#    the quantized formats start from the bf16 values.
# 2. Validation, before timing: `gen_model --check` reads every tensor of each
#    GGUF file back and compares it element by element with the safetensors
#    model (equal for bf16/f16; within the quantization step for q8_0/q4_0).
#    bench_model validates loom on each model before it times it (batched vs
#    token-by-token logits). A failure stops the script (exit 1).
# 3. Timing, alternating: for each of $VS_ROUNDS rounds and each format, loom
#    (bench_model --json, once per mode in $VS_MODES: "exact" is the default
#    f32-activation path, "fast" is --fast, activations rounded to bf16 or
#    8 bits as llama.cpp does) and llama-bench (-o jsonl) with the same threads,
#    prompt and generation lengths, each $VS_REPS repetitions after its own
#    warm-up; odd rounds run loom first, even rounds llama.cpp first, so a
#    drift in machine load does not favour one side.
# 4. Table of medians over every repetition of every round (and a second
#    table of the best repetition, which on a shared machine is the nearest
#    to what each program does alone): pp and tg
#    tokens/s for both, the ratio loom / llama.cpp, and the decode bound:
#    the best read bandwidth bench_model measured in this run divided by the
#    bytes a decode step reads (loom's weights as stored plus its KV; the
#    GGUF formats store the same bits per weight: 16, 16, 8.5, 4.5).
#
# 5. Batched decode (VS_BATCHED=1): for each format in $VS_BATCH_FORMATS,
#    llama-batched-bench (-npp 128 -ntg 64 -npl $VS_BATCH_SEQS) against
#    bench_engine --decode-only with the same protocol (each sequence its own
#    128-token prompt, 64 generated tokens, aggregate decode tokens/s),
#    alternating.
#
# llama.cpp is found in $LLAMA_CPP_DIR (default /tmp/llama.cpp/build/bin,
# needs llama-bench); without it the script prints loom's figures and the
# bound alone. Raw results go to $VS_DIR/runs/<time>/.
#
# Environment: BUILD (default build/bench), VS_DIR, LLAMA_CPP_DIR,
# VS_FORMATS (default "bf16 f16 q8_0 q4_0"), VS_MODES ("exact fast"),
# VS_BATCHED (0), VS_BATCH_FORMATS ("q8_0"), VS_BATCH_SEQS ("1,4,8"; at
# most 32), VS_ROUNDS (3), VS_REPS (2),
# VS_THREADS (all cores), VS_P (512), VS_N (128), VS_SEED (1), VS_PRESET
# (qwen3-0.6b; tiny for a quick check of the script). VS_TABLE=<runs dir>
# prints the table of an earlier (or interrupted) run and times nothing.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/bench}
SEED=${VS_SEED:-1}
PRESET=${VS_PRESET:-qwen3-0.6b}
DIR=${VS_DIR:-/tmp/loom-vs-llamacpp}/$PRESET-seed$SEED
LLAMA=${LLAMA_CPP_DIR:-/tmp/llama.cpp/build/bin}
FORMATS=${VS_FORMATS:-bf16 f16 q8_0 q4_0}
MODES=${VS_MODES:-exact fast}
BATCHED=${VS_BATCHED:-0}
BATCH_FORMATS=${VS_BATCH_FORMATS:-q8_0}
BATCH_SEQS=${VS_BATCH_SEQS:-1,4,8}
BATCH_CTX=$(( $(echo "$BATCH_SEQS" | tr , '\n' | sort -n | tail -n 1) * 256 ))
BATCH_CTX=$(( BATCH_CTX < 2048 ? 2048 : BATCH_CTX ))
ROUNDS=${VS_ROUNDS:-3}
REPS=${VS_REPS:-2}
THREADS=${VS_THREADS:-$(nproc)}
P=${VS_P:-512}
N=${VS_N:-128}

say() { echo "vs_llamacpp: $*" >&2; }
die() { say "$*"; exit 1; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

make -s BUILD="$BUILD" "$BUILD/bench/bench_model" "$BUILD/bench/bench_engine" "$BUILD/tools/gen_model" >&2
# The CLI is only needed for `loom convert`; an older binary will do.
make -s BUILD="$BUILD" "$BUILD/loom" >&2 || [ -x "$BUILD/loom" ] || say "cannot build $BUILD/loom"
GEN=$BUILD/tools/gen_model
HAVE_LLAMA=0
if [ -x "$LLAMA/llama-bench" ]; then HAVE_LLAMA=1; else
    say "no llama-bench in $LLAMA (set LLAMA_CPP_DIR): loom's figures and the bound only"
fi
HAVE_CONVERT=0
if "$BUILD/loom" convert --help >/dev/null 2>&1; then HAVE_CONVERT=1; fi

if [ -z "${VS_TABLE:-}" ]; then
# ---- 1. models --------------------------------------------------------------
for f in $FORMATS; do
    case $f in bf16|f16|q8_0|q4_0) ;; *) die "unknown format $f (expected bf16, f16, q8_0 or q4_0)" ;; esac
done
mkdir -p "$DIR"
st() { # loom's model directory for a format ("" if loom cannot run it)
    case $1 in
    bf16|f16) echo "$DIR/st-$1" ;;
    q8_0|q4_0)
        m=$DIR/st-q$(echo "$1" | cut -c2)
        if [ $HAVE_CONVERT = 1 ] || [ -f "$m/config.json" ]; then echo "$m"; else echo ""; fi ;;
    esac
}
src() { # the safetensors model a format's values come from
    case $1 in f16) echo "$DIR/st-f16" ;; *) echo "$DIR/st-bf16" ;; esac
}
gen_st() {
    [ -f "$DIR/st-$1/model.safetensors" ] ||
        "$GEN" --preset "$PRESET" --dtype "$1" --seed "$SEED" --out "$DIR/st-$1"
}
gen_st bf16
for f in $FORMATS; do
    s=$(src "$f")
    [ "$s" = "$DIR/st-f16" ] && gen_st f16
    [ -f "$DIR/gguf-$f/model.gguf" ] ||
        "$GEN" --preset "$PRESET" --format gguf --dtype "$f" --seed "$SEED" --out "$DIR/gguf-$f"
    m=$(st "$f")
    case $f in q8_0|q4_0)
        if [ -n "$m" ] && [ ! -f "$m/config.json" ]; then
            rm -rf "$m"
            bits=$(echo "$f" | cut -c2)
            "$BUILD/loom" convert --model "$DIR/st-bf16" --bits "$bits" --out "$m" >&2 ||
                die "loom convert --bits $bits failed"
        fi
    esac
done

# ---- 2. validation ----------------------------------------------------------
for f in $FORMATS; do
    "$GEN" --check "$DIR/gguf-$f/model.gguf" --against "$(src "$f")" ||
        die "gguf-$f does not hold the values of $(src "$f"): not timing anything"
done

# ---- 3. timing --------------------------------------------------------------
OUT=$DIR/runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
say "load average at start: $(load); raw results in $OUT"
fast_flag() { [ "$1" = fast ] && echo --fast || true; }
run_loom() { # format round
    m=$(st "$1")
    [ -n "$m" ] || return 0
    for mode in $MODES; do
        say "round $2 $1: loom $mode ($m), load $(load)"
        # shellcheck disable=SC2046
        "$BUILD/bench/bench_model" --model "$m" -p "$P" -n "$N" --reps "$REPS" \
            --threads "$THREADS" --json $(fast_flag $mode) >"$OUT/loom-$1-$mode-$2.json" \
            2>>"$OUT/loom.log" || die "bench_model $mode failed on $m (see $OUT/loom.log)"
    done
}
run_loom_batched() { # format round
    m=$(st "$1")
    [ -n "$m" ] || return 0
    for mode in $MODES; do
        say "round $2 $1: loom batched $mode ($m), load $(load)"
        # shellcheck disable=SC2046
        "$BUILD/bench/bench_engine" --model "$m" --decode-only --prompt 128 --gen 64 --seqs "$BATCH_SEQS" \
            --reps "$REPS" --threads "$THREADS" --json $(fast_flag $mode) \
            >"$OUT/loomb-$1-$mode-$2.json" 2>>"$OUT/loom.log" ||
            die "bench_engine $mode failed on $m (see $OUT/loom.log)"
    done
}
run_llama_batched() {
    [ $HAVE_LLAMA = 1 ] && [ -x "$LLAMA/llama-batched-bench" ] || return 0
    say "round $2 $1: llama-batched-bench (gguf-$1), load $(load)"
    k=1
    while [ $k -le "$REPS" ]; do
        # each sequence gets c / (most sequences) positions of the context
        "$LLAMA/llama-batched-bench" -m "$DIR/gguf-$1/model.gguf" -c "$BATCH_CTX" -b 2048 -ub 512 \
            -npp 128 -ntg 64 -npl "$BATCH_SEQS" -t "$THREADS" --output-format jsonl \
            >>"$OUT/llamab-$1-$2.jsonl" 2>>"$OUT/llama.log" ||
            die "llama-batched-bench failed on gguf-$1 (see $OUT/llama.log)"
        k=$((k + 1))
    done
}
# The read bandwidth just before and after llama-bench, as bench_model
# measures it around its own decode reps.
probe_bw() {
    "$BUILD/bench/bench_model" --bandwidth --threads "$THREADS" >>"$1" 2>>"$OUT/loom.log" ||
        die "bench_model --bandwidth failed (see $OUT/loom.log)"
}
run_llama() {
    [ $HAVE_LLAMA = 1 ] || return 0
    say "round $2 $1: llama.cpp (gguf-$1), load $(load)"
    probe_bw "$OUT/bw-llama-$1-$2.json"
    "$LLAMA/llama-bench" -m "$DIR/gguf-$1/model.gguf" -p "$P" -n "$N" -t "$THREADS" \
        -r "$REPS" -o jsonl >"$OUT/llama-$1-$2.jsonl" 2>>"$OUT/llama.log" ||
        die "llama-bench failed on gguf-$1 (see $OUT/llama.log)"
    probe_bw "$OUT/bw-llama-$1-$2.json"
}
r=1
while [ $r -le "$ROUNDS" ]; do
    for f in $FORMATS; do
        if [ $((r % 2)) = 1 ]; then run_loom "$f" $r; run_llama "$f" $r
        else run_llama "$f" $r; run_loom "$f" $r; fi
    done
    r=$((r + 1))
done
if [ "$BATCHED" = 1 ]; then
    r=1
    while [ $r -le "$ROUNDS" ]; do
        for f in $BATCH_FORMATS; do
            if [ $((r % 2)) = 1 ]; then run_loom_batched "$f" $r; run_llama_batched "$f" $r
            else run_llama_batched "$f" $r; run_loom_batched "$f" $r; fi
        done
        r=$((r + 1))
    done
fi
say "load average at end: $(load)"
else
    OUT=$VS_TABLE
    [ -d "$OUT" ] || die "VS_TABLE: no directory $OUT"
    HAVE_LLAMA=1
    ROUNDS=$(ls "$OUT" | sed -n 's/^loom-.*-\([0-9]*\)\.json$/\1/p' | sort -n | tail -1)
    ls "$OUT"/loomb-* >/dev/null 2>&1 && BATCHED=1
fi

# ---- 4. table ---------------------------------------------------------------
# field KEY FILE...: the values of "KEY" (a number or an array of numbers) in
# one-line JSON objects, one per line.
field() {
    k=$1; shift
    cat "$@" 2>/dev/null | sed -n "s/.*\"$k\": *\(\[[^]]*\]\|[^,}]*\).*/\1/p" |
        tr -d '[] "' | tr ',' '\n' | sed '/^$/d'
}
# llama-bench writes one object per test: pp has n_gen 0, tg n_prompt 0.
llama_samples() { # pp|tg FILES...
    t=$1; shift
    if [ "$t" = pp ]; then pat='"n_gen": 0,'; else pat='"n_prompt": 0,'; fi
    cat "$@" 2>/dev/null | grep -F "$pat" | field samples_ts /dev/stdin
}
best() { sort -g | awk '{v = $1} END { if (NR == 0) print "-"; else printf "%.1f\n", v }'; }
median() { sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) print "-"; else if (NR % 2) printf "%.1f\n", v[(NR + 1) / 2];
    else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-";
    else printf "%.2f\n", a / b }'; }

BW=$(field bandwidth_gbs "$OUT"/loom-*.json | sort -g | tail -1)
[ -n "$BW" ] || BW=-
echo
echo "loom vs llama.cpp, random $PRESET-shaped model (seed $SEED), $THREADS threads, pp$P / tg$N,"
echo "medians of $ROUNDS rounds x $REPS reps (alternating), tokens/s; ratio = loom / llama.cpp"
echo "read bandwidth (best measured by bench_model in this run): $BW GB/s; load average now: $(load)"
if [ $HAVE_LLAMA = 1 ]; then
    echo "llama.cpp: $(field build_commit "$OUT"/llama-*.jsonl | head -1) build $(field build_number "$OUT"/llama-*.jsonl | head -1), $LLAMA"
fi
echo
table() { # median|best mode
stat=$1
mode=$2
echo "loom $mode:"
echo
printf '| %-6s | %8s | %9s | %5s | %8s | %9s | %5s | %8s | %8s |\n' format "loom pp" "llama pp" ratio \
    "loom tg" "llama tg" ratio "MB/tok" "tg bound"
printf '| %-6s | %8s | %9s | %5s | %8s | %9s | %5s | %8s | %8s |\n' ------ -------- --------- ----- \
    -------- --------- ----- -------- --------
for f in $FORMATS; do
    lf=$(ls "$OUT"/loom-"$f"-"$mode"-*.json 2>/dev/null || true)
    gf=$(ls "$OUT"/llama-"$f"-*.jsonl 2>/dev/null || true)
    lpp=$(field pp_reps $lf | $stat); ltg=$(field tg_reps $lf | $stat)
    gpp=$(llama_samples pp $gf | $stat); gtg=$(llama_samples tg $gf | $stat)
    w=$(field weight_bytes_per_token $lf | head -1); kv=$(field kv_bytes_per_token $lf | head -1)
    mb=$(awk -v w="${w:-0}" -v k="${kv:-0}" 'BEGIN { if (w + k > 0) printf "%.1f\n", (w + k) / 1e6; else print "-" }')
    bound=$(awk -v bw="$BW" -v w="${w:-0}" -v k="${kv:-0}" 'BEGIN {
        if (bw == "-" || w + k == 0) print "-"; else printf "%.1f\n", bw * 1e9 / (w + k) }')
    printf '| %-6s | %8s | %9s | %5s | %8s | %9s | %5s | %8s | %8s |\n' "$f" "$lpp" "$gpp" \
        "$(ratio "$lpp" "$gpp")" "$ltg" "$gtg" "$(ratio "$ltg" "$gtg")" "$mb" "$bound"
done
}
# share loom|llama FORMAT MODE: decode as a share of the bound from the
# bandwidth measured around each round's own decode runs (the mean of the
# probes just before and after), median over rounds, in percent.
share() {
    r=1
    while [ $r -le "$ROUNDS" ]; do
        lf=$OUT/loom-$2-$3-$r.json
        if [ -f "$lf" ]; then
            if [ "$1" = loom ]; then
                tg=$(field tg_reps "$lf" | median)
                bw=$(field bandwidth_gbs_at_tg "$lf"; field bandwidth_gbs_after_tg "$lf")
            else
                tg=$(llama_samples tg "$OUT/llama-$2-$r.jsonl" | median)
                bw=$(field bandwidth_gbs "$OUT/bw-llama-$2-$r.json")
            fi
            echo "$bw" | awk -v tg="$tg" -v w="$(field weight_bytes_per_token "$lf")" \
                -v k="$(field kv_bytes_per_token "$lf")" '$1 > 0 { s += $1; n++ } END {
                if (n && tg != "-") printf "%.1f\n", 100 * tg * (w + k) / (s / n * 1e9) }'
        fi
        r=$((r + 1))
    done | median
}
for mode in $MODES; do table median "$mode"; echo; done
echo "decode as % of the bound from the bandwidth measured just before and after each decode"
echo "run (medians over rounds; the machine's bandwidth left over moves within minutes):"
echo
printf '| %-6s | %-5s | %7s | %8s |\n' format mode "loom %" "llama %"
printf '| %-6s | %-5s | %7s | %8s |\n' ------ ----- ------: -------:
for mode in $MODES; do
    for f in $FORMATS; do
        printf '| %-6s | %-5s | %7s | %8s |\n' "$f" "$mode" "$(share loom "$f" "$mode")" \
            "$(share llama "$f" "$mode")"
    done
done
echo
echo "best repetition of each (what each program reaches when the machine leaves it alone):"
echo
for mode in $MODES; do table best "$mode"; echo; done
echo "loom: bf16/f16 safetensors; q8_0/q4_0 rows run loom's MLX affine 8-/4-bit models (group 64,"
echo "from \`loom convert\` of the bf16 model) against llama.cpp's Q8_0/Q4_0 (group 32) of the same values."
echo "tg bound = bandwidth / (loom's weight bytes as stored + its average KV bytes per decode step)."

# ---- 5. batched decode table ---------------------------------------------------
if [ "$BATCHED" = 1 ]; then
    loomb_samples() { # seqs FILES...
        k=$1; shift
        cat "$@" 2>/dev/null | grep -o "{\"seqs\": $k, [^}]*}" | field reps /dev/stdin
    }
    llamab_samples() { # seqs FILES...
        k=$1; shift
        cat "$@" 2>/dev/null | grep -F "\"pl\": $k," | field speed_tg /dev/stdin
    }
    echo
    echo "batched decode: each sequence its own 128-token prompt, 64 new tokens; aggregate decode"
    echo "tokens/s, medians over $ROUNDS rounds x $REPS reps (bench_engine --decode-only vs llama-batched-bench)"
    echo
    printf '| %-6s | %-5s | %4s | %9s | %9s | %5s |\n' format mode seqs "loom" "llama.cpp" ratio
    printf '| %-6s | %-5s | %4s | %9s | %9s | %5s |\n' ------ ----- ---: --------: --------: ----:
    for f in $BATCH_FORMATS; do
        gf=$(ls "$OUT"/llamab-"$f"-*.jsonl 2>/dev/null || true)
        for mode in $MODES; do
            lf=$(ls "$OUT"/loomb-"$f"-"$mode"-*.json 2>/dev/null || true)
            for k in $(echo "$BATCH_SEQS" | tr , ' '); do
                l=$(loomb_samples $k $lf | median); g=$(llamab_samples $k $gf | median)
                printf '| %-6s | %-5s | %4s | %9s | %9s | %5s |\n' "$f" "$mode" $k "$l" "$g" "$(ratio "$l" "$g")"
            done
        done
    done
fi
