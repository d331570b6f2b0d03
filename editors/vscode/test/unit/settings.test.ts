import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  DEFAULTS,
  ConfigReader,
  didChangeConfigurationParams,
  expandPath,
  readLaunch,
  readServerSettings,
  sameSettings,
} from '../../src/settings';

const reader = (values: Record<string, unknown>): ConfigReader => ({
  get: <T>(key: string) => values[key] as T | undefined,
});

test('defaults when nothing is set', () => {
  assert.deepEqual(readServerSettings(reader({})), {
    mode: 'combined',
    maxTokens: 64,
    multiline: true,
    debounceMs: 75,
    socket: null,
    autostart: true,
    target: null,
    draft: null,
    dtype: null,
    device: null,
    suggestions: 1,
    streaming: false,
  });
  assert.deepEqual(readServerSettings(reader({})), { ...DEFAULTS });
});

test('settings map to initializationOptions with the contract key names', () => {
  const s = readServerSettings(
    reader({
      mode: 'pld',
      maxTokens: 128,
      multiline: true,
      debounceMs: 0,
      socket: '/run/c.sock',
      autostart: false,
      target: '/models/tiny',
      draft: 'none',
      dtype: 'float32',
      device: 'cpu',
      suggestions: 2,
      serverPath: '/x/completiond-lsp',
    }),
  );
  assert.deepEqual(s, {
    mode: 'pld',
    maxTokens: 128,
    multiline: true,
    debounceMs: 0,
    socket: '/run/c.sock',
    autostart: false,
    target: '/models/tiny',
    draft: 'none',
    dtype: 'float32',
    device: 'cpu',
    suggestions: 2,
    streaming: false,
  });
  // the contract's keys, plus the optional daemon model keys; nothing else (no serverPath)
  assert.deepEqual(Object.keys(s).sort(), [
    'autostart',
    'debounceMs',
    'device',
    'draft',
    'dtype',
    'maxTokens',
    'mode',
    'multiline',
    'socket',
    'streaming',
    'suggestions',
    'target',
  ]);
});

test('malformed values fall back or are clamped', () => {
  const s = readServerSettings(
    reader({ mode: 'turbo', maxTokens: -5, multiline: 'yes', debounceMs: 1e9, socket: '   ', autostart: null }),
  );
  assert.equal(s.mode, 'combined');
  assert.equal(s.maxTokens, 1);
  assert.equal(s.multiline, true);
  assert.equal(s.debounceMs, 5000);
  assert.equal(s.socket, null);
  assert.equal(s.autostart, true);
  assert.equal(readServerSettings(reader({ maxTokens: 12.6 })).maxTokens, 13);
  // the daemon's cap, not lower
  assert.equal(readServerSettings(reader({ maxTokens: 2048 })).maxTokens, 2048);
  assert.equal(readServerSettings(reader({ maxTokens: 5000 })).maxTokens, 2048);
  assert.equal(readServerSettings(reader({ multiline: false })).multiline, false);
  assert.equal(readServerSettings(reader({ maxTokens: Number.NaN })).maxTokens, 64);
  assert.equal(readServerSettings(reader({ socket: ' /tmp/x.sock ' })).socket, '/tmp/x.sock');
  assert.equal(readServerSettings(reader({ dtype: 'int3', device: 'tpu', target: '' })).dtype, null);
  assert.equal(readServerSettings(reader({ device: 'tpu' })).device, null);
  assert.equal(readServerSettings(reader({ target: '  ' })).target, null);
  // a named model with its weights form passes through as written (the daemon parses NAME@FORM)
  assert.equal(readServerSettings(reader({ target: 'qwen2.5-coder-1.5b@int4' })).target, 'qwen2.5-coder-1.5b@int4');
});

test('didChangeConfiguration params nest the settings under "completiond"', () => {
  const s = readServerSettings(reader({ mode: 'ar' }));
  const p = didChangeConfigurationParams(s);
  assert.deepEqual(p, { settings: { completiond: s } });
  assert.notEqual(p.settings.completiond, s, 'a copy, not the same object');
});

test('sameSettings detects real changes only', () => {
  const a = readServerSettings(reader({}));
  assert.equal(sameSettings(undefined, a), false);
  assert.equal(sameSettings(a, readServerSettings(reader({}))), true);
  assert.equal(sameSettings(a, readServerSettings(reader({ maxTokens: 65 }))), false);
});

test('server launch: default command, args, path expansion', () => {
  assert.deepEqual(readLaunch(reader({})), { command: 'completiond-lsp', args: [] });
  assert.deepEqual(readLaunch(reader({ serverPath: '  ' })), { command: 'completiond-lsp', args: [] });
  assert.deepEqual(
    readLaunch(reader({ serverPath: '${workspaceFolder}/.venv/bin/completiond-lsp', serverArgs: ['--x', 3, '~/y'] }), {
      home: '/home/u',
      workspaceFolder: '/ws',
    }),
    { command: '/ws/.venv/bin/completiond-lsp', args: ['--x', '/home/u/y'] },
  );
  assert.equal(expandPath('~', { home: '/h' }), '/h');
  assert.equal(expandPath('~user/x', { home: '/h' }), '~user/x');
  assert.equal(expandPath('${userHome}/bin/c', { home: '/h' }), '/h/bin/c');
});
