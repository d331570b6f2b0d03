"""`completiond setup neovim | vscode`: put the editor plugins of this checkout where the editors
load them.

  neovim   links (or with --copy, copies) editors/neovim into a Neovim pack path
           (~/.local/share/nvim/site/pack/completiond/start/completiond) and prints the init.lua line
  vscode   builds editors/vscode into a .vsix (npm ci + vsce) and installs it with
           `code --install-extension` when `code` is on PATH, else prints where the .vsix is
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .flags import UsageError

EDITORS = Path(__file__).resolve().parent.parent / "editors"  # a checkout (or editable install)
LSP_LINE = "require('completiond').setup({})"


def add_parser(sub) -> None:
    p = sub.add_parser("setup", help="install the Neovim plugin or the VS Code extension from this checkout")
    which = p.add_subparsers(dest="editor", required=True, parser_class=type(p))
    n = which.add_parser("neovim", help="link the plugin into a Neovim pack path and print the init.lua line")
    n.add_argument("--pack-dir", default=None,
                   help="the pack folder (default: $XDG_DATA_HOME/nvim/site/pack, ~/.local/share/... without it)")
    n.add_argument("--copy", action="store_true", help="copy the plugin instead of linking it (no update on git pull)")
    n.add_argument("--force", action="store_true", help="replace a different plugin folder or link already there")
    n.set_defaults(func=cmd_neovim)
    v = which.add_parser("vscode", help="build the .vsix and install it with `code` when it is on PATH")
    v.add_argument("--code", default="code", help="the VS Code command (default: code)")
    v.add_argument("--no-install", action="store_true", help="only build the .vsix and print its path")
    v.set_defaults(func=cmd_vscode)


def plugin_source(name: str) -> Path:
    src = EDITORS / name
    if not src.is_dir():
        raise UsageError(f"the {name} plugin is not in this install ({src} is missing): run `completiond setup` "
                         f"from a completiond checkout installed with `pip install -e`")
    return src


def default_pack_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "nvim" / "site" / "pack"


def lsp_command() -> str | None:
    """The `cmd` option to print when completiond-lsp is not on PATH (Neovim would not find it)."""
    if shutil.which("completiond-lsp"):
        return None
    return "{ %s, '-m', 'completiond_lsp.server' }" % repr(sys.executable).replace('"', "'")


def cmd_neovim(a: argparse.Namespace) -> int:
    src = plugin_source("neovim")
    pack = Path(a.pack_dir).expanduser() if a.pack_dir else default_pack_dir()
    if a.pack_dir and pack.exists() and not pack.is_dir():
        raise UsageError(f"--pack-dir {pack} is not a directory")
    dest = pack / "completiond" / "start" / "completiond"
    try:
        action = _install_neovim(src, dest, a.copy, a.force)
    except (OSError, RuntimeError) as e:  # a symlink loop (ELOOP, or RuntimeError from resolve), a file in the way
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        where = f" ({e.filename})" if isinstance(e, OSError) and e.filename else ""
        raise UsageError(f"cannot install the Neovim plugin at {dest}: {why}{where}") from None
    print(f"completiond: Neovim plugin {action}: {dest} -> {src}")
    cmd = lsp_command()
    line = LSP_LINE if cmd is None else "require('completiond').setup({ cmd = %s })" % cmd
    print("Add this line to your init.lua (Neovim >= 0.10):")
    print(f"  {line}")
    return 0


def _install_neovim(src: Path, dest: Path, copy: bool, force: bool) -> str:
    """Link (or copy) src at dest; what was done. OSError / RuntimeError from the file system."""
    if dest.is_symlink() and not copy:
        try:
            if os.path.realpath(dest, strict=True) == str(src.resolve()):
                return "already linked"
        except OSError:  # a dangling or looping link: not ours, replaced with --force
            pass
    if dest.is_symlink() or dest.exists():
        if not force:
            raise UsageError(f"{dest} exists and is not a link to {src}: pass --force to replace it")
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        else:
            shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if copy:
        shutil.copytree(src, dest)
        return "copied"
    dest.symlink_to(src, target_is_directory=True)
    return "linked"


def run(cmd: list[str], cwd: Path) -> None:
    print("+ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-15:])
        raise UsageError(f"`{' '.join(cmd)}` failed (exit {done.returncode}):\n{tail}")


def cmd_vscode(a: argparse.Namespace) -> int:
    src = plugin_source("vscode")
    npm = shutil.which("npm")
    if npm is None:
        raise UsageError("npm is not on PATH: the VS Code extension is built with Node.js 20 and npm")
    vsix = src / "completiond.vsix"
    try:  # a .vsix from an earlier build must not pass for this one's
        vsix.unlink(missing_ok=True)
    except OSError as e:
        raise UsageError(f"cannot remove the old {vsix}: {e.strerror}") from None
    run([npm, "ci", "--no-audit", "--no-fund"], src)
    run([npm, "run", "package"], src)
    if not vsix.is_file():
        raise UsageError(f"the build did not write {vsix}")
    print(f"completiond: built {vsix}")
    code = None if a.no_install else shutil.which(a.code)
    if code is None:
        print(f"`{a.code}` is not on PATH: install the extension with\n  {a.code} --install-extension {vsix}\n"
              f"or in VS Code: Extensions > ... > Install from VSIX...")
        return 0
    run([code, "--install-extension", str(vsix), "--force"], src)
    print(f"completiond: installed {vsix.name} into VS Code ({code})")
    return 0
