"""Slow, literal pure-Python versions of probepo.algo.tree, written straight from BASELINES.md.

One tree, one node, one leaf or one prompt at a time, with plain floats and lists: the vectorised code must
agree.
A tree is a list `parent` (-1 at the root, indices into the same list) and a list of rewards (read at leaves).
"""

from __future__ import annotations

import math


def children(parent: list[int]) -> list[list[int]]:
    """The children of every node."""
    kids: list[list[int]] = [[] for _ in parent]
    for node, up in enumerate(parent):
        if up >= 0:
            kids[up].append(node)
    return kids


def spo_values(parent: list[int], reward: list[float]) -> list[float]:
    """SPO-tree 3: V(leaf) = r(leaf); V(n) = mean of V over n's children (not its leaves)."""
    kids = children(parent)

    def value(node: int) -> float:
        if not kids[node]:
            return reward[node]
        return sum(value(child) for child in kids[node]) / len(kids[node])

    return [value(node) for node in range(len(parent))]


def spo_advantages(
    parent: list[int], reward: list[float], *, adv: str = "diff", eps: float = 1e-6
) -> list[float]:
    """SPO-tree 4: A(n) = V(n) − V(parent(n)); `sibling_std` divides by the siblings' population std of V."""
    values = spo_values(parent, reward)
    kids = children(parent)
    out = []
    for node, up in enumerate(parent):
        if up < 0:
            out.append(0.0)
            continue
        diff = values[node] - values[up]
        if adv == "sibling_std":
            siblings = [values[s] for s in kids[up]]
            mean = sum(siblings) / len(siblings)
            std = math.sqrt(sum((v - mean) ** 2 for v in siblings) / len(siblings))
            diff = diff / (std + eps)
        out.append(diff)
    return out


def treepo_advantages(paths: list[list[int]], rewards: list[float], *, agg: str = "mean") -> list[float]:
    """TreePO 5–6 for one prompt: paths[i] = leaf i's nodes from the root to the leaf.

    G_j = the leaves whose first j + 1 path entries (root and j segments) equal leaf i's; sets with more than
    one member, each distinct set once; Â_ij = r_i − mean(r over G_j); Ã_i their mean or size-weighted mean.
    """
    out = []
    for i, path in enumerate(paths):
        groups: list[frozenset[int]] = []
        for j in range(len(path)):
            members = frozenset(k for k, other in enumerate(paths) if other[: j + 1] == path[: j + 1])
            if len(members) > 1 and members not in groups:
                groups.append(members)
        if not groups:
            out.append(0.0)
            continue
        advs = [rewards[i] - sum(rewards[k] for k in g) / len(g) for g in groups]
        if agg == "mean":
            out.append(sum(advs) / len(advs))
        else:
            out.append(
                sum(len(g) * a for g, a in zip(groups, advs, strict=True)) / sum(len(g) for g in groups)
            )
    return out


def treepo_normalize(leaf_adv: list[float], n_tokens: list[int], *, center: bool = True) -> list[float]:
    """TreePO 7: every leaf's Ã repeated over its tokens; mean and Bessel std over all tokens of the batch."""
    tokens = [a for a, n in zip(leaf_adv, n_tokens, strict=True) for _ in range(n)]
    if len(tokens) < 2 or all(x == tokens[0] for x in tokens):  # no spread, no signal
        return [0.0] * len(leaf_adv)
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1))
    return [(a - mean) / std if center else a / std for a in leaf_adv]


def treepo_children(
    active: int, finished_now: int, finished_total: int, width: int, fork: int = 2
) -> list[int]:
    """TreePO 3 for one prompt: B = max(A, min(w − W, 2F + 2A)), ⌊B/A⌋ each, the remainder to the last."""
    if active == 0:
        return []
    total = max(active, min(width - finished_total, fork * finished_now + fork * active))
    shares = [total // active] * active
    shares[-1] += total % active
    return [max(1, s) for s in shares]


def treepo_restarts(
    n_segments: list[int], uniforms: list[float], budget: int, fork: int = 2
) -> list[tuple[int, int]]:
    """TreePO 4 for one prompt: (candidate, cut) per restart, -1 = the prompt; cut = floor(u · segments)."""
    if not n_segments:
        return [(-1, 0)] * min(fork, budget)
    rows = []
    left = budget
    for k, (segments, u) in enumerate(zip(n_segments, uniforms, strict=True)):
        if left == 0:
            break
        cut = min(int(u * segments), segments - 1)
        take = min(fork, left)
        rows += [(k, cut)] * take
        left -= take
    return rows


def spo_child_count(depth: int, stopped: bool, branching: list[int]) -> int:
    """SPO-tree 1–2 for one node: b_{ℓ+1} unless it stopped or lies at the last level."""
    if stopped or depth == len(branching):
        return 0
    return branching[depth]


def prob_kept(logp: float, threshold: float) -> bool:
    """SPO-tree 6 for one token: kept if its old probability is below the threshold; 1.0 keeps every token."""
    return threshold == 1.0 or math.exp(logp) < threshold
