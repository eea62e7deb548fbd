"""Plots and a markdown summary of one or several runs, read from their metrics in the store."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from probepo.schedule import EVAL_RESULTS, TRAINING_STAGES, Stage
from probepo.stats import mean_and_stderr
from probepo.store import ArtifactStore
from probepo.store.formats import table_from_parquet

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

    def accuracy_at(self, update: int) -> float:
        """Accuracy of policy `update`; KeyError naming the evaluated updates if it was not evaluated."""
        if update not in self.eval_updates:
            raise KeyError(f"run {self.run_id} was not evaluated at update {update} ({self.eval_updates})")
        return self.accuracy[self.eval_updates.index(update)]


def load_curves(store: ArtifactStore, run_id: str) -> RunCurves:
    """Read a run's metrics into curves."""
    algorithm = store.read_run(run_id)["config"]["algo"]["algorithm"]
    metrics = sorted(store.read_metrics(run_id), key=lambda m: m["update"])
    evals = [m for m in metrics if ACCURACY in m]
    trained = [m for m in metrics if "sample/reward_mean" in m]
    tokens, wall, total_tokens, total_wall = [], [], 0.0, 0.0
    for m in trained:
        total_tokens += m.get("sample/tokens", 0) + m.get("probe/tokens", 0)
        total_wall += sum(m.get(f"{stage}/wall_s", 0.0) for stage in TRAINING_STAGES)
        tokens.append(total_tokens)
        wall.append(total_wall)
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


def plot(curves: Sequence[RunCurves], path: Path) -> Path:
    """Held-out accuracy by update (±1 standard error), by sampled tokens and by training wall time, and
    the training reward by update: one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    by_update, by_tokens, by_wall, rewards = axes.flat
    for c in curves:
        label = f"{c.algorithm} ({c.run_id})"
        percent = [100 * a for a in c.accuracy]
        by_update.errorbar(
            c.eval_updates, percent, yerr=[100 * s for s in c.stderr], marker="o", capsize=3, label=label
        )
        by_tokens.plot(c.eval_tokens, percent, marker="o", label=label)
        by_wall.plot(c.eval_wall_s, percent, marker="o", label=label)
        rewards.plot(range(len(c.reward)), c.reward, label=label, alpha=0.8)
    by_update.set(xlabel="update", ylabel="eval accuracy (%)", title="Held-out accuracy by update")
    by_tokens.set(xlabel="sampled tokens (backbone + probes)", ylabel="eval accuracy (%)", title="by tokens")
    by_wall.set(xlabel="training wall time (s)", ylabel="eval accuracy (%)", title="by wall time")
    rewards.set(xlabel="update", ylabel="mean reward", title="Training reward (backbone samples)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def markdown(curves: Sequence[RunCurves], plot_name: str | None = None) -> str:
    """A comparison table: accuracy at each evaluation, final greedy accuracy, gain, tokens and wall time."""
    updates = sorted({u for c in curves for u in c.eval_updates})
    head = [
        "run",
        "algorithm",
        *[f"acc@{u}" for u in updates],
        "greedy (last)",
        "gain ± s.e. (points)",
        "sampled tokens",
        "training wall (s)",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in curves:
        by_update = {
            u: f"{100 * a:.1f} ± {100 * s:.1f}"
            for u, a, s in zip(c.eval_updates, c.accuracy, c.stderr, strict=True)
        }
        cells = [
            c.run_id,
            c.algorithm,
            *[by_update.get(u, "–") for u in updates],
            f"{100 * c.greedy[-1]:.1f}" if c.greedy else "–",
            f"{c.gain_points:+.1f} ± {c.gain_stderr_points:.1f}"
            + (" (within noise)" if c.gain_within_noise else ""),
            f"{c.sampled_tokens[-1]:,.0f}" if c.sampled_tokens else "–",
            f"{c.wall_s[-1]:.0f}" if c.wall_s else "–",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    notes = [
        f"- {c.run_id} was extended from {e['from']} to {e['to']} updates at {e['at'][:19]}Z."
        for c in curves
        for e in c.extensions
    ]
    text = (
        "\n".join(rows)
        + "\n\nAccuracy: Mean@k at the evaluation temperature on the fixed evaluation set, ± one standard"
        " error over problems. Gain: last minus first evaluation, its standard error over the problems"
        " paired; within noise means less than two standard errors from zero. Training wall time excludes"
        " evaluations.\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")
    )
    if plot_name:
        text += f"\n![curves]({plot_name})\n"
    return text


def write_report(store: ArtifactStore, run_ids: Sequence[str], outdir: Path, title: str = "Runs") -> Path:
    """Write `report.md` and `curves.png` for the runs into outdir; returns the markdown's path."""
    curves = [load_curves(store, run_id) for run_id in run_ids]
    outdir.mkdir(parents=True, exist_ok=True)
    plot(curves, outdir / "curves.png")
    report = outdir / "report.md"
    report.write_text(f"# {title}\n\n" + markdown(curves, "curves.png"))
    return report
