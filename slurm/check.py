"""`probepo check` and the launch checks of the flows: a recipe, an execution profile, an executor and a
store checked together before anything is submitted — the recipe's rules, the model's files, the data, the
store (probepo/preflight.py), each job's memory and the evaluation's shards (slurm/check_jobs.py) and the
site of the executor's backend (slurm/site.py) — and, on request, a one-minute probe job that imports what
the recipe needs in the job's own interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.errors import ExecutionError
from probepo.execution import StageRunner
from probepo.job_credentials import job_credential_findings
from probepo.preflight import (
    Findings,
    invalid_recipe_preflight,
    preflight,
    store_findings,
    tied_parameters,
)
from probepo.presets import ConfigError, load_profile, validate_run_config
from probepo.schedule import Stage, resident_refusal
from slurm.backends import Backend
from slurm.check_jobs import evaluation_shard_findings, gpu_findings, memory_findings
from slurm.check_spend import scratch_need, spend_findings
from slurm.executors import Executor, executor_for
from slurm.ranks import generation_rank_findings

PROBE_JOB_WAIT_S = 300.0
"""How long `--probe-job` waits for its job (pending included) before it cancels it and says so."""


@dataclass
class Checked:
    """The outcome of a check: its findings, and what parsed (None where it did not)."""

    findings: Findings
    config: RunConfig | None = None
    profile: ExecutionProfile | None = None
    executor: Executor | None = None
    backend: Backend | None = None
    """The executor's backend, checked (None: in process, or it did not answer)."""
    scratch_bytes: int | None = None
    """What the trainer's job writes to its node's scratch ($TMPDIR) at most in one update, by the spend
    model (None: the model's size is unknown)."""


def check_launch(
    config: RunConfig | dict[str, Any],
    executor: str,
    profile: str | os.PathLike[str] | None,
    *,
    store: str | None = None,
    probe_job: bool = False,
    source: str = "config",
    thorough: bool = True,
) -> Checked:
    """Every check of a launch of `config` (a recipe, or its fields, read from `source`) with `executor` and
    `profile` (a YAML path), the store being `store` if given, else the recipe's. Never raises for what it
    checks, and names every problem it finds, each on its own line: one problem hides no other (a recipe
    that fails validation still has its model, store and checkpoint_every checked; a bad profile, an
    unknown executor). `thorough` off: only what a run needs to start (the recipe, the profile, the
    executor and its backend answering)."""
    found = Findings()
    data = config.model_dump(mode="json") if isinstance(config, RunConfig) else dict(config)
    if store is not None:
        data["store"] = store
    checked = Checked(found)
    try:
        checked.config = validate_run_config(data, source)
        c = checked.config
        found.passed.append(
            f"recipe: {source}: {c.algo.algorithm} on {c.task.kind} with the {c.model.kind} model,"
            " every rule across fields holds"
        )
    except ConfigError as exc:
        found.failures += str(exc).splitlines()
    _execution_parts(checked, executor, profile, thorough)
    if not thorough:
        return checked
    found.extend(_recipe_findings(checked, data, executor))
    found.extend(_job_credential_findings(checked, data))  # said whether the backend answers or not
    backend = checked.backend
    if backend is None or checked.profile is None or checked.executor is None:
        if probe_job and checked.executor is not None and checked.executor.in_process:
            found.warnings.append(f"--probe-job: executor {executor} runs no jobs, so none was submitted")
        return checked
    found.extend(_python_findings(checked.profile))
    found.extend(site_way_findings(checked.profile, checked.executor.stages))
    found.extend(backend.site_findings(checked.executor.stages))
    if probe_job and not found.failures:
        found.extend(run_probe_job(checked, backend))
    return checked


