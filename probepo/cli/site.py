"""The commands that prepare a site: `probepo check` (what a job would discover hours into an allocation,
verified in seconds on the login node; slurm/check.py does the checking) and `probepo stage` (what a
recipe reads, put in one folder for compute nodes without internet; probepo/staging.py); and the one rule
by which `check`, `train`, `resume` and `launch` take their executor and profile (`run_execution`).
Nothing here imports Prefect."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from probepo.config.site import site_file
from probepo.presets import ConfigError, load_site_file, preset_fields
from probepo.store.cli import DEFAULT_STORE_URL, StoreOption, store_url

ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor",
        help="Where each stage runs: inline (this process), local (a subprocess per stage, submitit's"
        " LocalExecutor), slurm (a SLURM job per stage) or resident (one SLURM job runs the driver and every"
        " stage, engines resident: what checkpoint_every > 1 needs). Default, the same for check, train,"
        " resume and launch: the site file's ($PROBEPO_SITE, else site.yaml in the checkout), else inline"
        " for the testbed or where sbatch is not on PATH, else resident; the command says which it took.",
    ),
]
ProfileOption = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        help="Execution profile (YAML): per-stage SLURM resources, job folder, environment allow-list;"
        " not part of the run's recipe (configs/profiles/ has examples). Default: the site file's, if any.",
    ),
]


@dataclass(frozen=True)
class Execution:
    """The executor and profile a command runs a recipe with."""

    executor: str
    profile: str | None
    notes: tuple[str, ...] = ()
    """A line for each of them taken by default, saying which and why."""


def run_execution(
    testbed: bool, executor: str | None, profile: Path | None, checkpoint_every: int = 1
) -> Execution:
    """The executor and profile of a run, the one rule of `check`, `train`, `resume` and `launch` (and of the
    deployments' forms: slurm.executors.executor_that_runs): those given, else the site file's
    (probepo/config/site.py; resident where the site's executor cannot keep the engines a recipe's
    `checkpoint_every` > 1 needs), else no profile and, for the executor, inline for a `testbed` recipe (it
    needs no cluster) or where this machine has no SLURM, else resident (the scale path: one job runs every
    stage, its engines resident). Raises ConfigError for a site file that does not read."""
    from slurm.executors import executor_that_runs  # the registry's rule, read only with a site file

    named = site_file()
    site = load_site_file(named) if named is not None else None
    notes = []
    if executor is None:
        if site is not None:
            executor = executor_that_runs(site.executor, checkpoint_every)
            kept = executor == site.executor
            why = f"the site's, {named}" + ("" if kept else f"; {site.executor} keeps no engines resident")
        elif testbed:
            executor, why = "inline", "the testbed runs in this process"
        elif shutil.which("sbatch") is None:
            executor, why = "inline", "no SLURM on this machine (sbatch is not on PATH)"
        else:
            executor, why = "resident", "a cluster recipe: one job runs every stage, its engines resident"
        notes.append(f"executor: {executor} ({why}; --executor chooses another)")
    if profile is None and site is not None and site.profile is not None:
        notes.append(f"profile: {site.profile} (the site's, {named}; --profile chooses another)")
        return Execution(executor, site.profile, tuple(notes))
    return Execution(executor, str(profile) if profile else None, tuple(notes))


def _checkpoint_every(fields: dict[str, Any]) -> int:
    """A recipe's `checkpoint_every`, not yet validated (1 where it is not a whole number: the recipe's
    check then says what is wrong with it)."""
    value = fields.get("checkpoint_every", 1)
    return value if isinstance(value, int) else 1


def _is_testbed(fields: dict[str, Any]) -> bool:
    """Whether a recipe's fields, not yet validated, name the testbed model (the default kind)."""
    model = fields.get("model") or {}
    return not isinstance(model, dict) or model.get("kind", "testbed") == "testbed"


def check(
    config: Annotated[Path, typer.Argument(metavar="RECIPE", help="A YAML preset of RunConfig fields.")],
    profile: ProfileOption = None,
    store: StoreOption = None,
    executor: ExecutorOption = None,
    probe_job: Annotated[
        bool,
        typer.Option(
            "--probe-job",
            metavar="",
            help="Also submit a short job with the trainer's resources that imports what the recipe needs in"
            " the job's own interpreter, reaches the store with the job's credentials and reports versions,"
            " GPUs, memory and $TMPDIR's free space.",
        ),
    ] = False,
) -> None:
    """Check a recipe, its execution profile, the executor's cluster and the store before an allocation:
    the recipe's rules, the model's files and memory, the data, the store's conditional writes, partitions,
    accounts, QOS, time limits, GPUs, the job folder and what preemption sends. Prints every finding; exits
    2 if anything fails."""
    from slurm.check import check_launch

    try:
        fields = preset_fields(config)
        execution = run_execution(_is_testbed(fields), executor, profile, _checkpoint_every(fields))
        checked_store = store_url(store, fields.get("store", DEFAULT_STORE_URL))
    except ConfigError as exc:
        typer.echo(f"FAIL {exc}")
        raise typer.Exit(2) from None
    for note in execution.notes:
        typer.echo(note)
    checked = check_launch(
        fields,
        execution.executor,
        execution.profile,
        store=checked_store,
        probe_job=probe_job,
        source=str(config),
    )
    found = checked.findings
    for line in found.passed:
        typer.echo(f"ok   {line}")
    for line in found.warnings:
        typer.echo(f"WARN {line}")
    for line in found.failures:
        typer.echo(f"FAIL {line}")
    verdict = "refused" if found.failures else "ready"
    typer.echo(f"{verdict}: {len(found.failures)} failure(s), {len(found.warnings)} warning(s)")
    if found.failures:
        raise typer.Exit(2)


def stage(
    config: Annotated[Path, typer.Argument(metavar="RECIPE", help="A YAML preset of RunConfig fields.")],
    to: Annotated[Path, typer.Option("--to", help="The folder to stage into (on a shared file system).")],
) -> None:
    """Stage a recipe's model and benchmark sets into one folder, with a recipe that points there and a
    manifest (sizes, sha256), for compute nodes without internet. Run where the hub is reachable, or with
    HF_HUB_OFFLINE=1 from the local Hugging Face cache."""
    from probepo.presets import load_run_config
    from probepo.staging import StagingError
    from probepo.staging import stage as stage_recipe

    try:
        staged = stage_recipe(load_run_config(config), to)
    except (ConfigError, StagingError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for line in staged.sources:
        typer.echo(f"staged {line}")
    size = sum(file["bytes"] for file in staged.files)
    typer.echo(f"{len(staged.files)} files, {size / 1e6:.1f} MB, listed in {staged.folder / 'manifest.json'}")
    typer.echo(f"next: probepo check {staged.recipe} --profile PROFILE")
