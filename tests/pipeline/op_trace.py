"""Which operation first rounds differently? Traces every ATen operation of the golden run, in order, with a
hash of its inputs and outputs, so two machines or two settings can be compared by a diff instead of a guess.

    python -m tests.pipeline.op_trace record ALGORITHM STORE TRACE   # run golden_run's training, traced
    python -m tests.pipeline.op_trace diff TRACE_A TRACE_B            # the first op whose outputs differ

Run `record` under the environment being compared (e.g. PORTABLE_NUMERICS, or ATEN_CPU_CAPABILITY=avx2);
`diff` names the first operation whose inputs hashed the same in both traces and whose outputs did not:
that kernel is the one that rounds differently. A trace line is `index op inputs-hash outputs-hash shapes`.
Used for issue 41 (docs/PIPELINE.md, "Bits across machines")."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _tensor_bytes(value: torch.Tensor) -> bytes:
    flat = value.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8).numpy().tobytes() + str(tuple(value.shape)).encode()


def _digest(values: Any) -> tuple[str, str]:
    """(hash of every tensor leaf's bytes and shape, and of every other leaf's repr; the shapes)."""
    digest = hashlib.blake2b(digest_size=8)
    shapes = []
    for leaf in tree_leaves(values):
        if isinstance(leaf, torch.Tensor):
            if leaf.is_sparse or leaf.device.type != "cpu" or leaf.dtype.is_complex:
                digest.update(repr((leaf.dtype, tuple(leaf.shape))).encode())
            else:
                digest.update(_tensor_bytes(leaf))
            shapes.append("x".join(map(str, leaf.shape)) or "()")
        elif isinstance(leaf, int | float | bool | str | torch.dtype | torch.device) or leaf is None:
            digest.update(repr(leaf).encode())
        else:  # an opaque handle (a profiler record, a generator): its repr holds an address
            digest.update(type(leaf).__name__.encode())
    return digest.hexdigest(), ",".join(shapes)


UNINITIALISED = ("empty", "new_empty")
"""Ops whose output holds whatever the memory held: traced as zeros (a kernel reading them is a bug)."""


class OpTrace(TorchDispatchMode):
    """Writes a line per ATen operation: its index, name, inputs' and outputs' hashes and output shapes."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self.out = out
        self.index = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs, _ = _digest((args, kwargs))
        result = func(*args, **kwargs)
        if func.__name__.startswith(UNINITIALISED):  # garbage bytes would make every trace differ
            result.zero_()
        outputs, shapes = _digest(result)
        self.out.write(f"{self.index} {func} {inputs} {outputs} {shapes}\n")
        self.index += 1
        return result


def record(algorithm: str, store_url: str, trace: Path) -> None:
    """golden_run's training of ALGORITHM into STORE, every op traced into TRACE (the ops the portable
    kernels run, not the ones they replace); prints the digests."""
    from tests.pipeline.golden_run import final_digests

    with trace.open("w") as out, OpTrace(out):
        digests = final_digests(algorithm, store_url)
    print("\n".join(digests))


def _lines(trace: Path) -> Iterator[list[str]]:
    with trace.open() as lines:
        for line in lines:
            yield line.split()


def first_difference(a: Path, b: Path) -> str:
    """The first op whose outputs differ, and whether its inputs were equal (then it is the culprit)."""
    for left, right in zip(_lines(a), _lines(b), strict=False):
        if left[1] != right[1]:
            return f"the op sequences part at op {left[0]}: {left[1]} vs {right[1]}"
        if left[3] != right[3]:
            same_inputs = "with equal inputs" if left[2] == right[2] else "with inputs already different"
            shapes = left[4] if len(left) > 4 else ""
            return f"op {left[0]} {left[1]} ({shapes}) rounds differently {same_inputs}"
    return "no difference in the ops both traces hold"


def main(argv: list[str]) -> None:
    if argv[:1] == ["record"] and len(argv) == 4:
        record(argv[1], argv[2], Path(argv[3]))
    elif argv[:1] == ["diff"] and len(argv) == 3:
        print(first_difference(Path(argv[1]), Path(argv[2])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
