"""Next-edit benchmark: is the predicted next edit right, how long after the request does it come,
how much of its prompt was already cached, and what does copy speculation save over plain decoding?

Cases, all from real code:
- rename propagation: a function of a public package whose parameter is renamed in its signature
  (the history); right when the document after the answer's edits has the first k >= 1 code uses of
  the parameter in that function renamed (in order; mentions in strings and comments may be renamed
  or not) and nothing else changed;
- release diffs: two consecutive releases of a public package (wheels, diffed); in a file with two
  nearby hunks, the earlier hunk applied is the history and the next one is the expected edit (right
  when the region after the answer equals the region after that hunk).

Each case is timed as the daemon serves it (`--warm rest`): the next-edit prompt at the cursor was
prefilled while the cursor rested on the parameter before the edit (the text before it, the window
at the cursor: service/next_edit.Ahead), then the user typed the edit and asked; the latency is from
the request to the answer, with the prompt tokens it found cached (`reused_tokens`). `--warm none`
prefills every prompt cold (the daemon before it warmed next edits). Plain decoding (mode ar, cold,
the first `--ar` cases) must give the same tokens (greedy, lossless). Reported per case kind: passes,
latency p50/p95, prompt tokens reused, exact-edit rate and edit similarity; per case the tree of
every decode pass (nodes, accepted), and the decode priced at the run's final pass-cost table
(`decode_ms_at_table`: variants compared without the load's noise). `--variants tight long` runs
each case with 16-token prompt-lookup candidates and with the daemon's 64-token copy runs.

    python -m benchmarks.next_edit --target qwen2.5-coder-0.5b --renames 16 --releases 2 \\
        --json benchmarks/results/next-edit-0.5b-warm.json

Before numbers come from the same script on an older checkout (PYTHONPATH at it, the script copied
out of this tree): without `next_edit_window` it uses the plain window and, with `--warm none`, the
cold prefill the daemon then did.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import difflib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tokenize
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from completiond.core.prompt.next_edit import answer_text, edits, next_edit_prompt, window_at  # noqa: E402
from completiond.paths import cache_root  # noqa: E402
from completiond.models.device import cpu_name  # noqa: E402
from completiond.service.history import History  # noqa: E402

try:  # the window that follows the edit (an older checkout, for before numbers, has only window_at)
    from completiond.core.prompt.next_edit import next_edit_window, removed_names  # noqa: E402
except ImportError:
    next_edit_window, removed_names = None, None
try:
    from completiond.core.prompt.next_edit import USE_LINES  # noqa: E402
except ImportError:
    USE_LINES = None
try:  # the names the region follows, the name under a resting cursor included (service/next_edit.prepare)
    from completiond.service.next_edit import followed_names  # noqa: E402
except ImportError:
    followed_names = None
try:  # the rename draft for copy speculation (service/next_edit.prepare)
    from completiond.core.prompt.next_edit import renamed_draft  # noqa: E402
except ImportError:
    renamed_draft = None
try:  # the answer's token budget (an older checkout: twice the region + 64)
    from completiond.core.prompt.next_edit import answer_budget  # noqa: E402
except ImportError:
    answer_budget = None
try:  # prompt-lookup candidates of a next edit: copy runs of up to this many tokens (else the engine's 16)
    from completiond.core.prompt.next_edit import COPY_RUN  # noqa: E402
except ImportError:
    COPY_RUN = None
try:  # a signature change's draft: the region's other calls changed the same way
    from completiond.core.prompt.next_edit import call_draft  # noqa: E402
except ImportError:
    call_draft = None

# packages not used to tune the prompt (toolz 0.12 and boltons 23 were: rounds 4-5 of docs/next-edit.md)
PACKAGES = ["more_itertools==10.8.0:11.1.0", "fsspec==2026.7.0:2026.9.0"]
NEW_NAMES = ["value", "items", "data", "source", "obj", "target_value", "payload"]


@dataclass
class Case:
    kind: str  # "rename" | "release"
    name: str  # file:line and what changed
    before: str  # the document before the history edit
    text: str  # the document now (history edit applied)
    anchor: int  # offset of the end of the history edit (the cursor after typing it)
    cursor: int  # offset in `before` where the cursor rested before the edit (the warm-up's anchor)
    expected: list[str]  # acceptable documents after the next edit (the first: the full expected edit)
    between: tuple[str, ...] = ()  # documents between `before` and `text` (more edits in the history)


# Variants compared side by side on every case (`--variants`): how the region is chosen.
# base: the region follows only the names the last edit removed (a resting cursor's region does not
# follow the name under it) and ends at the plain window's end; tight: the name under a resting
# cursor is followed too (the prompt warmed at rest has the request's region) and a region that
# follows a use ends USE_LINES lines below it; long: tight, with prompt-lookup candidates of up to
# COPY_RUN tokens (the daemon's next edit), where base and tight keep the engine's 16.
VARIANTS = ("base", "tight", "long")


def history_of(case: Case) -> History:
    h = History()
    docs = (case.before, *case.between, case.text)
    for i, (a, b) in enumerate(zip(docs, docs[1:])):
        h.record("file:///" + case.name.split(":")[0], a, b, now=10.0 * i)  # apart: separate edits
    return h


def window_for(text: str, anchor: int, h: History, variant: str = "tight"):
    """The editable region the daemon picks (service/next_edit.prepare): following the names the
    last edit removed, where this checkout has that."""
    if next_edit_window is None:
        return window_at(text, anchor)
    last = h.edits[-1] if h.edits else None
    if variant in ("tight", "long") and followed_names is not None:
        return next_edit_window(text, anchor, followed_names(text, anchor, last))
    names = removed_names(last.old, last.new, last.before, last.after) if last is not None else []
    return next_edit_window(text, anchor, names, use_lines=None)


def shown_diffs(h: History, path: str) -> list[str]:
    return [e.diff(path) for e in (h.shown() if hasattr(h, "shown") else h.recent())]


def wheel_files(req: str) -> dict[str, str]:
    """The .py files of a pinned wheel from PyPI (pip download, cached under the user cache dir)."""
    dest = cache_root() / "bench-repos" / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    name, version = req.split("==")
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{name.lower()}-{version}-")]
    if not found:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", tmp, req]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"pip could not download {req}: {done.stderr.strip().splitlines()[-1:]}")
            for p in Path(tmp).glob("*.whl"):
                p.rename(dest / p.name)
        found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{name.lower()}-{version}-")]
    with zipfile.ZipFile(found[0]) as z:
        return {n: z.read(n).decode("utf-8", "replace") for n in sorted(z.namelist())
                if n.endswith(".py") and "/tests/" not in n and not n.endswith("_version.py")}


def rename_cases(files: dict[str, str], n: int) -> list[Case]:
    """Functions whose first non-self parameter is used within the window below the signature, taken
    round-robin over the files (diverse code)."""
    per_file = [_renames(path, text) for path, text in files.items()]
    out: list[Case] = []
    while len(out) < n and any(per_file):
        for cases in per_file:
            if cases and len(out) < n:
                out.append(cases.pop(0))
    return out


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _body_end(text: str, indent: str, start: int) -> int:
    """Where the function whose body starts at `start` ends: the first code line indented no deeper
    than its `def` (the next function, a class, module code), else the end of the text."""
    pos = start
    while pos < len(text):
        nl = text.find("\n", pos)
        line = text[pos:nl if nl >= 0 else len(text)]
        if line.strip() and not line.startswith(indent + " ") and not line.startswith(indent + "\t") \
                and len(line) - len(line.lstrip()) <= len(indent):
            return pos
        if nl < 0:
            break
        pos = nl + 1
    return len(text)


def _uses(text: str, name: str, lo: int, hi: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Spans of `name` in text[lo:hi] by Python's tokenizer: (code uses: the name itself, not an
    attribute `x.name` or a keyword argument `f(name=...)`; mentions in strings and comments)."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [], []
    starts = _line_starts(text)
    code, mentions, depth = [], [], 0
    word = re.compile(rf"(?<![\w.]){re.escape(name)}\b")
    for i, t in enumerate(toks):
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        off = starts[t.start[0] - 1] + t.start[1]
        if not lo <= off < hi:
            continue
        if t.type == tokenize.NAME and t.string == name:
            after = toks[i + 1].string if i + 1 < len(toks) else ""
            if not (i and toks[i - 1].string == ".") and not (depth > 0 and after == "="):
                code.append((off, off + len(name)))
        elif t.type in (tokenize.STRING, tokenize.COMMENT):
            mentions += [(off + w.start(), off + w.end()) for w in word.finditer(t.string)]
    return code, mentions


def _renamed(region: str, spans: list[tuple[int, int]], new: str) -> str:
    for s, e in sorted(spans, reverse=True):
        region = region[:s] + new + region[e:]
    return region


def _renames(path: str, text: str) -> list[Case]:
    """Rename cases of one file: the uses to propagate are the parameter's code uses inside the
    function's own body (tokens, not text: a later function's parameter of the same name, an attribute
    or a keyword argument are other names); renaming the first k >= 1 of them, in order, is right, with
    any of its mentions in strings and comments renamed or not."""
    out = []
    sig = re.compile(r"^([ \t]*)def (\w+)\(([^)]*)\):[ \t]*\n", re.M)
    for m in sig.finditer(text):
        params = [p.strip().split("=")[0].split(":")[0].strip() for p in m.group(3).split(",")]
        params = [p for p in params if p and p not in ("self", "cls") and not p.startswith("*")]
        if not params:
            continue
        p = params[0]
        end = _body_end(text, m.group(1), m.end())
        body = text[m.end():end]
        if "\t" in body:
            continue
        new = next((x for x in NEW_NAMES if x not in body and x not in m.group(0)), None)
        if new is None:
            continue
        at = m.start(3) + re.search(rf"\b{re.escape(p)}\b", m.group(3)).start()
        now = text[:at] + new + text[at + len(p):]
        anchor, shift = at + len(new), len(new) - len(p)
        sig_end = now.index("\n", anchor) + 1  # the uses below the signature line, in the function's body
        code, mentions = _uses(now, p, sig_end, end + shift)
        if not code:
            continue
        subsets = [list(c) for r in range(len(mentions) + 1) for c in itertools.combinations(mentions, r)] \
            if len(mentions) <= 4 else [[], mentions]
        expected = [_renamed(now, code, new)] + [_renamed(now, code[:k] + ms, new)
                                                 for k in range(len(code), 0, -1) for ms in subsets]
        line = text.count("\n", 0, m.start()) + 1
        out.append(Case("rename", f"{path}:{line} {p} -> {new}", text, now, anchor, at + len(p), expected))
    return out


def release_cases(old_files: dict[str, str], new_files: dict[str, str], n: int) -> list[Case]:
    """Two nearby hunks of one file between releases: the first applied is the history, the second the expected edit."""
    out: list[Case] = []
    if n <= 0:
        return out
    for path in sorted(set(old_files) & set(new_files)):
        a, b = old_files[path].splitlines(keepends=True), new_files[path].splitlines(keepends=True)
        ops = [o for o in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if o[0] != "equal"]
        for h1, h2 in zip(ops, ops[1:]):
            if h2[1] - h1[2] > 10 or (h1[2] - h1[1]) + (h1[4] - h1[3]) > 30 or (h2[2] - h2[1]) + (h2[4] - h2[3]) > 12:
                continue
            before = "".join(a)
            # the history: hunk 1 applied to the old file
            text_l = a[:h1[1]] + b[h1[3]:h1[4]] + a[h1[2]:]
            text = "".join(text_l)
            anchor = len("".join(text_l[:h1[1] + (h1[4] - h1[3])]))  # the end of hunk 1
            if h1[4] > h1[3]:
                anchor -= 1  # on its last line
            shift = (h1[4] - h1[3]) - (h1[2] - h1[1])
            s2, e2 = h2[1] + shift, h2[2] + shift  # hunk 2 in `text` lines
            done_l = text_l[:s2] + b[h2[3]:h2[4]] + text_l[e2:]
            case = Case("release", f"{path}:{h2[1] + 1}", before, text, max(anchor, 0),
                        min(len("".join(a[:h1[1]])), len(before)), ["".join(done_l)])
            w = window_for(text, case.anchor, history_of(case))
            start_line, end_line = text.count("\n", 0, w.start), text.count("\n", 0, w.end)
            if not (start_line <= s2 and e2 <= end_line):
                continue  # the expected edit is outside the window: not a next edit we ask for
            out.append(case)
            if len(out) >= n:
                return out
    return out


SIGNATURE_KINDS = ("signature-swap", "signature-remove", "signature-add")
FLAGS = ["strict", "verbose", "checked", "quiet"]


def _offset(starts: list[int], line: int, col: int) -> int:
    return starts[line - 1] + col  # ast: 1-based lines, 0-based columns (ASCII lines only: checked)


def _calls(tree: ast.Module, fn: ast.FunctionDef, method: bool) -> list[ast.Call]:
    """One-line calls of `fn` in the same module with every positional parameter passed positionally
    (nothing starred, no keywords): `fn(a, b)`, or `self.fn(a, b)` for a method."""
    n = len([a for a in fn.args.args if a.arg not in ("self", "cls")])
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.lineno != node.end_lineno or node.keywords:
            continue
        f = node.func
        named = (isinstance(f, ast.Attribute) and f.attr == fn.name and isinstance(f.value, ast.Name)
                 and f.value.id in ("self", "cls")) if method else (isinstance(f, ast.Name) and f.id == fn.name)
        if named and len(node.args) == n and not any(isinstance(a, ast.Starred) for a in node.args) \
                and not (fn.lineno <= node.lineno <= fn.end_lineno):
            out.append(node)
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def _spans_fixed(text: str, fixes: list[tuple[int, int, str]]) -> str:
    for a, b, new in sorted(fixes, reverse=True):
        text = text[:a] + new + text[b:]
    return text


def signature_cases(path: str, text: str) -> list[Case]:
    """Signature changes of one file and the next edit at a call site of the same file (the user moved
    the cursor there and asks): swap the first two parameters (the call swaps its arguments), remove
    the last one (the call drops it), or add a keyword parameter with a default and pass it at the
    first call (the next call passes it too: a pattern applied again). Right when the call at the
    cursor is changed so, and any other change is the same change at another call of it."""
    if not text.isascii():
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    starts = _line_starts(text)
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    out: list[Case] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.args.vararg or fn.args.kwarg or fn.args.posonlyargs:
            continue
        params = [a for a in fn.args.args if a.arg not in ("self", "cls")]
        if len(params) < 2 or len(fn.args.defaults) > len(fn.args.args) - 2 or fn.args.kwonlyargs \
                or params[-1].lineno != fn.lineno or fn.args.defaults:
            continue
        calls = _calls(tree, fn, id(fn) in methods)
        if not calls:
            continue
        line = fn.lineno

        def span(node) -> tuple[int, int]:
            return _offset(starts, node.lineno, node.col_offset), _offset(starts, node.end_lineno, node.end_col_offset)

        p0, p1, pl = span(params[0]), span(params[1]), span(params[-1])
        prev_end = span(params[-2])[1]
        cursor = p0[0]
        kinds: list[tuple[str, str, list[str], int, list[tuple[int, int, str]]]] = []
        # swap: the signature's first two parameters, then each call's first two arguments
        sig = _spans_fixed(text, [(p0[0], p0[1], text[p1[0]:p1[1]]), (p1[0], p1[1], text[p0[0]:p0[1]])])
        swap = [[(span(c.args[0])[0], span(c.args[0])[1], text[span(c.args[1])[0]:span(c.args[1])[1]]),
                 (span(c.args[1])[0], span(c.args[1])[1], text[span(c.args[0])[0]:span(c.args[0])[1]])] for c in calls]
        kinds.append(("signature-swap", sig, [], 0, swap))
        # remove: the last parameter (from the end of the one before it), then each call's last argument
        sig = _spans_fixed(text, [(prev_end, pl[1], "")])
        drop = [[(span(c.args[-2])[1], span(c.args[-1])[1], "")] for c in calls]
        kinds.append(("signature-remove", sig, [], 0, drop))
        # add: a keyword parameter with a default, passed at the first call; the next call is asked
        flag = next((f for f in FLAGS if f not in text), None)
        if flag is not None and len(calls) >= 2:
            sig = _spans_fixed(text, [(pl[1], pl[1], f", {flag}=False")])
            add = [[(span(c.args[-1])[1], span(c.args[-1])[1], f", {flag}=True")] for c in calls]
            kinds.append(("signature-add", sig, [0], 1, add))
        for kind, sig_text, done_first, ask, fixes in kinds:
            # `text` offsets shift after the signature edit: the calls are below or above it, shift them
            d = len(sig_text) - len(text)
            sig_at = fn.lineno

            def moved(fix):  # a call's fix in sig_text offsets
                return [(a + (d if a > starts[sig_at] else 0), b + (d if b > starts[sig_at] else 0), t) for a, b, t in fix]

            fixes_m = [moved(f) for f in fixes]
            between: tuple[str, ...] = ()
            now = sig_text
            for i in done_first:  # the history's second edit: the first call already changed
                between = (sig_text,)
                now = _spans_fixed(sig_text, fixes_m[i])
                d2 = len(now) - len(sig_text)
                at_i = fixes_m[i][0][0]
                fixes_m = [[(a + (d2 if a > at_i else 0), b + (d2 if b > at_i else 0), t) for a, b, t in f]
                           for f in fixes_m]
            target = fixes_m[ask]
            others = [f for i, f in enumerate(fixes_m) if i != ask and i not in done_first]
            subsets = [list(c) for r in range(len(others) + 1) for c in itertools.combinations(others, r)] \
                if len(others) <= 4 else [[], others]
            expected = [_spans_fixed(now, target + [x for f in sub for x in f]) for sub in subsets]
            anchor = target[0][0]  # the cursor on the call's argument
            out.append(Case(kind, f"{path}:{line} {fn.name} {kind.split('-')[1]}", text, now, anchor, cursor,
                            expected, between))
    return out


def signature_cases_of(files: dict[str, str], n: int) -> list[Case]:
    """Up to `n` signature cases per kind, round-robin over the files (diverse code)."""
    per_file = [signature_cases(path, text) for path, text in files.items()]
    out: list[Case] = []
    for kind in SIGNATURE_KINDS:
        lists = [[c for c in cases if c.kind == kind] for cases in per_file]
        got = 0
        while got < n and any(lists):
            for cases in lists:
                if cases and got < n:
                    out.append(cases.pop(0))
                    got += 1
    return out


def changed_lines(region: str, after: str) -> str:
    return "".join(l for l in difflib.unified_diff(region.splitlines(True), after.splitlines(True), n=0)
                   if l[:1] in "+-" and not l.startswith(("+++", "---")))


def run_case(engine, tok, case: Case, with_ar: bool, warm: str = "rest", use_draft: bool = True,
             slot=("bench", "next_edit"), variant: str = "tight") -> dict:
    from completiond.core.engine import Request

    path = case.name.split(":")[0]
    h = history_of(case)
    engine.typed.clear()  # nothing served from an earlier case's memory
    warm_ms = None
    if warm == "rest":  # the cursor rested on the parameter before the edit: that prompt was warmed
        w0 = window_for(case.before, case.cursor, History(), variant)
        ids0, _ = next_edit_prompt(tok, case.before, w0, [], path, "python")
        t = time.perf_counter()
        engine.warm(ids0, slot=slot)
        warm_ms = (time.perf_counter() - t) * 1000
    t0 = time.perf_counter()  # the request: window, prompt, prefill of what is not cached, decode, edits
    w = window_for(case.text, case.anchor, h, variant)
    region = case.text[w.start:w.end]
    ids, stops = next_edit_prompt(tok, case.text, w, shown_diffs(h, path), path, "python")
    build_ms = (time.perf_counter() - t0) * 1000
    n_region = len(tok.encode(region, add_special_tokens=False))
    max_tokens = answer_budget(n_region) if answer_budget is not None else 2 * n_region + 64
    last = h.edits[-1] if h.edits else None
    draft = renamed_draft(region, last.old, last.new, last.before, last.after) \
        if renamed_draft is not None and last is not None and use_draft else None
    if draft is None and call_draft is not None and last is not None and use_draft:  # a signature change's
        draft = call_draft(region, last.old, last.new, last.before, last.after)

    if draft is not None:  # as the daemon does: prompt lookup proposes from it, the target verifies
        engine.index.set_open("next-edit-draft", tok.encode(draft, add_special_tokens=False))
    run = COPY_RUN if variant == "long" else None
    trees: list[list[int]] = []  # each decode pass: [nodes verified, of them accepted]
    verify = engine.verify

    def traced(st, tree, *rest, **kw):
        path, bonus = verify(st, tree, *rest, **kw)
        trees.append([len(tree), len(path) - 1])
        return path, bonus

    engine.verify = traced
    try:
        spec = engine.complete(Request(prompt=ids, mode="pld", max_tokens=max_tokens, stops=stops, slot=slot,
                                       reuse_prefix=warm != "none", max_draft_len=run))
    finally:
        del engine.verify  # the class's again
    engine.index.close("next-edit-draft")
    answer = answer_text(spec.text, region, case.text[w.end:w.end + 4000])
    found = edits(region, answer, w.start, spec.stopped_by != "max_tokens")
    latency_ms = (time.perf_counter() - t0) * 1000
    decode_ms = spec.ms_total - spec.ms_first_token
    # where the request's time went: building the prompt (window, diffs, tokenizer), the prefill of the
    # prompt tokens not cached (with the first token's pass), the decode passes, and the rest (edits)
    breakdown = {"build_ms": round(build_ms, 1), "prefill_ms": round(spec.ms_first_token, 1),
                 "prefill_tokens": len(ids) - spec.reused_tokens, "decode_ms": round(decode_ms, 1),
                 "decode_passes": max(spec.target_passes - 1, 0),
                 "ms_per_decode_pass": round(decode_ms / max(spec.target_passes - 1, 1), 1),
                 "other_ms": round(latency_ms - build_ms - spec.ms_total, 1)}
    after = case.text
    for e in sorted(found, key=lambda e: -e.start):
        after = after[:e.start] + e.text + after[e.end:]
    exact = after in case.expected
    want, got = changed_lines(case.text, case.expected[0]), changed_lines(case.text, after)
    sim = 1.0 if want == got else difflib.SequenceMatcher(None, want, got, autojunk=False).ratio()
    row = {"kind": case.kind, "case": case.name, "variant": variant, "exact": exact, "edit_similarity": round(sim, 4),
           "edits": len(found), "expected_change": want, "predicted_change": got, "answer": spec.text,
           "window_lines": [case.text.count("\n", 0, w.start) + 1, case.text.count("\n", 0, w.end)],
           "prompt_tokens": len(ids), "reused_tokens": spec.reused_tokens, "tokens": len(spec.token_ids),
           "stopped_by": spec.stopped_by, "latency_ms": round(latency_ms, 1), "draft": draft is not None,
           "copy_run": run or engine.max_candidate_len, "trees": trees,
           "warm_ms": None if warm_ms is None else round(warm_ms, 1), "breakdown": breakdown,
           "load_avg_1m": round(os.getloadavg()[0], 2),
           "pld": {"ms_total": round(spec.ms_total, 1), "ms_first_token": round(spec.ms_first_token, 1),
                   "passes": spec.target_passes, "mean_accepted": round(spec.mean_accepted, 3)}}
    if with_ar:  # plain decoding of the same prompt, cold: the same tokens
        ar = engine.complete(Request(prompt=ids, mode="ar", max_tokens=max_tokens, stops=stops, slot=slot,
                                     reuse_prefix=False))
        row["ar"] = {"ms_total": round(ar.ms_total, 1), "ms_first_token": round(ar.ms_first_token, 1),
                     "passes": ar.target_passes}
        row["identical"] = ar.token_ids == spec.token_ids
        d_spec, d_ar = spec.ms_total - spec.ms_first_token, ar.ms_total - ar.ms_first_token
        row["decode_speedup"] = round(d_ar / d_spec, 3) if d_spec > 0 else None
        row["pass_ratio"] = round(ar.target_passes / max(spec.target_passes, 1), 3)
    return row


def summary(sel: list[dict]) -> dict:
    if not sel:
        return {}
    lat = [r["latency_ms"] for r in sel]
    ar = [r for r in sel if "ar" in r]
    out = {"cases": len(sel), "exact": f"{sum(r['exact'] for r in sel)}/{len(sel)}",
           "exact_edit_rate": round(float(np.mean([r["exact"] for r in sel])), 3),
           "edit_similarity": round(float(np.mean([r["edit_similarity"] for r in sel])), 3),
           "latency_ms_p50": round(float(np.percentile(lat, 50)), 1),
           "latency_ms_p95": round(float(np.percentile(lat, 95)), 1),
           "prompt_tokens_mean": round(float(np.mean([r["prompt_tokens"] for r in sel])), 1),
           "reused_fraction": round(sum(r["reused_tokens"] for r in sel) / max(1, sum(r["prompt_tokens"] for r in sel)), 3),
           "reused_fraction_p50": round(float(np.median([r["reused_tokens"] / r["prompt_tokens"] for r in sel])), 3),
           "passes_mean": round(float(np.mean([r["pld"]["passes"] for r in sel])), 1),
           "tokens_mean": round(float(np.mean([r["tokens"] for r in sel])), 1)}
    if all("breakdown" in r for r in sel):  # where the time went, summed over the cases
        parts = ("build_ms", "prefill_ms", "decode_ms", "other_ms")
        tot = {k: sum(r["breakdown"][k] for r in sel) for k in parts}
        out["time_share"] = {k: round(v / max(sum(tot.values()), 1e-9), 3) for k, v in tot.items()}
        out["prefill_tokens_p50"] = float(np.median([r["breakdown"]["prefill_tokens"] for r in sel]))
        out["prefill_ms_p50"] = round(float(np.median([r["breakdown"]["prefill_ms"] for r in sel])), 1)
        out["decode_ms_p50"] = round(float(np.median([r["breakdown"]["decode_ms"] for r in sel])), 1)
        out["ms_per_decode_pass_p50"] = round(float(np.median([r["breakdown"]["ms_per_decode_pass"] for r in sel])), 1)
        if all("decode_ms_at_table" in r["breakdown"] for r in sel):
            at = [r["breakdown"]["decode_ms_at_table"] for r in sel]
            out["decode_ms_at_table_p50"] = round(float(np.median(at)), 1)
            out["decode_ms_at_table_total"] = round(sum(at), 1)
    if all("trees" in r for r in sel):
        nodes = [n for r in sel for n, _ in r["trees"]]
        out["nodes_per_pass_mean"] = round(float(np.mean(nodes)), 1) if nodes else 0.0
        out["accepted_per_pass_mean"] = round(float(np.mean([k for r in sel for _, k in r["trees"]] or [0])), 2)
    if any(r.get("warm_ms") is not None for r in sel):
        out["warm_ms_p50"] = round(float(np.median([r["warm_ms"] for r in sel if r.get("warm_ms") is not None])), 1)
    if ar:
        dec_spec = sum(r["pld"]["ms_total"] - r["pld"]["ms_first_token"] for r in ar)
        dec_ar = sum(r["ar"]["ms_total"] - r["ar"]["ms_first_token"] for r in ar)
        out.update({"identical": f"{sum(r['identical'] for r in ar)}/{len(ar)}",
                    "decode_speedup_total": round(dec_ar / dec_spec, 3) if dec_spec else None,
                    "pass_ratio_total": round(sum(r["ar"]["passes"] for r in ar)
                                              / max(1, sum(r["pld"]["passes"] for r in ar)), 3)})
    return out


def write(a: argparse.Namespace, rows: list[dict], n_cases: int, target, engine, calibration: str,
          load_s: float) -> dict:
    for r in rows:  # the decode passes at the run's final pass-cost table (a low quantile of its real passes:
        # what they cost where the load let them run), so variants compare without the load's noise
        if "trees" in r:
            r["breakdown"]["decode_ms_at_table"] = round(sum(engine.budget.cost(n) for n, _ in r["trees"]), 1)
    result = {
        "command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_name(), "target": target.name, "dtype": str(target.dtype).replace("torch.", ""),
        "quant": target.meta.get("quant", "none"), "calibration": calibration,
        "pass_cost_ms": {str(k): round(v, 2) for k, v in engine.budget.costs().items()},
        # prompt lookup's measured acceptance at the end: a later token of a candidate (next), of one
        # whose backward match is 16+ tokens (run; older checkouts lack it), a leading first token by match
        "prompt_lookup": {"next": round(engine.prompt_lookup.next.value, 3),
                          "run": round(engine.prompt_lookup.run.value, 3) if hasattr(engine.prompt_lookup, "run") else None,
                          "first": {str(b): round(e.value, 3) for b, e in engine.prompt_lookup.first.items()}},
        "load_s": round(load_s, 1), "packages": a.packages, "cases_done": f"{len(rows) // max(1, len(a.variants))}/{n_cases}",
        "warm": a.warm, "window": "follows the edit" if next_edit_window is not None else "plain (window_at)",
        "rename_draft": renamed_draft is not None and not a.no_draft, "use_lines": USE_LINES,
        "note": a.note,
        "load_avg_1m": {"min": min((r["load_avg_1m"] for r in rows), default=None),
                        "max": max((r["load_avg_1m"] for r in rows), default=None),
                        "mean": round(float(np.mean([r["load_avg_1m"] for r in rows])), 2) if rows else None},
        "variants": a.variants,
        "summary": {v: {k: summary([r for r in rows if r.get("variant", "tight") == v and (k == "all" or r["kind"] == k)])
                        for k in ("all", "rename", *SIGNATURE_KINDS, "release")
                        if k == "all" or any(r["kind"] == k for r in rows)}
                    for v in a.variants},
        "cases": rows,
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


def plot(runs: list[Path], out: Path) -> None:
    """Latency per rename case (sorted) and prompt tokens reused, one line per run JSON, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for path in runs:
        run = json.loads(path.read_text())
        for v in run.get("variants", [None]):  # one line per variant of a run with variants
            rows = [r for r in run["cases"] if r["kind"] == "rename" and (v is None or r.get("variant") == v)]
            summ = run["summary"]["rename"] if v is None else run["summary"][v]["rename"]
            name = path.stem if v is None else f"{path.stem} {v}"
            ax1.plot(sorted(r["latency_ms"] / 1000 for r in rows), marker="o", label=f"{name}: {summ['exact']} right")
            ax2.plot(sorted(r["reused_tokens"] / r["prompt_tokens"] for r in rows), marker="o", label=name)
    ax1.set(title="next edit after a rename: request to answer", xlabel="case (sorted)", ylabel="s")
    ax2.set(title="prompt tokens cached at the request", xlabel="case (sorted)", ylabel="fraction", ylim=(0, 1))
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    first = json.loads(runs[0].read_text())
    fig.suptitle(f"{first['target']}, {first['cpu']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-0.5b")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quant", default="auto")
    p.add_argument("--packages", nargs="+", default=PACKAGES, help="NAME==OLD:NEW (consecutive releases)")
    p.add_argument("--renames", type=int, default=8, help="rename cases (from the newer release of each package, split)")
    p.add_argument("--releases", type=int, default=6, help="release-diff cases per package (at most)")
    p.add_argument("--signatures", type=int, default=0, help="signature-change cases per kind and package (at most)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=["long"],
                   help="region rules run side by side on every case (base: as before; tight: see VARIANTS)")
    p.add_argument("--ar", type=int, default=4, help="run plain decoding on the first N cases only (it is slow)")
    p.add_argument("--warm", choices=("rest", "none"), default="rest",
                   help="rest: the prompt at the cursor before the edit was prefilled (the daemon's pause); none: cold")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-draft", action="store_true", help="no rename draft for copy speculation")
    p.add_argument("--json", type=Path)
    p.add_argument("--note", default="2-core machine shared with other agents: ms are noisy; passes and identity are not",
                   help="how the machine was used during the run (kept in the JSON)")
    p.add_argument("--plot", nargs="+", type=Path, metavar="PATH",
                   help="OUT.png RUN.json...: plot committed runs side by side (no model run)")
    a = p.parse_args()
    if a.plot:
        return plot(a.plot[1:], a.plot[0])

    import torch

    from completiond.core.engine import Engine
    from completiond.models.loader import load

    if a.threads:
        torch.set_num_threads(a.threads)

    per_pkg_r, per_pkg_d = -(-a.renames // len(a.packages)), a.releases
    renames, signatures, releases = [], [], []
    for spec in a.packages:
        name, versions = spec.split("==")
        old_v, new_v = versions.split(":")
        old, new = wheel_files(f"{name}=={old_v}"), wheel_files(f"{name}=={new_v}")
        renames.append(rename_cases(new, per_pkg_r))
        signatures.append(signature_cases_of(new, a.signatures) if a.signatures else [])
        releases.append(release_cases(old, new, per_pkg_d) if old_v != new_v else [])
    # the packages' cases in turn, renames first: a run stopped early still covers every package
    cases = [c for kind in (renames, signatures, releases) for group in itertools.zip_longest(*kind)
             for c in group if c]
    print(f"{len(cases)} cases: " + ", ".join(f"{sum(c.kind == k for c in cases)} {k}"
                                              for k in ("rename", *SIGNATURE_KINDS, "release")), flush=True)

    t0 = time.time()
    target = load(a.target, "target", "cpu", a.dtype, a.quant)
    engine = Engine(target)
    calibration = engine.calibrate_cached()
    load_s = time.time() - t0
    rows: list[dict] = []
    for i, c in enumerate(cases):
        for v in a.variants:  # side by side, case by case: the load they see is the same
            row = run_case(engine, target.tokenizer, c, with_ar=i < a.ar and v == a.variants[-1], warm=a.warm,
                           use_draft=not a.no_draft, variant=v)
            rows.append(row)
            if a.json:  # after every case: a run stopped early keeps what it measured
                write(a, rows, len(cases), target, engine, calibration, load_s)
            print(json.dumps({k: row[k] for k in ("variant", "kind", "case", "exact", "edit_similarity", "tokens",
                                                  "latency_ms", "prompt_tokens", "reused_tokens", "window_lines")}
                             | {"passes": row["pld"]["passes"], "breakdown": row["breakdown"],
                                "ar_passes": row.get("ar", {}).get("passes"), "identical": row.get("identical"),
                                "decode_speedup": row.get("decode_speedup")}), flush=True)

    result = write(a, rows, len(cases), target, engine, calibration, load_s)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
