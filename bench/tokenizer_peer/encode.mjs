// The peer half of bench/tokenizer.sh: Hugging Face `tokenizers` (the Rust
// library as a native Node addon, version pinned in package-lock.json)
// loads the same tokenizer.json and encodes the same files as
// bench/bench_tokenizer.c, printing the same raw lines:
//
//   node encode.mjs TOKENIZER.json [--reps R] [--load-reps L]
//                   [--check-ids DIR] FILE...
//
//   peer <name> <version>               (first line)
//   load <ms>                           (each of L loads)
//   enc <file> <bytes> <ids> <sec>      (each of R timed encodes, after one
//                                        untimed warm-up per file)
//
// Text only: addSpecialTokens false (loom: LOOM_TOK_NO_SPECIAL). A timed
// encode is the awaited encode() plus getIds(), which is what a caller needs
// to get the ids into JS. Run with RAYON_NUM_THREADS=1 (tokenizer.sh does)
// so the library cannot use more than one core.
//
// --check-ids DIR: nothing is timed; the ids of FILE must equal
// DIR/<basename of FILE>.ids (bench_tokenizer --ids-out). The first
// difference is printed with the tokens around it and the exit code is 1.
import { readFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');
const here = dirname(fileURLToPath(import.meta.url));
const version = JSON.parse(readFileSync(join(here, 'node_modules/tokenizers/package.json'), 'utf8')).version;

let json = null, checkDir = null, reps = 5, loadReps = 1;
const files = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--reps') reps = Number(argv[++i]);
  else if (a === '--load-reps') loadReps = Number(argv[++i]);
  else if (a === '--check-ids') checkDir = argv[++i];
  else if (a.startsWith('-')) usage();
  else if (json === null) json = a;
  else files.push(a);
}
if (json === null || !(reps >= 0) || !(loadReps >= 1)) usage();

function usage() {
  console.error('usage: node encode.mjs TOKENIZER.json [--reps R] [--load-reps L] [--check-ids DIR] FILE...');
  process.exit(2);
}

console.log(`peer tokenizers ${version}`);
let tok = null;
for (let r = 0; r < loadReps; r++) {
  const t0 = performance.now();
  tok = Tokenizer.fromFile(json);
  console.log(`load ${(performance.now() - t0).toFixed(3)}`);
}

const utf8 = new TextDecoder('utf-8', { fatal: true });
async function encode(text) {
  const e = await tok.encode(text, null, { addSpecialTokens: false });
  return e.getIds();
}

function show(ids, at) {
  const lo = Math.max(0, at - 3), hi = Math.min(ids.length, at + 4);
  const parts = [];
  for (let i = lo; i < hi; i++) parts.push(`${i === at ? '>' : ''}${ids[i]}:${JSON.stringify(tok.idToToken(ids[i]))}`);
  return parts.join(' ');
}

let rc = 0;
for (const f of files) {
  const bytes = readFileSync(f);
  let text;
  try {
    text = utf8.decode(bytes);
  } catch {
    console.error(`encode.mjs: ${f}: not valid UTF-8`);
    process.exit(1);
  }
  if (checkDir !== null) {
    const mine = await encode(text);
    const theirs = readFileSync(join(checkDir, `${basename(f)}.ids`), 'utf8').split('\n').filter((s) => s !== '').map(Number);
    let i = 0;
    while (i < mine.length && i < theirs.length && mine[i] === theirs[i]) i++;
    if (i < mine.length || i < theirs.length) {
      const ctx = await tok.decode(mine.slice(Math.max(0, i - 8), i + 8), false);
      console.error(`${basename(json)} ${basename(f)}: ids differ at index ${i} (loom ${theirs.length} ids, peer ${mine.length})`);
      console.error(`  loom: ${show(theirs, i)}`);
      console.error(`  peer: ${show(mine, i)}`);
      console.error(`  text near there (peer's ids decoded): ${JSON.stringify(ctx)}`);
      rc = 1;
    }
    continue;
  }
  for (let r = -1; r < reps; r++) {
    const t0 = performance.now();
    const ids = await encode(text);
    const dt = (performance.now() - t0) / 1e3;
    if (r >= 0) console.log(`enc ${basename(f)} ${bytes.length} ${ids.length} ${dt.toFixed(6)}`);
  }
}
process.exit(rc);
