"""`probepo demo`: the CPU testbed end to end, GRPO and ProbePO side by side, then a report.

The warm-up runs (or is reused) first, in this process; then each arm trains in its own process
(`probepo train`, one torch thread each) while this one draws progress from the store's ledger. Run ids
derive from the preset's content, so running the demo again reuses (or resumes) the same runs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from probepo.config import RunConfig
from probepo.presets import with_overrides
from probepo.report.summary import load_curves, write_report
from probepo.run.pipeline import ensure_warmup
from probepo.run.schedule import Stage
from probepo.store import ArtifactStore, StoreError, open_store

ARMS = ("grpo", "probepo")
POLL_S = 1.0


def arm_run_id(config: RunConfig, algorithm: str) -> str:
    """A run id that names the arm and the recipe: the same preset maps to the same run."""
    recipe = config.recipe_json()
    return f"demo-{algorithm}-s{config.seed}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"


def arm_runs(config: RunConfig) -> dict[str, tuple[str, RunConfig]]:
    """Each arm of the demo: its run id and its config (the preset with the arm's algorithm)."""
    runs = {}
    for algorithm in ARMS:
        arm = with_overrides(config, **{"algo.algorithm": algorithm})
        runs[algorithm] = (arm_run_id(arm, algorithm), arm)
    return runs


def _updates_done(store: ArtifactStore, run_id: str) -> int:
    try:
        return sum(Stage.OPTIMIZE in stages for stages in store.ledger_entries(run_id).values())
    except StoreError:  # progress display only; the child process reports real errors
        return 0


def warm_up(config: RunConfig, console: Console) -> str:
    """The shared supervised warm-up of the preset (made, or reused from the store); returns its run id."""
    store = open_store(config.store)
    with console.status("warm-up: supervised training until accuracy enters the window (or reuse)"):
        warmup_id = ensure_warmup(config, store)
    warm = store.marker(warmup_id, 0, Stage.WARMUP)["summary"]
    console.print(f"warm-up {warmup_id}: accuracy {100 * warm['accuracy']:.1f}% after {warm['steps']} steps")
    return warmup_id


def train_arms(config: RunConfig, outdir: Path, console: Console) -> list[str]:
    """Both arms at once, each `probepo train` in its own process (one torch thread), with a progress bar
    each read from the store's ledger; returns their run ids. Raises RuntimeError naming a failed arm's
    log."""
    outdir.mkdir(parents=True, exist_ok=True)
    store = open_store(config.store)
    arms = {}
    for algorithm, (run_id, arm) in arm_runs(config).items():
        path = outdir / f"{algorithm}.yaml"
        path.write_text(yaml.safe_dump(arm.model_dump(mode="json"), sort_keys=False))
        arms[algorithm] = (run_id, path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    children = {}
    for algorithm, (run_id, path) in arms.items():
        command = [
            sys.executable,
            "-m",
            "probepo.cli",
            "train",
            str(path),
            "--run-id",
            run_id,
            "--store",
            config.store,
            "--tensorboard",
            str(outdir / "tensorboard" / algorithm),
        ]
        with (outdir / f"{algorithm}.log").open("w") as log:  # the child keeps its own descriptor
            children[algorithm] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bars = {a: progress.add_task(f"{a} ({arms[a][0][-8:]})", total=config.num_updates) for a in ARMS}
        while any(child.poll() is None for child in children.values()):
            for algorithm in ARMS:
                progress.update(bars[algorithm], completed=_updates_done(store, arms[algorithm][0]))
            time.sleep(POLL_S)
        for algorithm in ARMS:
            progress.update(bars[algorithm], completed=_updates_done(store, arms[algorithm][0]))
    for algorithm, child in children.items():
        if child.returncode != 0:
            tail = (outdir / f"{algorithm}.log").read_text().splitlines()[-15:]
            raise RuntimeError(
                f"the {algorithm} arm failed (exit {child.returncode}); end of its log "
                f"{outdir / f'{algorithm}.log'}:\n" + "\n".join(tail)
            )
    return [arms[a][0] for a in ARMS]


def summarize(config: RunConfig, run_ids: list[str], outdir: Path, console: Console) -> Path:
    """The report (markdown and plot) of both arms, and a table and verdicts on the console; returns the
    report's path."""
    store = open_store(config.store)
    report = write_report(store, run_ids, outdir, title="Demo: GRPO vs ProbePO on the CPU testbed")
    table = Table(
        title=f"Held-out accuracy (Mean@{config.eval.samples_per_problem}, {config.eval.problems} problems)"
    )
    for column in ("arm", "start", "end", "gain ± s.e. (points)", "sampled tokens", "wall (s)"):
        table.add_column(column)
    verdicts = []
    for algorithm, run_id in zip(ARMS, run_ids, strict=True):
        c = load_curves(store, run_id)
        table.add_row(
            algorithm,
            f"{100 * c.accuracy[0]:.1f}%",
            f"{100 * c.accuracy[-1]:.1f}%",
            f"{c.gain_points:+.1f} ± {c.gain_stderr_points:.1f}",
            f"{c.sampled_tokens[-1]:,.0f}",
            f"{c.wall_s[-1]:.0f}",
        )
        verdicts.append(
            f"{algorithm}: {c.gain_points:+.1f} points is within noise (less than two standard errors from"
            " zero): this run does not show that it learned"
            if c.gain_within_noise
            else f"{algorithm}: {c.gain_points:+.1f} points, more than two standard errors from zero"
        )
    console.print(table)
    for verdict in verdicts:
        console.print(verdict)
    console.print(
        "One seed, one evaluation set: this shows what each arm did here and what probing costs, not which"
        " method is better (bench/science.py: many seeds, paired intervals)."
    )
    console.print(f"plot {outdir / 'curves.png'}")
    return report


def run_demo(config: RunConfig, outdir: Path, console: Console | None = None) -> Path:
    """Run the demo in this process (the `demo` flow runs the same three steps as task runs); returns the
    markdown report's path."""
    console = console or Console()
    started = time.perf_counter()
    warm_up(config, console)
    report = summarize(config, train_arms(config, outdir, console), outdir, console)
    console.print(f"demo wall time {time.perf_counter() - started:.0f} s")
    return report
