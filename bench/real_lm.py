"""A pretrained language model through every stage on this CPU: a few GRPO and ProbePO updates of
SmolLM2-135M-Instruct (configs/cpu-smollm2.yaml) on one-digit arithmetic, graded by math-verify.

    .venv/bin/python bench/real_lm.py                  # both arms, 3 updates each (≈ 30–40 min on 2 cores)
    .venv/bin/python bench/real_lm.py --updates 1 --arms grpo

Each arm is one run in a fresh store (same seed: the same prompts at every update), evaluated before
the first and after the last update. Per arm it records the Hugging Face engines' throughput (generation:
sample, probe and evaluation tokens per second; trainer: scored and trained response tokens per second),
the seconds of each stage per update, the reward and boxed-answer rate of every update's responses, the
probes' rescue rate, and held-out accuracy. Writes bench/results/real_lm.json and prints the markdown of
docs/BENCHMARKS.md. A 135M model rarely boxes an answer: the boxed rate says how rarely.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from benchlib import machine, recorded

from probepo.methods import METHODS
from probepo.presets import load_run_config
from probepo.run.pipeline import train
from probepo.run.schedule import TRAINING_STAGES
from probepo.store import ArtifactStore, open_store

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "configs" / "cpu-smollm2.yaml"
RESULTS = ROOT / "bench" / "results" / "real_lm.json"


def summaries(store: ArtifactStore, run_id: str, update: int) -> dict[str, dict[str, Any]]:
    """Every committed stage's summary at `update`."""
    stages = store.ledger_entries(run_id).get(update, [])
    return {stage: store.marker(run_id, update, stage)["summary"] for stage in stages}


def rate(tokens: float, seconds: float) -> float:
    return round(tokens / seconds, 2) if seconds > 0 else 0.0


def response_tokens(summary: dict[str, Any], responses: int) -> float:
    return summary["response_len_mean"] * responses


def measure(store: ArtifactStore, run_id: str, num_updates: int, responses: int) -> dict[str, Any]:
    """What one finished run's markers say: per-update curves, per-stage seconds and engine throughput."""
    per_update = [summaries(store, run_id, u) for u in range(num_updates)]
    evaluations = {
        u: s["evaluate"] for u in (0, num_updates) if "evaluate" in (s := summaries(store, run_id, u))
    }
    seconds = {
        stage: round(statistics.mean(u[stage]["wall_s"] for u in per_update), 2) for stage in TRAINING_STAGES
    }
    # the trained policies' saves (update 0's checkpoint is the pretrained model's conversion)
    saves = [summaries(store, run_id, u + 1)["checkpoint"]["wall_s"] for u in range(num_updates)]
    seconds["checkpoint"] = round(statistics.mean(saves), 2)
    tokens = {stage: sum(u[stage].get("tokens", 0) for u in per_update) for stage in ("sample", "probe")}
    walls = {stage: sum(u[stage]["wall_s"] for u in per_update) for stage in TRAINING_STAGES}
    trained = sum(response_tokens(u["sample"], responses) for u in per_update)
    return {
        "updates": num_updates,
        "reward": [round(u["sample"]["reward_mean"], 4) for u in per_update],
        "boxed_rate": [round(1 - u["sample"].get("no_answer_fraction", 0.0), 4) for u in per_update],
        "finished_rate": [round(u["sample"]["finished_fraction"], 4) for u in per_update],
        "rescued_probe_rate": [round(u["probe"]["rescued_fraction"], 4) for u in per_update],
        "probe_continuations": [u["probe"]["continuations"] for u in per_update],
        "accuracy": {str(u): round(e["accuracy"], 4) for u, e in evaluations.items()},
        "accuracy_stderr": {str(u): round(e["stderr"], 4) for u, e in evaluations.items()},
        "seconds_per_stage": seconds,
        "seconds_per_evaluation": round(statistics.mean(e["wall_s"] for e in evaluations.values()), 2),
        "generation_tokens_per_s": {
            "sample": rate(tokens["sample"], walls["sample"]),
            "probe": rate(tokens["probe"], walls["probe"]),
        },
        "trainer_tokens_per_s": {
            "score": rate(trained, walls["score"]),
            "optimize": rate(trained, walls["optimize"]),
        },
    }


def run_arm(arm: str, updates: int, folder: Path) -> dict[str, Any]:
    overrides = {"algo.algorithm": arm, "num_updates": updates, "eval.every": updates}
    config = load_run_config(PRESET, overrides)
    store = open_store(folder / arm)
    started = time.perf_counter()
    train(config, f"real-lm-{arm}", store=store)
    wall = time.perf_counter() - started
    result = measure(store, f"real-lm-{arm}", updates, config.prompts_per_update * config.group_size)
    return {**result, "wall_s": round(wall, 1), "overrides": overrides}


def joined(values: Any, spec: str = "") -> str:
    return ", ".join(format(v, spec) for v in values)


def markdown(results: dict[str, Any]) -> str:
    arms = results["arms"]
    head = "| | " + " | ".join(arms) + " |\n|---|" + "---|" * len(arms) + "\n"

    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(str(cell(a)) for a in arms.values()) + " |\n"

    lines = [
        row("reward per update", lambda a: joined(a["reward"], ".3f")),
        row("boxed-answer rate per update", lambda a: joined(a["boxed_rate"], ".2f")),
        row("held-out accuracy before, after", lambda a: joined(a["accuracy"].values(), ".3f")),
        row("probe continuations per update", lambda a: joined(a["probe_continuations"])),
        row("rescued probes per update", lambda a: joined(a["rescued_probe_rate"], ".2f")),
        row("generation tok/s: sample, probe", lambda a: joined(a["generation_tokens_per_s"].values())),
        row("trainer tok/s: score, optimize", lambda a: joined(a["trainer_tokens_per_s"].values())),
        *(
            row(f"s per update: {stage}", lambda a, s=stage: a["seconds_per_stage"][s])
            for stage in (*TRAINING_STAGES, "checkpoint")
        ),
        row("s per evaluation", lambda a: a["seconds_per_evaluation"]),
        row("wall (s)", lambda a: a["wall_s"]),
    ]
    ran = recorded(results, "bench/results/real_lm.json")
    ran += f"; {results['preset']}, {results['torch_threads']} torch threads.\n\n"
    return ran + head + "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=["grpo", "probepo"], choices=list(METHODS))
    parser.add_argument("--store", type=Path, help="keep the runs' stores here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.store or Path(scratch)
        arms = {arm: run_arm(arm, args.updates, folder) for arm in args.arms}
    results = {
        "benchmark": "real_lm",
        "command": " ".join(["bench/real_lm.py", *sys.argv[1:]]),
        "machine": machine(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "preset": str(PRESET.relative_to(ROOT)),
        "arms": arms,
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
