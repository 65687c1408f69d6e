// loom serve's /v1/responses through the official OpenAI client: string and
// item input, instructions, the typed event stream with sequence numbers,
// previous_response_id continuing a stored conversation from its kept KV,
// retrieve by id, store: false, 404s, function_call items rendered through a
// template that has tools, text.format, and 400s naming the field. Run by
// tests/cli_server_sdks.sh:
//   LOOM_URL=... LOOM_TOOLS_URL=... LOOM_API_KEY=KEY node responses.test.mjs
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { expectError, run, test } from './harness.mjs';

const base = process.env.LOOM_URL;
const toolsBase = process.env.LOOM_TOOLS_URL;
const key = process.env.LOOM_API_KEY || 'none';
if (!base || !toolsBase) throw new Error('LOOM_URL and LOOM_TOOLS_URL must be set');
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const tclient = new OpenAI({ baseURL: `${toolsBase}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const model = 'pycoder-16m';

const messageText = (r) => r.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');

test('responses.create with a string input', async () => {
  const r = await client.responses.create({ model, input: 'def add(a, b):', max_output_tokens: 8, temperature: 0 });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(r.model, model);
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.content[0].type, 'output_text');
  assert.equal(r.output_text, m.content[0].text, 'the client joins output_text');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.output_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

test('max_output_tokens: status incomplete with its reason', async () => {
  const r = await client.responses.create({ model, input: 'import', max_output_tokens: 5, ignore_eos: true });
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.usage.output_tokens, 5);
});

test('items input and instructions', async () => {
  const items = [{ role: 'user', content: [{ type: 'input_text', text: 'def f():' }] },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'return 1' }] },
    { role: 'user', content: 'again' }];
  const a = await client.responses.create({ model, input: items, max_output_tokens: 2 });
  const b = await client.responses.create({ model, input: items, instructions: 'You write Python.', max_output_tokens: 2 });
  const s = await client.responses.create({ model, input: 'again', max_output_tokens: 2 });
  assert.ok(a.usage.input_tokens > s.usage.input_tokens + 8, `${a.usage.input_tokens} vs ${s.usage.input_tokens}`);
  assert.ok(b.usage.input_tokens > a.usage.input_tokens + 3, `${b.usage.input_tokens} vs ${a.usage.input_tokens}`);
  assert.equal(b.instructions, 'You write Python.');
});

test('stream: typed events in order with sequence numbers; the same text as blocking', async () => {
  const args = { model, input: 'import numpy', max_output_tokens: 16, temperature: 0, ignore_eos: true };
  const full = await client.responses.create(args);
  const events = [];
  for await (const ev of await client.responses.create({ ...args, stream: true })) events.push(ev);
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.incomplete']);
  assert.ok(types.slice(4, -4).every((t) => t === 'response.output_text.delta'), types.join());
  assert.equal(events[0].response.status, 'in_progress');
  const id = events[0].response.id;
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, messageText(full));
  assert.equal(events.at(-4).text, text);
  assert.equal(events.at(-2).item.content[0].text, text);
  const last = events.at(-1).response;
  assert.equal(last.id, id);
  assert.equal(messageText(last), text);
  assert.equal(last.usage.output_tokens, 16);
  // a stream that ends on its own completes
  const done = [];
  for await (const ev of await client.responses.create({ model, input: 'x', max_output_tokens: 400, temperature: 0, stream: true }))
    done.push(ev.type);
  assert.ok(['response.completed', 'response.incomplete'].includes(done.at(-1)), done.at(-1));
  // the stored response is the final one
  const got = await client.responses.retrieve(id);
  assert.equal(messageText(got), text);
});

test('previous_response_id continues the conversation from its kept state', async () => {
  const first = await client.responses.create({ model, input: 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""',
    max_output_tokens: 8, temperature: 0 });
  const next = await client.responses.create({ model, input: 'and factorial?', previous_response_id: first.id,
    max_output_tokens: 4, temperature: 0 });
  assert.equal(next.previous_response_id, first.id);
  // the prompt holds the first turn, its answer and the new input
  assert.ok(next.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
    `${next.usage.input_tokens} vs ${first.usage.input_tokens} + ${first.usage.output_tokens}`);
  // and the first turn is not computed again
  assert.ok(next.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens,
    `cached ${next.usage.input_tokens_details.cached_tokens} of ${first.usage.input_tokens}`);
  // a third turn continues the second: the whole conversation is there
  const third = await client.responses.create({ model, input: 'thanks', previous_response_id: next.id, max_output_tokens: 2 });
  assert.ok(third.usage.input_tokens > next.usage.input_tokens + next.usage.output_tokens);
  // instructions are the request's own: a continuation does not inherit them
  const withIns = await client.responses.create({ model, input: 'hi', instructions: 'Be brief and answer in Python only.', max_output_tokens: 2 });
  const cont = await client.responses.create({ model, input: 'ok', previous_response_id: withIns.id, max_output_tokens: 2 });
  const plain = await client.responses.create({ model, input: [{ role: 'user', content: 'hi' },
    { role: 'assistant', content: messageText(withIns) }, { role: 'user', content: 'ok' }], max_output_tokens: 2 });
  assert.equal(cont.usage.input_tokens, plain.usage.input_tokens);
});

test('retrieve and delete by id; unknown ids and store: false are 404', async () => {
  const r = await client.responses.create({ model, input: 'x = ', max_output_tokens: 3, metadata: { k: 'v' } });
  const got = await client.responses.retrieve(r.id);
  assert.deepEqual(got, r);
  assert.deepEqual(got.metadata, { k: 'v' });
  await expectError(client.responses.retrieve('resp_unknown'), OpenAI.NotFoundError, 404);
  const e = await expectError(client.responses.create({ model, input: 'x', previous_response_id: 'resp_unknown' }),
    OpenAI.NotFoundError, 404, 'previous_response_id');
  assert.equal(e.code, 'previous_response_not_found');
  const ns = await client.responses.create({ model, input: 'x', max_output_tokens: 2, store: false });
  assert.equal(ns.store, false);
  await expectError(client.responses.retrieve(ns.id), OpenAI.NotFoundError, 404);
  await expectError(client.responses.create({ model, input: 'y', previous_response_id: ns.id }), OpenAI.NotFoundError, 404);
  // delete: gone for retrieve and for continuing
  await client.responses.delete(r.id);
  await expectError(client.responses.retrieve(r.id), OpenAI.NotFoundError, 404);
  await expectError(client.responses.delete(r.id), OpenAI.NotFoundError, 404);
  await expectError(client.responses.create({ model, input: 'y', previous_response_id: r.id }), OpenAI.NotFoundError, 404);
});

const tools = [{ type: 'function', name: 'get_weather', description: 'weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];

test('function tools and function_call / function_call_output items render', async () => {
  const input = [{ role: 'user', content: 'weather in Paris?' }];
  const plain = await tclient.responses.create({ model, input, max_output_tokens: 2 });
  const withTools = await tclient.responses.create({ model, input, tools, max_output_tokens: 2 });
  assert.ok(withTools.usage.input_tokens > plain.usage.input_tokens + 10);
  assert.equal(withTools.tools[0].name, 'get_weather');
  const none = await tclient.responses.create({ model, input, tools, tool_choice: 'none', max_output_tokens: 2 });
  assert.equal(none.usage.input_tokens, withTools.usage.input_tokens); /* the tools stay in the prompt */
  const named = await tclient.responses.create({ model, input, tools, max_output_tokens: 2,
    tool_choice: { type: 'function', name: 'get_weather' } });
  assert.ok(['completed', 'incomplete'].includes(named.status));
  const turn = [...input,
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'sunny, 21 C' }];
  const r = await tclient.responses.create({ model, input: turn, tools, max_output_tokens: 2 });
  assert.ok(r.usage.input_tokens > withTools.usage.input_tokens + 15, `${r.usage.input_tokens} vs ${withTools.usage.input_tokens}`);
  const longer = structuredClone(turn);
  longer[2].output = 'sunny, 21 C, light wind from the west, no rain expected';
  const r2 = await tclient.responses.create({ model, input: longer, tools, max_output_tokens: 2 });
  assert.ok(r2.usage.input_tokens > r.usage.input_tokens + 5, 'the output is in the prompt');
  await expectError(tclient.responses.create({ model, input, tools, tool_choice: { type: 'function', name: 'nope' } }),
    OpenAI.BadRequestError, 400, 'tool_choice');
});

test('text.format is accepted', async () => {
  for (const format of [{ type: 'text' }, { type: 'json_object' },
    { type: 'json_schema', name: 'x', schema: { type: 'object', properties: { a: { type: 'number' } } } }]) {
    const r = await client.responses.create({ model, input: 'give json', text: { format }, max_output_tokens: 3 });
    assert.deepEqual(r.text.format, format);
  }
});

test('400s name the field', async () => {
  const B = OpenAI.BadRequestError;
  await expectError(client.responses.create({ model }), B, 400, 'input');
  await expectError(client.responses.create({ model, input: 5 }), B, 400, 'input');
  await expectError(client.responses.create({ model, input: [{ type: 'wizardry' }] }), B, 400, 'input[0].type');
  await expectError(client.responses.create({ model, input: [{ role: 'robot', content: 'x' }] }), B, 400, 'input[0].role');
  const img = await expectError(client.responses.create({ model, input: [{ role: 'user',
    content: [{ type: 'input_image', image_url: 'data:image/png;base64,AA==' }] }] }), B, 400, 'input[0].content[0]');
  assert.match(img.message, /takes no images/);
  await expectError(client.responses.create({ model, input: 'x', max_output_tokens: 0 }), B, 400, 'max_output_tokens');
  await expectError(client.responses.create({ model, input: 'x', temperature: 'hot' }), B, 400, 'temperature');
  await expectError(client.responses.create({ model, input: 'x', store: 'yes' }), B, 400, 'store');
  await expectError(client.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] }), B, 400, 'tools[0].type');
  await expectError(client.responses.create({ model, input: 'x', stream: true, top_p: 7 }), B, 400, 'top_p');
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await expectError(bad.responses.create({ model, input: 'x' }), OpenAI.AuthenticationError, 401);
});

await run();
