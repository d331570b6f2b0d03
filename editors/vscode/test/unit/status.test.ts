import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  formatAccepted,
  formatLatency,
  normalizeStatus,
  progressStep,
  renderStatus,
  shortModelName,
  upgradeText,
} from '../../src/status';

const ready = normalizeStatus({
  state: 'ready',
  message: '',
  target: 'google/gemma-3-270m',
  draft: '/home/u/.cache/completiond/draft',
  device: 'cpu',
  lastLatencyMs: 84.4,
  meanAccepted: 2.375,
});

test('ready status shows model, device, latency and mean accepted tokens per pass', () => {
  const r = renderStatus({ client: 'running', server: ready });
  assert.equal(r.text, '$(zap) gemma-3-270m · cpu · 84 ms · 2.4 tok/pass');
  assert.equal(r.severity, 'normal');
  assert.match(r.tooltip, /Target: google\/gemma-3-270m/);
  assert.match(r.tooltip, /Draft: \/home\/u\/\.cache\/completiond\/draft/);
  assert.match(r.tooltip, /Mean accepted tokens per pass: 2\.38/);
  assert.match(r.tooltip, /Click to show the completiond log/);
});

test('before the first completion only model and device are shown', () => {
  const s = { ...ready, lastLatencyMs: null, meanAccepted: null };
  assert.equal(renderStatus({ client: 'running', server: s }).text, '$(zap) gemma-3-270m · cpu');
  // the editor's own round trip stands in when the server does not report a latency
  assert.equal(renderStatus({ client: 'running', server: s, clientLatencyMs: 1500 }).text, '$(zap) gemma-3-270m · cpu · 1.50 s');
});

test('loading and error states', () => {
  const loading = renderStatus({ client: 'running', server: { ...ready, state: 'loading', message: 'converting GGUF' } });
  assert.equal(loading.text, '$(sync~spin) gemma-3-270m: loading…');
  assert.match(loading.tooltip, /loading: converting GGUF/);
  const error = renderStatus({ client: 'running', server: { ...ready, state: 'error', message: 'daemon unreachable' } });
  assert.equal(error.severity, 'error');
  assert.equal(error.text, '$(error) gemma-3-270m');
  assert.match(error.tooltip, /daemon unreachable/);
});

test('client states without a server status', () => {
  assert.equal(renderStatus({ client: 'starting' }).text, '$(sync~spin) completiond');
  assert.equal(renderStatus({ client: 'running' }).text, '$(sync~spin) completiond');
  const missing = renderStatus({ client: 'missing' });
  assert.equal(missing.severity, 'warning');
  assert.match(missing.tooltip, /pipx install \/path\/to\/completiond/);
  assert.doesNotMatch(missing.tooltip, /pip install completiond\b/);
  assert.match(missing.tooltip, /completiond\.serverPath/);
  assert.equal(renderStatus({ client: 'failed' }).severity, 'error');
  assert.equal(renderStatus({ client: 'stopped', server: ready }).text, '$(circle-slash) completiond');
});

test('normalizeStatus tolerates partial or bad params', () => {
  assert.deepEqual(normalizeStatus(undefined), {
    state: 'ready',
    message: '',
    target: '',
    draft: null,
    device: '',
    lastLatencyMs: null,
    meanAccepted: null,
  });
  const s = normalizeStatus({ state: 'weird', draft: '', lastLatencyMs: 'fast', meanAccepted: Number.NaN });
  assert.equal(s.state, 'ready');
  assert.equal(s.draft, null);
  assert.equal(s.lastLatencyMs, null);
  assert.equal(s.meanAccepted, null);
  assert.equal(renderStatus({ client: 'running', server: s }).text, '$(zap) completiond');
});

test('shortModelName and number formats', () => {
  assert.equal(shortModelName('google/gemma-3-270m'), 'gemma-3-270m');
  assert.equal(shortModelName('/x/y/gemma-3-270m-it-Q4_K_M.gguf'), 'gemma-3-270m-it-Q4_K_M');
  assert.equal(shortModelName('C:\\models\\tiny\\'), 'tiny');
  assert.equal(shortModelName('default'), 'default');
  assert.equal(shortModelName(''), '');
  assert.equal(formatLatency(null), '–');
  assert.equal(formatLatency(999.6), '1000 ms');
  assert.equal(formatLatency(12345), '12.3 s');
  assert.equal(formatAccepted(3), '3.0');
  assert.equal(formatAccepted(undefined), '–');
});

