// Real-editor test: VS Code (code-server) in headless Chromium, driven through the real input path.
//
// Stages (each logged with its time; E2E_UNTIL stops early with success):
//   open      workbench loaded with the workspace folder, the Python file open in an editor
//   activate  our extension is active: its status bar item is shown
//   ready     the language server reported `ready` (completiond/status) — needs completiond-lsp
//   inline    type at the end of a line, ghost text appears, screenshot, Tab accepts, file checked
//   word      (E2E_ACCEPT_WORD=1) on a new suggestion, Ctrl+Right accepts the next word only
//   settings  a completiond.* change in the Settings editor reaches the server live
//             (workspace/didChangeConfiguration; checked in the extension's log, and in the fake
//             server's message log when E2E_FAKE_LSP_LOG is set)
//   rewrite   select line 1, "completiond: Rewrite selection…" from the command palette with an
//             instruction; the server's edit lands in the file (E2E_REWRITE=0 skips)
//
// Started by test/e2e.sh, which provides code-server and these variables:
//   E2E_URL, E2E_WORKSPACE, E2E_FILE (relative to the workspace), E2E_PROFILE (fresh Chromium
//   profile), E2E_ARTIFACTS (screenshots of every stage), E2E_SCREENSHOT (the ghost-text
//   screenshot), CHROMIUM (default /usr/bin/chromium), E2E_UNTIL (last stage; default rewrite),
//   E2E_TIMEOUT_MS (wait for the server and for a suggestion; default 120000), E2E_USER_DATA
//   (code-server's user data dir: the extension's log is read from it), E2E_FAKE_LSP_LOG,
//   E2E_EXPECT_SOCKET (the configured completiond.socket, checked after a live settings change).
import { chromium } from 'playwright-core';
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const env = process.env;
const URL_ = env.E2E_URL;
const WORKSPACE = env.E2E_WORKSPACE;
const FILE = env.E2E_FILE ?? 'sample.py';
const PROFILE = env.E2E_PROFILE;
const ARTIFACTS = env.E2E_ARTIFACTS ?? path.join(process.cwd(), '.e2e', 'artifacts');
const SCREENSHOT = env.E2E_SCREENSHOT;
const UNTIL = env.E2E_UNTIL ?? 'rewrite';
const TIMEOUT = Number(env.E2E_TIMEOUT_MS ?? 120000);
const ACCEPT_WORD = (env.E2E_ACCEPT_WORD ?? '1') === '1';
const STAGES = ['open', 'activate', 'ready', 'inline', 'word', 'settings', 'rewrite'];
if (!URL_ || !WORKSPACE || !PROFILE) {
  console.error('run.mjs: E2E_URL, E2E_WORKSPACE and E2E_PROFILE must be set (use test/e2e.sh)');
  process.exit(2);
}
if (!STAGES.includes(UNTIL)) {
  console.error(`run.mjs: E2E_UNTIL must be one of ${STAGES.join(', ')}`);
  process.exit(2);
}
mkdirSync(ARTIFACTS, { recursive: true });

const t0 = Date.now();
const log = (msg) => console.log(`[e2e ${((Date.now() - t0) / 1000).toFixed(1).padStart(6)}s] ${msg}`);
const NBSP = /\u00a0/g;
const STATUS_ITEM = '[id="completiond.completiond.status"]';

class StageError extends Error {}

