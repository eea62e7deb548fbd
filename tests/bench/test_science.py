"""bench/science.py's analysis on hand-made curves: pairing, equal-token matching for every arm, VinePPO
time-to-reach, and carrying committed runs (checked against any rerun)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from probepo.report.stats import paired_t_power
from probepo.report.summary import RunCurves
from probepo.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import science_cpu
import science_output
import science_plan
import science_report
from benchlib import cpu_kind
from science_report import ArmResult, Curve

N = 2
UNSTAMPED = SimpleNamespace(get_versioned=lambda key: None)
"""The objects of a store whose runs were trained before science_cpu's stamps."""
DIAGNOSED = {"residual_to_grpo_advantage": 0.1, "zero_signal_groups": 0.5, "probe_success_rate": 0.3}


def curves(name: str, accuracy: list[float], tokens_per_update: float, wall_per_update: float) -> Curve:
    updates = list(range(len(accuracy)))
    return Curve(
        run_id=name,
        eval_updates=updates,
        accuracy=accuracy,
        greedy=[round(a + 0.1, 4) for a in accuracy],
        eval_tokens=[tokens_per_update * u for u in updates],
        eval_wall_s=[wall_per_update * u for u in updates],
    )


def test_analysis_pairs_seeds_matches_tokens_and_times_vineppo():
    plan = science_plan
    arms = {a.name: a for a in (plan.GRPO_EQUAL_TOKENS, plan.PROBEPO, plan.VINEPPO, plan.TREEPO)}
    testbed = science_plan.Testbed("t", "configs/cpu-demo.yaml", N, tuple(arms.values()))
    # GRPO runs 4N updates at 100 tokens each; ProbePO spends 300 tokens per update, TreePO 50.
    grpo = [
        curves("g0", [0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6], 100, 1),
        curves("g1", [0.3] * 9, 100, 1),
    ]
    probepo = [curves("p0", [0.2, 0.35, 0.45], 300, 2), curves("p1", [0.3, 0.33, 0.36], 300, 2)]
    vineppo = [curves("v0", [0.2, 0.3, 0.4], 3000, 20), curves("v1", [0.3, 0.3, 0.3], 3000, 20)]
    treepo = [curves("t0", [0.2, 0.3, 0.3], 50, 1), curves("t1", [0.3, 0.3, 0.4], 50, 1)]
    # A third ProbePO seed that VinePPO lacks: the time-to-reach pairs seeds, so it must not count.
    probepo.append(curves("p2", [0.9, 0.9, 0.9], 300, 2))
    collected = {
        "t": {
            "grpo": ArmResult(arms["grpo"], grpo, DIAGNOSED),
            "probepo": ArmResult(arms["probepo"], probepo, DIAGNOSED),
            "vineppo": ArmResult(arms["vineppo"], vineppo, DIAGNOSED),
            "treepo": ArmResult(arms["treepo"], treepo, {}),
        }
    }
    result = science_report.analyse([testbed], collected)["t"]
    # Equal updates: GRPO at update N (0.4 and 0.3), not at the end of its longer run.
    assert result["arms"]["grpo"]["seeds"] == [0.4, 0.3]
    diff = result["minus_grpo_equal_updates"]["probepo"]
    assert diff["mean"] == pytest.approx(100 * ((0.45 - 0.4) + (0.36 - 0.3)) / 2) and diff["seeds"] == 2
    # Equal tokens: ProbePO's 600 tokens at update N = GRPO's update 6 (0.6 and 0.3).
    tokens = result["minus_grpo_equal_tokens"]
    assert tokens["probepo"]["grpo_matched"]["seeds"] == [0.6, 0.3]
    assert tokens["probepo"]["mean"] == pytest.approx(100 * ((0.45 - 0.6) + 0.06) / 2)
    # TreePO's 100 tokens at update N = GRPO's update 1 (0.3 and 0.3): fewer updates than N for GRPO.
    assert tokens["treepo"]["grpo_matched"]["seeds"] == [0.3, 0.3]
    assert tokens["treepo"]["mean"] == pytest.approx(100 * (0.0 + 0.1) / 2)
    assert tokens["treepo"]["grpo_token_fraction"] == 1.0
    # VinePPO's 6000 tokens lie beyond GRPO's 800: its last evaluation stands in, and the fraction says so.
    assert tokens["vineppo"]["grpo_token_fraction"] == pytest.approx(800 / 6000, abs=1e-3)
    # ProbePO against the other baselines, paired by seed at equal updates.
    assert result["probepo_minus"]["treepo"]["mean"] == pytest.approx(100 * ((0.45 - 0.3) + (0.36 - 0.4)) / 2)
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
    text = science_output.markdown({"t": result})
    assert "| probepo | 3 |" in text and "power" in text
    assert "| treepo | 2 |" in text and "ProbePO − TreePO (paired by seed, equal updates)" in text
    assert "† GRPO's 4× run ended before" in text and "vineppo (13 %)" in text


