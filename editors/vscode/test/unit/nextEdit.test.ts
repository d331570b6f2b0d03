import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { NEXT_EDIT_REQUEST, VISIBLE_CONTEXT, editsOf, isAway, nextEditParams, preview } from '../../src/nextEdit';

const rename = [
  { range: { start: { line: 2, character: 15 }, end: { line: 2, character: 16 } }, text: 'value' },
  { range: { start: { line: 1, character: 8 }, end: { line: 1, character: 9 } }, text: 'value' },
];

test('the request is completiond/nextEdit {textDocument, version, position}', () => {
  assert.equal(NEXT_EDIT_REQUEST, 'completiond/nextEdit');
  assert.deepEqual(nextEditParams('file:///a.py', 3, 0, 4),
    { textDocument: { uri: 'file:///a.py' }, version: 3, position: { line: 0, character: 4 } });
  assert.deepEqual(nextEditParams('file:///a.py', 3), { textDocument: { uri: 'file:///a.py' }, version: 3 });
});

test('edits are sorted; a cancelled or malformed result has none', () => {
  assert.deepEqual(editsOf({ edits: rename, version: 2 }).map((e) => e.range.start.line), [1, 2]);
  assert.deepEqual(editsOf({ edits: rename, version: 2, cancelled: true }), []);
  assert.deepEqual(editsOf(null), []);
  assert.deepEqual(editsOf({ edits: 'x' }), []);
});

test('away from the cursor when the first edit is on other lines', () => {
  const edits = editsOf({ edits: rename });
  assert.equal(isAway(0, edits), true);
  assert.equal(isAway(1, edits), false);
  assert.equal(isAway(5, edits), true);
  assert.equal(isAway(0, []), false);
});

test('preview: the lines as they read after the edits', () => {
  const lines = ['    y = x * k', '    return y + x'];
  assert.deepEqual(preview(lines, 1, editsOf({ edits: rename })), ['    y = value * k', '    return y + value']);
  const join = [{ range: { start: { line: 1, character: 13 }, end: { line: 2, character: 4 } }, text: ' ' }];
  assert.deepEqual(preview(lines, 1, join), ['    y = x * k return y + x']);
});

test('package.json binds Tab / Escape only while a next edit is shown', () => {
  const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'package.json'), 'utf8'));
  const keys = manifest.contributes.keybindings as { command: string; key: string; when: string }[];
  const tab = keys.find((k) => k.command === 'completiond.acceptNextEdit');
  assert.ok(tab && tab.key === 'tab' && tab.when.includes(VISIBLE_CONTEXT) && tab.when.includes('!inlineSuggestionVisible'));
  const esc = keys.find((k) => k.command === 'completiond.dismissNextEdit');
  assert.ok(esc && esc.when.includes(VISIBLE_CONTEXT));
  const commands = (manifest.contributes.commands as { command: string }[]).map((c) => c.command);
  for (const c of ['completiond.nextEdit', 'completiond.acceptNextEdit', 'completiond.dismissNextEdit']) {
    assert.ok(commands.includes(c), c);
  }
});
