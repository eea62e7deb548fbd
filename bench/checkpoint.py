"""Checkpoint commits against the raw speed of the disk and of the S3 endpoint, side by side in one run.

    .venv/bin/python bench/checkpoint.py                 # the tiny Qwen2 and a 100M-parameter Qwen2 (≈ 4 min)
    .venv/bin/python bench/checkpoint.py --models tiny   # the tiny Qwen2 only (≈ 30 s)

A full checkpoint is what the checkpoint and optimize stages commit: the Hugging Face trainer's `save`
(config.json, model.safetensors, the tokenizer files, optimizer.safetensors with both AdamW moments,
trainer.json) into scratch, then `commit_stage` of every file. Two models: the tiny Qwen2 of
tests/hf/tiny_qwen.py (9.8 M parameters) and a random-init Qwen2 of 100.4 M parameters (Qwen's vocabulary,
hidden 512, 8 layers; nothing downloaded), both fp32 after one AdamW step, so the moments exist.

Each measurement is the same `save` followed by one way of moving its bytes:
- disk, ours: `commit_stage` into a local store (each file hashed in the one pass that copies it, fsynced,
  renamed into place; then the create-only marker);
- disk, raw: `cp -r` of the saved folder beside the store, then `sync` of the copies (an fsync of each: the
  durability the store gives before its marker); `ratio` is against `cp` alone, `ratio_vs_cp_sync` against
  `cp` + `sync`;
- S3, ours: `commit_stage` into an S3 store (each file hashed in the one read that uploads it, multipart
  parts sent in parallel; files in parallel);
- S3, raw: boto3's `upload_file` of each file in turn, with boto3's default transfer settings.
Before each measurement every dirty page is flushed (`os.sync`, not timed) and the last one's files are
gone; the ways alternate which goes first; a first round warms up and is not kept; each is repeated
`--rounds` times and the median kept. A ratio is ours ÷ raw throughput (the same bytes: raw seconds ÷ ours).
CPU seconds are this process's and its children's (cp, sync) and, for S3, the endpoint's: moto's S3 server
on loopback, started here (tests/s3server.py), sharing the machine's cores. Writes
bench/results/checkpoint.json; `markdown` renders it as docs/BENCHMARKS.md's table (the site renders it from
that file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import botocore
import psutil
import torch
import transformers
from benchlib import machine, recorded, table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probepo.config import OptimConfig  # noqa: E402
from probepo.engines.hf import HFTrainerEngine  # noqa: E402
from probepo.stages.common import policy_files  # noqa: E402
from probepo.store import ArtifactStore, open_store  # noqa: E402
from tests.hf.tiny_qwen import build_tiny_qwen, qwen_tokenizer  # noqa: E402
from tests.s3server import isolated_aws_env, start_s3_server  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "checkpoint.json"
RUN = "bench-checkpoint"
BUCKET = "probepo-bench-checkpoint"
MB = 1e6
QWEN_100M = dict(
    vocab_size=151_936,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
"""A Qwen2 of ~100 M parameters: Qwen's vocabulary (78 M of them, tied) and 8 small layers."""


def trainer(model: Any, tokenizer: Any) -> HFTrainerEngine:
    """The Hugging Face trainer on `model` after one AdamW step on random gradients (both moments filled,
    as in every checkpoint after update 0)."""
    engine = HFTrainerEngine(model, OptimConfig(), response_budget=16, tokenizer=tokenizer)
    generator = torch.Generator().manual_seed(0)
    for parameter in model.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator) * 1e-3
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=True)
    engine.optimizer_steps = 1
    return engine


def build_engines(work: Path, names: list[str]) -> dict[str, HFTrainerEngine]:
    """The trainers of the models asked for, by name (`tiny`, `100m`)."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    engines = {}
    if "tiny" in names:
        tiny = build_tiny_qwen(work / "tiny-qwen")
        engines["tiny"] = trainer(AutoModelForCausalLM.from_pretrained(tiny.folder), tiny.tokenizer)
    if "100m" in names:
        torch.manual_seed(0)
        tokenizer = qwen_tokenizer()
        config = Qwen2Config(
            **QWEN_100M, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        engines["100m"] = trainer(Qwen2ForCausalLM(config), tokenizer)
    return engines


def fresh(*folders: Path) -> None:
    """Remove the previous round's folders and flush every dirty page, so no measurement pays for
    another's writeback."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    os.sync()


