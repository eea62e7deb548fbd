"""Evidence: GRPO vs ProbePO vs VinePPO-dense on the CPU testbeds, over seeds, with intervals.

    .venv/bin/python bench/science.py                 # every arm of PLAN (resumable: rerun to continue)
    .venv/bin/python bench/science.py --analyse-only  # tables, plots and results from the store as it is

Each (testbed, arm, seed) is one `pipeline.train` run in its own process (one torch thread; `--jobs` at
once) in one store (`--store`, default out/science/store). Runs are named by their recipe, so a rerun
skips finished runs and resumes interrupted ones. All seeds of a testbed start from one shared warm-up
checkpoint and are evaluated on the same 1,024 held-out prompts at temperature 1 and greedily.

Pairing: seed s of every arm samples the same prompt batches and starts from the same checkpoint, so
arm differences are paired by seed (paired-t interval, and the paired bootstrap beside it).

Equal sampled tokens: the GRPO arm runs GRPO_HORIZON × the updates. Its first N updates are exactly a
run of N updates (prompt batches and stage seeds derive from (seed, update), nothing depends on the
horizon), so it gives the equal-updates comparison at update N, and its accuracy where its cumulative
sampled tokens equal ProbePO's at update N gives the equal-tokens one (linear between evaluations).

This plan runs on the engine after the audit's fixes (900f164: the RL prompts no longer replay the
warm-up's batches, the warm-up no longer depends on the run that made it). The tables measured before
them, exploratory arms included, are kept as they were in docs/science/prefix-f30d05b.md and
bench/results/science-prefix-f30d05b.json.

STATED IN ADVANCE, before any of these runs (issue 10, not to be changed): the primary comparison is
ProbePO with its defaults (configs/cpu-demo.yaml after the engine fixes) minus GRPO, on modchain, 80
updates, temperature-1 accuracy after update 80 on the fixed 1,024 held-out prompts, over the 30 fresh
paired seeds 10-39 (`modchain-replication`), reported with the paired-t 95 % interval (primary) and the
bootstrap beside it; the GRPO arm of the replication runs 80 updates. With the measured SD of paired
differences (2.2 points) this has about 80 % power for +1.2. It is reported whatever it says.

Also re-measured on the fixed engine, 10 seeds (0-9) each, as the confirmatory comparisons of the earlier
plan: ProbePO − GRPO at update 80 on `modchain` and on `pointer`, with GRPO run to 4× the updates for the
equal-token comparison; VinePPO-dense (5 seeds) and GRPO with 4× the responses per prompt (modchain, 5
seeds), which the README quotes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from benchlib import machine

from probepo.config import RunConfig
from probepo.presets import load_run_config
from probepo.report import RunCurves, load_curves
from probepo.stages.warmup import warmup_run_id
from probepo.stats import (
    first_reach,
    mean_and_stderr,
    paired_bootstrap_ci,
    paired_t_ci95,
    paired_t_power,
    value_at,
)
from probepo.store import ArtifactStore, open_store

ROOT = Path(__file__).resolve().parent.parent
GRPO_HORIZON = 4
"""The GRPO arm trains this many times the updates (ProbePO samples ~3.5× GRPO's tokens per update)."""
PRIMARY = ("modchain-replication", "probepo", "grpo")


@dataclass(frozen=True)
class Arm:
    """One arm: overrides of the testbed's preset, and which seeds."""

    name: str
    overrides: dict[str, Any]
    seeds: int
    about: str
    horizon: int = 1
    """Train this many times the testbed's updates (GRPO_HORIZON for the equal-tokens GRPO arm)."""
    first_seed: int = 0
    """Seeds first_seed .. first_seed + seeds - 1 (the replication uses fresh seeds 10-39)."""

    @property
    def seed_range(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)


@dataclass(frozen=True)
class Testbed:
    """A preset plus what every arm on it shares."""

    name: str
    preset: str
    updates: int
    arms: tuple[Arm, ...]
    overrides: dict[str, Any] = field(default_factory=lambda: {"eval.every": 10})


GRPO = {"algo.algorithm": "grpo"}
GRPO_EQUAL_TOKENS = Arm("grpo", GRPO, 10, "GRPO (run to 4× the updates, see above)", GRPO_HORIZON)
PROBEPO = Arm("probepo", {}, 10, "ProbePO, defaults (5 pivots × 8 continuations, κ 4, λ 1)")
VINEPPO = Arm("vineppo", {"algo.algorithm": "vineppo"}, 5, "every step boundary × 8, MC values, no GRPO")
GRPO_G32 = Arm(
    "grpo_g32",
    {**GRPO, "group_size": 32, "optim.minibatch_size": 256},
    5,
    "GRPO with 4× the responses per prompt (≈ ProbePO's tokens), same updates and optimizer steps",
)

PLAN = (
    Testbed("modchain", "configs/cpu-demo.yaml", 80, (GRPO_EQUAL_TOKENS, PROBEPO, VINEPPO, GRPO_G32)),
    Testbed("pointer", "configs/cpu-pointer.yaml", 80, (GRPO_EQUAL_TOKENS, PROBEPO, VINEPPO)),
    Testbed(
        "modchain-replication",
        "configs/cpu-demo.yaml",
        80,
        (
            Arm("grpo", GRPO, 30, "GRPO, 80 updates", first_seed=10),
            Arm("probepo", {}, 30, "ProbePO, defaults", first_seed=10),
        ),
    ),
)
REPLICATION = "modchain-replication"
PLANNED_EFFECT, PLANNED_SD = 0.012, 0.022
"""The effect (+1.2 points) and SD of paired differences (2.2 points) the replication was sized for."""


def arm_config(testbed: Testbed, arm: Arm, seed: int, store: str) -> RunConfig:
    overrides = {**testbed.overrides, **arm.overrides, "seed": seed, "store": store}
    overrides["num_updates"] = testbed.updates * arm.horizon
    return load_run_config(ROOT / testbed.preset, overrides)


def run_id(testbed: Testbed, arm: Arm, config: RunConfig) -> str:
    recipe = config.recipe_json()
    return f"sci-{testbed.name}-{arm.name}-s{config.seed}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"


def _log_to(log: str) -> None:
    """Send this worker process's output (its own and its libraries') to `log`."""
    with open(log, "a") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)


