/**
 * completiond for VS Code: starts `completiond-lsp` (stdio) with vscode-languageclient, which
 * registers the server's inline completion provider (LSP 3.18 textDocument/inlineCompletion),
 * code actions and commands. This file only glues VS Code to the pure modules:
 *   settings.ts   completiond.* settings -> initializationOptions / didChangeConfiguration
 *   status.ts     completiond/status notification -> status bar item
 *   rewrite.ts    "completiond: Rewrite selection…" -> workspace/executeCommand completiond.rewrite
 *   cursor.ts     cursor moves -> completiond/cursor (debounced): the daemon warms the prompt there
 *   serverPath.ts finding the executable, and the message with the fix when it is missing
 */
import * as os from 'os';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from 'vscode-languageclient/node';

import { CURSOR_NOTIFICATION, CursorParams, Debounced, cursorParams } from './cursor';
import { describeRewriteResult, rewriteParams, validateInstruction } from './rewrite';
import { registerNextEdit } from './nextEdit';
import { INSTALL_HINT, findExecutable, missingServerMessage } from './serverPath';
import {
  ConfigReader,
  LAUNCH_KEYS,
  SECTION,
  ServerSettings,
  didChangeConfigurationParams,
  readLaunch,
  readServerSettings,
  sameSettings,
} from './settings';
import {
  ClientState,
  ServerStatus,
  StatusView,
  isStarting,
  normalizeStatus,
  progressStep,
  renderStatus,
} from './status';

const STATUS_NOTIFICATION = 'completiond/status';

let client: LanguageClient | undefined;
let log: vscode.LogOutputChannel;
let statusItem: vscode.StatusBarItem;
let view: StatusView = { client: 'starting' };
let lastSent: ServerSettings | undefined;
const cursorMoves = new Debounced<CursorParams>((p) => {
  if (client?.isRunning()) void client.sendNotification(CURSOR_NOTIFICATION, p);
});

function onSelection(e: vscode.TextEditorSelectionChangeEvent): void {
  const doc = e.textEditor.document;
  if (doc.uri.scheme !== 'file' && doc.uri.scheme !== 'untitled') return;
  const at = e.selections[0]?.active;
  if (at) cursorMoves.push(cursorParams(doc.uri.toString(), at.line, at.character));
}

const config = (): ConfigReader => vscode.workspace.getConfiguration(SECTION);

function pathVars() {
  return { home: os.homedir(), workspaceFolder: vscode.workspace.workspaceFolders?.[0]?.uri.fsPath };
}

function showStatus(next: Partial<StatusView>): void {
  view = { ...view, ...next };
  const r = renderStatus(view);
  statusItem.text = r.text;
  statusItem.tooltip = r.tooltip;
  statusItem.backgroundColor =
    r.severity === 'error'
      ? new vscode.ThemeColor('statusBarItem.errorBackground')
      : r.severity === 'warning'
        ? new vscode.ThemeColor('statusBarItem.warningBackground')
        : undefined;
  statusItem.show();
}

/**
 * A progress notification while the daemon starts, converts a model or restarts after it was lost:
 * opened on the first such status, updated with each phase (and percent when known), closed on
 * ready or error. The status bar says the same in short.
 */
let startup: { report: (m: { message?: string; increment?: number }) => void; done: () => void; percent: number } | undefined;

function followStartup(s: ServerStatus): void {
  if (!startup && isStarting(s)) {
    let report: (m: { message?: string; increment?: number }) => void = () => undefined;
    let done: () => void = () => undefined;
    const finished = new Promise<void>((resolve) => (done = resolve));
    void vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'completiond', cancellable: false },
      (progress) => {
        report = (m) => progress.report(m);
        return finished;
      },
    );
    startup = { report: (m) => report(m), done: () => done(), percent: 0 };
  }
  if (!startup) return;
  const step = progressStep(s, startup.percent);
  startup.percent = step.percent;
  if (step.done) {
    startup.done();
    startup = undefined;
    if (s.state === 'ready') vscode.window.setStatusBarMessage(`completiond: ${step.message}`, 5000);
    return;
  }
  startup.report({ message: step.message, increment: step.increment });
}

async function offerFix(message: string): Promise<void> {
  const choice = await vscode.window.showErrorMessage(message, 'Open Settings', 'Show Log');
  if (choice === 'Open Settings') {
    await vscode.commands.executeCommand('workbench.action.openSettings', 'completiond.serverPath');
  } else if (choice === 'Show Log') {
    log.show(true);
  }
}

/** Build the language client for the resolved server executable (not started). */
function createClient(command: string, args: string[]): LanguageClient {
  const serverOptions: ServerOptions = {
    command,
    args,
    // No `transport`: with TransportKind.stdio the client would append `--stdio` to the command
    // line; completiond-lsp speaks stdio by default and takes no such flag.
    options: { cwd: pathVars().workspaceFolder, env: process.env },
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    outputChannel: log,
    traceOutputChannel: log,
    initializationOptions: () => {
      lastSent = readServerSettings(config());
      return lastSent;
    },
    middleware: {
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        const t0 = Date.now();
        const result = await next(document, position, context, token);
        if (!token.isCancellationRequested) showStatus({ clientLatencyMs: Date.now() - t0 });
        return result;
      },
      workspace: {
        // A pull of the `completiond` section gets the same object as initializationOptions.
        configuration: (params, token, next) => {
          if (params.items.every((i) => i.section === SECTION)) {
            return params.items.map(() => readServerSettings(config()));
          }
          return next(params, token);
        },
      },
    },
  };

  const c = new LanguageClient('completiond', 'completiond', serverOptions, clientOptions);
  c.onNotification(STATUS_NOTIFICATION, (params: unknown) => {
    const s = normalizeStatus(params);
    if (s.state === 'error') log.error(`server: ${s.message}`);
    else if (s.state === 'restarting') log.warn(`server: ${s.message}`);
    showStatus({ server: s });
    followStartup(s);
  });
  c.onDidChangeState((e) => {
    const map: Record<number, ClientState> = {
      [State.Starting]: 'starting',
      [State.Running]: 'running',
      [State.Stopped]: 'stopped',
    };
    if (client === c) showStatus({ client: map[e.newState] ?? 'stopped' });
  });
  return c;
}

