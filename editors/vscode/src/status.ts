/**
 * The status bar item's text and tooltip, from the server's `completiond/status` notification
 * (params: state, message, target, draft, device, quant, defaultReason, phase, phaseS, elapsedS,
 * progress, upgrade, lastLatencyMs, meanAccepted) and the client's own state; and what the start-up progress notification says.
 * Pure module: unit-tested without VS Code.
 */

import { INSTALL_HINT } from './serverPath';

export type ServerState = 'loading' | 'restarting' | 'ready' | 'error';

export interface ServerStatus {
  state: ServerState;
  message: string;
  target: string;
  draft: string | null;
  device: string;
  /** The target's weights form (int8, int4, none); the target is spelled NAME@FORM for a named model. */
  quant?: string | null;
  /** Why this target and form are the default on this machine; absent when the target was named. */
  defaultReason?: string | null;
  lastLatencyMs: number | null;
  meanAccepted: number | null;
  /** While the daemon starts: its phase ("importing torch", "loading target …"), seconds so far, percent if known. */
  phase?: string | null;
  elapsedS?: number | null;
  progress?: number | null;
  /** The daemon's background switch to the larger default: converting / loading / switched / failed / off. */
  upgrade?: Upgrade | null;
}

export interface Upgrade {
  model: string;
  phase: string;
  /** Fraction done (0..1) while it converts. */
  progress: number | null;
  why: string;
}

/** What the extension knows about the server process itself. */
export type ClientState = 'starting' | 'running' | 'stopped' | 'missing' | 'failed';

export interface StatusView {
  client: ClientState;
  server?: ServerStatus;
  /** Round trip of the last inline completion request as measured in the editor. */
  clientLatencyMs?: number | null;
}

export type Severity = 'normal' | 'warning' | 'error';