def _train(config_json: str, run: str, log: str) -> str:
    """One run in a worker process, its output in `log`; returns the run id."""
    _log_to(log)
    from probepo.pipeline import train

    train(RunConfig.model_validate_json(config_json), run)
    return run


def _warmup(config_json: str, log: str) -> str:
    """A testbed's warm-up in a worker process; returns the warm-up run's id."""
    _log_to(log)
    from probepo.pipeline import ensure_warmup

    config = RunConfig.model_validate_json(config_json)
    return ensure_warmup(config, open_store(config.store))


def execute(plan: Sequence[Testbed], store_url: str, jobs: int, logs: Path) -> None:
    """Run every missing (testbed, arm, seed), `jobs` processes at a time: warm-ups first, then the runs,
    longest first. A failed run is reported with its log and the others go on."""
    from probepo.pipeline import resume_point

    store = open_store(store_url)
    logs.mkdir(parents=True, exist_ok=True)
    todo = []
    for testbed in plan:
        for arm in testbed.arms:
            for seed in arm.seed_range:
                config = arm_config(testbed, arm, seed, store_url)
                run = run_id(testbed, arm, config)
                if not resume_point(store, run, config).done:
                    todo.append((config, run, testbed.name))
    cost = {"vineppo": 4.0, "grpo": 3.0}
    order = {t.name: i for i, t in enumerate(plan)}  # testbed by testbed, the longest runs first in each
    todo.sort(key=lambda item: (order[item[2]], -cost.get(item[0].algo.algorithm, 1.0)))
    print(f"{len(todo)} runs to do in {store_url} ({jobs} at a time); logs in {logs}", flush=True)
    context = get_context("spawn")
    started = time.perf_counter()
    with ProcessPoolExecutor(jobs, mp_context=context, max_tasks_per_child=1) as pool:
        # One process per warm-up (testbeds may share one), none for a testbed with nothing left to do.
        needed: dict[str, tuple[RunConfig, list[str]]] = {}
        for t in plan:
            if any(item[2] == t.name for item in todo):
                config = arm_config(t, t.arms[0], t.arms[0].first_seed, store_url)
                needed.setdefault(warmup_run_id(config), (config, []))[1].append(t.name)
        warmups = {
            pool.submit(_warmup, config.model_dump_json(), str(logs / f"{key}.log")): names
            for key, (config, names) in needed.items()
        }
        failed = set()
        for future in wait(warmups).done:
            names = ", ".join(warmups[future])
            if future.exception() is None:
                print(f"warm-up of {names}: {future.result()} ready", flush=True)
            else:  # the other testbeds go on
                failed.update(warmups[future])
                print(f"warm-up of {names} FAILED, its runs skipped: {future.exception()}", flush=True)
        todo = [item for item in todo if item[2] not in failed]
        pending = {pool.submit(_train, c.model_dump_json(), r, str(logs / f"{r}.log")): r for c, r, _ in todo}
        finished = 0
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                run = pending.pop(future)
                finished += 1
                error = future.exception()
                status = f"FAILED ({error}; see {logs / f'{run}.log'})" if error else "done"
                elapsed = time.perf_counter() - started
                print(f"[{elapsed:7.0f}s] {finished}/{len(todo)} {run}: {status}", flush=True)


