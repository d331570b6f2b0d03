"""The one place that verifies: which path of the token tree the target accepts, and the bonus token.

Greedy: follow the child equal to the target's argmax at each node; the first argmax with no
matching child is the bonus token. Output is then exactly the target's own greedy decoding.

Sampling: at each node, the children are proposals from a deterministic proposer (point masses),
tried one after another. With p the target's (warped) distribution at the node, child token x is
accepted with probability p(x); on rejection x is removed from p and p renormalised; when every child
is rejected the bonus token is drawn from what is left. The token leaving the node is therefore
distributed exactly as p, and the path continues below an accepted child, whose logits were
computed with that child in context. This keeps the target's distribution exactly for any tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...limits import MIN_TEMPERATURE  # greedy below it (defined torch-free, for the daemon's handlers)
from .tree import TokenTree

# Below MIN_TEMPERATURE sampling is greedy: logits / T overflows float32 for T near 1e-38 (inf - inf
# = nan in softmax), and long before that the warped distribution is the argmax's point mass anyway.


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 (or under MIN_TEMPERATURE): greedy
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


def warp(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Target probabilities after temperature / top-k / top-p: [..., V] float32 logits -> probs."""
    logits = logits / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the first always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= s.top_p
        drop[..., 0] = False  # a top_p that rounds to 0 in float32 (5e-324) still keeps the best token
        probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> int:
    """One token from the target at a single position: logits [V]."""
    if s.greedy:
        return int(logits.argmax())
    return int(torch.multinomial(warp(logits, s), 1, generator=gen))


def accept(tree: TokenTree, logits: torch.Tensor, s: Sampling, gen: torch.Generator | None
           ) -> tuple[list[int], int]:
    """Walk the tree with the target's logits [len(tree), V]; return (accepted path nodes, bonus token).

    The path starts at the root (node 0); accepted tokens are tree.tokens[path[1:]].
    """
    path = [0]
    node = 0
    if s.greedy:
        best = logits.argmax(-1).tolist()
        while True:
            child = tree.children[node].get(best[node])
            if child is None:
                return path, best[node]
            path.append(child)
            node = child
    while True:
        p = warp(logits[node], s)
        nxt = None
        for token, child in tree.children[node].items():
            mass = float(p.sum())
            if mass <= 0.0:
                break
            if float(torch.rand((), generator=gen)) * mass < float(p[token]):
                nxt = child
                break
            p[token] = 0.0
        if nxt is None:
            if float(p.sum()) <= 0.0:  # every token with mass was proposed and rejected: impossible in exact math
                p = warp(logits[node], s)
            return path, int(torch.multinomial(p, 1, generator=gen))
        path.append(nxt)
        node = nxt
