"""The spend counters: timed pieces add up without double counting, nothing counts outside an attempt, and
attempts sum into an update's metrics and the report's breakdown."""

from __future__ import annotations

import time

from probepo import spend
from probepo.report_spend import spend_markdown, updates_spend


def test_nested_pieces_count_their_own_time_only() -> None:
    with spend.attempt_spend() as counters:
        with spend.timed("optimizer"):
            time.sleep(0.02)
            with spend.timed("save"):
                time.sleep(0.03)
        spend.count("uploaded", 10)
        spend.count("uploaded", 5)
    record = counters.as_record()
    assert 0.015 < record["seconds"]["optimizer"] < 0.03
    assert record["seconds"]["save"] >= 0.03
    assert record["bytes"] == {"uploaded": 15}


def test_nothing_counts_outside_an_attempt() -> None:
    spend.count("uploaded", 10)
    with spend.timed("commit"):
        pass
    with spend.attempt_spend() as counters:
        pass
    assert counters.as_record() == {"bytes": {}, "seconds": {}, "scratch_peak_bytes": 0}


def test_attempts_sum_into_metrics_and_a_breakdown() -> None:
    first = {"spend": {"bytes": {"uploaded": 100}, "seconds": {"save": 1.0}, "scratch_peak_bytes": 70}}
    second = {"spend": {"bytes": {"uploaded": 50, "scratch": 20}, "seconds": {"save": 0.5, "commit": 2.0}}}
    total = spend.summed([first, second, {"outcome": "running"}])
    assert total == {
        "bytes": {"uploaded": 150, "scratch": 20},
        "seconds": {"save": 1.5, "commit": 2.0},
        "scratch_peak_bytes": 70,
    }
    metrics = spend.spend_metrics("optimize", total)
    assert metrics["bytes/optimize/uploaded"] == 150 and metrics["timing/optimize/commit"] == 2.0
    assert all(spend.is_spend_metric(key) for key in metrics) and not spend.is_spend_metric("optimize/loss")
    records = [{"update": 3, **metrics, "timing/sample/generation": 4.0, "sample/reward_mean": 0.5}]
    (update,) = updates_spend(records)
    assert update.update == 3 and update.total_s == 7.5 and update.scratch_peak == 70
    assert "| 3 | 7.50 |" in spend_markdown("run", [update])
