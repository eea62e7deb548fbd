"""The spend counters on a real run of the tiny recipe: every attempt records what it spent, the counts are
the bytes the store holds, and they reach the metrics, TensorBoard and `probepo report`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from probepo.report.summary import write_report
from probepo.run.pipeline import train
from probepo.run.schedule import is_optimizer_state
from probepo.store import ArtifactStore
from tests.pipeline.conftest import tiny_config

pytestmark = pytest.mark.integration


def test_an_update_counts_the_bytes_it_commits(warm_store: ArtifactStore, tmp_path: Path) -> None:
    config = tiny_config("probepo", checkpoint_every=2)  # update 1 ends on a full checkpoint
    events = tmp_path / "events"
    metrics = train(config, "spend", store=warm_store, tensorboard_dir=events)
    for update in range(config.num_updates):
        for record in warm_store.attempts("spend", update):
            assert set(record["spend"]) == {"bytes", "seconds", "scratch_peak_bytes"}, record
    # no stop was asked: optimize 1 committed no part, and uploaded checkpoint 2 alone
    assert not [s for s in warm_store.committed_stages("spend", 1) if s.startswith("optimize.part-")]
    by_update = {record["update"]: record for record in metrics}
    checkpoint = sum(f["size"] for f in warm_store.marker("spend", 2, "checkpoint")["files"].values())
    assert by_update[1]["bytes/optimize/uploaded"] == checkpoint
    assert by_update[0]["bytes/optimize/uploaded"] == 0 and by_update[0]["timing/optimize/digest"] > 0
    # a saved state leaves the scratch once committed: one save at a time beside what was fetched
    peak = max(m.get("bytes/optimize/scratch_peak", 0) for m in metrics)
    assert checkpoint <= peak <= 2 * checkpoint
    assert by_update[0]["timing/sample/generation"] > 0 and by_update[0]["timing/score/scoring"] > 0
    tags = EventAccumulator(str(events)).Reload().Tags()["scalars"]
    assert {"timing/sample/generation", "bytes/optimize/uploaded", "bytes/evaluate/handoff_memory"} <= set(
        tags
    )
    report = write_report(warm_store, ["spend"], tmp_path / "report").read_text()
    assert "### Where spend's updates went" in report and (tmp_path / "report" / "spend-spend.png").exists()


def test_score_on_a_committed_policy_fetches_its_weights_alone(warm_store: ArtifactStore) -> None:
    """A score stage without a resident trainer (a job of its own, or after a resume) reads policy k's
    weights, not its optimizer state; the optimize after it still restores the full trainer."""
    config = tiny_config("grpo")
    train(config, "score-weights", store=warm_store)
    warm_store.invalidate("score-weights", 1, "score", force=True)
    train(config, "score-weights", store=warm_store)  # a fresh driver: nothing resident
    [attempt] = [a for a in warm_store.attempts("score-weights", 1, "score") if a["outcome"] == "committed"][
        -1:
    ]
    files = warm_store.marker("score-weights", 1, "checkpoint")["files"]
    weights = sum(f["size"] for name, f in files.items() if not is_optimizer_state(name))
    # what landed in scratch: the weights' files (the rows it scores are read into memory)
    assert attempt["spend"]["bytes"]["scratch"] == weights < sum(f["size"] for f in files.values())
