"""Random ragged batches for property tests: interleaved groups of random sizes and non-contiguous ids,
random lengths (right padded), random valid pivots in random slots (unsorted, -1 anywhere)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor


@dataclass
class Batch:
    group: Tensor  # [N] long
    rewards: Tensor  # [N] float64
    mask: Tensor  # [N, T] bool
    pivot_pos: Tensor  # [N, M] long, -1 = none
    pivot_val: Tensor  # [N, M] float64

    @property
    def lengths(self) -> list[int]:
        return self.mask.sum(1).tolist()

    def pivots(self, row: int) -> list[tuple[int, float]]:
        """(position, value) of the row's pivots, in slot order."""
        return [
            (int(t), float(v))
            for t, v in zip(self.pivot_pos[row], self.pivot_val[row], strict=True)
            if t >= 0
        ]


def random_batch(seed: int, *, n_groups: int, max_group_size: int, max_len: int, slots: int) -> Batch:
    rng = random.Random(seed)
    sizes = [rng.randint(1, max_group_size) for _ in range(n_groups)]
    ids = rng.sample(range(1000), n_groups)
    group = [gid for gid, size in zip(ids, sizes, strict=True) for _ in range(size)]
    rng.shuffle(group)
    binary = rng.random() < 0.5
    rewards = [float(rng.random() < 0.5) if binary else rng.random() for _ in group]
    lengths = [rng.randint(1, max_len) for _ in group]
    n_positions = max(lengths) + rng.randint(0, 3)

    pivot_pos = torch.full((len(group), slots), -1, dtype=torch.long)
    pivot_val = torch.tensor([[rng.random() for _ in range(slots)] for _ in group], dtype=torch.float64)
    for row, length in enumerate(lengths):
        n_pivots = rng.randint(0, min(slots, length - 1))
        positions = rng.sample(range(1, length), n_pivots)
        for slot, t in zip(rng.sample(range(slots), n_pivots), positions, strict=True):
            pivot_pos[row, slot] = t
    return Batch(
        group=torch.tensor(group),
        rewards=torch.tensor(rewards, dtype=torch.float64),
        mask=torch.arange(n_positions) < torch.tensor(lengths)[:, None],
        pivot_pos=pivot_pos,
        pivot_val=pivot_val,
    )


@st.composite
def batches(draw: st.DrawFn, *, max_len: int = 24, slots: int = 4) -> Batch:
    return random_batch(
        draw(st.integers(0, 2**32 - 1)),
        n_groups=draw(st.integers(1, 4)),
        max_group_size=draw(st.integers(1, 5)),
        max_len=draw(st.integers(1, max_len)),
        slots=draw(st.integers(0, slots)),
    )
