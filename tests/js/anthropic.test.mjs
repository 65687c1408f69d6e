// loom serve's /v1/messages through the official Anthropic client: text,
// stop_sequences, the max_tokens stop reason, the event stream, count_tokens,
// prefix-cache reads in usage, the key check by x-api-key or bearer, errors
// in Anthropic's shape, and tools rendered through a template that has them.
// Run by tests/cli_server_sdks.sh:
//   LOOM_URL=... LOOM_TOOLS_URL=... LOOM_API_KEY=KEY node anthropic.test.mjs
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { expectAnthropicError, run, test } from './harness.mjs';

const base = process.env.LOOM_URL;
const toolsBase = process.env.LOOM_TOOLS_URL;
const key = process.env.LOOM_API_KEY || 'none';
if (!base || !toolsBase) throw new Error('LOOM_URL and LOOM_TOOLS_URL must be set');
const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const tclient = new Anthropic({ baseURL: toolsBase, apiKey: key, maxRetries: 0, timeout: 120000 });
const model = 'pycoder-16m';
const user = (content) => [{ role: 'user', content }];
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

test('messages.create: a message with a text block, usage, stop reason', async () => {
  const m = await client.messages.create({ model, max_tokens: 12, messages: user('def add(a, b):'), temperature: 0 });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, model);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(typeof m.content[0].text, 'string');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.input_tokens > 0);
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
});

test('max_tokens ends with stop_reason max_tokens', async () => {
  const m = await client.messages.create({ model, max_tokens: 5, messages: user('import'), ignore_eos: true });
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 5);
});

test('system as a string and as text blocks; multi-turn; metadata ignored', async () => {
  const msgs = [...user('def f():'), { role: 'assistant', content: 'return 1' }, ...user([{ type: 'text', text: 'again' }])];
  const none = await client.messages.countTokens({ model, messages: msgs });
  const s = await client.messages.countTokens({ model, messages: msgs, system: 'You write Python.' });
  const b = await client.messages.countTokens({ model, messages: msgs, system: [{ type: 'text', text: 'You write Python.' }] });
  assert.ok(s.input_tokens > none.input_tokens + 3, `${s.input_tokens} vs ${none.input_tokens}`);
  assert.equal(b.input_tokens, s.input_tokens);
  const m = await client.messages.create({ model, max_tokens: 3, messages: msgs, system: 'You write Python.',
    metadata: { user_id: 'u-1' }, top_p: 0.9, top_k: 5 });
  assert.equal(m.type, 'message');
});

test('count_tokens counts what create reads; a repeated prompt is read from the cache', async () => {
  const messages = user('def fibonacci(n):\n    """Return the n-th Fibonacci number, computed iteratively."""\n');
  const c = await client.messages.countTokens({ model, messages });
  assert.ok(c.input_tokens > 20, `${c.input_tokens} tokens`);
  const a = await client.messages.create({ model, max_tokens: 2, messages, temperature: 0 });
  const b = await client.messages.create({ model, max_tokens: 2, messages, temperature: 0 });
  for (const m of [a, b])
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, c.input_tokens, JSON.stringify(m.usage));
  assert.ok(b.usage.cache_read_input_tokens >= 16, `cached ${b.usage.cache_read_input_tokens}`);
});

// The greedy text, then a stop sequence cut from it.
test('stop_sequences: the text before it, stop_reason and stop_sequence', async () => {
  const args = { model, max_tokens: 30, messages: user('hello'), temperature: 0, ignore_eos: true };
  const full = textOf(await client.messages.create(args));
  assert.ok(full.length > 15, full);
  const stop = full.slice(8, 11);
  const m = await client.messages.create({ ...args, stop_sequences: ['never ~~', stop] });
  assert.equal(textOf(m), full.slice(0, full.indexOf(stop)));
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  // a stop sequence ends the request early: its usage still counts the cache
  const long = { ...args, messages: user('def fibonacci(n):\n    """Return the n-th Fibonacci number, iteratively."""\n') };
  const lt = textOf(await client.messages.create(long));
  const again = await client.messages.create({ ...long, stop_sequences: [lt.slice(4, 7)] });
  assert.equal(again.stop_reason, 'stop_sequence');
  assert.ok(again.usage.cache_read_input_tokens >= 16, `cache read ${JSON.stringify(again.usage)}`);
  const s = client.messages.stream({ ...args, stop_sequences: [stop] });
  const fm = await s.finalMessage();
  assert.equal(textOf(fm), textOf(m));
  assert.equal(fm.stop_reason, 'stop_sequence');
  assert.equal(fm.stop_sequence, stop);
});

