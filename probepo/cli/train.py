"""The commands that run a recipe: `probepo train` (a run from a preset; the same run id again resumes it),
`probepo resume` (a run from what its store holds) and `probepo launch` (a flow run of a Prefect train
deployment). Each takes its executor and profile by the one rule of `run_execution` (probepo/cli/site.py)
and its store by `store_url`, and runs the checks of `probepo check` first (`launchable`, slurm/check.py)
unless --no-check; Prefect is imported by `launch` alone, when it creates the flow run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer
import yaml

from probepo import __version__
from probepo.checks.findings import Refused
from probepo.cli.runs import fail
from probepo.cli.site import Execution, ExecutorOption, ProfileOption, run_execution
from probepo.config import ExecutionProfile, RunConfig
from probepo.config.algo import Algorithm
from probepo.errors import ExecutionError
from probepo.presets import ConfigError, load_run_config, validate_run_config, with_overrides
from probepo.run.preemption import PREEMPTED_EXIT, Preempted
from probepo.store import LeaseHeld, StoreError, open_store
from probepo.store.cli import StoreOption, store_url
from probepo.store.outage import RIDER, OutageBudget

if TYPE_CHECKING:
    from probepo.run.execution import StageRunner
    from probepo.run.pipeline import ProgressFn

TensorboardOption = Annotated[
    Path | None,
    typer.Option("--tensorboard", help="Write TensorBoard events here (default: out/tensorboard/RUN_ID)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", metavar="", help="No per-stage lines.")]
TakeOverOption = Annotated[
    bool,
    typer.Option(
        "--take-over",
        metavar="",
        help="Take the run's lease from the driver holding it. Only once that driver is known dead (a dead"
        " process of this host is taken over without it): a live one would lose the run at its next renewal.",
    ),
]
NoCheckOption = Annotated[
    bool,
    typer.Option(
        "--no-check",
        metavar="",
        help="Skip the checks `probepo check` makes before anything runs (model, data, store, the cluster's"
        " site; the recipe, profile and executor are still read): a problem they would name then shows"
        " when a stage meets it (for launch: when the flow run checks on its worker).",
    ),
]
AlgoOption = Annotated[
    str | None,
    # the names of the method table (probepo.methods), kept equal to the Literal by a test; the table
    # itself imports torch, which the CLI loads only when a command needs it
    typer.Option("--algo", help=f"Override algo.algorithm: {'|'.join(get_args(Algorithm))}."),
]
UpdatesOption = Annotated[int | None, typer.Option("--updates", help="Override num_updates.")]
SetsOption = Annotated[
    list[str],
    typer.Option(
        "--set", metavar="FIELD=VALUE", help="Override any field, e.g. --set algo.kappa=0 (repeatable)."
    ),
]


def _checked(
    config: RunConfig, executor: str | None, profile: Path | None, store: str, check: bool
) -> tuple[Execution, StageRunner, ExecutionProfile]:
    """The executor and profile of a run of `config` (`run_execution`; said where taken by default), its
    stage runner and profile (its checkpoint retention), after the checks `probepo check` makes on `store`
    (refused in one line, exit 2) or, with `check` off, which it says, only what the run needs to start."""
    from slurm.check import launchable

    try:
        chosen = run_execution(config.model.kind == "testbed", executor, profile, config.checkpoint_every)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    for note in chosen.notes:
        typer.echo(note, err=True)
    if not check:
        typer.echo("checks skipped (--no-check)", err=True)
    try:
        _, execution, runner, warnings = launchable(
            config, chosen.executor, chosen.profile, store=store, check=check
        )
    except Refused as exc:
        skip = ", --no-check skips them" if check else ""
        raise fail(f"refused: {exc}; `probepo check` lists every finding{skip}") from None
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    return chosen, runner, execution


def _failed(exc: ExecutionError | ConfigError | StoreError) -> typer.Exit:
    """A known failure as an `error:` line: exit 2 for a user's error (config, profile, store, the site,
    a refused submission), exit 1 for a stage that failed in its job (the message carries the end of the
    job's stderr, where its traceback is). Anything else is a bug: it propagates with its traceback."""
    user = not isinstance(exc, ExecutionError) or exc.user_error
    return fail(str(exc), 2 if user else 1)


def _parse_sets(pairs: list[str]) -> dict[str, Any]:
    """`--set a.b=value` pairs; values are read as YAML scalars (numbers, booleans, strings)."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise fail(f"--set {pair!r}: expected FIELD=VALUE, e.g. --set algo.kappa=0")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            overrides[key.strip()] = value  # not YAML: the field's validation says what it takes
    return overrides


class _Progress:
    """Prints a line per stage run, and one line for the committed stages a resume skips."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.perf_counter()
        self.skipped: list[int] = []

    def __call__(self, update: int, stage: str, summary: dict[str, Any], ran: bool) -> None:
        if not ran:
            self.skipped.append(update)
            return
        self.flush()
        if not self.quiet:
            shown = {
                k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items() if k != "history"
            }
            typer.echo(f"[{time.perf_counter() - self.started:7.1f}s] update {update:4d} {stage:<9} {shown}")

    def flush(self) -> None:
        if self.skipped and not self.quiet:
            first, last = self.skipped[0], self.skipped[-1]
            where = f"update {first}" if first == last else f"updates {first}-{last}"
            typer.echo(f"skipped {len(self.skipped)} committed stage(s) of {where}")
        self.skipped.clear()


def _preset_config(config: Path, algo: str | None, updates: int | None, sets: list[str]) -> RunConfig:
    """The preset with --set, --algo and --updates applied (the named options win, and say so)."""
    overrides = _parse_sets(sets)
    blame = {key: f"--set {key}" for key in overrides}
    for field, option, value in (("algo.algorithm", "--algo", algo), ("num_updates", "--updates", updates)):
        if value is None:
            continue
        if field in overrides and overrides[field] != value:
            typer.echo(f"note: {option} {value} wins over --set {field}={overrides[field]}", err=True)
        overrides[field], blame[field] = value, option
    try:
        return load_run_config(config, overrides, blame=blame)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _store_of(explicit: str | None, recipe: str) -> str:
    """`store_url`, a site file that does not read refused in one line."""
    try:
        return store_url(explicit, recipe)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _train(
    config: RunConfig,
    run_id: str,
    *,
    store: str,
    tensorboard: Path | None,
    quiet: bool,
    take_over: bool,
    command: str,
    runner: StageRunner,
    profile: ExecutionProfile,
) -> None:
    """Run the driver on `store` and turn every failure into one line; `command` is how the user resumes
    (advice). A lease held by a SLURM job that accounting shows ended is taken over at once
    (slurm.holders). An unreachable store is waited for up to the profile's store_outage_s, and while a
    job runs the stages this process waits for it whatever the outage lasts (slurm/runner.py)."""
    from probepo.run.pipeline import train as run_training  # torch loads here, not for --help
    from slurm.holders import holder_ended

    events = tensorboard or Path("out") / "tensorboard" / run_id
    progress: ProgressFn = _Progress(quiet)
    try:
        with RIDER.configured(OutageBudget(profile.store_outage_s)):
            opened = open_store(store)
            metrics = run_training(
                config,
                run_id,
                store=opened,
                progress=progress,
                say=typer.echo,
                tensorboard_dir=events,
                take_over=take_over,
                runner=runner,
                holder_ended=holder_ended,
                retention=profile.retention,
            )
    except LeaseHeld as exc:
        raise fail(f"{exc}; if that driver is dead, take the run over: {command} --take-over") from None
    except (StoreError, ConfigError, ExecutionError) as exc:
        raise _failed(exc) from None
    except Preempted as exc:
        typer.echo(f"preempted: {exc}; resume with `probepo resume {run_id}`", err=True)
        raise typer.Exit(PREEMPTED_EXIT) from None
    progress.flush()
    evals = [m for m in metrics if "evaluate/accuracy" in m]
    if evals:
        first, last = evals[0]["evaluate/accuracy"], evals[-1]["evaluate/accuracy"]
        typer.echo(
            f"run {run_id}: eval accuracy {100 * first:.1f}% -> {100 * last:.1f}% ({len(evals)} evaluations)"
        )
    typer.echo(f"store: {opened.url}; TensorBoard events: {events}; compare runs: probepo report {run_id}")


def train(
    config: Annotated[
        Path,
        typer.Argument(
            metavar="CONFIG", help="A YAML preset of RunConfig fields, e.g. configs/cpu-demo.yaml."
        ),
    ],
    run_id: Annotated[str, typer.Option("--run-id", help="Run id; the same id again resumes the run.")],
    algo: AlgoOption = None,
    updates: UpdatesOption = None,
    sets: SetsOption = [],  # noqa: B006
    store: StoreOption = None,
    tensorboard: TensorboardOption = None,
    quiet: QuietOption = False,
    take_over: TakeOverOption = False,
    executor: ExecutorOption = None,
    profile: ProfileOption = None,
    no_check: NoCheckOption = False,
) -> None:
    """Train (or resume) a run from a preset: every stage of every update is committed to the store, after
    the checks of `probepo check` (--no-check skips them)."""
    run_config = _preset_config(config, algo, updates, sets)
    store = _store_of(store, run_config.store)
    _, runner, execution = _checked(run_config, executor, profile, store, not no_check)
    _train(
        run_config,
        run_id,
        store=store,
        tensorboard=tensorboard,
        quiet=quiet,
        take_over=take_over,
        command=f"probepo train {config} --run-id {run_id}",
        runner=runner,
        profile=execution,
    )


def launch(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="A YAML preset of RunConfig fields.")],
    run_id: Annotated[str, typer.Option("--run-id", help="Run id; the same id again resumes the run.")],
    algo: AlgoOption = None,
    updates: UpdatesOption = None,
    sets: SetsOption = [],  # noqa: B006
    executor: ExecutorOption = None,
    profile: ProfileOption = None,
    deployment: Annotated[
        str | None,
        typer.Option(
            "--deployment",
            help="The Prefect deployment to run (flow/deployment); default: train/<the preset's name; a"
            " staged recipe.yaml: its folder's>, the deployment infra/prefect/deploy.sh makes for it (any"
            " train deployment runs the recipe given).",
        ),
    ] = None,
    no_check: NoCheckOption = False,
) -> None:
    """Create a flow run of a Prefect train deployment, as the UI's Run button does, and print its URL. The
    flow's checks run here first (the same one-line refusal; --no-check leaves them to the flow run); a
    worker of the deployment's pool runs it; PREFECT_API_URL names the server."""
    run_config = _preset_config(config, algo, updates, sets)
    # the flow run opens the store this machine's commands would (the site's, as the UI's form has it)
    run_config = with_overrides(run_config, store=_store_of(None, run_config.store))
    chosen, *_ = _checked(run_config, executor, profile, run_config.store, not no_check)
    from probepo.cli.launch import LaunchError, create_flow_run
    from probepo.staging import preset_name

    parameters = {"config": run_config.model_dump(mode="json"), "run_id": run_id, "executor": chosen.executor}
    if chosen.profile is not None:
        parameters["profile"] = str(Path(chosen.profile).resolve())
    try:
        typer.echo(create_flow_run(deployment or f"train/{preset_name(config)}", parameters))
    except LaunchError as exc:
        raise fail(str(exc)) from None


