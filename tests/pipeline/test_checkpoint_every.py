"""Full checkpoints every N updates and the optimize replay (ALGORITHM-independent; DESIGN.md "Execution").

A run with `checkpoint_every: 3` commits policy k in full at updates 0, 3 and the last one only; the
optimize stages between commit their metrics and a weight digest. Killed (SIGKILL) at points between two
full checkpoints and resumed, it replays the optimize stages since the last one from their committed
inputs, generating nothing again, and ends bitwise equal to an uninterrupted `checkpoint_every: 1` run; a
replay that does not reproduce a digest is recorded and logged, and the run goes on.
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load

from probepo import spend
from probepo.engines.fingerprint import weights_digest
from probepo.engines.sampler import TorchGenerationEngine
from probepo.run import execution
from probepo.run.execution import StageRequest
from probepo.run.pipeline import train
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext
from probepo.stages.replay import FINGERPRINT, LEGACY_DIGEST
from probepo.store import ArtifactStore
from tests.pipeline.conftest import FINAL_FILES, LONG_UPDATES, every_config, train_cli

FULL = [0, 3, 5]  # checkpoint_every 3 over 5 updates: update 0, every third, and the last
GENERATING = {"sample", "probe", "evaluate"}


def final_checkpoint(store: ArtifactStore, run_id: str) -> dict[str, bytes]:
    files = store.read_stage(run_id, LONG_UPDATES, "checkpoint")
    return {name: files[name] for name in FINAL_FILES}


@pytest.mark.integration
def test_only_every_third_policy_is_committed_in_full_and_the_bits_do_not_change(
    warm_store, every_update_reference
):
    train(every_config(3), "every-3", store=warm_store)
    entries = warm_store.ledger_entries("every-3")
    assert [u for u, stages in entries.items() if "checkpoint" in stages] == FULL
    for update in range(LONG_UPDATES):
        # every optimize commits the fingerprint of the weights it made but the last, which commits them:
        # a checkpoint uploads beside the next updates and, until it lands, a resume replays it
        summary = warm_store.marker("every-3", update, "optimize")["summary"]
        assert (FINGERPRINT in summary) == (update + 1 < LONG_UPDATES)
    assert final_checkpoint(warm_store, "every-3") == every_update_reference

    # The metrics are those of the run that checkpoints every update (digests, timings and spend aside).
    def comparable(run_id: str) -> list[dict]:
        return [
            {
                k: v
                for k, v in m.items()
                if "wall_s" not in k and not k.endswith(FINGERPRINT) and not spend.is_spend_metric(k)
            }
            for m in warm_store.read_metrics(run_id)
        ]

    assert comparable("every-3") == comparable("every-1")


def _kill_cli(store: ArtifactStore, tmp_path: Path, run_id: str, crash_at: str) -> None:
    preset = tmp_path / "every-3.yaml"
    preset.write_text(yaml.safe_dump(every_config(3).model_dump(mode="json")))
    assert train_cli(store.url, preset, run_id, crash_at) == -signal.SIGKILL


class StageSpy:
    """Which stage each generation call happens in, and what each stage attempt reports."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.current: tuple[int, str] | None = None
        self.generation_calls: list[tuple[int, str]] = []
        original_execute, original_decode = execution.execute_stage, TorchGenerationEngine.decode_chunks

        def execute(ctx: StageContext, stage: Stage, job_id: str | None = None) -> None:
            self.current = (ctx.update, stage)
            try:
                original_execute(ctx, stage, job_id)
            finally:
                self.current = None

        def decode_chunks(engine, *args, **kwargs):
            self.generation_calls.append(self.current)
            return original_decode(engine, *args, **kwargs)

        monkeypatch.setattr(execution, "execute_stage", execute)
        monkeypatch.setattr(TorchGenerationEngine, "decode_chunks", decode_chunks)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("crash_at", "resume_every", "replayed"),
    [
        ("2:probe:before-commit", 3, 2),  # replay optimizes 0 and 1 for the generation stages of update 2
        ("1:optimize:before-commit", 1, 1),  # a light optimize killed while committing; resumed at every 1
    ],
)
def test_killed_between_full_checkpoints_replays_without_generating(
    warm_store, every_update_reference, tmp_path, monkeypatch, crash_at, resume_every, replayed
):
    run_id = "every-3-" + crash_at.replace(":", "-")
    _kill_cli(warm_store, tmp_path, run_id, crash_at)
    before = {u: set(stages) for u, stages in warm_store.ledger_entries(run_id).items()}

    spy = StageSpy(monkeypatch)
    train(every_config(resume_every), run_id, store=warm_store)  # checkpoint_every is not part of the recipe

    assert final_checkpoint(warm_store, run_id) == every_update_reference
    # Generation ran only in generating stages the killed run had not committed: the replay generated
    # nothing (and no stage before the kill ran again).
    assert spy.generation_calls
    for update, stage in spy.generation_calls:
        assert stage in GENERATING and stage not in before.get(update, set()), (update, stage)
    notes = [a.get("replayed_updates") for a in warm_store.attempts(run_id) if a.get("replayed_updates")]
    assert notes == [replayed]  # one stage restored the policy; the others had it resident


