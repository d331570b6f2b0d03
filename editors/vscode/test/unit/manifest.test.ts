import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { DEFAULTS, LAUNCH_KEYS, LIVE_KEYS, MAX_TOKENS_LIMIT, MODES } from '../../src/settings';

// out/test/unit -> package root
const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'package.json'), 'utf8'));
const props = manifest.contributes.configuration.properties as Record<
  string,
  { default: unknown; enum?: string[]; maximum?: number }
>;

test('every setting the code reads is declared in package.json with the same default', () => {
  for (const key of LIVE_KEYS) {
    const p = props[`completiond.${key}`];
    assert.ok(p, `completiond.${key} is declared`);
    assert.deepEqual(p.default, DEFAULTS[key], `default of completiond.${key}`);
  }
  for (const key of LAUNCH_KEYS) assert.ok(props[`completiond.${key}`], `completiond.${key} is declared`);
  assert.equal(props['completiond.serverPath'].default, 'completiond-lsp');
  assert.deepEqual(props['completiond.mode'].enum, [...MODES]);
  assert.equal(props['completiond.maxTokens'].maximum, MAX_TOKENS_LIMIT);
});

test('defaults agree with the daemon and completiond-lsp', () => {
  assert.equal(props['completiond.multiline'].default, true);
  assert.equal(props['completiond.debounceMs'].default, 75);
  assert.equal(MAX_TOKENS_LIMIT, 2048);
});

test('no install instruction names the package index (completiond is not on PyPI)', () => {
  const readme = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'README.md'), 'utf8');
  for (const text of [readme, JSON.stringify(manifest)]) {
    assert.doesNotMatch(text, /pip install completiond\b/);
    assert.match(text, /pipx install \/path\/to\/completiond/);
  }
});

test('commands and activation', () => {
  const ids = manifest.contributes.commands.map((c: { command: string }) => c.command);
  assert.ok(ids.includes('completiond.rewriteSelection'));
  assert.ok(ids.includes('completiond.showLog'));
  assert.ok(!ids.includes('completiond.rewrite'), 'completiond.rewrite is the server command; the client registers it');
  const rewrite = manifest.contributes.commands.find((c: { command: string }) => c.command === 'completiond.rewriteSelection');
  assert.equal(`${rewrite.category}: ${rewrite.title}`, 'completiond: Rewrite selection…');
  assert.equal(manifest.main, './dist/extension.js');
  assert.ok(fs.existsSync(path.join(__dirname, '..', '..', 'src', 'extension.js')), 'tsc output exists');
});
