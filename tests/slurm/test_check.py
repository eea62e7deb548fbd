"""`probepo check` against the real SLURM cluster (infra/slurm: partitions low, high and short, 8 fake GPUs a
node, preempt_send_user_signal): each site problem refused with its one line, table-driven; the testbed
and the tiny Qwen recipes passing; a site without preempt_send_user_signal warned about, a grace longer
than a partition's GraceTime refused; the probe job run on the cluster through the command line: its
interpreter, the store reached (or not) with the credentials a job gets (moto and Ceph RGW), its $TMPDIR
against what an update writes there."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from slurm import site
from slurm.check import check_launch
from tests.hf.tiny_qwen import TinyQwen, qwen_config
from tests.pipeline.conftest import tiny_config
from tests.s3server import isolated_aws_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _profile(tmp_path: Path, **fields: object) -> str:
    data = {"job_folder": str(tmp_path / "jobs"), **fields}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _recipe(tmp_path: Path) -> dict:
    return tiny_config("probepo", store=str(tmp_path / "store")).model_dump(mode="json")


def _cli_check(
    recipe: Path, profile: str, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`probepo check RECIPE --profile P --executor slurm OPTIONS` in a fresh process."""
    command = [sys.executable, "-m", "probepo.cli", "check", str(recipe), "--profile", profile]
    return subprocess.run(
        [*command, "--executor", "slurm", *options],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )


SITE_PROBLEMS = [
    ("a missing partition", {"defaults": {"partition": "gpu-h200"}}, "partition 'gpu-h200' does not exist"),
    ("a missing account", {"defaults": {"account": "other-lab"}}, "account 'other-lab' is not one of yours"),
    ("a missing QOS", {"defaults": {"qos": "premium"}}, "QOS 'premium' does not exist (QOS: normal)"),
    (
        "a time limit over MaxTime",
        {"defaults": {"partition": "short", "time_min": 90}},
        "time_min = 90 is over partition short's MaxTime of 60 minutes",
    ),
    (
        "9 GPUs on an 8-GPU node",
        {"stages": {"optimize": {"gpus_per_node": 9}}},
        "9 GPUs per node asked, but partition low's nodes have at most 8",
    ),
    (
        "two nodes of a one-node partition",
        {"stages": {"optimize": {"nodes": 2, "tasks_per_node": 2}}},
        "nodes = 2, but partition low has 1 node(s) (probepo-node1)",
    ),
]


@pytest.mark.parametrize(("problem", "profile", "line"), SITE_PROBLEMS, ids=[c[0] for c in SITE_PROBLEMS])
def test_a_site_problem_is_one_line_naming_the_fix(slurm_cluster, tmp_path, problem, profile, line):
    where = "stages.optimize" if "stages" in profile else "defaults"
    found = check_launch(_recipe(tmp_path), "slurm", _profile(tmp_path, **profile)).findings
    assert len(found.failures) == 1, found.failures
    assert found.failures[0].startswith(line)
    assert "\n" not in found.failures[0]
    assert found.failures[0].endswith(f" the execution profile's {where}")


def test_a_two_node_trainer_in_the_partition_of_both_nodes_passes(slurm_cluster, tmp_path):
    if "wide" not in site.read_site().partitions:
        pytest.skip("the SLURM test cluster has one node: start it with PROBEPO_SLURM_NODES=2 (.ci/run does)")
    two = {"partition": "wide", "nodes": 2, "tasks_per_node": 2}
    profile = _profile(tmp_path, stages={"score": two, "optimize": two})
    found = check_launch(_recipe(tmp_path), "slurm", profile).findings
    assert found.failures == []
    assert (
        "slurm: stages.score, stages.optimize: partition wide (2 node(s), MaxTime unlimited, 8 GPUs a node),"
        in ("\n".join(found.passed))
    )
    assert any(line.endswith("60 min, 2 node(s) x 2 rank(s), 0 GPUs a node") for line in found.passed)


