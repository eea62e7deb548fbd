"""The executors against real daemons: every stage a job (SLURM, or a local subprocess) gives the inline
run's bits; jobs see no secret of the driver and still reach S3; multi-task jobs get their rank
environment; bad requests (two nodes where one is all there is among them) and a missing SLURM are
refused before anything runs, naming why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from probepo.presets import load_profile
from probepo.run.pipeline import train
from probepo.run.schedule import TRAINING_STAGES
from probepo.store import open_store
from slurm import make_runner
from tests.slurm.conftest import drill_config
from tests.slurm.drill import Drill, slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SENTINEL = "sentinel-secret-never-in-a-job-3f9a"
FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")
CLI_TRAIN = (sys.executable, "-m", "probepo.cli", "train", "configs/cpu-demo.yaml", "--run-id", "x")


def _final(store, run_id: str, update: int) -> dict[str, bytes]:
    final = store.read_stage(run_id, update, "checkpoint")
    return {name: final[name] for name in FILES}


def test_three_updates_as_slurm_jobs_on_s3_equal_inline_and_jobs_hold_no_secret(
    s3_warm_store, warm_store, tmp_path, profile_path
):
    config = drill_config(num_updates=3)
    train(config, "three-inline", store=warm_store)
    credentials = tmp_path / "aws-credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {os.environ['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {os.environ['AWS_SECRET_ACCESS_KEY']}\n"
    )
    drill = Drill(
        s3_warm_store, "three-slurm", tmp_path, profile_path, config, pause=("0:sample:before-commit",)
    )
    saved = dict(os.environ)
    os.environ.update(AWS_SECRET_ACCESS_KEY=SENTINEL, AWS_SHARED_CREDENTIALS_FILE=str(credentials))
    try:
        drill.train()
        pid = drill.paused_at("0:sample:before-commit")
        job_env = dict(
            line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line
        )
        drill.release.touch()
        drill.finish()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert "AWS_SECRET_ACCESS_KEY" not in job_env and "AWS_ACCESS_KEY_ID" not in job_env
    assert job_env["AWS_SHARED_CREDENTIALS_FILE"] == str(credentials)  # how the job reached S3
    for path in (tmp_path / "jobs").rglob("*"):
        if path.is_file():
            assert SENTINEL.encode() not in path.read_bytes(), path
    assert _final(s3_warm_store, "three-slurm", 3) == _final(warm_store, "three-inline", 3)
    expected = {"checkpoint", "evaluate", *TRAINING_STAGES}
    assert {stage for u in range(3) for stage in s3_warm_store.ledger_entries("three-slurm")[u]} >= expected
    for update, stages in s3_warm_store.ledger_entries("three-slurm").items():
        for stage in (s for s in stages if "." not in s and not (s == "checkpoint" and update > 0)):
            jobs = s3_warm_store.jobs("three-slurm", update, stage)
            assert [j["executor"] for j in jobs] == ["slurm"], (update, stage)  # every stage a job
    listing = subprocess.run(
        [sys.executable, "-m", "probepo.cli", "jobs", "three-slurm", "--store", s3_warm_store.url],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "optimize" in listing and "COMPLETED" in listing and "committed" in listing


def test_the_local_executor_runs_each_stage_in_a_subprocess_with_the_same_bits(
    warm_store, drill_baseline, tmp_path
):
    profile = ExecutionProfile(job_folder=str(tmp_path / "jobs"), poll_s=0.2, poll_max_s=0.2)
    runner = make_runner("local", profile)
    train(drill_config(), "drill-local", store=warm_store, runner=runner)
    assert _final(warm_store, "drill-local", 1) == drill_baseline
    pids = {a["pid"] for a in warm_store.attempts("drill-local")}
    assert os.getpid() not in pids and len(pids) == runner.submissions == 9


def test_a_two_task_job_gets_its_rank_environment_and_can_all_reduce(slurm_cluster, tmp_path):
    import submitit

    from tests.slurm.distributed_job import all_reduce_ranks

    executor = submitit.SlurmExecutor(folder=tmp_path / "jobs", max_num_timeout=0)
    executor.update_parameters(partition="low", ntasks_per_node=2, gpus_per_node=8, time=5)
    results = executor.submit(all_reduce_ranks).results()
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert {r["world_size"] for r in results} == {2} and {r["sum"] for r in results} == {1.0}
    assert {r["local_rank"] for r in results} == {0, 1} and all(r["master_port"] > 0 for r in results)


def test_an_impossible_request_is_refused_at_submit_naming_slurms_reason(warm_store, tmp_path, slurm_cluster):
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"),
        defaults=StageResources(partition="low"),
        stages={"checkpoint": StageResources(gpus_per_node=9)},
    )
    from slurm.backends import SubmitRefused

    with pytest.raises(
        SubmitRefused, match=r"Requested node configuration is not available.*gpus_per_node=9"
    ):
        train(drill_config(), "impossible", store=warm_store, runner=make_runner("slurm", profile))
    assert not warm_store.updates("impossible")


def test_a_profile_field_that_does_not_exist_is_named(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"stages": {"optimize": {"gpu_per_node": 8}}}))
    result = subprocess.run(
        [*CLI_TRAIN, "--executor", "slurm", "--profile", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "stages.optimize.gpu_per_node: no such field; did you mean stages.optimize.gpus_per_node?" in (
        result.stderr
    )
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY would hand credentials"):
        path.write_text(yaml.safe_dump({"env_allow": ["PATH", "AWS_SECRET_ACCESS_KEY"]}))
        load_profile(path)


REFUSALS = {
    "slurm": "nodes = 2, but partition low has 1 node(s) (probepo-node1): lower nodes, or give a partition"
    " of 2, in the execution profile's stages.optimize",
    "resident": "nodes = 2, but partition low has 1 node(s) (probepo-node1): lower nodes, or give a"
    " partition of 2, in the execution profile's stages.driver",
    "local": "nodes > 1 in the execution profile's stages.optimize: the local executor runs every job on",
}


@pytest.mark.parametrize(
    ("executor", "stage"), [("slurm", "optimize"), ("resident", "driver"), ("local", "optimize")]
)
def test_a_multi_node_request_where_one_node_is_all_there_is_is_refused_before_any_job_is_submitted(
    slurm_cluster, tmp_path, executor, stage
):
    """On the single-node partition `low` (the cluster's default) and on this machine (the local executor),
    a job of two nodes is refused naming the node counts; no job is submitted."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    path = tmp_path / "profile.yaml"
    jobs = tmp_path / "jobs"
    path.write_text(yaml.safe_dump({"job_folder": str(jobs), "stages": {stage: {"nodes": 2}}}))
    store, run_id = tmp_path / "store", f"two-nodes-{executor}"
    options = {"--run-id": run_id, "--executor": executor, "--profile": str(path), "--store": str(store)}
    result = subprocess.run(
        [*CLI_TRAIN[:-2], *(word for pair in options.items() for word in pair)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert REFUSALS[executor] in " ".join(result.stderr.split())
    # No sbatch ran: no submission in the job folder (the checks only write and delete a probe there), no
    # run in the store (the checks probe it), and SLURM knows no job of the run.
    assert not [path for path in jobs.rglob("*") if path.is_file()]
    assert not store.exists() or open_store(store).runs() == []
    names = slurm("sacct", "-n", "-X", "-P", "-a", "-S", started, "-o", "JobName").splitlines()
    assert not [name for name in names if name.startswith(f"probepo-{run_id}-")]


def _cli_slurm(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "probepo.cli",
            "train",
            "configs/cpu-demo.yaml",
            "--run-id",
            "x",
            "--executor",
            "slurm",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_no_slurm_on_path_fails_fast_naming_what_and_how(tmp_path):
    bin_dir = Path(sys.executable).parent
    result = _cli_slurm({**os.environ, "PATH": f"{bin_dir}:/usr/bin/nonexistent"})
    assert result.returncode == 2 and "sbatch" in result.stderr and "infra/slurm/start.sh" in result.stderr


def test_a_controller_that_does_not_answer_fails_fast_naming_it(slurm_cluster, tmp_path):
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    port = next(line for line in conf.splitlines() if line.startswith("SlurmctldPort="))
    dead = tmp_path / "slurm.conf"
    dead.write_text(conf.replace(port, "SlurmctldPort=1"))
    for name in ("gres.conf", "plugstack.conf"):
        shutil.copy(Path(os.environ["SLURM_CONF"]).with_name(name), tmp_path / name)
    result = _cli_slurm({**os.environ, "SLURM_CONF": str(dead)})
    assert result.returncode == 2 and "slurmctld" in result.stderr and "infra/slurm" in result.stderr
