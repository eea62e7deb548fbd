"""Evaluating checkpoints after the fact (the `evaluate` and `nightly_eval` flows): checkpoint k of a run on
a suite — its own held-out split, or a benchmark — committed create-only beside the run
(`runs/<id>/evaluations/<k>/<suite>.json`), so that a second night or a concurrent evaluation never does one
twice. It takes no lease: it only reads checkpoints, and never drives a run.

The numbers are those of the run's own evaluate stage: the same policy, the same eval settings and the same
eval seed, so checkpoint k on `heldout` reproduces the in-run evaluation of update k to the bit.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from probepo.config import CheckpointSelection, RunConfig
from probepo.config.retention import Retention
from probepo.presets import ConfigError, validate_run_config
from probepo.run.faults import fault_point
from probepo.run.schedule import EVAL_RESULTS, Stage
from probepo.stages.context import StageContext, never_stop
from probepo.stages.evaluate import HELDOUT, recipe_suites, suites_for
from probepo.store import ArtifactStore, ObjectMissing, StoreError, open_store
from probepo.store.retention import RetentionReport, apply_retention, checkpoint_markers, holds

log = logging.getLogger("probepo.run.evaluations")


@dataclass(frozen=True)
class EvaluationRequest:
    """One checkpoint of one run on one suite, in a form that travels to a job."""

    store_url: str
    run_id: str
    checkpoint: int
    suite: str
    from_run: bool = False
    """The run's own evaluate stage evaluated this checkpoint on this suite already: its numbers are taken
    (`adopt_run_evaluation`), nothing is generated again."""

    def describe(self) -> str:
        return f"checkpoint {self.checkpoint} of run {self.run_id} on {self.suite}"


def known_suites() -> tuple[str, ...]:
    """Every suite name: `heldout` (a run's own eval split) and the benchmarks."""
    from probepo.data.benchmarks import BENCHMARKS

    return (HELDOUT, *BENCHMARKS)


def check_suites(suites: Sequence[str] | None) -> tuple[str, ...] | None:
    """The suites (None: each run's own, `recipe_suites`), or a ValueError naming the unknown ones (or an
    empty list) and the choices."""
    if suites is None:
        return None
    choices = f"choose from {', '.join(known_suites())}"
    if not suites:
        raise ValueError(f"suites: none given — leave suites unset (None) for each run's own, or {choices}")
    if unknown := [name for name in suites if name not in known_suites()]:
        raise ValueError(f"suites: {', '.join(unknown)} — {choices}")
    return tuple(dict.fromkeys(suites))


def checkpoints(markers: Mapping[int, Mapping[str, Any]]) -> dict[int, datetime]:
    """Of a run's checkpoint markers (retention.checkpoint_markers), the updates whose checkpoint (policy
    k) still holds its weights (retention may have deleted those of some), with when each was committed."""
    return {
        update: datetime.fromisoformat(marker["committed_at"])
        for update, marker in sorted(markers.items())
        if holds(marker) != "record"
    }


def stored_config(store: ArtifactStore, run_id: str) -> RunConfig:
    return validate_run_config(store.read_run(run_id)["config"], f"run {run_id}: its stored recipe")


def _evaluated_in_run(entries: Mapping[int, list[str]], config: RunConfig) -> set[tuple[int, str]]:
    """The (update, suite) pairs the run's own evaluate stage committed (`entries`: its ledger): policy k
    on its held-out split, or on each of `eval.benchmarks` — the same numbers an evaluation after the fact
    would make."""
    in_run = recipe_suites(config)
    return {
        (update, suite) for update, stages in entries.items() if Stage.EVALUATE in stages for suite in in_run
    }


def missing(
    store: ArtifactStore, suites: Sequence[str] | None, selection: CheckpointSelection | None = None
) -> list[EvaluationRequest]:
    """Every (run, checkpoint, suite) of the selection (default: every checkpoint of every run) without an
    evaluation, on each of `suites` the run can be evaluated on (None: each run's own, `recipe_suites`);
    those the run's own evaluate stage made come `from_run`. A run whose stored recipe this version cannot
    read (or a run folder without one) is skipped with a warning."""
    chosen = check_suites(suites)
    selection = selection or CheckpointSelection()
    wanted = []
    for run_id in filter(selection.takes_run, store.runs()):
        try:
            entries = store.ledger_entries(run_id)
            markers = checkpoint_markers(store, run_id, entries)
            wanted += _missing_of_run(store, run_id, chosen, selection, entries, markers)
        except (ConfigError, StoreError) as exc:  # a recipe of another version, a folder without run.json
            log.warning("skipping run %s: %s", run_id, exc)
    return wanted


def _missing_of_run(
    store: ArtifactStore,
    run_id: str,
    suites: Sequence[str] | None,
    selection: CheckpointSelection,
    entries: Mapping[int, list[str]],
    markers: Mapping[int, Mapping[str, Any]],
) -> list[EvaluationRequest]:
    """`missing` for one run, from its ledger `entries` and checkpoint `markers` (read once by the caller)."""
    config = stored_config(store, run_id)
    done = store.evaluations(run_id)
    in_run = _evaluated_in_run(entries, config)
    applicable = [name for name in suites or recipe_suites(config) if name in suites_for(config)]
    committed = checkpoints(markers)
    return [
        EvaluationRequest(store.url, run_id, k, name, from_run=(k, name) in in_run)
        for k in selection.choose(list(committed), committed.__getitem__)
        for name in applicable
        if (k, name) not in done
    ]


def retain_checkpoints(
    store: ArtifactStore, run_id: str, retention: Retention, *, dry_run: bool = False
) -> RetentionReport:
    """Prune the run's checkpoints as `retention` says, keeping the weights its nightly evaluation still
    has to read (`retention.pending_evaluation`: the checkpoints it would evaluate that lack an
    evaluation the run did not make itself). The ledger is listed and the markers read once."""
    entries = store.ledger_entries(run_id)
    markers = checkpoint_markers(store, run_id, entries)
    selection = retention.pending_evaluation
    pending = (
        set()
        if selection is None or not selection.takes_run(run_id)
        else {
            request.checkpoint
            for request in _missing_of_run(
                store, run_id, check_suites(retention.evaluation_suites), selection, entries, markers
            )
            if not request.from_run
        }
    )
    return apply_retention(store, run_id, retention, pending, markers=markers, dry_run=dry_run)


def adopt_run_evaluation(request: EvaluationRequest) -> str:
    """Commit, as checkpoint k's evaluation, the numbers the run's own evaluate stage made at update k
    (`from_run` requests): `reused`, or `exists` when another evaluation came first."""
    store = open_store(request.store_url)
    marker = store.marker(request.run_id, request.checkpoint, Stage.EVALUATE)
    if marker is None:
        raise ValueError(
            f"{request.describe()}: the run's evaluate stage of update {request.checkpoint} is gone"
        )
    summary = marker["summary"]
    if request.suite == HELDOUT:
        numbers = {"mean": summary["accuracy"], "stderr": summary["stderr"], "problems": summary["problems"],
                   "k": summary["samples_per_problem"]}  # fmt: skip
        results = EVAL_RESULTS
    else:
        numbers = {key: summary[f"{request.suite}/{key}"] for key in ("mean", "stderr", "problems", "k")}
        results = f"eval-{request.suite}.parquet"
    record = {**numbers, "from_run": {"update": request.checkpoint, "stage": Stage.EVALUATE, "file": results}}
    created = store.record_evaluation(request.run_id, request.checkpoint, request.suite, record)
    return "reused" if created else "exists"


@runtime_checkable
class HoldsCommits(Protocol):
    """A stop flag that abandons the work at once, but for a commit (an array task's: slurm/job.py,
    AbandoningStop): the work makes each commit inside `held()`, and the flag counts them as progress."""

    def __call__(self) -> bool: ...

    def held(self) -> AbstractContextManager[None]: ...


def _held(should_stop: Callable[[], bool]) -> AbstractContextManager[None]:
    """A commit, never cut by a stop that abandons the work (HoldsCommits); a plain flag waits anyway."""
    return should_stop.held() if isinstance(should_stop, HoldsCommits) else nullcontext()


@dataclass(frozen=True)
class EvaluationShards:
    """An evaluation's shards (a ShardBook), kept beside the run's evaluations under a prefix of its own
    (`runs/<id>/evaluation-shards/<k>/<suite>/`), never in the run's ledger: a task stopped midway
    (preempted, at its time limit, killed) resumes from them, on any node, the next time it runs."""

    ctx: StageContext
    suite: str

    def committed(self, stage: str) -> set[int]:
        from probepo.stages.shards import shard_indices

        names = self.ctx.store.evaluation_shard_names(self.ctx.run_id, self.ctx.update, self.suite)
        return shard_indices(names, stage)

    def commit(self, name: str, table: bytes, summary: Mapping[str, Any]) -> None:
        ctx = self.ctx
        fault_point(ctx.update, name, "before-commit", ctx.should_stop)
        with _held(ctx.should_stop):
            ctx.store.commit_evaluation_shard(ctx.run_id, ctx.update, self.suite, name, table)
        fault_point(ctx.update, name, "after-commit", ctx.should_stop)

    def read(self, name: str) -> bytes:
        return self.ctx.store.read_evaluation_shard(self.ctx.run_id, self.ctx.update, self.suite, name)


def scheduler_job() -> str | None:
    """The SLURM job this process runs in, as accounting names it (`123_4`: task 4 of array 123), or None."""
    env = os.environ
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def evaluate_checkpoint(request: EvaluationRequest, should_stop: Callable[[], bool] = never_stop) -> str:
    """Evaluate one checkpoint on one suite and commit it: `evaluated`, `resumed` (evaluated, some of its
    shards made by an earlier, stopped task), or `exists` when an evaluation was there already (before or
    — a concurrent one, which may drop the shards this one reads — after this one ran). Its samples are
    made shard by shard (the recipe's engine calls), each kept as it is made; once `should_stop` (a
    preemption or time-limit signal), it stops at the next shard and raises Preempted, or, under an array
    task's flag (HoldsCommits), is abandoned at once but for a commit; its next run makes only the missing
    shards: the same bits as an uninterrupted evaluation. Each SLURM job that works on it is noted beside
    the shards, and the record names them all (`jobs`: the GPU-hours of every night it took). The shards
    are deleted once the evaluation is committed."""
    store = open_store(request.store_url)
    pair = (request.run_id, request.checkpoint, request.suite)
    if store.evaluation(*pair) is not None:
        store.drop_evaluation_shards(*pair)
        return "exists"
    if request.checkpoint not in (committed := checkpoints(checkpoint_markers(store, request.run_id))):
        raise ValueError(
            f"{request.describe()}: run {request.run_id} has no checkpoint with weights at update"
            f" {request.checkpoint} (it has {list(committed)})"
        )
    if job := scheduler_job():
        store.record_evaluation_job(*pair, job)
    started = time.perf_counter()
    try:
        summary, table, source, notes = _score(store, request, should_stop)
    except ObjectMissing:
        if store.evaluation(*pair) is None:
            raise
        store.drop_evaluation_shards(*pair)  # what this one kept after the other dropped the rest
        return "exists"
    resumed = notes.get("resumed_shards", 0)
    record = {
        **summary,
        "source": source,
        "per_problem": table,
        "wall_s": round(time.perf_counter() - started, 3),
        "shards": resumed + notes.get("shards_run", 0),
        "resumed_shards": resumed,
        "jobs": store.evaluation_jobs(*pair),
    }
    with _held(should_stop):
        created = store.record_evaluation(*pair, record)
        store.drop_evaluation_shards(*pair)
    if not created:
        return "exists"
    return "resumed" if resumed else "evaluated"


def _score(
    store: ArtifactStore, request: EvaluationRequest, should_stop: Callable[[], bool]
) -> tuple[dict[str, float | int], dict[str, list], str, dict[str, Any]]:
    """Policy k on the request's suite, its shards kept as EvaluationShards: its summary, per-problem
    table and source, and the attempt's notes (`resumed_shards`, `shards_run`)."""
    from probepo.stages.common import task_of
    from probepo.stages.evaluate import benchmark_suite, heldout_suite, score_suite

    config = stored_config(store, request.run_id)
    with tempfile.TemporaryDirectory(prefix=f"probepo-eval-{request.run_id}-") as scratch:
        ctx = StageContext(store, request.run_id, request.checkpoint, config, Path(scratch), should_stop)
        task = task_of(ctx)
        suite = heldout_suite(ctx, task) if request.suite == HELDOUT else benchmark_suite(ctx, request.suite)
        summary, table = score_suite(ctx, task, suite, EvaluationShards(ctx, request.suite))
    return summary, table, suite.source, ctx.attempt_notes