def _killed_with_optimize_1_summary(
    store: ArtifactStore, tmp_path: Path, run_id: str, fields: dict, drop: str | None = None
) -> None:
    """Kill an every-3 run at update 2's score (policy 2 only in memory), then rewrite update 1's optimize
    summary: `fields` set, `drop` removed."""
    _kill_cli(store, tmp_path, run_id, "2:score:before-commit")
    marker = Path(store.url) / "runs" / run_id / "ledger" / "000001" / "optimize.json"
    record = json.loads(marker.read_text())
    record["summary"].pop(drop, None)
    record["summary"].update(fields)
    marker.write_text(json.dumps(record))


@pytest.mark.integration
def test_a_replay_that_does_not_reproduce_the_committed_weights_is_recorded_and_the_run_goes_on(
    warm_store, tmp_path, caplog
):
    run_id = "every-3-diverged"
    # as if update 1 had been computed on another device
    _killed_with_optimize_1_summary(warm_store, tmp_path, run_id, {FINGERPRINT: "0" * 16})
    with caplog.at_level(logging.WARNING, logger="probepo.stages.replay"):
        train(every_config(3), run_id, store=warm_store)
    [replay] = [a for a in warm_store.attempts(run_id) if a.get("replayed_updates")]
    assert replay["replayed_updates"] == 2 and replay["replay_diverged"] == [1]
    assert f"run {run_id}: replaying optimize of updates [1] did not reproduce" in caplog.text
    assert warm_store.committed(run_id, LONG_UPDATES, "checkpoint")


@pytest.mark.integration
def test_a_store_written_before_fingerprints_still_replays_against_its_sha256(
    warm_store, every_update_reference, tmp_path
):
    """Optimize summaries committed with `policy_sha256` (the sha256 of a host copy) are checked as before."""
    run_id = "every-3-legacy"
    policy_2 = load(warm_store.read_stage("every-1", 2, "checkpoint")["model.safetensors"])
    _killed_with_optimize_1_summary(
        warm_store, tmp_path, run_id, {LEGACY_DIGEST: weights_digest(policy_2)}, drop=FINGERPRINT
    )
    train(every_config(3), run_id, store=warm_store)
    [replay] = [a for a in warm_store.attempts(run_id) if a.get("replayed_updates")]
    assert replay["replayed_updates"] == 2 and "replay_diverged" not in replay
    assert final_checkpoint(warm_store, run_id) == every_update_reference


class PerStageJobs:
    """A runner that, like the SLURM executor, would run every stage in a fresh process."""

    resident = False

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        raise AssertionError("nothing may run")


def test_checkpoint_every_above_1_is_refused_with_jobs_per_stage(warm_store):
    with pytest.raises(ValueError, match="checkpoint_every = 3 needs engines that stay resident"):
        train(every_config(3), "every-3-jobs", store=warm_store, runner=PerStageJobs())