def _execution_parts(
    checked: Checked, executor: str, profile: str | os.PathLike[str] | None, thorough: bool
) -> None:
    """The profile, the executor and its backend answering into `checked`, each problem a failure."""
    found = checked.findings
    try:
        checked.profile = load_profile(profile)
    except ConfigError as exc:
        found.failures += str(exc).splitlines()
    try:
        checked.executor = executor_for(executor)
    except ExecutionError as exc:
        found.failures += str(exc).splitlines()
    if checked.profile is None or checked.executor is None or checked.executor.backend is None:
        return
    try:
        backend = checked.executor.backend(checked.profile)
        # a thorough check names each stage's site problems in site_findings; a quick one refuses them here
        backend.check(() if thorough else checked.executor.stages)
        checked.backend = backend
    except ExecutionError as exc:
        found.failures += str(exc).splitlines()


def _recipe_findings(checked: Checked, data: dict[str, Any], executor: str) -> Findings:
    """What the recipe's jobs would meet: its model's files and memory, its data, its store, what an update
    spends under the executor, and whether the executor can run its checkpoint_every. Of a recipe that
    failed validation, what can be checked of it still (`invalid_recipe_preflight`, checkpoint_every)."""
    config = checked.config
    if config is None:
        found = invalid_recipe_preflight(data)
        checkpoint_every = data.get("checkpoint_every", 1)
    else:
        found, model = preflight(config)
        if checked.profile and checked.executor:
            found.extend(generation_rank_findings(config, checked.profile, checked.executor.stages))
            found.extend(gpu_findings(config, checked.profile, checked.executor))
        if model.parameters is not None and checked.profile and checked.executor:
            found.extend(memory_findings(config, checked.profile, checked.executor, model.parameters))
            found.extend(evaluation_shard_findings(config, checked.profile, checked.executor))
            tied = tied_parameters(model.folder)
            found.extend(spend_findings(config, checked.profile, executor, model.parameters, tied))
            checked.scratch_bytes = scratch_need(config, checked.profile, executor, model.parameters, tied)
        checkpoint_every = config.checkpoint_every
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool):
        return found  # not a number: its field's failure says so
    refusal = resident_refusal(checkpoint_every)
    if refusal and checked.executor is not None and not checked.executor.resident:
        found.failures.append(f"executor {executor}: {refusal}")
    return found


def _job_credential_findings(checked: Checked, data: dict[str, Any]) -> Findings:
    """An S3 store's credentials as the executor's jobs receive them (probepo/job_credentials.py): every
    backend's jobs get only the profile's allow-listed environment, the local executor's included; jobs
    that run in this process have this process's."""
    store = checked.config.store if checked.config is not None else data.get("store")
    profile, executor = checked.profile, checked.executor
    if profile is None or executor is None or executor.in_process:
        return Findings()
    if not isinstance(store, str) or not store.startswith("s3://"):
        return Findings()
    longest = max(profile.resources(stage).time_min for stage in executor.stages)
    return job_credential_findings(store, profile.exported(dict(os.environ)), longest)


def launchable(
    config: RunConfig | dict[str, Any],
    executor: str,
    profile: str | None,
    *,
    store: str | None = None,
    check: bool = True,
) -> tuple[RunConfig, ExecutionProfile, StageRunner, list[str]]:
    """What a launch checks before it submits anything (`probepo check`'s checks, bar the probe job: recipe,
    profile, executor and its site, model, data, store; with `check` off, only what the run needs to start)
    as the recipe, the profile, the stage runner and the warnings; raises Refused naming every problem
    found. The train flow, `probepo launch`, `train` and `resume` all run it."""
    checked = check_launch(config, executor, profile, store=store, thorough=check)
    checked.findings.refuse()
    assert checked.config is not None and checked.profile is not None and checked.executor is not None
    runner = checked.executor.runner(checked.backend, checked.profile)  # its backend checked already
    return checked.config, checked.profile, runner, checked.findings.warnings


def _python_findings(profile: ExecutionProfile) -> Findings:
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


