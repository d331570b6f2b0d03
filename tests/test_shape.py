"""The shape of the code, checked from the sources (no imports run): the import graph between
files has no circle and runs one way down the layers, no two classes share a name, and no pass
takes its context from attributes set on shared objects (a PassContext argument instead).

Layers, top to bottom (a file may import files of its own layer and of lower layers only):

  tools     cli.py, __main__.py, daemon_cli.py, setup_cli.py, bench/, draft/, the LSP server
            (lsp/completiond_lsp): entry points, each drives the layers below
  service   service/: the daemon, its wire, sessions, documents, workspace, HTTP
  core      core/: the engine and its scheduler, a request and its result, the remote target
  prompt    core/prompt/: text -> prompt tokens, stop rules, context files, typed-through
  speculation core/speculation/: proposers, token tree, verification, budget, heads, index
  forward   core/forward/: the target pass (runner), its KV cache, the native layer
  models    models/: finding, fetching, loading a model, its weight form (quantization) and the
            kernels that multiply it (models/kernels/, C sources and their header)
  base      paths.py, files.py, flags.py, cache_dir.py, limits.py, __init__.py: torch-free helpers

Every import counts, for the layers and for circles: module level, inside functions and under
TYPE_CHECKING (an annotation is a dependency a reader follows too). Where a module needs the type of
one that imports it (the handlers, the daemon that dispatches to them), it names a Protocol of a
module below both (service/serving.py, core/engine_like.py, alternatives.EngineSteps)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"completiond": ROOT / "completiond", "completiond_lsp": ROOT / "lsp" / "completiond_lsp"}

# (rank, dotted prefix); the longest matching prefix names a module's layer.
LAYERS = [
    (0, "completiond_lsp"), (0, "completiond.cli"), (0, "completiond.__main__"),
    (0, "completiond.daemon_cli"), (0, "completiond.setup_cli"), (0, "completiond.bench"),
    (0, "completiond.draft"),
    (1, "completiond.service"),
    (2, "completiond.core"),
    (3, "completiond.core.prompt"),
    (4, "completiond.core.speculation"),
    (5, "completiond.core.forward"),
    (6, "completiond.models"),
    (7, "completiond"),
]


def modules() -> dict[str, Path]:
    """Every module of the packages: dotted name -> file."""
    return modules_of(PACKAGES)


def modules_of(packages: dict[str, Path]) -> dict[str, Path]:
    out = {}
    for pkg, folder in packages.items():
        for f in sorted(folder.rglob("*.py")):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = f
    return out


def _typing_only(tree: ast.AST) -> set[ast.AST]:
    """The import statements under `if TYPE_CHECKING:`."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(n for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return out


def imports(name: str, path: Path, known: dict[str, Path], typing: bool = True) -> set[str]:
    """The project modules `name` imports, wherever the import statement stands (without the
    ones under TYPE_CHECKING unless `typing`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph(typing: bool = True) -> dict[str, set[str]]:
    known = modules()
    return {n: imports(n, p, known, typing) for n, p in known.items()}


def layer(name: str) -> tuple[int, str]:
    rank, prefix = max(((r, p) for r, p in LAYERS if name == p or name.startswith(p + ".")), key=lambda rp: len(rp[1]))
    return rank, prefix


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    assert circles(graph(typing=True)) == []


def test_imports_run_down_the_layers() -> None:
    bad = []
    for a, targets in sorted(graph().items()):
        ra, _ = layer(a)
        for b in sorted(targets):
            rb, _ = layer(b)
            if rb < ra:
                bad.append(f"{a} -> {b}")
    assert bad == []


def test_one_class_per_name() -> None:
    where = defaultdict(list)
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(name)
    assert {n: ms for n, ms in where.items() if len(ms) > 1} == {}


def test_the_engine_thread_writes_no_session_state() -> None:
    """The guard behind the thread rule (service/plan.py): session state written on the engine
    thread fails, so every daemon test that completes shows the engine thread wrote none."""
    import threading

    from completiond.core.scheduler import ENGINE_THREAD
    from completiond.service.plan import LoopOwned

    anchors = LoopOwned()
    anchors["on the loop"] = 1
    failed: list[BaseException] = []

    def engine() -> None:
        try:
            anchors["on the engine thread"] = 2
        except AssertionError as e:
            failed.append(e)

    t = threading.Thread(target=engine, name=ENGINE_THREAD)
    t.start()
    t.join()
    assert failed and list(anchors) == ["on the loop"]


# A pass gets its context as an argument (core/forward/context.PassContext): nothing sets these on a
# runner, its decoder layers or a proposer for the length of a job. One object keeps a field of that
# name: a request's decode state (decoding.Decoding, one per request), the feature its next proposal reads.
# A pass's outputs and a step's gate decision are returned as values too (Runner.run_pass's Pass,
# Engine.propose's decision): nothing sets them on the runner or the engine for the caller to read.
PASS_STATE = {"check", "preempt", "feature", "_completiond_check", "last_hidden", "last_pass_ms", "_gated"}
OWN_STATE = {("completiond.core.engine", "st.feature")}


def pass_state_writes(packages: dict[str, Path] | None = None) -> list[str]:
    """Every `x.check = ...` (or preempt, feature, the old layer hook's attribute; also augmented,
    annotated, in a tuple, or through setattr) in the product's sources, but OWN_STATE."""
    found = []
    for name, path in modules_of(packages or PACKAGES).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                  and node.args[1].value in PASS_STATE):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
            for t in (e for t in targets for e in ast.walk(t)):
                if (isinstance(t, ast.Attribute) and t.attr in PASS_STATE
                        and (name, ast.unparse(t)) not in OWN_STATE):
                    found.append(f"{name}:{t.lineno} {ast.unparse(t)}")
    return found


def test_a_pass_gets_its_context_as_an_argument() -> None:
    assert pass_state_writes() == []
