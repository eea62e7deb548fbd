"""The stage table (probepo.run.schedule.STAGES) is the one place that says what each stage reads, writes,
where
it runs and when: every file a stage reads is written by a stage before it, every file it commits is
declared, the lists read from the table are those the code kept before, and a tiny run's store agrees."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from dataclasses import replace
from fnmatch import fnmatch
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

from probepo.config import RunConfig
from probepo.run.execution import StageRequest, execute_stage
from probepo.run.pipeline import train
from probepo.run.schedule import (
    BENCHMARK_RESULTS,
    EVERY_RANK,
    POLICY,
    STAGES,
    TRAINING_STAGES,
    WARMUP_MODEL,
    Stage,
    UnknownStage,
    When,
    stages_for_update,
    written_by,
)
from probepo.stages import runners, warmup
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore
from slurm.executors import EXECUTORS
from tests.pipeline.conftest import tiny_config

TABLE_ORDER = (
    Stage.WARMUP,
    Stage.CHECKPOINT,
    Stage.EVALUATE,
    Stage.SAMPLE,
    Stage.SCORE,
    Stage.SELECT,
    Stage.PROBE,
    Stage.ADVANTAGE,
    Stage.OPTIMIZE,
)
"""What slurm/executors.py's STAGE_JOBS said before the table: every Stage but driver and eval_task."""
OLD_TRAINING_STAGES = (Stage.SAMPLE, Stage.SCORE, Stage.SELECT, Stage.PROBE, Stage.ADVANTAGE, Stage.OPTIMIZE)
OLD_EVERY_RANK = (Stage.SAMPLE, Stage.PROBE, Stage.EVALUATE, Stage.SCORE, Stage.OPTIMIZE)
TESTBED_POLICY = {"model.safetensors", "config.json", "optimizer.safetensors", "trainer.json"}
"""The files of a testbed policy (what POLICY stands for in the tiny run)."""


def old_stages_for_update(update: int, num_updates: int, eval_every: int) -> list[Stage]:
    """schedule.stages_for_update as it was written before the table."""
    stages = [Stage.CHECKPOINT] if update == 0 else []
    if update % eval_every == 0 or update == num_updates:
        stages.append(Stage.EVALUATE)
    if update < num_updates:
        stages.extend(OLD_TRAINING_STAGES)
    return stages


def test_the_lists_read_from_the_table_are_the_old_ones():
    assert tuple(STAGES) == TABLE_ORDER
    assert TRAINING_STAGES == OLD_TRAINING_STAGES
    # the same stages in the table's order (so config/execution.py's MULTI_NODE_STAGES names them)
    assert set(EVERY_RANK) == set(OLD_EVERY_RANK)
    assert tuple(stage for stage in TABLE_ORDER if stage in OLD_EVERY_RANK) == EVERY_RANK
    for num_updates in (1, 2, 5):
        for eval_every in (1, 2, 3):
            for update in range(num_updates + 1):
                expected = old_stages_for_update(update, num_updates, eval_every)
                assert stages_for_update(update, num_updates=num_updates, eval_every=eval_every) == expected


def test_the_runners_and_the_executors_hold_the_tables_stages():
    assert tuple(runners.STAGES) == tuple(STAGES)
    for stage, spec in STAGES.items():
        # in probepo/stages/, which the layer tests hold to the stages' rules (runners import it by name)
        assert spec.module.startswith("probepo.stages.")
        module = import_module(spec.module)
        assert stage == module.STAGE
        assert runners.STAGES[stage] is module.run
    for name in ("local", "slurm"):  # a job per stage
        assert EXECUTORS[name].stages == TABLE_ORDER
    assert EXECUTORS["resident"].stages == (Stage.DRIVER,)
    assert EXECUTORS["inline"].stages == ()


def test_an_unknown_stage_is_refused_naming_it_and_the_stages():
    known = "warmup, checkpoint, evaluate, sample, score, select, probe, advantage, optimize"
    with pytest.raises(UnknownStage, match=rf"^unknown stage 'driver': the stages are {known}$"):
        STAGES[Stage.DRIVER]
    with pytest.raises(UnknownStage, match=rf"^unknown stage 'sampel': the stages are {known}$"):
        runners.STAGES["sampel"]
    assert "sampel" not in STAGES and STAGES.get("sampel") is None
    with pytest.raises(ValueError, match=r"no stage writes a file 'shard.parquet'"):
        written_by("shard.parquet")


def test_each_file_has_one_writer():
    names = [name for spec in STAGES.values() for name in spec.writes]
    assert len(names) == len(set(names))
    for stage, spec in STAGES.items():
        assert all(written_by(name) == stage for name in spec.writes)
    assert written_by(POLICY) == Stage.CHECKPOINT  # optimize commits policy k + 1 into update k + 1's


def written_in_order(num_updates: int, eval_every: int) -> dict[tuple[Stage, str, int | None], tuple]:
    """Each file a run commits, as (folder, name, update; None: the warm-up run's), with the (update,
    stage) that wrote it; every read checked against what stages before it wrote."""
    written: dict[tuple[Stage, str, int | None], tuple[int | None, Stage]] = {}

    def run(stage: Stage, update: int | None) -> None:
        spec = STAGES[stage]
        for folder, name in spec.reads:
            at = None if STAGES[folder].when == When.WARMUP else update
            assert (folder, name, at) in written, (
                f"{stage} at update {update} reads {folder}/{name} unwritten"
            )
        for name in spec.writes:
            written[(stage, name, update)] = (update, stage)
        if spec.commits_next_checkpoint:
            assert update is not None
            written[(Stage.CHECKPOINT, POLICY, update + 1)] = (update, stage)

    for stage in (stage for stage, spec in STAGES.items() if spec.when == When.WARMUP):
        run(stage, None)  # the warm-up run comes before every run that starts from it
    for update in range(num_updates + 1):
        for stage in stages_for_update(update, num_updates=num_updates, eval_every=eval_every):
            run(stage, update)
    return written


