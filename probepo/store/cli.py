"""`probepo store ls|verify|invalidate|gc`: inspect, re-check, repair and clean a run in the artifact store.

The store URL comes from `--store`, else the environment variable PROBEPO_STORE, else the site file's `store`,
else `./store` (`store_url`, every command alike).
Store errors print one line on stderr and exit with code 2; `verify` exits 1 when it finds corruption.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from probepo.config.retention import Retention
from probepo.store import ArtifactStore, LeaseHeld, Ledger, StoreError, open_store
from probepo.store.formats import format_bytes
from probepo.store.lease import take_lease
from probepo.store.maintenance import DEFAULT_GC_MIN_AGE_S
from probepo.store.retention import prune_parts, sweep_pruned

DEFAULT_STORE_URL = "./store"
GC_LEASE_TTL_S = 600.0

store_app = typer.Typer(
    help="Inspect, verify and garbage-collect runs in the artifact store.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Store URL (s3://bucket/prefix or a folder); default $PROBEPO_STORE, else the site file's"
        " `store` ($PROBEPO_SITE, else site.yaml in the checkout), else the preset's `store` (train, check,"
        f" demo), else {DEFAULT_STORE_URL}.",
    ),
]


def store_url(explicit: str | None, recipe: str = DEFAULT_STORE_URL) -> str:
    """The store URL to use, every command alike: the option, else $PROBEPO_STORE, else the site file's
    `store` (the team's, which its deployments put in every recipe, so that `probepo resume` finds a run the
    UI launched), else the recipe's `store` (for a command that reads a recipe), else ./store. Raises
    ConfigError for a site file that does not read."""
    from probepo.config.site import site_file
    from probepo.presets import load_site_file  # the presets' reader, read only where the site decides

    given = explicit or os.environ.get("PROBEPO_STORE")
    if given:
        return given
    named = site_file()
    return (load_site_file(named).store if named is not None else None) or recipe


@contextmanager
def _store(explicit: str | None) -> Iterator[ArtifactStore]:
    """Open the store; any store error becomes one line on stderr and exit code 2 (no traceback)."""
    from probepo.presets import ConfigError

    try:
        yield open_store(store_url(explicit))
    except (StoreError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _age(seconds: float) -> str:
    """A duration as people say it: 6.0 h, 15 min, 30 s."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


@store_app.command("ls")
def ls(
    run: Annotated[str | None, typer.Argument(help="Run id; without it, list the runs.")] = None,
    store: StoreOption = None,
) -> None:
    """Show what a run has committed: stages per update, latest checkpoint, lease, attempts."""
    with _store(store) as opened:
        if run is None:
            names = opened.runs()
            for name in names:
                typer.echo(name)
            if not names:
                typer.echo(f"store {opened.url} holds no runs")
            return
        typer.echo(Ledger(opened, run).summary())


@store_app.command("verify")
def verify(run: Annotated[str, typer.Argument(help="Run id.")], store: StoreOption = None) -> None:
    """Re-check the size and sha256 of every committed file of a run (streamed)."""
    with _store(store) as opened:
        report = opened.verify(run)
        for problem in report.problems:
            typer.echo(str(problem))
        typer.echo(
            f"checked {report.stages} stages, {report.files} files, {format_bytes(report.bytes)}: "
            f"{len(report.problems)} problem(s)"
        )
        if report.problems:
            raise typer.Exit(1)


@store_app.command("invalidate")
def invalidate(
    run: Annotated[str, typer.Argument(help="Run id.")],
    update: Annotated[int, typer.Argument(help="Update number.")],
    stage: Annotated[str, typer.Argument(help="Stage name, e.g. probe or checkpoint.")],
    store: StoreOption = None,
    force: Annotated[
        bool, typer.Option("--force", metavar="", help="Also a stage whose files all check out.")
    ] = False,
) -> None:
    """Set a corrupt stage aside (its marker goes to quarantine, nothing is deleted) so that resuming the
    run computes it again. Refuses a healthy stage unless --force."""
    with _store(store) as opened:
        record = opened.invalidate(run, update, stage, force=force)
        for problem in record["problems"]:
            typer.echo(problem)
        typer.echo(
            f"invalidated update {update} stage {stage} of {run}: `probepo resume {run}` recomputes it"
        )


