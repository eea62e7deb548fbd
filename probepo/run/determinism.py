"""The run's determinism switch (`RunConfig.determinism`, docs/DETERMINISM.md), applied to a process before it
builds an engine: every engine is built through probepo.engines.build, which calls `apply_determinism` first,
so the settings precede the process's first cuBLAS call whichever stage it starts at.

bitwise, on CUDA:
- `CUBLAS_WORKSPACE_CONFIG=:4096:8`, unless it already names one of cuBLAS's fixed workspaces: cuBLAS reads
  it when the process creates its first handle, and only a fixed workspace keeps its reductions in one order;
- `torch.use_deterministic_algorithms(True)`, not warn-only: an op without a deterministic kernel raises,
  naming itself, rather than silently breaking the promise (and scaled-dot-product attention leaves cuDNN's
  kernel for the flash / memory-efficient kernels' deterministic backward);
- with vLLM as the generator, vLLM's batch-invariant mode (`VLLM_BATCH_INVARIANT=1` and its
  `init_batch_invariance()`), installed before the first engine rather than when vLLM builds its own:
  its kernels replace torch's matmul, softmax and mean process-wide, so the trainer in the same process
  must run on them from its first step, whichever engine a resumed process builds first. Read from vLLM's
  source, not run (docs/DETERMINISM.md says what it changes).
fast: torch's defaults (nondeterministic kernels allowed), nothing exported.
On the CPU nothing is set: its kernels are deterministic for a given thread count, as the suite's resume and
golden tests show.
"""

from __future__ import annotations

import functools
import os

import torch

from probepo.config import RunConfig

CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
FIXED_WORKSPACES = (":4096:8", ":16:8")
"""cuBLAS's workspace settings under which its kernels are deterministic, the two torch's deterministic mode
accepts (the first is ours; vLLM's batch-invariant mode sets the second on Hopper)."""
VLLM_BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"


def apply_determinism(config: RunConfig) -> None:
    """Set this process up for the run's `determinism` (see the module docstring); idempotent, and a no-op
    without CUDA."""
    if not torch.cuda.is_available():
        return
    bitwise = config.determinism == "bitwise"
    if bitwise and os.environ.get(CUBLAS_WORKSPACE_ENV) not in FIXED_WORKSPACES:
        os.environ[CUBLAS_WORKSPACE_ENV] = FIXED_WORKSPACES[0]
    torch.use_deterministic_algorithms(bitwise)
    if bitwise and config.model.generator == "vllm":
        _vllm_batch_invariant()


@functools.cache
def _vllm_batch_invariant() -> None:
    """vLLM's batch-invariant mode, once per process: the variable first (vLLM reads it when it starts an
    engine), then its kernels (vllm/model_executor/determinism/batch_invariant.py)."""
    os.environ[VLLM_BATCH_INVARIANT_ENV] = "1"
    from vllm.model_executor.determinism.batch_invariant import init_batch_invariance

    init_batch_invariance()
