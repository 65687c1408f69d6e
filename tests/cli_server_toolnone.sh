#!/bin/sh
# tool_choice "none" through the real HTTP path: the tool-call marker is
# banned, so the model cannot open a call even when everything pushes it
# to. The model is qwen3-tiny under a vocabulary whose <tool_call> is one
# token (written here: the 256 byte tokens and five added ones) and the
# tool-rendering template; a logit bias of +100 on the marker makes it
# the only likely token. With tool_choice auto the output opens with the
# marker (the control: the bias works); with "none" (OpenAI chat) and
# {"type": "none"} (Anthropic Messages) it never appears, and no call is
# returned.
set -u
. tests/js/server_lib.sh
command -v python3 >/dev/null || fail "python3 is required"

M="$TMPD/qwen3-tiny-tools"
mkdir -p "$M"
for f in config.json model.safetensors; do ln -s "$PWD/tests/fixtures/models/qwen3-tiny/$f" "$M/"; done
cp tests/fixtures/templates/hermes-tools.jinja "$M/chat_template.jinja"
python3 - "$M" <<'EOF' || fail "writing the vocabulary"
import json, sys
d = sys.argv[1]
# byte-level alphabet (GPT-2's byte-to-unicode table): ids 0-255 are the bytes
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": i < 3} for i, s in enumerate(names)]
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": bl, "decoder": bl,
           "post_processor": None,
           "model": {"type": "BPE", "unk_token": None, "byte_fallback": False, "vocab": vocab, "merges": []}},
          open(d + "/tokenizer.json", "w"))
json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}, open(d + "/tokenizer_config.json", "w"))
EOF
MODEL=$M
start_server toolnone

TOOLS='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
ATOOLS='[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]'
BIAS='"logit_bias":{"259":100}'
U='{"role":"user","content":"Weather in Paris?"}'

post() { curl -s --max-time 60 -H 'Content-Type: application/json' "$BASE$1" -d "$2"; }

# the control: with auto the biased marker comes first
r=$(post /v1/chat/completions "{\"messages\":[$U],\"tools\":$TOOLS,\"tool_choice\":\"auto\",\"max_tokens\":4,$BIAS,\"logprobs\":true}")
echo "$r" | grep -q '"token":"<tool_call>"' || fail "tool_choice auto with the marker biased: no <tool_call> token: $r"
ok "tool_choice auto: the biased marker is emitted"

for seed in 1 2 3; do
    r=$(post /v1/chat/completions "{\"messages\":[$U],\"tools\":$TOOLS,\"tool_choice\":\"none\",\"max_tokens\":16,\"temperature\":1,\"seed\":$seed,$BIAS,\"logprobs\":true}")
    echo "$r" | grep -q '"finish_reason":"length"' || fail "tool_choice none: unexpected answer: $r"
    case $r in *'<tool_call>'* | *'"tool_calls"'*) fail "tool_choice none: the model opened a call: $r" ;; esac
done
ok "OpenAI chat tool_choice none: no marker in 3 x 16 biased tokens"

s=$(post /v1/chat/completions "{\"messages\":[$U],\"tools\":$TOOLS,\"tool_choice\":\"none\",\"max_tokens\":16,\"stream\":true,$BIAS}")
echo "$s" | grep -q '\[DONE\]' || fail "tool_choice none, streamed: no end: $s"
case $s in *'<tool_call>'* | *'"tool_calls"'*) fail "tool_choice none, streamed: the model opened a call: $s" ;; esac
ok "OpenAI chat tool_choice none, streamed: no marker"

r=$(post /v1/messages "{\"model\":\"qwen3-tiny-tools\",\"messages\":[$U],\"tools\":$ATOOLS,\"tool_choice\":{\"type\":\"auto\"},\"max_tokens\":4,$BIAS}")
case $r in *'<tool_call>'* | *'"tool_use"'*) ;; *) fail "Anthropic tool_choice auto with the marker biased: no call opened: $r" ;; esac
for seed in 1 2 3; do
    r=$(post /v1/messages "{\"model\":\"qwen3-tiny-tools\",\"messages\":[$U],\"tools\":$ATOOLS,\"tool_choice\":{\"type\":\"none\"},\"max_tokens\":16,\"temperature\":1,\"seed\":$seed,$BIAS}")
    echo "$r" | grep -q '"stop_reason":"max_tokens"' || fail "Anthropic tool_choice none: unexpected answer: $r"
    case $r in *'<tool_call>'* | *'"tool_use"'*) fail "Anthropic tool_choice none: the model opened a call: $r" ;; esac
done
ok "Anthropic tool_choice {type: none}: no marker in 3 x 16 biased tokens"

stop_server "$PID" "$LOG"
echo "all tool_choice none checks passed"
