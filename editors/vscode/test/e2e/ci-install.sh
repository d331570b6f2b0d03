#!/usr/bin/env bash
# Install what the VS Code real-editor test (test/e2e.sh) needs on a fresh Debian machine; .ci/run
# calls it (as root). Idempotent: what is there already is kept (code-server is cached in .e2e/).
#   - Debian: chromium (driven by playwright-core), ripgrep (seeds code-server's ripgrep download),
#     and the headers code-server's native modules build against;
#   - the extension's npm packages (npm ci), then code-server from npm (test/e2e/install-code-server.sh).
# Measured on a 2-core CI-size machine: apt-get ~40 s, code-server ~110 s; a second run ~1 s.
set -euo pipefail
EXT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
T0=$(date +%s)
say() { echo "[e2e ci-install $(( $(date +%s) - T0 ))s] $*"; }

DEBS=(chromium ripgrep build-essential python3 libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev)
missing=()
for pkg in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "e2e ci-install: needs root to install: ${missing[*]}" >&2
    exit 1
  fi
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v node >/dev/null && command -v npm >/dev/null || { echo "e2e ci-install: node and npm are needed" >&2; exit 1; }

cd "$EXT"
[ -d node_modules ] || { say "npm ci"; npm ci --no-audit --no-fund >/dev/null; }
CODE_SERVER="$(bash "$EXT/test/e2e/install-code-server.sh" "$EXT/.e2e/code-server")"
say "ready: chromium $(/usr/bin/chromium --version 2>/dev/null | awk '{print $2}'), code-server at $CODE_SERVER"
