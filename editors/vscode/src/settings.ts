/**
 * completiond.* settings -> what the language server receives.
 *
 * Pure module (no `vscode` import) so it is unit-tested with node's test runner.
 * The same object is sent as `initializationOptions` on `initialize`, as
 * `{"settings": {"completiond": ...}}` in `workspace/didChangeConfiguration`, and as the answer
 * to a `workspace/configuration` pull for the `completiond` section.
 */

export const SECTION = 'completiond';

export const MODES = ['combined', 'ar', 'pld', 'draft'] as const;
export type Mode = (typeof MODES)[number];

/** The server's view of the settings (contract with completiond-lsp: keep the key names). */
export interface ServerSettings {
  mode: Mode;
  maxTokens: number;
  multiline: boolean;
  debounceMs: number;
  socket: string | null;
  autostart: boolean;
  /** Models and placement for a daemon the server autostarts (null: the daemon's defaults). */
  target: string | null;
  draft: string | null;
  dtype: string | null;
  device: string | null;
  /** Suggestions per request (1..3): VS Code cycles through them with its next/previous commands. */
  suggestions: number;
  /** VS Code's inline completion API is not incremental: the server answers once per request. */
  streaming: false;
}

/** The daemon's cap on max_tokens (completiond.protocol). */
export const MAX_TOKENS_LIMIT = 2048;

/** Defaults as the daemon and completiond-lsp have them (multiline on, 75 ms debounce). */
export const DEFAULTS: Readonly<ServerSettings> = Object.freeze({
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

/** Settings that change how the server process is launched: changing them restarts it. */
export const LAUNCH_KEYS = ['serverPath', 'serverArgs'] as const;
/** Settings forwarded to the running server without a restart. */
export const LIVE_KEYS = [
  'mode',
  'maxTokens',
  'multiline',
  'debounceMs',
  'socket',
  'autostart',
  'target',
  'draft',
  'dtype',
  'device',
  'suggestions',
] as const;
const DTYPES = ['auto', 'bfloat16', 'float16', 'float32'];
const DEVICES = ['auto', 'cpu', 'cuda'];

/** The subset of `vscode.WorkspaceConfiguration` this module needs (scoped to `completiond`). */
export interface ConfigReader {
  get<T>(key: string): T | undefined;
}

function intIn(value: unknown, fallback: number, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) return fallback;
  return Math.min(max, Math.max(min, Math.round(value)));
}

function strOrNull(value: unknown, allowed?: string[]): string | null {
  if (typeof value !== 'string' || value.trim() === '') return null;
  const v = value.trim();
  return allowed && !allowed.includes(v) ? null : v;
}

function bool(value: unknown, fallback: boolean): boolean {
  return typeof value === 'boolean' ? value : fallback;
}

/** Read and sanitise the settings; anything missing or malformed falls back to its default. */
export function readServerSettings(cfg: ConfigReader): ServerSettings {
  const mode = cfg.get<string>('mode');
  return {
    mode: (MODES as readonly string[]).includes(mode ?? '') ? (mode as Mode) : DEFAULTS.mode,
    maxTokens: intIn(cfg.get('maxTokens'), DEFAULTS.maxTokens, 1, MAX_TOKENS_LIMIT),
    multiline: bool(cfg.get('multiline'), DEFAULTS.multiline),
    debounceMs: intIn(cfg.get('debounceMs'), DEFAULTS.debounceMs, 0, 5000),
    socket: strOrNull(cfg.get('socket')),
    autostart: bool(cfg.get('autostart'), DEFAULTS.autostart),
    target: strOrNull(cfg.get('target')),
    draft: strOrNull(cfg.get('draft')),
    dtype: strOrNull(cfg.get('dtype'), DTYPES),
    device: strOrNull(cfg.get('device'), DEVICES),
    suggestions: intIn(cfg.get('suggestions'), DEFAULTS.suggestions, 1, 3),
    streaming: false,
  };
}

/** Params of the `workspace/didChangeConfiguration` notification. */
export function didChangeConfigurationParams(s: ServerSettings): { settings: { completiond: ServerSettings } } {
  return { settings: { completiond: { ...s } } };
}

export function sameSettings(a: ServerSettings | undefined, b: ServerSettings): boolean {
  return a !== undefined && JSON.stringify(a) === JSON.stringify(b);
}

export interface Launch {
  command: string;
  args: string[];
}

/** Expand `~`, `${userHome}` and `${workspaceFolder}` in a configured path. */
export function expandPath(p: string, vars: { home?: string; workspaceFolder?: string }): string {
  let out = p.trim();
  if (vars.home) {
    if (out === '~' || out.startsWith('~/')) out = vars.home + out.slice(1);
    out = out.split('${userHome}').join(vars.home);
  }
  if (vars.workspaceFolder) out = out.split('${workspaceFolder}').join(vars.workspaceFolder);
  return out;
}

export function readLaunch(cfg: ConfigReader, vars: { home?: string; workspaceFolder?: string } = {}): Launch {
  const raw = cfg.get<string>('serverPath');
  const command = typeof raw === 'string' && raw.trim() !== '' ? raw : 'completiond-lsp';
  const args = cfg.get<unknown>('serverArgs');
  return {
    command: expandPath(command, vars),
    args: Array.isArray(args) ? args.filter((a): a is string => typeof a === 'string').map((a) => expandPath(a, vars)) : [],
  };
}
