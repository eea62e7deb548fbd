"""What a run's page shows while it trains (probepo/report/live.py): one row per update; the lead table of
the numbers a user scans and the stage table of every metric, rounded to what they mean; and the curves
as markdown charts over the whole run, between their axis ranges, downsampled rather than cut."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from probepo.report.live import (
    BLOCKS,
    CURVES,
    chart_rows,
    curve_lines,
    curves_markdown,
    downsampled,
    lead_row,
    metric_columns,
    rows_by_update,
    significant,
    stage_table,
    updates_done,
)

ACCURACY, REWARD = CURVES


def test_update_comes_first_and_the_columns_go_by_stage_in_the_order_of_an_update():
    keys = ["optimize/loss", "sample/tokens", "evaluate/accuracy", "advantage/std", "update", "zzz/other"]
    assert metric_columns(keys) == [
        "update", "evaluate/accuracy", "sample/tokens", "advantage/std", "optimize/loss", "zzz/other"
    ]  # fmt: skip


def test_floats_keep_four_significant_digits():
    assert significant(0.01491833218945741) == 0.01492
    assert significant(1234.5678) == 1235.0 and significant(-0.000123456) == -0.0001235
    assert significant(0.0) == 0.0 and math.isinf(significant(math.inf))


def test_the_lead_table_has_the_numbers_a_user_scans_and_the_stage_table_every_metric_rounded():
    row = {
        "update": 3,
        "evaluate/accuracy": 0.1875,
        "evaluate/wall_s": 0.3316,
        "sample/reward_mean": 0.01491833218945741,
        "sample/tokens": 120,
        "sample/wall_s": 1.23456,
        "probe/tokens": 30,
        "optimize/loss": math.nan,
        "timing/sample/generation": 0.2891,  # a spend counter: TensorBoard's and the report's
    }
    assert lead_row(row) == {
        "update": 3,
        "accuracy %": 18.8,
        "reward": 0.01492,
        "tokens": 150,
        "wall (s)": 1.566,
    }
    unevaluated = lead_row({"update": 4, "sample/reward_mean": 0.5, "optimize/loss": 0.1})
    assert unevaluated == {"update": 4, "accuracy %": None, "reward": 0.5, "tokens": None, "wall (s)": None}
    (by_stage,) = stage_table([row])
    assert list(by_stage) == [
        "update", "evaluate/accuracy", "evaluate/wall_s", "sample/reward_mean", "sample/tokens",
        "sample/wall_s", "probe/tokens", "optimize/loss",
    ]  # fmt: skip
    assert by_stage["sample/reward_mean"] == 0.01492 and by_stage["optimize/loss"] is None  # JSON has no NaN


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=300), st.integers(1, 60))
def test_a_series_is_downsampled_whole_into_at_most_the_charts_width(values, width):
    points = list(enumerate(values))
    columns = downsampled(points, width)
    assert len(columns) == min(len(points), width)
    assert columns[0][0] == 0 and columns[-1][1] == len(points) - 1  # the whole run: nothing cut
    assert all(a[1] < b[0] for a, b in itertools.pairwise(columns))  # consecutive, no overlap
    sizes = {last - first + 1 for first, last, _ in columns}
    assert max(sizes) - min(sizes) <= 1  # as even as can be
    low, high = min(values), max(values)
    assert all(low - 1e-6 <= mean <= high + 1e-6 for _, _, mean in columns)


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=60))
def test_a_chart_fills_each_column_from_its_lowest_row_to_its_place(values):
    low, high = min(values), max(values)
    rows = chart_rows(values, low, high, height=4)
    assert len(rows) == 4 and all(len(row) == len(values) and set(row) <= set(BLOCKS) | {" "} for row in rows)
    if high > low:
        highest = values.index(high)
        assert all(row[highest] == BLOCKS[-1] for row in rows)  # the highest fills every row
        lowest = values.index(low)
        assert [row[lowest] for row in rows] == [" ", " ", " ", BLOCKS[0]]  # the lowest an eighth of one


def test_the_curves_show_their_axis_ranges_and_the_whole_run():
    rows = [{"update": u, "sample/reward_mean": u / 100, "optimize/loss": 0.1} for u in range(120)]
    rows[0]["evaluate/accuracy"], rows[119]["evaluate/accuracy"] = 0.125, 0.5
    reward = curve_lines(REWARD, rows, width=60)
    assert reward[0] == "mean reward: 120 points, updates 0–119; a column: the mean of 2"
    assert reward[1] == "  lowest 0 (update 0), highest 1.19 (update 119), last 1.19 (update 119)"
    assert reward[2].startswith("1.19 ┤") and reward[5].startswith("   0 ┤")  # the axis: its range
    assert reward[-1] == "     └" + "─" * 60
    accuracy = curve_lines(ACCURACY, rows)
    assert accuracy[0] == "held-out accuracy (%): 2 points, updates 0–119"  # the evaluated ones, in %
    assert accuracy[1] == "  lowest 12.5 (update 0), highest 50.0 (update 119), last 50.0 (update 119)"
    # two points, three characters each: a short series still reads as a chart
    assert accuracy[2:7] == ["50.0 ┤   ███", "     │   ███", "     │   ███", "12.5 ┤▁▁▁███", "     └──────"]
    assert curve_lines(REWARD, [{"update": 0}]) == ["mean reward: none yet"]


def test_a_flat_curve_is_drawn_at_its_one_value():
    lines = curve_lines(REWARD, [{"update": u, "sample/reward_mean": 0.25} for u in range(3)])
    assert lines[0] == "mean reward: 3 points, updates 0–2"
    assert lines[2:] == [f"     │{' ' * 9}"] * 3 + ["0.25 ┤▄▄▄▄▄▄▄▄▄", "     └─────────"]
    assert (
        curve_lines(REWARD, [{"update": 4, "sample/reward_mean": 0.25}])[0]
        == "mean reward: 1 point, update 4"
    )


def test_a_resumed_updates_records_are_one_row_and_count_once():
    records = [
        {"update": 0, "evaluate/accuracy": 0.2, "sample/reward_mean": 0.1},
        {"update": 1, "sample/reward_mean": 0.2},
        {"update": 0, "optimize/loss": 0.5},  # update 0 resumed after its sample: the rest logged apart
        {"update": 1, "optimize/loss": 0.4},
        {"update": 2, "evaluate/accuracy": 0.4},
    ]
    rows = rows_by_update(records)
    assert list(rows) == [0, 1, 2]
    assert rows[0] == {"update": 0, "evaluate/accuracy": 0.2, "sample/reward_mean": 0.1, "optimize/loss": 0.5}
    assert updates_done(rows.values()) == 2
    chart = curves_markdown("r1", list(rows.values()), num_updates=4)
    assert "2 of 4 updates done" in chart and chart.count("```") == 2
