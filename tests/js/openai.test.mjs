// loom serve through the official OpenAI client: chat and completions,
// blocking and streamed, logprobs, stop strings, n, seeds, tools, and the
// error classes the client maps statuses to. Run by tests/cli_server_js.sh:
//   LOOM_URL=http://127.0.0.1:PORT LOOM_API_KEY=KEY [LOOM_BUSY_URL=...] node openai.test.mjs
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { expectError, run, test } from './harness.mjs';

const base = process.env.LOOM_URL;
const key = process.env.LOOM_API_KEY || 'none';
if (!base) throw new Error('LOOM_URL is not set');
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const model = 'pycoder-16m';
const user = (content) => [{ role: 'user', content }];

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

// Concatenated text of choice i in chat chunks.
const chatText = (chunks, i = 0) =>
  chunks.flatMap((c) => c.choices.filter((x) => x.index === i)).map((x) => x.delta?.content ?? '').join('');

test('models.list names the model', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

test('chat blocking', async () => {
  const r = await client.chat.completions.create({ model, messages: user('def add(a, b):'), max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens <= 12 && r.usage.completion_tokens > 0);
});

test('chat streamed: role, deltas, finish_reason, usage; equals blocking', async () => {
  const args = { model, messages: user('import numpy'), max_tokens: 16, temperature: 0, ignore_eos: true };
  const full = await client.chat.completions.create(args);
  const chunks = await collect(
    await client.chat.completions.create({ ...args, stream: true, stream_options: { include_usage: true } }));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, 'one id across chunks');
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
  const finishes = chunks.flatMap((c) => c.choices).filter((x) => x.finish_reason);
  assert.equal(finishes.length, 1);
  assert.equal(finishes[0].finish_reason, 'length');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, full.usage);
  assert.equal(last.usage.completion_tokens, 16);
  for (const c of chunks.slice(0, -1)) assert.ok(!c.usage, 'usage only in the last chunk');
  assert.equal(chatText(chunks), full.choices[0].message.content);
});

test('streams without include_usage send no usage chunk', async () => {
  const chunks = await collect(await client.chat.completions.create(
    { model, messages: user('x'), max_tokens: 3, stream: true }));
  assert.ok(chunks.every((c) => !c.usage && c.choices.length === 1));
});

test('completions with token ids, return_token_ids, echo', async () => {
  const r = await client.completions.create({
    model, prompt: [785, 1630, 25], max_tokens: 6, temperature: 0, return_token_ids: true });
  assert.equal(r.object, 'text_completion');
  const c = r.choices[0];
  assert.deepEqual(c.prompt_token_ids, [785, 1630, 25]);
  assert.equal(c.token_ids.length, r.usage.completion_tokens);
  assert.equal(r.usage.prompt_tokens, 3);
  const e = await client.completions.create({
    model, prompt: [785, 1630, 25], max_tokens: 6, temperature: 0, echo: true });
  assert.ok(e.choices[0].text.endsWith(c.text), 'echo keeps the completion');
  assert.ok(e.choices[0].text.length > c.text.length, 'echo adds the prompt');
  // the text of the prompt ids, as the completion of a text prompt sees it
  const prompt = e.choices[0].text.slice(0, e.choices[0].text.length - c.text.length);
  const t = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0, return_token_ids: true });
  assert.deepEqual(t.choices[0].prompt_token_ids, [785, 1630, 25], `"${prompt}" encodes back to the ids`);
  assert.equal(t.choices[0].text, c.text);
  // streamed echo: the prompt comes first, as in the blocking answer
  const se = await collect(await client.completions.create({
    model, prompt: [785, 1630, 25], max_tokens: 6, temperature: 0, echo: true, stream: true }));
  assert.equal(se.flatMap((x) => x.choices.map((y) => y.text)).join(''), e.choices[0].text);
  // with echo, logprobs cover the prompt's tokens too (the first has none),
  // and offsets count from the start of the echoed text
  const el = await client.completions.create({
    model, prompt: [785, 1630, 25], max_tokens: 6, temperature: 0, echo: true, logprobs: 1 });
  const lp = el.choices[0].logprobs;
  assert.equal(lp.tokens.length, 3 + el.usage.completion_tokens);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  assert.ok(lp.token_logprobs[1] <= 0 && lp.token_logprobs[2] <= 0);
  assert.equal(lp.text_offset[0], 0);
  assert.equal(lp.text_offset[3], Buffer.byteLength(prompt));
});

