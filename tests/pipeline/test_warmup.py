"""The shared warm-up: a pure function of its own key (never of the run that happened to create it), and
the accuracy window it promises."""

from __future__ import annotations

import pytest

from probepo.presets import with_overrides
from probepo.run.pipeline import ensure_warmup
from probepo.stages import warmup
from probepo.store import open_store
from tests.pipeline.conftest import tiny_config


def _warmup(tmp_path, config) -> tuple[dict, bytes]:
    store = open_store(tmp_path / f"store-{config.seed}-{config.warmup.accuracy_low}")
    run_id = ensure_warmup(config, store)
    return store.marker(run_id, 0, warmup.STAGE)["summary"], store.read_stage(run_id, 0, warmup.STAGE)[
        "model.safetensors"
    ]


def test_runs_sharing_a_warmup_id_get_the_same_warmup_whatever_their_seed(tmp_path):
    """The audit's reproduction: seeds 0-3 share one warm-up id, and before the fix seed 1 stopped at
    step 20 while the others stopped at 30 (its checks were seeded from the run seed)."""
    configs = [
        tiny_config(seed=s, warmup={**tiny_config().warmup.model_dump(), "accuracy_low": 0.15})
        for s in range(2)
    ]
    assert len({warmup.warmup_run_id(c) for c in configs}) == 1
    made = [_warmup(tmp_path, c) for c in configs]
    assert made[0][0]["history"] == made[1][0]["history"]
    assert {weights for _, weights in made} == {made[0][1]}


def test_the_warmup_key_is_versioned():
    config = tiny_config()
    assert warmup.warmup_run_id(config).startswith("warmup-")
    # An older store's warm-up (another key version) is never served as the current one.
    current = warmup.warmup_run_id(config)
    try:
        warmup.KEY_VERSION -= 1
        assert warmup.warmup_run_id(config) != current
    finally:
        warmup.KEY_VERSION += 1


@pytest.mark.parametrize("low", [0.15, 0.3])
def test_the_warmup_stops_at_the_first_check_reaching_accuracy_low(tmp_path, low):
    config = with_overrides(tiny_config(), **{"warmup.accuracy_low": low, "warmup.accuracy_high": 0.95})
    summary, _ = _warmup(tmp_path, config)
    history = summary["history"]
    assert summary["accuracy"] >= low and history[-1] == [summary["steps"], summary["accuracy"]]
    assert all(acc < low for _, acc in history[:-1])  # no earlier check reached the window
