"""Golden bits: the tiny recipe's final policy under GRPO, ProbePO and VinePPO, as sha256 of its weights and
optimizer state, recorded before the training-rows refactor (issue 16) moved them onto the path the tree
baselines share. A change of these bits is a change of the maths or of its order of operations: when one is
meant, record the new digests here and say why in the commit. One torch thread, CPU, torch 2.13.0."""

from __future__ import annotations

import hashlib

import pytest

from probepo.pipeline import train
from tests.pipeline.conftest import tiny_config

pytestmark = pytest.mark.integration

GOLDEN = {  # (model.safetensors, optimizer.safetensors) of the checkpoint of update 2, recorded at 08dd9ad
    "grpo": (
        "04ee5daaa26b2f63958ab8fc02d30c0f3af029dc41c51459df9c38dd1dacbcee",
        "d98eaae22ad6017b5b2b6325ff1418a7d43a829f8fb84cb6b281eaa08fbd9e3b",
    ),
    "probepo": (
        "2563244527d300a0090f7c6e260d853f140fcd847bd4b4f305687cd4432909fb",
        "fe57535b37c8618b52835f29a92bc6608a9f76dbdd94fe06b9ff83074a4b8315",
    ),
    "vineppo": (
        "a990832f28580a459f28a94e2040fd64e99e994dc505856f3493405ffbf512e0",
        "8b95ba694355d060aaec0e9cc6af6298076b96ee0527f8e2993ea8708208974d",
    ),
}


@pytest.mark.parametrize("algorithm", sorted(GOLDEN))
def test_the_final_policy_has_the_recorded_bits(algorithm, warm_store):
    run_id = f"golden-{algorithm}"
    train(tiny_config(algorithm), run_id, store=warm_store)
    final = warm_store.read_stage(run_id, 2, "checkpoint")
    files = ("model.safetensors", "optimizer.safetensors")
    assert tuple(hashlib.sha256(final[name]).hexdigest() for name in files) == GOLDEN[algorithm]