@dataclass
class ArmResult:
    """What one arm's seeds gave, paired by seed index."""

    arm: Arm
    curves: list[RunCurves]
    diagnostics: list[dict[str, float]]


def diagnostics(store: ArtifactStore, run: str, updates: int) -> dict[str, float]:
    """Over the first `updates` updates: the mean |token advantage − GRPO advantage| relative to the mean
    |GRPO advantage| (how much redistribution changes), the share of groups with no GRPO signal (all
    rewards equal), and the success rate of probe continuations."""
    records = [
        m for m in store.read_metrics(run) if "advantage/seq_adv_abs_mean" in m and m["update"] < updates
    ]
    seq = sum(m["advantage/seq_adv_abs_mean"] for m in records)
    return {
        "residual_to_grpo_advantage": sum(m["advantage/residual_abs_mean"] for m in records) / seq
        if seq
        else 0.0,
        "zero_signal_groups": sum(m["advantage/zero_signal_fraction"] for m in records) / len(records),
        "probe_success_rate": sum(m.get("probe/success_rate", 0.0) for m in records) / len(records),
    }


def collect(plan: Sequence[Testbed], store: ArtifactStore) -> dict[str, dict[str, ArmResult]]:
    """The finished runs of every arm (an arm appears with the seeds that have finished)."""
    results: dict[str, dict[str, ArmResult]] = {}
    stored = set(store.runs())
    for testbed in plan:
        for arm in testbed.arms:
            curves, diagnosed = [], []
            for seed in arm.seed_range:
                config = arm_config(testbed, arm, seed, store.url)
                run = run_id(testbed, arm, config)
                curve = load_curves(store, run) if run in stored else None
                if curve is None or not curve.eval_updates or curve.eval_updates[-1] != config.num_updates:
                    break  # seeds are paired by index: stop at the first unfinished one
                curves.append(curve)
                diagnosed.append(diagnostics(store, run, testbed.updates))
            if curves:
                results.setdefault(testbed.name, {})[arm.name] = ArmResult(arm, curves, diagnosed)
    return results


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


def _runs(arm: Arm, curves: Sequence[RunCurves]) -> list[dict[str, Any]]:
    """Every run's whole curve: accuracy (temperature 1 and greedy), sampled tokens and training wall time
    at each evaluation."""
    return [
        {
            "seed": seed,
            "run_id": c.run_id,
            "updates": c.eval_updates,
            "accuracy": [round(x, 4) for x in c.accuracy],
            "greedy": [round(x, 4) for x in c.greedy],
            "tokens": [round(x) for x in c.eval_tokens],
            "wall_s": [round(x, 2) for x in c.eval_wall_s],
        }
        for seed, c in zip(arm.seed_range, curves, strict=False)
    ]


