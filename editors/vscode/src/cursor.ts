/**
 * `completiond/cursor`: where the editor's cursor rests, sent (debounced) so that the daemon warms
 * the prompt of a completion there before the user types (LSP itself has no cursor message).
 * Pure module: unit-tested without VS Code.
 */

export const CURSOR_NOTIFICATION = 'completiond/cursor';
export const CURSOR_DEBOUNCE_MS = 150;

export interface CursorParams {
  textDocument: { uri: string };
  position: { line: number; character: number };
}

/** Positions are VS Code's: UTF-16 code units, the encoding the language client negotiates. */
export function cursorParams(uri: string, line: number, character: number): CursorParams {
  return { textDocument: { uri }, position: { line, character } };
}

/** Calls `send` with the last value given, once `delayMs` passed without a newer one. */
export class Debounced<T> {
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly send: (value: T) => void,
    private readonly delayMs: number = CURSOR_DEBOUNCE_MS,
  ) {}

  push(value: T): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.send(value);
    }, this.delayMs);
  }

  dispose(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