def test_a_job_folder_no_other_node_sees_is_refused(slurm_cluster, tmp_path, monkeypatch):
    """On this one-node cluster /tmp is every node's; with its node taken for another machine, it is not."""
    profile = _profile(tmp_path)
    assert check_launch(_recipe(tmp_path), "slurm", profile).findings.failures == []
    monkeypatch.setattr(site, "_is_this_host", lambda node: False)
    (failure,) = check_launch(_recipe(tmp_path), "slurm", profile).findings.failures
    assert failure.startswith(f"job_folder = {tmp_path / 'jobs'} is on this machine's own disk")
    assert "set the profile's job_folder to a shared file system" in failure


def test_a_site_without_the_user_signal_at_preemption_is_warned_about(slurm_cluster, tmp_path, monkeypatch):
    profile = _profile(tmp_path)
    found = check_launch(_recipe(tmp_path), "slurm", profile).findings
    assert found.warnings == []
    assert any(
        "preempt/partition_prio: partition low (GraceTime 60 s) send the job's USR2 at preemption" in line
        for line in found.passed
    )

    real = site.read_site()
    config = {**real.config, "SlurmctldParameters": "(null)"}
    monkeypatch.setattr(site, "read_site", lambda: dataclasses.replace(real, config=config))
    found = check_launch(_recipe(tmp_path), "slurm", profile).findings
    (warning,) = found.warnings
    assert warning.startswith(
        "preemption: preempt/partition_prio may preempt jobs of partition low (GraceTime 60 s)"
    )
    assert "ask the admins for SlurmctldParameters=preempt_send_user_signal" in warning
    assert found.failures == []


def test_the_testbed_and_the_tiny_qwen_recipes_pass(slurm_cluster, tmp_path, tiny_qwen: TinyQwen):
    profile = _profile(tmp_path, defaults={"partition": "low", "time_min": 30})
    testbed = check_launch(_recipe(tmp_path), "resident", profile).findings
    assert (testbed.failures, testbed.warnings) == ([], [])
    assert any(line.startswith("slurm: defaults: partition low") for line in testbed.passed)

    qwen = qwen_config(tiny_qwen.folder, store=str(tmp_path / "store")).model_dump(mode="json")
    gpus = _profile(
        tmp_path,
        defaults={"partition": "low"},
        stages={"optimize": {"gpus_per_node": 2, "tasks_per_node": 2, "gpu_memory_gb": 80}},
    )
    found = check_launch(qwen, "slurm", gpus).findings
    assert found.failures == []
    assert any(line.startswith("model: ") and "1 weight shard(s)" in line for line in found.passed)
    assert any(line.startswith("context: ") for line in found.passed)
    (spend,) = found.warnings
    # the trainer's memory in numbers, for the optimize job's 2 GPUs
    (memory,) = [line for line in found.passed if line.startswith("memory: ")]
    assert memory.startswith("memory: 0.01 B parameters train on 2 GPU(s) with the hf trainer")
    assert memory.endswith("leaving the 80.0 GB of each 80 GB GPU")
    small = _profile(
        tmp_path,
        defaults={"partition": "low"},
        stages={"optimize": {"gpus_per_node": 2, "tasks_per_node": 2, "gpu_memory_gb": 0.01}},
    )
    (too_big,) = check_launch(qwen, "slurm", small).findings.failures  # by the estimate: refused
    assert "MORE than the 0.0 GB of each 0.01 GB GPU; shard further (model.zero_stage: 3)" in too_big
    # a job per stage fetches the policy in each and commits it in full every update
    assert spend.startswith("spend: about ") and "the slurm executor moves" in spend
    assert spend.endswith(
        "`--executor resident` keeps the engines resident and checkpoints every checkpoint_every updates"
    )


def test_the_memory_line_gives_the_trainer_the_gpu_vllm_sleeps_through_under_the_resident_executor(
    slurm_cluster, tmp_path, tiny_qwen: TinyQwen
):
    """The resident job's ranks time-share each GPU between the trainer and a vLLM engine that sleeps while
    the trainer works: the trainer has the GPU less a margin; a job per stage gives the optimize job's GPUs to
    the trainer whole."""
    model = {"kind": "hf", "pretrained": str(tiny_qwen.folder), "generator": "vllm", "vllm_memory": 0.35}
    qwen = qwen_config(tiny_qwen.folder, model=model, store=str(tmp_path / "store")).model_dump(mode="json")
    gpus = {"gpus_per_node": 2, "tasks_per_node": 2, "gpu_memory_gb": 80}
    profile = _profile(tmp_path, defaults={"partition": "low"}, stages={"driver": gpus, "optimize": gpus})
    memory = {}
    for executor in ("resident", "slurm"):
        found = check_launch(qwen, executor, profile).findings
        (memory[executor],) = [line for line in found.passed if line.startswith("memory: ")]
    assert memory["resident"].endswith(
        "leaving the 74.0 GB of each 80 GB GPU while vLLM sleeps, less the 6 GB margin"
    )
    assert memory["slurm"].endswith("leaving the 80.0 GB of each 80 GB GPU")


