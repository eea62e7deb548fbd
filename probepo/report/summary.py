"""Plots and a markdown summary of one or several runs, read from their metrics in the store, and, where the
caller gathered them (probepo/report/costs.py: the CLI and the train flow ask SLURM's accounting), what each
run
cost in GPU-hours: accuracy against GPU-hours is how the study compares methods."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from probepo.report.costs import RunCosts
from probepo.report.spend import write_spend
from probepo.report.stats import mean_and_stderr
from probepo.run.schedule import EVAL_RESULTS, TRAINING_STAGES, Stage
from probepo.store import ArtifactStore
from probepo.store.formats import table_from_parquet

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ACCURACY = "evaluate/accuracy"
STDERR = "evaluate/stderr"
GREEDY = "evaluate/greedy_accuracy"


@dataclass
class RunCurves:
    """What a report needs of one run: its evaluations, and its training reward and cost by update."""

    run_id: str
    algorithm: str
    eval_updates: list[int]
    accuracy: list[float]
    """Mean@k at the evaluation temperature, at each evaluated update."""
    stderr: list[float]
    greedy: list[float]
    """Greedy accuracy at each evaluated update (empty if the run did not evaluate greedily)."""
    reward: list[float]
    """Mean backbone reward of each training update."""
    sampled_tokens: list[float]
    """Cumulative generated tokens (backbone and probes) after each training update."""
    wall_s: list[float]
    """Cumulative wall time of the training stages (evaluations excluded) after each training update."""
    gain_stderr_points: float = math.nan
    """Standard error of `gain_points`, over the evaluation problems paired (each problem's correctness
    at the last evaluation minus at the first): how far the gain stands from the evaluation's noise."""
    extensions: list[dict] = field(default_factory=list)
    """The run's recorded extensions (from, to, at): a run trained further than its frozen recipe."""
    gpu_hours: list[float] = field(default_factory=list)
    """Cumulative GPU-hours of the training stages' jobs after each training update (evaluations
    excluded, as in `wall_s`); empty when no job of the run was accounted for (inline, local executor)."""
    costs: RunCosts | None = None
    """The run's costs by update and stage, where the caller gathered them."""

    @property
    def gain_points(self) -> float:
        """Accuracy points gained from the first to the last evaluation."""
        return 100.0 * (self.accuracy[-1] - self.accuracy[0]) if len(self.accuracy) > 1 else math.nan

    @property
    def gain_within_noise(self) -> bool:
        """The gain is less than two standard errors from zero (or has no standard error), or is zero."""
        return self.gain_points == 0 or not abs(self.gain_points) >= 2 * self.gain_stderr_points

    def _at_evals(self, cumulative: list[float]) -> list[float]:
        # Policy u is evaluated before update u trains: it has cost the updates 0..u-1.
        return [cumulative[u - 1] if u > 0 else 0.0 for u in self.eval_updates]

    @property
    def eval_tokens(self) -> list[float]:
        """Sampled tokens spent to reach each evaluated policy."""
        return self._at_evals(self.sampled_tokens)

    @property
    def eval_wall_s(self) -> list[float]:
        """Training wall time spent to reach each evaluated policy."""
        return self._at_evals(self.wall_s)

    @property
    def eval_gpu_hours(self) -> list[float]:
        """Training GPU-hours spent to reach each evaluated policy (empty without accounting)."""
        return self._at_evals(self.gpu_hours) if self.gpu_hours else []

    def accuracy_at(self, update: int) -> float:
        """Accuracy of policy `update`; KeyError naming the evaluated updates if it was not evaluated."""
        if update not in self.eval_updates:
            raise KeyError(f"run {self.run_id} was not evaluated at update {update} ({self.eval_updates})")
        return self.accuracy[self.eval_updates.index(update)]


