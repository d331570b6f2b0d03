"""What prompt lookup could give at most: a target's `ar` tokens replayed through its candidates.

For every position of the target's `ar` output the ranked continuations (up to 6, 16 tokens each)
are kept with how many of their tokens the target wrote next; then decoding is replayed step by step
under tree policies, each node count priced by a pass-cost table: the best continuation chosen after
the fact (an upper bound no proposer reaches), the leading continuation cut at a fixed length, and
the engine's value rule (nodes by P(path accepted), the size with the most expected tokens per ms)
with every first token valued by its own match length (the earlier rule) or alternatives at 0.1 (the engine's rule).
Replays count decoding only; `first_token_ms` adds the prefill the bench counts too.

    python -m benchmarks.experiments pld_replay --repo pypi:toolz==1.0.0 --positions 40 \
        --costs benchmarks/results/zen4/round20/targets-toolz.json \
        --json benchmarks/results/zen4/round20/pld-replay-toolz.json
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch

from completiond.bench.cli import machine
from completiond.bench.modes import index_repo, open_position, prepare, warm
from completiond.bench.repo import resolve_repo, sample_positions
from completiond.core.engine import Engine, Request
from completiond.models.loader import load

PRIORS = {2: 0.3, 4: 0.5, 8: 0.7, 16: 0.8}  # PromptLookup.first's priors; later tokens 0.8


def bucket(match: int) -> int:
    return 2 if match < 4 else 4 if match < 8 else 8 if match < 16 else 16


def interpolate(table: dict[int, float], n: int) -> float:
    sizes = sorted(table)
    for a, b in zip(sizes, sizes[1:]):
        if a <= n <= b:
            return table[a] + (table[b] - table[a]) * (n - a) / (b - a)
    return table[sizes[-1]] * n / sizes[-1]


def agreed(tokens: list[int], ids: list[int], i: int) -> int:
    """How many of `tokens` `ar` wrote from its offset i on."""
    a = 0
    while a < len(tokens) and i + a < len(ids) and tokens[a] == ids[i + a]:
        a += 1
    return a


def collect(engine: Engine, repo: str, positions: int, max_tokens: int,
            extra: Callable[[list[int]], tuple[list[int], int]] | None = None) -> list[dict]:
    """Per position: `ar`'s tokens and, at each of their offsets, the ranked continuations as
    (match length, tokens, how many of them `ar` wrote next). extra: another proposer's
    (tokens, match) for the context as prompt lookup reads it, kept as `extra` in the same form."""
    root, _ = resolve_repo(repo)
    files = index_repo(engine, root)
    pld = engine.prompt_lookup
    out, current = [], None
    for pp in sorted(prepare(engine, root, sample_positions(root, positions, "both", 0), True, 2048),
                     key=lambda p: str(p.file)):
        current = open_position(engine, files, pp, current)
        warm(engine, pp.prompt)
        ids = engine.complete(Request(prompt=pp.prompt, mode="ar", max_tokens=max_tokens, stops=pp.stops,
                                      heal=pp.heal)).token_ids
        steps, more = [], []
        for i in range(1, len(ids)):
            steps.append([(m, t, agreed(t, ids, i)) for t, m in pld.ranked(pp.prompt + ids[:i], 16)])
            if extra is not None:
                t, m = extra(pld.document_view(pp.prompt + ids[:i])[0].tolist())
                more.append((m, t, agreed(t, ids, i)))
        out.append({"tokens": len(ids), "steps": steps} | ({"extra": more} if extra is not None else {}))
    return out


def valued(cands: list, alt: float | None, costs: dict[int, float]) -> list[tuple[int, int]]:
    """The engine's rule: node values down each candidate, the best-first nodes with the most expected
    tokens per ms; alt=None values every first token by its own match length (the earlier rule)."""
    values: dict[tuple, float] = {}
    for m, t, _ in cands:
        v = 1.0
        for d in range(len(t)):
            path = tuple(t[:d + 1])
            if path in values:
                v = values[path]
                continue
            beside = alt is not None and any(len(q) == d + 1 and q[:d] == path[:d] for q in values)
            v *= alt if beside else PRIORS[bucket(m)] if d == 0 else 0.8
            values[path] = v
    order = sorted(values.items(), key=lambda kv: (-kv[1], len(kv[0])))[:16]
    best_n, best_rate, gain = 0, 1 / interpolate(costs, 1), 1.0
    for n in range(1, len(order) + 1):
        gain += order[n - 1][1]
        if gain / interpolate(costs, n + 1) > best_rate:
            best_n, best_rate = n, gain / interpolate(costs, n + 1)
    keep = {p for p, _ in order[:best_n]}
    cuts = []
    for k, (_, t, _) in enumerate(cands):
        d = 0
        while d < len(t) and tuple(t[:d + 1]) in keep:
            d += 1
        cuts.append((k, d))
    return cuts


def replay(data: list[dict], policy, costs: dict[int, float]) -> dict:
    """Decode every position under `policy` (candidates -> [(candidate, tokens kept)])."""
    ms = passes = tokens = 0
    for pos in data:
        i = 1
        while i < pos["tokens"]:
            cands = pos["steps"][i - 1]
            cuts = [(k, n) for k, n in policy(cands) if n > 0]
            nodes = {tuple(cands[k][1][:j]) for k, n in cuts for j in range(1, n + 1)}
            accepted = max([min(cands[k][2], n) for k, n in cuts] + [0])
            ms += interpolate(costs, len(nodes) + 1)
            passes += 1
            tokens += accepted + 1
            i += accepted + 1
    return {"passes": passes, "tokens_per_pass": round(tokens / passes, 3), "ms": round(ms, 1)}


def after_the_fact(cands: list) -> list[tuple[int, int]]:
    """The candidate the target agreed with longest, cut there: an upper bound no proposer reaches."""
    return [max(((k, x[2]) for k, x in enumerate(cands)), key=lambda kn: kn[1])] if cands else []


def scored(data: list[dict], policy, costs: dict[int, float], first_ms: float) -> dict:
    """`replay`, with its speed-up over `ar` (a one-node pass a token) in decoding alone and with
    every position's first token (first_ms) counted, as the bench counts it."""
    r = replay(data, policy, costs)
    ar_ms = sum(p["tokens"] - 1 for p in data) * costs[1]
    r["decode_speedup"] = round(ar_ms / r["ms"], 3)
    r["with_first_token_speedup"] = round((ar_ms + first_ms * len(data)) / (r["ms"] + first_ms * len(data)), 3)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--costs", required=True, help="a two-target bench JSON: every target's pass_cost_ms prices the replay")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load(a.target, "target", "cpu", "auto", a.quant)
    engine = Engine(target, None)
    engine.calibrate_cached()
    data = collect(engine, a.repo, a.positions, a.max_tokens)
    bench = json.load(open(a.costs))
    policies = {"after the fact": after_the_fact}
    for n in (1, 2, 3, 4, 6, 8, 16):
        policies[f"leading chain of {n}"] = lambda c, n=n: [(0, n)] if c else []
    results = {}
    for name, info in bench["by_target"].items():
        costs = {int(k): v for k, v in info["pass_cost_ms"].items()}
        first_ms = info["modes"]["ar"]["p50_first_token_ms"]
        rules = dict(policies, **{"by match length (round 19)": lambda c, t=costs: valued(c, None, t),
                                  "alternatives at 0.1 (round 20)": lambda c, t=costs: valued(c, 0.1, t)})
        rows = {}
        for rule, policy in rules.items():
            r = rows[rule] = scored(data, policy, costs, first_ms)
            print(f"{name:26s} {rule:32s} passes {r['passes']:4d} tokens/pass {r['tokens_per_pass']:.2f} "
                  f"decoding {r['decode_speedup']:.2f}x, with the first token {r['with_first_token_speedup']:.2f}x", flush=True)
        results[name] = {"pass_cost_ms": costs, "first_token_ms": first_ms, "policies": rows}
    out = {"command": "python -m benchmarks.experiments pld_replay " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None),
           "machine": machine(target), "repo": a.repo, "tokens_of": a.target, "positions": len(data),
           "decode_tokens": sum(p["tokens"] - 1 for p in data), "by_cost_table": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