class Laps:
    """Seconds from the start of a measurement to each named point of it, and the CPU seconds it used: this
    process's, its waited-for children's and the S3 server's (`server_cpu`)."""

    def __init__(self, server: psutil.Process) -> None:
        self.server = server
        self.marks: dict[str, float] = {}
        self.start, self.cpu_start, self.server_start = time.perf_counter(), cpu_seconds(), server_cpu(server)

    def mark(self, name: str) -> None:
        """Record the seconds since the start under `name`."""
        self.marks[name] = time.perf_counter() - self.start

    def close(self) -> None:
        """Record the CPU seconds used since the start (`cpu`, `server_cpu`)."""
        self.marks["cpu"] = cpu_seconds() - self.cpu_start
        self.marks["server_cpu"] = server_cpu(self.server) - self.server_start


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have been waited for (cp, sync)."""
    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def server_cpu(server: psutil.Process) -> float:
    """CPU seconds of the S3 server process."""
    times = server.cpu_times()
    return times.user + times.system


Way = Callable[[Laps, int], None]
"""One way to make a checkpoint durable: saves it and moves its bytes, marking its laps; gets the round."""


def alternate(
    ways: dict[str, Way], reset: Callable[[], None], rounds: int, server: psutil.Process
) -> dict[str, dict[str, list]]:
    """Every way once per round, after `reset`, the order alternating between rounds; a first round warms
    up (connections, threads, page cache of the code) and is not kept. Returns way → lap → seconds."""
    laps: dict[str, dict[str, list]] = {way: {} for way in ways}
    for round_index in range(-1, rounds):
        for way in list(ways) if round_index % 2 else list(ways)[::-1]:
            reset()
            measured = Laps(server)
            ways[way](measured, round_index + 1)
            measured.close()
            if round_index >= 0:
                for name, seconds in measured.marks.items():
                    laps[way].setdefault(name, []).append(seconds)
    return laps


def committer(engine: HFTrainerEngine, store: ArtifactStore, folder: Path, sizes: list[int]) -> Way:
    """Ours: the trainer's save into `folder`, then `commit_stage` of its files (the bytes it commits are
    appended to `sizes`)."""

    def commit(laps: Laps, update: int) -> None:
        engine.save(folder)
        laps.mark("save")
        marker = store.commit_stage(RUN, update, "checkpoint", policy_files(folder))
        laps.mark("total")
        sizes.append(sum(entry["size"] for entry in marker["files"].values()))

    return commit


def bench_disk(engine: HFTrainerEngine, work: Path, rounds: int, server: psutil.Process) -> dict[str, Any]:
    """Save + commit into a local store vs save + `cp -r` (then `sync` of the copies) into a folder."""
    scratch, store_root, plain = work / "scratch", work / "store", work / "plain"
    sizes: list[int] = []

    def copy(laps: Laps, update: int) -> None:
        folder, target = scratch / "raw", plain / f"raw-{update}"
        engine.save(folder)
        laps.mark("save")
        subprocess.run(["cp", "-r", str(folder), str(target)], check=True)
        laps.mark("cp")
        subprocess.run(["sync", str(target), *map(str, sorted(target.iterdir()))], check=True)
        laps.mark("cp_sync")

    def reset() -> None:
        fresh(scratch, store_root, plain)
        plain.mkdir(parents=True)

    ways = {"ours": committer(engine, open_store(store_root), scratch / "ours", sizes), "raw": copy}
    laps = alternate(ways, reset, rounds, server)
    fresh(scratch, store_root, plain)
    return figures(sizes[-1], laps, {"cp": ("raw", "cp"), "cp_sync": ("raw", "cp_sync")})


def bench_s3(
    engine: HFTrainerEngine, client: Any, work: Path, rounds: int, server: psutil.Process
) -> dict[str, Any]:
    """Save + commit into an S3 store vs save + boto3 `upload_file` of each file (boto3's defaults)."""
    scratch = work / "scratch"
    sizes: list[int] = []

    def upload(laps: Laps, update: int) -> None:
        folder = scratch / "raw"
        engine.save(folder)
        laps.mark("save")
        for name, path in policy_files(folder).items():
            client.upload_file(str(path), BUCKET, f"plain/{update}/{name}")
        laps.mark("upload_file")

    def reset() -> None:
        fresh(scratch)
        empty_bucket(client)

    store = open_store(f"s3://{BUCKET}/ours")
    ways = {"ours": committer(engine, store, scratch / "ours", sizes), "raw": upload}
    laps = alternate(ways, reset, rounds, server)
    reset()
    return figures(sizes[-1], laps, {"upload_file": ("raw", "upload_file")})


def empty_bucket(client: Any) -> None:
    """Delete every object of the benchmark's bucket (moto keeps them in memory)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})


def figures(size: int, laps: dict[str, dict[str, list]], raws: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Bytes; median seconds and MB/s of ours and of each raw way (`raws`: name → (way, lap)); `ratio`
    (ours ÷ raw throughput) against the first raw way, `ratio_vs_<name>` against the others; the median
    seconds of each way's save alone and its CPU seconds (client side, and the S3 server's); every round's
    seconds."""
    totals = {"ours": laps["ours"]["total"]} | {name: laps[way][lap] for name, (way, lap) in raws.items()}
    medians = {name: statistics.median(seconds) for name, seconds in totals.items()}
    first, *others = raws

    def median_of(lap: str) -> dict[str, float]:
        return {way: round(statistics.median(laps[way][lap]), 3) for way in laps}

    return {
        "bytes": size,
        "ratio": round(medians[first] / medians["ours"], 3),
        **{f"ratio_vs_{name}": round(medians[name] / medians["ours"], 3) for name in others},
        "seconds_median": {name: round(value, 3) for name, value in medians.items()},
        "mb_per_s": {name: round(size / MB / value, 1) for name, value in medians.items()},
        "save_seconds_median": median_of("save"),
        "cpu_seconds_median": median_of("cpu"),
        "server_cpu_seconds_median": median_of("server_cpu"),
        "seconds": {name: [round(value, 3) for value in seconds] for name, seconds in totals.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=["tiny", "100m"], default=["tiny", "100m"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()

    server = start_s3_server()
    os.environ.update(isolated_aws_env(server))
    assert server.process is not None
    server_process = psutil.Process(server.process.pid)
    results: dict[str, Any] = {}
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory(prefix="probepo-bench-checkpoint-") as tmp:
            work = Path(tmp)
            for name, engine in build_engines(work, args.models).items():
                parameters = sum(p.numel() for p in engine.model.parameters())
                results[name] = {"parameters": parameters}
                results[name]["disk"] = bench_disk(engine, work, args.rounds, server_process)
                print(name, "disk", json.dumps(results[name]["disk"]), flush=True)
                results[name]["s3"] = bench_s3(engine, client, work, args.rounds, server_process)
                print(name, "s3", json.dumps(results[name]["s3"]), flush=True)
    finally:
        server.stop()

    out = {
        "ratio": {
            f"{name}_{target}": results[name][target]["ratio"]
            for name in results
            for target in ("disk", "s3")
        },
        "details": results,
        "endpoint": "moto S3 server (tests/s3server.py) on 127.0.0.1, same machine",
        "machine": machine(),
        "versions": {
            "boto3": boto3.__version__,
            "botocore": botocore.__version__,
            "torch": torch.__version__,
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(["bench/checkpoint.py", *sys.argv[1:]]),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "details"}, indent=2))
    print(markdown(out))


MODELS = {"tiny": "tiny Qwen2", "100m": "random-init Qwen2"}
"""How the table names each model of the results file."""


def markdown(results: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's checkpoint table, rendered from bench/results/checkpoint.json when the site is
    built: per model and target, ours (save + `commit_stage`) against the raw ways, medians."""
    rows = []
    for name, entry in results["details"].items():
        model = MODELS.get(name, name)
        disk, s3 = entry["disk"], entry["s3"]
        seconds, rate = disk["seconds_median"], disk["mb_per_s"]
        rows.append(
            [
                f"{model}, {entry['parameters'] / 1e6:.1f} M parameters ({disk['bytes'] / 1e6:,.1f} MB)",
                "disk",
                f"{seconds['ours']:.3f} s, {rate['ours']:.0f} MB/s",
                f"`cp -r` {seconds['cp']:.3f} s, {rate['cp']:.0f} MB/s;"
                f" `cp -r` + `sync` {seconds['cp_sync']:.3f} s",
                f"**{disk['ratio']:.2f}**; {disk['ratio_vs_cp_sync']:.2f} vs `cp` + `sync`",
            ]
        )
        seconds, rate = s3["seconds_median"], s3["mb_per_s"]
        rows.append(
            [
                model,
                "S3",
                f"{seconds['ours']:.3f} s, {rate['ours']:.0f} MB/s",
                f"`upload_file` per file {seconds['upload_file']:.3f} s, {rate['upload_file']:.0f} MB/s",
                f"**{s3['ratio']:.2f}**",
            ]
        )
    versions = ", ".join(f"{name} {version}" for name, version in results.get("versions", {}).items())
    head = (
        recorded(results, "bench/results/checkpoint.json") + f"; endpoint: {results['endpoint']}; {versions}."
    )
    header = ["model (checkpoint bytes)", "target", "ours (save + `commit_stage`)", "raw (save + …)", "ratio"]
    return "\n".join([head, "", *table(header, rows)])


if __name__ == "__main__":
    main()
