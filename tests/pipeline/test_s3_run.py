"""A whole run with its store on a real S3 endpoint (moto server): the same stages, commits and resume."""

from __future__ import annotations

import pytest

from probepo.run.pipeline import train
from probepo.run.schedule import TRAINING_STAGES
from tests.pipeline.conftest import tiny_config


@pytest.mark.integration
def test_run_on_s3_matches_the_local_run(s3_warm_store, warm_store):
    config = tiny_config("probepo", num_updates=1)
    store = s3_warm_store
    metrics = train(config, "on-s3", store=store)
    assert [m["update"] for m in metrics] == [0, 1]
    assert {"checkpoint", "evaluate", *TRAINING_STAGES} <= set(store.ledger_entries("on-s3")[0])
    assert store.verify("on-s3").problems == []

    local = train(config, "on-local", store=warm_store)
    # Same seed, same recipe: the store backend changes nothing that is computed.
    assert (
        store.read_stage("on-s3", 1, "checkpoint")["model.safetensors"]
        == warm_store.read_stage("on-local", 1, "checkpoint")["model.safetensors"]
    )
    assert [m["evaluate/accuracy"] for m in metrics] == [m["evaluate/accuracy"] for m in local]

    # Resuming on S3 is a no-op once everything is committed.
    before = len(store.attempts("on-s3"))
    assert train(config, "on-s3", store=store) == metrics
    assert len(store.attempts("on-s3")) == before