test('chat logprobs and top_logprobs', async () => {
  const r = await client.chat.completions.create({
    model, messages: user('class Foo:'), max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    for (let k = 1; k < 3; k++) assert.ok(t.top_logprobs[k - 1].logprob >= t.top_logprobs[k].logprob);
    assert.equal(t.top_logprobs[0].token, t.token, 'greedy picks the top token');
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4);
    assert.deepEqual(Buffer.from(t.bytes).toString('utf8'), t.token);
  }
  assert.equal(lp.map((t) => t.token).join(''), r.choices[0].message.content);
  // streamed: the same entries, spread over the chunks
  const chunks = await collect(await client.chat.completions.create({
    model, messages: user('class Foo:'), max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3, stream: true }));
  const slp = chunks.flatMap((c) => c.choices.flatMap((x) => x.logprobs?.content ?? []));
  assert.deepEqual(slp.map((t) => t.token), lp.map((t) => t.token));
});

test('completions logprobs', async () => {
  const r = await client.completions.create({ model, prompt: 'def fib(n):', max_tokens: 6, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 6);
  assert.equal(lp.token_logprobs.length, 6);
  assert.equal(lp.top_logprobs.length, 6);
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  let off = 0;
  for (let i = 0; i < 6; i++) {
    assert.equal(lp.text_offset[i], off);
    off += lp.tokens[i].length;
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 2);
  }
});

// The greedy text of a prompt, then stop strings cut from it at random:
// the answer must be exactly the text before the first stop, blocking and
// streamed, and no streamed piece may hold any part of the stop.
test('stop strings never leak', async () => {
  const prompt = 'def fib(n):';
  const base = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0, ignore_eos: true });
  const text = base.choices[0].text;
  assert.ok(text.length > 30, 'a long enough reference');
  let rng = 12345;
  const rand = (n) => ((rng = (rng * 1103515245 + 12345) % 2147483648) % n);
  for (let trial = 0; trial < 8; trial++) {
    const a = 1 + rand(text.length - 6);
    const stop = text.slice(a, a + 1 + rand(5));
    const stops = [stop, 'never appears ~~'];
    const want = text.slice(0, text.indexOf(stop));
    const r = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0, ignore_eos: true, stop: stops });
    assert.equal(r.choices[0].text, want, `stop ${JSON.stringify(stop)}`);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const chunks = await collect(await client.completions.create(
      { model, prompt, max_tokens: 40, temperature: 0, ignore_eos: true, stop: stops, stream: true }));
    const pieces = chunks.flatMap((c) => c.choices.map((x) => x.text));
    assert.equal(pieces.join(''), want, `streamed, stop ${JSON.stringify(stop)}`);
    assert.equal(chunks.flatMap((c) => c.choices).filter((x) => x.finish_reason).map((x) => x.finish_reason).join(), 'stop');
  }
  // chat: the same through the chat endpoint
  const cb = await client.chat.completions.create({ model, messages: user('hello'), max_tokens: 30, temperature: 0, ignore_eos: true });
  const ct = cb.choices[0].message.content;
  const stop = ct.slice(10, 13);
  const cs = await collect(await client.chat.completions.create(
    { model, messages: user('hello'), max_tokens: 30, temperature: 0, ignore_eos: true, stop, stream: true }));
  assert.equal(chatText(cs), ct.slice(0, ct.indexOf(stop)));
  assert.equal(cs.flatMap((c) => c.choices).find((x) => x.finish_reason).finish_reason, 'stop');
});