test('while the daemon starts the status bar shows its phase and seconds', () => {
  const s = normalizeStatus({
    state: 'loading', message: 'completiond: importing torch (3 s)', target: 'default', device: 'auto',
    phase: 'importing torch', elapsedS: 3.4, progress: null,
  });
  assert.equal(renderStatus({ client: 'running', server: s }).text, '$(sync~spin) default: importing torch (3 s)');
  const conv = normalizeStatus({ state: 'loading', message: 'completiond: converting (40 %, 12 s)',
    target: 'qwen2.5-coder-0.5b', phase: 'converting', elapsedS: 12, progress: 40 });
  assert.equal(renderStatus({ client: 'running', server: conv }).text, '$(sync~spin) qwen2.5-coder-0.5b: converting 40 % (12 s)');
  const again = normalizeStatus({ state: 'restarting', message: 'completiond: daemon stopped \u2014 restarting' });
  const r = renderStatus({ client: 'running', server: again });
  assert.equal(r.text, '$(sync~spin) completiond: daemon stopped \u2014 restarting');
  assert.equal(r.severity, 'warning');
});

test('the progress notification follows the start and closes when ready', () => {
  const conv = normalizeStatus({ state: 'loading', message: 'completiond: converting (40 %, 12 s)', progress: 40 });
  assert.deepEqual(progressStep(conv, 10), { message: 'converting (40 %, 12 s)', increment: 30, percent: 40, done: false });
  const plain = normalizeStatus({ state: 'loading', message: 'completiond: importing torch (1 s)' });
  assert.deepEqual(progressStep(plain, 0), { message: 'importing torch (1 s)', percent: 0, done: false });
  const ready = normalizeStatus({ state: 'ready', message: 'completiond: ready: qwen on cpu' });
  assert.equal(progressStep(ready, 40).done, true);
  assert.equal(progressStep(normalizeStatus({ state: 'restarting', message: 'x' }), 0).done, false);
});

test('a named model shows the weights form it runs, and the tooltip says why it is the default', () => {
  const s = normalizeStatus({
    state: 'ready', message: '', target: 'qwen2.5-coder-1.5b@int4', draft: null, device: 'cpu', quant: 'int4',
    defaultReason: 'qwen2.5-coder-1.5b@int4 is the default here: its passes measured 1.10x the 0.5B\'s',
    lastLatencyMs: null, meanAccepted: null,
  });
  assert.equal(s.quant, 'int4');
  const r = renderStatus({ client: 'running', server: s });
  assert.equal(r.text, '$(zap) qwen2.5-coder-1.5b@int4 · cpu');
  assert.match(r.tooltip, /Target: qwen2\.5-coder-1\.5b@int4/);
  assert.match(r.tooltip, /Why: qwen2\.5-coder-1\.5b@int4 is the default here/);
  // a target named in the settings has no default reason: the tooltip says it was named
  const named = renderStatus({ client: 'running', server: { ...s, defaultReason: null } });
  assert.match(named.tooltip, /Why: named \(completiond\.target or serve --target\)/);
});

test('a background upgrade shows its phase and progress next to the model that answers now', () => {
  const s = normalizeStatus({
    state: 'ready', message: 'completiond: ready: qwen2.5-coder-0.5b@int8 on cpu', target: 'qwen2.5-coder-0.5b@int8',
    device: 'cpu', lastLatencyMs: null, meanAccepted: null,
    upgrade: { model: 'qwen2.5-coder-1.5b@int4', phase: 'converting', progress: 0.42, why: 'converting in the background' },
  });
  const r = renderStatus({ client: 'running', server: s });
  assert.equal(r.text, '$(zap) qwen2.5-coder-0.5b@int8 · cpu · converting qwen2.5-coder-1.5b@int4 42 %');
  assert.match(r.tooltip, /Upgrade: qwen2\.5-coder-1\.5b@int4 converting — converting in the background/);
  const loading = { ...s, upgrade: { ...s.upgrade!, phase: 'loading', progress: 1 } };
  assert.equal(upgradeText(loading.upgrade), 'loading qwen2.5-coder-1.5b@int4');
  // switched: the new model answers and the status bar says nothing more of it
  const done = normalizeStatus({ ...s, target: 'qwen2.5-coder-1.5b@int4', upgrade: { ...s.upgrade!, phase: 'switched' } });
  assert.equal(renderStatus({ client: 'running', server: done }).text, '$(zap) qwen2.5-coder-1.5b@int4 · cpu');
  assert.match(renderStatus({ client: 'running', server: done }).tooltip, /Upgrade: qwen2\.5-coder-1\.5b@int4 switched/);
  // an older server sends no upgrade: nothing is shown
  assert.equal(normalizeStatus({ state: 'ready', upgrade: null }).upgrade, undefined);
});