def test_equal_tokens_beyond_grpo_run_uses_its_last_evaluation_and_says_so():
    grpo = [curves("g", [0.2, 0.3, 0.4, 0.5, 0.6], 100, 1)]  # 4 updates: 400 tokens at most
    probepo = [curves("p", [0.2, 0.3, 0.35], 250, 2)]  # 500 tokens at update N = 2
    result = science_report._equal_tokens(probepo, grpo, N)
    assert result["grpo_matched"]["seeds"] == [0.6]
    assert result["grpo_token_fraction"] == 0.8
    assert result["mean"] == pytest.approx(-25.0)


def _run_curves(curve: Curve, wall_factor: float = 1.0) -> RunCurves:
    """A store run whose evaluations are `curve`'s (one training update between evaluations)."""
    return RunCurves(
        run_id=curve.run_id,
        algorithm="grpo",
        eval_updates=curve.eval_updates,
        accuracy=curve.accuracy,
        stderr=[0.0] * len(curve.accuracy),
        greedy=curve.greedy,
        reward=[0.0] * curve.eval_updates[-1],
        sampled_tokens=[float(t) for t in curve.eval_tokens[1:]],
        wall_s=[w * wall_factor for w in curve.eval_wall_s[1:]],
    )


def test_committed_runs_are_carried_and_a_rerun_must_reproduce_them(monkeypatch):
    arm = science_plan.Arm("grpo", science_plan.GRPO, 3, "GRPO")
    testbed = science_plan.Testbed("t", "configs/cpu-demo.yaml", N, (arm,))
    committed_curves = [curves(f"old{s}", [0.2, 0.3 + s / 10, 0.4], 100, 1) for s in range(3)]
    committed = {
        ("t", "grpo"): {
            "overrides": arm.overrides,
            "first_seed": 0,
            "measured": "2026-12-01T00:00:00+00:00",
            "reproduced": [],
            "diagnostics": DIAGNOSED,
            "runs": [c.record(s) for s, c in enumerate(committed_curves)],
        }
    }
    store_runs: dict[str, RunCurves] = {}
    store = SimpleNamespace(url="memory://science", runs=lambda: list(store_runs), objects=UNSTAMPED)
    monkeypatch.setattr(science_report, "load_curves", lambda _store, run: store_runs[run])
    monkeypatch.setattr(science_report, "diagnostics", lambda *_: DIAGNOSED)
    ids = [
        science_plan.run_id(testbed, arm, science_plan.arm_config(testbed, arm, s, store.url))
        for s in range(3)
    ]
    seed0 = ids[0]

    # Nothing in the store: the committed curves stand, marked as carried.
    result = science_report.collect([testbed], store, committed)[0]["t"]["grpo"]
    assert result.carried and result.curves == committed_curves and result.reproduced == []

    # Seed 0 rerun (on a machine twice as slow): the same evaluations, so it reproduces.
    store_runs[seed0] = _run_curves(committed_curves[0], wall_factor=2.0)
    result = science_report.collect([testbed], store, committed)[0]["t"]["grpo"]
    assert result.carried and result.reproduced == [{"seed": 0, "wall_ratio": 2.0}]

    # A rerun whose accuracy differs means the engine changed: the analysis stops and says what to do.
    changed = curves("new0", [0.2, 0.3, 0.41], 100, 1)
    store_runs[seed0] = _run_curves(changed)
    with pytest.raises(SystemExit, match=r"differ from.*rerun the arm's seeds"):
        science_report.collect([testbed], store, committed)
    # Without the committed results (--fresh) the store alone is analysed.
    result = science_report.collect([testbed], store, {})[0]["t"]["grpo"]
    assert not result.carried and result.curves == [Curve.of(store_runs[seed0])]

    # Every seed rerun: the arm comes from the store, with what reproduced and what changed.
    store_runs.update({ids[s]: _run_curves(committed_curves[s], wall_factor=0.5) for s in (1, 2)})
    result = science_report.collect([testbed], store, committed)[0]["t"]["grpo"]
    assert not result.carried and result.differs == [0]
    assert result.reproduced == [{"seed": 1, "wall_ratio": 0.5}, {"seed": 2, "wall_ratio": 0.5}]
    # Read again against the results it wrote, a run is not a rerun: what was recorded stays.
    written = {
        ("t", "grpo"): {
            **committed[("t", "grpo")],
            "runs": [c.record(s) for s, c in enumerate(result.curves)],
        }
    }
    written[("t", "grpo")]["reproduced"] = result.reproduced
    again = science_report.collect([testbed], store, written)[0]["t"]["grpo"]
    assert (
        again.reproduced == result.reproduced
        and again.differs == []
        and again.measured == "2026-12-01T00:00:00+00:00"
    )

    # A redefined arm's committed runs measure something else: they are not carried.
    committed[("t", "grpo")]["overrides"] = {"algo.algorithm": "grpo", "group_size": 32}
    result = science_report.collect([testbed], store, committed)[0]["t"]["grpo"]
    assert not result.carried