def resume(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run to continue.")],
    updates: Annotated[
        int | None,
        typer.Option(
            "--updates",
            help="Extend the run to this many updates (more than it has; recorded in the store). Nothing"
            " else of its recipe changes, and its first updates stay as they were.",
        ),
    ] = None,
    store: StoreOption = None,
    tensorboard: TensorboardOption = None,
    quiet: QuietOption = False,
    take_over: TakeOverOption = False,
    executor: ExecutorOption = None,
    profile: ProfileOption = None,
    no_check: NoCheckOption = False,
) -> None:
    """Continue a run from what the store holds (its frozen recipe): committed stages are skipped, and a
    stage's job still pending or running is waited for, not submitted again. The executor and profile may
    differ from the run's earlier ones: the bits do not. The checks of `probepo check` run first
    (--no-check skips them)."""
    from probepo.run.pipeline import extend_run, recorded_updates

    try:
        opened = open_store(store_url(store))
        record = opened.read_run(run_id)
    except (StoreError, ConfigError) as exc:
        raise _failed(exc) from None
    try:
        config = validate_run_config(record["config"], f"run {run_id}: its stored recipe")
    except ConfigError as exc:
        made_by = record.get("code_version", "an unknown version")
        raise fail(
            f"{exc}\nthis probepo ({__version__}) cannot resume a recipe made by probepo {made_by}:"
            " resume it with that version, or start a new run id from a preset"
        ) from None
    _, runner, execution = _checked(config, executor, profile, opened.url, not no_check)
    try:  # after the checks: a refused resume extends nothing
        if updates is not None and updates != recorded_updates(opened, run_id):
            extension = extend_run(opened, run_id, updates)
            typer.echo(f"run {run_id}: extended from {extension['from']} to {extension['to']} updates")
        config = with_overrides(config, num_updates=recorded_updates(opened, run_id))
    except (StoreError, ConfigError) as exc:
        raise _failed(exc) from None
    _train(
        config,
        run_id,
        store=opened.url,
        tensorboard=tensorboard,
        quiet=quiet,
        take_over=take_over,
        command=f"probepo resume {run_id}",
        runner=runner,
        profile=execution,
    )
