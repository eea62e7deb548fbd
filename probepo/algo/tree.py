"""Trees of responses (BASELINES.md), the structure both tree baselines read: spo_tree.py (SPO-tree's node
values, edge advantages, probability mask) and treepo.py (TreePO's nested-subgroup advantages) build on it.

Representation. The trees of one update (one tree per prompt, several prompts) lie in flat node arrays of
length Nn, nodes in any order, the nodes of different trees interleaved or not:

- `parent [Nn] long`: the index of the node's parent in the same arrays, -1 for a root (the prompt itself);
- `depth [Nn] long`: 0 at roots, depth(parent) + 1 elsewhere (= the number of segments after the prompt);
- `reward [Nn] float`: the verifier's reward of a leaf, read at leaves only (any value elsewhere).

Every non-root node is one segment, a continuation of its parent's prefix; the leaves are the non-root nodes
without children (`tree_leaves`), so no leaf flag is stored that could disagree with the structure. A node's
prompt is its root. Segment token spans are the sampler's business, not this module's.

TreePO reads a tree through its leaf paths: `ancestors [L, D + 1] long`, row i the path of leaf i (D the
deepest leaf's depth): column j holds the label of the prefix made of the prompt and leaf i's first j
segments (column 0 the root, column depth_i the leaf itself), -1 past the leaf. Two leaves share their first
j segments iff their column-j labels agree; labels need only be distinct among prefixes of equal length.
`leaf_ancestors` builds this from the node arrays (the labels are then node indices).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_tree", "float_values", "leaf_ancestors", "segment_mean", "tree_leaves"]


def tree_leaves(parent: Tensor) -> Tensor:
    """The leaves: non-root nodes without children.

    Args:
        parent: [Nn] long, -1 at roots.

    Returns:
        [Nn] bool.
    """
    return (parent >= 0) & ~_has_child(parent)


def _has_child(parent: Tensor) -> Tensor:
    """[Nn] bool: the nodes some node names as its parent."""
    has_child = torch.zeros(parent.shape, dtype=torch.bool, device=parent.device)
    has_child[parent[parent >= 0]] = True
    return has_child


def leaf_ancestors(parent: Tensor, depth: Tensor) -> tuple[Tensor, Tensor]:
    """The leaf paths of a batch of trees, TreePO's view of them.

    Args:
        parent: [Nn] long, -1 at roots. depth: [Nn] long.

    Returns:
        (leaves [L] long: the leaves' node indices in ascending order; ancestors [L, D + 1] long: row i the
        node indices on the path from leaf i's root (column 0) to the leaf (column depth_i), -1 after it).

    Raises:
        ValueError: an inconsistent tree (see `check_tree`).
    """
    check_tree(parent, depth)
    is_leaf = tree_leaves(parent)
    leaves = is_leaf.nonzero().squeeze(1)
    n_columns = int(depth[is_leaf].max()) + 1 if leaves.numel() else 1
    ancestors = torch.full((leaves.numel(), n_columns), -1, dtype=torch.long, device=parent.device)
    rows = torch.arange(leaves.numel(), device=parent.device)
    node = leaves
    for _ in range(n_columns):  # one step up the tree per pass: the loop runs over depth, not nodes
        present = node >= 0
        ancestors[rows[present], depth[node[present]]] = node[present]
        node = torch.where(present, parent[node.clamp_min(0)], -1)
    return leaves, ancestors


def check_tree(parent: Tensor, depth: Tensor) -> None:
    """1-D integer arrays of equal length, parents in range, consistent depths, no childless root.

    Depth consistency (root 0, child = parent + 1) rules out cycles: depth would have to grow around one.
    """
    if parent.dim() != 1 or depth.shape != parent.shape:
        raise ValueError(
            "parent and depth must be 1-D of equal length,"
            f" got {tuple(parent.shape)} and {tuple(depth.shape)}"
        )
    if parent.is_floating_point() or depth.is_floating_point():
        raise ValueError(f"parent and depth must be integer tensors, got {parent.dtype} and {depth.dtype}")
    n_nodes = parent.numel()
    bad = (parent < -1) | (parent >= n_nodes) | (parent == torch.arange(n_nodes, device=parent.device))
    if bad.any():
        node = int(bad.nonzero()[0])
        raise ValueError(
            f"parent[{node}] = {int(parent[node])}: must be -1 or another node's index in [0, {n_nodes})"
        )
    expected = torch.where(parent >= 0, depth[parent.clamp_min(0)] + 1, 0)
    bad = depth != expected
    if bad.any():
        node = int(bad.nonzero()[0])
        raise ValueError(
            f"depth[{node}] = {int(depth[node])}, expected {int(expected[node])} (roots have depth 0, every"
            " other node one more than its parent)"
        )
    bad = (parent < 0) & ~_has_child(parent)
    if bad.any():
        raise ValueError(f"parent: root {int(bad.nonzero()[0])} has no children (a tree needs a response)")


def float_values(values: Tensor) -> Tensor:
    """`values` as a floating tensor (its own dtype if floating, else the default dtype)."""
    return values if values.is_floating_point() else values.to(torch.get_default_dtype())


def segment_mean(values: Tensor, index: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Mean [size] of `values` over each index and the count [size] (long); mean 0 where the count is 0.

    Summing values shifted by the segment minimum keeps equal values exactly equal to their mean, so a
    segment of equal rewards gives differences of exactly 0, not rounding residues.
    """
    count = torch.bincount(index, minlength=size)
    lowest = values.new_full((size,), torch.inf).scatter_reduce(0, index, values, "amin")
    shift_sum = values.new_zeros(size).index_add(0, index, values - lowest[index])
    mean = lowest + shift_sum / count.clamp_min(1).to(values.dtype)
    return torch.where(count > 0, mean, 0), count
