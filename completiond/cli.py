"""Command line: `completiond complete | convert | serve | status | stop | bench | train-draft | setup`.

Bad input (missing file, position out of range, unknown model, bad flag) prints one line on stderr
and exits with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import daemon_cli, setup_cli
from .bench import cli as bench_cli
from .draft import cli as draft_cli
from .flags import EXIT_USAGE, Parser, UsageError, check_model_flags, model_flags


def build_parser() -> Parser:
    parser = Parser(prog="completiond", description="Local code completion with lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", parser_class=Parser, required=True)

    c = sub.add_parser("complete", help="complete FILE at a position and print the completion")
    c.add_argument("file")
    c.add_argument("--line", type=int, required=True, help="1-based line")
    c.add_argument("--col", type=int, required=True, help="1-based column, in characters")
    c.add_argument("--mode", default="combined", choices=["ar", "pld", "draft", "combined"])
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=0)
    c.add_argument("--seed", type=int, default=None)
    ml = c.add_mutually_exclusive_group()
    ml.add_argument("--multiline", dest="multiline", action="store_true", default=True)
    ml.add_argument("--single-line", dest="multiline", action="store_false")
    model_flags(c)
    c.add_argument("--workspace", default=None, help="directory whose files feed prompt lookup")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--no-daemon", dest="daemon", action="store_false",
                   help="load the models here even when a daemon runs (default: a running daemon answers, "
                        "warm, when it serves what the flags ask for)")
    c.add_argument("--socket", default=None, help="the daemon's socket (default: $COMPLETIOND_SOCKET or the per-user one)")

    v = sub.add_parser("convert", help="convert a model to its runtime form in the cache now (what its first start "
                                       "would do), e.g. qwen2.5-coder-1.5b@int4")
    v.add_argument("model", help="a named model with its weights form (NAME@FORM), a .gguf file, or 'default'")
    v.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="the activations it will run with (auto: as a daemon on this CPU)")
    v.add_argument("--quant", default="auto", choices=["auto", "none", "int8", "int4"],
                   help="its weights form, the same as the model's @FORM")

    daemon_cli.add_parsers(sub)  # serve / status / stop
    draft_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    setup_cli.add_parser(sub)  # setup neovim / vscode
    return parser


def read_source(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file")
    if not p.is_file():
        raise UsageError(f"{path}: not a regular file")
    data = p.read_bytes()
    if not data:
        raise UsageError(f"{path}: file is empty, nothing to complete")
    if b"\0" in data[:8192]:
        raise UsageError(f"{path}: binary file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def cmd_complete(a: argparse.Namespace) -> int:
    from .core.prompt import PositionError, line_starts, offset_at

    text = read_source(a.file)
    if a.line < 1 or a.col < 1:
        raise UsageError("--line and --col are 1-based")
    if a.max_tokens < 1:
        raise UsageError("--max-tokens must be at least 1")
    if a.temperature < 0 or not 0 < a.top_p <= 1 or a.top_k < 0:
        raise UsageError("--temperature must be >= 0, --top-p in (0, 1], --top-k >= 0")
    check_model_flags(a)
    check_target_form(a)
    try:
        offset = offset_at(text, a.line - 1, a.col - 1, encoding="utf-32")
    except PositionError:
        starts = line_starts(text)
        if a.line > len(starts):
            why = f"line {a.line} is past the end (the file has {len(starts)} lines)"
        else:
            end = starts[a.line] if a.line < len(starts) else len(text)
            width = len(text[starts[a.line - 1]:end].rstrip("\r\n"))
            why = f"column {a.col} is past the end of line {a.line} (last column: {width + 1})"
        raise UsageError(f"{a.file}:{a.line}:{a.col}: position out of range: {why}") from None

    if a.daemon:
        answered = complete_via_daemon(a, text, offset, Path(a.file).resolve())
        if answered is not None:
            print(json.dumps(answered, ensure_ascii=False) if a.json else
                  answered["text"] + ("\n" if not answered["text"].endswith("\n") else ""), end="")
            return 0

    from .gc_pause import paused_gc

    with paused_gc():  # imports and loading (gc_pause.py)
        from .core.engine import Engine, Request, draft_for
        from .models.catalog import ModelError, spelled
        from .models.loader import draft_label, load, load_draft
        from .core.prompt import build_prompt
        from .core.speculation.verify import Sampling
        from .service.protocol import prefill_dtype
        from .service.workspace import index_workspace

        try:
            target = load(a.target, "target", a.device, a.dtype, a.quant)
            draft, unloaded = draft_for(a.draft, target) if a.mode == "combined" else (None, None)
            if a.mode == "draft":  # the draft alone: asked for, so loaded
                draft = load_draft(a.draft, target)
        except ModelError as e:
            raise UsageError(str(e)) from None
        if a.target == "default":  # the larger default not converted yet: one line on what serves, and how
            from .models.loader import pending_for

            if (p := pending_for(a.device, a.dtype, a.quant)) is not None:
                print(f"completiond: {spelled(target.name, target.meta.get('quant'))} answers while {p.spelled}, "
                      "this CPU's default, is not converted: `completiond serve` converts it in the background, "
                      f"`{p.convert_command}` now", file=sys.stderr)
    if a.mode == "draft" and draft is None:
        raise UsageError(f"--mode draft needs a draft model; {draft_label(a.draft, None, target)}")
    engine = Engine(target, draft, backend=a.backend)
    path = Path(a.file).resolve()
    if a.workspace:
        index_workspace(engine.index, target.tokenizer, Path(a.workspace), exclude={path})
    engine.index.set_open(path.as_uri(), target.tokenizer.encode(text, add_special_tokens=False))
    engine.calibrate_cached()
    root = Path(a.workspace).resolve() if a.workspace else path.parent
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    prompt = build_prompt(target.tokenizer, text, offset, multiline=a.multiline, path=rel, repo=root.name)
    req = Request(prompt=prompt.ids, mode=a.mode, max_tokens=a.max_tokens, seed=a.seed, stops=prompt.stops,
                  sampling=Sampling(a.temperature, a.top_p, a.top_k), heal=prompt.heal)
    res = engine.complete(req)
    if a.json:
        out = {
            "text": res.text, "token_ids": res.token_ids, "tokens": res.tokens, "mode": res.mode,
            "target_passes": res.target_passes, "mean_accepted": round(res.mean_accepted, 4),
            "ms_first_token": round(res.ms_first_token, 2), "ms_total": round(res.ms_total, 2),
            "target": spelled(target.name, target.meta.get("quant")), "draft": draft_label(a.draft, draft, target, unloaded),
            "dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device),
            "quant": target.meta.get("quant", "none"), "backend": engine.runner.backend,
            "prefill_dtype": prefill_dtype(target), "int8_kernel": target.meta.get("int8_kernel"),
            "weights": target.meta.get("weights"), "default_reason": target.meta.get("default_reason"), "stopped_by": res.stopped_by, "prompt_tokens": res.prompt_tokens,
            "accepted_by_depth": res.accepted_by_depth,
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write(res.text + ("\n" if not res.text.endswith("\n") else ""))
    return 0


def cmd_convert(a: argparse.Namespace) -> int:
    """Convert (assemble, hash-check, quantize) a model's runtime form into the cache and say where,
    so that the next start maps it: what a daemon that chose a not yet converted default asks for."""
    a.target = a.model
    check_target_form(a)
    from .gc_pause import paused_gc

    with paused_gc():
        from .models.catalog import ModelError, spelled
        from .models.loader import load

        try:
            m = load(a.model, "target", "cpu", a.dtype, a.quant)
        except ModelError as e:
            raise UsageError(str(e)) from None
    where = m.meta.get("runtime") or m.name
    print(f"completiond: {spelled(m.name, m.meta.get('quant'))} ({str(m.dtype).replace('torch.', '')}) is converted: "
          f"{where}; a daemon started now loads it (`completiond stop` ends a running one; editors start it again)",
          file=sys.stderr)
    return 0


def check_target_form(a: argparse.Namespace) -> None:
    """`--target NAME@FORM`: a known form, and no --quant that says otherwise (one line, exit 2).
    Only a spec with an @ is parsed here: models.catalog's package imports torch, which a completion
    a running daemon answers does not need."""
    if "@" not in a.target:
        return
    from .models.catalog import ModelError, split_form

    try:
        name, form = split_form(a.target)
    except ModelError as e:
        raise UsageError(f"--target {e}") from None
    if form and a.quant not in ("auto", form):
        raise UsageError(f"--target {a.target} runs its {form} weights but --quant says {a.quant}: give one "
                         f"of them (e.g. --target {name}@{a.quant})")


def _target_form(spec: str) -> tuple[str, str | None]:
    """(model, weights form or None) of a --target (see check_target_form)."""
    if "@" not in spec:
        return spec, None
    from .models.catalog import split_form

    return split_form(spec)


def daemon_mismatch(a: argparse.Namespace, info: dict) -> str | None:
    """Why the running daemon (its `status`) would not answer as a local load with these flags
    would; None when it would. Flags left at their defaults take what the daemon runs (its target is
    the one its owner chose); the draft changes only the speed of greedy text, so it must match only
    when sampling."""
    for flag in ("dtype", "quant", "device"):
        asked, runs = getattr(a, flag), str(info.get(flag))
        if asked != "auto" and not runs.startswith(asked):
            return f"--{flag} {asked}: it runs {runs}"
    name, form = _target_form(a.target)
    served = str(info.get("target"))
    if name != "default" and not _same_model(name, served):
        return f"--target {a.target}: it serves {served}"
    if form and str(info.get("quant")) != form:  # a bare name takes the form the daemon runs, as --quant auto
        return f"--target {a.target}: it serves {served} ({info.get('quant')} weights)"
    if a.backend != "auto":
        return f"--backend {a.backend}: the daemon chooses its own"
    daemon_draft = str(info.get("draft") or "none").split(" (")[0]
    if a.temperature > 0 and a.draft != "default" and a.mode in ("draft", "combined") and daemon_draft != a.draft:
        return f"--draft {a.draft} with sampling: it drafts with {info.get('draft')}"
    return None


def _same_model(spec: str, served: str) -> bool:
    """Whether the daemon's `target` (a named model spelled with its form, NAME@FORM) is `spec`."""
    if spec == served or served.startswith(spec + "@"):
        return True
    try:
        return Path(spec).expanduser().resolve() == Path(served).expanduser().resolve() and Path(spec).exists()
    except (OSError, ValueError):
        return False


