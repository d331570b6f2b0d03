/**
 * Locating the `completiond-lsp` executable before launching it, so a missing server gives a
 * message with the fix instead of a bare ENOENT. Pure apart from the injectable file check.
 */
import * as fs from 'fs';
import * as path from 'path';

export type IsExecutable = (file: string) => boolean;

export const defaultIsExecutable: IsExecutable = (file) => {
  try {
    if (!fs.statSync(file).isFile()) return false;
    if (process.platform !== 'win32') fs.accessSync(file, fs.constants.X_OK);
    return true;
  } catch {
    return false;
  }
};

/**
 * Resolve `command` the way a shell would: a name with a path separator is taken as a path
 * (relative ones against `cwd`), a bare name is searched on PATH (with PATHEXT on Windows).
 * Returns the absolute file, or undefined when there is none.
 */
export function findExecutable(
  command: string,
  opts: { env?: NodeJS.ProcessEnv; platform?: NodeJS.Platform; cwd?: string; isExecutable?: IsExecutable } = {},
): string | undefined {
  const env = opts.env ?? process.env;
  const platform = opts.platform ?? process.platform;
  const isExe = opts.isExecutable ?? defaultIsExecutable;
  const p = platform === 'win32' ? path.win32 : path.posix;
  const exts =
    platform === 'win32'
      ? ['', ...(env.PATHEXT ?? '.COM;.EXE;.BAT;.CMD').split(';').filter(Boolean).map((e) => e.toLowerCase())]
      : [''];
  const tryFile = (f: string) => exts.map((e) => f + e).find(isExe);

  if (command === '') return undefined;
  const hasSep = command.includes('/') || (platform === 'win32' && command.includes('\\'));
  if (hasSep || p.isAbsolute(command)) {
    return tryFile(p.resolve(opts.cwd ?? process.cwd(), command));
  }
  const dirs = (env.PATH ?? env.Path ?? '').split(platform === 'win32' ? ';' : ':').filter(Boolean);
  for (const dir of dirs) {
    const hit = tryFile(p.join(dir, command));
    if (hit) return hit;
  }
  return undefined;
}

/** How to get completiond-lsp: it is not on PyPI, so from a checkout (README "Set up a fresh machine"). */
export const INSTALL_HINT =
  "install it from a completiond checkout: `pip install torch==2.13.0 && pip install -e '/path/to/completiond[default-model]'` " +
  '(or `pipx install /path/to/completiond`); see "Set up a fresh machine" in completiond\'s README';

/** The error shown when the server cannot be found or started; it names the fix. */
export function missingServerMessage(command: string, detail?: string): string {
  const why = detail ? ` (${detail})` : '';
  return (
    `completiond: the language server "${command}" was not found${why}. ` +
    `To fix, ${INSTALL_HINT}, ` +
    'or set "completiond.serverPath" to the full path of completiond-lsp.'
  );
}