def test_the_7b_recipe_per_stage_with_its_model_missing_names_both_problems(slurm_cluster, tmp_path):
    """Every problem at once: the executor that cannot hold checkpoint_every = 10 and the model's files."""
    fields = yaml.safe_load((ROOT / "configs" / "deepseekmath-7b-sft.yaml").read_text())
    fields["model"]["pretrained"] = str(tmp_path / "deepseek-math-7b")
    found = check_launch(fields, "slurm", _profile(tmp_path), store=str(tmp_path / "store")).findings
    assert f"model.pretrained = {tmp_path / 'deepseek-math-7b'}: no such folder" in found.failures
    (executor,) = [line for line in found.failures if line.startswith("executor slurm: ")]
    assert executor.startswith("executor slurm: checkpoint_every = 10 needs engines that stay resident")


def test_the_probe_job_reports_the_jobs_interpreter(slurm_cluster, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path)))
    done = _cli_check(recipe, _profile(tmp_path, defaults={"partition": "low"}), "--probe-job")
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if f"{sys.executable}; probepo " in line]
    assert line.startswith("ok   probe job ") and ", torch 2.13.0" in line
    assert "; 0 CUDA device(s) (CUDA_VISIBLE_DEVICES " in line  # fake gres; torch is the CPU build
    assert done.stdout.splitlines()[-1] == "ready: 0 failure(s), 0 warning(s)"


