"""The `probepo` command (typer): the face of the suite; the one module of probepo/ that may launch flows."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from probepo import __version__
from probepo.config import RunConfig
from probepo.preemption import PREEMPTED_EXIT, Preempted
from probepo.presets import ConfigError, load_run_config, validate_run_config
from probepo.store import StoreError, open_store
from probepo.store.cli import StoreOption, store_app, store_url

# One torch thread per process: measured 3-25x faster than two on these small models under load. Set
# before torch is imported (it reads the variable once); export OMP_NUM_THREADS to choose otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if TYPE_CHECKING:
    from probepo.pipeline import ProgressFn

app = typer.Typer(
    help="ProbePO: RL training job suite for LLM reasoning on shared GPU clusters.", no_args_is_help=True
)
app.add_typer(store_app, name="store")

TensorboardOption = Annotated[
    Path | None,
    typer.Option("--tensorboard", help="Write TensorBoard events here (default: out/tensorboard/RUN_ID)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No per-stage lines.")]

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _parse_sets(pairs: list[str]) -> dict[str, Any]:
    """`--set a.b=value` pairs; values are read as YAML scalars (numbers, booleans, strings)."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _fail(f"--set {pair!r}: expected FIELD=VALUE, e.g. --set algo.kappa=0")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _progress_printer(quiet: bool) -> ProgressFn | None:
    if quiet:
        return None
    started = time.perf_counter()

    def show(update: int, stage: str, summary: dict[str, Any]) -> None:
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items() if k != "history"}
        typer.echo(f"[{time.perf_counter() - started:7.1f}s] update {update:4d} {stage:<9} {shown}")

    return show


def _train(config: RunConfig, run_id: str, store: str | None, tensorboard: Path | None, quiet: bool) -> None:
    from probepo.pipeline import resume_point  # torch loads here, not for --help
    from probepo.pipeline import train as run_training

    try:
        opened = open_store(store or os.environ.get("PROBEPO_STORE") or config.store)
        start = resume_point(opened, run_id, config)
        if start.done:
            typer.echo(f"run {run_id} is complete in {opened.url}")
        elif opened.updates(run_id):  # the run has commits: say where it picks up
            partial = f", partial progress {', '.join(start.partials)}" if start.partials else ""
            typer.echo(f"resuming run {run_id} at update {start.update}, stage {start.stage}{partial}")
        metrics = run_training(
            config,
            run_id,
            store=opened,
            progress=_progress_printer(quiet),
            tensorboard_dir=tensorboard or Path("out") / "tensorboard" / run_id,
        )
    except (StoreError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except Preempted as exc:
        typer.echo(f"preempted: {exc}; resume with `probepo resume {run_id}`", err=True)
        raise typer.Exit(PREEMPTED_EXIT) from None
    evals = [m for m in metrics if "evaluate/accuracy" in m]
    if evals:
        first, last = evals[0]["evaluate/accuracy"], evals[-1]["evaluate/accuracy"]
        typer.echo(
            f"run {run_id}: eval accuracy {100 * first:.1f}% -> {100 * last:.1f}% ({len(evals)} evaluations)"
        )


@app.command()
def train(
    config: Annotated[
        Path, typer.Argument(help="A YAML preset of RunConfig fields, e.g. configs/cpu-demo.yaml.")
    ],
    run_id: Annotated[str, typer.Option("--run-id", help="Run id; the same id again resumes the run.")],
    algo: Annotated[
        str | None, typer.Option("--algo", help="Override algo.algorithm: grpo|probepo|vineppo.")
    ] = None,
    updates: Annotated[int | None, typer.Option("--updates", help="Override num_updates.")] = None,
    sets: Annotated[list[str], typer.Option("--set", help="Override any field: --set algo.kappa=0.")] = [],  # noqa: B006
    store: StoreOption = None,
    tensorboard: TensorboardOption = None,
    quiet: QuietOption = False,
) -> None:
    """Train (or resume) a run from a preset: every stage of every update is committed to the store."""
    overrides = _parse_sets(sets)
    if algo is not None:
        overrides["algo.algorithm"] = algo
    if updates is not None:
        overrides["num_updates"] = updates
    try:
        run_config = load_run_config(config, **overrides)
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from None
    _train(run_config, run_id, store, tensorboard, quiet)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    store: StoreOption = None,
    tensorboard: TensorboardOption = None,
    quiet: QuietOption = False,
) -> None:
    """Continue a run from what the store holds (its frozen config): committed stages are skipped."""
    try:
        record = open_store(store_url(store)).read_run(run_id)
    except StoreError as exc:
        raise _fail(str(exc)) from None
    made_by = record.get("code_version", "an unknown version")
    try:
        config = validate_run_config(record["config"], f"run {run_id}: its stored recipe")
    except ConfigError as exc:
        raise _fail(
            f"{exc}\nthis probepo ({__version__}) cannot resume a recipe made by probepo {made_by}: resume it"
            " with that version, or start a new run id from a preset"
        ) from None
    _train(config, run_id, store, tensorboard, quiet)


@app.command()
def demo(
    outdir: Annotated[Path, typer.Option("--out", help="Where the report, plot and logs go.")] = Path(
        "out/demo"
    ),
    config: Annotated[Path, typer.Option("--config", help="The preset both arms use.")] = PRESET_DIR
    / "cpu-demo.yaml",
    store: StoreOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Run seed of both arms.")] = 0,
) -> None:
    """The CPU testbed end to end: warm-up (or reuse), then GRPO and ProbePO side by side, then a report."""
    from probepo.demo import run_demo

    try:
        store = store or os.environ.get("PROBEPO_STORE")
        run_config = load_run_config(config, seed=seed, **({"store": store} if store else {}))
        report = run_demo(run_config, config, outdir)
    except (OSError, ValueError, StoreError, RuntimeError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"report: {report}")


@app.command()
def report(
    run_ids: Annotated[list[str], typer.Argument(help="One or several run ids.")],
    outdir: Annotated[Path, typer.Option("--out", help="Where report.md and curves.png go.")] = Path(
        "out/report"
    ),
    store: StoreOption = None,
) -> None:
    """Plots and a markdown comparison of runs, from their metrics in the store."""
    from probepo.report import write_report

    try:
        path = write_report(open_store(store_url(store)), run_ids, outdir)
    except StoreError as exc:
        raise _fail(str(exc)) from None
    typer.echo(path.read_text())
    typer.echo(f"written: {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
