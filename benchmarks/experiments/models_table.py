"""README's models table, written from `completiond bench --replay` JSONs (one per target and package):

    python -m benchmarks.experiments models_table --readme README.md \\
        benchmarks/results/models/replay-*.json

One row per target (its weights form in the name), the packages' values side by side ("a / b" in the
order of the files): the engine's quality on the full prompt (`ar`: every mode gives its text), what
the daemon *shows* after each open pause (`keystroke_replay.shown`), `combined`'s and `pld`'s
latency, and the last keystroke's time to the first streamed token. Without --readme it prints the
table. The rows are rewritten between the `<!-- MODELS TABLE -->` markers; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

START, END = "<!-- MODELS TABLE -->", "<!-- /MODELS TABLE -->"
HEADER = ("| target | packages | exact line: full prompt | shown after a 2 s / 30 s open pause | edit similarity: "
          "full / shown 2 s / 30 s | `combined` p50 / p95 (`pld`) | last key → ghost text p50 (2 s / 30 s) | source |\n"
          "|---|---|---|---|---|---|---|---|")


def package(run: dict) -> str:
    return run["repo"].split(":", 1)[-1].split("==")[0]


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def row(runs: list[tuple[Path, dict]]) -> str:
    """One target's row from its runs (one per package)."""
    cells: dict[str, list[str]] = defaultdict(list)
    for _, r in runs:
        modes, shown = r["modes"], r.get("keystroke_replay", {}).get("shown", {})
        engine = r.get("keystroke_replay", {}).get("engine") or {}
        s2, s30 = shown.get("2", {}), shown.get("30", {})
        cells["exact"].append(_num(engine.get("exact_line", modes["ar"]["exact_match"])))
        cells["shown"].append(f"{_num(s2.get('exact_line'))} / {_num(s30.get('exact_line'))}")
        cells["sim"].append(f"{_num(engine.get('edit_sim', modes['ar']['edit_similarity']))} / "
                            f"{_num(s2.get('edit_sim'))} / {_num(s30.get('edit_sim'))}")
        c, p = modes.get("combined", {}), modes.get("pld", {})
        cells["lat"].append(f"{_ms(c.get('p50_ms'))} / {_ms(c.get('p95_ms'))} ms "
                            f"({_ms(p.get('p50_ms'))} / {_ms(p.get('p95_ms'))})")
        cells["key"].append(f"{_ms(s2.get('p50_final_keystroke_ms'))} / {_ms(s30.get('p50_final_keystroke_ms'))} ms")
    first = runs[0][1]
    name = f"`{first['target']}@{first['quant']}`" if first.get("quant") else f"`{first['target']}`"
    positions = {r["positions"] for _, r in runs}
    replayed = {len(r.get("keystroke_replay", {}).get("shown", {}).get("2", {}).get("rows", [])) or r["positions"]
                for _, r in runs}
    counts = f"{'/'.join(str(x) for x in sorted(positions))} positions each"
    if replayed != positions:  # quality and shown on the replayed ones, latency on all
        counts += f", {'/'.join(str(x) for x in sorted(replayed))} replayed"
    packages = " / ".join(f"{package(r)} {r['repo'].split('==')[-1]}" for _, r in runs) + f" ({counts})"
    source = ", ".join(f"`{p.as_posix()}`" for p, _ in runs)
    return "| " + " | ".join([name, packages, " / ".join(cells["exact"]), " · ".join(cells["shown"]),
                              " · ".join(cells["sim"]), " · ".join(cells["lat"]), " · ".join(cells["key"]),
                              source]) + " |"


def table(paths: list[Path]) -> str:
    """The table for these runs: targets in the order they first appear, larger first when tied."""
    by_target: dict[str, list[tuple[Path, dict]]] = {}
    for p in paths:
        r = json.loads(p.read_text())
        by_target.setdefault(f"{r['target']}@{r.get('quant')}", []).append((p, r))
    machines = {r["machine"] for runs in by_target.values() for _, r in runs}
    lines = [HEADER] + [row(runs) for runs in by_target.values()]
    return "\n".join(lines) + "\n\n" + "; ".join(sorted(machines)) + "."


def write(readme: Path, body: str) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme}: no {START} ... {END} block")
    readme.write_text(pattern.sub(lambda _: f"{START}\n{body}\n{END}", text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--readme", type=Path)
    a = ap.parse_args()
    body = table(a.runs)
    if a.readme:
        write(a.readme, body)
    print(body)


if __name__ == "__main__":
    main()
