"""What a Prefect worker's environment must hold for the study's recipes (infra/prefect/worker.env.example),
and a refused train flow naming what it lacks."""

from __future__ import annotations

import os
from pathlib import Path

from probepo.checks.environment import missing_environment
from probepo.presets import load_run_config

ROOT = Path(__file__).resolve().parents[2]
READ = ("AWS_", "HF_", "PROBEPO_BENCHMARKS")


def test_an_empty_environment_lacks_what_the_7b_recipe_reads(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith(READ)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws/credentials
    config = load_run_config(ROOT / "configs" / "deepseekmath-7b-sft.yaml", {"store": "s3://bucket/runs"})
    missing = missing_environment(config)
    assert [line.split()[0] for line in missing] == [
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_REGION",
        "HF_HUB_OFFLINE=1",
        "HF_HUB_CACHE",
        "PROBEPO_BENCHMARKS",
    ]
    example = (ROOT / "infra" / "prefect" / "worker.env.example").read_text()
    for line in missing:  # the example file sets each of them
        assert f"\n{line.split()[0].split('=')[0]}=" in example, line
    for name, value in (line.split("=", 1) for line in example.splitlines() if line and line[0] != "#"):
        monkeypatch.setenv(name, value)
    assert missing_environment(config) == []

    from flows.train import worker_lacks

    monkeypatch.delenv("HF_HUB_OFFLINE")
    (lacks,) = worker_lacks(config.model_dump(mode="json"))
    assert lacks.startswith(
        "the worker's environment has no HF_HUB_OFFLINE=1 (model.pretrained = deepseek-ai/"
    )
    assert "infra/prefect/worker.env.example" in lacks


def test_the_testbed_reads_nothing_from_the_environment():
    assert missing_environment(load_run_config(ROOT / "configs" / "cpu-demo.yaml")) == []
