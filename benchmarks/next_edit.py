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
latency p50/p95, prompt tokens reused, exact-edit rate and edit similarity.

    python -m benchmarks.next_edit --target qwen2.5-coder-0.5b --renames 16 --releases 2 \\
        --json benchmarks/results/next-edit-0.5b-warm.json

Before numbers come from the same script on an older checkout (PYTHONPATH at it, the script copied
out of this tree): without `next_edit_window` it uses the plain window and, with `--warm none`, the
cold prefill the daemon then did.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import io
import itertools
import json
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
try:  # the rename draft for copy speculation (service/next_edit.prepare)
    from completiond.core.prompt.next_edit import renamed_draft  # noqa: E402
except ImportError:
    renamed_draft = None

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


def history_of(case: Case) -> History:
    h = History()
    h.record("file:///" + case.name.split(":")[0], case.before, case.text, now=0.0)
    return h


def window_for(text: str, anchor: int, h: History):
    """The editable region the daemon picks (service/next_edit.prepare): following the names the
    last edit removed, where this checkout has that."""
    if next_edit_window is None:
        return window_at(text, anchor)
    last = h.edits[-1] if h.edits else None
    names = removed_names(last.old, last.new, last.before, last.after) if last is not None else []
    return next_edit_window(text, anchor, names)


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


def changed_lines(region: str, after: str) -> str:
    return "".join(l for l in difflib.unified_diff(region.splitlines(True), after.splitlines(True), n=0)
                   if l[:1] in "+-" and not l.startswith(("+++", "---")))


