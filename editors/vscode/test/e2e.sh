#!/usr/bin/env bash
# Real-editor test of the completiond extension: code-server (VS Code) on loopback with our .vsix,
# driven by headless Chromium through playwright-core (test/e2e/run.mjs).
#
#   bash test/e2e.sh            # from editors/vscode (or: npm run e2e)
#
# Environment:
#   COMPLETIOND_LSP           server command written as completiond.serverPath (default completiond-lsp)
#   COMPLETIOND_E2E_SETTINGS  JSON object merged into the settings (completiond.* keys into the remote
#                             "Machine" settings.json, others into the User one), e.g.
#                             '{"completiond.target": "/tmp/tiny", "completiond.draft": "none", "completiond.maxTokens": 8}'
#   CODE_SERVER               code-server executable (default: .e2e/code-server, installed on first use)
#   CHROMIUM                  Chromium executable (default /usr/bin/chromium)
#   E2E_UNTIL                 last stage: open|activate|ready|inline|word|settings|rewrite (default: all)
#   E2E_SCREENSHOT            ghost-text screenshot (default <repo>/benchmarks/results/vscode-inline.png)
#   E2E_KEEP=1                keep the temporary directory (user data, logs, workspace)
# Debian packages needed: chromium ripgrep (and for installing code-server: build-essential python3
# libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev).
# test/e2e/ci-install.sh installs all of it on a fresh Debian machine (.ci/run does, as root); pytest
# runs this script through tests/test_vscode_e2e.py.
set -euo pipefail

EXT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="$(cd "$EXT/../.." && pwd)"
cd "$EXT"
T0=$(date +%s)
say() { echo "[e2e.sh $(( $(date +%s) - T0 ))s] $*"; }

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
[ -x "$CHROMIUM" ] || { echo "e2e: Chromium not found at $CHROMIUM (apt-get install chromium)" >&2; exit 2; }

# ---- code-server ----------------------------------------------------------------------------
if [ -z "${CODE_SERVER:-}" ]; then
  CODE_SERVER="$(bash "$EXT/test/e2e/install-code-server.sh" "$EXT/.e2e/code-server")"
fi
say "code-server: $CODE_SERVER ($("$CODE_SERVER" --config /dev/null --version 2>/dev/null | head -1))"

# ---- build the .vsix ------------------------------------------------------------------------
[ -d node_modules ] || npm ci --no-audit --no-fund
npm run --silent package >/dev/null
VSIX="$EXT/completiond.vsix"
say "built $VSIX"

# ---- temp dirs, settings, workspace ---------------------------------------------------------
TMP="$(mktemp -d "${TMPDIR:-/tmp}/completiond-e2e.XXXXXX")"
USER_DATA="$TMP/user-data"
EXTENSIONS="$TMP/extensions"
WORKSPACE="$TMP/workspace"
PROFILE="$TMP/chromium-profile"
ARTIFACTS="$EXT/.e2e/artifacts"
mkdir -p "$USER_DATA/User" "$EXTENSIONS" "$WORKSPACE" "$PROFILE" "$ARTIFACTS"
rm -f "$ARTIFACTS"/*.png
CS_PID=""
machine_socket() {  # completiond.socket as configured for this run
  node -e 'try{const s=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"))["completiond.socket"];if(s)console.log(s)}catch{}' \
    "$USER_DATA/Machine/settings.json" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  set +e  # the clean-up runs to its end; its own failures are warnings
  # code-server runs in a process group of its own (setsid below): stop all of it (extension host,
  # language server) and wait until none of it is left, so nothing writes into $TMP as it goes
  if [ -n "$CS_PID" ]; then
    kill -TERM -- "-$CS_PID" 2>/dev/null || true
    for _ in $(seq 1 40); do pgrep -g "$CS_PID" >/dev/null 2>&1 || break; sleep 0.25; done
    kill -KILL -- "-$CS_PID" 2>/dev/null || true
    wait "$CS_PID" 2>/dev/null || true
  fi
  # the daemon the server autostarted outlives the editor by design: stop it (our socket only)
  local sock
  sock="$(machine_socket)"
  if [ -n "$sock" ] && [ -S "$sock" ] && [ "$sock" = "${E2E_DAEMON_SOCKET:-}" ]; then
    if command -v completiond >/dev/null; then timeout 30 completiond stop --socket "$sock" >/dev/null 2>&1 || true
    else timeout 30 python3 -m completiond stop --socket "$sock" >/dev/null 2>&1 || true; fi
    for _ in $(seq 1 20); do [ -S "$sock" ] || break; sleep 0.5; done
    [ -S "$sock" ] && say "warning: the daemon on $sock may still be running"
  fi
  if [ "$rc" -ne 0 ]; then
    echo "---- code-server log (tail) ----"; tail -n 30 "$TMP/code-server.log" 2>/dev/null || true
    for f in $(find "$USER_DATA/logs" -iname '*completiond*.log' 2>/dev/null) "$TMP"/*.log; do
      [ -f "$f" ] || continue
      case "$f" in */code-server.log) continue ;; esac
      echo "---- $f (tail) ----"; tail -n 40 "$f"
    done
  fi
  # a failing clean-up only warns: it never turns a passing run red
  if [ "${E2E_KEEP:-0}" = 1 ]; then say "kept $TMP"
  else
    for _ in 1 2 3 4 5; do rm -rf "$TMP" 2>/dev/null && break; sleep 1; done
    [ -e "$TMP" ] && say "warning: could not remove $TMP"
  fi
  say "done (exit $rc)"
  exit "$rc"
}
trap cleanup EXIT

