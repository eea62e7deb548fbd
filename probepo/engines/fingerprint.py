"""A fingerprint of a policy's weights computed where they are (on the GPU, without a host copy), for the
replay check: optimize commits it for a policy kept only in memory, and a replay recomputes it.

A tensor's raw bytes, read as signed 16-bit words whatever the dtype, are cut into rows of ROW words;
word i of row c counts w · M_i · r_c mod p, where M is a fixed table of pseudo-random multipliers in
[1, p − 1] and r_c = (a · (c + s) + b) mod p a row multiplier, never 0, with s, a, b drawn from the
tensor's name; the tensor's sum is taken for two primes p < 2^31, every product and partial sum within
int64. A single flipped bit changes one word by d with 0 < |d| < 2^16 < p, so it changes that sum by
d · M_i · r_c ≢ 0 mod p: always detected; an arbitrary change goes unseen with probability about 2^-62.
Sums over tensors are order-independent, so each rank of a job hashes a share of the tensors and one
integer all-reduce combines them (`probepo.run.distributed.sum_over_ranks`). Names, dtypes and shapes go into
a sha256 beside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache

import torch
from torch import Tensor

from probepo import spend
from probepo.run import distributed

PRIMES = (2_147_483_629, 2_147_483_587)
"""The two moduli: primes just below 2^31."""
ROW = 1 << 16
"""Words per row: a row's Σ w · M_i stays within int64 (2^16 words × 2^15 × 2^31)."""
BLOCK_ROWS = 128
"""Rows widened to int64 at a time (64 MB of temporaries)."""


@cache
def _multipliers(device: torch.device) -> Tensor:
    """[len(PRIMES), ROW] int64: M for each prime, in [1, p − 1], the same on every machine."""
    generator = torch.Generator().manual_seed(20261204)
    tables = [torch.randint(1, prime, (ROW,), generator=generator, dtype=torch.int64) for prime in PRIMES]
    return torch.stack(tables).to(device)


def _words(tensor: Tensor) -> Tensor:
    """The tensor's bytes as int16 words, flat (a view where the layout allows: nothing copied); an odd
    byte count is padded with a zero byte."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return flat.view(torch.int16)


def tensor_sums(name: str, tensor: Tensor) -> Tensor:
    """[len(PRIMES)] int64: the tensor's sum mod each prime, on the tensor's device."""
    words = _words(tensor)
    device = words.device
    tail = (-words.numel()) % ROW
    rows = torch.cat([words, words.new_zeros(tail)]) if tail else words
    rows = rows.view(-1, ROW)
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    # per prime: the row multiplier's shift s, slope a (never 0) and offset b, drawn from the name
    drawn = [(seed % p, 1 + (seed >> 20) % (p - 1), (seed >> 40) % p) for p in PRIMES]
    table = _multipliers(device)
    sums = torch.zeros(len(PRIMES), dtype=torch.int64, device=device)
    for start in range(0, rows.shape[0], BLOCK_ROWS):
        block = rows[start : start + BLOCK_ROWS].to(torch.int64)
        index = torch.arange(start, start + block.shape[0], dtype=torch.int64, device=device)
        for j, (prime, (shift, a, b)) in enumerate(zip(PRIMES, drawn, strict=True)):
            row_multiplier = ((index + shift) % prime * a + b) % prime
            row_multiplier = torch.where(row_multiplier == 0, 1, row_multiplier)
            row_sums = (block * table[j]).sum(dim=1) % prime
            sums[j] = (sums[j] + (row_sums * row_multiplier % prime).sum()) % prime
    return sums


def weights_fingerprint(named: Iterable[tuple[str, Tensor]]) -> str:
    """The fingerprint of a state dict's tensors (name, tensor): equal for bitwise equal weights, whatever
    the device or the number of ranks. Collective on the ranks of a job (each hashes every world-th
    tensor); `named` must list the same tensors on every rank."""
    tensors = sorted(named, key=lambda item: item[0])
    layout = hashlib.sha256()
    device = tensors[0][1].device if tensors else torch.device("cpu")
    total = torch.zeros(len(PRIMES), dtype=torch.int64, device=device)
    primes = torch.tensor(PRIMES, device=device)
    rank, world = distributed.rank(), distributed.world_size()
    for index, (name, tensor) in enumerate(tensors):
        layout.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        if index % world == rank:
            total = (total + tensor_sums(name, tensor).to(device)) % primes
    combined = distributed.sum_over_ranks(total.cpu())
    values = [int(v) % p for v, p in zip(combined.tolist(), PRIMES, strict=True)]
    return f"{values[0]:08x}{values[1]:08x}-{layout.hexdigest()[:16]}"


def weights_digest(weights: dict[str, Tensor]) -> str:
    """sha256 over the weights' names, dtypes, shapes and bytes (in name order): equal iff bitwise equal.
    The replay check of stores written before `weights_fingerprint` (their optimize summaries hold
    `policy_sha256`)."""
    digest = hashlib.sha256()
    with spend.timed("digest"):
        for name in sorted(weights):
            tensor = weights[name].detach().cpu().contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    spend.count("host_copy", spend.tensor_bytes(weights.values()))  # tobytes copies every weight
    return digest.hexdigest()
