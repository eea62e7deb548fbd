"""The `probepo` command (typer): the face of the suite. The CLI modules (probepo/cli/) are
the only ones of probepo/ that may import flows/ and slurm/, and a command that needs no Prefect imports
none: `train`, `resume` and `launch` are probepo/cli/train.py's, `check` and `stage` probepo/cli/site.py's,
`jobs`, `logs` and `report` probepo/cli/runs.py's, `store` probepo/store/cli.py's; `demo` is here.

Conventions every command keeps: an error is one line on stderr starting `error:` (exit 2) that names what
failed (the option, field, file, store URL or run) and what to do, with advice that names an option the
command really has; a preemption exits 75 after committing; status lines come after the checks pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from probepo.cli.runs import fail, jobs, logs, report
from probepo.cli.site import check, stage
from probepo.cli.train import launch, resume, train
from probepo.config import RunConfig
from probepo.presets import load_run_config, with_overrides
from probepo.store import StoreError
from probepo.store.cli import StoreOption, store_app, store_url

# One torch thread per process: measured 3-25x faster than two on these small models under load. Set
# before torch is imported (it reads the variable once); export OMP_NUM_THREADS to choose otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")

app = typer.Typer(
    help="ProbePO: RL training job suite for LLM reasoning on shared GPU clusters.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
app.add_typer(store_app, name="store")
app.command("check")(check)
app.command("stage")(stage)
for command in (jobs, logs, report, train, launch, resume):
    app.command()(command)

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


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
    try:
        run_config = load_run_config(config, {"seed": seed}, blame={"seed": "--seed"})
        run_config = with_overrides(run_config, store=store_url(store, run_config.store))
        report = _demo_report(run_config, outdir)
    except (OSError, ValueError, StoreError, RuntimeError) as exc:
        raise fail(str(exc)) from None
    typer.echo(f"report: {report}")


def _demo_report(config: RunConfig, outdir: Path) -> str:
    """The demo flow in this process (PREFECT_API_URL's server, else a temporary one Prefect starts), or,
    where Prefect is not installed (no `flows` extra), the same steps without it."""
    try:
        from flows.demo import demo as demo_flow
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("prefect"):
            raise
        from probepo.run.demo import run_demo

        return str(run_demo(config, outdir))
    state = demo_flow(config, str(outdir), return_state=True)
    if not state.is_completed():
        raise RuntimeError(f"the demo flow ended {state.name}: {state.message}")
    return state.result()


def main() -> None:
    app()
