"""What a run cost, per update and stage: GPU-hours and CPU-hours of its jobs from the scheduler's
accounting (each job's allocation × elapsed time, over every record of a requeued job), and the wall time
of its stages. Plain data: the execution layer (slurm/costs.py) gathers it, the report and the jobs table
show it. A run that ran inline, or on the local executor, has no accounting: wall time only."""

from __future__ import annotations

from dataclasses import dataclass, replace

from probepo.run.schedule import TRAINING_STAGES, Stage


@dataclass(frozen=True)
class StageCost:
    """One stage of one update: what its jobs were allocated, and how long the stage itself ran."""

    update: int
    stage: str
    gpu_hours: float = 0.0
    """GPUs × elapsed hours of the jobs that ran it (a resident driver job's share: slurm/costs.py)."""
    cpu_hours: float = 0.0
    wall_s: float = 0.0
    """The stage's own wall time, as its committed summary says (`<stage>/wall_s` in the metrics)."""


@dataclass(frozen=True)
class RunCosts:
    """A run's costs by (update, stage), with how many of its jobs the scheduler accounted for and what a
    reader must know about the figures (jobs without accounting, how a driver job's cost was split)."""

    run_id: str
    stages: tuple[StageCost, ...] = ()
    jobs: int = 0
    """Jobs the run submitted (0: it ran inline)."""
    accounted_jobs: int = 0
    """Those whose allocations the scheduler's accounting reports (SLURM's; the local executor has none)."""
    notes: tuple[str, ...] = ()

    @property
    def wall_time_only(self) -> bool:
        """No job of the run was accounted for: it ran inline or on the local executor, and its cost is its
        wall time alone (no GPU-hours are claimed)."""
        return self.accounted_jobs == 0

    @property
    def gpu_hours(self) -> float:
        """Every job's GPU-hours, evaluations included."""
        return sum(cost.gpu_hours for cost in self.stages)

    @property
    def cpu_hours(self) -> float:
        return sum(cost.cpu_hours for cost in self.stages)

    def by_stage(self) -> dict[str, StageCost]:
        """Totals per stage over every update (their update: -1), in the order of the schedule."""
        totals: dict[str, StageCost] = {}
        for cost in sorted(self.stages, key=lambda cost: schedule_order(cost.stage)):
            totals[cost.stage] = _plus(totals.get(cost.stage, StageCost(-1, cost.stage)), cost)
        return totals

    def training_gpu_hours(self, update: int) -> float:
        """GPU-hours of update `update`'s training stages (sample to optimize; evaluations and
        checkpoints excluded, as the report's training wall time)."""
        return sum(c.gpu_hours for c in self.stages if c.update == update and c.stage in TRAINING_STAGES)


def schedule_order(stage: str) -> int:
    """A stage's place in the schedule (Stage's order: checkpoint, evaluate, sample ... optimize, driver);
    names that are no stage come last."""
    names = list(Stage)
    return names.index(Stage(stage)) if stage in names else len(names)


def _plus(total: StageCost, cost: StageCost) -> StageCost:
    return replace(
        total,
        gpu_hours=total.gpu_hours + cost.gpu_hours,
        cpu_hours=total.cpu_hours + cost.cpu_hours,
        wall_s=total.wall_s + cost.wall_s,
    )