def load_curves(store: ArtifactStore, run_id: str, costs: RunCosts | None = None) -> RunCurves:
    """Read a run's metrics into curves, with its GPU-hours where `costs` accounts for its jobs."""
    algorithm = store.read_run(run_id)["config"]["algo"]["algorithm"]
    metrics = sorted(store.read_metrics(run_id), key=lambda m: m["update"])
    evals = [m for m in metrics if ACCURACY in m]
    trained = [m for m in metrics if "sample/reward_mean" in m]
    tokens, wall, gpu_hours, total_tokens, total_wall, total_gpu = [], [], [], 0.0, 0.0, 0.0
    for m in trained:
        total_tokens += m.get("sample/tokens", 0) + m.get("probe/tokens", 0)
        total_wall += sum(m.get(f"{stage}/wall_s", 0.0) for stage in TRAINING_STAGES)
        tokens.append(total_tokens)
        wall.append(total_wall)
        if costs is not None and not costs.wall_time_only:
            total_gpu += costs.training_gpu_hours(m["update"])
            gpu_hours.append(total_gpu)
    return RunCurves(
        run_id=run_id,
        algorithm=algorithm,
        gain_stderr_points=_gain_stderr(store, run_id, [m["update"] for m in evals]),
        extensions=store.extensions(run_id),
        eval_updates=[m["update"] for m in evals],
        accuracy=[m[ACCURACY] for m in evals],
        stderr=[m.get(STDERR, 0.0) for m in evals],
        greedy=[m[GREEDY] for m in evals if GREEDY in m],
        reward=[m["sample/reward_mean"] for m in trained],
        sampled_tokens=tokens,
        wall_s=wall,
        gpu_hours=gpu_hours,
        costs=costs,
    )


def _gain_stderr(store: ArtifactStore, run_id: str, evaluated: list[int]) -> float:
    """Standard error (points) of last − first evaluation accuracy, per problem paired; NaN with fewer
    than two evaluations."""
    files = [store.read_stage(run_id, update, Stage.EVALUATE) for update in evaluated[:1] + evaluated[-1:]]
    if len(evaluated) < 2 or any(EVAL_RESULTS not in f for f in files):  # benchmark evaluations: per suite
        return math.nan
    first, last = (table_from_parquet(f[EVAL_RESULTS])["correct"] for f in files)
    differences = [float(b) - float(a) for a, b in zip(first, last, strict=True)]
    return 100.0 * mean_and_stderr(differences)[1]


NO_GPU_HOURS_PLOT = (
    "No plot by GPU-hours: no job of these runs was accounted for by SLURM (inline and local jobs are not),"
    " so their cost shows as training wall time."
)
"""The report's one line where it leaves the GPU-hours panel out: an empty panel would show nothing."""


def accounted(curves: Sequence[RunCurves]) -> bool:
    """Whether SLURM accounted for any job of the runs: only then does a plot by GPU-hours have points."""
    return any(c.gpu_hours for c in curves)