def analyse(plan: Sequence[Testbed], collected: dict[str, dict[str, ArmResult]]) -> dict[str, Any]:
    """Per testbed: each arm's final accuracies (temperature 1 and greedy), tokens and wall time; every
    arm minus GRPO at equal updates; ProbePO minus GRPO at equal sampled tokens; VinePPO time-to-reach."""
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
        }
        for name, result in arms.items():
            curves = result.curves
            at_n = [c.eval_updates.index(n) for c in curves]
            entry["arms"][name] = {
                "about": result.arm.about,
                "overrides": result.arm.overrides,
                "first_seed": result.arm.first_seed,
                "seeds": [round(a, 4) for a in final[name]],
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
                "diagnostics": {
                    key: round(sum(d[key] for d in result.diagnostics) / len(result.diagnostics), 4)
                    for key in result.diagnostics[0]
                },
                "runs": _runs(result.arm, curves),
            }
        if "grpo" in arms:
            entry["minus_grpo_equal_updates"] = {
                name: _diff(final[name], final["grpo"]) for name in arms if name != "grpo"
            }
        if "grpo" in arms and "probepo" in arms and arms["grpo"].arm.horizon > 1:
            entry.update(_equal_tokens(arms["probepo"].curves, arms["grpo"].curves, n))
        if "grpo_g32" in arms and "probepo" in arms:
            entry["probepo_minus_grpo_g32"] = _diff(final["probepo"], final["grpo_g32"])
        if "vineppo" in arms and "probepo" in arms:
            vine = arms["vineppo"].curves
            paired = arms["probepo"].curves[: len(vine)]  # the seeds both arms have (both start at 0)
            entry["vineppo_time_to_reach"] = _time_to_reach(paired, vine[: len(paired)], n)
        out[testbed.name] = entry
    return out


def _equal_tokens(probepo: Sequence[RunCurves], grpo: Sequence[RunCurves], n: int) -> dict[str, Any]:
    """GRPO's accuracy at ProbePO's sampled tokens after update n, seed by seed, read off GRPO's longer
    run (linear between evaluations). Where that run ended before ProbePO's token count, its last
    evaluation stands in: GRPO then had fewer tokens, which favours ProbePO (`grpo_token_fraction` < 1)."""
    pairs = list(zip(probepo, grpo))  # noqa: B905 (the seeds both arms have)
    targets = [p.eval_tokens[p.eval_updates.index(n)] for p, _ in pairs]
    matched = [
        value_at(g.eval_tokens, g.accuracy, t) if t <= g.eval_tokens[-1] else g.accuracy[-1]
        for (_, g), t in zip(pairs, targets, strict=True)
    ]
    fraction = min(min(1.0, g.eval_tokens[-1] / t) for (_, g), t in zip(pairs, targets, strict=True))
    return {
        "grpo_token_matched": {
            "seeds": [round(a, 4) for a in matched],
            "accuracy": _summary(matched),
            "grpo_token_fraction": round(fraction, 3),
        },
        "probepo_minus_grpo_equal_tokens": _diff([p.accuracy_at(n) for p, _ in pairs], matched),
    }


def _mean_curve(curves: Sequence[RunCurves], axis: str) -> tuple[list[float], list[float]]:
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


def _time_to_reach(probepo: Sequence[RunCurves], vineppo: Sequence[RunCurves], n: int) -> dict[str, Any]:
    """How much of VinePPO's training wall time (and tokens) the mean ProbePO curve needs to first reach
    VinePPO's mean final accuracy (NaN if it never does within its N updates)."""
    target = sum(c.accuracy_at(n) for c in vineppo) / len(vineppo)
    result: dict[str, Any] = {"vineppo_final_accuracy": round(100 * target, 2), "seeds": len(vineppo)}
    for axis in ("wall", "tokens"):
        px, py = _mean_curve(probepo, axis)
        vx, _ = _mean_curve(vineppo, axis)
        reach = first_reach(px, py, target)
        result[f"probepo_{axis}_to_reach"] = None if math.isnan(reach) else round(reach, 1)
        result[f"vineppo_{axis}_total"] = round(vx[-1], 1)
        result[f"ratio_{axis}"] = None if math.isnan(reach) else round(reach / vx[-1], 3)
    return result


COST_ARMS = ("grpo", "probepo", "vineppo", "grpo_g32")
"""The arms drawn on the sampled-tokens and wall-time axes."""


