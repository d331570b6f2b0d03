// llama.cpp as a benchmark peer (node-llama-cpp's prebuilt binaries: the best ggml CPU variant for
// this machine is loaded at start). One JSON request per stdin line, one JSON reply per stdout line:
//   {"op": "complete", "warm": [ids], "rest": [ids], "n": N, "lookup": bool}
//       -> {"tokens": [ids], "ms": total, "ms_first": to the first token}; the cache holds `warm`
//          before the clock starts (the bench's warm-cache setup), then `rest` + N greedy tokens.
//   {"op": "prefill", "prompt": [ids]} -> {"ms": cold prompt processing, logits of the last token}
//   {"op": "pass", "context": [ids], "k": K, "reps": R} -> {"ms": [R times]}: one batch of K tokens
//          after `context`, next-token output at every one of them (what a verify pass computes)
//   {"op": "info"} -> {"system": llama.cpp's system info, "build": ...}
import {getLlama, LlamaLogLevel, InputLookupTokenPredictor} from "node-llama-cpp";
import readline from "node:readline";

const [modelPath, threadsArg, ctxArg] = process.argv.slice(2);
const threads = Number(threadsArg), contextSize = Number(ctxArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({contextSize, threads, batchSize: 512, sequences: 2});
const plain = ctx.getSequence();
const lookup = ctx.getSequence({tokenPredictor: new InputLookupTokenPredictor({predictionLength: {max: 10}})});

// Make the sequence's cache hold exactly `tokens`, reusing the prefix it already holds (untimed setup).
async function holdOnly(seq, tokens) {
  const same = Math.min(seq.compareContextTokens(tokens).firstDifferentIndex, tokens.length);
  if (same < seq.nextTokenIndex) await seq.eraseContextTokenRanges([{start: same, end: seq.nextTokenIndex}]);
  if (same < tokens.length) await seq.evaluateWithoutGeneratingNewTokens(tokens.slice(same));
}

async function complete({warm, rest, n, lookup: useLookup}) {
  const seq = useLookup ? lookup : plain;
  await holdOnly(seq, warm);
  const tokens = [];
  const t0 = performance.now();
  let first = null;
  for await (const t of seq.evaluate(rest, {temperature: 0})) {
    if (first === null) first = performance.now() - t0;
    tokens.push(t);
    if (tokens.length >= n) break;
  }
  return {tokens, ms: performance.now() - t0, ms_first: first};
}

async function prefill({prompt}) {
  await plain.clearHistory();
  const t0 = performance.now();
  await plain.controlledEvaluate([...prompt.slice(0, -1), [prompt.at(-1), {generateNext: {token: true}}]]);
  return {ms: performance.now() - t0};
}

async function pass({context, k, reps}) {
  await holdOnly(plain, context);
  const batch = context.slice(-k).map(t => [t, {generateNext: {token: true}}]);
  const ms = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    await plain.controlledEvaluate(batch);
    ms.push(performance.now() - t0);
    await plain.eraseContextTokenRanges([{start: context.length, end: context.length + k}]);
  }
  return {ms};
}

const ops = {complete, prefill, pass, info: async () => ({system: llama.systemInfo, build: llama.buildType,
  math_cores: llama.cpuMathCores, llama_cpp: llama.llamaCppRelease})};
for await (const line of readline.createInterface({input: process.stdin})) {
  let reply;
  try {
    const req = JSON.parse(line);
    reply = await ops[req.op](req);
  } catch (e) {
    reply = {error: String(e && e.stack || e)};
  }
  process.stdout.write(JSON.stringify(reply) + "\n");
}
