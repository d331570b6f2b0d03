"""A/B of the FIM prompt with and without Qwen's repository header, same positions, `ar` only.

    python benchmarks/fim_header_ab.py pypi:boltons==25.0.0

Prints exact-line rate and mean edit similarity per variant (the README's "Choosing the default
models" cites one run): default target qwen2.5-coder-0.5b, int8, 24-token multi-line completions.
"""

import sys

import torch

from completiond.bench.repo import edit_similarity, first_line, read_text_file, resolve_repo, sample_positions
from completiond.core.engine import Engine, Request
from completiond.models import load
from completiond.core.prompt import build_prompt


def main(repo: str, positions: int = 16) -> None:
    torch.set_num_threads(1)
    root, label = resolve_repo(repo)
    target = load("qwen2.5-coder-0.5b", quant="int8")
    engine = Engine(target, None)
    pos = sample_positions(root, positions, "both", 0)
    for variant in ("repo", "plain"):
        exact = sim = 0.0
        for p in pos:
            doc, off = p.document(read_text_file(p.file) or "")
            kw = dict(path=p.file.relative_to(root).as_posix(), repo=root.name) if variant == "repo" else {}
            pr = build_prompt(target.tokenizer, doc, off, multiline=True, max_tokens=2048, **kw)
            r = engine.complete(Request(prompt=pr.ids, mode="ar", max_tokens=24, stops=pr.stops, heal=pr.heal))
            line = first_line(r.text)
            exact += line == p.reference
            sim += edit_similarity(line, p.reference)
        print(label, variant, "exact line", round(exact / len(pos), 3), "edit sim", round(sim / len(pos), 3))


if __name__ == "__main__":
    main(sys.argv[1])
