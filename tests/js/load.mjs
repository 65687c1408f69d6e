// Load test of loom serve over loopback: C concurrent clients, each doing
// R requests. Most stream well-formed chat or completion requests; some
// hang up mid-stream, some send malformed JSON or oversized bodies, some
// trickle their body over seconds, and some repeat one seeded request
// whose text must not depend on what else is batched with it. Every
// well-formed request must get a valid SSE stream; afterwards the server
// must be idle (no running or queued sequence, no KV block in use). Prints requests/s and the client's
// TTFT and inter-token latency percentiles.
//   node load.mjs --url http://127.0.0.1:PORT [--clients 64] [--rounds 3]
//        [--max-tokens 32] [--oversize BYTES] [--slow-ms 2000] [--key KEY]
import http from 'node:http';

const opt = { url: '', clients: 64, rounds: 3, 'max-tokens': 32, oversize: 9 << 20, 'slow-ms': 2000, key: '' };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i].replace(/^--/, '');
  if (!(k in opt)) throw new Error(`unknown option ${process.argv[i]}`);
  opt[k] = typeof opt[k] === 'number' ? Number(process.argv[i + 1]) : process.argv[i + 1];
}
if (!opt.url) throw new Error('--url is required');
const target = new URL(opt.url);
const T = opt['max-tokens'];
const agent = new http.Agent({ keepAlive: true, maxSockets: opt.clients * 2 });
const now = () => performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const stats = { ok: 0, aborted: 0, bad400: 0, big413: 0, slow: 0, same: 0, failures: [], ttft: [], itl: [], tokens: 0 };
// The seeded request every "same" client sends; its text alone is the reference.
const SAME = JSON.stringify({ prompt: 'def parse(line):', max_tokens: T, ignore_eos: true, stream: true,
  stream_options: { include_usage: true }, temperature: 0.9, seed: 4242 });
let sameRef = null;
const failure = (what) => { stats.failures.push(what); };

// One HTTP request. body: a string/Buffer, or an array of pieces sent
// pieceDelay ms apart. onData(chunk, req) sees the response as it comes.
function request(path, body, { pieces = null, pieceDelay = 0, onData = null, method = 'POST' } = {}) {
  return new Promise((resolve) => {
    const len = pieces ? pieces.reduce((a, p) => a + Buffer.byteLength(p), 0) : Buffer.byteLength(body ?? '');
    const headers = { 'content-type': 'application/json', 'content-length': len };
    if (opt.key) headers.authorization = `Bearer ${opt.key}`;
    const req = http.request({ host: target.hostname, port: target.port, path, method, headers, agent });
    let settled = false, sentAt = 0;
    const done = (v) => { if (!settled) { settled = true; resolve({ ...v, sentAt }); } };
    req.on('response', (res) => {
      const parts = [];
      res.on('data', (c) => { parts.push(c); if (onData) onData(c, req); });
      res.on('end', () => done({ status: res.statusCode, type: res.headers['content-type'], body: Buffer.concat(parts).toString() }));
      res.on('error', (e) => done({ status: res.statusCode, error: e, body: Buffer.concat(parts).toString() }));
      res.on('aborted', () => done({ status: res.statusCode, aborted: true, body: Buffer.concat(parts).toString() }));
    });
    req.on('error', (e) => done({ error: e }));
    req.on('close', () => done({ closed: true }));
    (async () => {
      if (!pieces) {
        sentAt = now();
        return req.end(body);
      }
      for (const p of pieces) {
        if (req.destroyed) return;
        req.write(p);
        await sleep(pieceDelay);
      }
      sentAt = now();
      req.end();
    })();
  });
}

// Checks an SSE body; returns the parsed chunks or throws.
function checkStream(r, chat, n) {
  if (r.status !== 200) throw new Error(`status ${r.status}: ${String(r.body).slice(0, 200)}`);
  if (!String(r.type).startsWith('text/event-stream')) throw new Error(`content-type ${r.type}`);
  const events = r.body.split('\n\n').filter((e) => e.length);
  if (events.at(-1) !== 'data: [DONE]') throw new Error(`last event ${JSON.stringify(events.at(-1))}`);
  const chunks = events.slice(0, -1).map((e) => {
    if (!e.startsWith('data: ')) throw new Error(`event without data: ${e.slice(0, 80)}`);
    return JSON.parse(e.slice(6));
  });
  if (chunks.some((c) => c.error)) throw new Error(`error event ${JSON.stringify(chunks.find((c) => c.error))}`);
  const usage = chunks.at(-1).usage;
  if (!usage || usage.completion_tokens !== n * T) throw new Error(`usage ${JSON.stringify(usage)}`);
  for (let i = 0; i < n; i++) {
    const mine = chunks.flatMap((c) => c.choices).filter((x) => x.index === i);
    if (chat && mine[0]?.delta?.role !== 'assistant') throw new Error(`choice ${i}: no role first`);
    const fin = mine.filter((x) => x.finish_reason);
    if (fin.length !== 1 || fin[0].finish_reason !== 'length') throw new Error(`choice ${i}: finishes ${JSON.stringify(fin)}`);
  }
  return chunks;
}

function genBody(i, round, chat) {
  const common = { max_tokens: T, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    temperature: 0.8, seed: i * 1000 + round };
  return JSON.stringify(chat
    ? { ...common, messages: [{ role: 'user', content: `task ${i}.${round}: write a parser` }] }
    : { ...common, prompt: `def task_${i}_${round}(x):` });
}