test('n > 1, blocking and streamed', async () => {
  const r = await client.chat.completions.create({ model, messages: user('x = '), max_tokens: 5, n: 3, seed: 11 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.ok(r.usage.completion_tokens >= 3 && r.usage.completion_tokens <= 15);
  const chunks = await collect(await client.chat.completions.create(
    { model, messages: user('x = '), max_tokens: 5, n: 3, seed: 11, stream: true }));
  for (let i = 0; i < 3; i++) {
    const mine = chunks.flatMap((c) => c.choices).filter((x) => x.index === i);
    assert.equal(mine[0].delta.role, 'assistant');
    assert.equal(mine.filter((x) => x.finish_reason).length, 1, `one finish for choice ${i}`);
    assert.equal(chatText(chunks, i), r.choices[i].message.content, `choice ${i} as blocking with the seed`);
  }
});

test('n > 1 streams its choices side by side', async () => {
  const chunks = await collect(await client.completions.create(
    { model, prompt: 'import', max_tokens: 48, n: 6, ignore_eos: true, stream: true }));
  const order = chunks.flatMap((c) => c.choices).filter((x) => x.text).map((x) => x.index);
  assert.ok(order.length >= 6 * 24, `${order.length} text chunks`);
  // every choice starts within the first few rounds, not after choice 0 is done
  const start = new Set(order.slice(0, 18));
  assert.equal(start.size, 6, `first 18 chunks come from choices ${[...start]}`);
});

test('seeds reproduce; different seeds differ', async () => {
  const args = { model, prompt: 'import', max_tokens: 24, temperature: 1, ignore_eos: true };
  const a = await client.completions.create({ ...args, seed: 42 });
  const b = await client.completions.create({ ...args, seed: 42 });
  const c = await client.completions.create({ ...args, seed: 43 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
  const n = await client.completions.create({ ...args, seed: 42, n: 2 });
  assert.equal(n.choices[0].text, a.choices[0].text, 'choice 0 uses the seed itself');
  assert.notEqual(n.choices[1].text, n.choices[0].text);
});

test('tools: accepted; a tool_calls + tool conversation renders', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await client.chat.completions.create({ model, messages: user('weather in Paris?'), tools, max_tokens: 4 });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  const conv = [
    ...user('weather in Paris?'),
    // content "" rather than null: this model's template concatenates it
    { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' },
  ];
  const r2 = await client.chat.completions.create({ model, messages: conv, tools, max_tokens: 4 });
  assert.ok(r2.usage.prompt_tokens > r.usage.prompt_tokens + 5, 'the tool message is in the prompt');
  const s = await collect(await client.chat.completions.create({ model, messages: conv, tools, max_tokens: 4, stream: true }));
  assert.equal(s.flatMap((c) => c.choices).filter((x) => x.finish_reason).length, 1);
});

test('400s: types, ranges, roles name the field', async () => {
  const B = OpenAI.BadRequestError;
  await expectError(client.chat.completions.create({ model, messages: user('x'), temperature: 'hot' }), B, 400, 'temperature');
  await expectError(client.chat.completions.create({ model, messages: user('x'), top_p: 1.5 }), B, 400, 'top_p');
  await expectError(client.chat.completions.create({ model, messages: user('x'), n: 99 }), B, 400, 'n');
  await expectError(client.chat.completions.create({ model, messages: user('x'), max_tokens: 0 }), B, 400, 'max_tokens');
  await expectError(client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }), B, 400, 'messages[0].role');
  await expectError(client.chat.completions.create({ model, messages: [] }), B, 400, 'messages');
  await expectError(client.chat.completions.create({ model, messages: user('x'), stream: 'yes' }), B, 400, 'stream');
  await expectError(client.completions.create({ model, prompt: [1, -2] }), B, 400, 'prompt');
  await expectError(client.completions.create({ model, prompt: 'x', logprobs: 50 }), B, 400, 'logprobs');
  // a streamed request that is refused gets its status before any event
  await expectError(client.chat.completions.create({ model, messages: user('x'), temperature: -1, stream: true }), B, 400, 'temperature');
  // bad JSON cannot come from the client: send it raw
  const res = await fetch(`${base}/v1/chat/completions`, { method: 'POST', body: '{"messages": [',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` } });
  assert.equal(res.status, 400);
  const j = await res.json();
  assert.equal(j.error.type, 'invalid_request_error');
  assert.match(j.error.message, /not valid JSON/);
});

test('401 with a wrong key, 404, 413', async () => {
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await expectError(bad.models.list(), OpenAI.AuthenticationError, 401);
  await expectError(client.get('/nothing/here'), OpenAI.NotFoundError, 404);
  const e = await expectError(client.chat.completions.create({ model, messages: user('x'.repeat(200000)) }),
    OpenAI.APIError, 413);
  assert.match(e.message, /exceeds/);
});

test('429 when the queue is full', async () => {
  const busy = process.env.LOOM_BUSY_URL;
  assert.ok(busy, 'LOOM_BUSY_URL (a server with --max-seqs 1 --max-queue 1) is not set');
  const bc = new OpenAI({ baseURL: `${busy}/v1`, apiKey: key, maxRetries: 0 });
  const ctl = new AbortController();
  const long = { model, prompt: 'def', max_tokens: 100000, ignore_eos: true };
  const metric = async (name) => {
    const t = await (await fetch(`${busy}/metrics`, { headers: { authorization: `Bearer ${key}` } })).text();
    return Number(t.split('\n').find((l) => l.startsWith(name + ' ')).split(' ')[1]);
  };
  const until = async (name, v) => {
    for (let i = 0; i < 400 && (await metric(name)) !== v; i++) await new Promise((r) => setTimeout(r, 50));
    assert.equal(await metric(name), v, name);
  };
  const held = [];
  held.push(bc.completions.create({ ...long, stream: true }, { signal: ctl.signal }).then(collect).catch(() => {}));
  await until('loom_running_sequences', 1);
  held.push(bc.completions.create(long, { signal: ctl.signal }).catch(() => {}));
  await until('loom_queue_depth', 1);
  await expectError(bc.completions.create(long), OpenAI.RateLimitError, 429);
  ctl.abort();
  await Promise.all(held);
  await until('loom_running_sequences', 0);
  await until('loom_queue_depth', 0);
  await until('loom_kv_blocks_used', 0);
});

test('an aborted stream is cancelled in the engine', async () => {
  const ctl = new AbortController();
  const s = await client.chat.completions.create(
    { model, messages: user('x'), max_tokens: 100000, ignore_eos: true, stream: true }, { signal: ctl.signal });
  let n = 0;
  try {
    for await (const c of s) if (++n === 5) ctl.abort();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', e.message);
  }
  const t0 = Date.now();
  for (;;) {
    const m = await (await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${key}` } })).text();
    if (/^loom_running_sequences 0$/m.test(m) && /^loom_kv_blocks_used 0$/m.test(m)) break;
    assert.ok(Date.now() - t0 < 2000, 'still running 2 s after the abort');
    await new Promise((r) => setTimeout(r, 20));
  }
});

