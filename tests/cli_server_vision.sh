#!/bin/sh
# loom serve with images: the Qwen3-VL fixture made servable (a tokenizer
# and a Qwen-VL chat template, tests/js/vl_model.mjs) answers the official
# OpenAI Node client's image_url parts (tests/js/vision.test.mjs) with the
# tokens `loom generate --image` gives; file:// URLs only under
# --allowed-media-dir; loom chat's /image replies as the server does; a
# text model refuses an image naming itself. Needs
# node and `npm ci --prefix tests/js` (scripts/install-deps.sh runs it).
set -u
. tests/js/server_lib.sh

command -v node >/dev/null || fail "node is not installed (scripts/install-deps.sh installs it)"
[ -f tests/js/node_modules/openai/package.json ] ||
    fail "the openai package is missing: run 'npm ci --prefix tests/js' (scripts/install-deps.sh does)"

VL="$TMPD/qwen3-vl"
node tests/js/vl_model.mjs tests/fixtures/models/qwen3-vl-tiny "$VL" || fail "cannot make $VL"
MEDIA="$TMPD/media"
mkdir -p "$MEDIA"
cp tests/fixtures/models/qwen3-vl-tiny/images/*.png tests/fixtures/models/qwen3-vl-tiny/images/*.jpg "$MEDIA/"
cp "$MEDIA/D_300x200_rgb.png" "$TMPD/secret.png"
ln -s "$TMPD/secret.png" "$MEDIA/escape.png"

TEXT_MODEL=$MODEL
MODEL=$VL
start_server vl --allowed-media-dir "$MEDIA"
LOOM_URL=$BASE LOOM_BIN=$LOOM_BIN LOOM_VL_MODEL=$VL LOOM_MEDIA=$MEDIA node tests/js/vision.test.mjs ||
    fail "OpenAI client vision tests"
s=$(req GET /health); expect_status 200 "$s" "/health after the vision tests"
# loom chat's /image: the reply the server gives the same message (image, then text)
printf '/image %s\nwhat is it?\n' "$MEDIA/D_300x200_rgb.png" |
    "$LOOM_BIN" chat --model "$VL" --temperature 0 --repeat-penalty 1 --max-tokens 8 --threads 2 \
        >"$TMPD/chat.out" 2>"$TMPD/chat.err" || fail "loom chat with /image: $(cat "$TMPD/chat.err")"
node -e '
const fs = require("fs");
const img = fs.readFileSync(process.argv[1]).toString("base64");
fs.writeFileSync(process.argv[2], JSON.stringify({ max_tokens: 8, temperature: 0, messages: [{ role: "user",
  content: [{ type: "image_url", image_url: { url: `data:image/png;base64,${img}` } },
            { type: "text", text: "what is it?" }] }] }));' "$MEDIA/D_300x200_rgb.png" "$TMPD/chat.json"
s=$(curl -s --max-time 120 -o "$TMPD/body" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$TMPD/chat.json" "$BASE/v1/chat/completions")
expect_status 200 "$s" "the chat message through the server"
node -e '
const fs = require("fs");
const want = JSON.parse(fs.readFileSync(process.argv[1], "utf8")).choices[0].message.content + "\n";
const got = fs.readFileSync(process.argv[2]).toString("utf8");
if (got !== want) { console.log(`loom chat replied ${JSON.stringify(got)}, the server ${JSON.stringify(want)}`); process.exit(1); }
' "$TMPD/body" "$TMPD/chat.out" || fail "loom chat /image differs from the server"
grep -q "12 tokens, goes with the next message" "$TMPD/chat.err" || fail "chat: $(cat "$TMPD/chat.err")"
stop_server "$PID" "$LOG"

MODEL=$TEXT_MODEL
start_server text
s=$(req POST /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}],"max_tokens":2}')
expect_status 400 "$s" "an image for a text model"
body_has "the model 'pycoder-16m' takes no images" "an image for a text model"
stop_server "$PID" "$LOG"
echo "all vision server checks passed"
