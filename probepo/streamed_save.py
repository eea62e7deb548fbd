"""A safetensors writer that streams: the file `safetensors.torch.save_file` writes, byte for byte, without
a second copy of the tensors in host memory.

Why: `save_file` puts every tensor in host memory before it writes the first byte (`_to_ndarray` copies a
device tensor with `.to("cpu")` into fresh pageable memory and `_flatten_as_ptr` keeps all of them alive
until the Rust writer returns), so a save holds a host copy of the rank's state; and a device→host copy
into fresh pageable memory ran at 1.26 GB/s on an H200 against 55 GB/s pinned
(bench/results/overhead_gpu.json). Here host tensors are written straight from their own memory, and
device tensors pass, chunk by chunk, through one pinned `HostStagingBuffer` kept across saves.

The format, from huggingface/safetensors at commit 24b0b28 (the 0.8.0 wheel installed here; its
py_src/safetensors/torch.py is that commit's file):
- safetensors/src/tensor.rs 218-265 `prepare`: the tensors sorted by `Dtype` descending, then by name
  (Rust `str` order: UTF-8 bytes, i.e. code points); their data back to back in that order; the header
  JSON (serde_json, compact) padded with b" " to a multiple of 8 bytes, whose length N comes first as a
  little-endian u64. `Dtype`'s order is its declaration order (811-862, `_DTYPES` below), whose variant
  names are the header's dtype names; the torch names map to them in bindings/python/src/lib.rs 146-176.
- tensor.rs 574-597 `Metadata::serialize`: `__metadata__` first when given (even empty), then each tensor
  as {"dtype", "shape", "data_offsets"} (`TensorInfo`'s field order, 799-806) in the sorted order.
  Where this writer differs: several metadata keys come out in a Rust HashMap's order, which changes from
  one process to the next, here in the dict's order (one of those), so files compare only with at most one
  key; and no tensors with an empty metadata dict make save_file write `{},"__metadata__":{}}`, which no
  reader parses (584-585 declare a map of 0 entries, so serde_json closes it at once), here
  `{"__metadata__":{}}`.
- tensor.rs 302-342 `buffered_write_to_file`: N, header, each tensor's bytes, written to a sibling temp
  file renamed over the target (created mode 0600, and a file `load_file` mapped is never truncated under
  it); a header over 100,000,000 bytes is refused (10, 368).
- py_src/safetensors/torch.py 527-600: a dict of dense tensors, no two sharing memory (its own
  `_find_shared_tensors`, reused), each contiguous (a non-contiguous tensor is refused, not copied), and
  0-element tensors written as no bytes.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import _find_shared_tensors
from torch import Tensor

STAGING_CAPACITY = 256 << 20
"""Bytes a `HostStagingBuffer` grows to at most: a device tensor larger than it crosses in several chunks."""
MAX_HEADER_SIZE = 100_000_000

_DTYPES = [  # (torch name, safetensors name) in `Dtype`'s order: tensors sort by its index, descending
    ("bool", "BOOL"), ("uint8", "U8"), ("int8", "I8"), ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fn", "F8_E4M3"), ("float8_e8m0fnu", "F8_E8M0"), ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ"), ("int16", "I16"), ("uint16", "U16"), ("float16", "F16"),
    ("bfloat16", "BF16"), ("int32", "I32"), ("uint32", "U32"), ("float32", "F32"), ("complex64", "C64"),
    ("float64", "F64"), ("int64", "I64"), ("uint64", "U64"),
]  # fmt: skip
_CODE = {getattr(torch, t): (rank, code) for rank, (t, code) in enumerate(_DTYPES) if hasattr(torch, t)}
_json = partial(json.dumps, ensure_ascii=False, separators=(",", ":"))  # serde_json's compact output


class HostStagingBuffer:
    """The one host buffer device tensors cross to a file through: pinned where CUDA is present (the copy
    runs at DMA rate, and the driver needs no bounce buffer of its own), allocated at the first device
    tensor, grown to the largest tensor seen but never beyond `capacity`, and kept across saves, so host
    memory holds this buffer, never a second copy of the state. `pin=None`: pinned iff CUDA is available."""

    def __init__(self, capacity: int = STAGING_CAPACITY, pin: bool | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a staging buffer needs at least one byte, not {capacity}")
        self.capacity = capacity
        self.pin = pin
        self.lock = threading.Lock()  # one save at a time uses it
        self._buffer: Tensor | None = None

    def take(self, nbytes: int) -> Tensor:
        """The buffer, at least min(nbytes, capacity) bytes long (reallocated if shorter)."""
        want = min(max(nbytes, 1), self.capacity)
        if self._buffer is None or self._buffer.numel() < want:
            self._buffer = None  # the old one is freed before the larger one is pinned
            pin = torch.cuda.is_available() if self.pin is None else self.pin
            self._buffer = torch.empty(want, dtype=torch.uint8, pin_memory=pin)
        return self._buffer

    def write(self, file: BinaryIO, data: Tensor) -> None:
        """Writes the bytes of `data` (uint8, 1-D, contiguous) to `file` through the buffer, a chunk at a
        time: an asynchronous copy into the pinned buffer, waited for, then written. One buffer, not two
        halves whose copies overlap the writes: a pinned copy runs at tens of GB/s, a file write at a few,
        so the overlap would save a tenth of the time at the price of events and ordering to get right."""
        buffer = self.take(data.numel())
        host = buffer.numpy()
        cuda = data.device.type == "cuda"
        asynchronous = cuda and buffer.is_pinned()
        for start in range(0, data.numel(), buffer.numel()):
            n = min(buffer.numel(), data.numel() - start)
            buffer[:n].copy_(data[start : start + n], non_blocking=asynchronous)
            if asynchronous:
                torch.cuda.current_stream(data.device).synchronize()
            file.write(host[:n])


STAGING = HostStagingBuffer()
"""The process's staging buffer, which every save uses unless given another."""


