"""Benchmark numbers: per-mode and per-peer summaries (the JSON other tools read) and a plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .modes import BenchPrompt


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2) if values else float("nan")


def summarize_modes(prepared: list[BenchPrompt], modes: list[str]) -> dict:
    out = {}
    ar_ms = [pp.runs["ar"].result.ms_total for pp in prepared]
    for mode in modes:
        runs = [pp.runs[mode] for pp in prepared if mode in pp.runs]
        if not runs:
            continue
        ms = [r.result.ms_total for r in runs]
        tokens = sum(len(r.result.token_ids) for r in runs)
        passes = sum(r.result.target_passes for r in runs)
        accepted = sum(r.result.mean_accepted * r.result.target_passes for r in runs)
        depth = np.zeros(max((len(r.result.accepted_by_depth) for r in runs), default=0))
        for r in runs:
            depth[: len(r.result.accepted_by_depth)] += r.result.accepted_by_depth
        out[mode] = {
            "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95),
            "p50_first_token_ms": _pct([r.result.ms_first_token for r in runs], 50),
            "p95_first_token_ms": _pct([r.result.ms_first_token for r in runs], 95),
            "tokens_per_s": round(tokens / (sum(ms) / 1000), 2) if sum(ms) else 0.0,
            "mean_accepted": round(accepted / passes, 3) if passes else 0.0,
            "speedup_vs_ar": round(sum(ar_ms) / sum(ms), 3) if sum(ms) else 0.0,
            "identical_rate": round(sum(r.identical for r in runs) / len(runs), 4),
            "exact_match": round(sum(r.exact for r in runs) / len(runs), 4),
            "exact_middle": round(sum(r.exact_middle for r in runs) / len(runs), 4),
            "edit_similarity": round(float(np.mean([r.similarity for r in runs])), 4),
            "tokens": tokens, "target_passes": passes,
            # P(draft token at depth d accepted) per pass: acceptance by position in the tree
            "acceptance_by_depth": [round(float(x) / passes, 4) for x in depth] if passes else [],
            "divergences": [dict(position=r.position, **r.divergence) for r in runs if r.divergence],
        }
    return out


def details(prepared: list[BenchPrompt], positions, root) -> list[dict]:
    """One row per position: where, the reference line, ar's text, and each mode's numbers."""
    rows = []
    for pp, pos in zip(prepared, positions):
        rows.append({
            "file": str(pos.file.relative_to(root)), "line": pos.line + 1, "col": pos.col + 1, "kind": pos.kind,
            "reference": pos.reference, "prompt_tokens": len(pp.prompt),
            "context_files": pp.context_files,
            "ar_text": pp.runs["ar"].result.text if "ar" in pp.runs else None,
            "modes": {m: {"ms_total": round(r.result.ms_total, 1), "ms_first_token": round(r.result.ms_first_token, 1),
                          "tokens": len(r.result.token_ids), "passes": r.result.target_passes,
                          "identical": r.identical, "stopped_by": r.result.stopped_by}
                      for m, r in pp.runs.items()},
        })
    return rows


def summarize_peers(prepared: list[BenchPrompt], peer_rows: dict[str, list[dict]]) -> dict:
    out = {}
    for name, rows in peer_rows.items():
        if not rows:
            continue
        ms = [r["ms_total"] for r in rows]
        ar_ms = [prepared[r["position"]].runs["ar"].result.ms_total for r in rows]
        tokens = sum(r["tokens"] for r in rows)
        out[name] = {
            "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95),
            **({"p50_first_token_ms": _pct([r["ms_first_token"] for r in rows], 50),
                "p95_first_token_ms": _pct([r["ms_first_token"] for r in rows], 95)} if "ms_first_token" in rows[0] else {}),
            "tokens_per_s": round(tokens / (sum(ms) / 1000), 2) if sum(ms) else 0.0,
            "speedup_vs_ar": round(sum(ar_ms) / sum(ms), 3) if sum(ms) else 0.0,
            "identical_rate": round(sum(r["identical"] for r in rows) / len(rows), 4),
            **({"exact_match": round(sum(r["exact"] for r in rows) / len(rows), 4),
                "edit_similarity": round(float(np.mean([r["similarity"] for r in rows])), 4)}
               if "exact" in rows[0] else {}),
            **({"assistant": rows[0]["assistant"]} if "assistant" in rows[0] else {}),
        }
    return out


def shown_table(replay: dict) -> list[str]:
    """Table lines: what the daemon showed after typing up to each position's cursor, per open pause,
    beside the engine's quality on the same positions (`keystroke_replay` of the JSON)."""
    shown = replay.get("shown") or {}
    if not shown:
        return []
    e = replay.get("engine") or {}
    lines = [f"{'shown (daemon, typed)':<26}{'pause s':>9}{'exact':>7}{'edit sim':>9}{'vs eng':>8}"
             f"{'quick':>7}{'full':>6}{'final p50':>11}{'p95':>8}"]
    if e:
        lines.append(f"{'engine (' + e['mode'] + ', same pos.)':<26}{'':>9}{e['exact_line']:>7.2f}{e['edit_sim']:>9.2f}")
    for s in shown.values():
        vs = (s.get("vs_engine") or {}).get("exact_line")
        lines.append(f"{'shown':<26}{s['open_pause_s']:>9g}{s['exact_line']:>7.2f}{s['edit_sim']:>9.2f}"
                     f"{vs if vs is not None else float('nan'):>8.2f}{s['lanes']['quick']:>7}{s['lanes']['full']:>6}"
                     f"{_num(s['p50_final_keystroke_ms']):>11}{_num(s['p95_final_keystroke_ms']):>8}")
    return lines


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["modes"]) + list(summary.get("peers", {}))
    rows = [summary["modes"].get(n) or summary["peers"][n] for n in names]
    depth = any(summary["modes"][m]["acceptance_by_depth"] for m in summary["modes"])
    replay = summary.get("keystroke_replay") or {}
    shown = replay.get("shown") or {}
    fig, axes = plt.subplots(1, 2 + depth + bool(shown), figsize=(16 + 5 * bool(shown), 4.8))
    colors = ["#4477aa" if n in summary["modes"] else "#bbbbbb" for n in names]
    x = np.arange(len(names))
    axes[0].bar(x - 0.2, [r["p50_ms"] for r in rows], 0.4, color=colors, label="p50")
    axes[0].bar(x + 0.2, [r["p95_ms"] for r in rows], 0.4, color=colors, alpha=0.5, label="p95")
    axes[0].set_xticks(x, names, rotation=30, ha="right")
    axes[0].set_ylabel("completion latency (ms)")
    axes[0].legend()
    axes[1].bar(x, [r["speedup_vs_ar"] for r in rows], color=colors)
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_xticks(x, names, rotation=30, ha="right")
    axes[1].set_ylabel("speed-up vs completiond ar (same positions)")
    if shown:  # quality shown after typing (per open pause) beside the engine's, same positions
        ax = axes[-1]
        e = replay.get("engine") or {}
        names_q = ([f"engine ({e['mode']})"] if e else []) + [f"shown, {k} s open" for k in shown]
        rows_q = ([e] if e else []) + list(shown.values())
        xq = np.arange(len(names_q))
        ax.bar(xq - 0.2, [r["exact_line"] for r in rows_q], 0.4, color="#4477aa", label="exact line")
        ax.bar(xq + 0.2, [r["edit_sim"] for r in rows_q], 0.4, color="#66ccee", label="edit similarity")
        ax.set_xticks(xq, names_q, rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"quality, {rows_q[-1]['positions']} positions")
        ax.legend()
    if depth:
        for m, r in summary["modes"].items():
            if r["acceptance_by_depth"]:
                d = r["acceptance_by_depth"][:16]
                axes[2].plot(range(1, len(d) + 1), d, marker="o", label=m)
        axes[2].set_xlabel("position in the speculated path (depth)")
        axes[2].set_ylabel("accepted tokens per verify pass")
        axes[2].legend()
    fig.suptitle(f"{summary['repo']} — {summary['positions']} positions, {summary['machine']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
