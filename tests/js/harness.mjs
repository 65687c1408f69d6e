// What the client test files share: tests registered in order, run one
// after another with a line each, and the error checks of the two API
// shapes (OpenAI's param, Anthropic's error type).
import assert from 'node:assert/strict';

const tests = [];
export const test = (name, fn) => tests.push({ name, fn });

// Runs the registered tests and exits 1 if any failed.
export async function run() {
  let failed = 0;
  for (const t of tests) {
    const t0 = Date.now();
    try {
      await t.fn();
      console.log(`ok   ${t.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name}\n     ${(e.stack || String(e)).split('\n').slice(0, 6).join('\n     ')}`);
    }
  }
  console.log(failed ? `${failed} of ${tests.length} failed` : `all ${tests.length} passed`);
  process.exit(failed ? 1 : 0);
}

// promise must reject with an instance of cls and HTTP status; param, when
// given, is the OpenAI error's param. Returns the error.
export async function expectError(promise, cls, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param, `param of: ${e.message}`);
    return e;
  }
  assert.fail(`expected ${cls.name} (${status})`);
}

// The same for an Anthropic client error: its body in Anthropic's shape,
// of error type type, the message matching pattern when given.
export async function expectAnthropicError(promise, cls, status, type, pattern) {
  const e = await expectError(promise, cls, status);
  assert.equal(e.error?.type, 'error', `Anthropic's shape: ${JSON.stringify(e.error)}`);
  assert.equal(e.type, type);
  if (pattern) assert.match(e.apiMessage, pattern);
  return e;
}
