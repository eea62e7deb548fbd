"""The science bench's outputs: plots, bench/results/science.json, and the tables of docs/BENCHMARKS.md
(the site renders them from that file)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import machine
from science_plan import GRPO_HORIZON, PLAN, PRIMARY, Testbed
from science_report import RESULTS, ArmResult, mean_curve

from probepo.report.stats import mean_and_stderr

COST_ARMS = ("grpo", "probepo", "vineppo", "grpo_g32", "spo_tree", "treepo")
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
                x, y = mean_curve(curves, axis)
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


def _short(d: dict[str, Any]) -> str:
    """A difference and its paired-t interval (the bootstrap one if there are too few seeds)."""
    low, high = d.get("ci95_t", d["ci95"])
    return f"{d['mean']:+.1f} [{low:+.1f}, {high:+.1f}]"


NAMES = {arm.name: arm.label for testbed in PLAN for arm in testbed.arms}
"""Each arm's name in the notes: its method's label (probepo.methods) or the plan's."""


def _table(entry: dict[str, Any]) -> list[str]:
    lines = [
        "| arm | seeds | start | final, T = 1 | final, greedy"
        " | − GRPO, equal updates: paired-t 95 % CI (bootstrap; power)"
        " | − GRPO, equal sampled tokens: paired-t 95 % CI | sampled tokens"
        " | training wall (s) | residual / GRPO advantage |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    updates = entry.get("minus_grpo_equal_updates", {})
    tokens = entry.get("minus_grpo_equal_tokens", {})
    for name, arm in entry["arms"].items():
        greedy = f"{arm['greedy']['mean']:.1f} ± {arm['greedy']['se']:.1f}" if arm["greedy"] else "–"
        d = updates.get(name)
        diff = f"{d['mean']:+.1f} {_interval(d)}" if d else "–"
        t = tokens.get(name)
        matched = "–" if not t else _short(t) + (" †" if t["grpo_token_fraction"] < 1 else "")
        final = f"{arm['accuracy']['mean']:.1f} ± {arm['accuracy']['se']:.1f}"
        residual = arm["diagnostics"].get("residual_to_grpo_advantage")
        lines.append(
            f"| {name}{' *' if arm['carried'] else ''} | {len(arm['seeds'])} | {arm['start']['mean']:.1f}"
            f" | {final} | {greedy} | {diff} | {matched} | {arm['sampled_tokens']:,}"
            f" | {arm['training_wall_s']:.0f} | {'–' if residual is None else f'{residual:.2f}'} |"
        )
    return lines


def _notes(entry: dict[str, Any]) -> list[str]:
    """What the table's marks mean, and the comparisons that are not against GRPO."""
    lines = []
    short = {
        name: t
        for name, t in entry.get("minus_grpo_equal_tokens", {}).items()
        if t["grpo_token_fraction"] < 1
    }
    if short:
        arms = ", ".join(f"{name} ({100 * t['grpo_token_fraction']:.0f} %)" for name, t in short.items())
        lines.append(
            f"† GRPO's {GRPO_HORIZON}× run ended before this arm's sampled tokens on some seeds (fewest, as a"
            f" share of the arm's: {arms}): there its last evaluation stands in, in the arm's favour."
        )
    carried = {name: arm for name, arm in entry["arms"].items() if arm["carried"]}
    if carried:
        dates = ", ".join(sorted({arm["measured"][:10] for arm in carried.values()}))
        lines.append(
            f"\\* carried from the committed results (measured {dates}); their runs are not in this store."
        )
    engines = sorted({arm["engine"] for arm in entry["arms"].values()})
    if engines:
        lines.append(
            f"Engine of every arm in this table: {engines[0]} (bench/science_plan.py, ENGINE)."
            if len(engines) == 1
            else f"**Arms of different engines in one table: {', '.join(engines)}** (not comparable)."
        )
    machines = sorted({arm.get("machine", "") for arm in entry["arms"].values()})
    if len(machines) == 1 and machines[0]:
        lines.append(f"Measured on one machine: {machines[0]}.")
    elif len(machines) > 1:
        named = [f"{name}: {arm.get('machine') or 'not recorded'}" for name, arm in entry["arms"].items()]
        lines.append(f"Machines of this table's arms: {'; '.join(named)} (pairs need one kind of CPU).")
    if entry.get("withheld"):
        arms = ", ".join(
            f"{name} (measured {arm['measured'][:10]}, engine {arm['engine']})"
            for name, arm in entry["withheld"].items()
        )
        lines.append(
            f"Withheld: {arms}. Their runs (kept in the results file) do not pair with this table's: another"
            " engine measured them, or they start from another warm-up checkpoint, or the arms beside them"
            " changed on rerun, so these must be rerun before they are compared again."
        )
    reruns = [_reruns(name, arm["reproduced"]) for name, arm in entry["arms"].items() if arm["reproduced"]]
    if reruns:
        lines.append(
            "Rerun on this engine and reproduced exactly (accuracy, greedy accuracy and sampled tokens at"
            f" every evaluation): {'; '.join(reruns)}."
        )
    changed = {name: arm["differs_from_committed"] for name, arm in entry["arms"].items()}
    for name, seeds in changed.items():
        if seeds:
            lines.append(
                f"{name}: seeds {_seed_list(seeds)} differ from the committed runs (another engine's or"
                " another CPU's, or a changed run), which this store's measurement replaces."
            )
    for name, d in entry.get("probepo_minus", {}).items():
        lines.append(
            f"ProbePO − {NAMES[name]} (paired by seed, equal updates): **{d['mean']:+.1f}** points, 95 % CI"
            f" {_interval(d)} ({d['seeds']} seeds)."
        )
    reach = entry.get("vineppo_time_to_reach")
    if reach:
        lines.append(
            f"VinePPO-dense ({reach['seeds']} seeds, paired with ProbePO's first {reach['seeds']})"
            f" final accuracy {reach['vineppo_final_accuracy']:.1f} % (start"
            f" {entry['arms']['vineppo']['start']['mean']:.1f} %);" + _reach_text(reach)
        )
    return [part for line in lines for part in ("", line)]


def _reach_text(reach: dict[str, Any]) -> str:
    """ProbePO's time (or, across sessions, tokens only) to reach VinePPO's final accuracy."""
    if reach["ratio_tokens"] is None:
        return " ProbePO's mean curve never reaches it within its updates."
    tokens = f"{reach['ratio_tokens']:.2f}× VinePPO's sampled tokens"
    if not reach["one_session"]:
        return (
            f" ProbePO's mean curve reaches it at **{tokens}**. The two arms were measured in different"
            " sessions, so their wall times are not compared."
        )
    return (
        f" ProbePO's mean curve reaches it after {reach['probepo_wall_to_reach']:.0f} s of training wall"
        f" time = **{reach['ratio_wall']:.2f}×** VinePPO's {reach['vineppo_wall_total']:.0f} s ({tokens})."
    )


def _reruns(name: str, reproduced: list[dict[str, float]]) -> str:
    """E.g. "grpo seeds 0–9, wall time 0.55–0.62× the committed runs'"."""
    seeds = [int(r["seed"]) for r in reproduced]
    ratios = [r["wall_ratio"] for r in reproduced]
    span = f"{min(ratios):.2f}" if min(ratios) == max(ratios) else f"{min(ratios):.2f}–{max(ratios):.2f}"
    listed = _seed_list(seeds)
    return f"{name} seed{'s' if len(seeds) > 1 else ''} {listed}, wall time {span}× the committed runs'"


def _seed_list(seeds: list[int]) -> str:
    """E.g. "0–9" for a run of more than three seeds, else "0, 2, 5"."""
    contiguous = len(seeds) > 3 and seeds == list(range(seeds[0], seeds[-1] + 1))
    return f"{seeds[0]}–{seeds[-1]}" if contiguous else ", ".join(map(str, seeds))


def markdown(results: dict[str, Any]) -> str:
    """The tables of docs/BENCHMARKS.md's science section, which the site renders from the results file
    when it is built (docs/_ext/probepo_reference.py)."""
    lines = []
    for testbed, entry in results.items():
        if not entry["arms"]:
            continue
        settings = ", ".join(f"{k} = {v}" for k, v in entry["overrides"].items())
        lines += [f"### {testbed} ({entry['preset']}; {settings}; {entry['updates']} updates)", ""]
        lines += _table(entry) + _notes(entry)
        lines += ["", f"![{testbed}](science/science-{testbed}.png)", ""]
    return "\n".join(lines)


def write_outputs(results: dict[str, Any], wall_s: float | None, command: str) -> None:
    primary_testbed, a, b = PRIMARY
    primary = results.get(primary_testbed, {})
    if wall_s is None and RESULTS.exists():  # an analysis-only rerun keeps the wall time of the training
        wall_s = json.loads(RESULTS.read_text()).get("wall_s")
    replication = primary.get("minus_grpo_equal_updates", {}).get(a)
    modchain = results.get("modchain", {})
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
        "probepo_minus_grpo": modchain.get("minus_grpo_equal_updates", {}).get("probepo"),
        "probepo_minus_grpo_equal_tokens": modchain.get("minus_grpo_equal_tokens", {}).get("probepo"),
        "before_the_engine_fixes": "bench/results/science-prefix-f30d05b.json",
        "before_issue_48": "bench/results/science-before-48.json",
        "testbeds": results,
        "wall_s": wall_s,
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
    }
    RESULTS.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