def complete_via_daemon(a: argparse.Namespace, text: str, offset: int, path: Path) -> dict | None:
    """The completion from a running daemon (warm models and caches), or None: no daemon (quietly),
    or one that cannot answer as asked (one line saying why; the caller loads the models itself)."""
    import asyncio

    from .paths import socket_path
    from .service.client import DaemonError, Mismatch, complete_once

    sock = Path(a.socket) if a.socket else socket_path()
    if not sock.exists():
        return None
    line = text.count("\n", 0, offset)
    character = offset - (text.rfind("\n", 0, offset) + 1)
    params = {"mode": a.mode, "max_tokens": a.max_tokens, "temperature": a.temperature, "top_p": a.top_p,
              "top_k": a.top_k, "seed": a.seed, "multiline": a.multiline, "quick": False}
    roots = [str(Path(a.workspace).resolve())] if a.workspace else []

    def waiting(st: dict) -> None:
        print(f"completiond: waiting for the daemon on {sock} to load its models ({st.get('phase', 'loading')})",
              file=sys.stderr)

    try:
        info, res = asyncio.run(complete_once(sock, path.as_uri(), text, line, character, params,
                                              lambda st: daemon_mismatch(a, st), roots, waiting))
    except (FileNotFoundError, ConnectionRefusedError):
        return None  # a socket file with no daemon behind it
    except Mismatch:  # flags that ask for other models or settings: loaded here, as without a daemon
        return None
    except (DaemonError, OSError, TimeoutError, asyncio.TimeoutError) as e:
        print(f"completiond: the daemon on {sock} did not answer ({e or type(e).__name__}); loading the models "
              "here", file=sys.stderr)
        return None
    keys = ("target", "draft", "dtype", "device", "quant", "prefill_dtype", "int8_kernel", "weights", "default_reason")
    return {**res, **{k: info.get(k) for k in keys}, "daemon": str(sock)}


def _check_cache() -> None:
    """The cache folders are private to this user (created 0700), or one line and exit 2."""
    from .cache_dir import UnsafeDirError, check_cache

    try:
        check_cache()
    except UnsafeDirError as e:
        raise UsageError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        args = build_parser().parse_args(argv)
        if args.command not in ("status", "stop"):  # they read no cache; the rest may load code from it
            _check_cache()
        if args.command == "complete":
            return cmd_complete(args)
        if args.command == "convert":
            return cmd_convert(args)
        return args.func(args)
    except UsageError as e:
        print(f"completiond: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
