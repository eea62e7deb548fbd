"""The local backend: submitit's LocalExecutor, a subprocess per job on this machine, for a workstation or
a node of one's own (`executor: local`); the same job functions and stage requests as SLURM's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from probepo.checks.findings import Findings
from probepo.config import ExecutionProfile, StageResources
from probepo.run.execution import StageRequest
from slurm.accounting import JobCost, JobInfo
from slurm.backends import JobFunction, SubmitRefused, submitit_stderr_tail


@contextlib.contextmanager
def exported_environment(allowed: dict[str, str]) -> Iterator[None]:
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


def _local_executor_class() -> type:
    """submitit's LocalExecutor, keeping each job's controller process: its exit code is the job's.

    submitit's public `LocalJob.state` says FINISHED whatever the exit code, and the process it polls is a
    private attribute; so jobs are started here through submitit's `_submit_command`, the hook its executor
    plugins implement, with its public `start_controller`, and the process is kept by the backend."""
    import submitit
    from submitit.local.local import LocalJob, start_controller

    class ControllerKeepingExecutor(submitit.LocalExecutor):
        processes: dict[str, subprocess.Popen[bytes]]

        def _submit_command(self, command: str) -> LocalJob[Any]:
            tasks = self.parameters.get("tasks_per_node", 1)
            process = start_controller(
                folder=self.folder,
                command=command,
                tasks_per_node=tasks,
                timeout_min=self.parameters.get("timeout_min", 2.0),
                signal_delay_s=self.parameters.get("signal_delay_s", 30),
            )
            self.processes[str(process.pid)] = process
            job_id = str(process.pid)
            return LocalJob(folder=self.folder, job_id=job_id, process=process, tasks=list(range(tasks)))

    return ControllerKeepingExecutor


class LocalBackend:
    """submitit's LocalExecutor: a subprocess per job on this machine (job id = its controller's pid). A
    job started by a driver that died is still watched, through /proc (its exit code is then unknown)."""

    name = "local"
    job_id_variable = "SUBMITIT_LOCAL_JOB_ID"

    def __init__(self, profile: ExecutionProfile) -> None:
        self.profile = profile
        self._processes: dict[str, subprocess.Popen[bytes]] = {}  # this process's jobs: polling reaps them

    def check(self, stages: Iterable[str] = ()) -> None:
        """The local executor needs no service; its jobs run on this one machine."""
        if refused := self._too_many_nodes(stages):
            raise SubmitRefused(refused)

    def _too_many_nodes(self, stages: Iterable[str]) -> str | None:
        wide = [f"stages.{s}" for s in stages if self.profile.resources(s).nodes > 1]
        if not wide:
            return None
        return (
            f"nodes > 1 in the execution profile's {', '.join(wide)}: the local executor runs every job on"
            " this machine, one node; give nodes: 1 (the ranks in tasks_per_node), or use a SLURM executor"
        )

    def _executor(self, folder: Path, **parameters: object) -> Any:
        executor = _local_executor_class()(folder=folder, python=self.profile.python)
        executor.processes = self._processes
        executor.update_parameters(**parameters)
        return executor

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        executor = self._executor(
            folder,
            timeout_min=resources.time_min,
            signal_delay_s=resources.signal_grace_s,
            tasks_per_node=resources.tasks_per_node,
        )
        with exported_environment(self.profile.exported(dict(os.environ))):
            return str(executor.submit(function, request, self.job_id_variable).job_id)

    def submit_arrays(
        self,
        function: Callable[[Any], Any],
        items: Sequence[Any],
        resources: StageResources,
        folder: Path,
        parallelism: int | None = None,
    ) -> list[list[Any]]:
        # One process per item, all at once: submitit's local executor has no throttle (a cap is SLURM's).
        executor = self._executor(folder, timeout_min=resources.time_min)
        return [executor.map_array(function, list(items))]

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        states = {}
        for job_id in job_ids:
            process = self._processes.get(job_id)
            if process is not None:
                code = process.poll()
                alive = code is None
            else:
                code, alive = None, _process_alive(int(job_id))
            state = "RUNNING" if alive else ("COMPLETED" if code == 0 else "FAILED")
            states[job_id] = JobInfo(job_id, state, "" if code is None else str(code), os.uname().nodename)
        return states

    def cancel(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(job_id), signal.SIGTERM)

    def costs(self, job_ids: Iterable[str]) -> dict[str, JobCost] | None:
        return None  # subprocesses: no accounting, their wall time only

    def stderr_tail(self, folder: Path, job_id: str, lines: int = 15) -> str:
        return submitit_stderr_tail(folder, job_id, lines)

    def site_findings(self, stages: Iterable[str]) -> Findings:
        from slurm.site import job_folder_findings

        found = job_folder_findings(None, self.profile, [])
        if refused := self._too_many_nodes(stages):
            found.failures.append(refused)
        return found


def _process_alive(pid: int) -> bool:
    """A live (not zombie) process of this host."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