def test_a_testbed_whose_rerun_changed_withholds_its_committed_arms(monkeypatch):
    grpo = science_plan.Arm("grpo", science_plan.GRPO, 1, "GRPO")
    vine = science_plan.Arm("vineppo", {"algo.algorithm": "vineppo"}, 1, "VinePPO")
    testbed = science_plan.Testbed("t", "configs/cpu-demo.yaml", N, (grpo, vine))
    old = {name: curves(f"old-{name}", [0.2, 0.3, 0.4], 100, 1) for name in ("grpo", "vineppo")}
    committed = {
        ("t", arm.name): {
            "overrides": arm.overrides,
            "first_seed": 0,
            "measured": "2026-12-01T00:00:00+00:00",
            "reproduced": [],
            "diagnostics": DIAGNOSED,
            "runs": [old[arm.name].record(0)],
        }
        for arm in (grpo, vine)
    }
    run = science_plan.run_id(testbed, grpo, science_plan.arm_config(testbed, grpo, 0, "memory://science"))
    store_runs = {run: _run_curves(curves("new", [0.3, 0.4, 0.5], 100, 1))}
    store = SimpleNamespace(url="memory://science", runs=lambda: list(store_runs), objects=UNSTAMPED)
    monkeypatch.setattr(science_report, "load_curves", lambda _store, run: store_runs[run])
    monkeypatch.setattr(science_report, "diagnostics", lambda *_: DIAGNOSED)

    results, withheld = science_report.collect([testbed], store, committed)
    # GRPO from another starting point cannot be paired with the committed VinePPO: it is withheld.
    assert list(results["t"]) == ["grpo"] and results["t"]["grpo"].differs == [0]
    assert list(withheld["t"]) == ["vineppo"] and withheld["t"]["vineppo"]["runs"] == [
        old["vineppo"].record(0)
    ]
    entry = science_report.analyse([testbed], results, withheld)["t"]
    assert "vineppo" not in entry["arms"] and entry["withheld"] == withheld["t"]
    notes = science_output._notes(entry)
    assert any(
        line.startswith("Withheld: vineppo (measured 2026-12-01, engine carried-generator)") for line in notes
    )
    # the arms compared are of one engine, and the table says which
    assert entry["arms"]["grpo"]["engine"] == "chunk-seeded"
    assert "Engine of every arm in this table: chunk-seeded (bench/science_plan.py, ENGINE)." in notes
    # Read again against what it wrote (GRPO now matches the file), VinePPO stays withheld.
    written = {
        **committed,
        ("t", "grpo"): {**committed[("t", "grpo")], "runs": [results["t"]["grpo"].curves[0].record(0)]},
    }
    written[("t", "vineppo")] = {**withheld["t"]["vineppo"], "withheld": True}
    results, withheld = science_report.collect([testbed], store, written)
    assert list(results["t"]) == ["grpo"] and list(withheld["t"]) == ["vineppo"]

    # A new store holding only VinePPO rerun from GRPO's checkpoint: GRPO is carried, and VinePPO, withheld
    # before, is expected to change: it rejoins the table without withholding GRPO.
    del store_runs[run]
    vine_run = science_plan.run_id(testbed, vine, science_plan.arm_config(testbed, vine, 0, store.url))
    store_runs[vine_run] = _run_curves(curves("new-vine", [0.3, 0.45, 0.5], 300, 3))
    results, withheld = science_report.collect([testbed], store, written)
    assert sorted(results["t"]) == ["grpo", "vineppo"] and withheld == {}
    assert results["t"]["grpo"].carried and results["t"]["vineppo"].differs == [0]

    # GRPO carried beside a VinePPO run from another warm-up checkpoint (its accuracy at update 0 differs):
    # nothing compared changed on rerun, yet the two cannot pair, so GRPO is withheld.
    store_runs[vine_run] = _run_curves(curves("other-start", [0.25, 0.45, 0.5], 300, 3))
    written[("t", "vineppo")] = {**written[("t", "vineppo")], "withheld": False, "runs": []}
    results, withheld = science_report.collect([testbed], store, written)
    assert list(results["t"]) == ["vineppo"] and list(withheld["t"]) == ["grpo"]