def _trainer_stage(executor: Executor) -> Stage:
    return Stage.DRIVER if Stage.DRIVER in executor.stages else Stage.OPTIMIZE


def needed_modules(config: RunConfig | None) -> list[str]:
    """What a job of the recipe imports beyond the core: vLLM and DeepSpeed where the recipe uses them."""
    modules = ["probepo", "torch"]
    if config is not None and config.model.generator == "vllm":
        modules.append("vllm")
    if config is not None and config.model.trainer == "deepspeed":
        modules.append("deepspeed")
    return modules


def job_environment(modules: list[str], store_url: str) -> dict[str, Any]:
    """Run inside the probe job: the interpreter, each module's version (or its import error), the GPUs,
    CPUs and memory the job sees, its $TMPDIR's free space, and the store's check (a listing, a write, a
    read back and a delete under the store's prefix, and its conditional writes) with the credentials the
    job was given."""
    versions: dict[str, str] = {}
    for name in modules:
        try:
            versions[name] = str(getattr(importlib.import_module(name), "__version__", "?"))
        except Exception as exc:  # any import failure is the finding
            versions[name] = f"ERROR {type(exc).__name__}: {exc}"
    gpus, cuda_devices, cuda_build = "unknown", 0, None
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        cuda_devices, cuda_build = torch.cuda.device_count(), torch.version.cuda is not None
        gpus = f"{cuda_devices} CUDA device(s)"
        if torch.cuda.is_available():
            gpus += ": " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    scratch = tempfile.gettempdir()
    return {
        "host": socket.gethostname(),
        "python": sys.executable,
        "versions": versions,
        "gpus": gpus,
        "cuda_devices": cuda_devices,
        "cuda_build": cuda_build,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"),
        "cpus": len(os.sched_getaffinity(0)),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "tmpdir": scratch,
        "tmpdir_free": shutil.disk_usage(scratch).free,
        "store": dataclasses.asdict(store_findings(store_url)),
    }


def run_probe_job(checked: Checked, backend: Backend) -> Findings:
    """Submit `job_environment` as one short job with the trainer stage's resources and report it."""
    assert checked.profile is not None and checked.executor is not None
    stage = _trainer_stage(checked.executor)
    resources = checked.profile.resources(stage).model_copy(update={"time_min": 5})
    folder = Path(checked.profile.job_folder).resolve() / "check"
    modules = needed_modules(checked.config)
    store = checked.config.store if checked.config is not None else ""
    (job,) = backend.submit_arrays(
        functools.partial(job_environment, store_url=store), [modules], resources, folder
    )[0]
    deadline = time.monotonic() + PROBE_JOB_WAIT_S
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            return Findings(
                failures=[
                    f"probe job {job.job_id} ({stage}'s resources) did not run within {PROBE_JOB_WAIT_S:g} s"
                    " (the partition is busy, or the request cannot be met): cancelled; see `squeue`"
                ]
            )
        time.sleep(1.0)
    try:
        report = job.result()
    except Exception as exc:  # the job's own failure, with its stderr
        lines = str(exc).strip().splitlines()
        return Findings(failures=[f"probe job {job.job_id} failed: {lines[-1] if lines else exc}"])
    where = f"probe job {job.job_id} on {report['host']}"
    found = probe_report_findings(where, report, checked.scratch_bytes)
    return found.extend(node_findings(where, report, resources))


