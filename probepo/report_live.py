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


def curves_markdown(
    run_id: str, records: Sequence[Mapping[str, Any]], num_updates: int, width: int = 60
) -> str:
    """The run's curves so far as markdown: for each of CURVES, its first and last value and a sparkline
    over the updates that have it (the last `width` of them)."""
    done = sum("optimize/loss" in record for record in records)
    lines = [f"# Run {run_id}: curves", "", f"{done} of {num_updates} updates done", ""]
    rows = []
    for label, key in CURVES:
        points = [
            (int(r["update"]), float(r[key]))
            for r in records
            if isinstance(r.get(key), int | float) and not math.isnan(r[key])
        ]
        if not points:
            rows.append(f"{label:<18}  (none yet)")
            continue
        shown = points[-width:]
        first, last = shown[0], shown[-1]
        rows.append(
            f"{label:<18} {first[1]:7.3f} {sparkline([v for _, v in shown])} {last[1]:7.3f}"
            f"   updates {first[0]}–{last[0]}"
        )
    lines += ["```", *rows, "```"]
    return "\n".join(lines) + "\n"
