"""A tiny CPU-testbed recipe and a shared store, so pipeline tests take seconds."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from probepo.config import RunConfig
from probepo.pipeline import ensure_warmup
from probepo.store import ArtifactStore, open_store


def tiny_config(algorithm: str = "probepo", **fields: object) -> RunConfig:
    """4 prompts × 4 responses of 3-step mod-3 chains, 2 updates, 16 eval problems. The warm-up (about
    30 steps) stops at ≥ 20 % accuracy, so groups have mixed rewards and every stage sees real signal."""
    data = RunConfig().model_dump()
    data.update(num_updates=2, prompts_per_update=4, group_size=4)
    data["task"].update(steps=3, modulus=3)
    data["warmup"].update(
        accuracy_low=0.2, accuracy_high=0.6, check_every=10, check_problems=64, max_steps=400
    )
    data["eval"].update(problems=16, every=1)
    data["optim"].update(minibatch_size=6, microbatch_size=4)  # 16 responses -> 3 mini-batches
    data["algo"].update(algorithm=algorithm, max_pivots=2, continuations_per_pivot=3)
    data.update(fields)
    return RunConfig.model_validate(data)


@pytest.fixture(scope="session")
def warm_store(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    """A local store holding the tiny recipe's warm-up checkpoint (made once per session)."""
    folder: Path = tmp_path_factory.mktemp("store")
    store = open_store(folder)
    ensure_warmup(tiny_config(), store)
    return store


@pytest.fixture(scope="session")
def s3_warm_store(s3_admin) -> ArtifactStore:
    """A store on the S3 endpoint holding the tiny recipe's warm-up checkpoint (made once per session)."""
    bucket = f"warm-{uuid.uuid4().hex[:12]}"
    s3_admin.create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/team/runs")
    ensure_warmup(tiny_config(), store)
    return store
