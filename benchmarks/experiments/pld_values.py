"""How prompt lookup values its candidates, measured: one engine, `ar` and `pld` with the shipped
valuation and with the earlier one (every candidate's first token valued by its own backward-match
length), the two `pld` arms taking turns first position by position; plus, on `ar`'s own tokens,
how often the candidates' distinct first tokens are the target's, by rank.

    python -m benchmarks.experiments pld_values --target qwen2.5-coder-0.5b --repo pypi:toolz==1.0.0 --positions 40 \
        --json benchmarks/results/zen4/round20/pld-values-0.5b-toolz.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch

from completiond.bench.cli import machine
from completiond.bench.modes import index_repo, open_position, prepare, warm
from completiond.bench.repo import resolve_repo, sample_positions
from completiond.core.engine import Engine, Request
from completiond.core.speculation.proposers import Candidate, Outcome, PromptLookup
from completiond.models.loader import load


class ByMatchLength(PromptLookup):
    """The earlier valuation: each candidate's first token by its own match length, later ones by one
    EWMA; an outcome's first-token bucket is the one whose value is closest to what was predicted."""

    def value(self, found: list[tuple[list[int], int]]) -> list[Candidate]:
        return [Candidate(t, [self.first[self._bucket(m)].value] + [self.next.value] * (len(t) - 1), self.name)
                for t, m in found]

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            if o.depth > 1:
                self.next.add(float(o.accepted))
            else:
                self.first[min(self.first, key=lambda b: abs(self.first[b].value - o.predicted))].add(float(o.accepted))


def first_tokens_by_rank(engine: Engine, prompt: list[int], ids: list[int], hits: Counter) -> None:
    """At every position of `ar`'s output: is the r-th distinct first token of prompt lookup's
    candidates (in their rank order) the target's?"""
    pld = PromptLookup(engine.index, fim=engine.fim)
    for i in range(1, len(ids)):
        firsts = list(dict.fromkeys(t[0] for t, _ in pld.ranked(prompt + ids[:i], engine.max_candidate_len)))
        for rank, t in enumerate(firsts[:3]):
            hits[(rank, "n")] += 1
            hits[(rank, "ok")] += t == ids[i]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load(a.target, "target", "cpu", "auto", a.quant)
    engine = Engine(target, None)
    calibration = engine.calibrate_cached()
    arms = {"by-match-length": ByMatchLength(engine.index, fim=engine.fim),
            "shipped": PromptLookup(engine.index, fim=engine.fim)}
    root, label = resolve_repo(a.repo)
    files = index_repo(engine, root)
    prepared = sorted(prepare(engine, root, sample_positions(root, a.positions, "both", 0), True, 2048),
                      key=lambda p: str(p.file))
    totals = {k: dict(ms=0.0, decode_ms=0.0, passes=0, tokens=0, identical=0) for k in ("ar", *arms)}
    hits: Counter = Counter()
    current = None
    for n, pp in enumerate(prepared):
        current = open_position(engine, files, pp, current)
        names = list(arms) if n % 2 else list(arms)[::-1]
        ar = None
        for arm in ["ar", *names]:
            if arm != "ar":
                engine.prompt_lookup = arms[arm]
            warm(engine, pp.prompt)
            t0 = time.perf_counter()
            res = engine.complete(Request(prompt=pp.prompt, mode="ar" if arm == "ar" else "pld",
                                          max_tokens=a.max_tokens, stops=pp.stops, heal=pp.heal))
            ms = (time.perf_counter() - t0) * 1000
            row = totals[arm]
            row["ms"] += ms
            row["decode_ms"] += ms - res.ms_first_token
            row["passes"] += res.target_passes
            row["tokens"] += len(res.token_ids)
            if arm == "ar":
                ar = res.token_ids
                first_tokens_by_rank(engine, pp.prompt, ar, hits)
            else:
                row["identical"] += res.token_ids == ar
        print(f"{n + 1}/{len(prepared)}", {k: round(v["ms"]) for k, v in totals.items()}, flush=True)
    for arm in arms:
        row = totals[arm]
        row["speedup_vs_ar"] = round(totals["ar"]["ms"] / row["ms"], 3)
        row["decode_speedup_vs_ar"] = round(totals["ar"]["decode_ms"] / row["decode_ms"], 3)
    by_rank = {r: {"positions": hits[(r, "n")], "accepted": round(hits[(r, "ok")] / max(1, hits[(r, "n")]), 3)}
               for r in range(3)}
    out = {"command": "python -m benchmarks.experiments pld_values " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None),
           "machine": machine(target), "repo": label, "target": a.target, "quant": a.quant,
           "calibration": calibration, "positions": len(prepared), "totals": totals,
           "shipped_over_by_match_length_ms": round(totals["shipped"]["ms"] / totals["by-match-length"]["ms"], 3),
           "first_token_accepted_by_rank": by_rank,
           "calibrated": {name: {"first": {b: round(e.value, 3) for b, e in p.first.items()},
                                 "next": round(p.next.value, 3), "alt": round(p.alt.value, 3)}
                          for name, p in arms.items()}}
    print(json.dumps({k: out[k] for k in ("totals", "shipped_over_by_match_length_ms", "first_token_accepted_by_rank")},
                     indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
