"""The tiny CPU-testbed recipe that pipeline, CLI and execution tests share (warm stores: ../conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from probepo.config import RunConfig
from probepo.run.faults import CRASH_ENV, STOP_ENV


def tiny_config(algorithm: str = "probepo", **fields: object) -> RunConfig:
    """4 prompts × 4 responses of 3-step mod-3 chains, 2 updates, 16 eval problems. The warm-up (about
    30 steps) stops at ≥ 20 % accuracy, so groups have mixed rewards and every stage sees real signal."""
    data = RunConfig().model_dump()
    data.update(num_updates=2, prompts_per_update=4, group_size=4)
    data["task"].update(steps=3, modulus=3)
    data["warmup"].update(
        accuracy_low=0.2, accuracy_high=0.6, check_every=10, check_problems=64, max_steps=400
    )
    data["eval"].update(problems=16, every=1)
    data["optim"].update(minibatch_size=6, microbatch_size=4)  # 16 responses -> 3 mini-batches
    data["algo"].update(algorithm=algorithm, max_pivots=2, continuations_per_pivot=3)
    data.update(fields)
    return RunConfig.model_validate(data)


LONG_UPDATES = 5
"""`every_config` trains 5 updates: with checkpoint_every 3, policies 0, 3 and 5 are committed in full."""
FINAL_FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")


def every_config(every: int) -> RunConfig:
    """The tiny recipe over 5 updates, checkpointed in full every `every` updates."""
    return tiny_config("probepo", num_updates=LONG_UPDATES, checkpoint_every=every)


def train_cli(
    store_url: str,
    preset: Path,
    run_id: str,
    crash_at: str | None,
    events: Path | None = None,
    profile: Path | None = None,
    stop_at: str | None = None,
) -> int:
    """`probepo train PRESET` in a subprocess (with `--profile` if given), SIGKILLed at `crash_at` if given,
    told to stop (SIGUSR2) at `stop_at` if given; returns its exit status."""
    env = {key: value for key, value in os.environ.items() if key not in (CRASH_ENV, STOP_ENV)}
    if crash_at:
        env[CRASH_ENV] = crash_at
    if stop_at:
        env[STOP_ENV] = stop_at
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", run_id]
    command += ["--store", store_url, "--quiet"]
    if events is not None:
        command += ["--tensorboard", str(events)]
    if profile is not None:
        command += ["--profile", str(profile)]
    return subprocess.run(command, env=env, capture_output=True, timeout=300).returncode
