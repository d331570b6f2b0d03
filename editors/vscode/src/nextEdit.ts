/**
 * Next-edit suggestions (`completiond/nextEdit`): the edit the user likely makes next, shown in
 * place as decorations: the text it removes struck through, the line(s) as they will read after
 * the line, and, when the edit is on other lines than the cursor, a hint at the cursor saying where
 * it is. Tab jumps to it when it is away, else applies it; Escape hides it. It is asked for after
 * an edit and a pause (`completiond.nextEdit.delayMs`), or with the command "Suggest next edit".
 *
 * The pure part (params, where an edit is, the lines it makes) is unit-tested without VS Code.
 */
import type * as vscodeTypes from 'vscode';

export const NEXT_EDIT_REQUEST = 'completiond/nextEdit';
export const VISIBLE_CONTEXT = 'completiond.nextEditVisible';
export const DELAY_MS = 500;

export interface LspPosition {
  line: number;
  character: number;
}
export interface LspRange {
  start: LspPosition;
  end: LspPosition;
}
export interface LspEdit {
  range: LspRange;
  text: string;
}
export interface NextEditResult {
  edits: LspEdit[];
  version: number;
  cancelled?: boolean;
  ms?: number;
  target_passes?: number;
}

export function nextEditParams(uri: string, version: number, line?: number, character?: number): object {
  const params: Record<string, unknown> = { textDocument: { uri }, version };
  if (line !== undefined && character !== undefined) params.position = { line, character };
  return params;
}

/** The edits of a result, sorted, or [] for a cancelled or malformed one. */
export function editsOf(result: unknown): LspEdit[] {
  const r = (result && typeof result === 'object' ? result : {}) as Partial<NextEditResult>;
  if (r.cancelled || !Array.isArray(r.edits)) return [];
  return [...r.edits].sort((a, b) => a.range.start.line - b.range.start.line
    || a.range.start.character - b.range.start.character);
}

/** Is the first edit on other lines than the cursor's? */
export function isAway(cursorLine: number, edits: LspEdit[]): boolean {
  if (edits.length === 0) return false;
  const e = edits[0];
  return cursorLine < e.range.start.line || cursorLine > e.range.end.line;
}

/**
 * The lines `lines[first..]` as they read after the edits that fall in them (characters are string
 * indices: UTF-16 code units, as in VS Code and LSP's default encoding).
 */
export function preview(lines: string[], first: number, edits: LspEdit[]): string[] {
  const offsets: number[] = [];
  let total = 0;
  for (const l of lines) {
    offsets.push(total);
    total += l.length + 1;
  }
  const text = lines.join('\n');
  const at = (p: LspPosition) => offsets[p.line - first] + p.character;
  let out = '';
  let pos = 0;
  for (const e of edits) {
    out += text.slice(pos, at(e.range.start)) + e.text;
    pos = at(e.range.end);
  }
  return (out + text.slice(pos)).split('\n');
}

interface Shown {
  uri: string;
  version: number;
  edits: LspEdit[];
}

interface Client {
  isRunning(): boolean;
  sendRequest(method: string, params: object, token?: vscodeTypes.CancellationToken): Promise<unknown>;
}

