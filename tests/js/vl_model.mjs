// Makes a servable model directory from the Qwen3-VL fixture, which has
// weights and an image processor but no tokenizer or chat template:
//   node tests/js/vl_model.mjs SRC_DIR OUT_DIR
// The fixture's files are linked; tokenizer.json is byte-level BPE with
// no merges (ids 0..255 the bytes, 256..499 filler words) and the special
// tokens at the fixture's ids (<|im_start|> 500 ... <|image_pad|> 504);
// chat_template.jinja renders an image part as Qwen-VL's templates do,
// <|vision_start|><|image_pad|><|vision_end|>.
import { mkdirSync, symlinkSync, writeFileSync, existsSync } from 'node:fs';
import { resolve, join } from 'node:path';

const [src, out] = process.argv.slice(2);
if (!src || !out) throw new Error('usage: vl_model.mjs SRC_DIR OUT_DIR');
mkdirSync(out, { recursive: true });
for (const f of ['config.json', 'generation_config.json', 'preprocessor_config.json', 'model.safetensors'])
  if (existsSync(join(src, f)) && !existsSync(join(out, f))) symlinkSync(resolve(src, f), join(out, f));

// GPT-2's byte-to-unicode table
const bs = [];
for (let b = 33; b <= 126; b++) bs.push(b);
for (let b = 161; b <= 172; b++) bs.push(b);
for (let b = 174; b <= 255; b++) bs.push(b);
const cs = bs.slice();
for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
const byteChar = new Array(256);
bs.forEach((b, i) => { byteChar[b] = String.fromCodePoint(cs[i]); });

const vocab = {};
for (let b = 0; b < 256; b++) vocab[byteChar[b]] = b;
for (let i = 256; i < 500; i++) vocab[`\u0120w${i}`] = i;
const specials = ['<|im_start|>', '<|im_end|>', '<|vision_start|>', '<|vision_end|>', '<|image_pad|>',
                  '<|video_pad|>', '<|x506|>', '<|x507|>', '<|x508|>', '<|x509|>', '<|x510|>', '<|x511|>'];
const added = specials.map((content, k) => ({ id: 500 + k, content, single_word: false, lstrip: false,
                                              rstrip: false, normalized: false, special: true }));
specials.forEach((s, k) => { vocab[s] = 500 + k; });
writeFileSync(join(out, 'tokenizer.json'), JSON.stringify({
  version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
           end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges: [] },
}));
writeFileSync(join(out, 'tokenizer_config.json'), JSON.stringify({
  eos_token: '<|im_end|>', pad_token: '<|im_end|>', bos_token: null,
}));
writeFileSync(join(out, 'chat_template.jinja'),
  "{%- for m in messages -%}<|im_start|>{{ m.role }}\n" +
  "{% if m.content is string -%}{{ m.content }}{%- else -%}{%- for p in m.content -%}" +
  "{%- if p.type == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>" +
  "{%- elif p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}" +
  "<|im_end|>\n{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}");
