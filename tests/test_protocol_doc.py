"""docs/protocol.md is the wire contract: every name a client can send or receive is in it.

The names are read from the code, not listed here: the daemon's dispatch table and params schema
(completiond/service), the language server's custom methods and settings (lsp/), the HTTP route table,
the Neovim plugin's user commands and namespace, the VS Code extension's commands. A method added to
the code without its line in the contract fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

from completiond.service import protocol as P

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "protocol.md").read_text()
SERVICE = sorted((ROOT / "completiond" / "service").glob("*.py"))
LSP = sorted((ROOT / "lsp" / "completiond_lsp").glob("*.py"))


def documented(name: str) -> bool:
    """`name` appears in the contract as a whole word (backticked, in a map, or in a table)."""
    return re.search(r"(?<![\w/.$-])" + re.escape(name) + r"(?![\w-])", DOC) is not None


def missing(names) -> list[str]:
    return sorted(n for n in set(names) if not documented(n))


def trees(files: list[Path]) -> list[tuple[Path, ast.Module]]:
    return [(f, ast.parse(f.read_text(), str(f))) for f in files]


def dispatched_methods() -> set[str]:
    """The keys of the daemon's dispatch table: a dict literal in completiond/service whose string keys
    include `initialize` and `complete` (wherever a refactor puts it)."""
    found: set[str] = set()
    for _, tree in trees(SERVICE):
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if {"initialize", "complete"} <= keys:
                    found |= keys
    return found


def test_every_dispatched_method_is_documented():
    methods = dispatched_methods()
    assert {"initialize", "complete", "status", "shutdown"} <= methods, methods  # the table was found
    assert not missing(methods), f"daemon methods missing from docs/protocol.md: {missing(methods)}"
    for m in methods:  # each in the methods table as a row of its own
        assert re.search(r"^\| `" + re.escape(m) + "` \\|", DOC, re.M), f"no row for `{m}` in the methods table"


def test_every_notification_the_daemon_sends_is_documented():
    """The streaming notifications (`complete/partial`, ...): string constants `<x>/partial` in the service."""
    partials = {n.value for _, t in trees(SERVICE) for n in ast.walk(t)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"[a-z_]+/partial", n.value)}
    assert "complete/partial" in partials, partials
    assert not missing(partials), f"notifications missing from docs/protocol.md: {missing(partials)}"


def test_every_param_and_result_field_is_documented():
    schema = [c for c in vars(P).values()
              if isinstance(c, type) and dataclasses.is_dataclass(c) and (issubclass(c, P.Params) or c is P.Completion)]
    assert P.Complete in schema and P.Completion in schema
    names = {f.name for c in schema for f in dataclasses.fields(c)}
    assert not missing(names), f"params / result fields missing from docs/protocol.md: {missing(names)}"


def test_every_error_code_and_the_version_are_documented():
    codes = {name: v for name, v in vars(P).items()
             if name.isupper() and isinstance(v, int) and not isinstance(v, bool) and -32899 <= v <= -32000}
    assert {"INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS", "CANCELLED"} <= set(codes), codes
    for name, code in codes.items():
        assert re.search(rf"^\| {code} \| `{name}` \|", DOC, re.M), f"error {code} ({name}) has no row in docs/protocol.md"
    assert f"`PROTOCOL_VERSION` is `{P.PROTOCOL_VERSION}`" in DOC


def _string_of(node: ast.expr, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def lsp_custom_methods() -> set[str]:
    """Methods and commands the language server registers or sends (`server.feature(X)`,
    `server.command(X)`, `protocol.notify(X, ...)`) that are completiond's own, not LSP's."""
    found: set[str] = set()
    for _, tree in trees(LSP):
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in (
                    "feature", "command", "notify") and n.args:
                name = _string_of(n.args[0], consts)
                if name and name.startswith("completiond"):
                    found.add(name)
    return found


def test_every_lsp_custom_method_is_documented():
    methods = lsp_custom_methods()
    assert {"completiond/nextEdit", "completiond/status"} <= methods, methods
    assert not missing(methods), f"LSP custom methods missing from docs/protocol.md: {missing(methods)}"


def test_every_lsp_setting_is_documented():
    from completiond_lsp.settings import Settings

    names = {f.name for f in dataclasses.fields(Settings)}
    assert "maxTokens" in names
    assert not missing(names), f"LSP settings missing from docs/protocol.md: {missing(names)}"


def http_routes() -> set[tuple[str, str]]:
    """(verb, path) of the HTTP route table: a dict literal whose values are ("GET"|"POST", handler)."""
    found: set[tuple[str, str]] = set()
    for _, tree in trees(SERVICE):
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if (isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("/")
                            and isinstance(v, ast.Tuple) and v.elts and isinstance(v.elts[0], ast.Constant)
                            and v.elts[0].value in ("GET", "POST", "PUT", "DELETE")):
                        found.add((v.elts[0].value, k.value))
    return found


def test_every_http_route_is_documented():
    routes = http_routes()
    assert ("POST", "/infill") in routes and ("GET", "/health") in routes, routes
    absent = sorted(f"{verb} {path}" for verb, path in routes if f"`{verb} {path}`" not in DOC)
    assert not absent, f"HTTP routes missing from docs/protocol.md: {absent}"


def test_neovim_commands_and_namespace_are_documented():
    lua = "\n".join(f.read_text() for f in (ROOT / "editors" / "neovim").rglob("*.lua"))
    commands = set(re.findall(r"nvim_create_user_command\(\s*['\"](\w+)['\"]", lua))
    assert "CompletiondStatus" in commands, commands
    absent = sorted(c for c in commands if not re.search(r":(?:'<,'>)?" + c + r"\b", DOC))
    assert not absent, f"Neovim user commands missing from docs/protocol.md: {absent}"
    namespaces = set(re.findall(r"nvim_create_namespace\(\s*['\"]([^'\"]+)['\"]", lua))
    assert namespaces, "no namespace found in the Neovim plugin"
    assert all(f"namespace named **`{ns}`**" in DOC for ns in namespaces), namespaces


def test_vscode_commands_are_documented():
    contributes = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text())["contributes"]
    commands = {c["command"] for c in contributes["commands"]}
    assert "completiond.rewriteSelection" in commands
    assert not missing(commands), f"VS Code commands missing from docs/protocol.md: {missing(commands)}"
