"""Submitting a stage as a job through submitit, and asking after it: SLURM (sbatch) or the local
executor (a subprocess per stage). A backend submits, reports states, cancels, and reads a job's stderr."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from probepo.config import ExecutionProfile, StageResources
from probepo.execution import StageRequest
from slurm import accounting
from slurm.accounting import JobInfo

JobFunction = Callable[[StageRequest], str]
"""What a job runs: `run_stage_job` (one stage) or `run_driver_job` (the resident executor's driver)."""

TRANSIENT_SBATCH = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Slurm temporarily unable",
    "Resource temporarily unavailable",
    "Zero Bytes were transmitted",
)
"""sbatch refusals that say nothing about the request: worth submitting again after a pause."""
SUBMIT_TRIES = 4


class SubmitRefused(RuntimeError):
    """The scheduler refused the request itself (an impossible resource, an unknown partition): retrying
    cannot help. Names the stage, the resources asked for and the scheduler's reason."""


class SubmitFailed(RuntimeError):
    """Submitting kept failing for reasons of the infrastructure (the controller busy or unreachable)."""


class Backend(Protocol):
    name: str

    def check(self) -> None:
        """Fail fast (naming what is missing and how to start it) if nothing can be submitted."""
        ...

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        """Submit `function(request)` as a job; returns its id."""
        ...

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]: ...

    def cancel(self, job_ids: Iterable[str]) -> None: ...


def stderr_tail(folder: Path, job_id: str, lines: int = 15) -> str:
    """The last lines of a job's stderr (task 0), read with retries: on a shared file system the file may
    appear a moment after the job ends."""
    from submitit.core.utils import JobPaths

    path = JobPaths(folder, job_id=job_id, task_id=0).stderr
    for _ in range(5):
        if path.exists():
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        time.sleep(0.2)
    return f"(no stderr at {path})"


@contextlib.contextmanager
def _environment(allowed: dict[str, str]) -> Iterator[None]:
    """This process's environment reduced to `allowed` while a local job is started (submitit's local
    executor hands the child a copy of os.environ)."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(allowed)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _job_name(request: StageRequest) -> str:
    return f"probepo-{request.run_id}-{request.update}-{request.stage}"


class SlurmBackend:
    """sbatch through submitit's SlurmExecutor, one fresh executor per submission (so no resource of one
    stage leaks into the next), with only the profile's allowed variables exported to the job."""

    name = "slurm"

    def __init__(self, profile: ExecutionProfile) -> None:
        self.profile = profile

    def check(self) -> None:
        accounting.check_slurm()

    def parameters(self, job_name: str, resources: StageResources) -> dict[str, object]:
        """submitit SlurmExecutor parameters for one submission (a stage's job, or an array)."""
        # The batch script sets SUBMITIT_EXECUTOR for the step it starts: srun passes only listed names.
        exported = sorted({*self.profile.exported(dict(os.environ)), "SUBMITIT_EXECUTOR"})
        parameters: dict[str, object] = {
            "job_name": job_name,
            "nodes": resources.nodes,
            "ntasks_per_node": resources.tasks_per_node,
            "cpus_per_task": resources.cpus_per_task,
            "time": resources.time_min,
            "signal_delay_s": resources.signal_grace_s,
            "setup": list(resources.setup),
            "additional_parameters": {"export": ",".join(exported), "requeue": True},
        }
        optional = {
            "partition": resources.partition,
            "account": resources.account,
            "qos": resources.qos,
            "constraint": resources.constraint,
            "gpus_per_node": resources.gpus_per_node or None,
            "mem": f"{int(resources.mem_gb * 1024)}M" if resources.mem_gb else None,
        }
        parameters.update({key: value for key, value in optional.items() if value is not None})
        return parameters

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        import submitit
        from submitit.core.utils import FailedJobError

        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        executor.update_parameters(**self.parameters(_job_name(request), resources))
        for attempt in range(SUBMIT_TRIES):
            try:
                return str(executor.submit(function, request).job_id)
            except FailedJobError as exc:
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no message"
                if not any(marker in reason for marker in TRANSIENT_SBATCH):
                    raise SubmitRefused(
                        f"sbatch refused {request.describe()}: {reason} (asked for {_asked(resources)}); fix"
                        f" the execution profile's `stages.{request.stage}` or `defaults`"
                    ) from None
                if attempt == SUBMIT_TRIES - 1:
                    raise SubmitFailed(f"sbatch kept failing for {request.describe()}: {reason}") from None
                time.sleep(2.0 * (attempt + 1))
        raise AssertionError("unreachable")

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        return accounting.job_states(job_ids, submitted_at)

    def cancel(self, job_ids: Iterable[str]) -> None:
        accounting.cancel(job_ids)


def _asked(resources: StageResources) -> str:
    given = resources.model_dump(exclude_defaults=True)
    return ", ".join(f"{key}={value}" for key, value in given.items()) or "the defaults"


class LocalBackend:
    """submitit's LocalExecutor: a subprocess per stage on this machine (job id = its controller's pid).
    A job started by a driver that died is still watched, through /proc."""

    name = "local"

    def __init__(self, profile: ExecutionProfile) -> None:
        self.profile = profile
        self._jobs: dict[str, object] = {}  # submitit LocalJobs of this process: polling them reaps them

    def check(self) -> None:
        """Nothing to check: the local executor needs no service."""

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        import submitit

        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(
            timeout_min=resources.time_min,
            signal_delay_s=resources.signal_grace_s,
            tasks_per_node=resources.tasks_per_node,
        )
        with _environment(self.profile.exported(dict(os.environ))):
            job = executor.submit(function, request)
        self._jobs[str(job.job_id)] = job
        return str(job.job_id)

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        states = {}
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None:
                code = job._process.poll()  # type: ignore[attr-defined]
                alive = code is None
            else:
                code, alive = None, _process_alive(int(job_id))
            state = "RUNNING" if alive else ("COMPLETED" if code == 0 else "FAILED")
            states[job_id] = JobInfo(job_id, state, "" if code is None else str(code), os.uname().nodename)
        return states

    def cancel(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(job_id), 15)


def _process_alive(pid: int) -> bool:
    """A live (not zombie) process of this host."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def backend_for(executor: str, profile: ExecutionProfile) -> Backend:
    if executor == "slurm":
        return SlurmBackend(profile)
    if executor == "local":
        return LocalBackend(profile)
    raise ValueError(f"executor {executor!r}: choose inline, local or slurm")
