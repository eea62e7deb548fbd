"""The log files of a stage's job, for `probepo logs` and the `log` column of `probepo jobs`.

submitit writes each task's stdout and stderr to `<folder>/<job_id>_<task>_log.out|.err` (its JobPaths),
in the job folder the job record names; a job has nodes × tasks_per_node tasks (its record's resources).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

Stream = Literal["out", "err"]
JobRecord = Mapping[str, Any]


def task_count(record: JobRecord) -> int:
    """The job's tasks: nodes × tasks_per_node from its resources (1 each where the record has none)."""
    resources = record.get("resources") or {}
    return int(resources.get("nodes") or 1) * int(resources.get("tasks_per_node") or 1)


def log_path(record: JobRecord, task: int = 0, stream: Stream = "out") -> Path | None:
    """Where submitit writes a task's stdout ("out") or stderr ("err"); None for a record without a folder."""
    folder = record.get("folder")
    return Path(folder) / f"{record['job_id']}_{task}_log.{stream}" if folder else None


def log_files(record: JobRecord, task: int | None = None) -> list[Path]:
    """The job's log files that exist on this machine, stdout then stderr of each task (only `task` if
    given), in task order."""
    tasks = range(task_count(record)) if task is None else (task,)
    paths = (log_path(record, t, stream) for t in tasks for stream in ("out", "err"))
    return [path for path in paths if path is not None and path.is_file()]


def describe(record: JobRecord) -> str:
    """One line naming the job: `job 123 (update 0, stage sample; local, COMPLETED, 2 tasks)`."""
    tasks = task_count(record)
    many = f", {tasks} tasks" if tasks > 1 else ""
    return (
        f"job {record.get('job_id')} (update {record.get('update', 0)}, stage {record.get('stage', '?')};"
        f" {record.get('executor', '?')}, {record.get('state') or '?'}{many})"
    )


def missing_note(record: JobRecord, task: int | None = None) -> str:
    """Why no log file is listed: the job has not started yet, or its folder is not on this machine."""
    where = record.get("folder") or "(the record names no job folder)"
    which = f"task {task} of " if task is not None else ""
    return (
        f"no log files yet for {which}{describe(record)} in {where}: a pending job has written none yet;"
        " otherwise that folder is on a file system this machine does not share (read them on the job's node)"
    )


def tail_lines(path: Path, lines: int | None) -> list[str]:
    """The file's last `lines` lines (all of them if None), undecodable bytes replaced."""
    with path.open(encoding="utf-8", errors="replace") as file:
        kept: Sequence[str] = deque(file, maxlen=lines) if lines is not None else file.readlines()
        return [line.rstrip("\n") for line in kept]


def render(record: JobRecord, *, tail: int | None = None, task: int | None = None) -> str:
    """What `probepo logs` prints for one job: a line naming it, then each existing log file, introduced
    by `==> PATH <==` (its last `tail` lines if given); the note of `missing_note` if there is none."""
    files = log_files(record, task)
    if not files:
        return missing_note(record, task)
    parts = [describe(record)]
    for path in files:
        parts.append(f"==> {path} <==")
        parts.extend(tail_lines(path, tail))
    return "\n".join(parts)


def pick_job(records: Sequence[JobRecord], update: int | None, stage: str | None) -> JobRecord | None:
    """The last submitted of the jobs of `update` and `stage` (either or both None: any); None if none."""
    chosen = [
        r
        for r in _by_submission(records)
        if (update is None or r.get("update", 0) == update) and (stage is None or r.get("stage") == stage)
    ]
    return chosen[-1] if chosen else None


def _by_submission(records: Sequence[JobRecord]) -> list[JobRecord]:
    return sorted(records, key=lambda r: (r.get("submitted_epoch") or 0.0, str(r.get("submitted_at", ""))))


def stages_with_jobs(records: Sequence[JobRecord]) -> str:
    """The run's stages that have jobs, in the order of their first job, with their updates: `checkpoint
    (update 0), sample (updates 0-2)`."""
    updates: dict[str, set[int]] = {}
    for record in _by_submission(records):
        updates.setdefault(str(record.get("stage", "?")), set()).add(int(record.get("update", 0)))
    return ", ".join(f"{stage} ({_updates(sorted(ks))})" for stage, ks in updates.items())


def _updates(ks: list[int]) -> str:
    """`update 3`, `updates 0-4`, `updates 0-2, 5`: sorted update numbers as runs."""
    runs: list[list[int]] = []
    for k in ks:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    spans = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"update{'s' if len(ks) > 1 else ''} {spans}"
