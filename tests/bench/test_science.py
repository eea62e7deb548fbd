"""bench/science.py's analysis on hand-made curves: pairing, equal-token matching, VinePPO time-to-reach."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from probepo.report import RunCurves

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import science

N = 2
DIAGNOSED = {"residual_to_grpo_advantage": 0.1, "zero_signal_groups": 0.5, "probe_success_rate": 0.3}


def curves(name: str, accuracy: list[float], tokens_per_update: float, wall_per_update: float) -> RunCurves:
    updates = len(accuracy) - 1
    return RunCurves(
        run_id=name,
        algorithm=name,
        eval_updates=list(range(updates + 1)),
        accuracy=accuracy,
        stderr=[0.01] * len(accuracy),
        greedy=[a + 0.1 for a in accuracy],
        reward=[0.3] * updates,
        sampled_tokens=[tokens_per_update * (u + 1) for u in range(updates)],
        wall_s=[wall_per_update * (u + 1) for u in range(updates)],
    )


def test_analysis_pairs_seeds_matches_tokens_and_times_vineppo():
    arms = {a.name: a for a in (science.GRPO_EQUAL_TOKENS, science.PROBEPO, science.VINEPPO)}
    testbed = science.Testbed("t", "configs/cpu-demo.yaml", N, tuple(arms.values()))
    # GRPO runs 4N updates at 100 tokens each; ProbePO spends 300 tokens per update.
    grpo = [
        curves("g0", [0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6], 100, 1),
        curves("g1", [0.3] * 9, 100, 1),
    ]
    probepo = [curves("p0", [0.2, 0.35, 0.45], 300, 2), curves("p1", [0.3, 0.33, 0.36], 300, 2)]
    vineppo = [curves("v0", [0.2, 0.3, 0.4], 3000, 20), curves("v1", [0.3, 0.3, 0.3], 3000, 20)]
    # A third ProbePO seed that VinePPO lacks: the time-to-reach pairs seeds, so it must not count.
    probepo.append(curves("p2", [0.9, 0.9, 0.9], 300, 2))
    collected = {
        "t": {
            "grpo": science.ArmResult(arms["grpo"], grpo, [DIAGNOSED] * 2),
            "probepo": science.ArmResult(arms["probepo"], probepo, [DIAGNOSED] * 3),
            "vineppo": science.ArmResult(arms["vineppo"], vineppo, [DIAGNOSED] * 2),
        }
    }
    result = science.analyse([testbed], collected)["t"]
    # Equal updates: GRPO at update N (0.4 and 0.3), not at the end of its longer run.
    assert result["arms"]["grpo"]["seeds"] == [0.4, 0.3]
    diff = result["minus_grpo_equal_updates"]["probepo"]
    assert diff["mean"] == pytest.approx(100 * ((0.45 - 0.4) + (0.36 - 0.3)) / 2) and diff["seeds"] == 2
    # Equal tokens: ProbePO's 600 tokens at update N = GRPO's update 6 (0.6 and 0.3).
    assert result["grpo_token_matched"]["seeds"] == [0.6, 0.3]
    assert result["probepo_minus_grpo_equal_tokens"]["mean"] == pytest.approx(100 * ((0.45 - 0.6) + 0.06) / 2)
    # VinePPO's mean final 0.35 is first reached by ProbePO's mean curve (0.25, 0.34, 0.405) between its
    # evaluations 1 and 2: at 2 + 2 × (0.35 − 0.34) / 0.065 s of training, of VinePPO's 40 s.
    reach = result["vineppo_time_to_reach"]
    assert reach["vineppo_final_accuracy"] == 35.0
    assert reach["probepo_wall_to_reach"] == pytest.approx(2 + 2 * 0.01 / 0.065, abs=0.05)
    assert reach["ratio_wall"] == pytest.approx(reach["probepo_wall_to_reach"] / 40, abs=1e-3)
    assert reach["seeds"] == 2
    # Every run's whole curve is kept, with its seed.
    runs = result["arms"]["probepo"]["runs"]
    assert [r["seed"] for r in runs] == [0, 1, 2] and runs[0]["accuracy"] == [0.2, 0.35, 0.45]
    assert runs[0]["tokens"] == [0, 300, 600] and runs[0]["wall_s"] == [0, 2, 4]
    assert diff["power"] is not None and 0 <= diff["power"] <= 1 and "sd" in diff
    text = science.markdown({"t": result})
    assert "| probepo | 3 |" in text and "at equal sampled tokens" in text and "power" in text


def test_equal_tokens_beyond_grpo_run_uses_its_last_evaluation_and_says_so():
    grpo = [curves("g", [0.2, 0.3, 0.4, 0.5, 0.6], 100, 1)]  # 4 updates: 400 tokens at most
    probepo = [curves("p", [0.2, 0.3, 0.35], 250, 2)]  # 500 tokens at update N = 2
    result = science._equal_tokens(probepo, grpo, N)
    assert result["grpo_token_matched"]["seeds"] == [0.6]
    assert result["grpo_token_matched"]["grpo_token_fraction"] == 0.8
    assert result["probepo_minus_grpo_equal_tokens"]["mean"] == pytest.approx(-25.0)


def test_replication_uses_its_fresh_seeds_and_the_power_it_was_sized_for():
    replication = next(t for t in science.PLAN if t.name == science.REPLICATION)
    assert {a.name: list(a.seed_range) for a in replication.arms} == {
        "grpo": list(range(10, 40)),
        "probepo": list(range(10, 40)),
    }
    assert all(a.horizon == 1 and a.overrides in ({}, science.GRPO) for a in replication.arms)
    # The plan's arithmetic: 30 seeds, SD 2.2 points, +1.2 points -> about 80 % power.
    assert science.paired_t_power(science.PLANNED_EFFECT, science.PLANNED_SD, 30) == pytest.approx(
        0.8, abs=0.04
    )