/** Commands, keys (package.json: when completiond.nextEditVisible) and the pause trigger. */
export function registerNextEdit(vscode: typeof vscodeTypes, context: vscodeTypes.ExtensionContext,
                                 getClient: () => Client | undefined): void {
  const removed = vscode.window.createTextEditorDecorationType({
    textDecoration: 'line-through',
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
  });
  const added = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor('editorGhostText.foreground'), margin: '0 0 0 2em' },
  });
  const hint = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor('editorCodeLens.foreground'), margin: '0 0 0 2em' },
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.modifiedForeground'),
  });
  let shown: Shown | undefined;
  let pending: vscodeTypes.CancellationTokenSource | undefined;
  let timer: NodeJS.Timeout | undefined;

  const setVisible = (on: boolean) => void vscode.commands.executeCommand('setContext', VISIBLE_CONTEXT, on);
  const asRange = (r: LspRange) => new vscode.Range(r.start.line, r.start.character, r.end.line, r.end.character);

  function clear(): void {
    shown = undefined;
    for (const editor of vscode.window.visibleTextEditors) {
      editor.setDecorations(removed, []);
      editor.setDecorations(added, []);
      editor.setDecorations(hint, []);
    }
    setVisible(false);
  }

  function draw(editor: vscodeTypes.TextEditor): void {
    if (!shown || editor.document.uri.toString() !== shown.uri) return;
    const edits = shown.edits;
    editor.setDecorations(removed, edits.filter((e) => e.range.start.line !== e.range.end.line
      || e.range.start.character !== e.range.end.character).map((e) => asRange(e.range)));
    const first = edits[0].range.start.line;
    const last = Math.max(...edits.map((e) => e.range.end.line));
    const lines: string[] = [];
    for (let l = first; l <= last; l++) lines.push(editor.document.lineAt(l).text);
    const after = preview(lines, first, edits).join(' ⏎ ');
    editor.setDecorations(added, [{ range: editor.document.lineAt(last).range,
                                    renderOptions: { after: { contentText: `→ ${after.trim()}` } } }]);
    const cursor = editor.selection.active.line;
    editor.setDecorations(hint, isAway(cursor, edits) ? [{
      range: editor.document.lineAt(cursor).range,
      renderOptions: { after: { contentText: `${first > cursor ? '⇣' : '⇡'} next edit at line ${first + 1} (Tab)` } },
    }] : []);
  }

  async function request(editor: vscodeTypes.TextEditor | undefined = vscode.window.activeTextEditor): Promise<void> {
    const client = getClient();
    if (!editor || !client || !client.isRunning()) return;
    pending?.cancel();
    const source = new vscode.CancellationTokenSource();
    pending = source;
    const doc = editor.document;
    const version = doc.version;
    const pos = editor.selection.active;
    let result: unknown;
    try {
      result = await client.sendRequest(NEXT_EDIT_REQUEST,
        nextEditParams(doc.uri.toString(), version, pos.line, pos.character), source.token);
    } catch {
      return; // cancelled, outdated, or the server is gone: nothing to show
    }
    if (pending !== source || doc.version !== version) return;
    const edits = editsOf(result);
    if (edits.length === 0) return;
    shown = { uri: doc.uri.toString(), version, edits };
    setVisible(true);
    draw(editor);
  }

  async function accept(): Promise<boolean> {
    const editor = vscode.window.activeTextEditor;
    const s = shown;
    if (!editor || !s || editor.document.uri.toString() !== s.uri || editor.document.version !== s.version) {
      clear();
      return false;
    }
    if (isAway(editor.selection.active.line, s.edits)) { // jump first
      const p = s.edits[0].range.start;
      editor.selection = new vscode.Selection(p.line, p.character, p.line, p.character);
      editor.revealRange(asRange(s.edits[0].range));
      draw(editor);
      return true;
    }
    const edit = new vscode.WorkspaceEdit();
    for (const e of s.edits) edit.replace(editor.document.uri, asRange(e.range), e.text);
    clear();
    return vscode.workspace.applyEdit(edit);
  }

  context.subscriptions.push(
    removed, added, hint,
    vscode.commands.registerCommand('completiond.nextEdit', () => request()),
    vscode.commands.registerCommand('completiond.acceptNextEdit', accept),
    vscode.commands.registerCommand('completiond.dismissNextEdit', clear),
    vscode.workspace.onDidChangeTextDocument((e) => {
      if (e.contentChanges.length === 0) return;
      if (shown && e.document.uri.toString() === shown.uri) clear(); // computed for the text before
      const editor = vscode.window.activeTextEditor;
      if (!editor || editor.document !== e.document) return;
      const delay = vscode.workspace.getConfiguration('completiond').get<number>('nextEdit.delayMs', DELAY_MS);
      if (timer) clearTimeout(timer);
      if (delay < 0) return; // < 0: only on request
      timer = setTimeout(() => void request(editor), delay);
    }),
    vscode.window.onDidChangeTextEditorSelection((e) => draw(e.textEditor)),
    { dispose: () => { if (timer) clearTimeout(timer); pending?.cancel(); } },
  );
}
