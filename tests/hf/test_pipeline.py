"""A real causal LM through every stage: the tiny Qwen2 model (Qwen's BPE vocabulary) on maths problems,
two ProbePO updates, checkpoint 0 its pretrained weights, rewards from math-verify with the reason of
each zero, Hugging Face checkpoints with nothing pickled; a run killed inside the optimizer resumes to the
same bits; benchmark evaluation with Mean@k."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from probepo.data.benchmarks import benchmarks_root
from probepo.report.summary import write_report
from probepo.run.faults import CRASH_ENV, STOP_ENV
from probepo.run.pipeline import train
from probepo.run.schedule import TRAINING_STAGES
from probepo.store import open_store
from probepo.store.formats import table_from_parquet
from tests.hf.tiny_qwen import qwen_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")


@pytest.fixture(scope="module")
def finished(tiny_qwen, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen-store")
    store = open_store(folder)
    config = qwen_config(tiny_qwen.folder)
    train(config, "qwen", store=store, tensorboard_dir=folder / "tensorboard")
    yield store, config
    shutil.rmtree(folder)  # Hugging Face checkpoints: ~135 MB each with the full Qwen vocabulary


def test_every_stage_runs_the_real_model(finished, tiny_qwen):
    store, _ = finished
    entries = store.ledger_entries("qwen")
    assert {"checkpoint", "evaluate", *TRAINING_STAGES} <= set(entries[0])
    assert [stage for stage in entries[2] if ".shard-" not in stage] == ["checkpoint", "evaluate"]
    assert store.marker("qwen", 0, "checkpoint")["summary"]["pretrained"] == str(tiny_qwen.folder)
    assert not any(run.startswith("warmup-") for run in store.runs())  # a real model starts pretrained
    rollouts = table_from_parquet(store.read_stage("qwen", 0, "sample")["rollouts.parquet"])
    assert len(rollouts["text"]) == 4 and set(rollouts["outcome"]) <= {
        "correct",
        "no_answer",
        "unparsable",
        "wrong",
    }
    assert all(r == (o == "correct") for r, o in zip(rollouts["reward"], rollouts["outcome"], strict=True))
    summary = store.marker("qwen", 0, "sample")["summary"]
    assert sum(
        v
        for k, v in summary.items()
        if k.endswith("_fraction") and k != "finished_fraction" and k != "uniform_group_fraction"
    ) == pytest.approx(1 - summary["reward_mean"])
    assert store.marker("qwen", 0, "probe")["summary"]["continuations"] > 0
    assert store.marker("qwen", 0, "select")["summary"]["pivots"] > 0


def test_the_spend_counters_reach_tensorboard_and_the_report(finished, tmp_path):
    store, _ = finished
    events = Path(store.url) / "tensorboard"
    tags = set(EventAccumulator(str(events)).Reload().Tags()["scalars"])
    # the pretrained weights fetched for generation, the checkpoint's bytes uploaded at update 2
    assert {"timing/sample/generation", "bytes/evaluate/downloaded", "bytes/optimize/uploaded"} <= tags
    uploaded = [
        m["bytes/optimize/uploaded"] for m in store.read_metrics("qwen") if "bytes/optimize/uploaded" in m
    ]
    checkpoint = sum(f["size"] for f in store.marker("qwen", 2, "checkpoint")["files"].values())
    assert uploaded[-1] == checkpoint  # the checkpoint alone: no part without a stop
    report = write_report(store, ["qwen"], tmp_path).read_text()
    assert "### Where qwen's updates went" in report and (tmp_path / "spend-qwen.png").exists()


def test_checkpoints_are_hugging_face_folders_and_nothing_is_pickled(finished, tmp_path):
    from transformers import AutoModelForCausalLM

    store, _ = finished
    final = store.read_stage("qwen", 2, "checkpoint")
    assert {"config.json", "model.safetensors", "tokenizer.json", *FILES} <= set(final)
    for name in final:
        store.download_stage_file("qwen", 2, "checkpoint", name, tmp_path / name)
    AutoModelForCausalLM.from_pretrained(tmp_path)  # what generation and users load
    for path in Path(store.url).rglob("*"):
        if path.is_file():
            head = path.read_bytes()[:2]
            assert head not in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") and path.suffix not in (
                ".pkl",
                ".pt",
                ".bin",
            )


def test_a_run_killed_inside_the_optimizer_resumes_to_the_same_bits(
    finished, tiny_qwen, tmp_path, scratch_of_killed_runs
):
    scratch_of_killed_runs("qwen-killed")
    store, config = finished
    preset = tmp_path / "qwen.yaml"
    preset.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", "qwen-killed"]
    command += ["--store", store.url, "--quiet", "--tensorboard", str(tmp_path / "tb")]
    command += ["--executor", "inline"]  # an hf recipe's default where sbatch is on PATH is resident
    # told to stop after the first mini-batch, killed once its part is committed (the grace window ran out)
    env = {
        **os.environ,
        STOP_ENV: "1:optimize.minibatch-0000:done",
        CRASH_ENV: "1:optimize.part-0000:after-commit",
    }
    assert subprocess.run(command, env=env, capture_output=True, timeout=600).returncode == -signal.SIGKILL
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    attempt = store.attempts("qwen-killed", 1, "optimize")[-1]
    assert attempt["resumed_at_minibatch"] == 1 and attempt["minibatches_run"] == 1
    again, first = store.read_stage("qwen-killed", 2, "checkpoint"), store.read_stage("qwen", 2, "checkpoint")
    assert {name: again[name] for name in FILES} == {name: first[name] for name in FILES}


@pytest.mark.skipif(
    not (benchmarks_root() / "amc23").is_dir(), reason="the shared benchmark files are not here"
)
def test_benchmark_evaluation_reports_mean_at_k_per_benchmark(tiny_qwen, tmp_path):
    store = open_store(tmp_path / "store")
    eval_settings = {"benchmarks": ["amc23", "aime24"], "benchmark_problems": 2, "benchmark_samples": 2}
    config = qwen_config(tiny_qwen.folder, num_updates=0, eval={"every": 1, "greedy": False, **eval_settings})
    metrics = train(config, "qwen-bench", store=store)
    summary = store.marker("qwen-bench", 0, "evaluate")["summary"]
    assert summary["amc23/k"] == 2 and summary["amc23/problems"] == 2 and 0 <= summary["aime24/mean"] <= 1
    assert "avg6" not in summary  # two of the six study sets
    assert summary["accuracy"] == pytest.approx((summary["amc23/mean"] + summary["aime24/mean"]) / 2)
    table = table_from_parquet(store.read_stage("qwen-bench", 0, "evaluate")["eval-aime24.parquet"])
    assert list(table["id"]) == ["aime24/60", "aime24/61"] and np.all(np.asarray(table["correct"]) >= 0)
    assert "evaluate/amc23/mean" in metrics[0]


def test_a_run_checkpointed_every_other_update_replays_the_real_model_after_a_kill(
    finished, tmp_path, scratch_of_killed_runs
):
    """checkpoint_every 2: policy 1 is never committed in full; killed after update 1's sample, the resumed
    run replays optimize 0 from checkpoint 0 (the generator gets policy 1's weights from the replayed
    trainer) and ends with the bits of the run that checkpointed every update."""
    store, config = finished
    scratch_of_killed_runs("qwen-every-2")
    preset = tmp_path / "qwen-every-2.yaml"
    preset.write_text(yaml.safe_dump({**config.model_dump(mode="json"), "checkpoint_every": 2}))
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", "qwen-every-2"]
    command += ["--store", store.url, "--quiet", "--tensorboard", str(tmp_path / "tb")]
    command += ["--executor", "inline"]  # an hf recipe's default where sbatch is on PATH is resident
    env = {**os.environ, CRASH_ENV: "1:sample:after-commit"}
    assert subprocess.run(command, env=env, capture_output=True, timeout=600).returncode == -signal.SIGKILL
    assert not store.committed("qwen-every-2", 1, "checkpoint")
    train(config.model_copy(update={"checkpoint_every": 2}), "qwen-every-2", store=store)
    replayed = [
        a.get("replayed_updates") for a in store.attempts("qwen-every-2") if a.get("replayed_updates")
    ]
    assert replayed == [1]
    again, first = (
        store.read_stage("qwen-every-2", 2, "checkpoint"),
        store.read_stage("qwen", 2, "checkpoint"),
    )
    assert {name: again[name] for name in FILES} == {name: first[name] for name in FILES}