// Structured output: the bundled model writes Python, so every valid
// document below comes from the grammar; ajv checks it against the schema.
const toolSchema = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 16 },
    days: { type: 'integer', minimum: 1, maximum: 14 },
    units: { enum: ['metric', 'imperial'] },
    hourly: { type: 'boolean' },
    tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 },
    where: { $ref: '#/$defs/point' },
  },
  required: ['city', 'days', 'units'],
  additionalProperties: false,
  $defs: { point: { type: 'object', properties: { lat: { type: 'number', minimum: 0, maximum: 90 } }, required: ['lat'] } },
};

test('response_format json_schema: every output parses and validates (ajv)', async () => {
  const validate = new Ajv({ strict: false }).compile(toolSchema);
  const response_format = { type: 'json_schema', json_schema: { name: 'weather', schema: toolSchema, strict: true } };
  const runs = [];
  for (let seed = 0; seed < 6; seed++)
    runs.push(client.chat.completions.create(
      { model, messages: user('Weather in Paris?'), max_tokens: 400, temperature: 1, seed, response_format }));
  runs.push(client.chat.completions.create(
    { model, messages: user('Weather?'), max_tokens: 400, temperature: 0, response_format, n: 2 }));
  for (const r of await Promise.all(runs))
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'stop', `ended early: ${c.message.content}`);
      const doc = JSON.parse(c.message.content);
      assert.ok(validate(doc), `${c.message.content}: ${JSON.stringify(validate.errors)}`);
    }
  const chunks = await collect(await client.chat.completions.create(
    { model, messages: user('x'), max_tokens: 400, temperature: 0.7, seed: 9, response_format, stream: true }));
  const doc = JSON.parse(chatText(chunks));
  assert.ok(validate(doc), JSON.stringify(validate.errors));
});

