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

    resources = StageResources(sbatch_extra={"exclusive": True, "gpu-bind": "closest"})
    assert resources.sbatch_extra == {"exclusive": True, "gpu_bind": "closest"}
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
    resources = StageResources(srun_args=(image,), sbatch_extra={"exclusive": True})
    parameters = SlurmBackend(ExecutionProfile()).parameters("job", resources)
    assert parameters["srun_args"] == ["--export=ALL", "--kill-on-bad-exit=1", image]
    assert parameters["additional_parameters"]["exclusive"] is True


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