async function main() {
  const context = await chromium.launchPersistentContext(PROFILE, {
    executablePath: env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(60000);
  page.on('pageerror', (e) => log(`page error: ${e.message}`));
  const shot = (name) => screenshot(page, name);
  let stage = 'open';
  const done = async (name) => {
    log(`stage ${name}: ok`);
    if (name === UNTIL) {
      log(`stopping after stage ${name} (E2E_UNTIL)`);
      return true;
    }
    return false;
  };

  try {
    // ---- open: workbench with the folder, then the file through Quick Open (Ctrl+P) ------------
    await page.goto(`${URL_}/?folder=${encodeURIComponent(WORKSPACE)}`);
    await page.waitForSelector('.monaco-workbench', { timeout: 120000 });
    await page.waitForSelector('.part.statusbar', { timeout: 120000 });
    log('workbench loaded');
    await openFile(page, FILE);
    await shot('1-open');
    if (await done('open')) return 0;

    // ---- activate: our status bar item exists (activation event onStartupFinished) -----------
    stage = 'activate';
    const item = page.locator(STATUS_ITEM);
    await item.waitFor({ state: 'attached', timeout: 90000 });
    log(`status bar item: "${(await statusText(page)).trim()}" — ${await item.getAttribute('aria-label')}`);
    await shot('2-activated');
    if (await done('activate')) return 0;

    // ---- ready: completiond/status {state: "ready"} renders the zap icon ----------------------
    stage = 'ready';
    const deadline = Date.now() + TIMEOUT;
    let shown = '';
    for (;;) {
      // each status bar text while the server starts ("<model>: converting <model> 43 % (21 s)"): a
      // test reads the phases and their progress from these lines
      const now = (await statusText(page)).trim();
      if (now !== shown) log(`status: ${JSON.stringify((shown = now))}`);
      if (await item.locator('.codicon-zap').count()) break;
      const missing = await item.locator('.codicon-warning, .codicon-error, .codicon-circle-slash').count();
      if (missing) {
        const notes = await notifications(page);
        throw new StageError(
          `the language server is not running (status "${(await statusText(page)).trim()}"; ` +
            `notifications: ${notes || 'none'}). Set COMPLETIOND_LSP to a working completiond-lsp.`,
        );
      }
      if (Date.now() > deadline) throw new StageError(`no "ready" status within ${TIMEOUT} ms`);
      await page.waitForTimeout(500);
    }
    log(`server ready: "${(await statusText(page)).trim()}"`);
    if (await done('ready')) return 0;

    // ---- inline: type at the end of a line, ghost text, Tab, check the file ----------------------
    stage = 'inline';
    const typed = env.E2E_TYPE ?? '    ma';
    await goToEndOfFile(page);
    await page.keyboard.type(typed, { delay: 60 });
    const ghost = await waitForGhost(page, TIMEOUT);
    log(`ghost text: ${JSON.stringify(ghost)}`);
    log(`status after the ghost: ${JSON.stringify((await statusText(page)).trim())} — ${JSON.stringify(await item.getAttribute('aria-label'))}`);
    const screenshot = await shot('3-ghost');
    if (SCREENSHOT) {
      mkdirSync(path.dirname(SCREENSHOT), { recursive: true });
      await page.screenshot({ path: SCREENSHOT });
      log(`screenshot ${SCREENSHOT}`);
    } else log(`(no E2E_SCREENSHOT; ghost screenshot at ${screenshot})`);
    await page.keyboard.press('Tab');
    await page.waitForTimeout(300);
    const afterTab = await saveAndRead(page);
    const lastLine = afterTab.replace(/\n+$/, '').split('\n').pop() ?? '';
    const expected = (typed + ghost.split('\n')[0]).trimEnd();
    log(`line after Tab: ${JSON.stringify(lastLine)}`);
    if (!afterTab.includes(expected)) {
      throw new StageError(`after Tab the file does not contain ${JSON.stringify(expected)}; last line ${JSON.stringify(lastLine)}`);
    }
    await shot('4-accepted');
    if (await done('inline')) return 0;

    // ---- word: VS Code's own accept-next-word on our item --------------------------------------
    stage = 'word';
    if (ACCEPT_WORD) {
      await goToEndOfFile(page);
      await page.keyboard.press('Enter');
      const typed2 = env.E2E_TYPE2 ?? 'pri';
      await page.keyboard.type(typed2, { delay: 60 });
      const before = await saveAndRead(page);
      const ghost2 = await waitForGhost(page, TIMEOUT);
      log(`ghost text: ${JSON.stringify(ghost2)}`);
      await page.keyboard.press('Control+ArrowRight');
      await page.waitForTimeout(300);
      const after = await saveAndRead(page);
      const inserted = insertedText(before, after);
      log(`accept-next-word inserted ${JSON.stringify(inserted)}`);
      if (inserted === '' || !ghost2.startsWith(inserted)) {
        throw new StageError(`Ctrl+Right inserted ${JSON.stringify(inserted)}, not a prefix of ${JSON.stringify(ghost2)}`);
      }
      await page.keyboard.press('Escape');
      await shot('5-accept-word');
      if (await done('word')) return 0;
    } else log('E2E_ACCEPT_WORD=0: skipping stage word');

    // ---- settings: live change -> workspace/didChangeConfiguration ----------------------------
    stage = 'settings';
    await checkLiveSettings(page);
    await page.keyboard.press('Control+W'); // close the Settings editor; sample.py is active again
    if (await done('settings')) return 0;

    // ---- rewrite: the command with an instruction, the server applies the edit -----------------
    stage = 'rewrite';
    if ((env.E2E_REWRITE ?? '1') !== '1') {
      log('E2E_REWRITE=0: skipping stage rewrite');
      return 0;
    }
    const original = await saveAndRead(page);
    await page.locator('.editor-instance .monaco-editor .view-lines').first().click();
    await page.keyboard.press('Control+Home');
    await page.keyboard.press('Shift+End');
    await page.keyboard.press('F1');
    const palette = page.locator('.quick-input-widget input');
    await palette.waitFor({ state: 'visible', timeout: 15000 });
    await palette.fill('>completiond: Rewrite selection');
    await page.locator('.quick-input-list .monaco-list-row[aria-label*="Rewrite selection"]').first().waitFor({ timeout: 15000 });
    await page.keyboard.press('Enter');
    await page.locator('.quick-input-widget .quick-input-title', { hasText: 'Rewrite selection' }).waitFor({ timeout: 15000 });
    await shot('7-rewrite-input');
    await page.keyboard.type(env.E2E_INSTRUCTION ?? 'make the docstring shorter', { delay: 20 });
    await page.keyboard.press('Enter');
    const rewriteDeadline = Date.now() + TIMEOUT;
    let rewritten = original;
    // done when the text changed, or when the extension says the applied edit kept the text (a real
    // model may rewrite the selection into the same text; only then does it show a notification)
    while (rewritten === original) {
      const notes = await notifications(page);
      if (/rewrite failed|did not apply|returned no rewrite|not running/.test(notes)) throw new StageError(`rewrite: ${notes}`);
      if (/left the selection as it was/.test(notes)) break; // a real model may keep the text (the 1.5B did)
      if (Date.now() > rewriteDeadline) throw new StageError(`the file did not change within ${TIMEOUT} ms of the rewrite`);
      await page.waitForTimeout(1000);
      rewritten = await saveAndRead(page);
    }
    const firstLine = rewritten.split('\n')[0];
    log(`line 1 after the rewrite: ${JSON.stringify(firstLine)}`);
    if (rewritten.split('\n').slice(-4).join('\n') !== original.split('\n').slice(-4).join('\n')) {
      throw new StageError('the rewrite changed text outside the selection');
    }
    await shot('8-rewritten');
    await done('rewrite');
    return 0;
  } catch (err) {
    log(`stage ${stage}: FAILED: ${err instanceof Error ? err.message : String(err)}`);
    log(`status bar: ${JSON.stringify(await statusbarItems(page).catch(() => []))}`);
    log(`notifications: ${await notifications(page)}`);
    if (!(err instanceof StageError) && err instanceof Error && err.stack) console.error(err.stack);
    await shot(`failed-${stage}`).catch(() => {});
    return 1;
  } finally {
    await context.close();
  }
}

/** Change completiond.maxTokens in the Settings editor, as a user would, and see it reach the server. */
async function checkLiveSettings(page) {
  // (code-server does not notice settings.json being written behind its back, so use the UI.)
  const value = 17;
  await page.keyboard.press('F1');
  const palette = page.locator('.quick-input-widget input');
  await palette.waitFor({ state: 'visible', timeout: 15000 });
  await palette.fill('>Preferences: Open User Settings');
  await page.locator('.quick-input-list .monaco-list-row[aria-label^="Preferences: Open User Settings,"], .quick-input-list .monaco-list-row[aria-label^="Preferences: Open User Settings "]').first().waitFor({ timeout: 15000 });
  await page.keyboard.press('Enter');
  await page.locator('.settings-editor').waitFor({ timeout: 30000 });
  await page.waitForTimeout(500);
  await page.keyboard.type('completiond.maxTokens', { delay: 10 }); // the search box has the focus
  // code-server is a remote window: edit the Remote settings, where e2e.sh put completiond.*
  // (a User value would be overridden by them); the search stays when switching tabs
  const remoteTab = page.locator('.settings-tabs-widget .action-label', { hasText: 'Remote' });
  if (await remoteTab.count()) await remoteTab.first().click();
  // wait for the search to filter the list down to our setting, or we would edit another one
  const input = page.locator('.settings-editor .setting-item-number').filter({ hasText: 'Max Tokens' }).locator('input');
  await input.waitFor({ state: 'visible', timeout: 30000 });
  await input.click();
  await page.keyboard.press('Control+A');
  await page.keyboard.type(String(value), { delay: 30 });
  await page.keyboard.press('Tab');
  log(`Settings editor: completiond.maxTokens = ${value}`);
  await page.waitForTimeout(1500);
  await screenshot(page, '6-settings');
  const needle = `"maxTokens":${value}`;
  const deadline = Date.now() + 30000;
  for (;;) {
    const logText = extensionLog();
    const line = logText.split('\n').find((l) => l.includes('settings changed') && l.includes(needle));
    if (line) {
      log(`extension: ${line.trim()}`);
      // the other settings must survive the change (e.g. the daemon socket must not fall back to null)
      const sent = JSON.parse(line.slice(line.indexOf('{')));
      if (env.E2E_EXPECT_SOCKET && sent.socket !== env.E2E_EXPECT_SOCKET) {
        throw new StageError(`after the change the extension sent socket ${JSON.stringify(sent.socket)}, not ${env.E2E_EXPECT_SOCKET}`);
      }
      break;
    }
    if (Date.now() > deadline) throw new StageError(`the extension did not send the new settings (${needle}) within 30 s`);
    await new Promise((r) => setTimeout(r, 500));
  }
  const fakeLog = env.E2E_FAKE_LSP_LOG;
  if (fakeLog && existsSync(fakeLog)) {
    const msgs = readFileSync(fakeLog, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const init = msgs.find((m) => m.method === 'initialize');
    const keys = Object.keys(init?.params?.initializationOptions ?? {}).sort().join(',');
    if (keys !== 'autostart,debounceMs,device,draft,dtype,maxTokens,mode,multiline,socket,streaming,suggestions,target') {
      throw new StageError(`initializationOptions keys: ${keys}`);
    }
    const change = msgs.filter((m) => m.method === 'workspace/didChangeConfiguration').pop();
    const want = { ...init.params.initializationOptions, maxTokens: value };
    if (JSON.stringify(change?.params?.settings?.completiond) !== JSON.stringify(want)) {
      throw new StageError(`the server got no didChangeConfiguration with ${JSON.stringify(want)}: ${JSON.stringify(change)}`);
    }
    log(`server: initializationOptions ${JSON.stringify(init.params.initializationOptions)}`);
    log(`server: didChangeConfiguration ${JSON.stringify(change.params)}`);
  }
}

/** The extension's output channel as VS Code writes it under the user data dir. */
function extensionLog() {
  const root = env.E2E_USER_DATA ? path.join(env.E2E_USER_DATA, 'logs') : undefined;
  if (!root || !existsSync(root)) return '';
  const found = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name === 'completiond.log') found.push(p);
    }
  };
  walk(root);
  return found.map((f) => readFileSync(f, 'utf8')).join('\n');
}