// not, multipleOf, if/then/else, oneOf and a pattern with a length. ajv
// checks multipleOf to 1e-9: by default it divides in binary floating
// point, and 0.07 / 0.01 is 7.000000000000001.
const logicSchema = {
  type: 'object',
  properties: {
    kind: { enum: ['a', 'b', 'c'] },
    n: { type: 'integer', multipleOf: 7, minimum: -50, maximum: 500 },
    price: { type: 'number', multipleOf: 0.01, minimum: 0, maximum: 100 },
    code: { type: 'string', pattern: '^[A-Z][a-z0-9]*$', minLength: 3, maxLength: 6 },
    name: { type: 'string', maxLength: 8, not: { enum: ['', 'x'] } },
    v: { oneOf: [{ type: 'string', maxLength: 3 }, { type: 'integer' }, { type: 'number' }] },
    opt: { type: 'object', not: { required: ['bad'] }, additionalProperties: { type: 'integer' } },
  },
  required: ['kind', 'n', 'price', 'code', 'name', 'v'],
  additionalProperties: false,
  if: { properties: { kind: { const: 'a' } } },
  then: { properties: { n: { minimum: 0 } } },
  else: { properties: { name: { maxLength: 4 } } },
};

test('response_format with not, multipleOf, if/then/else, oneOf, pattern and length: outputs validate (ajv)', async () => {
  const validate = new Ajv({ strict: false, multipleOfPrecision: 9 }).compile(logicSchema);
  const response_format = { type: 'json_schema', json_schema: { name: 'logic', schema: logicSchema, strict: true } };
  const runs = [];
  for (let seed = 0; seed < 10; seed++)
    runs.push(client.chat.completions.create(
      { model, messages: user('x'), max_tokens: 800, temperature: 1, seed, response_format }));
  let whole = 0;
  for (const r of await Promise.all(runs)) {
    const c = r.choices[0];
    if (c.finish_reason !== 'stop') continue; /* a prefix: the grammar cut nothing */
    const doc = JSON.parse(c.message.content);
    assert.ok(validate(doc), `${JSON.stringify(validate.errors)}: ${JSON.stringify(doc)}`);
    whole++;
  }
  assert.ok(whole >= 3, `only ${whole} of 10 outputs ended`);
});

test('response_format json_object, and the regex extension on completions', async () => {
  const r = await client.chat.completions.create(
    { model, messages: user('x'), max_tokens: 300, temperature: 1, seed: 4, response_format: { type: 'json_object' } });
  const doc = JSON.parse(r.choices[0].message.content);
  assert.ok(doc && typeof doc === 'object' && !Array.isArray(doc), r.choices[0].message.content);
  const c = await client.completions.create({ model, prompt: 'id = ', max_tokens: 20, regex: '[A-Z]{3}-[0-9]{2,4}' });
  assert.match(c.choices[0].text, /^[A-Z]{3}-[0-9]{2,4}$/);
});

test('a schema that cannot be compiled is a 400 naming what is unsupported', async () => {
  const e = await expectError(client.chat.completions.create({
    model, messages: user('x'),
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', prefixItems: [] } } },
  }), OpenAI.BadRequestError, 400, 'response_format');
  assert.match(e.message, /prefixItems/);
});

