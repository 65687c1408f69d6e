// loom serve on the Qwen3-VL fixture through the official OpenAI client:
// chat with image_url parts (data: and file:// URLs), blocking and
// streamed; the reply's tokens equal `loom generate --image` on the
// server's own prompt ids; a repeated image is served from the prefix
// cache; Anthropic image blocks and Responses input_image parts give the
// chat answer; every refused URL or part is a 400 naming the part. Run by
// tests/cli_server_vision.sh:
//   LOOM_URL=... LOOM_BIN=build/loom LOOM_VL_MODEL=DIR LOOM_MEDIA=DIR node vision.test.mjs
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { expectError, run, test } from './harness.mjs';

const { LOOM_URL: base, LOOM_BIN: bin, LOOM_VL_MODEL: modelDir, LOOM_MEDIA: media } = process.env;
if (!base || !bin || !modelDir || !media) throw new Error('LOOM_URL, LOOM_BIN, LOOM_VL_MODEL, LOOM_MEDIA');
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const imgD = `${media}/D_300x200_rgb.png`, imgB = `${media}/B_100x70_noisy_q90.jpg`;
const dataUrl = (f, type) => `data:${type};base64,${readFileSync(f).toString('base64')}`;
const part = (url) => ({ type: 'image_url', image_url: { url } });
const ask = (parts, extra = {}) => client.chat.completions.create({
  messages: [{ role: 'user', content: [{ type: 'text', text: 'what is in it?' }, ...parts] }],
  max_tokens: 8, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra,
});
// The 8 greedy ids of `loom generate --image` on ids.
const generate = (ids, files) => {
  const args = ['generate', '--model', modelDir, '--tokens', ids.join(','), '--max-tokens', '8',
                '--temperature', '0', '--ignore-eos', '--ids', '--threads', '2'];
  for (const f of files) args.push('--image', f);
  const out = execFileSync(bin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return JSON.parse(out.trim().split('\n').pop());
};

// A 400 naming param (when given) whose message holds text.
async function badRequest(promise, param, text) {
  const e = await expectError(promise, OpenAI.BadRequestError, 400, param || undefined);
  assert.ok(e.message.includes(text), `"${e.message}" lacks "${text}"`);
}

let first;
test('a data: URL image: the tokens of loom generate --image on the same ids', async () => {
  const r = await ask([part(dataUrl(imgD, 'image/png'))]);
  const c = r.choices[0];
  assert.equal(c.token_ids.length, 8);
  // one placeholder per image, repeated to the grid's 12 tokens
  assert.equal(c.prompt_token_ids.filter((t) => t === 504).length, 12);
  assert.deepEqual(c.token_ids, generate(c.prompt_token_ids, [imgD]));
  first = r;
});

test('the same image again: a prefix-cache hit, the same tokens', async () => {
  const r = await ask([part(dataUrl(imgD, 'image/png'))]);
  assert.deepEqual(r.choices[0].token_ids, first.choices[0].token_ids);
  assert.ok(r.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(r.usage));
});

test('streamed: the blocking text', async () => {
  const s = await ask([part(dataUrl(imgD, 'image/png'))], { stream: true });
  let text = '';
  for await (const ch of s) text += ch.choices[0]?.delta?.content ?? '';
  assert.equal(text, first.choices[0].message.content);
});

test('a file:// URL under --allowed-media-dir: the data: URL answer', async () => {
  const r = await ask([part(`file://${imgD}`)]);
  assert.deepEqual(r.choices[0].token_ids, first.choices[0].token_ids);
});

test('two images, a JPEG among them: generate with both', async () => {
  const r = await ask([part(dataUrl(imgB, 'image/jpeg')), { type: 'text', text: 'and' },
                       part(dataUrl(imgD, 'image/png'))]);
  const c = r.choices[0];
  assert.deepEqual(c.token_ids, generate(c.prompt_token_ids, [imgB, imgD]));
  assert.notDeepEqual(c.token_ids, first.choices[0].token_ids);
});

test('refused URLs and parts name the part', async () => {
  const p1 = 'messages[0].content[1]';
  await badRequest(ask([part('https://example.com/cat.png')]), p1, 'not fetched');
  await badRequest(ask([part('data:image/png;base64,iVBO!!!!')]), p1, 'bad base64');
  await badRequest(ask([part('data:image/gif;base64,R0lGODlh')]), p1, 'data:image/gif');
  await badRequest(ask([part('file:///etc/hostname')]), p1, 'outside --allowed-media-dir');
  await badRequest(ask([part(`file://${media}/escape.png`)]), p1, 'outside --allowed-media-dir');
  await badRequest(ask([part(`file://${media}/../secret.png`)]), p1, 'outside --allowed-media-dir');
  await badRequest(ask([{ type: 'input_audio', input_audio: {} }]), p1, 'unknown content part type');
  await badRequest(ask([part('data:image/png;base64,iVBORw0KGgo=')]), p1, 'PNG');
  const many = Array.from({ length: 17 }, () => part('data:image/png;base64,AAAA'));
  await badRequest(ask(many), 'messages[0].content[17]', 'too many images');
});

// A PNG whose header claims w x h (no pixel data).
const crc32 = (buf) => {
  let c = ~0;
  for (const b of buf) { c ^= b; for (let k = 0; k < 8; k++) c = c >>> 1 ^ (0xedb88320 & -(c & 1)); }
  return ~c >>> 0;
};
function pngHeader(w, h) {
  const ihdr = Buffer.alloc(17);
  ihdr.write('IHDR', 0);
  ihdr.writeUInt32BE(w, 4);
  ihdr.writeUInt32BE(h, 8);
  ihdr.set([8, 2, 0, 0, 0], 12);
  const len = Buffer.alloc(4), crc = Buffer.alloc(4);
  len.writeUInt32BE(13);
  crc.writeUInt32BE(crc32(ihdr));
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), len, ihdr, crc]);
}

