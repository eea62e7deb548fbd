"""`probepo check` and the launch checks of the flows: a recipe, an execution profile, an executor and a
store checked together before anything is submitted. This module builds the launch (the recipe, the
profile, the executor and its backend answering) and runs probepo/checks/ over it — the recipe's rules,
the model's files, the data, the store, each job's ranks, GPUs and memory, the evaluation's shards, the
spend, the jobs' credentials and environment, and the site of the executor's backend (slurm/site.py) — and,
on request, a one-minute probe job that imports what the recipe needs in the job's own interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probepo.checks import launch as checks
from probepo.checks import recipe
from probepo.checks.findings import Findings
from probepo.checks.model import tied_parameters
from probepo.checks.spend import scratch_need
from probepo.checks.store import store_findings
from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.errors import ExecutionError
from probepo.presets import ConfigError, load_profile
from probepo.run.execution import StageRunner
from probepo.run.schedule import Stage
from slurm.backends import Backend
from slurm.executors import Executor, executor_for

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
    data = config.model_dump(mode="json") if isinstance(config, RunConfig) else dict(config)
    if store is not None:
        data["store"] = store
    parsed, found = recipe.parsed(data, source)
    checked = Checked(found, parsed)
    _execution_parts(checked, executor, profile, thorough)
    if not thorough:
        return checked
    launch = checks.Launch(data, parsed, checked.profile, executor, checked.executor, checked.backend)
    found.extend(checks.check_launch(launch))
    checked.scratch_bytes = _scratch_bytes(launch)
    backend = checked.backend
    if backend is None:
        if probe_job and checked.executor is not None and checked.executor.in_process:
            found.warnings.append(f"--probe-job: executor {executor} runs no jobs, so none was submitted")
        return checked
    if probe_job and not found.failures:
        found.extend(run_probe_job(checked, backend))
    return checked


def _scratch_bytes(launch: checks.Launch) -> int | None:
    """What the trainer's job writes to its node's scratch in one update, for the probe job's $TMPDIR."""
    config, profile, executor = launch.config, launch.profile, launch.executor
    model = launch.model[1]
    if config is None or profile is None or executor is None or model.parameters is None:
        return None
    return scratch_need(config, profile, executor, model.parameters, tied_parameters(model.folder))


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
