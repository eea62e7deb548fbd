"""Plots and a markdown summary of one or several runs, read from their metrics in the store."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probepo.store import ArtifactStore

ACCURACY = "evaluate/accuracy"
STDERR = "evaluate/stderr"


@dataclass
class RunCurves:
    """What a report needs of one run, by update."""

    run_id: str
    algorithm: str
    eval_updates: list[int]
    accuracy: list[float]
    stderr: list[float]
    reward: list[float]
    """Mean backbone reward of each training update."""
    sampled_tokens: list[float]
    """Cumulative generated tokens (backbone and probes) after each training update."""
    wall_s: list[float]
    """Cumulative stage wall time after each training update."""

    @property
    def gain_points(self) -> float:
        """Accuracy points gained from the first to the last evaluation."""
        return 100.0 * (self.accuracy[-1] - self.accuracy[0]) if len(self.accuracy) > 1 else math.nan


def load_curves(store: ArtifactStore, run_id: str) -> RunCurves:
    """Read a run's metrics into curves."""
    algorithm = store.read_run(run_id)["config"]["algo"]["algorithm"]
    metrics = sorted(store.read_metrics(run_id), key=lambda m: m["update"])
    evals = [m for m in metrics if ACCURACY in m]
    trained = [m for m in metrics if "sample/reward_mean" in m]
    tokens, wall, total_tokens, total_wall = [], [], 0.0, 0.0
    for m in trained:
        total_tokens += m.get("sample/tokens", 0) + m.get("probe/tokens", 0)
        total_wall += sum(v for k, v in m.items() if k.endswith("/wall_s"))
        tokens.append(total_tokens)
        wall.append(total_wall)
    return RunCurves(
        run_id=run_id,
        algorithm=algorithm,
        eval_updates=[m["update"] for m in evals],
        accuracy=[m[ACCURACY] for m in evals],
        stderr=[m.get(STDERR, 0.0) for m in evals],
        reward=[m["sample/reward_mean"] for m in trained],
        sampled_tokens=tokens,
        wall_s=wall,
    )


def plot(curves: Sequence[RunCurves], path: Path) -> Path:
    """Accuracy by update (with ±1 standard error) and training reward by update, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for c in curves:
        label = f"{c.algorithm} ({c.run_id})"
        left.errorbar(
            c.eval_updates,
            [100 * a for a in c.accuracy],
            yerr=[100 * s for s in c.stderr],
            marker="o",
            capsize=3,
            label=label,
        )
        right.plot(range(len(c.reward)), c.reward, label=label, alpha=0.8)
    left.set(xlabel="update", ylabel="eval accuracy (%)", title="Held-out accuracy")
    right.set(xlabel="update", ylabel="mean reward", title="Training reward (backbone samples)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(curves: Sequence[RunCurves], plot_name: str | None = None) -> str:
    """A comparison table: accuracy at each evaluation, gain, tokens and wall time per run."""
    updates = sorted({u for c in curves for u in c.eval_updates})
    head = ["run", "algorithm", *[f"acc@{u}" for u in updates], "gain (points)", "sampled tokens", "wall (s)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in curves:
        by_update: dict[int, Any] = {
            u: f"{100 * a:.1f} ± {100 * s:.1f}"
            for u, a, s in zip(c.eval_updates, c.accuracy, c.stderr, strict=True)
        }
        cells = [
            c.run_id,
            c.algorithm,
            *[by_update.get(u, "–") for u in updates],
            f"{c.gain_points:+.1f}",
            f"{c.sampled_tokens[-1]:,.0f}" if c.sampled_tokens else "–",
            f"{c.wall_s[-1]:.0f}" if c.wall_s else "–",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    text = (
        "\n".join(rows)
        + "\n\nAccuracy: Mean@k on the fixed evaluation set, ± one standard error over problems.\n"
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
