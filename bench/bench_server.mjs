// bench_server.mjs: one stream through `loom serve`, against the engine's
// own numbers, measured in turns on a shared machine.
//   node bench/bench_server.mjs --url http://127.0.0.1:PORT --prompt 1,2,3
//        --engine-cmd 'build/bench/bench_server --model DIR --prompt 1,2,3 -n 128 --reps 1' [--reps 5]
// The engine command prints bench_server's JSON line (ids, decode tok/s,
// TTFT). Validation first: the served greedy completion of the prompt must
// be the engine's ids exactly (return_token_ids). Then reps turns of one
// engine run and one streamed request timed by the client: TTFT = request
// to the first text chunk, decode tok/s = (n - 1) / (last chunk - first
// chunk). Medians and bests of both, and the served / engine ratios.
import { execSync } from 'node:child_process';

const opt = { url: '', 'engine-cmd': '', prompt: '', reps: 5 };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i].replace(/^--/, '');
  if (!(k in opt)) throw new Error(`unknown option ${process.argv[i]}`);
  opt[k] = typeof opt[k] === 'number' ? Number(process.argv[i + 1]) : process.argv[i + 1];
}
const runEngine = () => JSON.parse(execSync(opt['engine-cmd'], { encoding: 'utf8' }));
const engine = runEngine();
const prompt = opt.prompt.split(',').map(Number);
const n = engine.ids.length;
const body = { prompt, max_tokens: n, temperature: 0, ignore_eos: true };
const post = (b) => fetch(`${opt.url}/v1/completions`, {
  method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b) });

const check = await (await post({ ...body, return_token_ids: true })).json();
const got = check.choices?.[0]?.token_ids;
if (JSON.stringify(got) !== JSON.stringify(engine.ids)) {
  console.error(`served ids differ from the engine's:\n  served ${JSON.stringify(got)}\n  engine ${JSON.stringify(engine.ids)}`);
  process.exit(1);
}

const ttft = [], dec = [], eTtft = [], eDec = [];
for (let r = 0; r < opt.reps; r++) {
  const e = runEngine();
  eTtft.push(e.ttft_ms);
  eDec.push(e.decode_tok_s);
  const t0 = performance.now();
  const res = await post({ ...body, stream: true });
  const reader = res.body.getReader();
  const td = new TextDecoder();
  let buf = '', first = 0, last = 0, chunks = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += td.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: {')) continue;
      const c = JSON.parse(ev.slice(6)).choices[0];
      if (!c?.text) continue;
      last = performance.now();
      if (!first) first = last;
      chunks++;
    }
  }
  ttft.push(first - t0);
  dec.push((n - 1) / ((last - first) / 1000));
}
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const f = (x) => x.toFixed(1);
console.log(`one stream, ${n} greedy tokens, ${opt.reps} turns (median / best):`);
console.log(`  engine  decode ${f(med(eDec))} / ${f(Math.max(...eDec))} tok/s, TTFT ${med(eTtft).toFixed(2)} / ${Math.min(...eTtft).toFixed(2)} ms`);
console.log(`  served  decode ${f(med(dec))} / ${f(Math.max(...dec))} tok/s, TTFT ${med(ttft).toFixed(2)} / ${Math.min(...ttft).toFixed(2)} ms (HTTP + SSE, client-timed)`);
console.log(`  served / engine decode: ${(med(dec) / med(eDec)).toFixed(3)} (medians), ${(Math.max(...dec) / Math.max(...eDec)).toFixed(3)} (bests)`);
