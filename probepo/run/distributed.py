"""The ranks of a distributed stage, as stages and engines see them: one process group (gloo on CPU, NCCL
on GPUs) joined through the RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT a job exports, and the few
collectives they need. Every helper is a no-op (or the local value) in a single process without a group,
so the same stage code runs inline, in a one-task job and on every rank of a multi-task one.

The ranks of a job may span several nodes, which share nothing but the store: each node has its own
scratch folder (`node_scratch`), filled by its leader (local rank 0) while the node's other ranks wait.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from probepo.run.devices import gpu_index, local_rank

T = TypeVar("T")


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


NODE_ENV = "PROBEPO_NODE"
"""The name of the node a rank runs on, as the job exports it (SLURM's SLURMD_NODENAME); unset: this
host's name."""


def node_name() -> str:
    return os.environ.get(NODE_ENV) or socket.gethostname()


def is_node_leader() -> bool:
    """Whether this rank fills its node's scratch folder (local rank 0): one per node."""
    return local_rank() == 0


def node_scratch(name: str) -> Path:
    """This node's scratch folder for `name` (a job's), created: `<tmp>/<name>-<node>`. Keyed by the node
    so that nothing depends on one node seeing another's files, even where nodes share /tmp."""
    folder = Path(tempfile.gettempdir()) / f"{name}-{node_name()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def node_ranks() -> list[int]:
    """The ranks on this rank's node (collective)."""
    nodes = all_gather_json(node_name())
    return [r for r, node in enumerate(nodes) if node == node_name()]


TIMEOUT = timedelta(hours=1)
"""How long a collective waits for the other ranks: every rank runs the same stages, but one may reach a
barrier long after another (rank 0 records and commits; a slow shard of generation)."""


_claims_store: dist.Store | None = None
"""The key-value store the group rendezvoused through (rank 0 serves it): its atomic counters hand out
work (`claimed`)."""


def join(backend: str | None = None) -> None:
    """Join the job's process group from its rank environment (no-op if already joined). Without one (a
    single process outside any job), a group of one: DeepSpeed needs a group even on one rank. backend:
    gloo on CPU, nccl on GPUs by default (each rank on its own GPU: probepo.run.devices)."""
    global _claims_store
    if initialized():
        return
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if "WORLD_SIZE" not in os.environ:  # one process: an in-memory store, no port to collide on
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asks for it
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
        return
    if backend == "nccl":
        torch.cuda.set_device(gpu_index())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # what init_method="env://" does, keeping the store for the work counters
    _claims_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0, timeout=TIMEOUT
    )
    dist.init_process_group(backend, store=_claims_store, rank=rank, world_size=world, timeout=TIMEOUT)


_destroy_process_group = dist.destroy_process_group
"""torch's own, kept: `keep_group_from_libraries` replaces the module's."""


def leave() -> None:
    global _claims_store
    if initialized():
        _destroy_process_group()
    _claims_store = None


def keep_group_from_libraries() -> None:
    """From now on torch.distributed.destroy_process_group() without a group, as a library calls it (vLLM,
    when an engine stops or is collected), does nothing: the job's group stays, and `leave` alone ends it.
    With a group it still destroys that group. Idempotent."""

    def destroy_subgroups_only(group: dist.ProcessGroup | None = None) -> None:
        if group is not None:
            _destroy_process_group(group)

    dist.destroy_process_group = destroy_subgroups_only


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "gloo/transport")
"""What gloo's errors say when a rank of the group is gone (gloo raises plain RuntimeErrors)."""


def lost_a_rank(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed because another rank of the group is gone (its process
    killed, its node lost), not this rank's own error."""
    if world_size() == 1:
        return False
    if isinstance(exc, dist.DistError):  # NCCL's and the TCP store's
        return True
    return isinstance(exc, RuntimeError) and any(said in str(exc) for said in _PEER_GONE)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on any rank: the one decision all ranks take together (to stop at a safe point
    before a collective save; whether rank 0 found the stage committed)."""
    if world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], device=_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class AgreedStop:
    """A stop flag all ranks read together: true on every rank once it is true on any. Each call is a
    collective, so every rank must check it at the same safe points, as ranks running one stage do; `local`
    is the rank's own flag, for the points only some ranks reach (a rank's own chunks of generation)."""

    def __init__(self, local: Callable[[], bool]) -> None:
        self.local = local

    def __call__(self) -> bool:
        return any_rank(self.local())


def agreed(should_stop: Callable[[], bool]) -> Callable[[], bool]:
    """`should_stop` read by all ranks together (AgreedStop); itself on one rank."""
    if world_size() == 1:
        return should_stop
    return AgreedStop(should_stop)


def own_flag(should_stop: Callable[[], bool]) -> Callable[[], bool]:
    """This rank's own flag behind an agreed one (no collective), or the flag itself."""
    return should_stop.local if isinstance(should_stop, AgreedStop) else should_stop


def claimed(items: Sequence[T]) -> Iterator[T]:
    """The items this rank takes, each taken by exactly one rank of the group: every rank calls this with
    the same items, and each asks a counter the group shares for the next index once it is done with the
    last, so a rank whose items end sooner takes more. One rank: every item, in order."""
    if world_size() == 1:
        yield from items
        return
    if _claims_store is None:
        raise RuntimeError("claiming work needs the group joined through probepo.run.distributed.join")
    key = broadcast_json(f"probepo-claims/{uuid.uuid4().hex}")  # one counter per call
    while (index := _claims_store.add(key, 1) - 1) < len(items):
        yield items[index]


def broadcast_json(message: Any = None) -> Any:
    """Rank 0's JSON-able `message` on every rank (the others pass nothing): as UTF-8 bytes in a tensor,
    so nothing received is unpickled."""
    if world_size() == 1:
        return message
    data = json.dumps(message).encode() if rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=_device())
    dist.broadcast(size, src=0)
    buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=_device())
    if rank() == 0:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    return json.loads(bytes(buffer.cpu().tolist()).decode())


def all_gather_json(message: Any) -> list[Any]:
    """Every rank's JSON-able `message`, in rank order (collective); as UTF-8 bytes in tensors, so nothing
    received is unpickled."""
    if world_size() == 1:
        return [message]
    data = json.dumps(message).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=_device()) for _ in range(world_size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=_device()))
    longest = max(int(size.item()) for size in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=_device())
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers = [torch.zeros(longest, dtype=torch.uint8, device=_device()) for _ in range(world_size())]
    dist.all_gather(buffers, mine)
    return [
        json.loads(bytes(buffer[: int(size.item())].cpu().tolist()).decode())
        for buffer, size in zip(buffers, sizes, strict=True)
    ]


def sum_over_ranks(tensor: Tensor) -> Tensor:
    """The element-wise sum of `tensor` over ranks (a copy; the tensor itself on one rank)."""
    return _reduced(tensor, dist.ReduceOp.SUM)


def max_over_ranks(tensor: Tensor) -> Tensor:
    """The element-wise maximum of `tensor` over ranks (a copy; the tensor itself on one rank)."""
    return _reduced(tensor, dist.ReduceOp.MAX)


def _reduced(tensor: Tensor, op: dist.ReduceOp) -> Tensor:
    if world_size() == 1:
        return tensor
    result = tensor.detach().to(_device()).clone()
    dist.all_reduce(result, op=op)
    return result.to(tensor.device)


def _device() -> torch.device:
    """Where this group's collectives take tensors: NCCL only reduces CUDA tensors."""
    if initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
