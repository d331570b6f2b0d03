"""What `--target default` measures on this CPU before any bench: both Qwen targets' one-token pass
costs (completiond/models/estimate.py) in each weights form, on this CPU's kernels and on the
kernels an AVX2-only CPU runs (no VNNI): the ratios and the choice each gives.

    python -m benchmarks.experiments.default_choice --threads 2 --json benchmarks/results/default-choice.json

Nothing is converted or assembled; ~2 GB of memory for a few seconds (a minute under heavy load).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice, as the daemon)")
    ap.add_argument("--reps", type=int, default=5, help="passes per model and form; the fastest counts")
    ap.add_argument("--json", default=None, metavar="OUT")
    a = ap.parse_args(argv)

    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from completiond.models import choice, estimate
    from completiond.models.catalog import CODER_05B, CODER_15B
    from completiond.models.device import LOADED, OthersBusy, cpu_key, loadavg

    if (why := estimate.available()) is not None:
        print(f"default_choice: {why}", file=sys.stderr)
        return 1
    runs = {}
    for kinds, avx2 in (("this CPU's", False), ("AVX2 only", True)):
        busy, t0 = OthersBusy(), time.perf_counter()
        r = estimate.pass_costs(CODER_05B.shape, CODER_15B.shape, avx2=avx2, reps=a.reps)
        ratios = r["ratio"]  # what the daemon decides by (medians of back-to-back pairs)
        form = min(ratios, key=ratios.get)
        expected = ratios[form] * choice.PASS_TO_COMPLETION  # the larger's `combined` over the smaller's `ar`
        busy_share = busy.share()
        # as the daemon decides (models/choice.py): within the line, and measured while the machine was quiet
        within = expected <= choice.LARGER_DEFAULT_WITHIN and (busy_share or 0) < LOADED
        runs[kinds] = {**r, "ratio": ratios, "fastest_form": form, "expected_combined_ratio": round(expected, 3),
                       "default": f"{CODER_15B.name}@{form}" if within else CODER_05B.name,
                       "seconds": round(time.perf_counter() - t0, 1), "others_busy": busy_share}
        print(f"{kinds} kernels ({r['int8_kind']}, {r['w4_kind']}): 0.5B int8 {r['smaller_ms']:.1f} ms; 1.5B "
              + ", ".join(f"{f} {ms:.1f} ms ({ratios[f]:.2f}x)" for f, ms in r["larger_ms"].items())
              + f" -> expected `combined` {expected:.2f}x the 0.5B's `ar`: {runs[kinds]['default']} "
              f"(line {choice.LARGER_DEFAULT_WITHIN}x; others used "
              f"{100 * (runs[kinds]['others_busy'] or 0):.0f}% of the CPUs)")
    out = {"date": datetime.date.today().isoformat(), "cpu": cpu_key(), "cores": os.cpu_count(),
           "threads": torch.get_num_threads(), "loadavg": loadavg(), "torch": torch.__version__,
           "command": " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("COMPLETIOND_")),
                                "python -m benchmarks.experiments.default_choice", *(argv if argv is not None else sys.argv[1:])]),
           "line": choice.LARGER_DEFAULT_WITHIN, "pass_to_completion": choice.PASS_TO_COMPLETION, "runs": runs}
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
