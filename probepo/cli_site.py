"""The commands that prepare a site: `probepo check` (what a job would discover hours into an allocation,
verified in seconds on the login node; slurm/check.py does the checking) and `probepo stage` (what a
recipe reads, put in one folder for compute nodes without internet; probepo/staging.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from probepo.presets import ConfigError, preset_fields


def check(
    config: Annotated[Path, typer.Argument(metavar="RECIPE", help="A YAML preset of RunConfig fields.")],
    profile: Annotated[
        Path | None, typer.Option("--profile", help="The execution profile the run's jobs would use.")
    ] = None,
    store: Annotated[
        str | None, typer.Option("--store", help="The store the run would use (default: the recipe's).")
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            help="inline, local, slurm or resident, as train would use; default: the site's (its site file),"
            " else inline for the testbed or where no SLURM is installed, else resident.",
        ),
    ] = None,
    probe_job: Annotated[
        bool,
        typer.Option(
            "--probe-job",
            metavar="",
            help="Also submit a short job with the trainer's resources that imports what the recipe needs in"
            " the job's own interpreter and reports versions and visible GPUs.",
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
        if executor is None:
            executor, why = default_executor(fields)
            typer.echo(f"executor: {executor} ({why}; --executor chooses another)")
    except ConfigError as exc:
        typer.echo(f"FAIL {exc}")
        raise typer.Exit(2) from None
    checked = check_launch(
        fields,
        executor,
        str(profile) if profile else None,
        store=store,
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


def default_executor(fields: dict[str, Any]) -> tuple[str, str]:
    """The executor a run of the recipe `fields` would take, and why: the site file's, else inline for the
    testbed (it needs no cluster) or where this machine has no SLURM, else resident (the scale path: one
    job runs every stage, its engines resident). Raises ConfigError for a site file that does not read."""
    from flows.deployments import load_site, site_file

    named = site_file()
    if named is not None:
        return load_site(named)[0].executor, f"the site's, {named}"
    if fields.get("model", {}).get("kind", "testbed") == "testbed":
        return "inline", "the testbed runs in this process"
    if shutil.which("sbatch") is None:
        return "inline", "no SLURM on this machine (sbatch is not on PATH)"
    return "resident", "a cluster recipe: one job runs every stage, its engines resident"


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