@store_app.command("gc")
def gc(
    run: Annotated[str, typer.Argument(help="Run id.")],
    store: StoreOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", metavar="", help="List what would be removed.")
    ] = False,
    min_age: Annotated[
        float,
        typer.Option(
            "--min-age",
            help="Keep orphaned attempts younger than this many seconds (default 6 h: a writer"
            " may still be uploading them).",
        ),
    ] = DEFAULT_GC_MIN_AGE_S,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            metavar="",
            help="Take the run's lease even from a live holder (check it is dead first).",
        ),
    ] = False,
    checkpoints: Annotated[
        bool,
        typer.Option(
            "--checkpoints",
            metavar="",
            help="Also prune checkpoints as the profile's `retention` says (or --keep-optimizer and"
            " --weights-every): never the latest whole one, nor weights the nightly evaluation has still"
            " to read.",
        ),
    ] = False,
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="The execution profile whose `retention` --checkpoints applies."),
    ] = None,
    keep_optimizer: Annotated[
        int | None,
        typer.Option(
            "--keep-optimizer", min=1, help="Keep the optimizer state of the last N full checkpoints."
        ),
    ] = None,
    weights_every: Annotated[
        int | None,
        typer.Option(
            "--weights-every", min=1, help="Keep the weights of the checkpoints of every M-th update."
        ),
    ] = None,
    unevaluated: Annotated[
        bool,
        typer.Option(
            "--delete-unevaluated",
            metavar="",
            help="Delete weights even where the nightly evaluation has still to read them.",
        ),
    ] = False,
) -> None:
    """Remove attempt folders that no commit marker names (lost races, killed writers); with
    --checkpoints, prune the run's checkpoints too.

    Holds the run's lease meanwhile (except for a dry run), so it refuses while a driver works on the run.
    """
    retention = _retention(profile, keep_optimizer, weights_every, unevaluated) if checkpoints else None
    with _store(store) as opened:
        opened.read_run(run)
        if dry_run:
            report = opened.gc(run, min_age_s=min_age, dry_run=True)
            pruned = _prune_checkpoints(opened, run, retention, dry_run=True)
        else:
            holder = f"probepo-store-gc@{socket.gethostname()}:{os.getpid()}"
            try:
                lease = (
                    opened.acquire_lease(run, holder, GC_LEASE_TTL_S, force=True)
                    if force
                    else take_lease(opened, run, holder, GC_LEASE_TTL_S)
                )
            except LeaseHeld as exc:
                raise StoreError(f"{exc}; if that driver is dead, rerun with --force") from None
            with lease:
                report = opened.gc(run, min_age_s=min_age)
                pruned = _prune_checkpoints(opened, run, retention, dry_run=False)
        verb = "would remove" if dry_run else "removed"
        for line in pruned:
            typer.echo(line)
        for folder in report.removed:
            typer.echo(f"{verb} {folder}")
        kept = (
            f"; kept {len(report.kept_young)} younger than {_age(min_age)} (--min-age)"
            if report.kept_young
            else ""
        )
        typer.echo(f"{verb} {len(report.removed)} orphaned attempt(s), {format_bytes(report.bytes)}{kept}")


_HOLDS = {"weights": "weights kept, optimizer state deleted", "record": "weights and optimizer state deleted"}


def _retention(
    profile: Path | None, keep_optimizer: int | None, weights_every: int | None, unevaluated: bool
) -> Retention:
    """The retention --checkpoints applies: the profile's, with the options over it."""
    from probepo.presets import ConfigError, load_profile

    try:
        base = load_profile(profile).retention
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    given = {"optimizer_last": keep_optimizer, "weights_every": weights_every}
    retention = base.model_copy(update={key: value for key, value in given.items() if value is not None})
    if unevaluated:
        retention = retention.model_copy(update={"pending_evaluation": None})
    if retention.keeps_everything:
        typer.echo(
            "error: --checkpoints: the retention keeps every checkpoint whole; give --keep-optimizer N"
            " and/or --weights-every M, or a --profile whose `retention` sets them",
            err=True,
        )
        raise typer.Exit(2)
    return retention


def _prune_checkpoints(
    store: ArtifactStore, run: str, retention: Retention | None, *, dry_run: bool
) -> list[str]:
    """Apply `retention` (None: nothing) to the run's checkpoints; the lines that say what it did."""
    if retention is None:
        return []
    from probepo.run.evaluations import retain_checkpoints  # reads recipes and suites: loads torch

    report = retain_checkpoints(store, run, retention, dry_run=dry_run)
    verb = "would prune" if dry_run else "pruned"
    lines = [f"{verb} checkpoint {update}: {_HOLDS[held]}" for update, held in report.pruned.items()]
    parts = prune_parts(store, run, dry_run=dry_run)
    if parts.pruned:
        lines.append(
            f"{verb} the optimizer parts of {len(parts.pruned)} committed update(s),"
            f" {format_bytes(parts.freed_bytes)} freed"
        )
    swept = 0 if dry_run else sweep_pruned(store, run)
    lines.append(
        f"{verb} {len(report.pruned)} checkpoint(s), {format_bytes(report.freed_bytes)} freed;"
        f" {format_bytes(report.kept_bytes)} of checkpoints kept"
        + (f" ({swept} file(s) left by an interrupted prune deleted)" if swept else "")
    )
    return lines
