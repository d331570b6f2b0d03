"""Put a newer run's keystroke replay into a committed bench JSON (same positions, engine unchanged).

    python -m benchmarks.experiments replay_merge COMMITTED.json NEW.json --commit SHA [--note TEXT]

NEW.json is a `completiond bench --replay` run at the same repository, positions and target, whose
engine part may be cheaper (`--modes ar`): its `ar` quality must equal COMMITTED.json's position by
position, which holds when only the daemon changed (warm-ups, typed-through). COMMITTED.json keeps its
engine modes and gets NEW.json's `keystroke_replay`, with `keystroke_replay.run` naming NEW.json's
command, date, machine, the commit it ran at and the note; its plot is redrawn beside it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from completiond.bench.report import plot


def merge(committed: dict, new: dict, commit: str, note: str | None = None) -> dict:
    a, b = committed["modes"]["ar"], new["modes"]["ar"]
    if (a["exact_match"], a["edit_similarity"]) != (b["exact_match"], b["edit_similarity"]) or \
            [d["reference"] for d in committed["details"]] != [d["reference"] for d in new["details"]] or \
            [d["ar_text"] for d in committed["details"]] != [d["ar_text"] for d in new["details"]]:
        raise SystemExit("not the same positions and engine answers: run the whole bench instead")
    replay = dict(new["keystroke_replay"])
    replay["run"] = {"command": new["command"], "date": new["date"], "machine": new["machine"], "commit": commit,
                     "engine_modes_from": committed["command"], **({"note": note} if note else {})}
    return {**committed, "keystroke_replay": replay}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("committed", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--commit", required=True, help="the commit NEW.json's run used")
    ap.add_argument("--note", help="what changed after that commit, if anything")
    a = ap.parse_args()
    out = merge(json.loads(a.committed.read_text()), json.loads(a.new.read_text()), a.commit, a.note)
    a.committed.write_text(json.dumps(out, indent=2) + "\n")
    plot(out, a.committed.with_suffix(".png"))
    print("merged", a.committed)


if __name__ == "__main__":
    main()
