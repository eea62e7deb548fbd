"""The SLURM test cluster for the DeepSpeed engine's tests (the tiny Qwen2 model: tests/conftest.py), and
DeepSpeed's CPU build (the `deepspeed` extra; scripts/venv.sh builds it with DS_BUILD_OPS=0)."""

import pytest

from tests.slurm.conftest import slurm_cluster

pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed: bash scripts/venv.sh cpu,dev,hf,flows,deepspeed"
)

__all__ = ["slurm_cluster"]