async function screenshot(page, name) {
  const file = path.join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path: file });
  log(`screenshot ${file}`);
  return file;
}

async function statusText(page) {
  return (await page.locator(STATUS_ITEM).innerText().catch(() => '')).replace(NBSP, ' ');
}

async function statusbarItems(page) {
  return page.evaluate(() =>
    [...document.querySelectorAll('.statusbar-item')].map((e) => ({ id: e.id, text: e.textContent, label: e.getAttribute('aria-label') })),
  );
}

async function notifications(page) {
  const texts = await page.locator('.notification-list-item-message').allInnerTexts().catch(() => []);
  return texts.map((t) => t.replace(/\s+/g, ' ').trim()).join(' | ');
}

async function openFile(page, file) {
  const base = path.basename(file);
  const tab = page.locator(`.tabs-container .tab[aria-label*="${base}"]`);
  for (let attempt = 1; attempt <= 3 && !(await tab.count()); attempt++) {
    await page.locator('.monaco-workbench').click({ position: { x: 640, y: 400 } }).catch(() => {});
    await page.keyboard.press('Control+P');
    const input = page.locator('.quick-input-widget input');
    await input.waitFor({ state: 'visible', timeout: 15000 });
    await input.fill(file);
    await page.locator('.quick-input-list .monaco-list-row').first().waitFor({ timeout: 30000 });
    await page.keyboard.press('Enter');
    await tab.first().waitFor({ timeout: 15000 }).catch(() => log(`quick open attempt ${attempt} did not open ${file}`));
  }
  await tab.first().waitFor({ timeout: 5000 });
  await page.locator('.editor-instance .monaco-editor .view-lines').first().waitFor();
  log(`opened ${file}`);
}

