"""Generation over ranks: the sample stage's generated tokens per second as a job of 1 and of 2 ranks (local
jobs, one torch thread per rank) on the CPU testbed and the tiny Qwen2 (Hugging Face engine), whether both
committed the same bits, and how busy claiming chunks kept the ranks against a static split of the chunks.

    .venv/bin/python bench/ranks.py     # a few minutes; give it the machine's 2 cores to itself

Each arm is the sample stage of a fresh run (the same recipe, so the same prompts and chunks) submitted
through the local executor with `tasks_per_node` 1 or 2: the stage's own wall time (its commit's `wall_s`:
engine built, chunks made, shards read back, graded) on rank 0, the arms alternated and repeated, medians
taken. The ratio is tokens/s on 2 ranks over 1; `decode_ratio` the same for the busiest rank's decoding
alone (what the ranks share out), without what every rank does whole: build its engine, read the shards
back, grade the stage's responses.

Claiming vs a static split: every shard records how long its chunk took to decode (`decode_s`). Replayed on
those times (1-rank arms), claiming in plan order (what the stage does: a rank takes the next chunk when its
last is done) and a static round-robin split (chunk c to rank c mod R) give each a makespan; a rank's busy
fraction is the decoding time over R × makespan. Writes bench/results/ranks.json.

The study recipes on an 8-GPU node, on paper (`--models recipes`, a few minutes, no services): each rank's
busy fraction in sample and probe under the recipes' sampling settings against the default they replaced,
from bench/ranks_model.py's stated length model and two costs of a decoding step: an H200 roofline of each
recipe's model, and this CPU's testbed engine measured at several batch sizes (`cpu_step`).

vLLM's share of each GPU, on paper (`--models shares`, about a minute of CPU, no measurement: it rewrites
`vllm_shares` alone and keeps every other key of ranks.json): the recipes' sample and probe under their own
plan on the H200 roofline, with vLLM's fixed split (model.vllm_memory 0.35) against its time-shared share
(asleep while the trainer works): KV tokens per rank, rows decoding per step, preemptions, busy fractions
and makespans (ranks_model.vllm_shares).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from benchlib import machine
from ranks_model import (
    LENGTHS,
    busy_fractions,
    h200_decoder,
    measured_decoder,
    rank_seconds,
    recipe_share,
    vllm_shares,
)

from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.engines.base import SamplingParams
from probepo.engines.sampler import TorchGenerationEngine
from probepo.models.gpt import GPT
from probepo.presets import load_run_config
from probepo.run.execution import StageRequest, execute_stage
from probepo.run.pipeline import ensure_warmup, freeze_recipe
from probepo.run.schedule import ROLLOUTS, Stage
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore, open_store
from slurm import make_runner

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "ranks.json"


def testbed_config(store: str) -> RunConfig:
    """The embedded default's model and task, 512 prompts × 8 responses in 64 chunks of 64 rows."""
    overrides = {"store": store, "num_updates": 1, "prompts_per_update": 512, "sampling.batch_rows": 64}
    return load_run_config(ROOT / "configs" / "cpu-demo.yaml", overrides)


def qwen_config(store: str, folder: Path) -> RunConfig:
    """The tiny Qwen2 on one-digit arithmetic: 64 prompts × 4 responses of up to 48 tokens, 16 chunks."""
    sys.path.insert(0, str(ROOT))
    from tests.hf.tiny_qwen import qwen_config as tiny

    sampling = {"max_tokens": 48, "batch_rows": 16}
    return tiny(folder, num_updates=1, prompts_per_update=64, group_size=4, sampling=sampling, store=store)


