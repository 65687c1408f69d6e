#!/bin/sh
# loom batch: results in input order, per-line errors that do not stop the
# others, a completion equal to the greedy CLI run, split error file.
set -eu
LOOM="${LOOM_BUILD:-build}/loom"
MODEL=models/pycoder-16m
dir=$(mktemp -d /tmp/loom-batch-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/in.jsonl" <<'JSONL'
{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "return_token_ids": true}}
{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}}
not json

{"custom_id": "d", "method": "POST", "url": "/v1/audio/speech", "body": {}}
{"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "temperature": 9}}
{"custom_id": "f", "method": "POST", "url": "/v1/completions", "body": {"prompt": "def f():", "max_tokens": 3, "stream": true}}
{"custom_id": "g", "method": "POST", "url": "/v1/embeddings", "body": {"input": ["def f():", "x"], "dimensions": 3}}
JSONL
"$LOOM" batch --model "$MODEL" --input "$dir/in.jsonl" --output "$dir/out.jsonl" 2>"$dir/log"
test "$(wc -l <"$dir/out.jsonl")" -eq 7
sed -n 1p "$dir/out.jsonl" | grep -q '"custom_id":"a","response":{"status_code":200'
want=$("$LOOM" generate --model "$MODEL" --tokens 1,2,3 --max-tokens 4 --temperature 0 --ids --ignore-eos 2>/dev/null | tail -n 1 | tr -d ' []')
sed -n 1p "$dir/out.jsonl" | grep -q "\"token_ids\":\[$want\]"
sed -n 2p "$dir/out.jsonl" | grep -q '"custom_id":"b","response":{"status_code":200'
sed -n 3p "$dir/out.jsonl" | grep -q '"code":"invalid_json"'
sed -n 4p "$dir/out.jsonl" | grep -q '"custom_id":"d".*"code":"invalid_url"'
sed -n 5p "$dir/out.jsonl" | grep -q '"status_code":400.*"param":"temperature"'
sed -n 6p "$dir/out.jsonl" | grep -q '"status_code":400.*"param":"stream"'
sed -n 7p "$dir/out.jsonl" | grep -q '"custom_id":"g","response":{"status_code":200'
sed -n 7p "$dir/out.jsonl" | grep -qE '"index":1,"embedding":\[[-0-9.e]+,[-0-9.e]+,[-0-9.e]+\]'
grep -q "7 requests, 4 failed" "$dir/log"
# failures split into their own file
"$LOOM" batch --model "$MODEL" --input "$dir/in.jsonl" --output "$dir/ok.jsonl" --errors "$dir/err.jsonl" 2>/dev/null
test "$(wc -l <"$dir/ok.jsonl")" -eq 3
test "$(wc -l <"$dir/err.jsonl")" -eq 4
# --prefill-chunk: a prompt prefilled 2 tokens at a time gives the same tokens
"$LOOM" batch --model "$MODEL" --prefill-chunk 2 --input "$dir/in.jsonl" --output "$dir/chunk.jsonl" 2>/dev/null
sed -n 1p "$dir/chunk.jsonl" | grep -q "\"token_ids\":\[$want\]"
if "$LOOM" batch --model "$MODEL" --prefill-chunk 0 --input "$dir/in.jsonl" --output "$dir/x" 2>/dev/null; then exit 1; fi
# a model directory without a tokenizer: token-id prompts run and answer
# with token ids and empty text (embeddings of token ids too); text, chat
# and stop strings are errors
mkdir "$dir/notok"
cp "$MODEL/config.json" "$MODEL/generation_config.json" "$dir/notok/"
ln -s "$(cd "$MODEL" && pwd -P)/model.safetensors" "$dir/notok/model.safetensors"
cat >"$dir/notok.jsonl" <<'JSONL'
{"custom_id": "ids", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}}
{"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": {"prompt": "def f():", "max_tokens": 4}}
{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}
{"custom_id": "stop", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "stop": ["x"]}}
{"custom_id": "lp", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 2, "echo": true, "n": 2}}
{"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {"input": [[1, 2, 3], [4]]}}
JSONL
"$LOOM" batch --model "$dir/notok" --input "$dir/notok.jsonl" --output "$dir/notok.out" 2>"$dir/log"
grep -q "has no tokenizer.json" "$dir/log"
grep -q "6 requests, 3 failed" "$dir/log"
sed -n 1p "$dir/notok.out" | grep -q '"custom_id":"ids","response":{"status_code":200'
sed -n 1p "$dir/notok.out" | grep -q '"text":"",'
sed -n 1p "$dir/notok.out" | grep -q '"prompt_token_ids":\[1,2,3\]'
sed -n 1p "$dir/notok.out" | grep -q "\"token_ids\":\[$want\]"
for i in 2 3; do
  sed -n ${i}p "$dir/notok.out" | grep -q '"status_code":400.*no tokenizer (tokenizer.json); send token ids'
done
sed -n 4p "$dir/notok.out" | grep -q '"status_code":400.*"param":"stop"'
sed -n 5p "$dir/notok.out" | grep -q '"custom_id":"lp","response":{"status_code":200.*"index":1'
sed -n 6p "$dir/notok.out" | grep -q '"custom_id":"emb","response":{"status_code":200.*"index":1,"embedding":\['
# usage errors
if "$LOOM" batch --model "$MODEL" 2>/dev/null; then exit 1; fi
if "$LOOM" batch --model "$MODEL" --input /nonexistent --output "$dir/x" 2>/dev/null; then exit 1; fi
echo ok
