"""`probepo jobs` and `probepo costs` as text: one line per submitted job with its accounted cost, in
left-aligned columns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm.accounting import JobCost
from slurm.logs import log_path

JOB_COLUMNS = (
    "update",
    "stage",
    "job",
    "executor",
    "state",
    "node",
    "elapsed",
    "runs",
    "GPUs",
    "GPU-h",
    "CPU-h",
    "attempts",
    "outcome",
    "log",
)


def jobs_table(
    records: list[dict[str, Any]], attempts: list[dict[str, Any]], costs: Mapping[str, JobCost] | None = None
) -> str:
    """`probepo jobs`: one line per submitted job, with how many attempts its stage has, what its
    allocations cost (`costs`, by job id: elapsed, runs, GPUs, GPU-hours and CPU-hours over every record
    of a requeued job; `-` for a job without accounting) and, last, the path of its task 0's stdout
    (`probepo logs` prints its files)."""
    per_stage: dict[tuple[int, str], int] = {}
    for attempt in attempts:
        key = (attempt.get("update", 0), attempt.get("stage", ""))
        per_stage[key] = per_stage.get(key, 0) + 1
    rows = [JOB_COLUMNS]
    for r in sorted(records, key=lambda r: (r.get("update", 0), r.get("submitted_at", ""))):
        rows.append(
            (
                str(r.get("update", 0)),
                str(r.get("stage", "")),
                str(r.get("job_id", "")),
                str(r.get("executor", "")),
                str(r.get("state", "")),
                str(r.get("node") or "-"),
                *_cost_cells((costs or {}).get(str(r.get("job_id", ""))), r),
                str(per_stage.get((r.get("update", 0), r.get("stage", "")), 0)),
                str(r.get("outcome", "")),
                str(log_path(r) or "-"),
            )
        )
    return text_table(rows)


def _cost_cells(cost: JobCost | None, record: Mapping[str, Any]) -> tuple[str, ...]:
    """Elapsed, runs, GPUs, GPU-hours and CPU-hours of a job: its accounting's, else its record's elapsed."""
    if cost is None:
        return (str(record.get("elapsed") or "-"), "-", "-", "-", "-")
    hours = (f"{cost.gpu_hours:.4f}", f"{cost.cpu_hours:.4f}")
    return (duration(cost.elapsed_s), str(cost.records), str(cost.gpus), *hours)


def duration(seconds: int) -> str:
    """Seconds as SLURM writes a duration: [D-]HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def text_table(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells (the first the header) in left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
