"""What SLURM says of jobs: one batched `sacct` call per poll for every live job, `squeue` for what
accounting has not caught up with, and the checks that SLURM is there at all before anything is submitted.

States are read explicitly. A job is *alive* while SLURM may still run it (pending, running, completing,
requeued, or preempted and put back in the queue); an *ended* job is COMPLETED, FAILED, CANCELLED,
TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, BOOT_FAIL or DEADLINE with nothing of it left in the queue. Whether it
committed is the store's to say, never the scheduler's.

States come from plain `sacct -j`, which reports the most recent record of each job id: what a poll wants
(a requeued job keeps its id, and its older records say REQUEUED, NODE_FAIL or PREEMPTED). Costs come from
`sacct -D` (`job_costs`), which reports every record, so a job run twice is paid for twice.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from probepo.errors import ExecutionError

ALIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "SUSPENDED",
    }
)
DEFAULT_MAX_ARRAY_SIZE = 1001
"""SLURM's default MaxArraySize (indices 0..1000)."""
START_GRACE_S = 120.0
"""A job submitted this recently and not yet in accounting or the queue counts as pending."""
ID_REUSE_SLACK_S = 3600.0
"""A record submitted this long before the store's submission of the job is another job that had the same
id (ids restart when a cluster's state is reset; `sacct -D` shows both)."""
START_HINT = 'start the test cluster with `eval "$(bash infra/slurm/start.sh)"` (infra/slurm/README.md)'


class SlurmUnavailable(ExecutionError):
    """No SLURM here, or its controller does not answer: nothing can be submitted."""

    user_error = True


@dataclass(frozen=True)
class JobInfo:
    """One job as SLURM reports it."""

    job_id: str
    state: str
    exit_code: str = ""
    node: str = ""
    elapsed: str = ""

    @property
    def alive(self) -> bool:
        return self.state in ALIVE


@dataclass(frozen=True)
class JobCost:
    """What one job's allocations cost, summed over every accounting record of the job (`sacct -D`): a job
    requeued (preempted, its node failed, `scontrol requeue`) has one record per run, each allocated and
    timed on its own. A running job's record counts its time so far."""

    job_id: str
    """As sacct prints it: `123`, or `123_4` for task 4 of array 123."""
    gpus: int
    """GPUs of its last allocation (AllocTRES `gres/gpu`; 0 where the site's AccountingStorageTRES does not
    track gres/gpu)."""
    cpus: int
    """CPUs of its last allocation (AllocTRES `cpu`)."""
    elapsed_s: int
    """Seconds its allocations held their resources, over every record (ElapsedRaw)."""
    gpu_seconds: int
    """Sum over its records of GPUs × ElapsedRaw."""
    cpu_seconds: int
    """Sum over its records of CPUs × ElapsedRaw."""
    records: int
    """How many times it was allocated, or queued again (1 unless requeued)."""
    state: str
    """Its last record's state."""

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def cpu_hours(self) -> float:
        return self.cpu_seconds / 3600.0


def _run(
    command: list[str], timeout_s: float = 30.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)


def check_slurm(executor: str) -> None:
    """Fail fast, naming the executor asked for (slurm or resident), what is missing and how to get it:
    sbatch on PATH, and slurmctld answering."""
    missing = [tool for tool in ("sbatch", "sacct", "squeue", "scontrol") if shutil.which(tool) is None]
    if missing:
        raise SlurmUnavailable(
            f"--executor {executor} needs SLURM's commands, and {', '.join(missing)} is not on PATH: run on"
            f" a cluster's login node, or {START_HINT}"
        )
    try:
        ping = _run(["scontrol", "ping"], timeout_s=20.0)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(
            f"--executor {executor}: slurmctld did not answer `scontrol ping` within 20 s: {START_HINT}"
        ) from None
    if ping.returncode != 0 or "UP" not in ping.stdout:
        said = (ping.stdout + ping.stderr).strip().splitlines()
        raise SlurmUnavailable(
            f"--executor {executor}: slurmctld is not answering (`scontrol ping`:"
            f" {said[-1] if said else 'no output'}): {START_HINT}"
        )


def max_array_size() -> int:
    """The cluster's MaxArraySize (`scontrol show config`): an array's indices must stay below it."""
    shown = _run(["scontrol", "show", "config"]).stdout
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", shown, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_MAX_ARRAY_SIZE


def _base_id(job_id: str) -> str:
    return job_id.split(".", 1)[0]


def _sacct(job_ids: list[str]) -> dict[str, JobInfo] | None:
    """The allocations' accounting records (None when accounting does not answer)."""
    result = _run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Elapsed", "-j", ",".join(job_ids)]
    )
    if result.returncode != 0:
        return None
    found: dict[str, JobInfo] = {}
    for line in result.stdout.splitlines():
        fields = line.split("|")
        if len(fields) < 5:
            continue
        job_id, state, exit_code, node, elapsed = fields[:5]
        found[_base_id(job_id)] = JobInfo(
            job_id, state.split()[0] if state else "UNKNOWN", exit_code, node, elapsed
        )
    return found


