"""How often rounding the int8 kernel's activations changes the real target's greedy token.

The target as the daemon loads it on this CPU (int8 weights, the lean forward with the native Qwen2
layer, the output layer refined in float32 on its top rows), teacher-forced over real Python files
(the standard library's): each file's first tokens are prefilled, the rest run as verify passes of
--chain nodes (a chain, logits at every node, committed after), once per kernel kind. Every kind
sees the same weights and positions; the result is the share of positions whose argmax differs
from the float32-activation kernel's, and each kind's top-1 agreement with the file's next token.

    python -m benchmarks.experiments activation_agreement --json benchmarks/results/activation-agreement-0.5b.json
    python -m benchmarks.experiments activation_agreement --attention ...   # float32 vs bf16 attention scores
    python -m benchmarks.experiments activation_agreement --value-pairs ...  # bf16 attention's value sums: float32, pairs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import torch

from completiond.models.kernels import cpu_kernel
from completiond.core.forward.runner import Runner
from completiond.models.loader import load
from completiond.models.device import cpu_name

FILES = ["textwrap.py", "json/decoder.py", "argparse.py", "functools.py", "shlex.py", "csv.py", "heapq.py",
         "dataclasses.py", "pathlib.py", "statistics.py", "difflib.py", "calendar.py"]


def picks(r: Runner, kind: str, ids: list[int], prefix: int, chain: int, attr: str = "kind") -> torch.Tensor:
    """The argmax after every position from `prefix` on, with cpu_kernel.<attr>() (the kernel kind, or
    with --attention the attention scores' dtype) returning `kind` (--value-pairs: the kernel's
    switch set to `kind`)."""
    if attr == "value_pairs":  # the kernel's own switch (bf16 attention's value sums)
        lib = cpu_kernel.library()
        saved = lib.completiond_value_pairs(-1)
        lib.completiond_value_pairs(int(kind == "bf16-pairs"))
    else:
        saved = getattr(cpu_kernel, attr)
        setattr(cpu_kernel, attr, lambda: kind)
    try:
        r.rollback(0)
        r.extend(ids[:prefix])
        out = []
        for s in range(prefix, len(ids), chain):
            part = ids[s:s + chain]
            logits = r.forward(part, [-1] + list(range(len(part) - 1)), range(len(part)))
            out.append(logits.argmax(-1))
            r.keep(range(len(part)))
        return torch.cat(out)
    finally:
        if attr == "value_pairs":
            lib.completiond_value_pairs(saved)
        else:
            setattr(cpu_kernel, attr, saved)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--files", type=int, default=len(FILES))
    ap.add_argument("--tokens", type=int, default=512, help="tokens per file")
    ap.add_argument("--prefix", type=int, default=64, help="tokens prefilled before the verify passes")
    ap.add_argument("--chain", type=int, default=16, help="nodes per verify pass")
    ap.add_argument("--kinds", default="", help="default: float32, int16 and int8 on the widest sums here")
    ap.add_argument("--attention", action="store_true",
                    help="compare the attention scores' dtypes (cpu_kernel.ATTENTION) at this process's kind instead")
    ap.add_argument("--value-pairs", action="store_true",
                    help="compare bf16 attention's value sums one key at a time in float32 and in bf16 pairs of keys "
                         "(completiond_value_pairs) instead")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    if not cpu_kernel.enabled():
        print("activation_agreement: completiond's int8 kernel does not run here", file=sys.stderr)
        return 2
    kinds = [k for k in a.kinds.split(",") if k] or [cpu_kernel.kind_of(x) for x in cpu_kernel.ACTIVATIONS]
    attr = "attention" if a.attention else "value_pairs" if a.value_pairs else "kind"
    if a.attention:
        kinds = list(cpu_kernel.ATTENTION)
    if a.value_pairs:
        if cpu_kernel.attention() != "bf16":
            print("activation_agreement: value pairs run with bf16 attention only (AVX512-BF16)", file=sys.stderr)
            return 2
        kinds = ["float32-values", "bf16-pairs"]
    t = load(a.target, "target", "cpu", "auto", "auto")
    r = Runner(t, backend="lean")
    if getattr(r.base, "native", None) is None:
        print("activation_agreement: the native Qwen2 layer does not run for this target", file=sys.stderr)
        return 2
    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = {f: (lib / f).read_text() for f in FILES[:a.files]}
    got: dict[str, list[torch.Tensor]] = {k: [] for k in kinds}
    labels = []
    for name, text in texts.items():
        ids = t.tokenizer.encode(text, add_special_tokens=False)[:a.tokens]
        labels.append(torch.tensor(ids[a.prefix + 1:]))
        for k in kinds:  # the pick after the file's last token has no label
            got[k].append(picks(r, k, ids, a.prefix, a.chain, attr)[:len(labels[-1])])
        print(f"{name}: {len(ids)} tokens at {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    ref = torch.cat(got[kinds[0]])
    gold = torch.cat(labels)
    rows = {}
    for k in kinds:
        mine = torch.cat(got[k])
        rows[k] = {"differs_from_" + kinds[0]: round((mine != ref).float().mean().item(), 5),
                   "positions_differing": int((mine != ref).sum()),
                   "top1_vs_next_token": round((mine == gold).float().mean().item(), 4)}
        print(f"{k:20s} {rows[k]}")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "target": a.target, "cpu": cpu_name(),
              "int8_kernel_chosen_here": cpu_kernel.name(), "files": list(texts), "positions": len(ref),
              "setup": f"{a.prefix} tokens prefilled, then verify passes of {a.chain}-node chains "
                       "(logits at every node), int8 weights, lean native layer, top-8 float32 refinement",
              "compared": attr, "kinds": rows, "threads": a.threads, "load_average": list(os.getloadavg()),
              "wall_s": round(time.perf_counter() - t0, 1)}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
