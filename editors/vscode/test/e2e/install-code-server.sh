#!/usr/bin/env bash
# Install code-server (VS Code in the browser) for the e2e test into editors/vscode/.e2e/code-server
# (git-ignored). Works offline apart from the npm registry:
#  - code-server 4.100.3 is the newest release that runs on Node 20;
#  - its postinstall needs --unsafe-perm as root and the Debian packages libkrb5-dev libx11-dev
#    libxkbfile-dev libsecret-1-dev (plus build-essential, python3) for its native modules;
#  - @vscode/ripgrep's postinstall downloads ripgrep from GitHub. It first looks for the archive in
#    $TMPDIR/vscode-ripgrep-cache-<version>/, so we put one there built from Debian's /usr/bin/rg.
# Usage: install-code-server.sh [DIR]   (prints the path of the code-server executable)
set -euo pipefail

CS_VERSION="${CODE_SERVER_VERSION:-4.100.3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${1:-$HERE/../../.e2e/code-server}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
BIN="$DIR/node_modules/.bin/code-server"

if [ -x "$BIN" ] && [ -e "$DIR/node_modules/code-server/lib/vscode/node_modules/@vscode/ripgrep/bin/rg" ]; then
  echo "$BIN"
  exit 0
fi

RG="$(command -v rg || true)"
if [ -z "$RG" ]; then
  echo "install-code-server: ripgrep is missing (apt-get install ripgrep)" >&2
  exit 1
fi

# Seed @vscode/ripgrep's download cache (version of the module and of its ripgrep release).
TMP="$DIR/../tmp"
mkdir -p "$TMP/stage"
cp "$RG" "$TMP/stage/rg"
for mod in 1.15.11 1.15.10 1.15.9 1.15.14; do
  for rel in v13.0.0-10 v13.0.0-4; do
    mkdir -p "$TMP/vscode-ripgrep-cache-$mod"
    tar czf "$TMP/vscode-ripgrep-cache-$mod/ripgrep-$rel-x86_64-unknown-linux-musl.tar.gz" -C "$TMP/stage" rg
  done
done

cd "$DIR"
[ -f package.json ] || echo '{"name":"e2e-code-server","private":true}' > package.json
echo "install-code-server: npm install code-server@$CS_VERSION (builds native modules; several minutes)" >&2
# Fetch without scripts, then run the two packages' install scripts explicitly (npm only runs
# them on a fresh install, so a half-finished earlier attempt would otherwise never be repaired).
npm install --ignore-scripts --no-audit --no-fund "code-server@$CS_VERSION" >&2
# npm_config_yes: node-pty's post-install runs `npx node-gyp`, which would wait for a "yes".
TMPDIR="$TMP" npm_config_yes=true npm_config_unsafe_perm=true npm rebuild --unsafe-perm argon2 code-server >&2
if [ ! -e "$DIR/node_modules/code-server/lib/vscode/node_modules/@vscode/ripgrep/bin/rg" ]; then
  echo "install-code-server: code-server's postinstall did not finish (see the npm log above)" >&2
  exit 1
fi
echo "$BIN"
