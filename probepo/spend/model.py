"""What an update moves and how long that takes, from a recipe's shape alone: the model `probepo check` prints
before an allocation, and the one bench/overhead.py extrapolates its counted bytes to 7B with.

It also holds what a trainer keeps on each rank's device (`trainer_peaks`, DeepSpeed's allocations cited
at `_deepspeed_peaks`): the memory check's figures, and what decides vLLM's share of a GPU it shares with
the trainer (`generation_share`).

It follows the code path by path (stages/policy.py, committed.py and optimize.py, engines/build.py, the
trainers' `weights()` and `state()`): the bytes of each kind are what rank 0's spend counters
(probepo/spend/__init__.py) record for one update, and tests/pipeline/test_spend_model.py holds the model to
the
counters of a real run, so a change to what an update moves changes both. Seconds are bytes over stated
bandwidths (`Bandwidths`, each figure with its source), for state movement only: generation, grading,
scoring and the optimizer's own arithmetic are the update's work, not its overhead. Pure: nothing here
imports torch or a stage.

Each move either blocks the update (the update waits for it: the hand-off, the fingerprint, a save) or runs
beside the updates (`Move.beside`: under a resident driver a full checkpoint's upload and commit, which
probepo/stages/uploads.py runs while the next updates generate and train; rank 0's counters of it are the
`checkpoint` attempt record of update k + 1 marked `beside`). `Estimate` gives both, per update amortised
over a checkpoint period (`blocking_s`, `beside_s`). The model is of a run's steady state: its last
checkpoint, which optimize commits inside itself (blocking) however the run executes, is left out, as is
the wait of a checkpoint due while the one before still uploads (`Estimate.checkpoint_wait_s` gives it for
an update of a given length).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, TypeVar

from probepo.run.schedule import is_optimizer_state
from probepo.spend import ByteKind, Piece

if TYPE_CHECKING:
    from probepo.config import RunConfig

GB = 1e9
N = TypeVar("N", int, float)
DEEPSPEED_OPTIMIZER_BYTES = 12
"""Bytes of optimizer state per parameter under DeepSpeed ZeRO: a float32 master copy and AdamW's two
float32 moments (whatever the weights' dtype); torch's AdamW keeps two moments of the weights' dtype."""


@dataclass(frozen=True)
class Bandwidths:
    """The rates an update's bytes move at on one node of 8×H200, in GB/s: stated, with sources, except the
    fingerprint's, measured on a lent H200 (bench/overhead_gpu.py, which measures the device→host one too)."""

    scratch_write: float = 10.0
    """Node scratch (NVMe) writes, shared by the node's ranks. A DGX H200 has 8 × 3.84 TB U.2 NVMe data
    drives in RAID 0 (NVIDIA's DGX H200 datasheet), ~25 GB/s by the drives' sequential ratings; 10 GB/s
    assumes a file system on them under concurrent writers."""
    scratch_read: float = 20.0
    """Node scratch reads (a file just written is mostly in the page cache): half the drives' ~50 GB/s
    sequential read ratings."""
    s3: float = 2.5
    """The store, per node: 20 Gb/s. AWS's S3 guidance reaches 100 Gb/s per instance with many parallel
    requests; a site's S3 gateway rarely gives one node its whole NIC."""
    device_to_host: float = 25.0
    """A GPU's tensors copied into new pageable host memory (`.cpu()`: a file hand-off's `weights()`), per
    rank on its own PCIe Gen5 x16 link (64 GB/s each way by the specification; pageable copies reach about
    half). Measured on a lent H200
    in a Firecracker VM (bench/overhead_gpu.py): 1.26 GB/s, the time spent faulting in fresh pages; a bare
    node faults faster, by a factor not measured, so the stated figure stays and bench/overhead.py shows the
    measured one beside it."""
    device_to_pinned: float = 50.0
    """A GPU's tensors copied into a pinned host buffer kept across saves (probepo/streamed_save.py: how a
    save's files cross to the node's disk, a chunk at a time, the weights `save_pretrained` writes too), per
    rank: the same PCIe Gen5 x16 link, whose DMA from pinned memory reaches ~80 % of its 64 GB/s. Measured
    on a lent H200 (bench/overhead_gpu.py): 55 GB/s."""
    device_copy: float = 2000.0
    """A copy from one tensor to another on the same GPU (the trainer's weights into the generator's), in
    bytes copied: stated, not measured here. The H200's 4.8 TB/s of HBM3e (NVIDIA's datasheet) serves both
    the read and the write of each byte, and a copy kernel reaches ~85 % of it: ~2 TB/s copied. vLLM's own
    reload processing beside the copy (renaming, fusing q/k/v and gate/up by narrowed copies, post-load
    hooks) is not in this model: measured only on this CPU (bench/handoff.py: 10 × a memcpy, the CPU
    backend repacking its GEMM weights), never on a GPU."""
    device_hash: float = 32.3
    """The replay check's fingerprint (engines/fingerprint.py) over the weights where they are, per rank
    (each hashes a share): measured on a lent H200 (bench/overhead_gpu.py, DeepSeekMath-7B's 13.8 GB of
    bf16 tensors in 0.43 s), bound by its int64 arithmetic. On this CPU it runs at ~0.1-0.2 GB/s."""

    def described(self) -> str:
        return ", ".join(f"{f.name} {getattr(self, f.name):g} GB/s" for f in fields(self))


STATED = Bandwidths()


@dataclass(frozen=True)
class PolicySizes:
    """The bytes of one policy as a checkpoint holds it."""

    weights: int
    """One full copy of the weights (what generation reads; the trainer's `weights()`)."""
    optimizer: int
    """The optimizer state over all ranks (its shards summed)."""
    other: int = 0
    """Config, tokenizer and metadata files (small)."""
    tied: int = 0
    """Bytes a state dict lists twice (a tied LM head: the file stores it once, the trainer's `weights()`
    copies it under both names, and the generator takes both)."""

    @property
    def copied(self) -> int:
        """What one copy of the trainer's state dict holds."""
        return self.weights + self.tied

    @property
    def checkpoint(self) -> int:
        return self.weights + self.optimizer + self.other

    @classmethod
    def of(cls, parameters: int, *, dtype: str, trainer: str, tied_parameters: int = 0) -> PolicySizes:
        """A model of `parameters` parameters in `dtype` ("float32", "bfloat16") trained by `trainer`
        ("hf", "deepspeed"), `tied_parameters` of them a tied LM head's."""
        width = 2 if dtype in ("bfloat16", "float16") else 4
        per_parameter = DEEPSPEED_OPTIMIZER_BYTES if trainer == "deepspeed" else 2 * width
        return cls(parameters * width, parameters * per_parameter, tied=tied_parameters * width)

    @classmethod
    def of_files(
        cls, sizes: Mapping[str, int], tensor_bytes: Mapping[str, int], *, tied: int = 0
    ) -> PolicySizes:
        """A committed checkpoint's: its files' sizes by name, and the tensor bytes of its safetensors files
        (the file less its header: what a host copy of them holds)."""
        optimizer = sum(n for name, n in tensor_bytes.items() if is_optimizer_state(name))
        weights = sum(tensor_bytes.values()) - optimizer
        return cls(weights, optimizer, sum(sizes.values()) - weights - optimizer, tied)


@dataclass(frozen=True)
class UpdateShape:
    """What decides an update's movement: the policy's size, the ranks, the recipe and the executor."""

    sizes: PolicySizes
    ranks: int = 1
    """The trainer's ranks (DeepSpeed shards the optimizer state over them)."""
    ranks_per_node: int = 1
    checkpoint_every: int = 1
    resident: bool = True
    """Engines stay resident across stages and updates (inline, resident executors); else a job per stage
    (every update then a full checkpoint)."""
    handoff: Literal["file", "memory"] = "memory"
    """How a generator takes weights from a trainer (the engine's `handoff`: vLLM's is a file)."""
    accelerator: bool = True
    """The trainer's tensors live on GPUs: a save copies what it writes to host memory on the way (on a CPU
    it writes them as they are)."""
    generation_stages: int = 1
    """Stages per update that build a generation engine in a job of their own (sample; probe where the
    method probes): what a per-stage executor downloads the weights for."""

    @property
    def node_share(self) -> int:
        """The checkpoint bytes one node holds: the weights and its ranks' optimizer shards."""
        nodes_share = min(self.ranks_per_node, self.ranks) / self.ranks
        return self.sizes.weights + self.sizes.other + round(self.sizes.optimizer * nodes_share)

    @property
    def rank0_writes(self) -> int:
        """The tensor bytes rank 0 writes in a save: the weights (a tied head once), its optimizer shard."""
        return self.sizes.weights + self.sizes.optimizer // self.ranks


Rate = Literal[
    "scratch_write", "scratch_read", "s3", "device_to_host", "device_to_pinned", "device_copy", "device_hash"
]


@dataclass(frozen=True)
class Move:
    """Bytes of one kind, taken by one piece of rank 0's work at one rate (`per_node`: the node's ranks
    share that rate, so the node's bytes count, `nbytes` × ranks on the node)."""

    piece: Piece
    kind: ByteKind | None
    """The counter the bytes go to (None: time without a counter of its own, e.g. hashing)."""
    nbytes: int
    rate: Rate | None
    """None: no time of its own (a download's landing on the disk overlaps its transfer)."""
    per_node: bool = False
    beside: bool = False
    """It runs beside the next updates (a resident driver's checkpoint upload), not blocking this one."""

    def seconds(self, shape: UpdateShape, bandwidths: Bandwidths) -> float:
        if self.rate is None:
            return 0.0
        nbytes = self.nbytes * (min(shape.ranks_per_node, shape.ranks) if self.per_node else 1)
        return nbytes / (getattr(bandwidths, self.rate) * GB)


def update_moves(shape: UpdateShape, *, checkpoint: bool) -> list[Move]:
    """What rank 0 of one update moves: a plain update (policy k + 1 kept in memory, its digest committed) or
    one ending on a full checkpoint (every update under a per-stage executor). Under a resident driver a
    checkpoint update also commits the fingerprint (a resume replays policy k + 1 until its checkpoint's
    marker lands), and its checkpoint's upload and commit run beside the next updates (optimize.py,
    uploads.py); under a per-stage executor optimize commits the checkpoint inside itself and fingerprints
    nothing."""
    w, node = shape.sizes.copied, shape.node_share
    moves: list[Move] = []
    if shape.resident:
        # generation_engine: the resident trainer's weights, as it holds them, into the resident generator
        moves += _handoff(shape, w)
    else:
        weights_files = shape.sizes.weights + shape.sizes.other
        for _ in range(shape.generation_stages):  # fetch_policy(optimizer_state=False), read from the folder
            moves += [
                Move("download", "downloaded", weights_files, "s3"),
                Move("download", "scratch", weights_files, None),
                Move("handoff", "handoff_file", shape.sizes.weights, "scratch_read", per_node=True),
            ]
        # score reads policy k's weights alone (scoring_engine), optimize the node's share of the checkpoint
        for fetched in (weights_files, node):
            moves += [
                Move("download", "downloaded", fetched, "s3"),
                Move("download", "scratch", fetched, None),
                Move("load", None, fetched, "scratch_read"),
            ]
        # the checkpoint of policy k + 1, committed inside optimize (parts: a stop's only, stop_seconds)
        return [*moves, *_save(shape)]
    # optimize: the weights' fingerprint, each rank hashing its share where the weights are
    moves.append(Move("digest", None, w // shape.ranks, "device_hash"))
    return [*moves, *_save(shape, beside=True)] if checkpoint else moves


def _save(shape: UpdateShape, *, beside: bool = False) -> list[Move]:
    """A full save of the trainer: what rank 0 writes copied to host through the pinned staging buffer (its
    weights and its optimizer shard: probepo/streamed_save.py, `save_pretrained` routed through it), the
    node's share written to its disk and uploaded (`beside`: while the next updates run)."""
    return [
        Move("save", "host_copy", shape.rank0_writes if shape.accelerator else 0, "device_to_pinned"),
        Move("save", "scratch", shape.node_share, "scratch_write"),
        Move("commit", "uploaded", shape.node_share, "s3", beside=beside),
    ]


def stop_seconds(shape: UpdateShape, bandwidths: Bandwidths = STATED) -> float:
    """What a stop inside a checkpoint update's optimizer takes of the job's grace window: the trainer saved
    as a part and uploaded (a full checkpoint's bytes), blocking whatever the executor. The trainer's
    `signal_grace_s` must cover it, or the kill lands mid-save and the update reruns from the last committed
    state."""
    return sum(move.seconds(shape, bandwidths) for move in _save(shape))


def _handoff(shape: UpdateShape, nbytes: int) -> list[Move]:
    if shape.handoff == "memory":  # copied into the generator's own tensors where both live
        return [Move("handoff", "handoff_memory", nbytes, "device_copy")]
    # every rank copies the weights to host and writes its file to the node's disk, then its engine reads it
    return [
        Move("handoff", "host_copy", nbytes if shape.accelerator else 0, "device_to_host"),
        Move("handoff", "handoff_file", nbytes, "scratch_write", per_node=True),
        Move("handoff", None, nbytes, "scratch_read", per_node=True),
    ]


@dataclass
class UpdateEstimate:
    """One kind of update's bytes by counter and seconds by piece: `bytes` and `seconds` all of them, blocking
    or beside; `beside_bytes` and `beside_seconds` the part that runs beside the next updates."""

    bytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    beside_bytes: dict[str, int] = field(default_factory=dict)
    beside_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def blocking_bytes(self) -> dict[str, int]:
        """The bytes the update's own stages move (what its metrics count)."""
        return _less(self.bytes, self.beside_bytes)

    @property
    def blocking_seconds(self) -> dict[str, float]:
        """The seconds the update waits for, by piece."""
        return _less(self.seconds, self.beside_seconds)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def blocking_s(self) -> float:
        return sum(self.blocking_seconds.values())

    @property
    def beside_s(self) -> float:
        return sum(self.beside_seconds.values())

    def seconds_of(self, beside: bool | None = None) -> dict[str, float]:
        """Seconds by piece: all (None), blocking (False) or beside (True)."""
        return self.seconds if beside is None else self.beside_seconds if beside else self.blocking_seconds

    @classmethod
    def of(cls, shape: UpdateShape, moves: list[Move], bandwidths: Bandwidths) -> UpdateEstimate:
        estimate = cls()
        for move in moves:
            seconds = move.seconds(shape, bandwidths)
            kinds = [estimate.bytes, estimate.beside_bytes] if move.beside else [estimate.bytes]
            pieces = [estimate.seconds, estimate.beside_seconds] if move.beside else [estimate.seconds]
            if move.kind is not None:
                for counted in kinds:
                    counted[move.kind] = counted.get(move.kind, 0) + move.nbytes
            for timed in pieces:
                timed[move.piece] = timed.get(move.piece, 0.0) + seconds
        return estimate


def _less(whole: dict[str, N], part: dict[str, N]) -> dict[str, N]:
    """`whole` less `part`, key by key (a key `part` takes whole leaves)."""
    left = {key: value - part.get(key, 0) for key, value in whole.items()}
    return {key: value for key, value in left.items() if key not in part or value}


@dataclass
class Estimate:
    """A recipe's state movement per update: a plain update, a checkpoint update, and the mean over a
    checkpoint period (`checkpoint_every` − 1 plain updates and one checkpoint update), split into what
    the updates wait for (`blocking_s`) and what runs beside them (`beside_s`: a resident driver's
    checkpoint upload; `total_s` is both). The split assumes each upload lands before the next checkpoint
    is due (`checkpoint_wait_s` otherwise) and runs at its stated rate whatever the updates beside it do."""

    shape: UpdateShape
    plain: UpdateEstimate
    checkpoint: UpdateEstimate
    bandwidths: Bandwidths

    @property
    def every(self) -> int:
        return self.shape.checkpoint_every if self.shape.resident else 1

    def amortised_seconds(self, beside: bool | None = None) -> dict[str, float]:
        """Seconds per update by piece, the mean over a checkpoint period: all of them (None, the default),
        those the updates wait for (False) or those beside them (True)."""
        plain, full = self.plain.seconds_of(beside), self.checkpoint.seconds_of(beside)
        plain_share = (self.every - 1) / self.every
        return {
            piece: plain_share * plain.get(piece, 0.0) + full.get(piece, 0.0) / self.every
            for piece in sorted(set(plain) | set(full))
        }

    @property
    def total_s(self) -> float:
        """Every second of state movement per update, blocking or beside."""
        return sum(self.amortised_seconds().values())

    @property
    def blocking_s(self) -> float:
        """The seconds per update the updates wait for, amortised."""
        return sum(self.amortised_seconds(beside=False).values())

    @property
    def beside_s(self) -> float:
        """The seconds per update that run beside the updates, amortised."""
        return sum(self.amortised_seconds(beside=True).values())

    def checkpoint_wait_s(self, update_s: float) -> float:
        """The seconds per update, amortised, the updates would wait for a checkpoint still uploading when
        the next is due, where an update takes `update_s` in all: an upload starts after optimize k's save
        and must land before optimize k + `every`'s save hands on the next, `every` updates later (0 where
        nothing runs beside)."""
        return max(0.0, self.checkpoint.beside_s - self.every * update_s) / self.every

    def moved_bytes(self, update: UpdateEstimate) -> int:
        """Bytes to and from the store and the node's disk (what a checkpoint's size is compared with)."""
        return sum(
            update.bytes.get(kind, 0) for kind in ("uploaded", "downloaded", "scratch", "handoff_file")
        )


def estimate(shape: UpdateShape, bandwidths: Bandwidths = STATED) -> Estimate:
    plain = UpdateEstimate.of(shape, update_moves(shape, checkpoint=False), bandwidths)
    full = UpdateEstimate.of(shape, update_moves(shape, checkpoint=True), bandwidths)
    return Estimate(shape, plain, full, bandwidths)


FP32 = 4
"""Bytes of a float32: DeepSpeed's master weights and gradient partitions are float32 whatever the
model's dtype."""

TrainerUse = Literal["fresh", "weights", "training"]

Peaks = dict[str, dict[str, float]]
"""Bytes on a rank's device by part, at each moment the trainer peaks (named as a line prints it)."""


def trainer_peaks(config: RunConfig, parameters: int, ranks: int, use: TrainerUse, on_gpu: bool) -> Peaks:
    """The trainer's bytes on each rank's device (its GPU, `on_gpu`; else the host) at its peaks."""
    model = config.model
    sizes = PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer)
    weights = float(sizes.weights)
    # torch's AdamW takes the sqrt of its second moment into a temporary: one on CUDA (its foreach path,
    # torch/optim/adam.py 762), two on the CPU (its single-tensor path, adam.py 544: sqrt, then a division)
    temporaries = 1 if on_gpu else 2
    if model.trainer == "deepspeed":
        return _deepspeed_peaks(
            model.zero_stage, weights, parameters, sizes.optimizer, ranks, use, temporaries
        )
    peaks = {"as built": {"weights": weights}}
    if use == "training":  # torch's AdamW on one device, its moments in the weights' dtype (PolicySizes)
        peaks["at the first optimizer step"] = {
            "weights": weights,
            "gradients": weights,
            "AdamW moments": float(sizes.optimizer),
            "AdamW's step temporaries": weights * temporaries,
        }
    return peaks


def _deepspeed_peaks(
    zero_stage: int,
    weights: float,
    parameters: int,
    optimizer: int,
    ranks: int,
    use: TrainerUse,
    temporaries: int,
) -> Peaks:
    """DeepSpeed 0.19.8 (.venv/lib/python3.11/site-packages/deepspeed/runtime/), one rank of W, with torch's
    AdamW as its client optimizer (engines/deepspeed_engine.py):
    - engine.py 2093-2094: the module moves to the device whole (no zero.Init: the model is loaded on the
      host, engines/build.py).
    - ZeRO-2, zero/stage_1_and_2.py: 438-524 flattens the weights into one buffer (a second copy for a
      moment, on the device where it has room, else on the host: not counted); 569-577 clones this rank's
      partition as fp32 masters; 934-946 allocates an fp32 gradient partition at init, then frees it; 2192
      keeps a gradient partition in the weights' dtype from the first backward; 3118-3126 makes it fp32 for
      the step, where AdamW creates its two fp32 moments (torch/optim/adam.py 178-182) and takes its
      `temporaries` of the partition. A backward pass holds DeepSpeed's reduce bucket instead (5e8 elements
      of the weights' dtype, zero/config.py 113; stage_1_and_2.py 3266, released at 1061): 1 GB in bf16,
      less than the step's fp32 gradients and temporary at 7B on 8 ranks; not counted.
    - ZeRO-3, zero/stage3.py: each rank keeps 1/W of the weights once they are partitioned; 1081-1172 fp32
      masters; 791 a gradient partition in the accumulation dtype, the model's by default (engine.py
      1806-1807); 1306-1368 the fp32 gradient buffer of init, freed again; the step as ZeRO-2's.
    `optimizer` is the masters and moments of every rank (spend_model.DEEPSPEED_OPTIMIZER_BYTES a
    parameter). Measured here on the CPU (RSS of one rank building and stepping a 220 M-parameter Llama, by
    /proc/self/statm): the first step's rise over the built trainer was these parts within 1 % in bf16, and
    0-16 % below them in fp32 (the allocator reusing freed heap); the bf16 init rose ~0.7 × the weights
    above them: heap of the per-parameter tensors freed by the flattening, which the allocator keeps (no live
    tensor holds it)."""
    fp32_partition = parameters * FP32 / ranks
    held = {"weights": weights} if zero_stage == 2 else {"weight partition": weights / ranks}
    held["fp32 masters"] = fp32_partition
    peaks: Peaks = {}
    if zero_stage == 3:
        peaks["when moved to the device, before partitioning"] = {"weights": weights}
        held["gradient partition"] = weights / ranks
    peaks["at DeepSpeed's init"] = {**held, "fp32 gradient partition": fp32_partition}
    if use == "training":
        peaks["at the first optimizer step"] = {
            **held,
            "gradient partition": weights / ranks,
            "fp32 gradients": fp32_partition,
            "AdamW moments": optimizer / ranks - fp32_partition,
            "AdamW's step temporaries": fp32_partition * temporaries,
        }
    return peaks


GENERATION_MARGIN_GB = 6.0
"""GB of each GPU that neither the trainer's tensors nor vLLM's share may take: the process's CUDA context
with its cuBLAS and NCCL workspaces (~1-2 GB), the trainer's cached blocks that `torch.cuda.empty_cache`
cannot return (segments partly in use: fragmentation), and the error of vLLM's own profile of its
activations. A stated choice, ~4 % of an H200, not measured (no GPU here)."""

STEP_TRANSIENTS = ("fp32 gradients", "AdamW's step temporaries")
"""Parts of the trainer's step peak freed when the step is done (its activations are not counted at all)."""
OPTIMIZER_STATE = ("fp32 masters", "AdamW moments")
"""Parts of the trainer's state an optimizer offload moves to host memory between its phases."""


def trainer_resident(
    config: RunConfig, parameters: int, ranks: int, *, offload_optimizer: bool = False
) -> Peaks:
    """What a training trainer of `ranks` ranks keeps on each rank's GPU while vLLM generates beside it, at
    its two moments: its build (DeepSpeed's init peak: the generator may be built before the trainer or
    after it, and torch's allocator keeps what the init freed) and between optimizer steps (the weights or
    their partition, the optimizer shard and the gradient partition; the step's own buffers freed).
    `offload_optimizer`: the optimizer shard moved to host memory between phases (its init peak kept)."""
    peaks = trainer_peaks(config, parameters, ranks, "training", on_gpu=True)
    step = peaks.pop("at the first optimizer step")
    dropped = STEP_TRANSIENTS + (OPTIMIZER_STATE if offload_optimizer else ())
    return {**peaks, "between optimizer steps": {n: v for n, v in step.items() if n not in dropped}}


def generation_share(
    config: RunConfig,
    parameters: int,
    gpu_memory_gb: float,
    ranks: int,
    *,
    offload_optimizer: bool = False,
) -> float:
    """The share of each rank's GPU (of `gpu_memory_gb`) vLLM may take, weights and KV cache (its
    `gpu_memory_utilization`), beside a trainer of `ranks` ranks (0: none, a generation-only job) training a
    model of `parameters` parameters as `config.model` says: what the trainer's highest resident moment
    (`trainer_resident`) and GENERATION_MARGIN_GB leave of the GPU, floored to a hundredth; 0 where they
    leave nothing. vLLM sleeps while the trainer works (its weights and KV cache released), so the
    trainer's step peak and activations are not counted; vLLM sizes its KV cache once, when it is built.
    Pure: `model.vllm_memory` (an explicit override) is `vllm_share`'s. E.g. DeepSeekMath-7B (6.9 B) under
    ZeRO-2 on 8 H200s of 141 GB: between steps 13.8 + 3.45 + 1.725 + 6.9 = 25.9 GB, 31.9 GB with the margin:
    0.77 of the GPU."""
    resident = 0.0
    if ranks:
        peaks = trainer_resident(config, parameters, ranks, offload_optimizer=offload_optimizer)
        resident = max(sum(parts.values()) for parts in peaks.values()) / GB
    free = 1 - (resident + GENERATION_MARGIN_GB) / gpu_memory_gb
    return max(0.0, math.floor(free * 100) / 100)


def vllm_share(config: RunConfig, parameters: int, gpu_memory_gb: float, ranks: int) -> float:
    """vLLM's share of each rank's GPU: `model.vllm_memory` where the recipe sets it, else
    `generation_share`."""
    if config.model.vllm_memory is not None:
        return config.model.vllm_memory
    return generation_share(config, parameters, gpu_memory_gb, ranks)
