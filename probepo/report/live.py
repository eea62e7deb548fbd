"""What a run's page shows while it trains, from its metric records alone (no plotting library, no store):
the few numbers a user scans per update (the lead table), every metric grouped by stage in the order of an
update (the stage table), each rounded to what it means, and the curves as markdown charts that any
markdown viewer renders (Prefect's UI included): block characters between their axis ranges, the whole run
downsampled to a chart's width."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probepo import spend
from probepo.run.schedule import TRAINING_STAGES, Stage

BLOCKS = "▁▂▃▄▅▆▇█"
"""A column's partial fill, one eighth to whole."""
SIGNIFICANT_DIGITS = 4
"""What a metric's float is shown to: its noise is well above the fifth digit."""
COLUMN_ORDER = (Stage.EVALUATE, *TRAINING_STAGES)
"""The stage table's groups, in the order of an update (the held-out numbers first)."""
ACCURACY, REWARD, TOKENS = "evaluate/accuracy", "sample/reward_mean", ("sample/tokens", "probe/tokens")
LEAD_COLUMNS = ("update", "accuracy %", "reward", "tokens", "wall (s)")
"""The lead table's columns: held-out accuracy (a percent to 0.1, where the update was evaluated), mean
reward of its samples, tokens generated (samples and probes) and the wall time of its stages."""
DONE_WHEN = "optimize/loss"
"""An update is done once its optimizer step has committed (its metrics then hold this)."""
CHART_WIDTH, CHART_HEIGHT = 60, 4
"""A chart's columns at most (a longer series is averaged into that many) and its rows (8 levels each)."""
WIDEST_POINT = 3
"""Characters a point takes where a short series leaves room, so that a few points still read as a chart."""


@dataclass(frozen=True)
class Curve:
    label: str
    metric: str
    percent: bool
    """Shown as a percent to 0.1 (a fraction), else to SIGNIFICANT_DIGITS."""

    def shown(self, value: float) -> str:
        return f"{100 * value:.1f}" if self.percent else f"{significant(value):g}"


CURVES = (Curve("held-out accuracy (%)", ACCURACY, percent=True), Curve("mean reward", REWARD, percent=False))
"""The series the curves artifact draws."""


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


def significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """`value` rounded to `digits` significant digits (0.01491833218945741 → 0.01492, 1234.56 → 1235.0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def rounded(value: Any) -> Any:
    """A metric as a table shows it: a float to SIGNIFICANT_DIGITS, NaN as None (JSON has no NaN); whole
    numbers and words as they are."""
    if isinstance(value, float):
        return None if math.isnan(value) else significant(value)
    return value


def _number(value: Any) -> float | None:
    """A metric's value where it is a number (not NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def lead_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An update's row of the lead table (LEAD_COLUMNS; None where its update has no such number)."""
    accuracy = _number(row.get(ACCURACY))
    tokens = [count for key in TOKENS if (count := _number(row.get(key))) is not None]
    walls = [wall for key, v in row.items() if key.endswith("/wall_s") and (wall := _number(v)) is not None]
    return {
        "update": row["update"],
        "accuracy %": None if accuracy is None else round(100 * accuracy, 1),
        "reward": rounded(row.get(REWARD)),
        "tokens": int(sum(tokens)) if tokens else None,
        "wall (s)": significant(sum(walls)) if walls else None,
    }


def metric_columns(keys: Iterable[str]) -> list[str]:
    """`update` first, then the metrics grouped by stage in the order of an update (its prefix before the
    `/`), each group sorted; a stage the order does not know comes last."""
    stages = [str(stage) for stage in COLUMN_ORDER]

    def place(key: str) -> tuple[int, str]:
        stage = key.split("/", 1)[0]
        return (stages.index(stage) if stage in stages else len(stages), key)

    return ["update", *sorted({key for key in keys if key != "update"}, key=place)]


def stage_table(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every update's metrics by stage (metric_columns), rounded; the spend counters (bytes and timings,
    ~60 columns) are left to TensorBoard and `probepo report`."""
    listed = list(rows)
    keys = {key for row in listed for key in row if "/" in key and not spend.is_spend_metric(key)}
    columns = metric_columns(keys)
    return [{key: rounded(row.get(key)) for key in columns} for row in listed]


