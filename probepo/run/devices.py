"""Which GPU each rank of a job uses.

A job shows its tasks GPUs in one of two ways, and a rank finds its own either way:
- every GPU of the node to every task (`--gpus-per-node`: the resident job and the trainer stages, where
  DeepSpeed and NCCL's NVLink paths want them all): rank `LOCAL_RANK` takes visible GPU `LOCAL_RANK`;
- one GPU per task (`--gpus-per-task=1`: generation-only stage jobs may ask for that): visible GPU 0.
The generation engines (torch, Hugging Face, vLLM) and the trainer's process group use this device, and
every shard of generation records the GPU that made it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from probepo.errors import ExecutionError


class TooFewGPUs(ExecutionError):
    """A rank's local index is past the GPUs its job shows it."""

    user_error = True


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as the scheduler names them (CUDA_VISIBLE_DEVICES, which SLURM sets
    from the job's gres), else those torch sees; none on a CPU machine."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu for gpu in listed.split(",") if gpu.strip()]
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def gpu_index() -> int:
    """The index, among the visible GPUs, of this rank's: its local rank when it sees several, else 0."""
    visible, rank = visible_gpus(), local_rank()
    if len(visible) <= 1:
        return 0
    if rank >= len(visible):
        raise TooFewGPUs(
            f"local rank {rank} sees {len(visible)} GPUs ({','.join(visible)}): give the job one task per GPU"
            " (tasks_per_node no more than gpus_per_node), or one GPU per task (gpus_per_task: 1)"
        )
    return rank


def assigned_gpu() -> str | None:
    """This rank's GPU as the scheduler names it (e.g. "3"), or None without GPUs."""
    visible = visible_gpus()
    return visible[gpu_index()] if visible else None


def torch_device() -> str:
    """Where this rank's models run: its GPU (`cuda:<index>`) when torch has CUDA, else the CPU."""
    return f"cuda:{gpu_index()}" if torch.cuda.is_available() else "cpu"


class ModelPastOneGPU(ExecutionError):
    """A model whose weights do not fit the share of one GPU its engine may take."""

    user_error = True


def weights_bytes(folder: Path) -> int:
    """The size of a Hugging Face checkpoint's weights (its model*.safetensors / *.bin files)."""
    files = [*folder.glob("model*.safetensors"), *folder.glob("pytorch_model*.bin")]
    return sum(path.stat().st_size for path in files)


def check_fits_one_gpu(weights: int, share: float, setting: str, gpu_bytes: int | None = None) -> None:
    """Refuse a model whose weights alone exceed `share` of one GPU (`gpu_bytes`, default this rank's):
    each rank runs a whole engine on its own GPU, and engines split over several GPUs (tensor parallel) are
    not supported. A no-op without a GPU."""
    if gpu_bytes is None:
        if not torch.cuda.is_available():
            return
        gpu_bytes = torch.cuda.get_device_properties(gpu_index()).total_memory
    if weights > share * gpu_bytes:
        raise ModelPastOneGPU(
            f"the model's weights ({weights / 2**30:.1f} GiB) exceed {share:.0%} of this GPU's"
            f" {gpu_bytes / 2**30:.1f} GiB ({setting}): every rank runs a whole engine on one GPU, and"
            " engines split over several GPUs (tensor parallel) are not supported; use a smaller model (or"
            " bfloat16), or a larger share of the GPU where it has room"
        )
