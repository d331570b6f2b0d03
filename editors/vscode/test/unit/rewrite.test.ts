import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { describeRewriteResult, rewriteParams, validateInstruction } from '../../src/rewrite';

test('rewrite is sent as workspace/executeCommand completiond.rewrite with one argument object', () => {
  const range = { start: { line: 3, character: 0 }, end: { line: 5, character: 12 } };
  assert.deepEqual(rewriteParams('file:///ws/a.py', range, '  add type hints \n'), {
    command: 'completiond.rewrite',
    arguments: [{ uri: 'file:///ws/a.py', range, instruction: 'add type hints' }],
  });
});

test('instruction must not be blank', () => {
  assert.ok(validateInstruction('   '));
  assert.equal(validateInstruction('use pathlib'), undefined);
});

test('server answers are described', () => {
  assert.deepEqual(describeRewriteResult({ applied: true, text: 'a\nb' }), {
    ok: true,
    message: 'completiond: rewrote the selection (2 lines).',
  });
  assert.equal(describeRewriteResult({ applied: true, text: 'x' }).message, 'completiond: rewrote the selection (1 line).');
  assert.equal(describeRewriteResult({ applied: false, text: 'x' }).ok, false);
  assert.match(describeRewriteResult({ applied: false, text: 'x' }).message, /did not apply/);
  assert.match(describeRewriteResult(null).message, /no rewrite/);
});

test('a rewrite into the same text says so (nothing in the editor changes)', () => {
  assert.deepEqual(describeRewriteResult({ applied: true, text: 'def f():' }, 'def f():'), {
    ok: true,
    unchanged: true,
    message: 'completiond: the rewrite left the selection as it was (1 line).',
  });
  assert.equal(describeRewriteResult({ applied: true, text: 'def g():' }, 'def f():').unchanged, undefined);
});
