"""The spend counters: timed pieces add up without double counting, nothing counts outside an attempt, and
attempts sum into an update's metrics and the report's breakdown."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from probepo import spend
from probepo.report.spend import spend_markdown, updates_spend


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


def test_the_spend_model_at_7b_matches_the_code_paths_it_follows():
    from probepo.spend.model import PolicySizes, UpdateShape, estimate, stop_seconds

    sizes = PolicySizes.of(7_000_000_000, dtype="bfloat16", trainer="deepspeed")
    assert (sizes.weights, sizes.optimizer) == (14_000_000_000, 84_000_000_000)
    shape = UpdateShape(sizes, ranks=8, ranks_per_node=8, checkpoint_every=10, handoff="file")
    found = estimate(shape)
    # plain: the hand-off's host copy and the weights to vLLM through a file; the fingerprint copies nothing
    assert found.plain.bytes == {"host_copy": sizes.weights, "handoff_file": sizes.weights}
    assert found.plain.seconds["digest"] == pytest.approx(sizes.weights / 8 / 32.3e9)
    # a checkpoint update saves and uploads the node's whole checkpoint once (no part without a stop)
    assert found.checkpoint.bytes["uploaded"] == sizes.checkpoint == found.checkpoint.bytes["scratch"]
    assert found.checkpoint.bytes["host_copy"] == sizes.weights + sizes.weights + sizes.optimizer // 8
    amortised = found.amortised_seconds()
    assert amortised["commit"] == pytest.approx(sizes.checkpoint / 2.5e9 / 10)
    # rank 0's save: its weights (save_pretrained routed to the writer) and shard, through the pinned buffer
    save = (sizes.weights + sizes.optimizer / 8) / 50e9 + sizes.checkpoint / 10e9
    assert found.checkpoint.seconds["save"] == pytest.approx(save)
    # a stop's part takes the same save and upload of the grace window, blocking: ~49 s at 7B
    assert stop_seconds(shape) == pytest.approx(save + sizes.checkpoint / 2.5e9)
    assert found.total_s == pytest.approx(sum(amortised.values()))
    # the upload runs beside the next updates; the save, the fingerprint and the hand-off block
    assert found.checkpoint.beside_seconds == {"commit": pytest.approx(sizes.checkpoint / 2.5e9)}
    assert found.checkpoint.beside_bytes == {"uploaded": sizes.checkpoint}
    assert found.amortised_seconds(beside=True) == {"commit": amortised["commit"]}
    assert set(found.amortised_seconds(beside=False)) == {"digest", "handoff", "save"}
    assert found.beside_s == pytest.approx(amortised["commit"])
    assert found.blocking_s + found.beside_s == pytest.approx(found.total_s)
    assert found.checkpoint.seconds["digest"] == found.plain.seconds["digest"]  # a resume replays k + 1
    assert found.checkpoint_wait_s(104.0) == 0  # a 39 s upload against 10 updates of 104 s
    assert found.checkpoint_wait_s(1.0) == pytest.approx((sizes.checkpoint / 2.5e9 - 10) / 10)
    # the 8 ranks' vLLM files share the node's disk
    assert found.plain.seconds["handoff"] == pytest.approx(
        sizes.weights / 25e9 + 8 * sizes.weights / 10e9 + 8 * sizes.weights / 20e9
    )
    per_stage = estimate(UpdateShape(sizes, ranks=8, ranks_per_node=8, resident=False, handoff="file"))
    assert per_stage.every == 1 and per_stage.plain == per_stage.checkpoint
    # a job per stage commits each checkpoint inside optimize: nothing beside, no fingerprint
    assert per_stage.beside_s == 0 and per_stage.blocking_s == per_stage.total_s
    assert "digest" not in per_stage.checkpoint.seconds
    assert per_stage.moved_bytes(per_stage.checkpoint) > 4 * sizes.checkpoint > found.moved_bytes(found.plain)


def test_check_warns_when_the_trainers_grace_window_cannot_hold_a_stops_part():
    from probepo.checks.spend import spend_findings
    from probepo.presets import load_profile, load_run_config
    from slurm.executors import executor_for

    root = Path(__file__).resolve().parents[2] / "configs"
    config = load_run_config(root / "deepseekmath-7b-sft.yaml")
    profile = load_profile(root / "profiles" / "h200-node.yaml")
    found = spend_findings(config, profile, "resident", executor_for("resident"), 6_910_365_696)
    assert found.warnings == [] and found.passed[0].startswith("spend: ")  # 300 s hold ~49 s
    # both figures, per update amortised: what the updates wait for, and the upload beside them
    assert found.passed[0].startswith(
        "spend: about 1.1 s of state movement blocking each update under resident (8 trainer rank(s),"
        " amortised over checkpoint_every 10: digest 0.05, handoff 0.01, save 1.02) + 3.9 s beside the"
        " updates (commit 3.87: each checkpoint's upload, 39 s, while the next updates train; it blocks an"
        " update only where it outlasts checkpoint_every updates); GB moved by rank 0 in a plain update:"
    )
    driver = profile.stages["driver"].model_copy(update={"signal_grace_s": 30})
    short = profile.model_copy(update={"stages": {**profile.stages, "driver": driver}})
    (warning,) = spend_findings(config, short, "resident", executor_for("resident"), 6_910_365_696).warnings
    assert (
        "the trainer's job has signal_grace_s 30 but a stop inside a checkpoint update's optimizer" in warning
    )
    assert "saves and uploads 96.7 GB, ~49 s at stated bandwidths" in warning
