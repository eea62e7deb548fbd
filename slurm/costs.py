"""What a run's jobs cost, per update and stage, from SLURM's accounting: `probepo jobs`, `probepo report`
and the train flow's cost artifact read it.

Each SLURM job costs its allocation (AllocTRES: GPUs, CPUs) × its elapsed time, summed over every record
of the job (`sacct -D`, accounting.job_costs): a preempted or requeued job keeps its id and is paid for
each time it ran. A job of a stage counts for that stage of its update. The resident executor's one driver
job runs every stage: its cost is split over the (update, stage) pairs it ran (its attempt records) in
proportion to each stage's wall time (`<stage>/wall_s` in the metrics), so the split adds up to the job's
accounted cost exactly and the time outside stages (start-up, engine loading, the replay after a requeue)
is spread in the same proportion. Local jobs (submitit subprocesses) and inline runs have no accounting:
their stages' wall time only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probepo.report.costs import RunCosts, StageCost, schedule_order
from probepo.run.schedule import Stage
from probepo.store import ArtifactStore
from slurm.accounting import JobCost, job_costs
from slurm.backends import SlurmBackend
from slurm.tables import text_table

Pair = tuple[int, str]


def stage_wall_s(metrics: list[dict[str, Any]]) -> dict[Pair, float]:
    """Each committed stage's own wall time, by (update, stage), from the run's metrics records."""
    walls: dict[Pair, float] = {}
    for record in metrics:
        for key, value in record.items():
            stage, _, name = key.partition("/")
            if name == "wall_s" and isinstance(value, int | float):
                pair = (int(record["update"]), stage)
                walls[pair] = walls.get(pair, 0.0) + float(value)
    return walls


def _asked_gpus(record: Mapping[str, Any]) -> bool:
    resources = record.get("resources") or {}
    return bool(resources.get("gpus_per_node") or resources.get("gpus_per_task"))


def attribute(
    run_id: str,
    records: list[dict[str, Any]],
    costs: Mapping[str, JobCost] | None,
    attempts: list[dict[str, Any]],
    metrics: list[dict[str, Any]],
) -> RunCosts:
    """The run's costs by (update, stage) from its job records, their accounting (`costs`, by job id;
    None: accounting did not answer), its attempt records (which stages a driver job ran) and its metrics
    (each stage's wall time)."""
    walls = stage_wall_s(metrics)
    seconds: dict[Pair, list[float]] = {pair: [0.0, 0.0] for pair in walls}  # GPU-s, CPU-s
    notes, unaccounted, local, seen = [], [], 0, set()
    for record in records:
        job_id = str(record.get("job_id", ""))
        if job_id in seen:  # a record rewritten under another submission id: one job, paid once
            continue
        seen.add(job_id)
        if record.get("executor") != SlurmBackend.name:
            local += 1
            continue
        cost = (costs or {}).get(job_id)
        if cost is None:
            unaccounted.append(job_id)
            continue
        if _asked_gpus(record) and cost.gpus == 0 and cost.cpus > 0:
            notes.append(
                f"job {job_id} asked for GPUs but its accounting records none: the cluster's"
                " AccountingStorageTRES lacks gres/gpu, and its GPU-hours count 0"
            )
        shares = _shares(record, job_id, attempts, walls)
        for pair, share in shares.items():
            spent = seconds.setdefault(pair, [0.0, 0.0])
            spent[0] += share * cost.gpu_seconds
            spent[1] += share * cost.cpu_seconds
        if len(shares) > 1:
            notes.append(
                f"the driver job {job_id} ran {len(shares)} stages: its {cost.gpu_hours:.4f} GPU-hours are"
                " split over them in proportion to their wall time"
            )
    if costs is None and unaccounted:
        notes.append("SLURM's accounting (sacct) did not answer: no GPU-hours for the run's SLURM jobs")
    elif unaccounted:
        notes.append(f"not in SLURM's accounting (yet), not counted: jobs {', '.join(unaccounted)}")
    if local:
        notes.append(f"{local} job(s) of the local executor: no accounting, their wall time only")
    stages = tuple(
        StageCost(update, stage, gpu_s / 3600.0, cpu_s / 3600.0, walls.get((update, stage), 0.0))
        for (update, stage), (gpu_s, cpu_s) in sorted(
            seconds.items(), key=lambda item: (item[0][0], schedule_order(item[0][1]))
        )
    )
    accounted = len(seen) - local - len(unaccounted)
    return RunCosts(run_id, stages, len(seen), accounted, tuple(notes))


def _shares(
    record: Mapping[str, Any], job_id: str, attempts: list[dict[str, Any]], walls: Mapping[Pair, float]
) -> dict[Pair, float]:
    """How a job's cost is shared out: a stage's job, all to its (update, stage); the driver job, over
    the stages it ran in proportion to their wall time (equally where none is recorded)."""
    own: Pair = (int(record.get("update", 0)), str(record.get("stage", "")))
    if own[1] != Stage.DRIVER:
        return {own: 1.0}
    ran = sorted({(int(a["update"]), str(a["stage"])) for a in attempts if str(a.get("job_id")) == job_id})
    if not ran:
        return {own: 1.0}
    weights = {pair: walls.get(pair, 0.0) for pair in ran}
    total = sum(weights.values())
    return {pair: (weight / total if total else 1.0 / len(ran)) for pair, weight in weights.items()}


def accounted(records: list[dict[str, Any]]) -> dict[str, JobCost] | None:
    """The accounting of the run's SLURM jobs, by job id, from one `sacct -D` call (None: accounting did
    not answer); records submitted before the store's submission of a job belong to an earlier job that
    had the same id and are left out."""
    submitted = {
        str(r["job_id"]): float(r.get("submitted_epoch", 0.0))
        for r in records
        if r.get("executor") == SlurmBackend.name
    }
    return job_costs(submitted, submitted) if submitted else {}


def run_costs(store: ArtifactStore, run_id: str) -> RunCosts:
    """The run's costs by (update, stage), read from the store and SLURM's accounting."""
    records = store.jobs(run_id)
    return attribute(run_id, records, accounted(records), store.attempts(run_id), store.read_metrics(run_id))


def stage_totals(costs: RunCosts) -> list[StageCost]:
    """Totals per stage over every update, in the order stages run, then the run's (stage `run`)."""
    totals = list(costs.by_stage().values())
    return [*totals, StageCost(-1, "run", costs.gpu_hours, costs.cpu_hours, sum(c.wall_s for c in totals))]


def costs_table(costs: RunCosts) -> str:
    """Totals per stage and for the run (GPU-hours, CPU-hours, the stages' own wall time), then the notes;
    a run without accounting shows its wall time only."""
    if costs.wall_time_only:
        rows = [("stage", "wall (s)")] + [(c.stage, f"{c.wall_s:.1f}") for c in stage_totals(costs)]
    else:
        rows = [("stage", "GPU-h", "CPU-h", "wall (s)")] + [
            (c.stage, f"{c.gpu_hours:.4f}", f"{c.cpu_hours:.4f}", f"{c.wall_s:.1f}")
            for c in stage_totals(costs)
        ]
    return "\n".join([text_table(rows), *(f"note: {note}" for note in costs.notes)])