test('stream: the event sequence, and the same message as blocking', async () => {
  const args = { model, max_tokens: 16, messages: user('import numpy'), temperature: 0, ignore_eos: true };
  const full = await client.messages.create(args);
  const events = [];
  for await (const ev of await client.messages.create({ ...args, stream: true })) events.push(ev);
  const types = events.map((e) => e.type).filter((t) => t !== 'ping');
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(types.slice(2, -3).every((t) => t === 'content_block_delta'), types.join());
  assert.equal(events[0].message.role, 'assistant');
  assert.deepEqual(events[0].message.content, []);
  assert.equal(events[1].content_block.type, 'text');
  const deltas = events.filter((e) => e.type === 'content_block_delta');
  assert.ok(deltas.every((d) => d.index === 0 && d.delta.type === 'text_delta'));
  assert.equal(deltas.map((d) => d.delta.text).join(''), textOf(full));
  const md = events.find((e) => e.type === 'message_delta');
  assert.equal(md.delta.stop_reason, 'max_tokens');
  assert.equal(md.usage.output_tokens, 16);
  // the client's own accumulator agrees
  const fm = await client.messages.stream(args).finalMessage();
  assert.equal(textOf(fm), textOf(full));
  assert.equal(fm.stop_reason, 'max_tokens');
  assert.equal(fm.usage.output_tokens, 16);
});

test('thinking is accepted (this model has no reasoning to split)', async () => {
  const m = await client.messages.create({ model, max_tokens: 3, messages: user('x'), thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.ok(m.content.every((b) => b.type !== 'thinking'));
});

test('the key: x-api-key or Authorization: Bearer; a wrong one is 401 authentication_error', async () => {
  const bearer = new Anthropic({ baseURL: base, authToken: key, apiKey: null, maxRetries: 0 });
  const m = await bearer.messages.create({ model, max_tokens: 2, messages: user('x') });
  assert.equal(m.type, 'message');
  const bad = new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
  await expectAnthropicError(bad.messages.create({ model, max_tokens: 2, messages: user('x') }),
    Anthropic.AuthenticationError, 401, 'authentication_error', /x-api-key/);
  await expectAnthropicError(bad.messages.countTokens({ model, messages: user('x') }),
    Anthropic.AuthenticationError, 401, 'authentication_error');
});

test('errors: 400 invalid_request_error naming the field, 404 not_found_error', async () => {
  const B = Anthropic.BadRequestError;
  await expectAnthropicError(client.messages.create({ model, messages: user('x') }), B, 400, 'invalid_request_error', /'max_tokens' is required/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 'ten', messages: user('x') }), B, 400, 'invalid_request_error', /max_tokens/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4, messages: [] }), B, 400, 'invalid_request_error', /messages/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }), B, 400,
    'invalid_request_error', /messages\[0\]\.role/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4, temperature: 1.5, messages: user('x') }), B, 400,
    'invalid_request_error', /temperature/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4, stop_sequences: 'x', messages: user('x') }), B, 400,
    'invalid_request_error', /stop_sequences/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4,
    messages: user([{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }]) }), B, 400,
    'invalid_request_error', /messages\[0\]\.content\[0\].*takes no images/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4, messages: user([{ type: 'hologram' }]) }), B, 400,
    'invalid_request_error', /messages\[0\]\.content\[0\].*hologram/);
  await expectAnthropicError(client.messages.create({ model, max_tokens: 4, messages: user('x'), stream: true, temperature: -1 }), B, 400,
    'invalid_request_error', /temperature/);
  await expectAnthropicError(client.messages.create({ model: 'claude-nope', max_tokens: 4, messages: user('x') }),
    Anthropic.NotFoundError, 404, 'not_found_error', /claude-nope/);
  // bad JSON cannot come from the client: send it raw, with the headers it sends
  const res = await fetch(`${base}/v1/messages`, { method: 'POST', body: '{"messages": [',
    headers: { 'content-type': 'application/json', 'x-api-key': key, 'anthropic-version': '2023-06-01' } });
  assert.equal(res.status, 400);
  const j = await res.json();
  assert.equal(j.type, 'error');
  assert.equal(j.error.type, 'invalid_request_error');
  assert.match(j.error.message, /not valid JSON/);
});