def test_check_exits_2_listing_every_failure(slurm_cluster, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    data = _recipe(tmp_path)
    data["algo"]["rescue_suffix"] = "\\boxed{"  # a cross-field rule: the testbed task cannot tokenize it
    recipe.write_text(yaml.safe_dump(data))
    profile = _profile(tmp_path, defaults={"partition": "short", "time_min": 90, "qos": "premium"})
    done = _cli_check(recipe, profile)
    assert done.returncode == 2
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(failures) == 3, done.stdout
    assert failures[0].startswith(f"FAIL {recipe}: algo.rescue_suffix = '\\\\boxed{{' cannot be tokenized")
    assert done.stdout.splitlines()[-1] == "refused: 3 failure(s), 0 warning(s)"


def test_a_python_prefix_missing_here_is_warned_about(slurm_cluster, tmp_path):
    profile = _profile(tmp_path, python="apptainer exec --nv /shared/probepo.sif python")
    found = check_launch(_recipe(tmp_path), "slurm", profile).findings
    (warning,) = found.warnings
    assert warning.startswith("profile python = 'apptainer exec --nv /shared/probepo.sif python': apptainer")
    assert found.failures == []
    found = check_launch(_recipe(tmp_path), "slurm", _profile(tmp_path, python=sys.executable)).findings
    assert f"python: jobs start `{sys.executable}`" in found.passed and found.warnings == []


def test_a_grace_longer_than_the_partitions_grace_time_is_refused(slurm_cluster, tmp_path):
    profile = _profile(tmp_path, defaults={"partition": "low", "signal_grace_s": 120})
    (failure,) = check_launch(_recipe(tmp_path), "slurm", profile).findings.failures
    assert failure.startswith(
        "defaults: signal_grace_s = 120 s is longer than partition low's GraceTime (60 s)"
    )


def _probe_check(
    tmp_path: Path, profile: str, store: str, env: dict[str, str], recipe_fields: dict | None = None
) -> subprocess.CompletedProcess:
    """`probepo check --probe-job` of the testbed recipe (or `recipe_fields`) on `store`, in an environment
    of `env` alone."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_fields or _recipe(tmp_path)))
    return _cli_check(recipe, profile, "--store", store, "--probe-job", env=env)


@pytest.mark.parametrize("endpoint", ["moto", "rgw"])
def test_the_probe_job_reaches_the_store_with_the_credentials_a_job_gets(
    slurm_cluster, tmp_path, endpoint, request
):
    """From inside the job: a write, a read back and a delete under the store's prefix with what the job
    receives. Keys in a credentials file named by the allow-listed AWS_SHARED_CREDENTIALS_FILE reach it;
    keys set only as variables are stripped from jobs, which the login node's check now sees first."""
    if endpoint == "moto":
        server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    else:
        server, bucket = request.getfixturevalue("rgw_server"), os.environ["PROBEPO_TEST_RGW_BUCKET"]
    keys = {name: server.env[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    credentials = tmp_path / "aws-credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {keys['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {keys['AWS_SECRET_ACCESS_KEY']}\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    aws = {**isolated_aws_env(server), "AWS_DEFAULT_REGION": "us-east-1"}
    profile = _profile(tmp_path, defaults={"partition": "low"})
    store = f"s3://{bucket}/check-{uuid.uuid4().hex[:8]}"

    through_a_file = {**base, **aws, "AWS_SHARED_CREDENTIALS_FILE": str(credentials)}
    for name in keys:
        through_a_file.pop(name)
    done = _probe_check(tmp_path, profile, store, through_a_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(
        line.startswith("ok   probe job ") and f"store: {store}: 0 run(s), writable" in line
        for line in done.stdout.splitlines()
    ), done.stdout

    as_variables = {**base, **aws}  # the keys in the environment, no credentials file
    done = _probe_check(tmp_path, profile, store, as_variables)
    assert done.returncode == 2, done.stdout + done.stderr
    assert any(line.startswith(f"ok   store: {store}") for line in done.stdout.splitlines())  # login node
    # the login node judges the store's credentials as a job gets them, and refuses before any job
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("FAIL ")]
    assert failure.startswith(f"FAIL store {store}: this process reaches S3 with AWS_ACCESS_KEY_ID")
    assert "AWS_SHARED_CREDENTIALS_FILE" in failure
    assert not any(
        line.startswith(("ok   probe job ", "FAIL probe job ")) for line in done.stdout.splitlines()
    )


def test_the_probe_job_refuses_a_tmpdir_smaller_than_an_updates_scratch(
    slurm_cluster, tmp_path, tiny_qwen: TinyQwen
):
    """The job's $TMPDIR, a 16 KB tmpfs here (bubblewrap), against the megabytes the tiny Qwen2's checkpoint
    update writes there (by the spend model)."""
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap is installed by infra/slurm/install.sh"
    small = f"{bwrap} --bind / / --dev /dev --proc /proc --size 16384 --tmpfs /scratch --die-with-parent"
    profile = _profile(
        tmp_path,
        python=f"{small} {sys.executable}",
        defaults={"partition": "low", "setup": ["export TMPDIR=/scratch"]},
    )
    qwen = qwen_config(tiny_qwen.folder, store=str(tmp_path / "store")).model_dump(mode="json")
    done = _probe_check(tmp_path, profile, str(tmp_path / "store"), dict(os.environ), qwen)
    assert done.returncode == 2, done.stdout + done.stderr
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("FAIL probe job ")]
    assert "$TMPDIR /scratch has 0.0 GB free, less than the" in failure and "export TMPDIR" in failure


def test_the_probe_job_refuses_more_memory_than_the_node_has(slurm_cluster, tmp_path):
    """The test cluster's nodes advertise 64 GB (RealMemory) whatever this machine has: a mem_gb between
    the two passes the login node's checks and is caught from inside the job."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    asked = int(physical) + 1
    assert asked <= 64, "the test needs a machine with less memory than the nodes advertise"
    profile = _profile(tmp_path, defaults={"partition": "low", "mem_gb": asked})
    done = _probe_check(tmp_path, profile, str(tmp_path / "store"), dict(os.environ))
    assert done.returncode == 2, done.stdout + done.stderr
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("FAIL probe job ")]
    assert f"less than the profile's mem_gb = {asked}: lower mem_gb" in failure