cp "$EXT/test/e2e/workspace/sample.py" "$WORKSPACE/sample.py"

export E2E_DAEMON_SOCKET="$TMP/daemon.sock"
mkdir -p "$USER_DATA/Machine"
node - "$USER_DATA/User/settings.json" "$USER_DATA/Machine/settings.json" <<'EOF'
const fs = require('fs');
// User settings: a quiet workbench; nothing may steal focus or the Tab key from the editor.
const user = {
  'workbench.startupEditor': 'none',
  'workbench.tips.enabled': false,
  'workbench.enableExperiments': false,
  'workbench.welcomePage.walkthroughs.openOnInstall': false,
  'security.workspace.trust.enabled': false,
  'telemetry.telemetryLevel': 'off',
  'update.mode': 'none',
  'extensions.autoCheckUpdates': false,
  'extensions.autoUpdate': false,
  'extensions.ignoreRecommendations': true,
  'editor.quickSuggestions': { other: 'off', comments: 'off', strings: 'off' },
  'editor.suggestOnTriggerCharacters': false,
  'editor.wordBasedSuggestions': 'off',
  'editor.inlineSuggest.enabled': true,
  'files.autoSave': 'off',
};
// Remote ("Machine") settings: code-server is a remote window, where settings of scope
// machine-overridable (serverPath, socket, target, ...) are read from here, not from User.
const machine = {
  'completiond.serverPath': process.env.COMPLETIOND_LSP || 'completiond-lsp',
  // a daemon of our own (autostarted by the server), not the user's; stopped at the end
  'completiond.socket': process.env.E2E_DAEMON_SOCKET,
  'completiond.trace.server': 'messages',
};
const extra = process.env.COMPLETIOND_E2E_SETTINGS;
if (extra) {
  const parsed = JSON.parse(extra);
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('COMPLETIOND_E2E_SETTINGS must be a JSON object');
  for (const [k, v] of Object.entries(parsed)) (k.startsWith('completiond.') ? machine : user)[k] = v;
}
fs.writeFileSync(process.argv[2], JSON.stringify(user, null, 2));
fs.writeFileSync(process.argv[3], JSON.stringify(machine, null, 2));
console.log('Machine settings.json: ' + JSON.stringify(machine));
EOF

printf 'bind-addr: 127.0.0.1:0\nauth: none\ncert: false\n' > "$TMP/code-server.yaml"
CS_ARGS=(--config "$TMP/code-server.yaml" --user-data-dir "$USER_DATA" --extensions-dir "$EXTENSIONS")
"$CODE_SERVER" "${CS_ARGS[@]}" --install-extension "$VSIX" --force 2>&1 | tail -n 2
say "installed the extension: $("$CODE_SERVER" "${CS_ARGS[@]}" --list-extensions --show-versions 2>/dev/null | tr '\n' ' ')"

# ---- start code-server on a free loopback port --------------------------------------------------
PORT="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
# test/e2e/fake-lsp.py (if used as COMPLETIOND_LSP) records what it receives here
export FAKE_LSP_LOG="$TMP/fake-lsp.jsonl"
setsid "$CODE_SERVER" "${CS_ARGS[@]}" --bind-addr "127.0.0.1:$PORT" --auth none \
  --disable-telemetry --disable-update-check --disable-workspace-trust \
  --disable-getting-started-override --ignore-last-opened "$WORKSPACE" \
  >"$TMP/code-server.log" 2>&1 &
CS_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 120); do
  if curl -fsS "$URL/healthz" >/dev/null 2>&1; then break; fi
  kill -0 "$CS_PID" 2>/dev/null || { echo "e2e: code-server exited" >&2; exit 1; }
  sleep 0.5
done
curl -fsS "$URL/healthz" >/dev/null
say "code-server at $URL (pid $CS_PID)"

# ---- drive it -------------------------------------------------------------------------------------
E2E_URL="$URL" E2E_WORKSPACE="$WORKSPACE" E2E_USER_DATA="$USER_DATA" \
E2E_FAKE_LSP_LOG="$FAKE_LSP_LOG" E2E_EXPECT_SOCKET="$(machine_socket)" \
 E2E_FILE=sample.py E2E_PROFILE="$PROFILE" \
E2E_ARTIFACTS="$ARTIFACTS" E2E_SCREENSHOT="${E2E_SCREENSHOT:-$REPO/benchmarks/results/vscode-inline.png}" \
CHROMIUM="$CHROMIUM" node "$EXT/test/e2e/run.mjs"