// On a server whose chat template renders tools (a Hermes-style one).
const tools = [{ name: 'get_weather', description: 'weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];

test('tools: rendered through the template; tool_choice none keeps them in the prompt', async () => {
  const messages = user('weather in Paris?');
  const plain = await tclient.messages.countTokens({ model, messages });
  const withTools = await tclient.messages.countTokens({ model, messages, tools });
  assert.ok(withTools.input_tokens > plain.input_tokens + 10, `${withTools.input_tokens} vs ${plain.input_tokens}`);
  const none = await tclient.messages.countTokens({ model, messages, tools, tool_choice: { type: 'none' } });
  assert.equal(none.input_tokens, withTools.input_tokens);
  for (const tool_choice of [{ type: 'auto' }, { type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
    const m = await tclient.messages.create({ model, max_tokens: 4, messages, tools, tool_choice });
    assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(m.stop_reason), m.stop_reason);
  }
  await expectAnthropicError(tclient.messages.create({ model, max_tokens: 4, messages, tools, tool_choice: { type: 'tool', name: 'nope' } }),
    Anthropic.BadRequestError, 400, 'invalid_request_error', /nope/);
  await expectAnthropicError(tclient.messages.create({ model, max_tokens: 4, messages, tools: [{ name: 'f' }] }),
    Anthropic.BadRequestError, 400, 'invalid_request_error', /tools\[0\]\.input_schema/);
});

test('tools: a tool_use and tool_result round trip renders the call and its result', async () => {
  const first = user('weather in Paris?');
  const turn = [
    ...first,
    { role: 'assistant', content: [{ type: 'text', text: 'Let me look.' },
      { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny, 21 C' },
      { type: 'text', text: 'and tomorrow?' }] },
  ];
  const a = await tclient.messages.countTokens({ model, messages: first, tools });
  const b = await tclient.messages.countTokens({ model, messages: turn, tools });
  assert.ok(b.input_tokens > a.input_tokens + 20, `${b.input_tokens} vs ${a.input_tokens}`);
  // the result's text is in the prompt: a longer result counts more
  const longer = structuredClone(turn);
  longer[2].content[0].content = [{ type: 'text', text: 'sunny, 21 C, light wind from the west, no rain expected' }];
  const c = await tclient.messages.countTokens({ model, messages: longer, tools });
  assert.ok(c.input_tokens > b.input_tokens + 5, `${c.input_tokens} vs ${b.input_tokens}`);
  const m = await tclient.messages.create({ model, max_tokens: 4, messages: turn, tools });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, b.input_tokens);
  const s = await tclient.messages.stream({ model, max_tokens: 4, messages: turn, tools }).finalMessage();
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(s.stop_reason));
});

// tool_choice any or a named tool: the reply is that tool's call, its input
// valid for input_schema (constrained decoding), the same blocking and
// streamed (input_json_delta), and the call feeds a tool_result turn.
test('tools: tool_choice any / tool gives a valid tool_use, streamed as input_json_delta', async () => {
  const Ajv = (await import('ajv')).default;
  const shortTools = [{ name: 'get_weather', description: 'weather of a city',
    input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 },
      days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false } },
  { name: 'get_time', description: 'time in a zone', input_schema: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] } }];
  const valid = new Ajv().compile(shortTools[0].input_schema);
  const messages = user('weather in Paris for the next 3 days?');
  const args = { model, max_tokens: 96, messages, tools: shortTools, temperature: 0 };
  for (const tool_choice of [{ type: 'tool', name: 'get_weather' }, { type: 'any' }]) {
    const m = await tclient.messages.create({ ...args, tool_choice });
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, JSON.stringify(m.content));
    const use = uses[0];
    assert.match(use.id, /^toolu_/);
    assert.ok(['get_weather', 'get_time'].includes(use.name), use.name);
    if (tool_choice.type === 'tool') assert.equal(use.name, 'get_weather');
    if (use.name === 'get_weather') assert.ok(valid(use.input), `${JSON.stringify(use.input)}: ${JSON.stringify(valid.errors)}`);
    else assert.ok(['UTC', 'CET'].includes(use.input.zone), JSON.stringify(use.input));
    const events = [];
    for await (const ev of await tclient.messages.create({ ...args, tool_choice, stream: true })) events.push(ev);
    const start = events.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
    assert.ok(start, events.map((e) => e.type).join());
    assert.equal(start.content_block.name, use.name);
    const json = events.filter((e) => e.type === 'content_block_delta' && e.index === start.index)
      .map((e) => { assert.equal(e.delta.type, 'input_json_delta'); return e.delta.partial_json; }).join('');
    assert.deepEqual(JSON.parse(json), use.input);
    assert.equal(events.find((e) => e.type === 'message_delta').delta.stop_reason, 'tool_use');
    const fm = await tclient.messages.stream({ ...args, tool_choice }).finalMessage();
    assert.deepEqual(fm.content.find((b) => b.type === 'tool_use').input, use.input);
  }
});

await run();
