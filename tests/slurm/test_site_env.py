"""A site's environment on the real cluster: the drill recipe's stage jobs started in a container
(bubblewrap, through the profile's `python` prefix, with a hostname of its own) commit and end bitwise
equal to the inline run; a variable a `setup:` line exports reaches the job's ranks, and `module load`
once a stand-in Lmod init is sourced; `sbatch_extra` options reach the job's submission."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from probepo.checks.environment import site_way_findings
from probepo.config import ExecutionProfile, StageResources
from slurm.backends import SlurmBackend
from tests.slurm.conftest import drill_config
from tests.slurm.drill import Drill, slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CONTAINER_HOST = "probepo-container"


def _profile_file(tmp_path: Path, profile: ExecutionProfile) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json", exclude_defaults=True)))
    return path


def test_stage_jobs_in_a_container_commit_the_inline_runs_bits(
    slurm_cluster, warm_store, drill_baseline, tmp_path
):
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap is installed by infra/slurm/install.sh"
    container = f"{bwrap} --bind / / --dev /dev --proc /proc --unshare-uts --hostname {CONTAINER_HOST}"
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"),
        poll_s=0.3,
        poll_max_s=0.3,
        python=f"{container} --die-with-parent {sys.executable}",
        defaults=StageResources(partition="low", time_min=15, signal_grace_s=30),
    )
    drill = Drill(warm_store, "contained", tmp_path, _profile_file(tmp_path, profile), drill_config())
    drill.train()
    drill.finish()
    drill.check(drill_baseline)
    hosts = {attempt["host"] for attempt in warm_store.attempts("contained", 0, "optimize")}
    assert hosts == {CONTAINER_HOST}  # the stage ran inside the container


def test_setup_exports_and_sbatch_options_reach_the_job(slurm_cluster, tmp_path):
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"),
        defaults=StageResources(
            partition="low",
            time_min=5,
            setup=("export PROBEPO_TEST_MODULE=loaded-by-setup",),
            sbatch_extra={"comment": "probepo-site-test", "exclusive": True},
        ),
    )
    backend = SlurmBackend(profile)
    (job,) = backend.submit_arrays(os.getenv, ["PROBEPO_TEST_MODULE"], profile.resources("sample"), tmp_path)[
        0
    ]
    assert job.result() == "loaded-by-setup"  # what the setup line exported, seen by the rank
    script = Path(job.paths.submission_file).read_text()
    assert "#SBATCH --comment=probepo-site-test" in script and "#SBATCH --exclusive" in script
    assert "--export=ALL" in script


def test_module_load_in_setup_works_once_lmods_init_is_sourced(slurm_cluster, tmp_path):
    """The batch script is a non-login shell given only the allow-listed environment: Lmod's `module`
    function is not there. A stand-in init (defining `module` as Lmod's does) sourced by a setup line
    first makes `module load` work; without it the job fails, as `probepo check` warns."""
    init = tmp_path / "lmod" / "init" / "bash"
    init.parent.mkdir(parents=True)
    init.write_text('module() { if [ "$1" = load ]; then export PROBEPO_TEST_MODULE="loaded-$2"; fi; }\n')
    lines = (f"source {init}", "module load cuda/12.4")
    for setup, expected in ((lines, "loaded-cuda/12.4"), (lines[1:], None)):
        profile = ExecutionProfile(
            job_folder=str(tmp_path / "jobs"),
            defaults=StageResources(partition="low", time_min=5, setup=setup),
        )
        backend = SlurmBackend(profile)
        (job,) = backend.submit_arrays(
            os.getenv, ["PROBEPO_TEST_MODULE"], profile.resources("sample"), tmp_path
        )[0]
        assert (
            job.result() == expected
        )  # without the init, `module` is not found and the line exports nothing
        assert bool(site_way_findings(profile, ["sample"]).warnings) == (expected is None)


def test_each_rank_is_given_the_cpus_per_task_of_its_profile(slurm_cluster, tmp_path):
    """srun of SLURM 22.05-23.02 does not take --cpus-per-task from sbatch (22.05's RELEASE_NOTES: "srun will
    no longer read in SLURM_CPUS_PER_TASK"): the ranks' srun line carries it. Under this cluster's
    task/none nothing binds, so the allocation is what shows it: the ranks' step (JOB.0) holds
    tasks x cpus_per_task CPUs and, with no mem_gb, the job's memory (DefMemPerCPU x its CPUs)."""
    resources = StageResources(time_min=5, tasks_per_node=2, cpus_per_task=3)
    profile = ExecutionProfile(job_folder=str(tmp_path / "jobs"), defaults=resources)
    (job,) = SlurmBackend(profile).submit_arrays(os.getenv, ["SLURM_CPUS_PER_TASK"], resources, tmp_path)[0]
    assert job.results() == ["3", "3"]  # what srun gave each rank
    script = Path(job.paths.submission_file).read_text()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--cpus-per-task=3" in srun.split()
    step = accounted_step(f"{job.job_id}.0")
    assert step["AllocCPUS"] == "6" and "mem=1.50G" in step["AllocTRES"]  # 6 CPUs x DefMemPerCPU 256 MB


def accounted_step(step_id: str, timeout_s: float = 30.0) -> dict[str, str]:
    """A job step's allocation as accounting records it (it may lag the job's end by a moment)."""
    fields = ("AllocCPUS", "AllocTRES")
    deadline = time.monotonic() + timeout_s
    while not (row := slurm("sacct", "-n", "-P", "-j", step_id, "-o", ",".join(fields)).strip()):
        assert time.monotonic() < deadline, f"sacct has no record of step {step_id}"
        time.sleep(0.5)
    return dict(zip(fields, row.splitlines()[0].split("|"), strict=True))
