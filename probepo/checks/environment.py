"""The environment a run's processes meet: what a Prefect worker's environment must set for the flows
(`missing_environment`), and of a launch whose jobs go to a backend, the interpreter its jobs start and the
site's ways its batch script does not provide by itself (pyxis images, Lmod's `module`)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.config import ExecutionProfile, RunConfig

if TYPE_CHECKING:
    from probepo.checks.launch import Launch

WORKER_ENV_EXAMPLE = "infra/prefect/worker.env.example"
"""The documented environment file of a Prefect worker (what the flows need, each line explained)."""


def check(launch: Launch) -> Findings:
    """The jobs' interpreter and setup lines, where the executor's backend answered."""
    if launch.site is None or launch.profile is None or launch.executor is None:
        return Findings()
    found = python_findings(launch.profile)
    return found.extend(site_way_findings(launch.profile, launch.executor.stages))


def missing_environment(config: RunConfig) -> list[str]:
    """What this process's environment lacks that a run of `config` reads from it, each with what for: a
    Prefect worker (started by cron or systemd, with an empty environment) has only what its env file sets.
    An S3 store wants credentials (a credentials file, a profile or keys; an instance role cannot be seen
    from here) and a region; a model named by hub id, HF_HUB_OFFLINE and a cache (nodes have no internet);
    the maths benchmarks without `task.benchmarks_root`, PROBEPO_BENCHMARKS."""
    env = os.environ
    missing = []
    if config.store.startswith("s3://"):
        sources = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_ACCESS_KEY_ID")
        if (
            not any(env.get(name) for name in sources)
            and not (Path.home() / ".aws" / "credentials").is_file()
        ):
            missing.append(f"{' or '.join(sources)} (the S3 store's credentials)")
        if not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
            missing.append("AWS_REGION (the S3 store's region)")
    if config.model.kind == "hf" and not Path(config.model.pretrained).exists():
        if not env.get("HF_HUB_OFFLINE"):
            missing.append(
                f"HF_HUB_OFFLINE=1 (model.pretrained = {config.model.pretrained} from the local cache)"
            )
        if not (env.get("HF_HUB_CACHE") or env.get("HF_HOME")):
            missing.append("HF_HUB_CACHE (the Hugging Face cache the nodes share)")
    benchmarks = config.task.kind == "math" and config.task.source == "benchmarks"
    if benchmarks and config.task.benchmarks_root is None and not env.get("PROBEPO_BENCHMARKS"):
        missing.append("PROBEPO_BENCHMARKS (the benchmark files' folder)")
    return missing


def python_findings(profile: ExecutionProfile) -> Findings:
    """The profile's `python` prefix names a program this node has (the compute nodes must have it too:
    `--probe-job` runs it there)."""
    if profile.python is None:
        return Findings()
    try:
        program = shlex.split(profile.python)[0]
    except (ValueError, IndexError):
        problem = f"profile python = {profile.python!r}: not a command line: fix the profile"
        return Findings(failures=[problem])
    if shutil.which(program) is None:
        return Findings(
            warnings=[
                f"profile python = {profile.python!r}: {program} is not on this node's PATH; the compute"
                " nodes must have it (`probepo check --probe-job` runs it there)"
            ]
        )
    return Findings(passed=[f"python: jobs start `{profile.python}`"])


def site_way_findings(profile: ExecutionProfile, stages: Iterable[str]) -> Findings:
    """Two ways of a site that a job's batch script does not provide by itself. pyxis starts the ranks in
    the image (`--container-image` among srun_args), where `python:` should name the image's interpreter
    (`python3`): unset, the job starts this machine's interpreter path inside the image. Lmod's `module`
    is a shell function the batch script (a non-login shell, the environment cut to the allow-list) does
    not have: a `module` setup line needs the site's Lmod init sourced before it."""
    found = Findings()
    for where, resources in {profile.entry(stage): profile.resources(stage) for stage in stages}.items():
        if profile.python is None and any(arg.startswith("--container-image") for arg in resources.srun_args):
            found.warnings.append(
                f"{where}: srun_args start the ranks in a container image, and the profile's python is"
                f" unset, so they run {sys.executable} inside it: set `python: python3` (the image's"
                " interpreter, with probepo installed in the image)"
            )
        commands = [line.split()[:1] for line in resources.setup]
        before = commands[: commands.index(["module"])] if ["module"] in commands else None
        if before is not None and ["source"] not in before and ["."] not in before:
            found.warnings.append(
                f"{where}: a setup line runs `module`, which the job's batch script lacks (a non-login shell"
                " given only the allow-listed environment): source the site's Lmod init before it, e.g."
                " `source /etc/profile.d/lmod.sh` (or `source $LMOD_PKG/init/bash`)"
            )
    return found
