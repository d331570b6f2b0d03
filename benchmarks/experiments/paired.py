"""Two side-by-side bench runs on the same positions, paired: each position's `combined` time over
its own `ar` time (ar runs no code either change touches, so it carries the machine's drift), by
target. Usage: python -m benchmarks.experiments paired BEFORE.json AFTER.json"""

import json
import statistics as S
import sys


def rows(path: str) -> dict:
    d = json.load(open(path))
    out = {}
    for t, r in d["by_target"].items():
        out[t] = [(p["file"], p["line"], p["col"], p["modes"]["ar"]["ms_total"], p["modes"]["combined"]["ms_total"],
                   p["modes"]["combined"]["ms_first_token"], p["modes"]["combined"]["passes"], p["modes"]["combined"]["tokens"])
                  for p in r["details"]]
    return out


before, after = rows(sys.argv[1]), rows(sys.argv[2])
for t in before:
    a, b = before[t], after[t]
    assert [x[:3] for x in a] == [x[:3] for x in b], "not the same positions"
    ratio = [(y[4] / y[3]) / (x[4] / x[3]) for x, y in zip(a, b)]
    print(f"{t}: combined/ar per position, after over before: median {S.median(ratio):.3f}, "
          f"geomean {S.geometric_mean(ratio):.3f}, faster at {sum(r < 1 for r in ratio)} of {len(ratio)}")
    print(f"  combined p50 {S.median(x[4] for x in a):.1f} -> {S.median(y[4] for y in b):.1f} ms; "
          f"ar p50 {S.median(x[3] for x in a):.1f} -> {S.median(y[3] for y in b):.1f} ms; "
          f"ttft p50 {S.median(x[5] for x in a):.1f} -> {S.median(y[5] for y in b):.1f}; "
          f"passes {sum(x[6] for x in a)} -> {sum(y[6] for y in b)}; tokens {sum(x[7] for x in a)} -> {sum(y[7] for y in b)}")