export interface StatusRender {
  text: string;
  tooltip: string;
  severity: Severity;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const str = (v: unknown, fallback = ''): string => (typeof v === 'string' ? v : fallback);

/** Accept whatever the server sent; unknown or missing fields get neutral values. */
export function normalizeStatus(params: unknown): ServerStatus {
  const p = (params && typeof params === 'object' ? params : {}) as Record<string, unknown>;
  const state =
    p.state === 'loading' || p.state === 'restarting' || p.state === 'ready' || p.state === 'error' ? p.state : 'ready';
  const s: ServerStatus = {
    state,
    message: str(p.message),
    target: str(p.target),
    draft: typeof p.draft === 'string' && p.draft !== '' ? p.draft : null,
    device: str(p.device),
    lastLatencyMs: num(p.lastLatencyMs),
    meanAccepted: num(p.meanAccepted),
  };
  // start-up fields only when sent (older servers have none)
  if (typeof p.phase === 'string' && p.phase !== '') s.phase = p.phase;
  if (num(p.elapsedS) !== null) s.elapsedS = num(p.elapsedS);
  if (num(p.progress) !== null) s.progress = num(p.progress);
  if (typeof p.quant === 'string' && p.quant !== '') s.quant = p.quant;
  if (typeof p.defaultReason === 'string' && p.defaultReason !== '') s.defaultReason = p.defaultReason;
  const up = (p.upgrade && typeof p.upgrade === 'object' ? p.upgrade : null) as Record<string, unknown> | null;
  if (up && typeof up.phase === 'string') {
    s.upgrade = { model: str(up.model), phase: up.phase, progress: num(up.progress), why: str(up.why) };
  }
  return s;
}

/** A background upgrade while it runs, for the status bar: "converting qwen2.5-coder-1.5b@int4 42 %". */
export function upgradeText(u: Upgrade | null | undefined): string | null {
  if (!u) return null;
  if (u.phase === 'converting') {
    const pct = u.progress !== null ? ` ${Math.round(u.progress * 100)} %` : '';
    return `converting ${u.model}${pct}`;
  }
  if (u.phase === 'loading') return `loading ${u.model}`;
  return null;
}

/** The server's message without its "completiond: " prefix (the UI names completiond already). */
export function bareMessage(message: string): string {
  return message.replace(/^completiond:\s*/, '');
}

/** A start or a restart is under way: the progress notification stays open while this holds. */
export function isStarting(s: ServerStatus | undefined): boolean {
  return s !== undefined && (s.state === 'loading' || s.state === 'restarting');
}

/**
 * What the start-up progress notification shows for a status: its message, and the increment (in
 * percent, for VS Code's report()) since `lastPercent` when the daemon reports a percentage (a
 * conversion does). `done` once the daemon is ready or failed: the notification closes.
 */
export function progressStep(
  s: ServerStatus,
  lastPercent: number,
): { message: string; increment?: number; percent: number; done: boolean } {
  if (!isStarting(s)) return { message: bareMessage(s.message), percent: lastPercent, done: true };
  const pct = s.progress ?? null;
  if (pct !== null && pct > lastPercent) {
    return { message: bareMessage(s.message), increment: pct - lastPercent, percent: pct, done: false };
  }
  return { message: bareMessage(s.message), percent: lastPercent, done: false };
}

/** "google/gemma-3-270m" -> "gemma-3-270m"; "/x/y/model-Q4_K_M.gguf" -> "model-Q4_K_M". */
export function shortModelName(spec: string): string {
  const s = spec.trim().replace(/[\\/]+$/, '');
  if (s === '') return '';
  const base = s.split(/[\\/]/).pop() ?? s;
  return base.replace(/\.(gguf|safetensors|bin|pt)$/i, '');
}

export function formatLatency(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '–';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

export function formatAccepted(mean: number | null | undefined): string {
  if (mean === null || mean === undefined || !Number.isFinite(mean)) return '–';
  return mean.toFixed(1);
}

const CLICK = 'Click to show the completiond log.';

export function renderStatus(view: StatusView): StatusRender {
  switch (view.client) {
    case 'missing':
      return {
        text: '$(warning) completiond',
        tooltip: `completiond-lsp was not found: set completiond.serverPath, or ${INSTALL_HINT}.\n` + CLICK,
        severity: 'warning',
      };
    case 'failed':
      return { text: '$(error) completiond', tooltip: 'The language server failed to start.\n' + CLICK, severity: 'error' };
    case 'stopped':
      return { text: '$(circle-slash) completiond', tooltip: 'The language server is stopped.\n' + CLICK, severity: 'warning' };
    case 'starting':
      return { text: '$(sync~spin) completiond', tooltip: 'Starting the language server…\n' + CLICK, severity: 'normal' };
  }
  const s = view.server;
  if (!s) return { text: '$(sync~spin) completiond', tooltip: 'Waiting for the model…\n' + CLICK, severity: 'normal' };

  const model = shortModelName(s.target) || 'completiond';
  const latency = s.lastLatencyMs ?? view.clientLatencyMs ?? null;
  const lines = [
    `completiond — ${s.state}${s.message ? `: ${s.message}` : ''}`,
    `Target: ${s.target || '–'}`,
    // why this model and weights form: the daemon's own choice, or the one the settings named
    s.defaultReason ? `Why: ${s.defaultReason}` : s.target ? 'Why: named (completiond.target or serve --target)' : 'Why: –',
    ...(s.upgrade ? [`Upgrade: ${s.upgrade.model} ${s.upgrade.phase} — ${s.upgrade.why}`] : []),
    `Draft: ${s.draft ?? 'none'}`,
    `Device: ${s.device || '–'}`,
    `Last completion: ${formatLatency(latency)}`,
    `Mean accepted tokens per pass: ${s.meanAccepted === null ? '–' : s.meanAccepted.toFixed(2)}`,
  ];
  if (view.clientLatencyMs !== undefined && view.clientLatencyMs !== null && s.lastLatencyMs !== null) {
    lines.push(`Round trip in the editor: ${formatLatency(view.clientLatencyMs)}`);
  }
  const tooltip = lines.join('\n') + '\n\n' + CLICK;

  if (s.state === 'restarting') {
    return { text: `$(sync~spin) completiond: ${bareMessage(s.message) || 'restarting'}`, tooltip, severity: 'warning' };
  }
  if (s.state === 'loading') {
    // the phase and its seconds, so that a long first start shows it is moving
    const secs = s.elapsedS !== undefined && s.elapsedS !== null ? ` (${Math.round(s.elapsedS)} s)` : '';
    const pct = s.progress !== undefined && s.progress !== null ? ` ${Math.round(s.progress)} %` : '';
    const what = s.phase ? `${s.phase}${pct}${secs}` : 'loading…';
    return { text: `$(sync~spin) ${model}: ${what}`, tooltip, severity: 'normal' };
  }
  if (s.state === 'error') {
    return { text: `$(error) ${model}`, tooltip, severity: 'error' };
  }
  const parts = [model];
  if (s.device) parts.push(s.device);
  if (latency !== null) parts.push(formatLatency(latency));
  if (s.meanAccepted !== null) parts.push(`${formatAccepted(s.meanAccepted)} tok/pass`);
  const upgrading = upgradeText(s.upgrade);
  if (upgrading) parts.push(upgrading);
  return { text: `$(zap) ${parts.join(' · ')}`, tooltip, severity: 'normal' };
}