/** Find the server from the settings, create its client and start it; failures name the fix. */
async function startClient(): Promise<void> {
  const launch = readLaunch(config(), pathVars());
  const resolved = findExecutable(launch.command, { cwd: pathVars().workspaceFolder });
  if (!resolved) {
    const msg = missingServerMessage(launch.command);
    log.error(msg);
    showStatus({ client: 'missing', server: undefined });
    void offerFix(msg);
    return;
  }
  log.info(`starting ${resolved} ${launch.args.join(' ')}`.trim());

  const c = createClient(resolved, launch.args);
  client = c;
  showStatus({ client: 'starting', server: undefined });
  try {
    await c.start();
    showStatus({ client: 'running' });
  } catch (err) {
    const detail = err instanceof Error ? err.message : String(err);
    log.error(`failed to start ${resolved}: ${detail}`);
    showStatus({ client: 'failed' });
    void offerFix(
      /ENOENT|EACCES/.test(detail)
        ? missingServerMessage(launch.command, detail)
        : `completiond: the language server failed to start (${detail}). See the completiond log; ` +
            `check that "completiond.serverPath" is right, or ${INSTALL_HINT}.`,
    );
  }
}

async function stopClient(): Promise<void> {
  const c = client;
  client = undefined;
  if (c) {
    try {
      await c.stop(5000);
    } catch (err) {
      log.warn(`stopping the server: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
}

async function restartClient(): Promise<void> {
  await stopClient();
  await startClient();
}

async function onConfigurationChanged(e: vscode.ConfigurationChangeEvent): Promise<void> {
  if (!e.affectsConfiguration(SECTION)) return;
  if (LAUNCH_KEYS.some((k) => e.affectsConfiguration(`${SECTION}.${k}`))) {
    log.info('server path changed: restarting the language server');
    await restartClient();
    return;
  }
  const settings = readServerSettings(config());
  if (!client || !client.isRunning() || sameSettings(lastSent, settings)) return;
  lastSent = settings;
  log.info(`settings changed: ${JSON.stringify(settings)}`);
  await client.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(settings));
}

async function rewriteSelection(): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (!editor) {
    void vscode.window.showInformationMessage('completiond: open a file and select the code to rewrite.');
    return;
  }
  const c = client;
  if (!c || !c.isRunning()) {
    void offerFix('completiond: the language server is not running, so nothing can be rewritten.');
    return;
  }
  const doc = editor.document;
  // An empty selection means "this line".
  const range = editor.selection.isEmpty ? doc.lineAt(editor.selection.active.line).range : editor.selection;
  const selected = doc.getText(range);
  if (selected.trim() === '') {
    void vscode.window.showInformationMessage('completiond: select the code to rewrite.');
    return;
  }
  const instruction = await vscode.window.showInputBox({
    title: 'completiond: Rewrite selection',
    prompt: 'How should the selected code change?',
    placeHolder: 'e.g. add type hints',
    ignoreFocusOut: true,
    validateInput: validateInstruction,
  });
  if (instruction === undefined) return;

  const params = rewriteParams(c.code2ProtocolConverter.asUri(doc.uri), c.code2ProtocolConverter.asRange(range), instruction);
  try {
    const result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'completiond: rewriting…', cancellable: true },
      (_progress, token) => c.sendRequest(ExecuteCommandRequest.type, params, token),
    );
    const outcome = describeRewriteResult(result, selected);
    log.info(outcome.message);
    if (!outcome.ok) void vscode.window.showWarningMessage(outcome.message);
    else if (outcome.unchanged) void vscode.window.showInformationMessage(outcome.message); // else nothing shows it ran
  } catch (err) {
    const detail = err instanceof Error ? err.message : String(err);
    log.error(`rewrite failed: ${detail}`);
    void vscode.window.showErrorMessage(`completiond: rewrite failed: ${detail}`);
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  log = vscode.window.createOutputChannel('completiond', { log: true });
  statusItem = vscode.window.createStatusBarItem('status', vscode.StatusBarAlignment.Right, 100);
  statusItem.name = 'completiond';
  statusItem.command = 'completiond.showLog';
  context.subscriptions.push(
    log,
    statusItem,
    vscode.commands.registerCommand('completiond.showLog', () => log.show(true)),
    vscode.commands.registerCommand('completiond.restartServer', restartClient),
    vscode.commands.registerCommand('completiond.rewriteSelection', rewriteSelection),
    vscode.workspace.onDidChangeConfiguration((e) => void onConfigurationChanged(e)),
    vscode.window.onDidChangeTextEditorSelection(onSelection),
    { dispose: () => cursorMoves.dispose() },
  );
  registerNextEdit(vscode, context, () => client); // completiond/nextEdit (nextEdit.ts)
  showStatus({ client: 'starting' });
  log.info(`completiond extension ${context.extension.packageJSON.version} activated`);
  await startClient();
}

export async function deactivate(): Promise<void> {
  await stopClient();
}
