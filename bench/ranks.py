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

`markdown` renders ranks.json as docs/BENCHMARKS.md's tables (the site renders them from that file).
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
from benchlib import machine, marked, recorded, table
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
    print(markdown(results))


MODELS = {
    "testbed": ("testbed (cpu-demo's model, 512 prompts × 8)", "testbed"),
    "tiny_qwen2": ("tiny Qwen2, Hugging Face engine (64 prompts × 4, ≤ 48 tokens)", "tiny Qwen2"),
}
"""The measured models (`testbed_config`, `qwen_config`), in the tables' order, and how each table names
them: in full, and short."""
SOURCE = "bench/results/ranks.json"


def measured_table(results: dict[str, Any]) -> str:
    """Tokens per second of the sample stage on 1 and 2 ranks, per measured model."""
    rows = []
    for name, (label, _) in MODELS.items():
        if name in results:
            entry, speed = results[name], results[name]["tokens_per_s"]
            rows.append(
                [
                    label,
                    f"{entry['tokens']:,}",
                    entry["chunks"],
                    f"{speed['1_ranks']:,.0f} tokens/s",
                    f"{speed['2_ranks']:,.0f} tokens/s",
                    f"**{entry['ratio']:.2f}**",
                    f"{entry['decode_ratio']:.2f}",
                    "yes" if entry["bitwise_equal"] else "**no**",
                ]
            )
    header = ["model", "tokens", "chunks", "1 rank", "2 ranks", "ratio (goal ≥ 1.7)", "decoding alone, ratio"]
    return "\n".join([recorded(results, SOURCE), "", *table([*header, "bitwise equal"], rows)])


def busy_table(results: dict[str, Any]) -> str:
    """The busy fractions of claiming and of a static split, replayed on the 1-rank runs' chunk times."""
    rows = []
    for name, (_, short) in MODELS.items():
        if name in results:
            busy = results[name]["busy_fraction"]
            cells = []
            for ranks in ("2_ranks", "8_ranks"):
                claiming, static = busy[ranks]["claiming"], busy[ranks]["static"]
                pair = [f"{claiming:.3f}", f"{static:.3f}"]
                if ranks == "8_ranks" and claiming != static:  # the better of the two at 8 ranks
                    best = 0 if claiming > static else 1
                    pair[best] = f"**{pair[best]}**"
                cells += pair
            rows.append([f"{short}, {results[name]['chunks']} chunks", *cells])
    header = ["model", "2 ranks, claiming", "2 ranks, static", "8 ranks, claiming", "8 ranks, static"]
    return "\n".join(table(header, rows))


def _recipes(found: dict[str, Any]) -> dict[str, Any]:
    return {
        name: entry for name, entry in found.items() if isinstance(entry, dict) and "h200_roofline" in entry
    }


def _plan(entry: dict[str, Any]) -> str:
    """A plan's calls × rows per call, its lowest rank's median (worst) and its median makespan."""
    return (
        f"{entry['calls']} × {entry['rows'] // entry['calls']}: {entry['lowest_rank_median']:.2f}"
        f" ({entry['lowest_rank_worst']:.2f}), {entry['makespan_s']:.1f} s"
    )


def recipes_table(found: dict[str, Any]) -> str:
    """The study recipes on 8 ranks on the H200 roofline: before, the recipe's own plan (after), and more
    calls; a plan that is the recipe's own again (as many calls) says so."""
    rows = []
    for name, entry in _recipes(found).items():
        roofline = entry["h200_roofline"]
        for stage in ("sample", "probe"):
            after = roofline[f"{stage}_after"]
            cells = [_plan(roofline[f"{stage}_before"])]
            cells.append(
                f"{after['calls']} × {after['rows'] // after['calls']}: **{after['lowest_rank_median']:.2f}**"
                f" ({after['lowest_rank_worst']:.2f}), **{after['makespan_s']:.1f} s**"
            )
            for more in ("16_calls", "40_calls"):
                plan = roofline[f"{stage}_{more}"]
                same = plan["calls"] == after["calls"]
                cells.append(f"({plan['calls']} calls: as after)" if same else _plan(plan))
            rows.append([name, stage, *cells])
    header = ["recipe", "stage", "before", "after: the recipe's own plan", "16 calls", "40 calls"]
    head = f"`recipes`: {recorded(found, SOURCE)}; {found['draws']} updates drawn per recipe."
    return "\n".join([head, "", *table(header, rows)])


def streamed_table(found: dict[str, Any]) -> str:
    """The recipe's plan against streamed chunks and the longest row decoded alone (H200 roofline)."""
    rows = []
    for name, entry in _recipes(found).items():
        roofline = entry["h200_roofline"]
        for stage in ("sample", "probe"):
            cells = []
            for plan in ("after", "streamed_16", "streamed_8"):
                figures = roofline[f"{stage}_{plan}"]
                cells.append(f"{figures['lowest_rank_median']:.2f}, {figures['makespan_s']:.1f} s")
            rows.append([name, stage, *cells, f"{roofline[f'{stage}_longest_row_s']:.1f} s"])
    streamed = next(iter(_recipes(found).values()))["h200_roofline"]
    header = ["recipe", "stage", "after"]
    for plan in ("streamed_16", "streamed_8"):
        header.append(
            f"streamed {streamed[f'probe_{plan}']['batch_rows']} / {streamed[f'probe_{plan}']['keep_rows']}"
        )
    return "\n".join(table([*header, "longest row alone"], rows))


def shares_table(found: dict[str, Any]) -> str:
    """vLLM's fixed split against its time-shared share of each GPU, per recipe (H200 roofline)."""

    def stage(figures: dict[str, Any]) -> str:
        return (
            f"{figures['concurrency']:.1f}, {figures['preemptions']:g},"
            f" {figures['peak_kv_tokens'] / 1000:.1f} K, {figures['lowest_rank_median']:.2f},"
            f" **{figures['makespan_s']:.1f} s**"
        )

    rows = []
    for name, entry in found.items():
        if not isinstance(entry, dict):
            continue
        for share, label in (("fixed_split", "fixed"), ("time_shared", "time-shared")):
            figures = entry[share]
            rows.append(
                [
                    name,
                    f"{label} {figures['vllm_memory']:g}",
                    f"{figures['kv_tokens_per_rank']:,}",
                    stage(figures["sample"]),
                    stage(figures["probe"]),
                ]
            )
    measures = "concurrency, preemptions, peak, lowest rank, time"
    header = ["recipe", "vLLM share", "KV tokens per rank", f"sample: {measures}", f"probe: {measures}"]
    head = f"`vllm_shares`: {recorded(found, SOURCE)}; {found['draws']} updates drawn per recipe."
    return "\n".join([head, "", *table(header, rows)])


def markdown(results: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's ranks tables, rendered from bench/results/ranks.json when the site is built:
    the measured models, claiming against a static split, the recipes on paper, streamed chunks, and vLLM's
    share of the GPU."""
    parts = []
    if any(name in results for name in MODELS):
        parts += [marked("measured", measured_table(results)), marked("busy", busy_table(results))]
    if "recipes" in results:
        parts += [
            marked("recipes", recipes_table(results["recipes"])),
            marked("streamed", streamed_table(results["recipes"])),
        ]
    if "vllm_shares" in results:
        parts.append(marked("shares", shares_table(results["vllm_shares"])))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