def downsampled(points: Sequence[tuple[int, float]], width: int) -> list[tuple[int, int, float]]:
    """A series' (update, value) points as at most `width` columns, each (its first update, its last, the
    mean of its values): consecutive points in groups as even as can be, so the whole run is drawn."""
    count = min(len(points), width)
    groups = [points[len(points) * i // count : len(points) * (i + 1) // count] for i in range(count)]
    return [(group[0][0], group[-1][0], sum(v for _, v in group) / len(group)) for group in groups]


def chart_rows(values: Sequence[float], low: float, high: float, height: int = CHART_HEIGHT) -> list[str]:
    """Columns of block characters, top row first: each value filled from the bottom to its place between
    `low` (an eighth of the lowest row) and `high` (every row full); a flat series (`low` = `high`) is
    half the lowest row."""
    levels = 8 * height
    if high > low:
        filled = [1 + round((v - low) / (high - low) * (levels - 1)) for v in values]
    else:
        filled = [4] * len(values)
    rows = []
    for row in range(height):
        below = 8 * (height - 1 - row)  # the levels of the rows under this one
        rows.append("".join(" " if f <= below else BLOCKS[min(f - below, 8) - 1] for f in filled))
    return rows


def curve_lines(curve: Curve, rows: Sequence[Mapping[str, Any]], width: int = CHART_WIDTH) -> list[str]:
    """One curve over the whole run so far: a caption with its points, the updates they span and its range
    (lowest, highest and last value, with their updates), then the chart with its highest and lowest value
    on the axis. The updates are in words, not under the chart: a browser draws block characters in
    another font than digits, so nothing under them would line up."""
    points = [(int(row["update"]), v) for row in rows if (v := _number(row.get(curve.metric))) is not None]
    if not points:
        return [f"{curve.label}: none yet"]
    low, high = min(points, key=lambda p: p[1]), max(points, key=lambda p: p[1])
    columns = downsampled(points, width)
    first, last = points[0][0], points[-1][0]
    spans = f"update {first}" if first == last else f"updates {first}–{last}"
    per = ""
    if len(columns) < len(points):  # downsampled: each column the mean of as many points, or one more
        fewest, most = len(points) // len(columns), math.ceil(len(points) / len(columns))
        per = f"; a column: the mean of {fewest if fewest == most else f'{fewest} or {most}'}"
    captions = [
        f"{curve.label}: {len(points)} point{'' if len(points) == 1 else 's'}, {spans}{per}",
        f"  lowest {curve.shown(low[1])} (update {low[0]}), highest {curve.shown(high[1])} (update"
        f" {high[0]}), last {curve.shown(points[-1][1])} (update {last})",
    ]
    wide = max(1, min(WIDEST_POINT, width // len(columns)))
    drawn = [
        "".join(cell * wide for cell in row)
        for row in chart_rows([value for _, _, value in columns], low[1], high[1])
    ]
    axis = [""] * len(drawn)
    axis[-1] = curve.shown(low[1])
    if high[1] > low[1]:
        axis[0] = curve.shown(high[1])
    margin = max(map(len, axis))
    chart = [f"{tick:>{margin}} {'┤' if tick else '│'}{row}" for tick, row in zip(axis, drawn, strict=True)]
    return [*captions, *chart, f"{'':>{margin}} └{'─' * len(drawn[0])}"]


def curves_markdown(
    run_id: str, rows: Sequence[Mapping[str, Any]], num_updates: int, width: int = CHART_WIDTH
) -> str:
    """The run's curves so far as markdown, from its rows (one per update: rows_by_update): each of CURVES
    over the whole run (curve_lines), in a code block so that its columns line up."""
    lines = [f"# Run {run_id}: curves", "", f"{updates_done(rows)} of {num_updates} updates done", "", "```"]
    for curve in CURVES:
        lines += [*curve_lines(curve, rows, width), ""]
    return "\n".join([*lines[:-1], "```"]) + "\n"
