"""`completiond bench`: latency of every mode (and peers) on a real repository, side by side, one run.

    completiond bench --repo pypi:toolz==1.0.0 --positions 40 --modes ar,pld,draft,combined \\
        --peers hf-plain,hf-prompt-lookup,hf-assisted,llama.cpp --json out.json --plot out.png

With --targets A,B the same positions run on every target, all loaded at once and taking turns a few
positions at a time, and the JSON puts them side by side: quality and latency per mode, pass cost by
tree size, draft step cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..flags import model_flags
from ..limits import COMPLETION_PROMPT_TOKENS

PEERS = ("hf-plain", "hf-prompt-lookup", "hf-assisted", "llama.cpp")


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark modes and peers on a repository")
    b.add_argument("--repo", required=True, help="a directory, or pypi:NAME==VERSION (sdist fetched with pip)")
    b.add_argument("--positions", type=int, default=40, help="completion positions sampled from the repo's code")
    b.add_argument("--modes", default="ar,pld,draft,combined", help="comma list of the engine modes to time")
    b.add_argument("--cursor", default="both", choices=["line-start", "mid-line", "both"],
                   help="where in a line the sampled cursors sit (both: alternate)")
    b.add_argument("--max-tokens", type=int, default=64, help="most tokens generated per completion")
    b.add_argument("--single-line", action="store_true", help="stop at the end of the line (default: multi-line)")
    b.add_argument("--seed", type=int, default=0, help="seed of the position sample (and of the edit tasks)")
    b.add_argument("--peers", default="", help=f"comma list of {', '.join(PEERS)} (or 'all')")
    b.add_argument("--replay", type=int, default=0, metavar="LINES",
                   help="also replay typing LINES lines through a real daemon (keystroke latency), and score "
                        "what it shows after typing up to the first LINES positions' cursors")
    b.add_argument("--replay-open-pause", type=float, action="append", default=None, metavar="S",
                   help="seconds a file is open before typing starts, for the shown suggestions of --replay "
                        "(repeat for several; default: 2 and 30)")
    b.add_argument("--replay-shown-only", action="store_true",
                   help="with --replay, only the shown suggestions: skip the typing runs with and without "
                        "prefix reuse (keystroke latency; the no-reuse run prefills every prompt whole)")
    b.add_argument("--via", default="engine", choices=["engine", "infill"],
                   help="engine: the modes (and peers) on an engine in this process; infill: a real daemon's "
                        "/infill asked as llama.vim asks, beside the wire complete as completiond-lsp asks, "
                        "same positions, same scores (bench/infill.py)")
    b.add_argument("--min-line", type=int, default=None, metavar="N",
                   help="positions on 0-based line N or later (default 0; with --via infill 257: llama.vim's "
                        "256-line window then starts inside the file)")
    b.add_argument("--infill-idle", type=float, default=0.0, metavar="S",
                   help="with --via infill, ask every position again after S seconds idle (the warm-up's turn)")
    b.add_argument("--edits", type=int, default=0, metavar="N", help="also run N rewrite (edit) tasks")
    b.add_argument("--prompt-tokens", type=int, default=COMPLETION_PROMPT_TOKENS, metavar="N",
                   help=f"prompt budget per completion (default: the daemon's full prompt, {COMPLETION_PROMPT_TOKENS};"
                        " its quick prompt: 256)")
    b.add_argument("--repo-context", action="store_true",
                   help="prompts with the workspace files the document imports, as `serve --repo-context` builds them")
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    b.add_argument("--calibration", default="fresh", choices=["fresh", "cached"],
                   help="pass costs to start from: measured now (fresh), or the daemon's cached table "
                        "(cached: what a daemon started now would use, with the draft's measured gate, and without a "
                        "default draft that gate found slower unless --modes has draft; real passes "
                        "refine both alike, and are kept as a daemon keeps them)")
    b.add_argument("--json", default=None, metavar="OUT", help="also write the full result as JSON to OUT")
    b.add_argument("--plot", default=None, metavar="OUT.png", help="write a latency plot to OUT.png")
    b.add_argument("--targets", default=None, metavar="A,B",
                   help="run the same positions on each of these targets, taking turns, and report them side by side "
                        "(NAME@int4 / NAME@int8: that target's --quant) "
                        "(instead of --target)")
    model_flags(b)
    b.set_defaults(func=cmd_bench)


def cmd_bench(a: argparse.Namespace) -> int:
    import torch

    from ..flags import UsageError, check_plot
    from ..core.engine import MODES
    from .repo import resolve_repo, sample_positions

    check_plot(a.plot, "bench")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(f"--modes takes a comma list of {', '.join(MODES)}")
    peers = list(PEERS) if a.peers == "all" else [p.strip() for p in a.peers.split(",") if p.strip()]
    if any(p not in PEERS for p in peers):
        raise UsageError(f"--peers takes a comma list of {', '.join(PEERS)}")
    targets = [t.strip() for t in (a.targets or "").split(",") if t.strip()]
    if a.targets is not None and (len(targets) < 2 or len(set(targets)) < len(targets)):
        raise UsageError("--targets takes a comma list of two or more different targets")
    from ..models.catalog import ModelError, split_form

    try:
        forms = {t: split_form(t) for t in targets}  # NAME@FORM: that target's --quant
    except ModelError as e:
        raise UsageError(f"--targets: {e}") from None
    if a.replay_open_pause and any(s < 0 for s in a.replay_open_pause):
        raise UsageError("--replay-open-pause takes seconds, 0 or more")
    if a.min_line is None:
        a.min_line = 257 if a.via == "infill" else 0
    if a.min_line < 0 or a.infill_idle < 0:
        raise UsageError("--min-line and --infill-idle take 0 or more")
    if a.via == "infill" and (targets or peers or a.replay or a.edits):
        raise UsageError("--via infill runs alone: no --targets, --peers, --replay or --edits")
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        root, label = resolve_repo(a.repo)
    except ValueError as e:
        raise UsageError(str(e)) from None
    positions = sample_positions(root, a.positions, a.cursor, a.seed, a.min_line)
    if not positions:
        where = f" on line {a.min_line} or later" if a.min_line else ""
        raise UsageError(f"no code positions found in {root}{where}")
    if a.via == "infill":
        from .infill import run_infill, table as infill_table

        summary = run_infill(a, root, label, positions)
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(infill_table(summary))
        return 0
    if not targets:
        summary = bench_targets({a.target: a}, root, label, positions, modes, peers)[a.target]
        if a.plot:
            from .report import plot

            plot(summary, Path(a.plot))
        text = table(summary)
    else:
        specs = {t: argparse.Namespace(**{**vars(a), "target": forms[t][0], "quant": forms[t][1] or a.quant})
                 for t in targets}
        runs = bench_targets(specs, root, label, positions, modes, peers)
        if a.plot:
            from .report import plot

            for t, run in runs.items():
                plot(run, Path(a.plot).with_name(f"{Path(a.plot).stem}-{t.replace('/', '_')}.png"))
        summary = side_by_side(runs, label)
        text = "\n\n".join([table(r) for r in runs.values()] + [side_table(summary)])
        if (verdict := record_default(runs)) is not None:
            summary["default_target"] = verdict
            text += f"\n{verdict['target']} is now this CPU's default: {verdict['why']}"
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(text)
    return 0


BLOCK = 4  # positions a target runs before the next target takes its turn (--targets)


@dataclass
class TargetRun:
    """One target's engine and what it has run so far (`bench_targets` fills `prepared` block by block)."""
    a: argparse.Namespace
    target: Any
    draft: Any
    uses_draft: bool
    engine: Any
    costs: dict
    table_start: dict
    files: dict
    llama: Any = None  # peers.LlamaCppRun where --peers has llama.cpp and it can run
    unloaded: str | None = None  # why the default draft was not loaded (core.engine.draft_for)
    prepared: list = field(default_factory=list)


