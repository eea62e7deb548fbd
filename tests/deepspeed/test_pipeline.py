"""The optimize stage of a ProbePO run of the tiny Qwen2 model as a local job of two ranks running
DeepSpeed ZeRO-3, SIGKILLed inside the optimizer (both ranks, after the first mini-batch's commit): the
dead job is submitted again, the stage resumes at the next mini-batch on both ranks, and the committed
policy equals, bit for bit (weights and both ranks' optimizer shards), an uninterrupted replay of that
stage from the committed inputs. Nothing in the store is a pickle. The stages before it ran inline in
one process (a group of one: checkpoint 0 has no optimizer state, so any number of ranks starts from it).

The tiny model earns no reward on these problems (it never writes a boxed answer), so this run's
advantages are 0 and its update only applies weight decay: the gradients are checked against the Hugging
Face engine in test_engine.py, on a batch with non-zero advantages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from probepo.run.execution import StageRequest
from probepo.run.faults import CRASH_ENV, STOP_ENV
from probepo.stages.context import StageContext
from probepo.store import open_store
from slurm import make_runner
from tests.deepspeed.ranks_job import replay_on_two_local_ranks
from tests.hf.tiny_qwen import qwen_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PICKLE_HEADS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def test_a_two_rank_zero3_optimize_job_killed_inside_the_optimizer_resumes_to_the_bits_of_a_replay(
    tiny_qwen, tmp_path, monkeypatch, scratch_of_killed_runs
):
    scratch_of_killed_runs("zero3")
    store = open_store(tmp_path / "store")
    model = {"kind": "hf", "pretrained": str(tiny_qwen.folder), "trainer": "deepspeed", "zero_stage": 3}
    config = qwen_config(tiny_qwen.folder, num_updates=1, model=model, eval={"problems": 2, "every": 1})
    preset = tmp_path / "zero3.yaml"
    preset.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", "zero3"]
    command += ["--store", store.url, "--quiet", "--executor", "inline"]
    inline = subprocess.run(command, env={**os.environ, CRASH_ENV: "0:advantage:after-commit"}, timeout=600)
    assert inline.returncode == -signal.SIGKILL and store.committed("zero3", 0, "advantage")

    two = StageResources(tasks_per_node=2)
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"), poll_s=0.2, poll_max_s=0.2, stages={"optimize": two}
    )
    # both ranks are told to stop after the first mini-batch, and kill themselves once its part is committed
    monkeypatch.setenv(STOP_ENV, "0:optimize.minibatch-0000:done")
    monkeypatch.setenv(CRASH_ENV, "0:optimize.part-0000:after-commit")
    ctx = StageContext(store, "zero3", 0, config, tmp_path / "driver")
    runner = make_runner("local", profile)
    runner.run(StageRequest.of(ctx, "optimize"), ctx)

    assert runner.submissions == 2
    optimize = store.attempts("zero3", 0, "optimize")
    assert [a["outcome"] for a in optimize] == ["running", "committed"]  # the killed one never reported
    assert optimize[-1]["resumed_at_minibatch"] == 1 and optimize[-1]["minibatches_run"] == 1
    files = store.marker("zero3", 1, "checkpoint")["files"]
    assert {f"optimizer-rank-0000{r}-of-00002.safetensors" for r in (0, 1)} <= set(files)
    assert "model.safetensors" in files and "optimizer.safetensors" not in files

    monkeypatch.delenv(CRASH_ENV)
    monkeypatch.delenv(STOP_ENV)
    assert replay_on_two_local_ranks(store.url, "zero3", config.model_dump_json(), tmp_path, 0) == [
        True,
        True,
    ]

    for path in Path(store.url).rglob("*"):
        if path.is_file():
            assert path.read_bytes()[:2] not in PICKLE_HEADS and path.suffix not in (".pkl", ".pt", ".bin")
