"""One engine surface for the daemon (core/engine_like.EngineLike): the local Engine and the remote
target's RemoteEngine both have every member of it, and the service reads no other member of its
engine (checked from the sources: `engine.X` in service/)."""

from __future__ import annotations

import ast
from pathlib import Path

import tiny
from completiond.core.engine import Engine
from completiond.core.engine_like import EngineLike, PassCosts
from completiond.core.remote import RemoteEngine, parse_remote

SERVICE = Path(__file__).resolve().parent.parent / "completiond" / "service"


def members(protocol: type) -> set[str]:
    out = set()
    for cls in protocol.__mro__:
        if cls.__module__ == "completiond.core.engine_like" or cls.__name__ == "Turns":
            out |= {n for n in {**cls.__dict__, **cls.__dict__.get("__annotations__", {})} if not n.startswith("_")}
    return out


def test_the_local_and_the_remote_engine_are_engine_like():
    local = Engine(tiny.loaded())
    remote = RemoteEngine(parse_remote("openai:http://127.0.0.1:1/v1#m"), tiny.loaded().tokenizer)
    for engine in (local, remote):
        assert isinstance(engine, EngineLike), type(engine).__name__
        assert isinstance(engine.budget, PassCosts), type(engine).__name__
        missing = [m for m in members(EngineLike) if not hasattr(engine, m)]
        assert missing == [], (type(engine).__name__, missing)


def test_the_service_reads_only_the_engine_like_members():
    allowed = members(EngineLike)
    read = set()
    for path in SERVICE.glob("*.py"):
        tree = ast.parse(path.read_text())
        # `@engine.setter` (the daemon's engine property) is a decorator, not a read of the engine
        decorators = {id(d) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for d in f.decorator_list}
        for node in ast.walk(tree):
            # `d.engine.X`, `self.engine.X`, `engine.X`, `e.X` where e is an engine parameter
            if isinstance(node, ast.Attribute) and id(node) not in decorators and (
                    (isinstance(node.value, ast.Attribute) and node.value.attr == "engine")
                    or (isinstance(node.value, ast.Name) and node.value.id == "engine")):
                read.add((path.name, node.attr))
    assert read, "the scan found no engine reads: it no longer sees the service's code"
    assert sorted((f, a) for f, a in read if a not in allowed) == []