def test_every_file_a_stage_reads_is_written_by_a_stage_before_it():
    for num_updates, eval_every in ((1, 1), (4, 3)):
        written = written_in_order(num_updates, eval_every)
        # policy k: checkpoint 0 from the warm-up, then each from the update before's optimize
        assert written[(Stage.CHECKPOINT, POLICY, 0)] == (0, Stage.CHECKPOINT)
        for update in range(1, num_updates + 1):
            assert written[(Stage.CHECKPOINT, POLICY, update)] == (update - 1, Stage.OPTIMIZE)


class RecordingRunner:
    """Runs each stage in this process as a job of its own would, with no engine and no scratch folder kept
    from the stage before (so each reads policy k from the store), noting the committed files it reads: by
    (stage, run, update), a set of (run, update, folder, name)."""

    resident = False

    def __init__(self) -> None:
        self.running: tuple[Stage, str, int] | None = None
        self.reads: dict[tuple[Stage, str, int], set[tuple[str, int, str, str]]] = defaultdict(set)

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        self.running = (request.stage, request.run_id, request.update)
        try:
            with tempfile.TemporaryDirectory() as scratch:
                execute_stage(replace(ctx, scratch=Path(scratch)), request.stage)
        finally:
            self.running = None

    def note(self, run_id: str, update: int, folder: str, name: str) -> None:
        assert self.running is not None, f"{folder}/{name} read outside a stage"
        self.reads[self.running].add((run_id, update, folder, name))


@pytest.fixture(scope="module")
def recorded(warm_store: ArtifactStore) -> tuple[RecordingRunner, dict[str, RunConfig]]:
    """One update of the tiny recipe under grpo, probepo (its entropy selector reads the scores) and
    spo_tree (trees), each stage's reads recorded (every committed file is read through one of the two
    store methods patched here); returns the runner and each run's config by id."""
    runner = RecordingRunner()
    store_type = type(warm_store)
    fetch, download = store_type._fetch_verified, store_type.download_stage_file

    def fetched(self: ArtifactStore, marker: dict[str, Any], name: str) -> bytes:
        runner.note(marker["run_id"], marker["update"], marker["stage"], name)
        return fetch(self, marker, name)

    def downloaded(self: ArtifactStore, run_id: str, update: int, stage: str, name: str, dest: Any) -> Any:
        runner.note(run_id, update, stage, name)
        return download(self, run_id, update, stage, name, dest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_type, "_fetch_verified", fetched)
        patch.setattr(store_type, "download_stage_file", downloaded)
        configs = {
            f"stage-table-{algo}": tiny_config(algo, num_updates=1)
            for algo in ("grpo", "probepo", "spo_tree")
        }
        for run_id, config in configs.items():
            train(config, run_id, store=warm_store, runner=runner)
    return runner, configs


def test_each_committed_folder_holds_only_its_declared_files(recorded, warm_store):
    _, configs = recorded
    seen: dict[Stage, set[str]] = defaultdict(set)
    for run_id in configs:
        for update, stages in warm_store.ledger_entries(run_id).items():
            for stage in (s for s in stages if s in STAGES):  # not the stages' own shards and parts
                files = set(warm_store.marker(run_id, update, stage)["files"])
                declared = STAGES[stage].writes
                if POLICY in declared:
                    assert files == TESTBED_POLICY, (run_id, update, stage)
                else:
                    assert all(any(fnmatch(f, d) for d in declared) for f in files), (
                        run_id,
                        update,
                        stage,
                        files,
                    )
                seen[stage] |= files
    warmup_run = warmup.warmup_run_id(next(iter(configs.values())))
    assert set(warm_store.marker(warmup_run, 0, Stage.WARMUP)["files"]) == set(WARMUP_MODEL)
    # every file declared shows up in one of these runs, but a maths run's benchmark tables
    for stage, spec in STAGES.items():
        if stage != Stage.WARMUP:
            expected = {name for name in spec.writes if name not in (POLICY, BENCHMARK_RESULTS)}
            assert expected <= seen[stage], stage


def test_each_stage_reads_exactly_what_it_declares(recorded):
    runner, configs = recorded
    warmup_run = warmup.warmup_run_id(next(iter(configs.values())))
    read: dict[Stage, set[tuple[Stage, str]]] = defaultdict(set)
    for (stage, run_id, update), files in runner.reads.items():
        for source, at, folder, name in files:
            if folder.startswith(f"{stage}."):
                continue  # its own progress: shards, optimize's parts
            # the same update of the same run, or the warm-up run's files
            assert (source, at) == ((warmup_run, 0) if folder == Stage.WARMUP else (run_id, update)), name
            read[stage].add((Stage(folder), POLICY if folder == Stage.CHECKPOINT else name))
    for stage, spec in STAGES.items():
        assert read[stage] == set(spec.reads), stage
