"""The `evaluate` and `nightly_eval` flows: checkpoints evaluated after the fact (probepo/run/evaluations.py),
every missing (checkpoint, suite) pair of the selection one task of a SLURM job array (split to
MaxArraySize, one GPU each, at most `max_parallel` at once), each result committed create-only beside its
run, so a second night — or a run started while another is going — does nothing twice. A pair the run's own
evaluate stage made already is taken from it, in the flow's process. Neither takes a run's lease: they only
read checkpoints, and download weights without the optimizer state.

A task makes its samples shard by shard (the recipe's engine calls), keeping each beside the run; preempted
or warned of its time limit, it abandons the shard in flight at once and requeues itself (slurm/job.py:
AbandoningStop), and whichever run of it comes next, that night or the next, makes only the missing
shards: the same numbers as an uninterrupted task.

What the UI shows: a task run per job array (`evaluate · array <id> · <n> tasks`; inline, one per pair), a
table artifact listing every pair of the selection, each run's checkpoints in order, those evaluated on an
earlier night among them as reused (never evaluated again), saying of each whether it is complete, resumed
(completed from an earlier task's shards) or pending (the shards kept so far), with when it was committed
and the GPU-hours of every job that worked on it (earlier nights' too), an `avg6` row for each checkpoint
with all six benchmarks; its description says what the night cost, naming the executor (cost_line). The
flow run fails (after committing every result that came) when a pair could not be evaluated, naming it
and its job; the next night goes on with exactly those.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, cast

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from prefect.states import State
from pydantic import Field

from flows.artifacts import artifact_key, refused
from flows.runner import stage_task
from probepo.config import CheckpointSelection, ExecutionProfile
from probepo.errors import ExecutionError
from probepo.presets import ConfigError, load_profile
from probepo.report.live import rounded, significant
from probepo.run.evaluations import (
    EvaluationRequest,
    adopt_run_evaluation,
    check_suites,
    evaluate_checkpoint,
    missing,
)
from probepo.store import ArtifactStore, open_store
from slurm.accounting import JobCost
from slurm.arrays import ItemOutcome, job_costs, run_array
from slurm.executors import ArrayExecutorName, executor_for


@dataclass(frozen=True)
class Selected:
    """The (checkpoint, suite) pairs a selection takes: those still to evaluate (`missing`'s: from the
    run's own evaluate stage where it made them, else to be made) and those evaluated before (an earlier
    night's, a concurrent flow's), which the table lists too, as reused."""

    missing: list[EvaluationRequest]
    earlier: list[EvaluationRequest]


class _WithoutEvaluations:
    """A store as `missing` reads it, without its evaluations: `missing` then lists every pair of the
    selection, those evaluated before included (`selected` splits them)."""

    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def evaluations(self, run_id: str) -> dict[tuple[int, str], dict[str, Any]]:
        return {}


def selected(store: ArtifactStore, suites: Sequence[str] | None, selection: CheckpointSelection) -> Selected:
    """Every pair of `selection` on `suites` (None: each run's own), as `missing` chooses them, split by
    whether the store holds its evaluation already."""
    every = missing(cast(ArtifactStore, _WithoutEvaluations(store)), suites, selection)
    held = {run_id: set(store.evaluations(run_id)) for run_id in dict.fromkeys(r.run_id for r in every)}
    return split_evaluated(every, held)


def split_evaluated(
    every: list[EvaluationRequest], held: Mapping[str, Collection[tuple[int, str]]]
) -> Selected:
    """`every` pair of a selection split by `held` (each run's evaluated (checkpoint, suite) pairs)."""
    done = [(request.checkpoint, request.suite) in held.get(request.run_id, ()) for request in every]
    return Selected(
        missing=[request for request, was in zip(every, done, strict=True) if not was],
        earlier=[request for request, was in zip(every, done, strict=True) if was],
    )


def counted(count: int, noun: str) -> str:
    """`1 job`, `3 jobs`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _evaluate(
    pairs: Selected,
    executor: ArrayExecutorName,
    profile: str | None,
    name: str,
    max_parallel: int | None = None,
) -> dict[str, Any]:
    logger = get_run_logger()
    try:
        execution = load_profile(profile)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    reused = [request for request in pairs.missing if request.from_run]
    to_run = [request for request in pairs.missing if not request.from_run]
    logger.info(
        f"{counted(len(to_run), 'evaluation')} to do (executor {executor}), {len(reused)} taken from the"
        f" runs' own evaluate stage, {len(pairs.earlier)} evaluated before (both listed as reused)"
    )
    work: Callable[[EvaluationRequest, Callable[[], bool]], str] = evaluate_checkpoint
    in_process = executor_for(executor, arrays=True).in_process
    if in_process:  # one task run per pair, named after it

        def work(request: EvaluationRequest, should_stop: Callable[[], bool]) -> str:
            named = stage_task.with_options(task_run_name=f"evaluate · {request.describe()}")
            return named(lambda: evaluate_checkpoint(request, should_stop))

    def watch(array_id: str, count: int, wait: Callable[[], None]) -> None:
        stage_task.with_options(task_run_name=f"evaluate · array {array_id} · {counted(count, 'task')}")(wait)

    try:
        outcomes = [ItemOutcome(index, None, "reused") for index, _ in enumerate(pairs.earlier)]
        outcomes += [
            ItemOutcome(index, None, adopt_run_evaluation(request)) for index, request in enumerate(reused)
        ]
        outcomes += run_array(
            executor, work, to_run, execution, name=name, parallelism=max_parallel, watch=watch
        )
    except ExecutionError as exc:
        raise ValueError(str(exc)) from None
    requests = [*pairs.earlier, *reused, *to_run]
    stores = {url: open_store(url) for url in dict.fromkeys(request.store_url for request in requests)}
    # each run's checkpoints in order, an earlier night's among tonight's (a stable sort keeps the suites')
    done = sorted(zip(requests, outcomes, strict=True), key=lambda pair: (pair[0].run_id, pair[0].checkpoint))
    rows = [evaluation_row(request, outcome, stores[request.store_url]) for request, outcome in done]
    spent = _count_gpu_hours(rows, outcomes, executor, execution, in_process)
    if rows:
        table = rows + avg6_rows([request for request, _ in done], stores)
        create_table_artifact(
            table, key=artifact_key(name, "evaluations"), description=f"{name}: evaluations; {spent}"
        )
    logger.info(f"cost: {spent}")
    counts = {
        outcome: sum(row["outcome"] == outcome for row in rows)
        for outcome in ("evaluated", "resumed", "reused", "exists")
    }
    failed = [f"{request.describe()} (job {outcome.job_id}): {outcome.error}"
              for request, outcome in done if outcome.error is not None]  # fmt: skip
    counts["failed"] = len(failed)
    logger.info(", ".join(f"{value} {key}" for key, value in counts.items()))
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} evaluations failed (the next one retries them):\n"
                           + "\n".join(failed))  # fmt: skip
    return counts


def evaluation_row(request: EvaluationRequest, outcome: ItemOutcome, store: ArtifactStore) -> dict[str, Any]:
    """The artifact's row of one (checkpoint, suite): its status (complete; resumed, with the shards an
    earlier task kept; pending, with the shards kept so far), tonight's job and every job that worked on
    the pair (`jobs`: earlier nights' too, whose GPU-hours `GPU-h` sums: gpu_hours), and its numbers."""
    row = {"run": request.run_id, "checkpoint": request.checkpoint, "suite": request.suite,
           "status": "complete", "outcome": outcome.result or "failed", "job": outcome.job_id, "jobs": [],
           "GPU-h": None}  # fmt: skip
    tonight = [outcome.job_id] if outcome.job_id else []  # recorded by the task too, unless it died early
    if outcome.error is not None:
        kept = len(store.evaluation_shard_names(request.run_id, request.checkpoint, request.suite))
        row["status"] = f"pending: {counted(kept, 'shard')} kept"
        recorded = store.evaluation_jobs(request.run_id, request.checkpoint, request.suite)
        row["jobs"] = list(dict.fromkeys([*recorded, *tonight]))
        return row
    record = store.evaluation(request.run_id, request.checkpoint, request.suite)
    assert record is not None  # the item returned: its evaluation is committed
    if record.get("resumed_shards"):
        row["status"] = f"resumed: {record['resumed_shards']} of {record['shards']} shards kept before"
    row["jobs"] = list(dict.fromkeys([*record.get("jobs", []), *tonight]))
    numbers = {"mean": rounded(record["mean"]), "stderr": rounded(record["stderr"]), "k": record["k"]}
    return {**row, **numbers, "committed": record["at"]}


def _count_gpu_hours(
    rows: list[dict[str, Any]],
    outcomes: list[ItemOutcome],
    executor: str,
    profile: ExecutionProfile,
    in_process: bool,
) -> str:
    """Fill each row's GPU-h from accounting (tonight's jobs as run_array found them, earlier nights' asked
    for now); returns tonight's cost in words (cost_line)."""
    tonight = {outcome.job_id: outcome.cost for outcome in outcomes if outcome.job_id and outcome.cost}
    earlier = {job for row in rows for job in row["jobs"]} - set(tonight)
    costs = {**job_costs(executor, profile, sorted(earlier)), **tonight}
    for row in rows:
        row["GPU-h"] = gpu_hours(row["jobs"], costs)
    jobs = {outcome.job_id for outcome in outcomes if outcome.job_id}
    return cost_line(executor, in_process, len(jobs), tonight)


def cost_line(executor: str, in_process: bool, jobs: int, tonight: Mapping[str, JobCost]) -> str:
    """What tonight cost, naming the executor: accounting's GPU- and CPU-hours of `tonight`'s jobs (of the
    `jobs` submitted), or why there are none."""
    said = f"executor {executor}"
    if tonight:
        gpu, cpu = (
            significant(sum(getattr(c, unit) for c in tonight.values()))
            for unit in ("gpu_hours", "cpu_hours")
        )
        return (
            f"{said}: tonight {gpu:g} GPU-hours, {cpu:g} CPU-hours over {counted(len(tonight), 'job')}"
            " (accounting); a pair's GPU-h counts every job that worked on it, earlier nights' too"
        )
    if jobs:
        return f"{said}: {counted(jobs, 'job')} tonight, none in its accounting (no GPU-hours)"
    if in_process:
        return f"{said}: no jobs, every pair in the worker's process (no GPU-hours)"
    return f"{said}: no job tonight, nothing left to evaluate (no GPU-hours)"


def gpu_hours(jobs: list[str], costs: Mapping[str, JobCost]) -> float | None:
    """What the jobs cost in GPU-hours, by accounting (None: it knows none of them: inline, local, taken)."""
    known = [costs[job].gpu_hours for job in jobs if job in costs]
    return significant(sum(known)) if known else None


def avg6_rows(requests: list[EvaluationRequest], stores: dict[str, ArtifactStore]) -> list[dict[str, Any]]:
    """An `avg6` row (the study's Avg-6, the unweighted mean of the six benchmarks' Mean@k) for each
    checkpoint of the night whose six evaluations are all committed, this night's or earlier ones."""
    from probepo.data.benchmarks import AVG6_BENCHMARKS, avg6

    found = []
    for url, run_id, checkpoint in dict.fromkeys((r.store_url, r.run_id, r.checkpoint) for r in requests):
        records = stores[url].evaluations(run_id)
        means = {s: records[(checkpoint, s)]["mean"] for s in AVG6_BENCHMARKS if (checkpoint, s) in records}
        if len(means) == len(AVG6_BENCHMARKS):
            found.append({"run": run_id, "checkpoint": checkpoint, "suite": "avg6", "status": "complete",
                          "mean": rounded(avg6(means))})  # fmt: skip
    return found


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
    suites: Sequence[str] | None = None,
    executor: ArrayExecutorName = "inline",
    profile: str | None = None,
) -> dict[str, Any] | State:
    """Evaluate checkpoints of one run on chosen suites — only the pairs not evaluated yet.

    Args:
        run_id: The run whose checkpoints to evaluate.
        store: The store that holds it (s3://bucket/prefix or a folder); the site's by default.
        checkpoints: The updates whose checkpoints to evaluate; empty: all of them.
        suites: `heldout` (the run's own eval split) or benchmark names, for maths runs; None (the
            default): those its recipe's evaluate stage scores (its `eval.benchmarks`, else `heldout`).
        executor: inline (the worker's process), local (a subprocess each) or slurm (one job array).
        profile: The execution profile (a YAML path on the worker's machine) whose `eval_task` resources
            the jobs get (by default the evaluate stage's with one GPU); needed by slurm.
    """
    if problems := _missing_site_setting(store, executor, profile):
        return refused(f"evaluate {run_id}", problems)
    chosen = check_suites(suites)
    opened = open_store(store)
    opened.read_run(run_id)  # an unknown run fails here, naming the store
    selection = CheckpointSelection(runs=(run_id,), updates=tuple(checkpoints or ()))
    return _evaluate(selected(opened, chosen, selection), executor, profile, f"evaluate-{run_id}")


def _nightly_run_name() -> str:
    """`nightly-eval <date>`: the night it was scheduled for (UTC), else the day it started."""
    when = flow_run.scheduled_start_time or datetime.now(UTC)
    return f"nightly-eval {when.astimezone(UTC):%Y-%m-%d}"


@flow(name="nightly-eval", flow_run_name=_nightly_run_name, log_prints=True)
def nightly_eval(
    store: str | None = None,
    suites: Sequence[str] | None = None,
    selection: CheckpointSelection = CheckpointSelection(),  # noqa: B008 - immutable (a frozen model)
    max_parallel: Annotated[int | None, Field(ge=1)] = None,
    executor: ArrayExecutorName = "slurm",
    profile: str | None = None,
) -> dict[str, Any] | State:
    """Evaluate the selected checkpoints of the store's runs that lack an evaluation on the suites, as job
    arrays (split to the cluster's MaxArraySize, one GPU per task); what is there already is never done
    again, and what a run's own evaluate stage made is taken from it.

    Args:
        store: The team's store (s3://bucket/prefix or a shared folder); the site's by default, and the
            flow refuses to start without one.
        suites: `heldout` (each run's own eval split: a maths run's eval set, each problem once) or
            benchmark names, for maths runs (the study's six: math500, olympiadbench, college_math, amc23,
            minerva_math, aime24); None (the default): each run's own recipe's, what its evaluate stage
            scores (a maths recipe's `eval.benchmarks` at the study's Mean@k, the testbed's `heldout`).
        selection: Which runs (names or globs) and which of their checkpoints (the latest, every N-th,
            those since a date); the nightly deployment opens on each run's latest, and with every filter
            cleared it takes every checkpoint of every run.
        max_parallel: At most this many evaluation tasks running at once over the night's arrays (sbatch
            --array=…%N), so that a night leaves GPUs to the team; None: as many as the scheduler gives.
        executor: slurm (job arrays), local (a subprocess each) or inline (the worker's process).
        profile: The execution profile (a YAML path on the worker's machine) whose `eval_task` resources
            the array tasks get (by default the evaluate stage's with one GPU); needed by slurm.
    """
    if problems := _missing_site_setting(store, executor, profile):
        return refused("nightly-eval", problems)
    pairs = selected(open_store(store), check_suites(suites), selection)
    get_run_logger().info(f"selection: {selection.describe()}")
    return _evaluate(pairs, executor, profile, "nightly-eval", max_parallel)
