"""`python -m tests.pipeline.golden_run STORE ALGORITHM...`: trains the tiny recipe under each ALGORITHM into
a new local store (one warm-up, which the recipes share) under portable kernels (tests/pipeline/portable.py)
and prints, per algorithm, a line `ALGORITHM MODEL OPTIMIZER TRAJECTORY`: the sha256 of its final checkpoint's
two files and of its trajectory (advantages and metrics).
tests/pipeline/test_golden.py runs it in a process of its own under PORTABLE_NUMERICS."""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from probepo import spend
from probepo.run.pipeline import ensure_warmup, train
from probepo.stages.replay import FINGERPRINT
from probepo.store import ArtifactStore, open_store
from tests.pipeline.conftest import tiny_config
from tests.pipeline.portable import portable_kernels

PORTABLE_NUMERICS = {
    "ATEN_CPU_CAPABILITY": "default",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The process settings under which the golden bits are the same on any x86-64 CPU: ATen's kernels at the
`default` capability (one compiled code path, SSE2 arithmetic, on every machine), glibc's libm at its SSE2
variants (it picks FMA ones per CPU otherwise, which round differently: measured with ATen's float64
expm1), one thread. MKL is left at its own per-CPU choice on purpose: PortableKernels keeps every MKL
operation off the path, and test_golden checks that MKL's setting does not move the bits."""


def trajectory_digest(store: ArtifactStore, run_id: str, updates: int) -> str:
    """sha256 of what the weights do not show: each update's committed advantages and its metrics (losses,
    statistics; wall times, the spend counters and the weights' fingerprint left out: the fingerprint is
    the weights' own, which their digest covers, and optimize records it only where it does not commit the
    checkpoint itself, which depends on the executor). A reordered sum whose gradient is the same
    (Σ's gradient is 1 in any order) leaves the weights' bits alone but moves the loss it reports: this
    digest catches that."""
    digest = hashlib.sha256()
    for update in range(updates):
        advantage = store.read_stage(run_id, update, "advantage")
        for name in sorted(advantage):
            digest.update(advantage[name])
    for metrics in store.read_metrics(run_id):
        timeless = {
            key: value
            for key, value in metrics.items()
            if not key.endswith(("_s", FINGERPRINT)) and not spend.is_spend_metric(key)
        }
        digest.update(json.dumps(timeless, sort_keys=True).encode())
    return digest.hexdigest()


def final_digests(algorithm: str, store_url: str) -> tuple[str, str, str]:
    """sha256 of the tiny recipe's last checkpoint (model.safetensors, optimizer.safetensors) and of its
    trajectory (trajectory_digest)."""
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False  # oneDNN picks its kernels per CPU; off, nothing else reaches it
    config = tiny_config(algorithm)
    store = open_store(store_url)
    run_id = f"golden-{algorithm}"
    with portable_kernels():
        ensure_warmup(config, store)
        train(config, run_id, store=store)
    final = store.read_stage(run_id, config.num_updates, "checkpoint")
    return (
        hashlib.sha256(final["model.safetensors"]).hexdigest(),
        hashlib.sha256(final["optimizer.safetensors"]).hexdigest(),
        trajectory_digest(store, run_id, config.num_updates),
    )


if __name__ == "__main__":
    for name in sys.argv[2:]:
        print(name, *final_digests(name, sys.argv[1]), flush=True)
