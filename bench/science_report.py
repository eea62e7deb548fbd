"""The science bench's analysis: every arm's curves (from the store, or carried from the committed
results and checked against any rerun), paired differences at equal updates and at equal sampled tokens,
plots, and the tables of docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from science_cpu import one_kind, stamps, trained_on
from science_plan import (
    EARLIER_ENGINE,
    ENGINE,
    PLANNED_EFFECT,
    ROOT,
    Arm,
    Testbed,
    arm_config,
    run_id,
)

from probepo.report.stats import (
    first_reach,
    mean_and_stderr,
    paired_bootstrap_ci,
    paired_t_ci95,
    paired_t_power,
    value_at,
)
from probepo.report.summary import RunCurves, load_curves
from probepo.store import ArtifactStore

RESULTS = ROOT / "bench" / "results" / "science.json"


@dataclass(frozen=True)
class Curve:
    """One run as the analysis reads it, at science.json's rounding: accuracy (temperature 1, greedy),
    sampled tokens and training wall time at each evaluated update."""

    run_id: str
    eval_updates: list[int]
    accuracy: list[float]
    greedy: list[float]
    eval_tokens: list[float]
    eval_wall_s: list[float]

    @classmethod
    def of(cls, run: RunCurves) -> Curve:
        return cls(
            run.run_id,
            list(run.eval_updates),
            [round(x, 4) for x in run.accuracy],
            [round(x, 4) for x in run.greedy],
            [round(x) for x in run.eval_tokens],
            [round(x, 2) for x in run.eval_wall_s],
        )

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Curve:
        """A `runs` entry of science.json."""
        keys = ("run_id", "updates", "accuracy", "greedy", "tokens", "wall_s")
        return cls(*(record[key] for key in keys))

    def record(self, seed: int) -> dict[str, Any]:
        return {
            "seed": seed,
            "run_id": self.run_id,
            "updates": self.eval_updates,
            "accuracy": self.accuracy,
            "greedy": self.greedy,
            "tokens": self.eval_tokens,
            "wall_s": self.eval_wall_s,
        }

    def same_measurement(self, other: Curve) -> bool:
        """The same evaluations, accuracies and token counts (wall time depends on the machine's load)."""
        keys = ("eval_updates", "accuracy", "greedy", "eval_tokens")
        return all(getattr(self, key) == getattr(other, key) for key in keys)

    def accuracy_at(self, update: int) -> float:
        if update not in self.eval_updates:
            raise KeyError(f"run {self.run_id} was not evaluated at update {update} ({self.eval_updates})")
        return self.accuracy[self.eval_updates.index(update)]


@dataclass
class ArmResult:
    """What one arm's seeds gave, paired by seed index, and where the runs come from."""

    arm: Arm
    curves: list[Curve]
    diagnostics: dict[str, float]
    measured: str = ""
    """When the runs were analysed from a store (the date of the results file that first held them)."""
    carried: bool = False
    """The curves are the committed results', not this store's (which may rerun some seeds: `reproduced`)."""
    reproduced: list[dict[str, float]] = field(default_factory=list)
    """Seeds rerun that gave the committed curves exactly, each with its wall-time ratio (rerun /
    committed): how the machine's speed compared between the two measurements."""
    differs: list[int] = field(default_factory=list)
    """Seeds whose rerun in this store changed the committed curve (an arm measured anew)."""
    engine: str = ENGINE
    """The engine that measured the curves (science_plan.ENGINE for this store's runs)."""
    machine: str = ""
    """The machine that measured the curves (benchlib.machine(); empty for entries written before it was
    recorded): arms pair only when one kind of CPU measured them, since its kernels' rounding moves the
    shared warm-up checkpoint and so every run."""


def diagnostics(store: ArtifactStore, run: str, updates: int) -> dict[str, float]:
    """Over the first `updates` updates: the mean |token advantage − GRPO advantage| relative to the mean
    |GRPO advantage| (how much redistribution changes), the share of groups with no GRPO signal (all
    rewards equal), and the success rate of probe continuations. Empty for the tree methods, whose
    advantages are not a per-response GRPO advantage redistributed."""
    records = [
        m for m in store.read_metrics(run) if "advantage/residual_abs_mean" in m and m["update"] < updates
    ]
    if not records:
        return {}
    seq = sum(m["advantage/seq_adv_abs_mean"] for m in records)
    return {
        "residual_to_grpo_advantage": sum(m["advantage/residual_abs_mean"] for m in records) / seq
        if seq
        else 0.0,
        "zero_signal_groups": sum(m["advantage/zero_signal_fraction"] for m in records) / len(records),
        "probe_success_rate": sum(m.get("probe/success_rate", 0.0) for m in records) / len(records),
    }


def _mean_diagnostics(per_run: Sequence[dict[str, float]]) -> dict[str, float]:
    if not per_run or not per_run[0]:
        return {}
    return {key: round(sum(d[key] for d in per_run) / len(per_run), 4) for key in per_run[0]}


def committed_arms(path: Path = RESULTS) -> dict[tuple[str, str], dict[str, Any]]:
    """(testbed, arm) → that arm's entry in a results file (`measured` is the file's date, and nothing
    `reproduced`, for entries written before those were recorded); a withheld arm's entry says so."""
    if not path.exists():
        return {}
    payload = json.loads(path.read_text())
    return {
        (testbed, name): {
            "measured": payload["date"],
            "reproduced": [],
            "engine": EARLIER_ENGINE,
            **arm,
            "withheld": kind == "withheld",
        }
        for testbed, entry in payload["testbeds"].items()
        for kind in ("arms", "withheld")
        for name, arm in entry.get(kind, {}).items()
    }


def _stored(
    testbed: Testbed, arm: Arm, store: ArtifactStore, stored: set[str]
) -> tuple[list[Curve], list[dict[str, float]], list[str]]:
    """The arm's finished runs in the store, their diagnostics and run ids, up to its first unfinished seed
    (seeds pair by index)."""
    curves, diagnosed, runs = [], [], []
    for seed in arm.seed_range:
        config = arm_config(testbed, arm, seed, store.url)
        run = run_id(testbed, arm, config)
        curve = Curve.of(load_curves(store, run)) if run in stored else None
        if curve is None or not curve.eval_updates or curve.eval_updates[-1] != config.num_updates:
            break
        curves.append(curve)
        diagnosed.append(diagnostics(store, run, testbed.updates))
        runs.append(run)
    return curves, diagnosed, runs


def _reruns(
    arm: Arm, curves: Sequence[Curve], committed: Sequence[Curve], before: Sequence[dict[str, float]]
) -> tuple[list[dict[str, float]], list[int]]:
    """Seed by seed, the store's run against the committed one: (the seeds it reproduced, with the wall
    ratio, merged into those recorded `before`; the seeds whose rerun changed). A run identical to the
    committed one, wall time included, is the same run read again, not a rerun."""
    reproduced = {r["seed"]: r for r in before}
    differs = []
    for seed, new, old in zip(arm.seed_range, curves, committed, strict=False):
        if new == old:
            continue
        if not new.same_measurement(old):
            differs.append(seed)
            reproduced.pop(seed, None)  # what an earlier rerun of this seed reproduced no longer holds
            continue
        ratio = new.eval_wall_s[-1] / old.eval_wall_s[-1] if old.eval_wall_s[-1] else math.nan
        reproduced[seed] = {"seed": seed, "wall_ratio": round(ratio, 3)}
    return [reproduced[seed] for seed in sorted(reproduced)], differs


def _same_start(a: Sequence[Curve], b: Sequence[Curve]) -> bool:
    """Seed by seed (as far as both go), the same accuracies (temperature 1, greedy) at update 0: the
    same warm-up checkpoint, which every arm of a testbed starts from."""
    pairs = zip(a, b, strict=False)
    return all((x.accuracy[0], x.greedy[0]) == (y.accuracy[0], y.greedy[0]) for x, y in pairs)


def collect(
    plan: Sequence[Testbed], store: ArtifactStore, committed: dict[tuple[str, str], dict[str, Any]]
) -> tuple[dict[str, dict[str, ArmResult]], dict[str, dict[str, dict[str, Any]]]]:
    """Every arm's runs. An arm comes from the store when the store has at least as many finished seeds
    as `committed` (the results file) holds for it, or the file has none; otherwise the file's curves are
    carried, and each seed rerun in the store must have given exactly the file's curve (else SystemExit:
    the engine's results changed and the arm must be rerun whole). Either way the reruns that reproduced
    the file's curves are recorded, and for an arm from the store the seeds whose rerun changed.

    A testbed is one measurement: once any of its compared arms changed on rerun (another machine's
    floating point, say, gave another warm-up checkpoint), or an arm from the store starts from another
    checkpoint than a committed one (its accuracies at update 0 differ), the committed arms no longer pair
    with the new ones and are withheld rather than carried, and stay withheld until they are rerun. An arm
    that was withheld is expected to change when it is rerun: that is how it rejoins the comparisons.
    Returns the arms and, per testbed, each withheld arm's committed entry (kept in the results file,
    never compared)."""
    today = datetime.now(UTC).isoformat(timespec="seconds")
    results: dict[str, dict[str, ArmResult]] = {}
    withheld: dict[str, dict[str, dict[str, Any]]] = {}
    stored = set(store.runs())
    for testbed in plan:
        to_carry: list[tuple[ArmResult, dict[str, Any]]] = []
        changed = False
        testbed_stamps: dict[str, dict[str, str]] = {}
        for arm in testbed.arms:
            what = f"{testbed.name}/{arm.name}"
            curves, diagnosed, runs = _stored(testbed, arm, store, stored)
            stamped = stamps(store, runs)
            testbed_stamps.update(stamped)
            before = committed.get((testbed.name, arm.name))
            if before is not None and (before["overrides"], before["first_seed"]) != (
                arm.overrides,
                arm.first_seed,
            ):
                before = None  # the arm was redefined: its old runs measure something else
            old = [] if before is None else [Curve.from_record(r) for r in before["runs"]]
            reproduced, differs = _reruns(arm, curves, old, [] if before is None else before["reproduced"])
            if before is None or len(curves) >= len(old):
                if curves:
                    # The same runs read again keep their date; any rerun or new seed is measured today.
                    same = before is not None and curves == old
                    measured = before["measured"] if same else today
                    trained = before.get("machine", "") if same else trained_on(what, stamped)
                    result = ArmResult(
                        arm,
                        curves,
                        _mean_diagnostics(diagnosed),
                        measured,
                        False,
                        reproduced,
                        differs,
                        engine=before.get("engine", EARLIER_ENGINE) if same else ENGINE,
                        machine=trained,
                    )
                    results.setdefault(testbed.name, {})[arm.name] = result
                    changed |= bool(differs) and not before.get("withheld")
                continue
            if differs:
                raise SystemExit(
                    f"{testbed.name}/{arm.name} seeds {differs}: the runs in {store.url} differ from those in"
                    f" {RESULTS}: the engine's results changed, so the committed ones no longer stand; rerun"
                    f" the arm's seeds (--arms {arm.name}) and analyse with --fresh"
                )
            carried = ArmResult(
                arm,
                old,
                before["diagnostics"],
                before["measured"],
                True,
                reproduced,
                engine=before.get("engine", EARLIER_ENGINE),
                machine=before.get("machine", ""),
            )
            to_carry.append((carried, before))
        one_kind(f"testbed {testbed.name}", testbed_stamps)
        from_store = list(results.get(testbed.name, {}).values())
        for carried, before in to_carry:
            other_start = any(not _same_start(result.curves, carried.curves) for result in from_store)
            if changed or before.get("withheld") or other_start:
                record = {"engine": EARLIER_ENGINE, **{k: v for k, v in before.items() if k != "withheld"}}
                withheld.setdefault(testbed.name, {})[carried.arm.name] = record
            else:
                results.setdefault(testbed.name, {})[carried.arm.name] = carried
    return results, withheld


def _summary(values: Sequence[float]) -> dict[str, float]:
    mean, se = mean_and_stderr(values)
    return {"mean": round(100 * mean, 2), "se": round(100 * se, 2)}


def _diff(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """mean(a − b) over the seeds both arms have, in points: the paired-t 95 % interval (`ci95_t`), the
    paired-bootstrap one beside it (`ci95`), the SD of the paired differences, and the test's `power`: the
    chance that a paired-t test on this many seeds excludes zero if the true effect were the +1.2 points
    the replication was sized for, at the SD measured here."""
    n = min(len(a), len(b))
    mean, low, high = paired_bootstrap_ci(a[:n], b[:n])
    result = {"mean": round(100 * mean, 2), "ci95": [round(100 * low, 2), round(100 * high, 2)], "seeds": n}
    if n >= 2:
        _, t_low, t_high = paired_t_ci95(a[:n], b[:n])
        sd = math.sqrt(n) * mean_and_stderr([x - y for x, y in zip(a[:n], b[:n], strict=True)])[1]
        result["ci95_t"] = [round(100 * t_low, 2), round(100 * t_high, 2)]
        result["sd"] = round(100 * sd, 2)
        result["power"] = round(paired_t_power(PLANNED_EFFECT, sd, n), 3) if sd > 0 else None
    return result


PROBEPO_VERSUS = ("grpo_g32", "spo_tree", "treepo")
"""The arms ProbePO is also compared with directly, paired by seed (the study's other baselines)."""


def analyse(
    plan: Sequence[Testbed],
    collected: dict[str, dict[str, ArmResult]],
    withheld: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Per testbed: each arm's final accuracies (temperature 1 and greedy), tokens and wall time; every
    arm minus GRPO at equal updates and at equal sampled tokens; ProbePO minus the other baselines;
    VinePPO time-to-reach; the committed arms `withheld` (see `collect`)."""
    out: dict[str, Any] = {}
    for testbed in plan:
        arms = collected.get(testbed.name, {})
        n = testbed.updates
        final = {name: [c.accuracy_at(n) for c in r.curves] for name, r in arms.items()}
        entry: dict[str, Any] = {
            "preset": testbed.preset,
            "overrides": testbed.overrides,
            "updates": n,
            "arms": {},
            "withheld": (withheld or {}).get(testbed.name, {}),
        }
        for name, result in arms.items():
            curves = result.curves
            at_n = [c.eval_updates.index(n) for c in curves]
            entry["arms"][name] = {
                "about": result.arm.about,
                "overrides": result.arm.overrides,
                "first_seed": result.arm.first_seed,
                "measured": result.measured,
                "engine": result.engine,
                "machine": result.machine,
                "carried": result.carried,
                "reproduced": result.reproduced,
                "differs_from_committed": result.differs,
                "seeds": final[name],
                "accuracy": _summary(final[name]),
                "greedy": _summary([c.greedy[i] for c, i in zip(curves, at_n, strict=True)])
                if all(c.greedy for c in curves)
                else None,
                "start": _summary([c.accuracy[0] for c in curves]),
                "sampled_tokens": round(
                    sum(c.eval_tokens[i] for c, i in zip(curves, at_n, strict=True)) / len(curves)
                ),
                "training_wall_s": round(
                    sum(c.eval_wall_s[i] for c, i in zip(curves, at_n, strict=True)) / len(curves), 1
                ),
                "diagnostics": result.diagnostics,
                "runs": [c.record(seed) for seed, c in zip(result.arm.seed_range, curves, strict=False)],
            }
        if "grpo" in arms:
            others = [name for name in arms if name != "grpo"]
            entry["minus_grpo_equal_updates"] = {name: _diff(final[name], final["grpo"]) for name in others}
            if arms["grpo"].arm.horizon > 1:
                grpo = arms["grpo"].curves
                entry["minus_grpo_equal_tokens"] = {
                    name: _equal_tokens(arms[name].curves, grpo, n) for name in others
                }
        if "probepo" in arms:
            entry["probepo_minus"] = {
                name: _diff(final["probepo"], final[name]) for name in PROBEPO_VERSUS if name in arms
            }
        if "vineppo" in arms and "probepo" in arms:
            vine = arms["vineppo"].curves
            paired = arms["probepo"].curves[: len(vine)]  # the seeds both arms have (both start at 0)
            one_session = arms["vineppo"].measured == arms["probepo"].measured
            entry["vineppo_time_to_reach"] = _time_to_reach(paired, vine[: len(paired)], n, one_session)
        out[testbed.name] = entry
    return out


def _equal_tokens(arm: Sequence[Curve], grpo: Sequence[Curve], n: int) -> dict[str, Any]:
    """The arm's accuracy after update n minus GRPO's at the arm's sampled tokens then, seed by seed,
    read off GRPO's longer run (linear between evaluations). Where that run ended before the arm's token
    count, its last evaluation stands in: GRPO then had fewer tokens, which favours the arm
    (`grpo_token_fraction` < 1)."""
    pairs = list(zip(arm, grpo, strict=False))  # the seeds both arms have
    targets = [a.eval_tokens[a.eval_updates.index(n)] for a, _ in pairs]
    matched = [
        value_at(g.eval_tokens, g.accuracy, t) if t <= g.eval_tokens[-1] else g.accuracy[-1]
        for (_, g), t in zip(pairs, targets, strict=True)
    ]
    fraction = min(min(1.0, g.eval_tokens[-1] / t) for (_, g), t in zip(pairs, targets, strict=True))
    return {
        **_diff([a.accuracy_at(n) for a, _ in pairs], matched),
        "grpo_matched": {"seeds": [round(a, 4) for a in matched], "accuracy": _summary(matched)},
        "grpo_token_fraction": round(fraction, 3),
    }


def mean_curve(curves: Sequence[Curve], axis: str) -> tuple[list[float], list[float]]:
    """(x, accuracy) averaged over seeds at each evaluated update; x is the mean update, tokens or wall."""
    updates = curves[0].eval_updates
    xs = {
        "update": lambda c: [float(u) for u in c.eval_updates],
        "tokens": lambda c: c.eval_tokens,
        "wall": lambda c: c.eval_wall_s,
    }[axis]
    mean_x = [sum(xs(c)[i] for c in curves) / len(curves) for i in range(len(updates))]
    mean_y = [sum(c.accuracy[i] for c in curves) / len(curves) for i in range(len(updates))]
    return mean_x, mean_y


def _time_to_reach(
    probepo: Sequence[Curve], vineppo: Sequence[Curve], n: int, one_session: bool
) -> dict[str, Any]:
    """How much of VinePPO's training wall time (and tokens) the mean ProbePO curve needs to first reach
    VinePPO's mean final accuracy (None if it never does within its N updates). Wall times compare only
    when both arms were measured in one session (`one_session`, same machine and load): else tokens only."""
    target = sum(c.accuracy_at(n) for c in vineppo) / len(vineppo)
    result: dict[str, Any] = {
        "vineppo_final_accuracy": round(100 * target, 2),
        "seeds": len(vineppo),
        "one_session": one_session,
    }
    for axis in ("wall", "tokens") if one_session else ("tokens",):
        px, py = mean_curve(probepo, axis)
        vx, _ = mean_curve(vineppo, axis)
        reach = first_reach(px, py, target)
        result[f"probepo_{axis}_to_reach"] = None if math.isnan(reach) else round(reach, 1)
        result[f"vineppo_{axis}_total"] = round(vx[-1], 1)
        result[f"ratio_{axis}"] = None if math.isnan(reach) else round(reach / vx[-1], 3)
    return result