def sample_stage(config: RunConfig, store: ArtifactStore, run_id: str, ranks: int, jobs: Path) -> dict:
    """Checkpoint 0 inline, then the sample stage as a local job of `ranks` tasks; its figures."""
    freeze_recipe(store, run_id, config)
    ctx = StageContext(store, run_id, 0, config, jobs / run_id)
    ctx.scratch.mkdir(parents=True)
    execute_stage(ctx, Stage.CHECKPOINT)
    resources = StageResources(tasks_per_node=ranks, time_min=60)
    profile = ExecutionProfile(job_folder=str(jobs), poll_s=0.2, stages={Stage.SAMPLE: resources})
    make_runner("local", profile).run(StageRequest.of(ctx, Stage.SAMPLE), ctx)
    summary = store.marker(run_id, 0, Stage.SAMPLE)["summary"]
    shards = [
        store.marker(run_id, 0, name)["summary"]
        for name in sorted(store.committed_stages(run_id, 0))
        if name.startswith("sample.shard-")
    ]
    return {
        "wall_s": summary["wall_s"],
        "tokens": summary["tokens"],
        "tokens_per_s": summary["tokens"] / summary["wall_s"],
        "chunk_decode_s": [shard["decode_s"] for shard in shards],
        # the busiest rank's decoding: the stage's wall time less what every rank does whole (building its
        # engine, reading the shards back, grading) and the waits
        "decode_s": max(sum(s["decode_s"] for s in shards if s["rank"] == r) for r in range(ranks)),
        "chunks_per_rank": [sum(shard["rank"] == r for shard in shards) for r in range(ranks)],
        "rollouts": store.read_stage(run_id, 0, Stage.SAMPLE)[ROLLOUTS],
    }


def busy_fraction(times: list[float], ranks: int, claiming: bool) -> float:
    """Decoding time over ranks × makespan, the chunks (in plan order) taken as the stage takes them
    (claiming: by the first rank free) or split statically (chunk c to rank c mod ranks)."""
    finish = rank_seconds(times, ranks) if claiming else [sum(times[r::ranks]) for r in range(ranks)]
    return sum(times) / (ranks * max(finish))


def measure(name: str, config_of: Any, folder: Path, reps: int) -> dict[str, Any]:
    store = open_store(folder / "store")
    config = config_of(store.url)
    if config.model.kind == "testbed":
        ensure_warmup(config, store)
    arms: dict[int, list[dict]] = {1: [], 2: []}
    for rep in range(reps):
        for ranks in (1, 2) if rep % 2 == 0 else (2, 1):
            arms[ranks].append(sample_stage(config, store, f"{name}-{ranks}-{rep}", ranks, folder / "jobs"))
            print(
                f"{name}, {ranks} rank(s), rep {rep}: {arms[ranks][-1]['tokens_per_s']:.0f} tokens/s",
                flush=True,
            )
    speed = {ranks: statistics.median(a["tokens_per_s"] for a in runs) for ranks, runs in arms.items()}
    times = arms[1][0]["chunk_decode_s"]
    return {
        "tokens": arms[1][0]["tokens"],
        "chunks": len(times),
        "tokens_per_s": {f"{ranks}_ranks": round(s, 1) for ranks, s in speed.items()},
        "wall_s": {f"{ranks}_ranks": [a["wall_s"] for a in runs] for ranks, runs in arms.items()},
        "ratio": round(speed[2] / speed[1], 3),
        "decode_s": {
            f"{ranks}_ranks": [round(a["decode_s"], 3) for a in runs] for ranks, runs in arms.items()
        },
        "decode_ratio": round(
            statistics.median(a["decode_s"] for a in arms[1])
            / statistics.median(a["decode_s"] for a in arms[2]),
            3,
        ),
        "bitwise_equal": len({a["rollouts"] for runs in arms.values() for a in runs}) == 1,
        "chunks_per_rank_2_ranks": [a["chunks_per_rank"] for a in arms[2]],
        "chunk_decode_s_cv": round(statistics.stdev(times) / statistics.mean(times), 3),
        "busy_fraction": {
            f"{ranks}_ranks": {
                "claiming": round(busy_fraction(times, ranks, True), 3),
                "static": round(busy_fraction(times, ranks, False), 3),
            }
            for ranks in (2, 8)
        },
    }