def node_findings(where: str, report: dict[str, Any], resources: StageResources) -> Findings:
    """What the probe job's node has against what the trainer stage's resources ask: its memory against
    `mem_gb` (a node may advertise more RealMemory than it has), the CPUs its task may use against
    `cpus_per_task`, and the CUDA devices it sees against the GPUs each task is given."""
    found = Findings()
    memory_gb = report["memory_bytes"] / 1e9
    if resources.mem_gb is not None and memory_gb < resources.mem_gb:
        found.failures.append(
            f"{where}: the node has {memory_gb:.1f} GB of memory, less than the profile's mem_gb ="
            f" {resources.mem_gb:g}: lower mem_gb, or ask the admins why the node advertises more"
        )
    if report["cpus"] < resources.cpus_per_task:
        found.failures.append(
            f"{where}: a rank may use {report['cpus']} CPU(s) (its affinity), fewer than the profile's"
            f" cpus_per_task = {resources.cpus_per_task}: grading workers, tokenisation and data loading"
            " would share them; the ranks' srun is given --cpus-per-task, so ask the admins whether the"
            " node has that many CPUs and how tasks are bound (TaskPlugin), or lower cpus_per_task"
        )
    wanted = resources.gpus_per_task or resources.gpus_per_node // resources.tasks_per_node
    if wanted and report["cuda_build"] is False:
        found.warnings.append(
            f"{where}: the job is given {wanted} GPU(s) a task but its torch is a CPU build: install the"
            " CUDA build in the job's Python"
        )
    elif wanted and report["cuda_build"] and report["cuda_devices"] < wanted:
        found.failures.append(
            f"{where}: the job sees {report['cuda_devices']} CUDA device(s), fewer than the {wanted} a task"
            " is given (gpus_per_node / tasks_per_node or gpus_per_task): check the site's gres and"
            " CUDA_VISIBLE_DEVICES"
        )
    return found


def probe_report_findings(where: str, report: dict[str, Any], scratch_bytes: int | None) -> Findings:
    """The probe job's report as findings: its interpreter and modules (vLLM at the version the engine is
    written against), its store check (a failure there is the job's credentials or network, which the
    login node's own check cannot see), and its $TMPDIR against what the trainer writes there."""
    from probepo.engines.vllm_engine import VLLM_VERSION

    found = Findings()
    versions = report["versions"]
    text = ", ".join(f"{name} {version}" for name, version in versions.items())
    line = (
        f"{where}: {report['python']}; {text}; {report['gpus']} (CUDA_VISIBLE_DEVICES"
        f" {report['CUDA_VISIBLE_DEVICES']}); {report['cpus']} CPU(s), {report['memory_bytes'] / 1e9:.1f} GB"
        " of memory on the node"
    )
    if any(version.startswith("ERROR") for version in versions.values()):
        found.failures.append(f"{line}: fix the profile's setup lines so the job's Python has them")
    elif "vllm" in versions and versions["vllm"] != VLLM_VERSION:
        found.failures.append(
            f"{line}: the vLLM engine is written and tested against vllm {VLLM_VERSION}: install the `gpu`"
            " extra (pip install -e '.[gpu]') in the job's Python"
        )
    else:
        found.passed.append(line)
    store = report["store"]
    found.passed += [f"{where}: {passed}" for passed in store["passed"]]
    found.failures += [
        f"{where}: {failure} — from inside the job, with its own environment: jobs get only the"
        " allow-listed variables (AWS_* settings, never keys or tokens), so give them a credentials file"
        " (AWS_SHARED_CREDENTIALS_FILE on a shared file system) or an instance role, and the endpoint and"
        " proxy settings (env_allow_extra)"
        for failure in store["failures"]
    ]
    free, folder = report["tmpdir_free"], report["tmpdir"]
    if scratch_bytes is None:
        found.passed.append(f"{where}: $TMPDIR {folder}, {free / 1e9:.1f} GB free")
    elif free < scratch_bytes:
        found.failures.append(
            f"{where}: $TMPDIR {folder} has {free / 1e9:.1f} GB free, less than the"
            f" {scratch_bytes / 1e9:.1f} GB an update writes there (a checkpoint's save, by the spend model):"
            " export TMPDIR to a larger local disk in the profile's setup lines"
        )
    else:
        found.passed.append(
            f"{where}: $TMPDIR {folder}, {free / 1e9:.1f} GB free for the {scratch_bytes / 1e9:.1f} GB an"
            " update writes there"
        )
    return found
