"""What an update moves and how long that takes: counted on a model whose bytes dominate, then extrapolated
to the study's three recipes on 8×H200.

    .venv/bin/python bench/overhead.py --label after-67   # ≈ 10 min on 2 idle cores; writes one label's rows

The run: the resident executor's driver job (slurm/job.py `run_driver_job`, through DriverJobRunner) on
submitit's local executor with 2 tasks, the ranks in lockstep on gloo; a random-init Qwen2 of 100.4 M
parameters (bench/checkpoint.py's QWEN_100M: Qwen's vocabulary, hidden 512, 8 layers; float32), trained
by DeepSpeed ZeRO-2 over both ranks, generating with the Hugging Face engine; ProbePO for 6 updates of
2 prompts × 4 responses (4 mini-batches of 2), `checkpoint_every` 3, evaluating every 3. What each update
spent is read back from the store (the metrics the driver summed from every attempt's counters: rank 0's,
which records them; every rank moves as much, the shared disk and store aside) and split into the start
(update 0: checkpoint 0 fetched), plain updates, checkpoint updates and the run's last checkpoint update.
Those metrics are what an update waited for; a checkpoint's upload beside the next updates (since issue
67: all but the run's last, committed inside its optimize) is read from its own attempt record (stage
`checkpoint` of update k + 1, marked `beside`) into the row's `beside`.

Extrapolation (probepo/spend/model.py, the model `probepo check` prints): first the model is run at this
model's own sizes (read from the committed checkpoint's files) and compared with the counted bytes, kind
by kind (`model_vs_counted`, 1.0 where it reproduces them); then it is run at each recipe's shape — its
model's parameters (stated: the model cards'), bf16 weights, DeepSpeed's 12 bytes of optimizer state per
parameter, 8 ranks on one node (the h200-node profile's driver), the recipe's `checkpoint_every`,
vLLM's hand-off in memory (in its rank's process) — and its bytes turned into seconds at `Bandwidths`
(stated, with sources, in spend_model.py; the `before` label's sha256 rate was this machine's,
measured), and again at a modest site's (`MODEST_SITE`: one scratch drive, 8 Gb/s to S3), and, once
bench/overhead_gpu.py has run on a lent GPU, at the stated rates with its measured device ones
(`at_7b_h200_rates`). The counted seconds of this CPU run are kept beside, not scaled: the hardware
differs in every rate. Each 7B row gives the seconds per update amortised by piece, and split into what
the updates wait for (`blocking_s`) and what runs beside them (`beside_s`: the checkpoint's upload).
Writes the label into bench/results/overhead.json (the other labels kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import machine, median_seconds, when
from checkpoint import QWEN_100M

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probepo.checks.spend import recipe_shape  # noqa: E402
from probepo.config import ExecutionProfile, RunConfig, StageResources  # noqa: E402
from probepo.presets import load_profile, load_run_config  # noqa: E402
from probepo.run.pipeline import train  # noqa: E402
from probepo.spend import BYTE_KINDS, PIECES, summed  # noqa: E402
from probepo.spend.model import STATED, Estimate, UpdateShape, estimate  # noqa: E402
from probepo.store import ArtifactStore, open_store  # noqa: E402
from slurm.executors import executor_for  # noqa: E402
from slurm.local_backend import LocalBackend  # noqa: E402
from slurm.runner import DriverJobRunner  # noqa: E402
from tests.hf.tiny_qwen import qwen_config, qwen_tokenizer  # noqa: E402
from tests.pipeline.sizes import committed_sizes  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "overhead.json"
RUN = "bench-overhead"
UPDATES, EVERY, RANKS, MINIBATCHES = 6, 3, 2, 4
RECIPES = {
    "deepseekmath-7b-sft": (6_910_365_696, 0),
    "qwen3-4b-base": (4_022_468_096, 151_936 * 2560),
    "r1-distill-qwen-1.5b": (1_777_088_000, 0),
}
"""The study's recipes (configs/<name>.yaml) and their models' parameter counts, with those of a tied LM
head (the model cards' and configs': deepseek-math-7b-instruct 6.91 B, untied; Qwen3-4B-Base 4.02 B, its
151,936 × 2,560 embedding tied; DeepSeek-R1-Distill-Qwen-1.5B 1.78 B, untied)."""
MODEST_SITE = replace(STATED, scratch_write=3.0, scratch_read=6.0, s3=1.0)
"""A site with one NVMe drive of node scratch (~3 GB/s writes) and 8 Gb/s to its S3 gateway: the range's
slow end."""
GPU_RATES = ROOT / "bench" / "results" / "overhead_gpu.json"
"""The device rates bench/overhead_gpu.py measured on a lent H200 (when one was)."""


def measured_device_rates() -> tuple[Any, dict[str, Any]] | None:
    """The stated rates with the three device ones (device→host into new pageable memory and into a pinned
    buffer kept, the fingerprint) as measured on a lent H200, and where they were measured; None if no GPU
    run is recorded."""
    if not GPU_RATES.exists():
        return None
    rates = json.loads(GPU_RATES.read_text())
    site = replace(
        STATED,
        device_to_host=rates["device_to_host_pageable"]["gb_per_s"],
        device_to_pinned=rates["device_to_host_pinned"]["gb_per_s"],
        device_hash=rates["fingerprint_on_device"]["gb_per_s"],
    )
    return site, {"machine": rates["machine"], "date": rates["date"], "command": rates["command"]}


STUDY_UPDATE_S = 104.0
"""The study's whole update at 7B: 231 H200-hours over 1,000 updates on 8 GPUs."""
STATE_PIECES = ("handoff", "digest", "save", "commit", "download", "load", "store_wait", "checkpoint_wait")
"""The pieces of an update's seconds that are state movement (and its waits), not its work."""