def plot(plan: Sequence[Testbed], collected: dict[str, dict[str, ArmResult]], folder: Path) -> list[Path]:
    """Per testbed: mean accuracy over seeds (±1 standard error across seeds) by update (every arm), by
    sampled tokens and by training wall time (COST_ARMS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    updates = {t.name: t.updates for t in plan}
    paths = []
    for testbed, arms in collected.items():
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        for index, (name, result) in enumerate(arms.items()):
            color = f"C{index}"  # one colour per arm on all three panels
            curves = result.curves
            # By update, every arm stops at N (the equal-tokens GRPO arm goes on, on the other axes).
            cut = curves[0].eval_updates.index(updates[testbed])
            stderr = [
                100 * mean_and_stderr([c.accuracy[i] for c in curves])[1]
                for i in range(len(curves[0].eval_updates))
            ]
            for ax, axis in zip(axes, ("update", "tokens", "wall"), strict=True):
                if axis != "update" and name not in COST_ARMS:
                    continue  # the ablations and levers cost what ProbePO costs: by update is enough
                x, y = _mean_curve(curves, axis)
                last = cut + 1 if axis == "update" else len(x)
                ax.errorbar(
                    x[:last],
                    [100 * v for v in y[:last]],
                    yerr=stderr[:last],
                    capsize=2,
                    marker=".",
                    label=f"{name} ({len(curves)} seeds)",
                    color=color,
                )
        for ax, label in zip(
            axes, ("update", "sampled tokens (backbone + probes)", "training wall time (s)"), strict=True
        ):
            ax.set(xlabel=label, ylabel="held-out accuracy, temperature 1 (%)")
            ax.grid(alpha=0.3)
        axes[1].set_xscale("log")
        axes[2].set_xscale("log")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{testbed}: mean over seeds ± 1 s.e. across seeds")
        fig.tight_layout()
        path = folder / f"science-{testbed}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def _interval(d: dict[str, Any]) -> str:
    """A difference's paired-t interval, then the bootstrap one and the test's power in brackets."""
    boot = f"bootstrap [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]"
    if "ci95_t" not in d:
        return boot
    power = f"; power {d['power']:.2f}" if d.get("power") is not None else ""
    return f"[{d['ci95_t'][0]:+.1f}, {d['ci95_t'][1]:+.1f}] ({boot}{power})"


def markdown(results: dict[str, Any]) -> str:
    """The tables of docs/BENCHMARKS.md's science section."""
    lines = []
    for testbed, entry in results.items():
        if not entry["arms"]:
            continue
        settings = ", ".join(f"{k} = {v}" for k, v in entry["overrides"].items())
        lines += [
            f"### {testbed} ({entry['preset']}; {settings}; {entry['updates']} updates)",
            "",
            "| arm | seeds | start | final, T = 1 | final, greedy"
            " | − GRPO, equal updates: paired-t 95 % CI (bootstrap; power) | sampled tokens"
            " | training wall (s) | residual / GRPO advantage |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        diffs = entry.get("minus_grpo_equal_updates", {})
        for name, arm in entry["arms"].items():
            greedy = f"{arm['greedy']['mean']:.1f} ± {arm['greedy']['se']:.1f}" if arm["greedy"] else "–"
            d = diffs.get(name)
            diff = f"{d['mean']:+.1f} {_interval(d)}" if d else "–"
            final = f"{arm['accuracy']['mean']:.1f} ± {arm['accuracy']['se']:.1f}"
            lines.append(
                f"| {name} | {len(arm['seeds'])} | {arm['start']['mean']:.1f} | {final} | {greedy} | {diff}"
                f" | {arm['sampled_tokens']:,} | {arm['training_wall_s']:.0f}"
                f" | {arm['diagnostics']['residual_to_grpo_advantage']:.2f} |"
            )
        matched = entry.get("grpo_token_matched")
        if matched:
            d = entry["probepo_minus_grpo_equal_tokens"]
            short = matched["grpo_token_fraction"]
            lines += [
                "",
                "GRPO at ProbePO's sampled tokens (read off its longer run, linear between evaluations):"
                f" {matched['accuracy']['mean']:.1f} ± {matched['accuracy']['se']:.1f} %;"
                f" ProbePO − GRPO at equal sampled tokens: **{d['mean']:+.1f}** points, 95 % CI"
                f" {_interval(d)} ({d['seeds']} seeds)."
                + (
                    f" GRPO's {GRPO_HORIZON}× run ended at {100 * short:.0f} % of ProbePO's tokens on some"
                    " seeds: there its last evaluation is used (fewer tokens, in ProbePO's favour)."
                    if short < 1
                    else ""
                ),
            ]
        if "probepo_minus_grpo_g32" in entry:
            d = entry["probepo_minus_grpo_g32"]
            lines += [
                "",
                "ProbePO − GRPO with 4× the responses per prompt (similar sampled tokens, same updates and"
                f" optimizer steps): **{d['mean']:+.1f}** points, 95 % CI {_interval(d)}"
                f" ({d['seeds']} seeds).",
            ]
        reach = entry.get("vineppo_time_to_reach")
        if reach:
            ratio = reach["ratio_wall"]
            lines += [
                "",
                f"VinePPO-dense ({reach['seeds']} seeds, paired with ProbePO's first {reach['seeds']})"
                f" final accuracy {reach['vineppo_final_accuracy']:.1f} % (start"
                f" {entry['arms']['vineppo']['start']['mean']:.1f} %) after"
                f" {reach['vineppo_wall_total']:.0f} s of training wall time;"
                + (
                    f" ProbePO's mean curve reaches it after {reach['probepo_wall_to_reach']:.0f} s ="
                    f" **{ratio:.2f}×** VinePPO's time ({reach['ratio_tokens']:.2f}× its tokens)."
                    if ratio is not None
                    else " ProbePO's mean curve never reaches it within its updates."
                ),
            ]
        lines += ["", f"![{testbed}](science/science-{testbed}.png)", ""]
    return "\n".join(lines)


def write_outputs(results: dict[str, Any], wall_s: float | None, command: str) -> None:
    primary_testbed, a, b = PRIMARY
    primary = results.get(primary_testbed, {})
    path = ROOT / "bench" / "results" / "science.json"
    if wall_s is None and path.exists():  # an analysis-only rerun keeps the wall time of the training
        wall_s = json.loads(path.read_text()).get("wall_s")
    replication = primary.get("minus_grpo_equal_updates", {}).get(a)
    payload = {
        "replication": {
            "stated_in_advance": f"{a} − {b} on modchain, 80 updates, temperature-1 accuracy after update 80"
            " on the fixed 1,024 held-out prompts, fresh paired seeds 10-39, paired-t 95 % interval"
            " (primary), bootstrap beside it; sized for 80 % power at +1.2 points (SD 2.2)",
            **(
                {key: replication[key] for key in ("mean", "ci95_t", "ci95", "seeds", "power", "sd")}
                if replication
                else {}
            ),
        },
        "probepo_minus_grpo": results.get("modchain", {}).get("minus_grpo_equal_updates", {}).get("probepo"),
        "probepo_minus_grpo_equal_tokens": results.get("modchain", {}).get("probepo_minus_grpo_equal_tokens"),
        "before_the_engine_fixes": "bench/results/science-prefix-f30d05b.json",
        "testbeds": results,
        "wall_s": wall_s,
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
    }
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    docs = ROOT / "docs" / "BENCHMARKS.md"
    text = docs.read_text()
    begin, end = "<!-- science:begin (written by bench/science.py) -->", "<!-- science:end -->"
    block = f"{begin}\n{markdown(results)}\n{end}"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text += f"\n## Science: GRPO vs ProbePO vs VinePPO-dense\n\n{block}\n"
    docs.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=str(ROOT / "out" / "science" / "store"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once (one core each)")
    parser.add_argument("--testbeds", nargs="*", help="only these testbeds (default: all of PLAN)")
    parser.add_argument("--analyse-only", action="store_true", help="no training: analyse what is stored")
    args = parser.parse_args()
    plan = [t for t in PLAN if not args.testbeds or t.name in args.testbeds]
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # inherited by the spawned workers
    started = time.perf_counter()
    if not args.analyse_only:
        execute(plan, args.store, args.jobs, ROOT / "out" / "science" / "logs")
    wall = None if args.analyse_only else round(time.perf_counter() - started, 1)
    collected = collect(PLAN, open_store(args.store))
    results = analyse(PLAN, collected)
    plot(PLAN, collected, ROOT / "docs" / "science")
    write_outputs(results, wall, "python " + " ".join(sys.argv[0:1] + sys.argv[1:]))
    print(markdown(results))


if __name__ == "__main__":
    main()
