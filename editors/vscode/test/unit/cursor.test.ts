import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { CURSOR_NOTIFICATION, Debounced, cursorParams } from '../../src/cursor';

test('the cursor is sent as completiond/cursor {textDocument: {uri}, position}', () => {
  assert.equal(CURSOR_NOTIFICATION, 'completiond/cursor');
  assert.deepEqual(cursorParams('file:///ws/a.py', 4, 7), {
    textDocument: { uri: 'file:///ws/a.py' },
    position: { line: 4, character: 7 },
  });
});

test('cursor moves are debounced: only the last of a burst is sent', async () => {
  const sent: number[] = [];
  const d = new Debounced<number>((v) => sent.push(v), 20);
  d.push(1);
  d.push(2);
  d.push(3);
  assert.deepEqual(sent, []);
  await new Promise((r) => setTimeout(r, 60));
  assert.deepEqual(sent, [3]);
  d.push(4);
  d.dispose();
  await new Promise((r) => setTimeout(r, 60));
  assert.deepEqual(sent, [3]);
});
