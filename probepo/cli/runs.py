"""The commands that look at a run's jobs and results: `probepo jobs` (each job, its state and what it
cost), `probepo logs` (a job's stdout and stderr) and `probepo report` (runs compared, accuracy against
tokens, wall time and GPU-hours)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from probepo.presets import ConfigError
from probepo.store import StoreError, open_store
from probepo.store.cli import StoreOption, store_url


def fail(message: str, code: int = 2) -> typer.Exit:
    """A known failure: one `error:` line on stderr, and the exit to raise (code 2: the user's to fix)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def jobs(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run whose stage jobs to list.")],
    store: StoreOption = None,
) -> None:
    """Each stage's jobs: job id, executor, state, node, elapsed time, GPU-hours and CPU-hours (SLURM's
    accounting, every run of a requeued job), the stage's attempts and log; then totals per stage and for
    the run (an inline run: its stages' wall time only)."""
    from slurm.costs import accounted, attribute, costs_table
    from slurm.tables import jobs_table

    try:
        opened = open_store(store_url(store))
        opened.read_run(run_id)
        records = opened.jobs(run_id)
        attempts = opened.attempts(run_id)
        metrics = opened.read_metrics(run_id)
    except (StoreError, ConfigError) as exc:
        raise fail(str(exc)) from None
    per_job = accounted(records)
    costs = attribute(run_id, records, per_job, attempts, metrics)
    listing = (
        jobs_table(records, attempts, per_job)
        if records
        else f"run {run_id} has no stage jobs (it ran inline)"
    )
    typer.echo(f"{listing}\n\n{costs_table(costs)}")


def logs(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run whose job's logs to print.")],
    update: Annotated[
        int | None, typer.Option("--update", help="The job of this update (its last one, or --stage's).")
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage",
            help="The last job of this stage (`driver`: the resident executor's job); see --update.",
        ),
    ] = None,
    store: StoreOption = None,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="Print only the last N lines of each file.")
    ] = None,
    task: Annotated[
        int | None, typer.Option("--task", min=0, help="Only this task's files (default: every task's).")
    ] = None,
) -> None:
    """The stdout and stderr of a run's job (default: the last one submitted), each file under a header
    naming its path; `probepo jobs RUN` lists the jobs."""
    from slurm import logs as job_logs

    try:
        opened = open_store(store_url(store))
        opened.read_run(run_id)
        records = opened.jobs(run_id)
    except (StoreError, ConfigError) as exc:
        raise fail(str(exc)) from None
    if not records:
        raise fail(
            f"run {run_id} has no stage jobs: it ran inline, and its stages logged to the output of the"
            " command that trained it (jobs come with --executor local, slurm or resident)"
        )
    record = job_logs.pick_job(records, update, stage)
    if record is None:
        asked = " ".join(
            f"{name} {value}"
            for name, value in (("--update", update), ("--stage", stage))
            if value is not None
        )
        raise fail(
            f"run {run_id} has no job for {asked}; its stages with jobs: {job_logs.stages_with_jobs(records)}"
        )
    tasks = job_logs.task_count(record)
    if task is not None and task >= tasks:
        has = "only task 0" if tasks == 1 else f"tasks 0-{tasks - 1}"
        raise fail(f"--task {task}: {job_logs.describe(record)} has {has}")
    typer.echo(job_logs.render(record, tail=tail, task=task))


def report(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN...", help="One or several run ids.")],
    outdir: Annotated[Path, typer.Option("--out", help="Where report.md and curves.png go.")] = Path(
        "out/report"
    ),
    store: StoreOption = None,
) -> None:
    """Plots and a markdown comparison of runs, from their metrics in the store, with what each cost in
    GPU-hours (SLURM's accounting of its jobs; an inline run: wall time only)."""
    from probepo.report.summary import write_report
    from slurm.costs import run_costs

    try:
        opened = open_store(store_url(store))
        costs = {run_id: run_costs(opened, run_id) for run_id in run_ids}
        path = write_report(opened, run_ids, outdir, costs=costs)
    except (StoreError, ConfigError) as exc:
        raise fail(str(exc)) from None
    typer.echo(path.read_text())
    typer.echo(f"written: {path}")
