/**
 * The `completiond.rewrite` command as sent to the server (workspace/executeCommand), and how its
 * answer `{applied, text}` is reported. The server applies the edit itself (workspace/applyEdit).
 * Pure module: unit-tested without VS Code.
 */

export const REWRITE_COMMAND = 'completiond.rewrite';

export interface LspPosition {
  line: number;
  character: number;
}
export interface LspRange {
  start: LspPosition;
  end: LspPosition;
}

export interface RewriteArgument {
  uri: string;
  range: LspRange;
  instruction: string;
}

export interface ExecuteCommandParams {
  command: string;
  arguments: [RewriteArgument];
}

export function rewriteParams(uri: string, range: LspRange, instruction: string): ExecuteCommandParams {
  return { command: REWRITE_COMMAND, arguments: [{ uri, range, instruction: instruction.trim() }] };
}

/** For the input box's validateInput: undefined = valid, otherwise the message to show. */
export function validateInstruction(value: string): string | undefined {
  return value.trim() === '' ? 'Describe the change, e.g. "add type hints" or "use a list comprehension".' : undefined;
}

export interface RewriteOutcome {
  ok: boolean;
  message: string;
  /** Applied, but the model wrote the selection as it was: nothing in the editor shows it happened. */
  unchanged?: boolean;
}

/** `original`: the selected text the rewrite was asked for (to tell a rewrite that changed nothing). */
export function describeRewriteResult(result: unknown, original?: string): RewriteOutcome {
  const r = (result && typeof result === 'object' ? result : {}) as { applied?: unknown; text?: unknown };
  if (r.applied === true) {
    const lines = typeof r.text === 'string' ? r.text.split('\n').length : 0;
    const n = `${lines} line${lines === 1 ? '' : 's'}`;
    if (original !== undefined && r.text === original) {
      return { ok: true, unchanged: true, message: `completiond: the rewrite left the selection as it was (${n}).` };
    }
    return { ok: true, message: `completiond: rewrote the selection (${n}).` };
  }
  if (typeof r.text === 'string' && r.text !== '') {
    return { ok: false, message: 'completiond: the editor did not apply the rewrite (the document changed meanwhile?).' };
  }
  return { ok: false, message: 'completiond: the server returned no rewrite.' };
}