def test_the_tree_arms_pair_with_grpo_and_probepo_seeds():
    for name in ("modchain", "pointer"):
        testbed = next(t for t in science_plan.PLAN if t.name == name)
        arms = {a.name: a for a in testbed.arms}
        assert arms["spo_tree"].overrides == {"algo.algorithm": "spo_tree"}
        assert arms["treepo"].overrides == {"algo.algorithm": "treepo"}
        for tree in ("spo_tree", "treepo"):
            assert list(arms[tree].seed_range) == list(arms["grpo"].seed_range) == list(range(10))
            assert arms[tree].horizon == 1


def test_replication_uses_its_fresh_seeds_and_the_power_it_was_sized_for():
    replication = next(t for t in science_plan.PLAN if t.name == "modchain-replication")
    assert {a.name: list(a.seed_range) for a in replication.arms} == {
        "grpo": list(range(10, 40)),
        "probepo": list(range(10, 40)),
    }
    assert all(a.horizon == 1 and a.overrides in ({}, science_plan.GRPO) for a in replication.arms)
    # The plan's arithmetic: 30 seeds, SD 2.2 points, +1.2 points -> about 80 % power.
    power = paired_t_power(science_plan.PLANNED_EFFECT, science_plan.PLANNED_SD, 30)
    assert power == pytest.approx(0.8, abs=0.04)


def test_time_to_reach_compares_wall_times_only_within_one_session():
    probepo = [curves("p", [0.2, 0.35, 0.45], 300, 2)]
    vineppo = [curves("v", [0.2, 0.3, 0.4], 3000, 20)]
    # ProbePO's curve reaches VinePPO's final 0.4 halfway between its evaluations 1 and 2.
    within = science_report._time_to_reach(probepo, vineppo, N, one_session=True)
    assert within["ratio_wall"] == pytest.approx(3 / 40)
    assert within["ratio_tokens"] == pytest.approx(450 / 6000)
    assert "after 3 s of training wall time" in science_output._reach_text(within)
    across = science_report._time_to_reach(probepo, vineppo, N, one_session=False)
    assert "ratio_wall" not in across and across["ratio_tokens"] == within["ratio_tokens"]
    text = science_output._reach_text(across)
    assert "× VinePPO's sampled tokens" in text and "wall times are not compared" in text


def test_a_run_is_finished_on_the_kind_of_cpu_that_began_it_and_a_testbed_is_one_kinds(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    science_cpu.stamp(store, "run-a")
    science_cpu.stamp(store, "run-a")  # resumed on the same kind
    mine = science_cpu.stamps(store, ["run-a", "run-b"])
    assert list(mine) == ["run-a"] and mine["run-a"]["cpu"] == cpu_kind()
    assert science_cpu.one_kind("testbed t", mine, cpu_kind()) == mine["run-a"]["machine"]
    assert (
        science_cpu.trained_on("t/grpo", science_cpu.stamps(store, ["run-b"])) == science_cpu.machine()
    )  # before the stamps
    monkeypatch.setattr(science_cpu, "cpu_kind", lambda: "Other CPU (AVX512 kernels)")
    other = r"and this is Other CPU \(AVX512 kernels\): its bits would be two kinds of CPU's"
    with pytest.raises(RuntimeError, match=rf"run run-a was begun on .* {other}"):
        science_cpu.stamp(store, "run-a")
    science_cpu.stamp(store, "run-b")
    with pytest.raises(SystemExit, match=r"testbed t: its runs are of 2 kinds of CPU"):
        science_cpu.trained_on("testbed t", science_cpu.stamps(store, ["run-a", "run-b"]))
    with pytest.raises(SystemExit, match=r"testbed t: its runs are of 2 kinds of CPU"):
        science_cpu.one_kind("testbed t", science_cpu.stamps(store, ["run-a"]), "Other CPU (AVX512 kernels)")
