"""How a stage gets run: the driver loop (`probepo.run.pipeline.train`) hands each stage the ledger lacks to a
stage runner. `InlineRunner` runs it in the driver's process; the runners of `slurm/` submit it as a job
(a subprocess, or a SLURM job) that runs `execute_stage` there. Whichever runs it, the stage commits to the
store, and the store's create-only markers, never the runner, make each stage count exactly once.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from probepo import spend
from probepo.config import Retention, RunConfig
from probepo.run import distributed
from probepo.run.preemption import Preempted
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext
from probepo.stages.policy import PolicyEngines
from probepo.stages.runners import STAGES
from probepo.stages.uploads import CheckpointUploads
from probepo.store import AlreadyCommitted, ArtifactStore, AttemptOutcome, open_store


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class StageRequest:
    """One stage of one update, in a form that travels to a job: plain strings, and no secret (the store
    URL names a bucket or a folder; credentials come from the job's own environment)."""

    store_url: str
    run_id: str
    update: int
    stage: Stage
    config_json: str
    """The run's RunConfig as JSON (a warm-up run's too: the warm-up reads its settings from it)."""
    retention: Retention | None = None
    """The driver's (the resident executor's job): the profile's checkpoint retention."""
    signal_grace_s: float | None = None
    """The job's `signal_grace_s` (the profile's for its stage), set where it is submitted: how long a stop
    leaves it (a driver lets a checkpoint in flight land within it)."""

    @cached_property
    def config(self) -> RunConfig:
        return RunConfig.model_validate_json(self.config_json)

    @classmethod
    def of(cls, ctx: StageContext, stage: Stage) -> StageRequest:
        return cls(ctx.store.url, ctx.run_id, ctx.update, stage, ctx.config.model_dump_json())

    def describe(self) -> str:
        if self.stage == Stage.DRIVER:
            return f"the driver of run {self.run_id}"
        return f"stage {self.stage} of update {self.update} of run {self.run_id}"

    def context(self, store: ArtifactStore | None, scratch: Path, should_stop: Any) -> StageContext:
        """The stage's context in the process that runs it (opening the store unless given)."""
        store = store or open_store(self.store_url)
        return StageContext(store, self.run_id, self.update, self.config, scratch, should_stop=should_stop)


class StageRunner(Protocol):
    """Runs one stage so that it ends committed to the store, or raises: Preempted when it stopped at a
    safe point (its progress committed), another exception naming what failed otherwise."""

    resident: bool
    """Whether the engines stay alive from one stage to the next (policy k + 1 handed over in memory), as
    runs with `checkpoint_every` > 1 need."""

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        """`ctx` is the driver's own context of the stage (its store, scratch folder and stop flag)."""
        ...


@runtime_checkable
class DriverRunner(Protocol):
    """Runs the driver itself as a job — the resident executor: one job in one allocation runs every stage
    left, its engines resident — and waits for it (re-attaching to one in flight). Returns once the run is
    complete; raises as a StageRunner does."""

    resident: bool

    def run_driver(
        self, request: StageRequest, ctx: StageContext, on_poll: Callable[[], bool] | None = None
    ) -> None:
        """`request` names the driver pseudo-stage of update 0; `ctx` is the waiting process's; `on_poll`
        is called at each poll of the job while it runs (to follow what it commits) and returns whether
        it saw a new commit (the polls then go back to their quickest)."""
        ...


def execute_stage(ctx: StageContext, stage: Stage, job_id: str | None = None) -> None:
    """One attempt at a stage, in this process: the stage function, recorded in the store with the id of
    the job it runs in (None outside a job; the job wrapper in slurm/ hands it over).

    The record is written as running before the stage starts (so an attempt killed outright is still
    visible, with its job id, host and pid) and replaced with its AttemptOutcome when it ends: a collective
    that failed because another rank died is not the stage's own failure (RANK_LOST: submitted again).
    """
    store, run_id, update = ctx.store, ctx.run_id, ctx.update
    record: dict[str, Any] = {
        "job_id": job_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start": now(),
        "outcome": AttemptOutcome.RUNNING,
    }
    attempt = store.record_attempt(run_id, update, stage, record)
    ctx.stage_started, ctx.attempt_notes = time.perf_counter(), {}
    with spend.attempt_spend() as counters:
        try:
            STAGES[stage](ctx)
            record["outcome"] = AttemptOutcome.COMMITTED
        except AlreadyCommitted:
            record["outcome"] = AttemptOutcome.LOST_RACE
        except Preempted:
            record["outcome"] = AttemptOutcome.PREEMPTED
            raise
        except BaseException as exc:
            outcome = AttemptOutcome.RANK_LOST if distributed.lost_a_rank(exc) else AttemptOutcome.FAILED
            record.update(outcome=outcome, error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            record.update(ctx.attempt_notes, end=now(), spend=counters.as_record())
            store.record_attempt(run_id, update, stage, record, attempt_id=attempt)


class InlineRunner:
    """Runs each stage in the driver's own process (the default: demos, tests, one machine, and at scale
    the whole driver inside one allocation, whose job id `job_id` its attempts record), keeping the engines
    resident from stage to stage."""

    resident = True

    def __init__(self, job_id: str | None = None) -> None:
        self.engines = PolicyEngines()
        self.job_id = job_id

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        ctx.engines = self.engines
        try:
            execute_stage(ctx, request.stage, self.job_id)
        except BaseException:
            self.engines.release()  # the stage may have left an engine half-changed
            raise


class LockstepRunner(InlineRunner):
    """The inline runner of rank 0 of a multi-task driver job (the resident executor on several GPUs):
    before each stage it tells the other ranks, which run `follow_stages`, to run that stage too, so every
    rank runs every stage with its engines resident — DeepSpeed's collectives in score, optimize and
    replays line up, and rank 0 alone records and commits. Every rank works in its own node's `scratch`
    (the job's ranks may span several nodes). `finish()` releases the followers."""

    def __init__(self, scratch: Path, job_id: str | None = None) -> None:
        super().__init__(job_id)
        self.scratch = scratch

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        order = {"run_id": request.run_id, "update": request.update, "stage": request.stage}
        distributed.broadcast_json(order)
        lockstep = replace(ctx, scratch=self.scratch, should_stop=distributed.agreed(ctx.should_stop))
        super().run(request, lockstep)

    def finish(self) -> None:
        distributed.broadcast_json(None)


def follow_stages(request: StageRequest, should_stop: Any, scratch: Path) -> None:
    """Ranks other than 0 of a multi-task driver job: run each stage rank 0's LockstepRunner announces, in
    their node's `scratch`, the commits made together with rank 0, until rank 0 finishes (after its last
    stage, or after a stage stopped at a safe point: Preempted, raised on every rank at once). Should rank
    0 die, the group's collectives fail here and this process ends with them."""
    store = open_store(request.store_url)
    engines = PolicyEngines()
    uploads = CheckpointUploads(should_stop, request.signal_grace_s)
    with uploads.until_landed(store):  # this rank's part of a checkpoint in flight (rank 0 lands it)
        while (order := distributed.broadcast_json()) is not None:
            ctx = StageContext(
                store,
                order["run_id"],  # the run's, or its warm-up run's
                order["update"],
                request.config,
                scratch,
                should_stop=distributed.agreed(should_stop),
                engines=engines,
                uploads=uploads,
            )
            try:
                STAGES[order["stage"]](ctx)
            except AlreadyCommitted:
                pass  # another attempt committed it first, as rank 0 found too
            except Preempted:
                engines.release()  # rank 0 stops too, then tells this rank to finish
            except BaseException:
                engines.release()
                raise