COST_FIELDS = "JobID,AllocTRES,ElapsedRaw,State,Submit"


def _tres(alloc_tres: str) -> dict[str, int]:
    """AllocTRES (`billing=16,cpu=16,gres/gpu=8,mem=4G,node=1`) as counts; memory's unit suffix is not a
    count and is left out."""
    counts = {}
    for item in alloc_tres.split(","):
        name, _, value = item.partition("=")
        if value.isdigit():
            counts[name] = int(value)
    return counts


def parse_costs(sacct_text: str, submitted_at: Mapping[str, float] | None = None) -> dict[str, JobCost]:
    """The costs of the jobs in the output of `sacct -D -X -n -P -o COST_FIELDS` with SLURM_TIME_FORMAT=%s
    (Submit in epoch seconds), by job id; records submitted ID_REUSE_SLACK_S before `submitted_at[id]`
    belong to an earlier job of the same id and are left out. Lines of array tasks never started
    (`123_[4-9]`) cost nothing and are skipped."""
    by_job: dict[str, list[tuple[dict[str, int], int, str]]] = {}
    for line in sacct_text.splitlines():
        fields = line.split("|")
        if len(fields) < 5 or "[" in fields[0] or not fields[2].isdigit():
            continue
        job_id, alloc_tres, elapsed, state, submit = fields[:5]
        since = (submitted_at or {}).get(job_id)
        if since is not None and submit.isdigit() and int(submit) < since - ID_REUSE_SLACK_S:
            continue
        by_job.setdefault(job_id, []).append((_tres(alloc_tres), int(elapsed), state.split()[0]))
    costs = {}
    for job_id, records in by_job.items():
        allocated = [tres for tres, _, _ in records if tres] or [{}]
        costs[job_id] = JobCost(
            job_id=job_id,
            gpus=allocated[-1].get("gres/gpu", 0),
            cpus=allocated[-1].get("cpu", 0),
            elapsed_s=sum(elapsed for _, elapsed, _ in records),
            gpu_seconds=sum(tres.get("gres/gpu", 0) * elapsed for tres, elapsed, _ in records),
            cpu_seconds=sum(tres.get("cpu", 0) * elapsed for tres, elapsed, _ in records),
            records=len(records),
            state=records[-1][2],
        )
    return costs


def job_costs(
    job_ids: Iterable[str], submitted_at: Mapping[str, float] | None = None
) -> dict[str, JobCost] | None:
    """Each job's allocation × elapsed time over every one of its records, from one `sacct -D` call (None
    when accounting does not answer). Keyed as sacct prints ids: asking for an array's id returns each of
    its tasks (`123_0`, `123_1`, ...). `submitted_at` (epoch seconds, by id) sets aside earlier jobs that
    had the same id."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    try:
        result = _run(
            ["sacct", "-D", "-X", "-a", "-n", "-P", "-o", COST_FIELDS, "-j", ",".join(ids)],
            env={**os.environ, "SLURM_TIME_FORMAT": "%s"},
        )
    except (OSError, subprocess.TimeoutExpired):  # no sacct on this machine, or slurmdbd not answering
        return None
    if result.returncode != 0:
        return None
    return parse_costs(result.stdout, submitted_at)


def _squeue(job_ids: list[str]) -> dict[str, JobInfo]:
    """What the queue holds of these jobs (pending, running, requeued...)."""
    result = _run(["squeue", "-h", "-o", "%i|%T|%N|%M", "-j", ",".join(job_ids)])
    found: dict[str, JobInfo] = {}
    for line in result.stdout.splitlines():
        fields = line.split("|")
        if len(fields) >= 4:
            found[_base_id(fields[0])] = JobInfo(fields[0], fields[1], "", fields[2], fields[3])
    return found


def job_states(job_ids: Iterable[str], submitted_at: dict[str, float] | None = None) -> dict[str, JobInfo]:
    """The state of each job: from one sacct call for all of them; the queue is asked about those that
    accounting reports ended or does not know yet (a requeued job's old record can still say NODE_FAIL, and
    accounting lags the queue by a few seconds)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    accounted = _sacct(ids) or {}
    unsure = [i for i in ids if i not in accounted or not accounted[i].alive]
    queued = _squeue(unsure) if unsure else {}
    states: dict[str, JobInfo] = {}
    now = time.time()
    for job_id in ids:
        if job_id in queued:  # back in (or still in) the queue, whatever its last accounting record says
            states[job_id] = queued[job_id]
        elif job_id in accounted:
            states[job_id] = accounted[job_id]
        elif now - (submitted_at or {}).get(job_id, 0.0) < START_GRACE_S:
            states[job_id] = JobInfo(job_id, "PENDING")
        else:
            states[job_id] = JobInfo(job_id, "UNKNOWN")
    return states


def cancel(job_ids: Iterable[str]) -> None:
    """scancel the jobs (ended ones are ignored by SLURM)."""
    ids = sorted(set(job_ids))
    if ids:
        _run(["scancel", *ids])