def cpu_step(rows: tuple[int, ...] = (8, 32, 64, 128, 256), steps: int = 48, reps: int = 3) -> dict[str, Any]:
    """Seconds per decoding step of the testbed engine (the embedded default's model, one thread) at each
    batch size, medians of `reps`, and the least-squares line fixed_s + per_row_s × rows through them."""
    torch.set_num_threads(1)
    config = load_run_config(ROOT / "configs" / "cpu-demo.yaml")
    engine = TorchGenerationEngine(GPT(config.model), max_batch_rows=max(rows))
    params = SamplingParams(temperature=1.0, max_tokens=steps)  # no stop token: every row decodes `steps`
    measured = {}
    for batch in rows:
        times = []
        for rep in range(reps):
            started = time.perf_counter()
            engine.generate([[1] * 16], batch, params, rep)
            times.append((time.perf_counter() - started) / steps)
        measured[batch] = statistics.median(times)
    per_row, fixed = np.polyfit(list(measured), list(measured.values()), 1)
    return {
        "seconds_per_step": {str(b): round(t, 6) for b, t in measured.items()},
        "fixed_s": round(float(fixed), 6),
        "per_row_s": round(float(per_row), 7),
    }


def recipes(draws: int) -> dict[str, Any]:
    """Busy fractions of the study recipes' sample and probe on 8 ranks, under both step costs."""
    step = cpu_step()
    found: dict[str, Any] = {"cpu_step": step, "draws": draws}
    for name in LENGTHS:
        config = load_run_config(ROOT / "configs" / f"{name}.yaml")
        found[name] = {
            "lengths": asdict(LENGTHS[name]),
            "h200_roofline": busy_fractions(
                config, name, h200_decoder(name, recipe_share(config, name)), draws
            ),
            "cpu_measured": busy_fractions(
                config, name, measured_decoder(step["fixed_s"], step["per_row_s"]), draws
            ),
        }
        print(name, json.dumps(found[name]["h200_roofline"]), flush=True)
    return found


def shares(draws: int) -> dict[str, Any]:
    """The study recipes' sample and probe on 8 ranks under vLLM's fixed split and its time-shared share
    (ranks_model.vllm_shares), on the H200 roofline: no measurement, seconds of CPU."""
    found: dict[str, Any] = {"draws": draws}
    for name in LENGTHS:
        found[name] = vllm_shares(load_run_config(ROOT / "configs" / f"{name}.yaml"), name, draws)
        print(name, json.dumps(found[name]), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["testbed", "qwen"], choices=["testbed", "qwen", "recipes", "shares"]
    )
    parser.add_argument("--draws", type=int, default=16, help="recipes, shares: updates drawn per recipe")
    parser.add_argument("--reps", type=int, default=4, help="runs of each arm (alternated)")
    args = parser.parse_args()
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # inherited by every rank
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    with tempfile.TemporaryDirectory(prefix="probepo-ranks-") as tmp:
        folder = Path(tmp)
        if "testbed" in args.models:
            results["testbed"] = measure("testbed", testbed_config, folder / "testbed", args.reps)
        if "recipes" in args.models:
            results["recipes"] = recipes(args.draws)
        if "shares" in args.models:
            results["vllm_shares"] = shares(args.draws)
        if "qwen" in args.models:
            sys.path.insert(0, str(ROOT))
            from tests.hf.tiny_qwen import build_tiny_qwen

            model = build_tiny_qwen(folder / "tiny-qwen").folder
            results["tiny_qwen2"] = measure(
                "qwen", lambda store: qwen_config(store, model), folder / "qwen", args.reps
            )
    ran = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
        "command": "python bench/ranks.py " + " ".join(sys.argv[1:]),
    }
    for model, key in (("recipes", "recipes"), ("shares", "vllm_shares")):
        if model in args.models:  # its own record: the measured models' figures keep theirs
            results[key].update(ran)
    if {"testbed", "qwen"} & set(args.models):
        results.update(ran)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
