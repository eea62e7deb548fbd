"""What a stage attempt spends: the bytes it moves, by where they go, and the seconds of each piece of work.

A process runs one stage attempt at a time (a job's ranks are processes of their own), so the attempt's
counters are this process's current `Spend`: `execute_stage` opens one for each attempt (`attempt_spend`)
and writes it into the attempt record; the code that moves bytes or does a piece of work adds to it
through `count` and `timed`, which cost a clock read or an addition and do nothing outside an attempt.
Work that runs beside the attempts (a checkpoint uploading while the next updates train,
probepo/stages/uploads.py) counts into counters of its own on its threads (`counting_into`).
The driver sums a stage's attempts into the update's metrics as `timing/<stage>/<piece>` and
`bytes/<stage>/<kind>` (the way verl logs `timing_s/*`); `probepo report` breaks an update down by them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

ByteKind = Literal["scratch", "uploaded", "downloaded", "host_copy", "handoff_file", "handoff_memory"]
BYTE_KINDS: tuple[ByteKind, ...] = (
    "scratch",
    "uploaded",
    "downloaded",
    "host_copy",
    "handoff_file",
    "handoff_memory",
)
"""scratch: written to the node's scratch folder (saves, downloads landing there); uploaded / downloaded: to
and from the store; host_copy: copied from an accelerator (or a live parameter) to host memory, into a new
host tensor or through a save's pinned staging buffer (probepo/streamed_save.py);
handoff_file / handoff_memory: weights handed to a generation engine through a file or in memory."""

Piece = Literal[
    "generation",
    "grading",
    "scoring",
    "optimizer",
    "handoff",
    "digest",
    "save",
    "commit",
    "download",
    "load",
    "store_wait",
    "checkpoint_wait",
]
PIECES: tuple[Piece, ...] = get_args(Piece)
"""generation: engine calls that decode; grading: rewards of answers; scoring: log-probabilities and
entropies; optimizer: forward, backward and steps; handoff: weights into a generation engine; digest:
the replay check's hash of the weights; save: a trainer's state written to scratch; commit: uploads and
markers; download: files fetched from the store; load: engines built and weights read into them;
store_wait: an unreachable store waited for (probepo/store/outage.py), counted once however many of the
attempt's threads waited at the same time; checkpoint_wait: an update blocked on a checkpoint uploading
beside it (a second one due while one is in flight, or the run's end)."""

METRIC_GROUPS = ("timing", "bytes")
"""The metric keys' first part for spend (`timing/<stage>/<piece>`, `bytes/<stage>/<kind>`): not a stage."""


@dataclass
class Spend:
    """One attempt's counters. Additions from several threads (parallel uploads) are safe."""

    bytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    scratch_peak_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _nested: list[float] = field(default_factory=list, repr=False, compare=False)
    """Seconds of the timed blocks inside each open one (timed() runs on the attempt's thread)."""

    def add_bytes(self, kind: ByteKind, count: int) -> None:
        with self._lock:
            self.bytes[kind] = self.bytes.get(kind, 0) + int(count)

    def add_seconds(self, piece: Piece, seconds: float) -> None:
        with self._lock:
            self.seconds[piece] = self.seconds.get(piece, 0.0) + seconds

    def note_scratch(self, in_use: int) -> None:
        """The node scratch's bytes in use at a moment that may be a peak (after a save, a download)."""
        with self._lock:
            self.scratch_peak_bytes = max(self.scratch_peak_bytes, int(in_use))

    def as_record(self) -> dict[str, Any]:
        """The attempt record's `spend`: {"bytes": {kind: n}, "seconds": {piece: s}, "scratch_peak_bytes"}."""
        with self._lock:
            return {
                "bytes": {kind: self.bytes[kind] for kind in BYTE_KINDS if kind in self.bytes},
                "seconds": {p: round(self.seconds[p], 4) for p in PIECES if p in self.seconds},
                "scratch_peak_bytes": self.scratch_peak_bytes,
            }


_current: Spend | None = None
_beside = threading.local()
"""A thread's own counters (`counting_into`), which take the place of the attempt's on that thread."""


def current() -> Spend | None:
    """The counters this thread adds to: its own where it has some, else the running attempt's."""
    return getattr(_beside, "spend", None) or _current


@contextmanager
def attempt_spend() -> Iterator[Spend]:
    """This process's counters for the attempt run inside the block (the previous ones come back after)."""
    global _current
    previous, _current = _current, Spend()
    try:
        yield _current
    finally:
        _current = previous


@contextmanager
def counting_into(counters: Spend | None) -> Iterator[None]:
    """This thread counts into `counters` inside the block (None: the running attempt's), whatever attempt
    the process runs meanwhile: work beside the attempts, and the worker threads it starts."""
    previous = getattr(_beside, "spend", None)
    _beside.spend = counters
    try:
        yield
    finally:
        _beside.spend = previous


def count(kind: ByteKind, nbytes: int) -> None:
    """Add bytes to the running attempt's counters (nothing outside an attempt)."""
    if (spend := current()) is not None:
        spend.add_bytes(kind, nbytes)


def note_scratch(in_use: int) -> None:
    if (spend := current()) is not None:
        spend.note_scratch(in_use)


@contextmanager
def timed(piece: Piece) -> Iterator[None]:
    """Add the block's wall time to the running attempt's `piece` (nothing outside an attempt). A block
    timed inside another counts as its own piece only (the outer one keeps its self time: an optimizer
    that saves and commits parts between mini-batches is not charged for them), so pieces add up."""
    spend = current()
    if spend is None:
        yield
        return
    start = time.perf_counter()
    spend._nested.append(0.0)
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        inner = spend._nested.pop()
        spend.add_seconds(piece, elapsed - inner)
        if spend._nested:
            spend._nested[-1] += elapsed


def count_waited(piece: Piece, seconds: float) -> None:
    """Add seconds the attempt spent blocked, measured by the caller over all its threads (the store's
    outage wait), to `piece` and take them from the timed block open around them: pieces still add up."""
    spend = current()
    if spend is None:
        return
    spend.add_seconds(piece, seconds)
    with spend._lock:
        if spend._nested:
            spend._nested[-1] += seconds


def count_written(tensors: Iterable[Any]) -> None:
    """A save's tensors, written as they are: those on an accelerator are copied to host memory on the way
    (`host_copy`: through the writer's pinned staging buffer, a piece at a time, or for the weights
    `save_pretrained` writes, a pageable copy of each shard); host tensors are written without a copy."""
    count("host_copy", tensor_bytes(t for t in tensors if t.device.type != "cpu"))


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of a collection of tensors (anything with numel and element_size)."""
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def summed(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The `spend` of several attempt records added up (a stage's attempts: a preempted attempt's bytes
    are part of what its update cost); records without one count nothing."""
    total: dict[str, Any] = {"bytes": {}, "seconds": {}, "scratch_peak_bytes": 0}
    for record in records:
        spend = record.get("spend") or {}
        for kind, value in (spend.get("bytes") or {}).items():
            total["bytes"][kind] = total["bytes"].get(kind, 0) + int(value)
        for piece, value in (spend.get("seconds") or {}).items():
            total["seconds"][piece] = round(total["seconds"].get(piece, 0.0) + float(value), 4)
        peak = int(spend.get("scratch_peak_bytes", 0))
        total["scratch_peak_bytes"] = max(total["scratch_peak_bytes"], peak)
    return total


def spend_metrics(stage: str, spend: Mapping[str, Any]) -> dict[str, float | int]:
    """A stage's summed spend as metric keys: `timing/<stage>/<piece>` seconds, `bytes/<stage>/<kind>`
    and `bytes/<stage>/scratch_peak`."""
    metrics: dict[str, float | int] = {}
    for piece, seconds in (spend.get("seconds") or {}).items():
        metrics[f"timing/{stage}/{piece}"] = seconds
    for kind, nbytes in (spend.get("bytes") or {}).items():
        metrics[f"bytes/{stage}/{kind}"] = nbytes
    if spend.get("scratch_peak_bytes"):
        metrics[f"bytes/{stage}/scratch_peak"] = spend["scratch_peak_bytes"]
    return metrics


def is_spend_metric(key: str) -> bool:
    return key.split("/", 1)[0] in METRIC_GROUPS
