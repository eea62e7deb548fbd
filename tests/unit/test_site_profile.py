"""How slurm/site.py reads SLURM's answers (time limits, GPUs from gres), and the site fields of a profile."""

from __future__ import annotations

import pytest

from probepo.config import ExecutionProfile
from slurm.site import gpus_in_gres, minutes


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("60", 60),
        ("30:00", 30),
        ("04:00:00", 240),
        ("1-00:00:00", 1440),
        ("2-12:30:30", 2 * 1440 + 12 * 60 + 30.5),
    ],
)
def test_slurm_time_limits_in_minutes(limit, expected):
    assert minutes(limit) == expected


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:8", 8),
        ("gpu:h200:8(S:0-1)", 8),
        ("gpu:a100:4,gpu:v100:2", 6),
        ("shard:8,gpu:h200:8", 8),
        ("(null)", 0),
    ],
)
def test_gpus_from_a_nodes_gres(gres, gpus):
    assert gpus_in_gres(gres) == gpus


def test_sbatch_extra_takes_the_listed_options_and_refuses_others():
    from probepo.config import StageResources

    resources = StageResources(sbatch_extra={"exclusive": True, "gpu-bind": "none"})
    assert resources.sbatch_extra == {"exclusive": True, "gpu_bind": "none"}
    with pytest.raises(ValueError, match=r"sbatch_extra names signal, time, which it may not set"):
        StageResources(sbatch_extra={"time": 10, "signal": "USR1@5"})


def test_env_allow_extra_adds_to_the_default_list_and_refuses_credentials():

    profile = ExecutionProfile(env_allow_extra=("NCCL_*",))
    environ = {"NCCL_IB_HCA": "mlx5", "HF_HUB_CACHE": "/shared/hf", "PATH": "/bin", "OTHER": "x"}
    assert profile.exported(environ) == {"NCCL_IB_HCA": "mlx5", "HF_HUB_CACHE": "/shared/hf", "PATH": "/bin"}
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY would hand credentials to every job"):
        ExecutionProfile(env_allow_extra=("AWS_SECRET_ACCESS_KEY",))


def test_the_slurm_submission_carries_the_sites_options():
    from probepo.config import ExecutionProfile, StageResources
    from slurm.backends import SlurmBackend

    image = "--container-image=/shared/p.sqsh"
    resources = StageResources(srun_args=(image,), sbatch_extra={"exclusive": True}, cpus_per_task=8)
    parameters = SlurmBackend(ExecutionProfile()).parameters("job", resources)
    # the ranks' srun gets the CPUs again: srun of SLURM 22.05-23.02 does not take them from sbatch
    assert parameters["srun_args"] == ["--export=ALL", "--kill-on-bad-exit=1", "--cpus-per-task=8", image]
    assert parameters["cpus_per_task"] == 8
    assert parameters["additional_parameters"]["exclusive"] is True


def _sbatch_lines(tmp_path, resources) -> list[str]:
    """The `#SBATCH` lines of the batch script submitit writes for `resources`."""
    from probepo.config import ExecutionProfile
    from slurm.backends import SlurmBackend

    executor = SlurmBackend(ExecutionProfile())._executor(tmp_path, "job", resources)
    script = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_a_job_carries_no_wckey_unless_the_profile_gives_one(tmp_path):
    """submitit would send --wckey=submitit, which a site enforcing wckeys refuses."""
    from probepo.config import StageResources

    plain = _sbatch_lines(tmp_path, StageResources(partition="h200"))
    assert "#SBATCH --partition=h200" in plain and not [line for line in plain if "--wckey" in line]
    given = _sbatch_lines(tmp_path, StageResources(sbatch_extra={"wckey": "lab-7"}))
    assert [line for line in given if "--wckey" in line] == ["#SBATCH --wckey=lab-7"]


@pytest.mark.parametrize("bind", ["closest", "map_gpu:0,1", "single:1", "per_task:1", "verbose,closest"])
def test_a_gpu_binding_that_hides_gpus_from_a_rank_is_refused(bind):
    """Every rank sees its node's GPUs and takes GPU LOCAL_RANK (probepo/run/devices.py); a binding shows it
    only
    some, where index LOCAL_RANK is past them or another rank's."""
    from probepo.config import StageResources

    with pytest.raises(ValueError, match=rf"sbatch_extra gpu_bind = {bind} would show each rank only the"):
        StageResources(sbatch_extra={"gpu_bind": bind})
    with pytest.raises(ValueError, match=r"srun_args --gpu-bind = closest.*ask\s+gpus_per_task: 1 instead"):
        StageResources(srun_args=("--gpu-bind", "closest"))
    with pytest.raises(ValueError, match=rf"srun_args --gpu-bind = {bind} .*leave gpu_bind out"):
        StageResources(srun_args=(f"--gpu-bind={bind}",))
    kept = StageResources(sbatch_extra={"gpu-bind": "verbose,none"}, srun_args=("--gpu-bind=none",))
    assert kept.sbatch_extra == {"gpu_bind": "verbose,none"}


def test_a_stages_setup_runs_after_the_defaults_and_other_fields_still_override():
    profile = ExecutionProfile.model_validate(
        {
            "defaults": {"partition": "cpu", "setup": ["module load cuda/12.4"], "srun_args": ["--mpi=none"]},
            "stages": {
                "optimize": {"partition": "h200", "setup": ["export NCCL_IB_HCA=mlx5"], "srun_args": []}
            },
        }
    )
    optimize, sample = profile.resources("optimize"), profile.resources("sample")
    assert optimize.setup == ("module load cuda/12.4", "export NCCL_IB_HCA=mlx5")
    assert (optimize.partition, optimize.srun_args) == ("h200", ())  # replaced, as every other field
    assert (sample.setup, sample.partition, sample.srun_args) == (
        ("module load cuda/12.4",),
        "cpu",
        ("--mpi=none",),
    )
    assert profile.resources("eval_task").setup == ("module load cuda/12.4",)


def test_an_evaluation_array_task_gets_one_gpu_and_one_rank_unless_its_profile_entry_says():
    profile = ExecutionProfile.model_validate(
        {
            "stages": {
                "evaluate": {"partition": "h200", "gpus_per_node": 8, "tasks_per_node": 8, "mem_gb": 512}
            }
        }
    )
    task = profile.resources("eval_task")
    assert (task.partition, task.nodes, task.tasks_per_node, task.gpus_per_node, task.gpus_per_task) == (
        "h200", 1, 1, 0, 1
    )  # fmt: skip
    assert ExecutionProfile().resources("eval_task").gpus_per_task == 0  # a CPU profile stays on CPUs
    listed = ExecutionProfile.model_validate({"stages": {"eval_task": {"gpus_per_task": 2, "mem_gb": 64}}})
    assert (listed.resources("eval_task").gpus_per_task, listed.resources("eval_task").mem_gb) == (2, 64)
