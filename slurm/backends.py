"""Backends: how jobs are submitted and asked after, through submitit: SLURM (sbatch) here, or the local
executor (a subprocess per job, local_backend.py). A backend submits a stage's job or an array of small
ones, reports job states and exit codes, cancels, reads a job's stderr, and names the environment
variable in which a running job finds its own id. The executor registry (executors.py) pairs each
executor with its backend.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from probepo.checks.findings import Findings
from probepo.config import ExecutionProfile, StageResources
from probepo.errors import ExecutionError
from probepo.run.execution import StageRequest
from slurm import accounting
from slurm.accounting import JobCost, JobInfo

JobFunction = Callable[[StageRequest, str], str]
"""What a job runs, given the stage request and the name of the environment variable that holds the job's
id (the backend's `job_id_variable`): `run_stage_job` (one stage) or `run_driver_job` (the resident
executor's driver). Returns a JobOutcome."""

TRANSIENT_SBATCH = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Slurm temporarily unable",
    "Resource temporarily unavailable",
    "Zero Bytes were transmitted",
)
"""sbatch refusals that say nothing about the request: worth submitting again after a pause."""


class SubmitRefused(ExecutionError):
    """The scheduler refused the request itself (an impossible resource, an unknown partition): retrying
    cannot help. Names the stage, the resources asked for and the scheduler's reason."""

    user_error = True


class SubmitTransient(ExecutionError):
    """One submission failed for a reason of the infrastructure (the controller busy or unreachable): the
    job runner submits again after a pause."""


class SubmitFailed(ExecutionError):
    """Submitting kept failing for reasons of the infrastructure, try after try."""

    user_error = True


class Backend(Protocol):
    name: str
    job_id_variable: str
    """The environment variable in which a running job of this backend finds its own id."""

    def check(self, stages: Iterable[str] = ()) -> None:
        """Fail fast (SlurmUnavailable, naming what is missing and how to start it) if nothing can be
        submitted, or (ExecutionError) if the profile asks more nodes for one of `stages` than a job of
        this backend can span."""
        ...

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        """Submit `function(request, job_id_variable)` as one job; returns its id. Raises SubmitRefused
        when the request itself is refused, SubmitTransient when the infrastructure failed this time."""
        ...

    def submit_arrays(
        self,
        function: Callable[[Any], Any],
        items: Sequence[Any],
        resources: StageResources,
        folder: Path,
        parallelism: int | None = None,
    ) -> list[list[Any]]:
        """Submit `function(item)` for every item, as job arrays as large as the scheduler allows, at most
        `parallelism` tasks running at once over all of them (None: as many as the scheduler lets run);
        returns each array's submitit jobs (`job_id`, `wait()`, `result()`), in item order."""
        ...

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        """Each job's state, exit code and node (`submitted_at`: when each was submitted, epoch seconds,
        so a job not yet visible to the scheduler counts as pending)."""
        ...

    def cancel(self, job_ids: Iterable[str]) -> None: ...

    def costs(self, job_ids: Iterable[str]) -> dict[str, JobCost] | None:
        """What the jobs' allocations cost, from the scheduler's accounting (None: it keeps none)."""
        ...

    def stderr_tail(self, folder: Path, job_id: str, lines: int = 15) -> str:
        """The last lines of the job's stderr (task 0)."""
        ...

    def site_findings(self, stages: Iterable[str]) -> Findings:
        """What the site says of the profile's resources for `stages` and of its job folder (probepo
        check): one line for each problem, naming the stage and the fix."""
        ...


def submitit_stderr_tail(folder: Path, job_id: str, lines: int = 15) -> str:
    """The last lines of a submitit job's stderr (task 0), read with retries: on a shared file system the
    file may appear a moment after the job ends."""
    from submitit.core.utils import JobPaths

    path = JobPaths(folder, job_id=job_id, task_id=0).stderr
    for _ in range(5):
        if path.exists():
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        time.sleep(0.2)
    return f"(no stderr at {path})"


def _job_name(request: StageRequest) -> str:
    return f"probepo-{request.run_id}-{request.update}-{request.stage}"


