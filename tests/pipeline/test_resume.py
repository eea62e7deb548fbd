"""The preemption drill: SIGKILL a run at points inside and between stages (inside the optimizer's
mini-batches too, with or without a stop asked first), rerun it with the same run id, and check that it
continues from the store, commits no stage twice, and ends with a checkpoint bitwise identical to an
uninterrupted run's (one thread, CPU)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from probepo.run.pipeline import train
from probepo.store import ArtifactStore, CorruptArtifact
from tests.pipeline.conftest import tiny_config, train_cli

CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")
FINAL = 2  # tiny_config trains 2 updates: the final policy is the checkpoint of update 2
MINIBATCHES = 3  # tiny_config: 16 responses in mini-batches of 6


@pytest.fixture(scope="module")
def baseline(warm_store: ArtifactStore) -> dict[str, bytes]:
    train(tiny_config("probepo"), "drill-baseline", store=warm_store)
    files = warm_store.read_stage("drill-baseline", FINAL, "checkpoint")
    return {name: files[name] for name in CHECKPOINT_FILES}


@pytest.fixture(scope="module")
def baseline_optimize(warm_store: ArtifactStore, baseline: dict[str, bytes]) -> list[dict[str, float]]:
    """The uninterrupted run's optimizer metrics of each update (the summary a resumed optimize must
    rebuild from its part and its own mini-batches)."""
    return [_optimizer_metrics(warm_store, "drill-baseline", update) for update in range(FINAL)]


def _optimizer_metrics(store: ArtifactStore, run_id: str, update: int) -> dict[str, float]:
    summary = store.marker(run_id, update, "optimize")["summary"]
    return {key: value for key, value in summary.items() if key != "wall_s"}


def _drill(
    store: ArtifactStore,
    crash_at: str,
    preset: Path,
    events: Path,
    baseline: dict[str, bytes],
    baseline_optimize: list[dict[str, float]],
    stop_at: str | None = None,
) -> None:
    """Kill a CLI run at `crash_at` (told to stop at `stop_at` first, if given), rerun it, and check what
    the drill promises."""
    run_id = "drill-" + crash_at.replace(":", "-").replace(".", "-") + ("-stopped" if stop_at else "")
    killed = train_cli(store.url, preset, run_id, crash_at, events, stop_at=stop_at)
    assert killed == -signal.SIGKILL
    update, stage, when = crash_at.split(":")
    assert not store.committed(run_id, FINAL - 1, "optimize")
    parts_before = len([s for s in store.committed_stages(run_id, 1) if s.startswith("optimize.part-")])
    assert train_cli(store.url, preset, run_id, None, events) == 0

    final = store.read_stage(run_id, FINAL, "checkpoint")
    assert {name: final[name] for name in CHECKPOINT_FILES} == baseline
    assert [_optimizer_metrics(store, run_id, update) for update in range(FINAL)] == baseline_optimize
    # The killed attempt left its "running" record. A stage killed right after its commit is not run
    # again; any other killed stage is, once.
    killed_update, killed_stage = int(update), stage.split(".")[0]
    if stage == "checkpoint" and killed_update > 0:  # later checkpoints are committed by optimize
        killed_update, killed_stage = killed_update - 1, "optimize"
    attempts = store.attempts(run_id, killed_update, killed_stage)
    rerun = killed_stage != stage or when == "before-commit"
    assert [a["outcome"] for a in attempts] == (["running", "committed"] if rerun else ["running"])
    if killed_stage == "optimize":
        # Resume continues inside the optimizer: the resumed attempt runs only the mini-batches that were
        # not committed (bitwise equality alone cannot show this: recomputing them gives the same bits).
        resumed = attempts[-1]
        if stage == "checkpoint":  # policy k + 1 was committed: only the stage's summary remained
            assert resumed["minibatches_run"] == 0
        else:
            # a stop's part only, after the mini-batch the stop came at: the resume starts after it
            parted = stop_at is not None and when == "after-commit"
            start = int(stop_at.split(".minibatch-")[1].split(":")[0]) + 1 if parted else 0
            assert parts_before == (1 if parted else 0)
            assert resumed["resumed_at_minibatch"] == start
            assert resumed["minibatches_run"] == MINIBATCHES - start
    for entry_update, stages in store.ledger_entries(run_id).items():
        for name in stages:
            committed = [a for a in store.attempts(run_id, entry_update, name) if a["outcome"] == "committed"]
            assert len(committed) <= 1
    metrics = store.read_metrics(run_id)
    assert [m["update"] for m in metrics] == [0, 1, 2]
    assert list(events.glob("events.out.tfevents.*"))  # metrics also go to TensorBoard


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config("probepo").model_dump(mode="json")))
    return path


STOPPED_AFTER_COMMITTING_A_PART = ("1:optimize.part-0000:after-commit", "1:optimize.minibatch-0000:done")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("crash_at", "stop_at"),
    [
        ("0:probe:before-commit", None),  # inside a stage, its outputs written but not committed
        ("0:score:after-commit", None),  # between two stages
        ("1:optimize.minibatch-0000:done", None),  # inside the optimizer, no stop asked: no part
        # told to stop after the first mini-batch, killed once its part is committed (the grace ran out)
        STOPPED_AFTER_COMMITTING_A_PART,
        # told to stop after the second, killed while committing its part, or once it is committed
        ("1:optimize.part-0001:before-commit", "1:optimize.minibatch-0001:done"),
        ("1:optimize.part-0001:after-commit", "1:optimize.minibatch-0001:done"),
        ("2:checkpoint:after-commit", None),  # inside optimize, between its checkpoint and its summary
    ],
)
def test_killed_run_resumes_bitwise(
    crash_at, stop_at, warm_store, baseline, baseline_optimize, preset, tmp_path
):
    _drill(warm_store, crash_at, preset, tmp_path / "tensorboard", baseline, baseline_optimize, stop_at)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("crash_at", "stop_at"), [("0:probe:before-commit", None), STOPPED_AFTER_COMMITTING_A_PART]
)
def test_killed_run_on_s3_resumes_bitwise(
    crash_at, stop_at, s3_warm_store, baseline, baseline_optimize, preset, tmp_path
):
    _drill(s3_warm_store, crash_at, preset, tmp_path / "tensorboard", baseline, baseline_optimize, stop_at)


@pytest.mark.integration
def test_corrupt_artifact_is_named_then_recomputed_bitwise(warm_store, baseline, tmp_path):
    """A flipped byte in a committed file stops the run with an error naming run, update, stage and
    file; `probepo store invalidate` then `probepo resume` recompute that stage to the same bytes."""
    run_id = "drill-corrupt"
    config = tiny_config("probepo")
    train(config, run_id, store=warm_store)
    marker = warm_store.marker(run_id, 0, "score")
    files = warm_store.read_stage(run_id, 0, "score")
    original = files["scores.safetensors"]
    path = Path(warm_store.url) / "runs" / run_id / "updates" / "000000" / "score" / marker["attempt"]
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    (path / "scores.safetensors").write_bytes(bytes(damaged))

    with pytest.raises(
        CorruptArtifact, match=r"run 'drill-corrupt' update 0 stage 'score' file 'scores\.safetensors'"
    ):
        warm_store.read_stage(run_id, 0, "score")["scores.safetensors"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "probepo.cli",
            "store",
            "invalidate",
            run_id,
            "0",
            "score",
            "--store",
            warm_store.url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not warm_store.committed(run_id, 0, "score")
    # Resuming recomputes score alone (deterministic: the same bytes); the healthy commits stay as they were.
    attempts = len(warm_store.attempts(run_id))
    train(config, run_id, store=warm_store)
    assert warm_store.read_stage(run_id, 0, "score")["scores.safetensors"] == original
    assert len(warm_store.attempts(run_id)) == attempts + 1
    final = warm_store.read_stage(run_id, FINAL, "checkpoint")
    assert {name: final[name] for name in CHECKPOINT_FILES} == baseline
