import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { test } from 'node:test';

import { findExecutable, missingServerMessage } from '../../src/serverPath';

test('bare names are searched on PATH in order', () => {
  const exes = new Set(['/b/completiond-lsp', '/c/completiond-lsp']);
  const found = findExecutable('completiond-lsp', {
    env: { PATH: '/a:/b:/c' },
    platform: 'linux',
    isExecutable: (f) => exes.has(f),
  });
  assert.equal(found, '/b/completiond-lsp');
  assert.equal(findExecutable('completiond-lsp', { env: { PATH: '/a' }, platform: 'linux', isExecutable: () => false }), undefined);
  assert.equal(findExecutable('completiond-lsp', { env: {}, platform: 'linux', isExecutable: () => true }), undefined);
  assert.equal(findExecutable('', { env: { PATH: '/a' }, platform: 'linux', isExecutable: () => true }), undefined);
});

test('paths are resolved against cwd, not searched on PATH', () => {
  const seen: string[] = [];
  const isExecutable = (f: string) => (seen.push(f), f === '/ws/.venv/bin/completiond-lsp');
  assert.equal(
    findExecutable('.venv/bin/completiond-lsp', { env: { PATH: '/usr/bin' }, platform: 'linux', cwd: '/ws', isExecutable }),
    '/ws/.venv/bin/completiond-lsp',
  );
  assert.deepEqual(seen, ['/ws/.venv/bin/completiond-lsp']);
});

test('Windows uses PATHEXT', () => {
  const found = findExecutable('completiond-lsp', {
    env: { Path: 'C:\\py\\Scripts', PATHEXT: '.COM;.EXE' },
    platform: 'win32',
    isExecutable: (f) => f === 'C:\\py\\Scripts\\completiond-lsp.exe',
  });
  assert.equal(found, 'C:\\py\\Scripts\\completiond-lsp.exe');
});

test('the real file check: executable files only', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cd-path-'));
  try {
    const exe = path.join(dir, 'completiond-lsp');
    fs.writeFileSync(exe, '#!/bin/sh\n');
    assert.equal(findExecutable('completiond-lsp', { env: { PATH: dir } }), process.platform === 'win32' ? exe : undefined);
    fs.chmodSync(exe, 0o755);
    assert.equal(findExecutable('completiond-lsp', { env: { PATH: dir } }), exe);
    assert.equal(findExecutable(dir, { env: { PATH: '' } }), undefined, 'a directory is not an executable');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('the missing-server message names both fixes', () => {
  const m = missingServerMessage('completiond-lsp');
  // completiond is not on PyPI: the fix installs from a checkout (pip -e or pipx) and points to the README
  assert.doesNotMatch(m, /pip install completiond\b/);
  assert.match(m, /pip install torch==2\.13\.0 && pip install -e '\/path\/to\/completiond\[default-model\]'/);
  assert.match(m, /pipx install \/path\/to\/completiond/);
  assert.match(m, /Set up a fresh machine/);
  assert.match(m, /completiond\.serverPath/);
  assert.match(missingServerMessage('/x/lsp', 'spawn ENOENT'), /"\/x\/lsp" was not found \(spawn ENOENT\)/);
});
