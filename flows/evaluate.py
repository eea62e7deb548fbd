"""The `evaluate` and `nightly_eval` flows: checkpoints evaluated after the fact (probepo/evaluations.py),
every missing (checkpoint, suite) pair one task of a SLURM job array (split to MaxArraySize), each result
committed create-only beside its run, so a second night — or a run started while another is going — does
nothing twice. Neither takes a run's lease: they only read checkpoints.

What the UI shows: a task run per job array (`evaluate · array <id> · <n> tasks`; inline, one per pair), a
table artifact of what was evaluated, and the flow run fails (after committing every result that came)
when a pair could not be evaluated, naming it and its job; the next night retries exactly those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.states import State

from flows.runner import stage_task
from flows.train import artifact_key, refused
from probepo.errors import ExecutionError
from probepo.evaluations import EvaluationRequest, check_suites, evaluate_checkpoint, missing
from probepo.presets import ConfigError, load_profile
from probepo.store import open_store
from slurm.arrays import run_array
from slurm.executors import ArrayExecutorName, executor_for

DEFAULT_SUITES = ("heldout",)
"""Where the evaluations run: this process, a subprocess each, or SLURM job arrays."""


def _evaluate(
    requests: list[EvaluationRequest], executor: ArrayExecutorName, profile: str | None, name: str
) -> dict[str, Any]:
    logger = get_run_logger()
    try:
        execution = load_profile(profile)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    logger.info(f"{len(requests)} evaluations to do ({executor})")
    work: Callable[[EvaluationRequest], str] = evaluate_checkpoint
    if executor_for(executor, arrays=True).in_process:  # one task run per pair, named after it

        def work(request: EvaluationRequest) -> str:
            named = stage_task.with_options(task_run_name=f"evaluate · {request.describe()}")
            return named(lambda: evaluate_checkpoint(request))

    def watch(array_id: str, count: int, wait: Callable[[], None]) -> None:
        tasks = f"{count} task{'' if count == 1 else 's'}"
        stage_task.with_options(task_run_name=f"evaluate · array {array_id} · {tasks}")(wait)

    try:
        outcomes = run_array(executor, work, requests, execution, name=name, watch=watch)
    except ExecutionError as exc:
        raise ValueError(str(exc)) from None
    rows, failed, stores = [], [], {}
    for request, outcome in zip(requests, outcomes, strict=True):
        row = {"run": request.run_id, "checkpoint": request.checkpoint, "suite": request.suite,
               "job": outcome.job_id, "outcome": outcome.result or "failed"}  # fmt: skip
        if outcome.error is not None:
            failed.append(f"{request.describe()} (job {outcome.job_id}): {outcome.error}")
        else:
            if request.store_url not in stores:
                stores[request.store_url] = open_store(request.store_url)
            record = stores[request.store_url].evaluation(request.run_id, request.checkpoint, request.suite)
            assert record is not None  # the item returned: its evaluation is committed
            row.update(mean=record["mean"], stderr=record["stderr"], k=record["k"])
        rows.append(row)
    if rows:
        create_table_artifact(rows, key=artifact_key(name, "evaluations"), description=f"{name}: evaluations")
    counts = {
        "evaluated": sum(row["outcome"] == "evaluated" for row in rows),
        "exists": sum(row["outcome"] == "exists" for row in rows),
        "failed": len(failed),
    }
    logger.info(", ".join(f"{value} {key}" for key, value in counts.items()))
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} evaluations failed (the next one retries them):\n"
                           + "\n".join(failed))  # fmt: skip
    return counts


def _missing_site_setting(store: str | None, executor: ArrayExecutorName, profile: str | None) -> list[str]:
    """What an evaluation deployment lacks before it can start (the site's settings fill these)."""
    problems = [] if store else ["no store given: set the store parameter (or the site's store)"]
    if executor_for(executor, arrays=True).needs_profile and not profile:
        problems.append(f"executor {executor} needs a profile: set the profile parameter (or the site's)")
    return problems


@flow(name="evaluate", flow_run_name="evaluate {run_id}", log_prints=True)
def evaluate(
    run_id: str,
    store: str | None = None,
    checkpoints: list[int] | None = None,
    suites: Sequence[str] = DEFAULT_SUITES,
    executor: ArrayExecutorName = "inline",
    profile: str | None = None,
) -> dict[str, Any] | State:
    """Evaluate checkpoints of one run on chosen suites — only the pairs not evaluated yet.

    Args:
        run_id: The run whose checkpoints to evaluate.
        store: The store that holds it (s3://bucket/prefix or a folder); the site's by default.
        checkpoints: The updates whose checkpoints to evaluate; empty: all of them.
        suites: `heldout` (the run's own eval split) or benchmark names, for maths runs.
        executor: inline (the worker's process), local (a subprocess each) or slurm (one job array).
        profile: The execution profile (a YAML path on the worker's machine) whose `evaluate` resources the
            jobs get; needed by slurm.
    """
    if problems := _missing_site_setting(store, executor, profile):
        return refused(f"evaluate {run_id}", problems)
    chosen = check_suites(suites)
    opened = open_store(store)
    opened.read_run(run_id)  # an unknown run fails here, naming the store
    requests = missing(opened, chosen, runs=[run_id], only=checkpoints)
    return _evaluate(requests, executor, profile, f"evaluate-{run_id}")


@flow(name="nightly-eval", flow_run_name="nightly-eval", log_prints=True)
def nightly_eval(
    store: str | None = None,
    suites: Sequence[str] = DEFAULT_SUITES,
    executor: ArrayExecutorName = "slurm",
    profile: str | None = None,
) -> dict[str, Any] | State:
    """Evaluate every checkpoint of every run in a store that lacks an evaluation on the suites, as one job
    array (split to the cluster's MaxArraySize); what is there already is never done again.

    Args:
        store: The team's store (s3://bucket/prefix or a shared folder); the site's by default, and the
            flow refuses to start without one.
        suites: `heldout` (each run's own eval split) or benchmark names, for maths runs.
        executor: slurm (job arrays), local (a subprocess each) or inline (the worker's process).
        profile: The execution profile (a YAML path on the worker's machine) whose `evaluate` resources the
            array tasks get; needed by slurm.
    """
    if problems := _missing_site_setting(store, executor, profile):
        return refused("nightly-eval", problems)
    requests = missing(open_store(store), check_suites(suites))
    return _evaluate(requests, executor, profile, "nightly-eval")
