// loom serve's /v1/embeddings through the official OpenAI client, on the
// bundled pycoder-16m: strings, lists of strings, token ids and lists of
// them, dimensions, float and base64 (the client's default, which it
// decodes itself), and the errors. With no reference vectors for this
// model the checks are of consistency: unit norms, one input alone equals
// the same input among others, text equals its token ids, a cut vector is
// the full one's head normalised again. (tests/test_api.c checks the
// vectors against the transformers fixture.) Run by tests/cli_server_js.sh:
//   LOOM_URL=http://127.0.0.1:PORT LOOM_API_KEY=KEY node embeddings.test.mjs
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { expectError, run, test } from './harness.mjs';

const base = process.env.LOOM_URL;
const key = process.env.LOOM_API_KEY || 'none';
if (!base) throw new Error('LOOM_URL is not set');
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const model = 'pycoder-16m';
const HIDDEN = 384;

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const maxDiff = (a, b) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

// The prompt's token ids as the server tokenizes them.
async function ids(text) {
  const r = await client.completions.create({ model, prompt: text, max_tokens: 1, return_token_ids: true });
  const t = r.choices[0].prompt_token_ids;
  assert.ok(Array.isArray(t) && t.length > 0);
  return t;
}

const texts = ['def fibonacci(n):', 'import numpy as np', 'class Stack:\n    def push(self, x):'];

test('one string: a unit vector of the hidden size, usage counts its tokens', async () => {
  const r = await client.embeddings.create({ model, input: texts[0], encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.model, model);
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[0].embedding.length, HIDDEN);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
  assert.equal(r.usage.prompt_tokens, (await ids(texts[0])).length);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('a list of strings equals each string alone, in order', async () => {
  const all = await client.embeddings.create({ model, input: texts, encoding_format: 'float' });
  assert.deepEqual(all.data.map((d) => d.index), [0, 1, 2]);
  let tokens = 0;
  for (let i = 0; i < texts.length; i++) {
    const one = await client.embeddings.create({ model, input: texts[i], encoding_format: 'float' });
    assert.deepEqual(all.data[i].embedding, one.data[0].embedding, `input ${i}`);
    tokens += one.usage.prompt_tokens;
  }
  assert.equal(all.usage.prompt_tokens, tokens);
  assert.ok(maxDiff(all.data[0].embedding, all.data[1].embedding) > 1e-3, 'different texts, different vectors');
});

test('token ids and lists of them equal the text', async () => {
  const t0 = await ids(texts[0]), t1 = await ids(texts[1]);
  const byText = await client.embeddings.create({ model, input: [texts[0], texts[1]], encoding_format: 'float' });
  const one = await client.embeddings.create({ model, input: t0, encoding_format: 'float' });
  assert.deepEqual(one.data[0].embedding, byText.data[0].embedding);
  const two = await client.embeddings.create({ model, input: [t0, t1], encoding_format: 'float' });
  assert.deepEqual(two.data[1].embedding, byText.data[1].embedding);
  assert.equal(two.usage.prompt_tokens, t0.length + t1.length);
});

test('the client default (base64, decoded by the client) and base64 equal float', async () => {
  const f = await client.embeddings.create({ model, input: texts, encoding_format: 'float' });
  const d = await client.embeddings.create({ model, input: texts });
  const b = await client.embeddings.create({ model, input: texts, encoding_format: 'base64' });
  for (let i = 0; i < texts.length; i++) {
    // floats are written with 9 digits: each reads back as the same float32
    const f32 = f.data[i].embedding.map(Math.fround);
    assert.deepEqual(Array.from(d.data[i].embedding), f32);
    assert.equal(typeof b.data[i].embedding, 'string');
    const buf = Buffer.from(b.data[i].embedding, 'base64');
    assert.equal(buf.length, 4 * HIDDEN);
    const v = Array.from({ length: HIDDEN }, (_, k) => buf.readFloatLE(4 * k));
    assert.deepEqual(v, f32);
  }
});

test('dimensions: the head of the full vector, normalised again', async () => {
  const full = (await client.embeddings.create({ model, input: texts[2], encoding_format: 'float' })).data[0].embedding;
  for (const n of [1, 64, HIDDEN]) {
    const r = await client.embeddings.create({ model, input: texts[2], dimensions: n, encoding_format: 'float' });
    const v = r.data[0].embedding;
    assert.equal(v.length, n);
    assert.ok(Math.abs(norm(v) - 1) < 1e-5);
    const head = full.slice(0, n), s = norm(head);
    assert.ok(maxDiff(v, head.map((x) => x / s)) < 1e-6, `dimensions ${n}`);
  }
  const b = await client.embeddings.create({ model, input: texts[2], dimensions: 64, encoding_format: 'base64' });
  assert.equal(Buffer.from(b.data[0].embedding, 'base64').length, 4 * 64);
});

test('many inputs at once, beside a generation', async () => {
  const inputs = Array.from({ length: 40 }, (_, i) => `def f${i}(x):\n    return x * ${i}`);
  const [r, c] = await Promise.all([
    client.embeddings.create({ model, input: inputs, encoding_format: 'float' }),
    client.completions.create({ model, prompt: 'import os', max_tokens: 8, temperature: 0 }),
  ]);
  assert.equal(r.data.length, 40);
  assert.ok(c.choices[0].text.length >= 0);
  const last = await client.embeddings.create({ model, input: inputs[39], encoding_format: 'float' });
  assert.deepEqual(r.data[39].embedding, last.data[0].embedding);
});

test('errors: empty input, wrong types, dimensions, unknown model, too long', async () => {
  const bad = OpenAI.BadRequestError;
  await expectError(client.embeddings.create({ model, input: '' }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: [] }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: ['a', ''] }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: [[]] }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: ['a', [1, 2]] }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: [1, 'a'] }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: [100000] }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: 5 }), bad, 400, 'input');
  await expectError(client.embeddings.create({ model, input: 'x', dimensions: 0 }), bad, 400, 'dimensions');
  const big = await expectError(client.embeddings.create({ model, input: 'x', dimensions: HIDDEN + 1 }), bad, 400,
                                'dimensions');
  assert.match(big.message, new RegExp(`${HIDDEN + 1}.*${HIDDEN}`));
  await expectError(client.embeddings.create({ model, input: 'x', encoding_format: 'int8' }), bad, 400,
                    'encoding_format');
  const nf = await expectError(client.embeddings.create({ model: 'nope', input: 'x' }), OpenAI.NotFoundError, 404,
                               'model');
  assert.equal(nf.code, 'model_not_found');
  const long = await expectError(client.embeddings.create({ model, input: new Array(5000).fill(5) }), bad, 400,
                                 'input');
  assert.match(long.message, /5000 tokens.*context holds 4096/);
  // user is taken and ignored
  const u = await client.embeddings.create({ model, input: 'x', user: 'someone', encoding_format: 'float' });
  assert.equal(u.data.length, 1);
});

await run();