// A streamed request, timed by the arrival of text.
async function streamOnce(i, round, { abortAfter = 0, slow = false, same = false } = {}) {
  const chat = same ? false : (i + round) % 2 === 0;
  const body = same ? SAME : genBody(i, round, chat);
  let all = '';
  const t0 = now();
  let last = 0, first = 0, seen = 0, pending = '';
  const gaps = [];
  const onData = (c, req) => {
    pending += c.toString();
    let k;
    while ((k = pending.indexOf('\n\n')) >= 0) {
      const ev = pending.slice(0, k);
      pending = pending.slice(k + 2);
      if (!ev.startsWith('data: {')) continue;
      const j = JSON.parse(ev.slice(6));
      const text = j.choices?.[0] ? (chat ? j.choices[0].delta?.content : j.choices[0].text) : '';
      if (!text) continue;
      all += text;
      const t = now();
      if (!first) first = t;
      else gaps.push(t - last);
      last = t;
      if (abortAfter && ++seen === abortAfter) req.destroy();
    }
  };
  const path = chat ? '/v1/chat/completions' : '/v1/completions';
  let r;
  if (slow) {
    const pieces = [];
    const step = Math.ceil(body.length / 8);
    for (let k = 0; k < body.length; k += step) pieces.push(body.slice(k, k + step));
    r = await request(path, null, { pieces, pieceDelay: opt['slow-ms'] / pieces.length, onData });
  } else {
    r = await request(path, body, { onData });
  }
  if (abortAfter) {
    if (seen < abortAfter) failure(`client ${i}: stream ended before the hang-up (${r.status})`);
    else stats.aborted++;
    return;
  }
  try {
    checkStream(r, chat, 1);
  } catch (e) {
    failure(`client ${i} round ${round}${slow ? ' (slow body)' : ''}: ${e.message}`);
    return;
  }
  if (same && sameRef !== null && all !== sameRef) {
    failure(`client ${i} round ${round}: the seeded request gave different text under load`);
    return;
  }
  if (same) stats.same++;
  stats.ok++;
  if (slow) stats.slow++;
  stats.tokens += T;
  // TTFT from the end of the upload: a trickled body is not the server's time
  if (first) stats.ttft.push(first - (r.sentAt || t0));
  stats.itl.push(...gaps);
}

async function badOnce(i, round) {
  if (((i >> 3) + round) % 2 === 0) {
    const r = await request('/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}, ');
    if (r.status === 400 && /not valid JSON/.test(r.body)) stats.bad400++;
    else failure(`client ${i}: malformed JSON answered ${r.status} ${r.error ?? ''} ${String(r.body).slice(0, 120)}`);
  } else {
    const r = await request('/v1/chat/completions', Buffer.alloc(opt.oversize, 'a'));
    if (r.status === 413) stats.big413++;
    else failure(`client ${i}: oversized body answered ${r.status} ${r.error ?? ''}`);
  }
}

async function client(i) {
  for (let round = 0; round < opt.rounds; round++) {
    switch (i % 8) {
      case 3: await streamOnce(i, round, { abortAfter: 2 + (i % 5) }); break;
      case 5: await badOnce(i, round); break;
      case 7: await streamOnce(i, round, { slow: true }); break;
      case 6: await streamOnce(i, round, { same: true }); break;
      default: await streamOnce(i, round);
    }
  }
}

async function metrics() {
  const r = await request('/metrics', null, { method: 'GET' });
  const m = {};
  for (const l of String(r.body).split('\n')) {
    const [k, v] = l.split(' ');
    if (k && !k.startsWith('#') && v !== undefined) m[k] = Number(v);
  }
  return m;
}

const pct = (a, p) => {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

// the seeded request's text with nothing else running
{
  const r = await request('/v1/completions', SAME);
  const chunks = checkStream(r, false, 1);
  sameRef = chunks.map((c) => c.choices[0]?.text ?? '').join('');
  stats.tokens = 0;
}
const t0 = now();
await Promise.all(Array.from({ length: opt.clients }, (_, i) => client(i)));
const wall = (now() - t0) / 1000;

// The server must come back to idle.
let m = {};
const idle = (x) => x.loom_running_sequences === 0 && x.loom_queue_depth === 0 &&
  x.loom_kv_blocks_used === 0 && x.loom_requests_in_flight === 0;
for (let k = 0; k < 100 && !idle((m = await metrics())); k++) await sleep(50);
if (!idle(m)) failure(`not idle afterwards: ${JSON.stringify(m)}`);
agent.destroy();

const f = (x) => x.toFixed(1);
const total = stats.ok + stats.aborted + stats.bad400 + stats.big413;
console.log(`clients ${opt.clients} x rounds ${opt.rounds}, max_tokens ${T}: ${wall.toFixed(2)} s`);
console.log(`requests: ${stats.ok} streamed ok (${stats.slow} with slow bodies), ${stats.aborted} hung up mid-stream, ` +
  `${stats.bad400} malformed -> 400, ${stats.big413} oversized -> 413, ${stats.same} seeded repeats as alone; ` +
  `${(total / wall).toFixed(1)} requests/s, ` +
  `${(stats.ok / wall).toFixed(2)} streams/s, ${(stats.tokens / wall).toFixed(0)} tokens/s`);
console.log(`TTFT ms: p50 ${f(pct(stats.ttft, 50))} p99 ${f(pct(stats.ttft, 99))}; ` +
  `inter-token ms: p50 ${f(pct(stats.itl, 50))} p99 ${f(pct(stats.itl, 99))}`);
console.log(`server afterwards: running ${m.loom_running_sequences}, queue ${m.loom_queue_depth}, ` +
  `kv blocks used ${m.loom_kv_blocks_used}, disconnects ${m.loom_client_disconnects_total}`);
if (stats.failures.length) {
  console.log(`FAIL: ${stats.failures.length} problems:\n  ${stats.failures.slice(0, 20).join('\n  ')}`);
  process.exit(1);
}
console.log('load test passed');
