"""What a run's page shows while it trains (probepo/report_live.py): one row per update, the metrics
table's columns in the order of an update, and the curves as a markdown chart of block characters."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from probepo.report_live import (
    BLOCKS,
    curves_markdown,
    metric_columns,
    rows_by_update,
    sparkline,
    updates_done,
)


def test_update_comes_first_and_the_columns_go_by_stage_in_the_order_of_an_update():
    keys = ["optimize/loss", "sample/tokens", "evaluate/accuracy", "advantage/std", "update", "zzz/other"]
    assert metric_columns(keys) == [
        "update", "evaluate/accuracy", "sample/tokens", "advantage/std", "optimize/loss", "zzz/other"
    ]  # fmt: skip


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50))
def test_a_sparkline_has_a_block_per_value_lowest_to_highest(values):
    line = sparkline(values)
    assert len(line) == len(values) and set(line) <= set(BLOCKS)
    if max(values) > min(values):
        assert line[values.index(min(values))] == BLOCKS[0] and line[values.index(max(values))] == BLOCKS[-1]


def test_the_chart_draws_accuracy_and_reward_by_update_and_says_what_is_missing():
    records = [
        {"update": 0, "evaluate/accuracy": 0.2, "sample/reward_mean": 0.1, "optimize/loss": 0.5},
        {"update": 1, "sample/reward_mean": 0.3},
        {"update": 2, "evaluate/accuracy": 0.5, "sample/reward_mean": math.nan},
    ]
    chart = curves_markdown("r1", records, num_updates=10)
    assert "1 of 10 updates done" in chart
    accuracy = next(line for line in chart.splitlines() if line.startswith("held-out accuracy"))
    assert "0.200 ▁█   0.500   updates 0–2" in accuracy
    assert "(none yet)" in curves_markdown("r1", [{"update": 0}], num_updates=1)


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
    assert "2 of 4 updates done" in curves_markdown("r1", list(rows.values()), num_updates=4)