def figure(curves: Sequence[RunCurves]) -> Figure:
    """Held-out accuracy by update (±1 standard error), by sampled tokens, by training wall time and, for
    runs with accounted jobs, by training GPU-hours, and the training reward by update: one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_gpu_hours = accounted(curves)
    second_row = ["gpu", "reward", "reward"] if by_gpu_hours else ["reward", "reward", "reward"]
    fig, axes = plt.subplot_mosaic([["update", "tokens", "wall"], second_row], figsize=(16, 8))
    for c in curves:
        label = f"{c.algorithm} ({c.run_id})"
        percent = [100 * a for a in c.accuracy]
        axes["update"].errorbar(
            c.eval_updates, percent, yerr=[100 * s for s in c.stderr], marker="o", capsize=3, label=label
        )
        axes["tokens"].plot(c.eval_tokens, percent, marker="o", label=label)
        axes["wall"].plot(c.eval_wall_s, percent, marker="o", label=label)
        if c.gpu_hours:
            axes["gpu"].plot(c.eval_gpu_hours, percent, marker="o", label=label)
        axes["reward"].plot(range(len(c.reward)), c.reward, label=label, alpha=0.8)
    accuracy = "eval accuracy (%)"
    axes["update"].set(xlabel="update", ylabel=accuracy, title="Held-out accuracy by update")
    axes["tokens"].set(xlabel="sampled tokens (backbone + probes)", ylabel=accuracy, title="by tokens")
    axes["wall"].set(xlabel="training wall time (s)", ylabel=accuracy, title="by wall time")
    if by_gpu_hours:
        axes["gpu"].set(xlabel="training GPU-hours (SLURM accounting)", ylabel=accuracy, title="by GPU-hours")
    axes["reward"].set(xlabel="update", ylabel="mean reward", title="Training reward (backbone samples)")
    for ax in axes.values():
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(curves: Sequence[RunCurves], path: Path) -> Path:
    """Save `figure(curves)` as a PNG at `path`."""
    import matplotlib.pyplot as plt

    fig = figure(curves)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _hours(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def markdown(curves: Sequence[RunCurves], plot_name: str | None = None) -> str:
    """A comparison table (accuracy at each evaluation, final greedy accuracy, gain, tokens, wall time and
    GPU-hours), then accuracy against the training GPU-hours spent to reach each evaluated policy."""
    updates = sorted({u for c in curves for u in c.eval_updates})
    head = [
        "run",
        "algorithm",
        *[f"acc@{u}" for u in updates],
        "greedy (last)",
        "gain ± s.e. (points)",
        "sampled tokens",
        "training wall (s)",
        "training GPU-h",
        "GPU-h (all jobs)",
    ]
    rows = [_row(head), "|" + "---|" * len(head)]
    for c in curves:
        by_update = {
            u: f"{100 * a:.1f} ± {100 * s:.1f}"
            for u, a, s in zip(c.eval_updates, c.accuracy, c.stderr, strict=True)
        }
        all_jobs = c.costs.gpu_hours if c.costs is not None and not c.costs.wall_time_only else None
        cells = [
            c.run_id,
            c.algorithm,
            *[by_update.get(u, "–") for u in updates],
            f"{100 * c.greedy[-1]:.1f}" if c.greedy else "–",
            f"{c.gain_points:+.1f} ± {c.gain_stderr_points:.1f}"
            + (" (within noise)" if c.gain_within_noise else ""),
            f"{c.sampled_tokens[-1]:,.0f}" if c.sampled_tokens else "–",
            f"{c.wall_s[-1]:.0f}" if c.wall_s else "–",
            _hours(c.gpu_hours[-1] if c.gpu_hours else None),
            _hours(all_jobs),
        ]
        rows.append(_row(cells))
    notes = [
        f"- {c.run_id} was extended from {e['from']} to {e['to']} updates at {e['at'][:19]}Z."
        for c in curves
        for e in c.extensions
    ]
    notes += [f"- {c.run_id}: {note}." for c in curves for note in (c.costs.notes if c.costs else ())]
    notes += [
        f"- {c.run_id}: no job of it was accounted for (it ran inline, or on the local executor): wall"
        " time only, no GPU-hours."
        for c in curves
        if c.costs is not None and c.costs.wall_time_only
    ]
    text = (
        "\n".join(rows)
        + "\n\nAccuracy: Mean@k at the evaluation temperature on the fixed evaluation set, ± one standard"
        " error over problems. Gain: last minus first evaluation, its standard error over the problems"
        " paired; within noise means less than two standard errors from zero. Training wall time excludes"
        " evaluations. GPU-hours: each SLURM job's allocated GPUs × elapsed hours from the cluster's"
        " accounting, every run of a requeued job included; training GPU-hours count the training stages'"
        " jobs (sample to optimize), all jobs add evaluations and checkpoints.\n"
        + _by_gpu_hours(curves)
        + ("\n" + "\n".join(notes) + "\n" if notes else "")
    )
    if plot_name:
        text += ("" if accounted(curves) else f"\n{NO_GPU_HOURS_PLOT}\n") + f"\n![curves]({plot_name})\n"
    return text


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _by_gpu_hours(curves: Sequence[RunCurves]) -> str:
    """Accuracy of each evaluated policy against the training GPU-hours and wall time spent to reach it
    (policy u: the training stages of updates 0 to u - 1)."""
    head = ["run", "algorithm", "policy", "accuracy (%)", "training GPU-h", "training wall (s)"]
    rows = ["\n### Accuracy against GPU-hours\n", _row(head), "|" + "---|" * len(head)]
    for c in curves:
        spent = c.eval_gpu_hours or [None] * len(c.eval_updates)
        evaluated = zip(c.eval_updates, c.accuracy, spent, c.eval_wall_s, strict=True)
        rows += [
            _row([c.run_id, c.algorithm, str(u), f"{100 * a:.1f}", _hours(hours), f"{wall:.0f}"])
            for u, a, hours, wall in evaluated
        ]
    return "\n".join(rows) + "\n"


def write_report(
    store: ArtifactStore,
    run_ids: Sequence[str],
    outdir: Path,
    title: str = "Runs",
    costs: Mapping[str, RunCosts] | None = None,
) -> Path:
    """Write `report.md` and `curves.png` for the runs into outdir, with each run's GPU-hours where `costs`
    (by run id) accounts for its jobs, and where each run's updates spent their seconds and bytes
    (`spend-<run>.png`, probepo.report.spend); returns the markdown's path."""
    curves = [load_curves(store, run_id, (costs or {}).get(run_id)) for run_id in run_ids]
    outdir.mkdir(parents=True, exist_ok=True)
    plot(curves, outdir / "curves.png")
    spent = "".join(write_spend(store, run_id, outdir) for run_id in run_ids)
    report = outdir / "report.md"
    report.write_text(f"# {title}\n\n" + markdown(curves, "curves.png") + spent)
    return report