def _staged(tensor: Tensor) -> bool:
    """Whether a tensor crosses through the staging buffer (those not in host memory; tests force it)."""
    return tensor.device.type != "cpu"


def save_streamed(
    tensors: Mapping[str, Tensor],
    filename: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    *,
    staging: HostStagingBuffer | None = None,
) -> None:
    """Writes `tensors` to `filename` as `safetensors.torch.save_file(tensors, filename, metadata)` does,
    the same bytes (module docstring), one tensor at a time: host tensors from their own memory, the others
    through `staging` (default `STAGING`). Refuses what save_file refuses, before any file is created."""
    for name, tensor in tensors.items():
        if not isinstance(tensor, Tensor) or tensor.layout != torch.strided:
            raise ValueError(f"`{name}`: expected a dense torch.Tensor, got {type(tensor)}")
        if not tensor.is_contiguous():
            raise ValueError(f"`{name}` is not contiguous: call .contiguous() on it before saving")
        if tensor.dtype not in _CODE:
            raise ValueError(f"`{name}`: safetensors has no dtype {tensor.dtype} this writer knows")
    shared = [names for names in _find_shared_tensors(dict(tensors)) if len(names) > 1]
    if shared:
        raise RuntimeError(f"some tensors share memory, which safetensors refuses: {shared}")
    if metadata is not None and not all(isinstance(x, str) for item in metadata.items() for x in item):
        raise TypeError("safetensors metadata maps str to str")
    ordered = sorted(tensors.items(), key=lambda item: (-_CODE[item[1].dtype][0], item[0]))
    header = _header(ordered, metadata)
    if len(header) > MAX_HEADER_SIZE:
        raise ValueError(f"a safetensors header of {len(header)} bytes exceeds {MAX_HEADER_SIZE}")
    path = Path(filename)
    staging = STAGING if staging is None else staging
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file, staging.lock:
            file.write(struct.pack("<Q", len(header)) + header)
            for _, tensor in ordered:
                if tensor.numel():
                    data = tensor.detach().reshape(-1).view(torch.uint8)
                    if _staged(tensor):
                        staging.write(file, data)
                    else:
                        file.write(data.numpy())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _header(ordered: list[tuple[str, Tensor]], metadata: Mapping[str, str] | None) -> bytes:
    """The header `prepare` builds for tensors in their sorted order: compact JSON, padded with spaces
    to a multiple of 8 bytes."""
    pieces = [] if metadata is None else [f'"__metadata__":{_json(dict(metadata))}']
    offset = 0
    for name, tensor in ordered:
        end = offset + tensor.numel() * tensor.element_size()
        info = {"dtype": _CODE[tensor.dtype][1], "shape": list(tensor.shape), "data_offsets": [offset, end]}
        pieces.append(f"{_json(name)}:{_json(info)}")
        offset = end
    header = ("{" + ",".join(pieces) + "}").encode()
    return header + b" " * (-len(header) % 8)


@contextmanager
def streamed_pretrained_saves() -> Iterator[None]:
    """Route Hugging Face's `save_pretrained` through `save_streamed` for the block. transformers writes each
    weight shard with safetensors' `save_file`, imported as `transformers.modeling_utils.safe_save_file`
    (5.x: modeling_utils.py 40; called about line 3628 with the shard's tensors still where they live), and
    offers no hook for the writer: for the block that name is this module's writer, so the weights too
    cross to host through the staging buffer. Same bytes: its one metadata key is {"format": "pt"}. The
    name is global to the process: a save is the only thing that writes weight files at that moment."""
    import transformers.modeling_utils as modeling

    with _PRETRAINED_LOCK:
        original = modeling.safe_save_file
        modeling.safe_save_file = save_streamed
        try:
            yield
        finally:
            modeling.safe_save_file = original


_PRETRAINED_LOCK = threading.Lock()
