"""Evaluating checkpoints after the fact (the `evaluate` and `nightly_eval` flows): checkpoint k of a run on
a suite — its own held-out split, or a benchmark — committed create-only beside the run
(`runs/<id>/evaluations/<k>/<suite>.json`), so that a second night or a concurrent evaluation never does one
twice. It takes no lease: it only reads checkpoints, and never drives a run.

The numbers are those of the run's own evaluate stage: the same policy, the same eval settings and the same
eval seed, so checkpoint k on `heldout` reproduces the in-run evaluation of update k to the bit.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from probepo.config import RunConfig
from probepo.presets import ConfigError, validate_run_config
from probepo.schedule import Stage
from probepo.stages.context import StageContext
from probepo.stages.evaluate import HELDOUT, suites_for
from probepo.store import ArtifactStore, StoreError, open_store

log = logging.getLogger("probepo.evaluations")


@dataclass(frozen=True)
class EvaluationRequest:
    """One checkpoint of one run on one suite, in a form that travels to a job."""

    store_url: str
    run_id: str
    checkpoint: int
    suite: str

    def describe(self) -> str:
        return f"checkpoint {self.checkpoint} of run {self.run_id} on {self.suite}"


def known_suites() -> tuple[str, ...]:
    """Every suite name: `heldout` (a run's own eval split) and the benchmarks."""
    from probepo.data.benchmarks import BENCHMARKS

    return (HELDOUT, *BENCHMARKS)


def check_suites(suites: Sequence[str]) -> tuple[str, ...]:
    """The suites, or a ValueError naming the unknown ones and the choices."""
    unknown = [name for name in suites if name not in known_suites()]
    if unknown or not suites:
        raise ValueError(
            f"suites: {', '.join(unknown) or 'none given'} — choose from {', '.join(known_suites())}"
        )
    return tuple(dict.fromkeys(suites))


def checkpoints(store: ArtifactStore, run_id: str) -> list[int]:
    """The updates whose checkpoint (policy k) is committed."""
    return [k for k in store.updates(run_id) if store.committed(run_id, k, Stage.CHECKPOINT)]


def stored_config(store: ArtifactStore, run_id: str) -> RunConfig:
    return validate_run_config(store.read_run(run_id)["config"], f"run {run_id}: its stored recipe")


def missing(
    store: ArtifactStore,
    suites: Sequence[str],
    runs: Sequence[str] | None = None,
    only: Sequence[int] | None = None,
) -> list[EvaluationRequest]:
    """Every (run, checkpoint, suite) not yet evaluated: of `runs` (default: all runs of the store), their
    checkpoints (or those in `only`), on each of `suites` the run can be evaluated on. A run whose stored
    recipe this version cannot read (or a run folder without one) is skipped with a warning."""
    chosen = check_suites(suites)
    wanted = []
    for run_id in runs if runs is not None else store.runs():
        try:
            config = stored_config(store, run_id)
        except (ConfigError, StoreError) as exc:  # a recipe of another version, a folder without run.json
            log.warning("skipping run %s: %s", run_id, exc)
            continue
        done = store.evaluations(run_id)
        applicable = [name for name in chosen if name in suites_for(config)]
        for k in checkpoints(store, run_id):
            if only is not None and k not in only:
                continue
            wanted += [
                EvaluationRequest(store.url, run_id, k, name) for name in applicable if (k, name) not in done
            ]
    return wanted


def evaluate_checkpoint(request: EvaluationRequest) -> str:
    """Evaluate one checkpoint on one suite and commit it: `evaluated`, or `exists` when an evaluation was
    there already (before or — a concurrent one — after this one ran)."""
    from probepo.stages.common import task_of
    from probepo.stages.evaluate import benchmark_suite, heldout_suite, score_suite

    store = open_store(request.store_url)
    if store.evaluation(request.run_id, request.checkpoint, request.suite) is not None:
        return "exists"
    if not store.committed(request.run_id, request.checkpoint, Stage.CHECKPOINT):
        raise ValueError(
            f"{request.describe()}: run {request.run_id} has no full checkpoint at update"
            f" {request.checkpoint} (it has {checkpoints(store, request.run_id)})"
        )
    config = stored_config(store, request.run_id)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"probepo-eval-{request.run_id}-") as scratch:
        ctx = StageContext(store, request.run_id, request.checkpoint, config, Path(scratch))
        task = task_of(ctx)
        suite = heldout_suite(ctx, task) if request.suite == HELDOUT else benchmark_suite(ctx, request.suite)
        summary, table = score_suite(ctx, task, suite)
    record = {**summary, "per_problem": table, "wall_s": round(time.perf_counter() - started, 3)}
    created = store.record_evaluation(request.run_id, request.checkpoint, request.suite, record)
    return "evaluated" if created else "exists"