async function goToEndOfFile(page) {
  await page.locator('.editor-instance .monaco-editor .view-lines').first().click();
  await page.keyboard.press('Control+End');
}

/** Visible ghost text: the rest of the cursor line plus any lines VS Code shows below it. */
async function waitForGhost(page, timeout) {
  const deadline = Date.now() + timeout;
  let nextTrigger = Date.now() + 5000;
  for (;;) {
    const text = await page.evaluate(() => {
      const inline = [...document.querySelectorAll('.monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text-decoration-preview')]
        .map((e) => e.textContent ?? '')
        .join('');
      const below = [...document.querySelectorAll('.monaco-editor .ghost-text .view-line')].map((e) => e.textContent ?? '');
      return below.length ? [inline, ...below].join('\n') : inline;
    });
    const clean = text.replace(/\u00a0/g, ' ');
    if (clean.trim() !== '') return clean;
    if (Date.now() > deadline) throw new StageError(`no ghost text within ${timeout} ms`);
    if (Date.now() > nextTrigger) {
      // editor.action.inlineSuggest.trigger
      await page.keyboard.press('Alt+Backslash');
      nextTrigger = Date.now() + 5000;
    }
    await page.waitForTimeout(200);
  }
}

async function saveAndRead(page) {
  await page.keyboard.press('Control+S');
  await page.waitForTimeout(700);
  return readFileSync(path.join(WORKSPACE, FILE), 'utf8');
}

function insertedText(before, after) {
  let i = 0;
  while (i < before.length && before[i] === after[i]) i++;
  let j = 0;
  while (j < before.length - i && before[before.length - 1 - j] === after[after.length - 1 - j]) j++;
  return after.slice(i, after.length - j);
}

main().then(
  (code) => {
    log(code === 0 ? 'PASS' : 'FAIL');
    process.exit(code);
  },
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
