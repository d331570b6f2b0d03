"""How often a verify pass and one-token passes disagree on CUDA in bf16 (the Standards' near-tie
question), Qwen2.5-Coder 0.5B and 1.5B shapes with random weights (the device machine cannot fetch
the real ones; random logits are flatter than a trained model's, so near-ties are likelier here).

Teacher-forced: after a prompt of --context random ids, a chain of 8 ids runs as one pass (what a
verify pass does), and the same 8 ids run one pass each (what `ar` does). A node whose greedy token
(after the float32 refinement of the top rows) differs between the two is a disagreement: there,
speculative output could differ from `ar`. fp32 is run too, as the control. Graphs on (the default).

    python -m benchmarks.experiments gpu_agreement --json benchmarks/results/gpu-agreement.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from benchmarks.gpu_pass_cost import SHAPES, model  # noqa: E402

from completiond.core.forward.runner import Runner  # noqa: E402
from completiond.models.loaded import LoadedModel  # noqa: E402

CHAIN = 8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chains", type=int, default=48)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_agreement: no CUDA device", file=sys.stderr)
        return 2
    out = {}
    for name, shape in SHAPES.items():
        m = model(shape)
        for dtype in (torch.bfloat16, torch.float32):
            m = m.to(dtype)
            lm = LoadedModel(name=name, model=m, tokenizer=None, device=torch.device("cuda"), dtype=dtype)
            r = Runner(lm, capacity=a.context + 64, backend="lean")
            g = torch.Generator().manual_seed(1)
            ids = torch.randint(0, 151000, (a.context + a.chains * CHAIN,), generator=g).tolist()
            r.extend(ids[:a.context])
            differ, gaps, maxdiff = 0, [], 0.0
            for c in range(a.chains):
                chain = ids[a.context + c * CHAIN:a.context + (c + 1) * CHAIN]
                tree = r.forward(chain, list(range(-1, CHAIN - 1)), range(CHAIN))
                single = []
                for i, t in enumerate(chain):
                    single.append(r.forward([t], [-1], [0])[0])
                    r.keep([0])
                r.rollback(a.context)
                single = torch.stack(single)
                top2 = single.topk(2, -1).values
                gaps += (top2[:, 0] - top2[:, 1]).tolist()
                differ += int((tree.argmax(-1) != single.argmax(-1)).sum())
                maxdiff = max(maxdiff, float((tree.max(-1).values - single.max(-1).values).abs().max()))
            n = a.chains * CHAIN
            gaps.sort()
            key = f"{name} {str(dtype).removeprefix('torch.')}"
            out[key] = {"nodes": n, "greedy_differs": differ, "rate": differ / n,
                        "max_abs_diff_of_top_logit": maxdiff, "median_top2_gap": gaps[n // 2],
                        "top2_gap_under_0.01": sum(x < 0.01 for x in gaps) / n,
                        "graphs_captured": r.graphs.captured if r.graphs else 0}
            print(key, out[key], flush=True)
            del r, lm
            torch.cuda.empty_cache()
        del m
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "context": a.context, "chain": CHAIN, "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
