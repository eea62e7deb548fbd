"""Evidence: GRPO vs ProbePO vs VinePPO-dense on the CPU testbeds, over seeds, with intervals.

    .venv/bin/python bench/science.py                 # every arm of PLAN (resumable: rerun to continue)
    .venv/bin/python bench/science.py --analyse-only  # tables, plots and results from the store as it is

Each (testbed, arm, seed) is one `pipeline.train` run in its own process (one torch thread; `--jobs` at
once) in one store (`--store`, default out/science/store). Runs are named by their recipe, so a rerun
skips finished runs and resumes interrupted ones. All seeds of a testbed start from one shared warm-up
checkpoint and are evaluated on the same 1,024 held-out prompts at temperature 1 and greedily.

Pairing: seed s of every arm samples the same prompt batches and starts from the same checkpoint, so
arm differences are paired by seed (paired bootstrap over seeds).

Equal sampled tokens: the GRPO arm runs GRPO_HORIZON × the updates. Its first N updates are exactly a
run of N updates (prompt batches and stage seeds derive from (seed, update), nothing depends on the
horizon), so it gives the equal-updates comparison at update N, and its accuracy where its cumulative
sampled tokens equal ProbePO's at update N gives the equal-tokens one (linear between evaluations).

STATED IN ADVANCE (committed before any science run): the primary comparison is ProbePO with its
defaults minus GRPO on the `modchain` testbed (the embedded default, configs/cpu-demo.yaml: 6-step mod-10
chains, warm-up into [25 %, 50 %], 80 updates of 16 prompts × 8 responses, lr 2e-4), measured as the
temperature-1 accuracy of the policy after update 80 on the 1,024 fixed held-out prompts, over 10 paired
seeds, with a 95 % paired-bootstrap interval. Every other comparison here is secondary or exploratory.

STATED IN ADVANCE of the pointer runs (after the modchain primary gave +1.2 [−0.1, +2.6]): the second
confirmatory comparison is the same measure on the `pointer` testbed (configs/cpu-pointer.yaml), 10
paired seeds. Two confirmatory tests: read each interval with that in mind. The pointer arm with residual
weight 4 (10 seeds) is exploratory: the one lever of the prototypes in NOTES.md that leaned positive.
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
from probepo.stats import first_reach, mean_and_stderr, paired_bootstrap_ci, paired_t_ci95, value_at
from probepo.store import ArtifactStore, open_store

ROOT = Path(__file__).resolve().parent.parent
GRPO_HORIZON = 4
"""The GRPO arm trains this many times the updates (ProbePO samples ~3.5× GRPO's tokens per update)."""
PRIMARY = ("modchain", "probepo", "grpo")


@dataclass(frozen=True)
class Arm:
    """One arm: overrides of the testbed's preset, and how many seeds."""

    name: str
    overrides: dict[str, Any]
    seeds: int
    about: str
    horizon: int = 1
    """Train this many times the testbed's updates (GRPO_HORIZON for the equal-tokens GRPO arm)."""


@dataclass(frozen=True)
class Testbed:
    """A preset plus what every arm on it shares."""

    name: str
    preset: str
    updates: int
    arms: tuple[Arm, ...]
    overrides: dict[str, Any] = field(default_factory=lambda: {"eval.every": 10})


GRPO = {"algo.algorithm": "grpo"}


def _arms(seeds: int, primary_seeds: int, *extra: Arm) -> tuple[Arm, ...]:
    return (
        Arm("grpo", GRPO, primary_seeds, "GRPO (run to 4× the updates, see above)", GRPO_HORIZON),
        Arm("probepo", {}, primary_seeds, "ProbePO, defaults (5 pivots × 8 continuations, κ 4, λ 1)"),
        Arm("probepo_kappa0", {"algo.kappa": 0.0}, seeds, "ProbePO without shrinkage (κ = 0)"),
        Arm("probepo_random", {"algo.selector": "random"}, seeds, "ProbePO, random pivot placement"),
        Arm("vineppo", {"algo.algorithm": "vineppo"}, seeds, "every step boundary × 8, MC values, no GRPO"),
        *extra,
    )


GRPO_G32 = Arm(
    "grpo_g32",
    {**GRPO, "group_size": 32, "optim.minibatch_size": 256},
    5,
    "GRPO with 4× the responses per prompt (≈ ProbePO's tokens), same updates and optimizer steps",
)

LEVERS = (
    Arm("probepo_w4", {"algo.residual_weight": 4.0}, 5, "residual weight λ = 4"),
    Arm("probepo_mixed_only", {"algo.probe_uniform_groups": False}, 5, "probe only mixed-reward groups"),
    Arm("probepo_groupstd", {"algo.residual_scale": "group_std"}, 5, "residual divided by the group std"),
    Arm(
        "probepo_p10k4",
        {"algo.max_pivots": 10, "algo.continuations_per_pivot": 4},
        5,
        "same budget, 10 pivots × 4 continuations",
    ),
)

EXPLORE = (
    Arm("grpo", GRPO, 5, "GRPO"),
    Arm("probepo", {}, 5, "ProbePO, defaults"),
)
"""Arms of the exploratory testbed variants (no equal-tokens arm: GRPO runs N updates only)."""

PLAN = (
    Testbed("modchain", "configs/cpu-demo.yaml", 80, _arms(5, 10, GRPO_G32, *LEVERS)),
    Testbed(
        "pointer",
        "configs/cpu-pointer.yaml",
        80,
        _arms(5, 10, Arm("probepo_w4", {"algo.residual_weight": 4.0}, 10, "residual weight λ = 4")),
    ),
    Testbed(
        "modchain-lowstart",
        "configs/cpu-demo.yaml",
        80,
        EXPLORE,
        {"eval.every": 10, "warmup.accuracy_low": 0.08, "warmup.accuracy_high": 0.16},
    ),
    Testbed(
        "modchain-p32", "configs/cpu-demo.yaml", 80, EXPLORE, {"eval.every": 10, "prompts_per_update": 32}
    ),
    Testbed(
        "pointer-long",
        "configs/cpu-pointer.yaml",
        80,
        EXPLORE,
        {"eval.every": 10, "task.letters": 16, "task.hops": 13, "model.vocab_size": 24},
    ),
)


def arm_config(testbed: Testbed, arm: Arm, seed: int, store: str) -> RunConfig:
    overrides = {**testbed.overrides, **arm.overrides, "seed": seed, "store": store}
    overrides["num_updates"] = testbed.updates * arm.horizon
    return load_run_config(ROOT / testbed.preset, overrides)


def run_id(testbed: Testbed, arm: Arm, config: RunConfig) -> str:
    recipe = config.model_dump_json(exclude={"store"})
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
            for seed in range(arm.seeds):
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
        warmups = {
            pool.submit(
                _warmup,
                arm_config(t, t.arms[0], 0, store_url).model_dump_json(),
                str(logs / f"warmup-{t.name}.log"),
            ): t.name
            for t in plan
            if any(item[2] == t.name for item in todo)  # a finished testbed needs no warm-up process
        }
        failed = set()
        for future in wait(warmups).done:
            if future.exception() is None:
                print(f"warm-up of {warmups[future]}: {future.result()} ready", flush=True)
            else:  # the other testbeds go on
                failed.add(warmups[future])
                print(
                    f"warm-up of {warmups[future]} FAILED, its runs skipped: {future.exception()}", flush=True
                )
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
            for seed in range(arm.seeds):
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
    """mean(a − b) over the seeds both arms have, in points: the paired-bootstrap 95 % interval (`ci95`)
    and the more conservative paired-t one (`ci95_t`)."""
    n = min(len(a), len(b))
    mean, low, high = paired_bootstrap_ci(a[:n], b[:n])
    result = {"mean": round(100 * mean, 2), "ci95": [round(100 * low, 2), round(100 * high, 2)], "seeds": n}
    if n >= 2:
        _, t_low, t_high = paired_t_ci95(a[:n], b[:n])
        result["ci95_t"] = [round(100 * t_low, 2), round(100 * t_high, 2)]
    return result


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
            entry["vineppo_time_to_reach"] = _time_to_reach(arms["probepo"].curves, arms["vineppo"].curves, n)
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
    result: dict[str, Any] = {"vineppo_final_accuracy": round(100 * target, 2)}
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
    """A difference's bootstrap interval, and its paired-t one in brackets."""
    text = f"[{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]"
    return text + (f" (t: [{d['ci95_t'][0]:+.1f}, {d['ci95_t'][1]:+.1f}])" if "ci95_t" in d else "")


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
            " | − GRPO, equal updates: 95 % CI bootstrap (t) | sampled tokens | training wall (s)"
            " | residual / GRPO advantage |",
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
                f"VinePPO-dense final accuracy {reach['vineppo_final_accuracy']:.1f} % (start"
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
    payload = {
        "primary": {
            "stated_in_advance": f"{a} − {b} on {primary_testbed}, temperature-1 accuracy at the last update,"
            " paired by seed, 95 % paired-bootstrap interval",
            **(primary.get("minus_grpo_equal_updates", {}).get(a) or {}),
        },
        "arms": primary.get("arms", {}),
        "probepo_minus_grpo": primary.get("minus_grpo_equal_updates", {}).get("probepo"),
        "probepo_minus_grpo_equal_tokens": primary.get("probepo_minus_grpo_equal_tokens"),
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