test('a schema error names the keyword and its JSON pointer', async () => {
  const e = await expectError(client.chat.completions.create({
    model, messages: user('x'),
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema:
      { type: 'object', properties: { ids: { type: 'array', contains: { type: 'integer' } } } } } },
  }), OpenAI.BadRequestError, 400, 'response_format');
  assert.match(e.message, /'contains' is not supported \(at #\/properties\/ids\/contains\)/);
});

// tool_choice "required" and a named function force a call whose arguments
// validate against the tool's parameters; "none" never gives a call.
const weatherTool = { type: 'function', function: { name: 'get_weather', description: 'weather of a city',
  parameters: toolSchema } };
const timeTool = { type: 'function', function: { name: 'get_time', parameters: { type: 'object',
  properties: { tz: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['tz'], additionalProperties: false } } };

test('tool_choice required / named: a valid call every time (ajv on the arguments)', async () => {
  const tools = [weatherTool, timeTool];
  const check = { get_weather: new Ajv({ strict: false }).compile(toolSchema),
                  get_time: new Ajv({ strict: false }).compile(timeTool.function.parameters) };
  const runs = [];
  for (let seed = 0; seed < 4; seed++) {
    runs.push([null, client.chat.completions.create({ model, messages: user('Weather in Paris?'), tools,
      tool_choice: 'required', max_tokens: 400, temperature: 1, seed })]);
    runs.push(['get_time', client.chat.completions.create({ model, messages: user('What time is it?'), tools,
      tool_choice: { type: 'function', function: { name: 'get_time' } }, max_tokens: 400, temperature: 1, seed })]);
  }
  for (const [want, p] of runs) {
    const c = (await p).choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `no call: ${JSON.stringify(c.message)}`);
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) {
      if (want) assert.equal(call.function.name, want);
      const v = check[call.function.name];
      assert.ok(v, `unknown tool ${call.function.name}`);
      const args = JSON.parse(call.function.arguments);
      assert.ok(v(args), `${call.function.arguments}: ${JSON.stringify(v.errors)}`);
    }
  }
  const s = await collect(await client.chat.completions.create({ model, messages: user('x'), tools, stream: true,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 400, temperature: 0.8, seed: 3 }));
  const deltas = s.flatMap((ch) => ch.choices[0]?.delta?.tool_calls || []);
  assert.ok(deltas.length >= 1, 'a streamed call');
  const args = deltas.map((d) => d.function?.arguments || '').join('');
  assert.ok(check.get_weather(JSON.parse(args)), args);
});

test('tool_choice none: no tool call; a forced call and response_format together are a 400', async () => {
  for (let seed = 0; seed < 3; seed++) {
    const r = await client.chat.completions.create({ model, messages: user('Weather in Paris?'),
      tools: [weatherTool], tool_choice: 'none', max_tokens: 32, temperature: 1, seed });
    assert.ok(!r.choices[0].message.tool_calls?.length);
    assert.notEqual(r.choices[0].finish_reason, 'tool_calls');
  }
  const e = await expectError(client.chat.completions.create({ model, messages: user('x'), tools: [weatherTool],
    tool_choice: 'required', response_format: { type: 'json_object' } }), OpenAI.BadRequestError, 400, 'response_format');
  assert.match(e.message, /both constrain/);
  const e2 = await expectError(client.chat.completions.create({ model, messages: user('x'), tool_choice: 'required',
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: { pattern: 'x' } } } } } }] }),
  OpenAI.BadRequestError, 400, 'tools');
  assert.match(e2.message, /tool 'f' parameters: 'not' over 'pattern' is not supported .*\(at #\/properties\/a\/not\/pattern\)/);
  // strict: true on a tool promises valid arguments, so what loom cannot write is refused even under auto
  const e3 = await expectError(client.chat.completions.create({ model, messages: user('x'),
    tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object',
      properties: { a: { oneOf: [{ type: 'string', pattern: 'a' }, { type: 'string', pattern: 'b' }] } } } } }] }),
  OpenAI.BadRequestError, 400, 'tools[0].function.parameters');
  assert.match(e3.message, /'oneOf' branches 0 and 1 may both match one value/);
});

await run();
