"""`python -m tests.pipeline.golden_run ALGORITHM STORE`: trains the tiny recipe under ALGORITHM into a new
local store (warm-up included) and prints the sha256 of the final checkpoint's model and optimizer files,
one per line. tests/pipeline/test_golden.py runs it in a process of its own under PORTABLE_NUMERICS."""

from __future__ import annotations

import hashlib
import sys

import torch

from probepo.pipeline import ensure_warmup, train
from probepo.store import open_store
from tests.pipeline.conftest import tiny_config

PORTABLE_NUMERICS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The CPU kernels every x86-64 machine with AVX2 runs alike: torch's own kernels at AVX2, MKL in its
conditional-numerical-reproducibility mode, one thread (and oneDNN off: final_digests). Without them the
same code gives other bits on an AVX-512 machine than on an AVX2 one (measured: all three libraries change
the bits)."""


def final_digests(algorithm: str, store_url: str) -> tuple[str, str]:
    """sha256 of (model.safetensors, optimizer.safetensors) of the tiny recipe's last checkpoint."""
    torch.set_num_threads(1)
    # oneDNN capped at AVX2 still gave an Intel Xeon other bits than an AMD EPYC (its kernels are
    # chosen per machine); with it off, torch's fp32 matmuls go to MKL, reproducible under MKL_CBWR.
    torch.backends.mkldnn.enabled = False
    config = tiny_config(algorithm)
    store = open_store(store_url)
    ensure_warmup(config, store)
    run_id = f"golden-{algorithm}"
    train(config, run_id, store=store)
    final = store.read_stage(run_id, config.num_updates, "checkpoint")
    return (
        hashlib.sha256(final["model.safetensors"]).hexdigest(),
        hashlib.sha256(final["optimizer.safetensors"]).hexdigest(),
    )


if __name__ == "__main__":
    print("\n".join(final_digests(sys.argv[1], sys.argv[2])))