class SlurmBackend:
    """sbatch through submitit's SlurmExecutor, one fresh executor per submission (so no resource of one
    stage leaks into the next), with only the profile's allowed variables exported to the job."""

    name = "slurm"
    job_id_variable = "SLURM_JOB_ID"

    def __init__(self, profile: ExecutionProfile, executor: str = "slurm") -> None:
        self.profile = profile
        self.executor = executor
        """The executor it submits for (slurm or resident), as its refusals name it."""

    def check(self, stages: Iterable[str] = ()) -> None:
        accounting.check_slurm(self.executor)
        wide = [(stage, r) for stage in stages if (r := self.profile.resources(stage)).nodes > 1]
        if wide:  # the site is read only where a stage spans several nodes
            from slurm import site

            known = site.read_site()
            refused = [line for s, r in wide if (line := site.too_many_nodes(known, f"stages.{s}", r))]
            if refused:
                raise SubmitRefused("; ".join(refused))

    def parameters(self, job_name: str, resources: StageResources) -> dict[str, object]:
        """submitit SlurmExecutor parameters for one submission (a stage's job, or an array)."""
        # sbatch --export filters what the job gets of this environment; the ranks' srun then passes on the
        # job's own environment whole, with what the setup lines exported (module load, conda activate).
        exported = sorted(self.profile.exported(dict(os.environ)))
        parameters: dict[str, object] = {
            "job_name": job_name,
            "nodes": resources.nodes,
            "ntasks_per_node": resources.tasks_per_node,
            "cpus_per_task": resources.cpus_per_task,
            "time": resources.time_min,
            "signal_delay_s": resources.signal_grace_s,
            # submitit's default would be --wckey=submitit, which a site that enforces wckeys refuses; None
            # leaves the line out (submitit drops None parameters), sbatch_extra's `wckey` sets one
            "wckey": None,
            "setup": list(resources.setup),
            # a rank that dies (SIGKILL, its node lost, an error) takes the job's other ranks with it at
            # once, instead of leaving them blocked in a collective until its timeout. --cpus-per-task
            # again for the ranks' step: srun of SLURM 22.05 to 23.02 does not take sbatch's (its NEWS:
            # "srun will no longer read in SLURM_CPUS_PER_TASK"; 23.11 reads it again), so each rank would
            # be bound to one CPU where the site binds tasks (task/affinity, task/cgroup)
            "srun_args": [
                "--export=ALL",
                "--kill-on-bad-exit=1",
                f"--cpus-per-task={resources.cpus_per_task}",
                *resources.srun_args,
            ],
            "additional_parameters": {
                **resources.sbatch_extra,
                "export": ",".join(exported) or "NONE",
                "requeue": True,
            },
        }
        optional = {
            "partition": resources.partition,
            "account": resources.account,
            "qos": resources.qos,
            "constraint": resources.constraint,
            "gpus_per_node": resources.gpus_per_node or None,
            "gpus_per_task": resources.gpus_per_task or None,
            "mem": f"{int(resources.mem_gb * 1024)}M" if resources.mem_gb else None,
        }
        parameters.update({key: value for key, value in optional.items() if value is not None})
        return parameters

    def _executor(self, folder: Path, job_name: str, resources: StageResources) -> Any:
        import submitit

        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0, python=self.profile.python)
        executor.update_parameters(**self.parameters(job_name, resources))
        return executor

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        from submitit.core.utils import FailedJobError

        executor = self._executor(folder, _job_name(request), resources)
        try:
            return str(executor.submit(function, request, self.job_id_variable).job_id)
        except FailedJobError as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no message"
            if any(marker in reason for marker in TRANSIENT_SBATCH):
                raise SubmitTransient(f"sbatch: {reason}") from None
            raise SubmitRefused(
                f"sbatch refused {request.describe()}: {reason} (asked for {_asked(resources)}); fix the"
                f" execution profile's `stages.{request.stage}` or `defaults`"
            ) from None

    def submit_arrays(
        self,
        function: Callable[[Any], Any],
        items: Sequence[Any],
        resources: StageResources,
        folder: Path,
        parallelism: int | None = None,
    ) -> list[list[Any]]:
        parts = chunks(len(items), accounting.max_array_size())
        arrays = []  # all submitted before any wait: the scheduler sees the whole night at once
        for index, part in enumerate(parts):
            executor = self._executor(folder, folder.name, resources)
            # sbatch --array=0-N%M throttles one array: the cap is shared out over the arrays of a night
            # (the first ones get the remainder, every array at least one task).
            share = (
                len(part)
                if parallelism is None
                else max(1, parallelism // len(parts) + (index < parallelism % len(parts)))
            )
            executor.update_parameters(array_parallelism=share)
            arrays.append(executor.map_array(function, [items[i] for i in part]))
        return arrays

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        return accounting.job_states(job_ids, submitted_at)

    def cancel(self, job_ids: Iterable[str]) -> None:
        accounting.cancel(job_ids)

    def costs(self, job_ids: Iterable[str]) -> dict[str, JobCost] | None:
        return accounting.job_costs(job_ids)

    def stderr_tail(self, folder: Path, job_id: str, lines: int = 15) -> str:
        return submitit_stderr_tail(folder, job_id, lines)

    def site_findings(self, stages: Iterable[str]) -> Findings:
        from slurm import site

        try:
            found = site.read_site()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            return Findings(failures=[f"slurm: could not read the site's settings: {exc}"])
        by_resources: dict[str, tuple[list[str], StageResources]] = {}
        for stage in stages:  # each set of resources once, named by where the profile sets it
            resources = self.profile.resources(stage)
            where = self.profile.entry(stage)
            named = by_resources.setdefault(resources.model_dump_json(), ([], resources))[0]
            named += [] if where in named else [where]
        findings = Findings()
        partitions = []
        for named, resources in by_resources.values():
            findings.extend(site.stage_findings(found, ", ".join(named), resources))
            findings.extend(site.grace_findings(found, ", ".join(named), resources))
            partitions.append(resources.partition or found.default_partition or "")
        findings.extend(site.preemption_findings(found, [r for _, r in by_resources.values()], self.profile))
        return findings.extend(site.job_folder_findings(found, self.profile, partitions))


def chunks(count: int, size: int) -> list[range]:
    """Item indices in runs of at most `size` (one job array each)."""
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _asked(resources: StageResources) -> str:
    given = resources.model_dump(exclude_defaults=True)
    return ", ".join(f"{key}={value}" for key, value in given.items()) or "the defaults"
