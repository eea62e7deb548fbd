"""What a run's page shows while it trains, from its metric records alone (no plotting library, no store):
the metrics table's columns in reading order and the curves as a markdown chart that any markdown viewer
renders (Prefect's UI included), one row of block characters per series."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from probepo.schedule import TRAINING_STAGES, Stage

BLOCKS = "▁▂▃▄▅▆▇█"
COLUMN_ORDER = (Stage.EVALUATE, *TRAINING_STAGES)
"""The metrics table's stage groups, in the order of an update (the held-out numbers first)."""
CURVES = (("held-out accuracy", "evaluate/accuracy"), ("mean reward", "sample/reward_mean"))
"""The series the live chart draws: (label, metric)."""
DONE_WHEN = "optimize/loss"
"""An update is done once its optimizer step has committed (its metrics then hold this)."""


def rows_by_update(records: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """A run's metric records as one row per update, by update: a resumed update's records (each logs only
    the stages the others had not) merged into one."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records:
        rows.setdefault(int(record["update"]), {}).update(record)
    return dict(sorted(rows.items()))


def updates_done(rows: Iterable[Mapping[str, Any]]) -> int:
    """How many of these rows (one per update: rows_by_update) are of updates done."""
    return sum(DONE_WHEN in row for row in rows)


def metric_columns(keys: Iterable[str]) -> list[str]:
    """`update` first, then the metrics grouped by stage in the order of an update (its prefix before the
    `/`), each group sorted; a stage the order does not know comes last."""
    stages = [str(stage) for stage in COLUMN_ORDER]

    def place(key: str) -> tuple[int, str]:
        stage = key.split("/", 1)[0]
        return (stages.index(stage) if stage in stages else len(stages), key)

    return ["update", *sorted({key for key in keys if key != "update"}, key=place)]


def sparkline(values: Sequence[float]) -> str:
    """One block character per value, from ▁ (the lowest) to █ (the highest); a space for a missing one."""
    present = [v for v in values if not math.isnan(v)]
    if not present:
        return ""
    low, high = min(present), max(present)
    scale = (len(BLOCKS) - 1) / (high - low) if high > low else 0.0
    return "".join(" " if math.isnan(v) else BLOCKS[round((v - low) * scale)] for v in values)


def curves_markdown(run_id: str, rows: Sequence[Mapping[str, Any]], num_updates: int, width: int = 60) -> str:
    """The run's curves so far as markdown, from its rows (one per update: rows_by_update): for each of
    CURVES, its first and last value and a sparkline over the updates that have it (the last `width`)."""
    lines = [f"# Run {run_id}: curves", "", f"{updates_done(rows)} of {num_updates} updates done", ""]
    drawn = []
    for label, key in CURVES:
        points = [
            (int(r["update"]), float(r[key]))
            for r in rows
            if isinstance(r.get(key), int | float) and not math.isnan(r[key])
        ]
        if not points:
            drawn.append(f"{label:<18}  (none yet)")
            continue
        shown = points[-width:]
        first, last = shown[0], shown[-1]
        drawn.append(
            f"{label:<18} {first[1]:7.3f} {sparkline([v for _, v in shown])} {last[1]:7.3f}"
            f"   updates {first[0]}–{last[0]}"
        )
    lines += ["```", *drawn, "```"]
    return "\n".join(lines) + "\n"