def run_case(engine, tok, case: Case, with_ar: bool, warm: str = "rest", use_draft: bool = True,
             slot=("bench", "next_edit")) -> dict:
    from completiond.core.engine import Request

    path = case.name.split(":")[0]
    h = history_of(case)
    engine.typed.clear()  # nothing served from an earlier case's memory
    warm_ms = None
    if warm == "rest":  # the cursor rested on the parameter before the edit: that prompt was warmed
        w0 = window_for(case.before, case.cursor, History())
        ids0, _ = next_edit_prompt(tok, case.before, w0, [], path, "python")
        t = time.perf_counter()
        engine.warm(ids0, slot=slot)
        warm_ms = (time.perf_counter() - t) * 1000
    t0 = time.perf_counter()  # the request: window, prompt, prefill of what is not cached, decode, edits
    w = window_for(case.text, case.anchor, h)
    region = case.text[w.start:w.end]
    ids, stops = next_edit_prompt(tok, case.text, w, shown_diffs(h, path), path, "python")
    max_tokens = 2 * len(tok.encode(region, add_special_tokens=False)) + 64
    last = h.edits[-1] if h.edits else None
    draft = renamed_draft(region, last.old, last.new, last.before, last.after) \
        if renamed_draft is not None and last is not None and use_draft else None
    if draft is not None:  # as the daemon does: prompt lookup proposes from it, the target verifies
        engine.index.set_open("next-edit-draft", tok.encode(draft, add_special_tokens=False))
    spec = engine.complete(Request(prompt=ids, mode="pld", max_tokens=max_tokens, stops=stops, slot=slot,
                                   reuse_prefix=warm != "none"))
    engine.index.close("next-edit-draft")
    answer = answer_text(spec.text, region)
    found = edits(region, answer, w.start, spec.stopped_by != "max_tokens")
    latency_ms = (time.perf_counter() - t0) * 1000
    after = case.text
    for e in sorted(found, key=lambda e: -e.start):
        after = after[:e.start] + e.text + after[e.end:]
    exact = after in case.expected
    want, got = changed_lines(case.text, case.expected[0]), changed_lines(case.text, after)
    sim = 1.0 if want == got else difflib.SequenceMatcher(None, want, got, autojunk=False).ratio()
    row = {"kind": case.kind, "case": case.name, "exact": exact, "edit_similarity": round(sim, 4),
           "edits": len(found), "expected_change": want, "predicted_change": got, "answer": spec.text,
           "window_lines": [case.text.count("\n", 0, w.start) + 1, case.text.count("\n", 0, w.end)],
           "prompt_tokens": len(ids), "reused_tokens": spec.reused_tokens, "tokens": len(spec.token_ids),
           "stopped_by": spec.stopped_by, "latency_ms": round(latency_ms, 1), "draft": draft is not None,
           "warm_ms": None if warm_ms is None else round(warm_ms, 1),
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
    result = {
        "command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_name(), "target": target.name, "dtype": str(target.dtype).replace("torch.", ""),
        "quant": target.meta.get("quant", "none"), "calibration": calibration,
        "pass_cost_ms": {str(k): round(v, 2) for k, v in engine.budget.costs().items()},
        "load_s": round(load_s, 1), "packages": a.packages, "cases_done": f"{len(rows)}/{n_cases}",
        "warm": a.warm, "window": "follows the edit" if next_edit_window is not None else "plain (window_at)",
        "rename_draft": renamed_draft is not None and not a.no_draft,
        "note": a.note,
        "summary": {"all": summary(rows), "rename": summary([r for r in rows if r["kind"] == "rename"]),
                    "release": summary([r for r in rows if r["kind"] == "release"])},
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
        rows = [r for r in run["cases"] if r["kind"] == "rename"]
        summ = run["summary"]["rename"]
        label = f"{path.stem}: {summ['exact']} right"
        ax1.plot(sorted(r["latency_ms"] / 1000 for r in rows), marker="o", label=label)
        ax2.plot(sorted(r["reused_tokens"] / r["prompt_tokens"] for r in rows), marker="o", label=path.stem)
    ax1.set(title="next edit after a rename: request to answer", xlabel="case (sorted)", ylabel="s")
    ax2.set(title="prompt tokens cached at the request", xlabel="case (sorted)", ylabel="fraction", ylim=(0, 1))
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.suptitle(f"qwen2.5-coder-0.5b, {json.loads(runs[0].read_text())['cpu']}", fontsize=8)
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
    renames, releases = [], []
    for spec in a.packages:
        name, versions = spec.split("==")
        old_v, new_v = versions.split(":")
        old, new = wheel_files(f"{name}=={old_v}"), wheel_files(f"{name}=={new_v}")
        renames.append(rename_cases(new, per_pkg_r))
        releases.append(release_cases(old, new, per_pkg_d))
    # the packages' cases in turn, renames first: a run stopped early still covers every package
    cases = [c for kind in (renames, releases) for group in itertools.zip_longest(*kind) for c in group if c]
    print(f"{len(cases)} cases: {sum(c.kind == 'rename' for c in cases)} rename, "
          f"{sum(c.kind == 'release' for c in cases)} release", flush=True)

    t0 = time.time()
    target = load(a.target, "target", "cpu", a.dtype, a.quant)
    engine = Engine(target)
    calibration = engine.calibrate_cached()
    load_s = time.time() - t0
    rows: list[dict] = []
    for i, c in enumerate(cases):
        row = run_case(engine, target.tokenizer, c, with_ar=i < a.ar, warm=a.warm, use_draft=not a.no_draft)
        rows.append(row)
        if a.json:  # after every case: a run stopped early keeps what it measured
            write(a, rows, len(cases), target, engine, calibration, load_s)
        print(json.dumps({k: row[k] for k in ("kind", "case", "exact", "edit_similarity", "tokens", "latency_ms",
                                              "prompt_tokens", "reused_tokens", "window_lines")}
                         | {"passes": row["pld"]["passes"],
                            "ar_passes": row.get("ar", {}).get("passes"), "identical": row.get("identical"),
                            "decode_speedup": row.get("decode_speedup")}), flush=True)

    result = write(a, rows, len(cases), target, engine, calibration, load_s)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