test('a huge image is refused from its header, naming its size', async () => {
  const url = `data:image/png;base64,${pngHeader(20000, 20000).toString('base64')}`;
  await badRequest(ask([part(url)]), 'messages[0].content[1]', '20000');
  // and the server still answers
  const r = await ask([part(dataUrl(imgD, 'image/png'))]);
  assert.deepEqual(r.choices[0].token_ids, first.choices[0].token_ids);
});

test('a placeholder typed into the text: a 400 naming both counts', async () => {
  await badRequest(client.chat.completions.create({
    messages: [{ role: 'user', content: [{ type: 'text', text: 'see <|image_pad|>' },
                                         part(dataUrl(imgD, 'image/png'))] }],
    max_tokens: 2,
  }), 'messages', 'has 2 image placeholders (<|image_pad|>) for 1 images');
});

// The same question through Anthropic's Messages API (an image block) and
// OpenAI's Responses API (an input_image part): the chat answer, over the
// same prompt (its token count says the image was expanded).
test('an image block on /v1/messages and an input_image on /v1/responses: the chat answer', async () => {
  const png = readFileSync(imgD).toString('base64');
  const chat = await client.chat.completions.create({
    messages: [{ role: 'user', content: [{ type: 'text', text: 'what is in it?' }, part(dataUrl(imgD, 'image/png'))] }],
    max_tokens: 8, temperature: 0,
  });
  const anthropic = new Anthropic({ baseURL: base, apiKey: 'none', maxRetries: 0, timeout: 120000 });
  const m = await anthropic.messages.create({
    model: chat.model, max_tokens: 8, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'what is in it?' },
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }] }],
  });
  assert.equal(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0), chat.usage.prompt_tokens);
  assert.equal(m.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), chat.choices[0].message.content);
  const r = await client.responses.create({
    max_output_tokens: 8, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'what is in it?' },
      { type: 'input_image', image_url: dataUrl(imgD, 'image/png') }] }],
  });
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.output_text, chat.choices[0].message.content);
});

await run();
