"""The one place that builds the token tree.

Proposers return candidate continuations (`Candidate`: token ids plus an estimated acceptance
probability per token). `build_tree` merges them into a trie rooted at the last token of the
context, best-first: a node's value is the chance that the target accepts every token on its path,
and the tree takes the nodes of highest value up to the budget the tree-size budget (budget.py) chose.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class Candidate:
    tokens: list[int]
    probs: list[float]  # estimated P(target accepts token i | tokens before it accepted)
    source: str  # "pld" | "draft" | ...

    def __post_init__(self) -> None:
        if len(self.probs) != len(self.tokens):
            raise ValueError("one probability per token")


@dataclass
class TokenTree:
    tokens: list[int]  # node 0 is the root: the last context token, not yet in the target's cache
    parents: list[int]  # parents[0] = -1
    value: list[float]  # P(node's whole path accepted)
    source: list[str]
    children: list[dict[int, int]] = field(default_factory=list)  # token -> child node

    @classmethod
    def root_only(cls, token: int) -> "TokenTree":
        return cls([token], [-1], [1.0], ["root"], [{}])

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, value: float, source: str) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.value.append(value)
        self.source.append(source)
        self.children.append({})
        self.children[parent][token] = len(self.tokens) - 1
        return len(self.tokens) - 1

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def build_tree(root: int, candidates: list[Candidate], budget: int) -> TokenTree:
    """Merge candidates into a trie of at most 1 + budget nodes, most probable nodes first.

    Candidates sharing a prefix share nodes; a shared node's value is the largest any candidate
    gives it. Children are inserted after their parents, so parents[i] < i always holds.
    """
    tree = TokenTree.root_only(root)
    # Heap of (-value, tie, candidate index, depth, parent node); depth = index into the candidate.
    heap = [(-c.probs[0], i, i, 0, 0) for i, c in enumerate(candidates) if c.tokens]
    heapq.heapify(heap)
    tie = len(heap)
    while heap and len(tree) - 1 < budget:
        neg, _, ci, d, parent = heapq.heappop(heap)
        c = candidates[ci]
        node = tree.children[parent].get(c.tokens[d])
        if node is None:
            node = tree.add(parent, c.tokens[d], -neg, c.source)
        else:
            tree.value[node] = max(tree.value[node], -neg)
        if d + 1 < len(c.tokens):
            heapq.heappush(heap, (neg * c.probs[d + 1], tie, ci, d + 1, node))
            tie += 1
    return tree


def truncate(tree: TokenTree, n: int) -> TokenTree:
    """The first 1 + n nodes (best-first order, so parents come first)."""
    if n + 1 >= len(tree):
        return tree
    keep = n + 1
    children = [{t: c for t, c in ch.items() if c < keep} for ch in tree.children[:keep]]
    return TokenTree(tree.tokens[:keep], tree.parents[:keep], tree.value[:keep], tree.source[:keep], children)
