"""Where an update's seconds and bytes went: the spend counters of each stage attempt (probepo.spend), summed
per update over the training stages from the run's metrics, as a markdown table and a stacked plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probepo.spend import BYTE_KINDS, PIECES, is_spend_metric
from probepo.store import ArtifactStore

MB = 1e6


@dataclass
class UpdateSpend:
    """One update's spend, summed over its stages (its evaluation included, the warm-up not)."""

    update: int
    seconds: dict[str, float]
    """Seconds by piece (probepo.spend.PIECES)."""
    bytes: dict[str, int]
    """Bytes by kind (probepo.spend.BYTE_KINDS)."""
    scratch_peak: int
    """The largest scratch folder any of its stages saw."""

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


def updates_spend(metrics: Sequence[Mapping[str, Any]]) -> list[UpdateSpend]:
    """Each update's spend from its metrics records' `timing/<stage>/<piece>` and `bytes/<stage>/<kind>`;
    updates whose records hold none (written before the counters existed) are left out."""
    by_update: dict[int, UpdateSpend] = {}
    for record in metrics:
        for key, value in record.items():
            group, _, rest = key.partition("/")
            if not is_spend_metric(key) or "/" not in rest:
                continue
            name = rest.split("/", 1)[1]
            spent = by_update.setdefault(int(record["update"]), UpdateSpend(int(record["update"]), {}, {}, 0))
            if group == "timing":
                spent.seconds[name] = spent.seconds.get(name, 0.0) + float(value)
            elif name == "scratch_peak":
                spent.scratch_peak = max(spent.scratch_peak, int(value))
            else:
                spent.bytes[name] = spent.bytes.get(name, 0) + int(value)
    return [by_update[update] for update in sorted(by_update)]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def spend_markdown(run_id: str, spent: Sequence[UpdateSpend], plot_name: str | None = None) -> str:
    """The per-update table of one run: seconds by piece, then megabytes by kind."""
    if not spent:
        return (
            f"\n### Where {run_id}'s updates went\n\nNo spend counters recorded (a run from before them).\n"
        )
    pieces = [p for p in PIECES if any(p in s.seconds for s in spent)]
    kinds = [k for k in BYTE_KINDS if any(k in s.bytes for s in spent)]
    head = ["update", "total s", *[f"{p} s" for p in pieces], *[f"{k} MB" for k in kinds], "scratch peak MB"]
    rows = [f"\n### Where {run_id}'s updates went\n", _row(head), "|" + "---|" * len(head)]
    for s in spent:
        cells = [
            str(s.update),
            f"{s.total_s:.2f}",
            *[f"{s.seconds.get(p, 0.0):.2f}" for p in pieces],
            *[f"{s.bytes.get(k, 0) / MB:.2f}" for k in kinds],
            f"{s.scratch_peak / MB:.2f}",
        ]
        rows.append(_row(cells))
    text = "\n".join(rows) + (
        "\n\nSeconds: each stage attempt's counted pieces (a preempted attempt's included), summed over the"
        " update's stages; what no piece counts (bookkeeping, waiting for a job) is not in the total."
        " Bytes: uploaded to and downloaded from the store, written to the node's scratch, copied into new"
        " host memory, and handed to the generation engine through a file or in memory.\n"
    )
    if plot_name:
        text += f"\n![spend]({plot_name})\n"
    return text


def plot_spend(run_id: str, spent: Sequence[UpdateSpend], path: Path) -> Path:
    """Two stacked bar charts by update: seconds by piece, megabytes by kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.5))
    updates = [s.update for s in spent]
    for axis, names, values, unit in (
        (by_time, PIECES, lambda s, n: s.seconds.get(n, 0.0), "seconds"),
        (by_bytes, BYTE_KINDS, lambda s, n: s.bytes.get(n, 0) / MB, "MB"),
    ):
        bottom = [0.0] * len(spent)
        for name in names:
            heights = [values(s, name) for s in spent]
            if any(heights):
                axis.bar(updates, heights, bottom=bottom, label=name)
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("update")
        axis.set_ylabel(unit)
        axis.legend(fontsize=7)
    by_time.set_title(f"{run_id}: seconds per update")
    by_bytes.set_title(f"{run_id}: bytes per update")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_spend(store: ArtifactStore, run_id: str, outdir: Path) -> str:
    """The run's spend plot (`spend-<run>.png` in outdir, when it has counters) and its markdown."""
    spent = updates_spend(store.read_metrics(run_id))
    name = None
    if spent:
        name = f"spend-{run_id}.png"
        plot_spend(run_id, spent, outdir / name)
    return spend_markdown(run_id, spent, name)