def build_model(folder: Path) -> None:
    """QWEN_100M, random init, float32, with Qwen's tokenizer, saved as a Hugging Face folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tokenizer = qwen_tokenizer()
    config = Qwen2Config(
        **QWEN_100M, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def recipe(folder: Path) -> RunConfig:
    """ProbePO on the 100M model: 2 prompts × 4 responses of up to 8 tokens, 4 mini-batches of 2."""
    model = {"kind": "hf", "pretrained": str(folder), "trainer": "deepspeed", "zero_stage": 2}
    return qwen_config(
        folder,
        model=model,
        num_updates=UPDATES,
        checkpoint_every=EVERY,
        group_size=4,
        sampling={"max_tokens": 8},
        eval={"problems": 2, "every": EVERY, "greedy": False},
    )


def run(work: Path) -> tuple[ArtifactStore, RunConfig]:
    """The resident executor's driver job, 2 ranks, on submitit's local executor."""
    folder = work / "model"
    build_model(folder)
    config = recipe(folder)
    driver = StageResources(tasks_per_node=RANKS, time_min=120)
    profile = ExecutionProfile(
        job_folder=str(work / "jobs"),
        poll_s=1.0,
        poll_max_s=5.0,
        env_allow_extra=("DS_*",),
        stages={"driver": driver},
    )
    store = open_store(work / "store")
    train(config, RUN, store=store, runner=DriverJobRunner(LocalBackend(profile), profile))
    return store, config


def host_memcpy_seconds(nbytes: int, repeats: int = 5) -> float:
    """The median seconds of one host memcpy of `nbytes` into memory already touched: what a hand-off in
    memory is compared with."""
    import torch

    source = torch.ones(nbytes // 4, dtype=torch.float32)
    target = torch.zeros_like(source)
    return median_seconds(lambda: target.copy_(source), repeats)


def handoff_against_memcpy(plain: dict[str, Any]) -> dict[str, Any]:
    """A plain update's hand-off: its bytes in memory and through a file, and its seconds against a host
    memcpy of the same bytes (`ratio`)."""
    memcpy_s = host_memcpy_seconds(int(plain["handoff_memory_bytes"]))
    seconds = plain["seconds"].get("handoff", 0.0)
    return {
        "handoff_bytes_in_memory": plain["handoff_memory_bytes"],
        "handoff_bytes_via_disk": plain["handoff_file_bytes"],
        "handoff_s": seconds,
        "host_memcpy_s": round(memcpy_s, 4),
        "handoff_ratio": round(seconds / memcpy_s, 2),
    }


def counted(metrics: list[dict[str, Any]], updates: list[int]) -> dict[str, Any]:
    """The mean over `updates` of each byte kind and piece (every stage summed), and the scratch peak."""
    rows = [next(m for m in metrics if m["update"] == u) for u in updates]

    def total(row: dict[str, Any], group: str, name: str) -> float:
        return sum(v for k, v in row.items() if k.startswith(f"{group}/") and k.endswith(f"/{name}"))

    return {
        "updates": updates,
        **{f"{kind}_bytes": statistics.mean(total(r, "bytes", kind) for r in rows) for kind in BYTE_KINDS},
        "seconds": {p: round(statistics.mean(total(r, "timing", p) for r in rows), 3) for p in PIECES},
        "scratch_peak_bytes": max(total(r, "bytes", "scratch_peak") for r in rows),
    }


def beside(store: ArtifactStore, updates: list[int]) -> dict[str, Any]:
    """The mean over `updates` of what their checkpoints' uploads spent beside the next updates: the
    `beside` attempt records of stage `checkpoint` at update k + 1 (rank 0's counters)."""
    found = [
        summed(a for a in store.attempts(RUN, update + 1, "checkpoint") if a.get("beside"))
        for update in updates
    ]
    kinds = sorted({kind for spent in found for kind in spent["bytes"]})
    pieces = sorted({piece for spent in found for piece in spent["seconds"]})
    return {
        "bytes": {k: statistics.mean(spent["bytes"].get(k, 0) for spent in found) for k in kinds},
        "seconds": {
            p: round(statistics.mean(spent["seconds"].get(p, 0.0) for spent in found), 3) for p in pieces
        },
    }


def state_seconds(row: dict[str, Any]) -> dict[str, float]:
    """A counted row's state seconds: what its updates waited for, and what ran beside them."""
    blocking = sum(row["seconds"].get(piece, 0.0) for piece in STATE_PIECES)
    return {
        "blocking_state_s": round(blocking, 3),
        "beside_s": round(sum(row.get("beside", {}).get("seconds", {}).values()), 3),
    }


def study_shape(name: str, parameters: int, tied: int) -> UpdateShape:
    """A study recipe under the resident executor on the h200-node profile (8 ranks, one node), as `probepo
    check` sees it."""
    config = load_run_config(ROOT / "configs" / f"{name}.yaml")
    profile = load_profile(ROOT / "configs" / "profiles" / "h200-node.yaml")
    return recipe_shape(config, profile, executor_for("resident"), parameters, tied)


def at_7b(bandwidths: Any) -> dict[str, Any]:
    rows = {}
    for name, (parameters, tied) in RECIPES.items():
        shape = study_shape(name, parameters, tied)
        found: Estimate = estimate(shape, bandwidths)
        rows[name] = {
            "parameters": parameters,
            "checkpoint_bytes": shape.sizes.checkpoint,
            "checkpoint_every": shape.checkpoint_every,
            "plain": {"bytes": found.plain.bytes, "seconds": _rounded(found.plain.seconds)},
            "checkpoint": {"bytes": found.checkpoint.bytes, "seconds": _rounded(found.checkpoint.seconds)},
            "amortised_seconds": _rounded(found.amortised_seconds()),
            "total_s": round(found.total_s, 1),
            "of_study_update": round(found.total_s / STUDY_UPDATE_S, 3),
            "blocking_amortised_seconds": _rounded(found.amortised_seconds(beside=False)),
            "beside_amortised_seconds": _rounded(found.amortised_seconds(beside=True)),
            "blocking_s": round(found.blocking_s, 2),
            "beside_s": round(found.beside_s, 2),
            "checkpoint_blocking_s": round(found.checkpoint.blocking_s, 2),
            "checkpoint_beside_s": round(found.checkpoint.beside_s, 2),
            "checkpoint_wait_s_at_study_update": round(found.checkpoint_wait_s(STUDY_UPDATE_S), 2),
        }
    return rows


def _rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {piece: round(value, 2) for piece, value in seconds.items()}


def measure(label: str) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        work = Path(tmp)
        store, config = run(work)
        metrics = store.read_metrics(RUN)
        full = [u for u, stages in store.ledger_entries(RUN).items() if "checkpoint" in stages and u > 0]
        checkpoint_updates = [u - 1 for u in full if u < UPDATES]  # uploaded beside the next updates
        plain = [u for u in range(1, UPDATES) if u + 1 not in full]
        # QWEN_100M ties its LM head to the float32 embedding
        tied = QWEN_100M["vocab_size"] * QWEN_100M["hidden_size"] * 4
        sizes = committed_sizes(store, RUN, UPDATES, work / "sizes", tied=tied)
        uploaded = beside(store, checkpoint_updates)
    shape = UpdateShape(
        sizes,
        ranks=RANKS,
        ranks_per_node=RANKS,
        checkpoint_every=EVERY,
        handoff="memory",
        accelerator=False,
    )
    rows = {
        "start": counted(metrics, [0]),
        "plain": counted(metrics, plain),
        "checkpoint": counted(metrics, checkpoint_updates) | {"beside": uploaded},
        "last checkpoint": counted(metrics, [UPDATES - 1]),
    }
    found = estimate(shape)
    predictions = (
        ("plain", found.plain.bytes),
        ("checkpoint", found.checkpoint.blocking_bytes),
        ("last checkpoint", found.checkpoint.bytes),  # committed inside its optimize
    )
    for kind, predicted in predictions:
        rows[kind]["model_vs_counted"] = {
            k: round(rows[kind][f"{k}_bytes"] / v, 4) for k, v in predicted.items() if k != "downloaded" and v
        }
    rows["checkpoint"]["beside_model_vs_counted"] = {
        k: round(uploaded["bytes"].get(k, 0) / v, 4) for k, v in found.checkpoint.beside_bytes.items()
    }
    for kind in ("checkpoint", "last checkpoint"):
        row = rows[kind]
        total = row["uploaded_bytes"] + row.get("beside", {}).get("bytes", {}).get("uploaded", 0)
        row["uploaded_per_checkpoint"] = round(total / sizes.checkpoint, 3)
    for row in rows.values():
        row |= state_seconds(row)
    bandwidths = STATED
    return {
        "label": label,
        "date": datetime.now(UTC).date().isoformat(),
        "machine": machine(),
        "command": f".venv/bin/python bench/overhead.py --label {label}",
        "wall_s": round(time.perf_counter() - started, 1),
        "run": {
            "model": "random-init Qwen2, 100.4 M parameters, float32 (bench/checkpoint.py QWEN_100M)",
            "executor": f"resident: a driver job of {RANKS} tasks (submitit's local executor), ZeRO-2, gloo",
            "updates": UPDATES,
            "checkpoint_every": EVERY,
            "minibatches": MINIBATCHES,
            "responses_per_update": config.prompts_per_update * config.group_size,
            "sizes": asdict(sizes) | {"checkpoint": sizes.checkpoint},
        },
        "counted": rows,
        "handoff": handoff_against_memcpy(rows["plain"]),
        "bandwidths": asdict(bandwidths),
        "at_7b": at_7b(bandwidths),
        "at_7b_modest_site": {
            "bandwidths": asdict(MODEST_SITE),
            "recipes": at_7b(MODEST_SITE),
        },
    } | _at_h200_rates()


def _at_h200_rates() -> dict[str, Any]:
    found = measured_device_rates()
    if found is None:
        return {}
    site, measured = found
    return {"at_7b_h200_rates": {"bandwidths": asdict(site), "measured": measured, "recipes": at_7b(site)}}


def markdown(results: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's tables (the site renders them from bench/results/overhead.json): how each label
    was recorded, what it counted per update (and beside the updates), and its 7B extrapolation, blocking
    and beside. A label from before issue 67 split nothing: every second of it blocked its update."""
    kinds = [f"{kind}_bytes" for kind in BYTE_KINDS]
    lines = ["| label | recorded by | date | machine |", "|---|---|---|---|"]
    lines += [
        f"| {label} | `{result['command']}` | {when(result['date'])} | {result['machine']} |"
        for label, result in results.items()
    ]
    lines += [
        "",
        "| label | update | "
        + " | ".join(k.removesuffix("_bytes") + " MB" for k in kinds)
        + " | scratch peak MB"
        " | seconds (this CPU) | beside the updates (this CPU) | model ÷ counted |",
        "|---|---|" + "---|" * (len(kinds) + 4),
    ]
    for label, result in results.items():
        for kind, row in result["counted"].items():
            seconds = ", ".join(f"{p} {s:g}" for p, s in row["seconds"].items() if s >= 0.005)
            ratios = [f"{k} {v:g}" for k, v in row.get("model_vs_counted", {}).items()]
            ratios += [f"beside: {k} {v:g}" for k, v in row.get("beside_model_vs_counted", {}).items()]
            megabytes = " | ".join(f"{row[k] / 1e6:,.1f}" for k in kinds)
            lines.append(
                f"| {label} | {kind} {row['updates']} | {megabytes} | {row['scratch_peak_bytes'] / 1e6:,.1f}"
                f" | {seconds} | {_beside_cell(row.get('beside'))} | {', '.join(ratios) or '–'} |"
            )
    header = (
        "| label | recipe | checkpoint GB | every | s per update, amortised | blocking s | beside s"
        " | total s | blocking ÷ the study's 104 s |"
    )
    lines += ["", header, "|---|---|---|---|---|---|---|---|---|"]
    for label, result in results.items():
        sites = {"stated": result["at_7b"], "modest site": result["at_7b_modest_site"]["recipes"]}
        if "at_7b_h200_rates" in result:
            sites["H200's device rates"] = result["at_7b_h200_rates"]["recipes"]
        for site, recipes in sites.items():
            for name, row in recipes.items():
                pieces = ", ".join(f"{p} {s:g}" for p, s in row["amortised_seconds"].items())
                blocking = row.get("blocking_s", row["total_s"])  # before issue 67 every second blocked
                lines.append(
                    f"| {label}, {site} | {name} | {row['checkpoint_bytes'] / 1e9:.1f}"
                    f" | {row['checkpoint_every']} | {pieces} | **{blocking:g}** | {row.get('beside_s', 0):g}"
                    f" | {row['total_s']:g} | {blocking / STUDY_UPDATE_S:.1%} |"
                )
    handed = {label: result["handoff"] for label, result in results.items() if "handoff" in result}
    if handed:
        lines += [
            "",
            "| label | hand-off MB in memory | via disk MB | hand-off s | host memcpy s | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for label, row in handed.items():
            lines.append(
                f"| {label} | {row['handoff_bytes_in_memory'] / 1e6:,.1f}"
                f" | {row['handoff_bytes_via_disk'] / 1e6:,.1f} | {row['handoff_s']:g}"
                f" | {row['host_memcpy_s']:g} | **{row['handoff_ratio']:g}** |"
            )
    return "\n".join(lines)


def _beside_cell(spent: dict[str, Any] | None) -> str:
    """A counted row's seconds and bytes beside the updates (its checkpoints' uploads), or – if none."""
    if not spent:
        return "–"
    seconds = [f"{p} {s:g} s" for p, s in spent["seconds"].items() if s >= 0.005]
    megabytes = [f"{k} {v / 1e6:,.1f} MB" for k, v in spent["bytes"].items()]
    return ", ".join(seconds + megabytes) or "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--label",
        default="before",
        help="the rows' label (before, after-43a, after, after-44a, after-44, after-67)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the tables of the results file only")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(RESULTS.read_text())))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    result = measure(args.label)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = result
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