def bench_targets(specs: dict[str, argparse.Namespace], root: Path, label: str, positions: list, modes: list[str],
                  peers: list[str]) -> dict[str, dict]:
    """Each target's run (its Namespace: its --target and --quant) on the same positions, all loaded at
    once and taking turns BLOCK positions at a time, in alternating order: this machine's memory speed
    drifts by tens of percent over minutes, and targets run one after the other would carry that
    drift into their ratio. Returns each target's JSON summary."""
    from tqdm import tqdm

    from .modes import run_modes

    runs: dict[str, TargetRun] = {}
    try:  # (the finally closes the llama.cpp peers of targets started before one that fails to load)
        for t, a in specs.items():
            runs[t] = start_target(a, root, modes, peers)
        bar = tqdm(total=len(positions) * len(modes) * len(runs), desc="positions x modes")
        for i in range(0, len(positions), BLOCK):
            for t in (list(runs) if i // BLOCK % 2 == 0 else list(runs)[::-1]):
                r = runs[t]
                block = run_modes(r.engine, root, positions[i:i + BLOCK], modes, r.a.max_tokens,
                                  multiline=not r.a.single_line, max_prompt=r.a.prompt_tokens,
                                  context=r.a.repo_context, files=r.files, bar=bar)
                if r.llama is not None:  # llama.cpp right after ours, on the same positions
                    r.llama.block(block, len(r.prepared))
                r.prepared += block
        bar.close()
        return {t: finish_target(r, root, label, positions, modes, peers) for t, r in runs.items()}
    finally:  # closing a peer that finish_target closed already does nothing
        for r in runs.values():
            if r.llama is not None:
                r.llama.peer.close()


def start_target(a: argparse.Namespace, root: Path, modes: list[str], peers: list[str]) -> TargetRun:
    """Load a target (and the draft its modes or peers use), build and calibrate its engine."""
    import torch

    from ..flags import UsageError
    from ..core.engine import Engine, draft_for
    from ..models.catalog import ModelError
    from ..models.loader import load, load_draft
    from ..models import pages
    from .modes import index_repo
    from .peers import llama_cpp_run

    try:
        target = load(a.target, "target", a.device, a.dtype, a.quant)
        uses_draft = bool({"draft", "combined"} & set(modes)) or "hf-assisted" in peers
        draft, unloaded = None, None
        if uses_draft and a.calibration == "cached" and "draft" not in modes and "hf-assisted" not in peers:
            # as a returning daemon: a default draft this machine measured slower stays unloaded
            draft, unloaded = draft_for(a.draft, target)
        elif uses_draft:  # measured afresh, as at a first start
            draft = load_draft(a.draft, target)
    except (ValueError, ModelError) as e:
        raise UsageError(str(e)) from None
    pages.settle()  # the weights' move into 2 MB pages ends before anything is timed
    engine = Engine(target, draft, backend=a.backend)
    if a.calibration == "cached":
        engine.calibrate_cached()
    else:
        engine.calibrate()
    # prompts are at most --prompt-tokens, completions --max-tokens
    llama = llama_cpp_run(engine, torch.get_num_threads(), a.prompt_tokens + a.max_tokens + 64) \
        if "llama.cpp" in peers else None
    # the table the modes start from (then real passes refine it)
    return TargetRun(a, target, draft, uses_draft, engine, engine.budget.costs(), engine.budget.table_status(),
                     index_repo(engine, root), llama, unloaded)


def finish_target(r: TargetRun, root: Path, label: str, positions: list, modes: list[str], peers: list[str]) -> dict:
    """The transformers peers on the positions the target ran (llama.cpp ran beside each block), then
    its JSON summary."""
    from ..models.loader import draft_label
    from ..service.protocol import prefill_dtype
    from .peers import run_transformers
    from .report import details, summarize_modes, summarize_peers

    a, target, draft, engine, prepared = r.a, r.target, r.draft, r.engine, r.prepared
    if a.calibration == "cached":  # as a daemon does at exit: the next start reads what this run measured
        engine.save_calibration()
    hf = [p for p in peers if p.startswith("hf-")]
    peer_rows = run_transformers(engine, prepared, hf) if hf else {}
    prefill = {}
    if r.llama is not None:
        rows, prefill = r.llama.finish(prepared)
        peer_rows.update(rows)
    summary = {
        "repo": label, "machine": machine(target), "date": datetime.date.today().isoformat(),
        "command": "completiond " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        "positions": len(prepared), "target": target.name,
        "draft": draft_label(a.draft, draft, target, r.unloaded) if r.uses_draft else "none (no mode uses one)",
        "dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device),
        "quant": target.meta.get("quant", "none"), "backend": engine.runner.backend,
        "prefill_dtype": prefill_dtype(target), "int8_kernel": target.meta.get("int8_kernel"),
        "weights": target.meta.get("weights"),
        # the runtime form's file (its name says the format: int4 groups, layout), None for other loads
        "weights_file": Path(target.meta["runtime"]).name if target.meta.get("runtime") else None,
        "max_tokens": a.max_tokens, "repo_context": a.repo_context,
        "pass_cost_ms": {str(k): round(v, 2) for k, v in r.costs.items()},
        # the tree budget's table at the start and after the modes ran (per size: ms, source, passes,
        # probes; the daemon's estimator), so a run says which tree sizes it priced how
        "pass_costs_start": r.table_start, "pass_costs": engine.budget.table_status(),
        # what one proposal of the draft costs (a draft model's pass, or the heads' steps), ms, recent average
        "draft_step_ms": round(p.step_ms.value, 3) if (p := engine.draft or engine.heads) is not None else None,
        # whether the draft paid, measured: ms per emitted token of steps with and without it (StepGate)
        "draft_gate": {name: g.status() for name, g in engine.gates.items()},
        "modes": summarize_modes(prepared, modes), "peers": summarize_peers(prepared, peer_rows),
        **({"prefill": prefill} if prefill else {}),
        "details": details(prepared, positions, root),
    }
    if a.replay:
        from .replay import replay

        # the engine's quality on the positions the replay types to, beside what the daemon shows there
        same = [pp.runs["ar"] for pp in prepared[: a.replay]]
        engine_scores = {"mode": "ar", "positions": len(same), "prompt_tokens": a.prompt_tokens,
                         "exact_line": round(sum(r.exact for r in same) / len(same), 3),
                         "edit_sim": round(sum(r.similarity for r in same) / len(same), 3)}
        # its daemon serves the model the engine ran, by name: `--target default` could serve the smaller
        # while the larger converts, then switch to it mid-replay (the background upgrade)
        served = argparse.Namespace(**{**vars(a), "target": target.name, "quant": target.meta.get("quant") or a.quant})
        summary["keystroke_replay"] = replay(served, root, positions[: a.replay], engine_scores)
    if a.edits:
        from .edits import run_edits

        summary["edits"] = run_edits(engine, root, a.edits, a.seed)
    return summary


SIDE_KEYS = ("p50_ms", "p95_ms", "p50_first_token_ms", "tokens_per_s", "mean_accepted", "speedup_vs_ar",
             "identical_rate", "exact_match", "edit_similarity")


def side_by_side(runs: dict[str, dict], label: str) -> dict:
    """Targets run on the same positions: per target and mode its latency and quality, its pass cost
    by tree size and draft step cost; `ratio_vs_first_ar`: each mode's p50 over the first target's
    `ar` p50 (a bigger target's `combined` against the smaller one's `ar`)."""
    first = next(iter(runs.values()))
    base = first["modes"]["ar"]["p50_ms"]
    side = {}
    for t, r in runs.items():
        side[t] = {"target": r["target"], "draft": r["draft"], "quant": r["quant"], "pass_cost_ms": r["pass_cost_ms"],
                   "draft_step_ms": r["draft_step_ms"],
                   "modes": {m: {**{k: row.get(k) for k in SIDE_KEYS},
                                 "p50_vs_first_ar": round(row["p50_ms"] / base, 3) if base else None}
                             for m, row in r["modes"].items()}}
    return {"repo": label, "machine": first["machine"], "date": first["date"], "command": first["command"],
            "positions": first["positions"], "targets": list(runs), "side_by_side": side, "by_target": runs}


def record_default(runs: dict[str, dict]) -> dict | None:
    """A CPU run of both Qwen targets with `combined` and `ar` on enough positions decides which one
    `--target default` means on this CPU (models/choice.py): kept in the cache."""
    from ..models.catalog import split_form
    from ..models.choice import MEASURED_PAIR, MIN_POSITIONS, default_target, record_choice

    # the larger target as `NAME` (its default weights) or `NAME@QUANT`: the fastest `combined` of those run
    named = [t for t in runs if split_form(t)[0] == MEASURED_PAIR[0] and "combined" in runs[t]["modes"]]
    key = min(named, key=lambda t: runs[t]["modes"]["combined"]["p50_ms"], default=None)
    larger, smaller = runs.get(key) if key else None, runs.get(MEASURED_PAIR[1])
    if (larger is None or smaller is None or {larger["device"], smaller["device"]} != {"cpu"}
            or "ar" not in smaller["modes"]
            or min(larger["positions"], smaller["positions"]) < MIN_POSITIONS):
        return None
    record_choice({"larger_combined_p50_ms": larger["modes"]["combined"]["p50_ms"],
                   "smaller_ar_p50_ms": smaller["modes"]["ar"]["p50_ms"],
                   "positions": larger["positions"], "repo": larger["repo"], "date": larger["date"],
                   "command": larger["command"], "larger_quant": split_form(key)[1] or "auto",
                   "larger_weights": larger.get("weights_file")})
    target, why = default_target("cpu")
    return {"target": target, "why": why}


def side_table(summary: dict) -> str:
    names = summary["targets"]
    lines = [f"side by side on {summary['positions']} positions of {summary['repo']} "
             f"(p50 vs {names[0]} ar p50):",
             f"{'target':<28}{'mode':<10}{'p50 ms':>9}{'vs ar0':>8}{'tok/s':>8}{'exact':>7}{'edit sim':>9}"]
    for t in names:
        for m, r in summary["side_by_side"][t]["modes"].items():
            lines.append(f"{t:<28}{m:<10}{r['p50_ms']:>9.1f}{r['p50_vs_first_ar']:>8.2f}{r['tokens_per_s']:>8.1f}"
                         f"{r['exact_match']:>7.2f}{r['edit_similarity']:>9.2f}")
    for t in names:
        costs = summary["side_by_side"][t]["pass_cost_ms"]
        lines.append(f"{t}: pass ms by tree size " + ", ".join(f"{n}: {ms:.1f}" for n, ms in costs.items()))
    return "\n".join(lines)


def machine(target) -> str:
    import torch

    from ..models.device import cpu_features, cpu_name

    dev = (torch.cuda.get_device_name() if target.device.type == "cuda"
           else f"{os.cpu_count()} cores, {cpu_name()} ({' '.join(cpu_features()) or 'no AVX2'})")
    return f"{dev}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def table(summary: dict) -> str:
    lines = [f"{summary['repo']}: {summary['positions']} positions, {summary['machine']}",
             f"{'engine':<26}{'p50 ms':>9}{'p95 ms':>9}{'ttft p50':>10}{'tok/s':>8}{'acc/pass':>9}"
             f"{'vs ar':>7}{'same':>7}{'exact':>7}{'edit sim':>9}"]
    for name, r in {**summary["modes"], **summary["peers"]}.items():
        lines.append(f"{name:<26}{r['p50_ms']:>9.1f}{r['p95_ms']:>9.1f}{r.get('p50_first_token_ms', float('nan')):>10.1f}"
                     f"{r['tokens_per_s']:>8.1f}{r.get('mean_accepted', float('nan')):>9.2f}{r['speedup_vs_ar']:>7.2f}"
                     f"{r['identical_rate']:>7.2f}{r.get('exact_match', float('nan')):>7.2f}"
                     f"{r.get('edit_similarity', float('nan')):>9.2f}")
    if r := summary.get("keystroke_replay"):
        from .report import shown_table

        lines += shown_table(r)
    if p := summary.get("prefill"):
        lines.append(f"cold prefill, {p['prompts']} prompts, {p['tokens']} tokens: ours {p['ours_tokens_per_s']} tokens/s, "
                     f"llama.cpp {p['llama_cpp_tokens_per_s']} ({p['ratio_vs_llama_cpp']}x llama.cpp)")
    return "\n".join(lines)
