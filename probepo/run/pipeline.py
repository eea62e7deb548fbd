"""The driver of a training run: for each update, run the stages that the ledger lacks, in order.

The store is the single source of truth. A stage already committed is skipped, so running the same run id
again resumes it; a stage interrupted mid-way continues from the partial progress it committed. The
driver holds the run's lease so that no second driver works on the same run.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from probepo import __version__
from probepo.config import NOT_RECIPE, Retention, RunConfig
from probepo.presets import ConfigError
from probepo.run.driver_lease import LeaseKeeper, take_lease
from probepo.run.evaluations import retain_checkpoints
from probepo.run.execution import DriverRunner, InlineRunner, StageRequest, StageRunner
from probepo.run.metrics import MetricsFollower, ProgressFn, RunMetrics
from probepo.run.preemption import Preempted, StopFlag
from probepo.run.schedule import STAGES, Stage, full_checkpoint, resident_refusal, stages_for_update
from probepo.stages import warmup
from probepo.stages.context import StageContext
from probepo.stages.uploads import CheckpointUploads
from probepo.store import (
    ArtifactStore,
    Ledger,
    ResumePoint,
    RunConfigMismatch,
    open_store,
)
from probepo.store.lease import HolderEnded
from probepo.store.retention import prune_parts
from probepo.store.store import differing_fields

log = logging.getLogger(__name__)

SayFn = Callable[[str], None]
"""Called with a line for the user: where the store, warm-up and events are, where a run starts."""


def drive_stage(
    ctx: StageContext, stage: str, runner: StageRunner, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Have `runner` run one stage unless the ledger already holds it; returns its committed summary
    (and tells `progress` whether it ran or was skipped)."""
    store, run_id, update = ctx.store, ctx.run_id, ctx.update
    marker = store.marker(run_id, update, stage)
    ran = marker is None
    if marker is None:
        runner.run(StageRequest.of(ctx, stage), ctx)
        marker = store.marker(run_id, update, stage)
        if marker is None:
            raise RuntimeError(
                f"stage {stage} of update {update} of run {run_id} returned without committing"
            )
    summary = dict(marker.get("summary") or {})
    if progress is not None:
        progress(update, stage, summary, ran)
    return summary


def run_record(config: RunConfig, parts: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What run.json freezes: the config (or some of its parts) and the code version. Where the store
    lives and how often it is checkpointed in full are not part of its recipe (NOT_RECIPE): a run may be
    moved, or resumed with another checkpoint interval."""
    frozen = config.model_dump(mode="json", exclude=set(NOT_RECIPE))
    if parts is not None:
        frozen = {name: frozen[name] for name in parts}
    return {"config": frozen, "code_version": __version__}


def train(
    config: RunConfig,
    run_id: str,
    *,
    store: ArtifactStore | None = None,
    progress: ProgressFn | None = None,
    say: SayFn | None = None,
    tensorboard_dir: Path | None = None,
    take_over: bool = False,
    runner: StageRunner | DriverRunner | None = None,
    holder_ended: HolderEnded | None = None,
    retention: Retention | None = None,
    signal_grace_s: float | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) `run_id` to `config.num_updates` updates; returns the metrics records. Every stage
    the ledger lacks (the warm-up's too) goes to `runner` (default: inline, in this process); a
    DriverRunner (the resident executor) runs this very function in a job instead, and this process waits.

    A run's recipe is frozen in the store on its first start: resuming with another `config` raises
    RunConfigMismatch naming the differing fields (a resume never silently changes a recipe; more updates
    go through `extend_run`). `take_over` takes the run's lease even from a live holder (an operator's
    decision, after checking that it is dead); `holder_ended` judges a holder of another host (a SLURM
    job that accounting shows ended is taken over at once). `say` hears where things are and where the
    run starts, once the recipe and the lease are settled. `retention` (the profile's) prunes older
    checkpoints after each full one. `signal_grace_s`: how long a stop leaves this process (its job's;
    None: the profile default's), which a checkpoint uploading beside the updates may use to land.
    """
    store = store or open_store(config.store)
    runner = runner or InlineRunner()
    if not runner.resident and (refusal := resident_refusal(config.checkpoint_every)):
        raise ConfigError(refusal)
    tell = say or (lambda line: None)
    freeze_recipe(store, run_id, config)
    if isinstance(runner, DriverRunner):
        _drive_in_a_job(config, run_id, store, runner, tell, progress, retention)
        return store.read_metrics(run_id)
    flag = StopFlag()
    uploads = None
    if runner.resident:  # its process outlives the stage: a checkpoint can upload beside the next updates
        landed = partial(_retain, store, run_id, retention)
        uploads = CheckpointUploads(flag, signal_grace_s, landed, job_id=getattr(runner, "job_id", None))
    with flag.installed():  # a stop during the warm-up, too, ends this driver at a safe point
        return _train(config, run_id, store, runner, flag, tell, progress, tensorboard_dir, take_over,
                      holder_ended, retention, uploads)  # fmt: skip


def _train(
    config: RunConfig,
    run_id: str,
    store: ArtifactStore,
    runner: StageRunner,
    flag: StopFlag,
    tell: SayFn,
    progress: ProgressFn | None,
    tensorboard_dir: Path | None,
    take_over: bool,
    holder_ended: HolderEnded | None,
    retention: Retention | None,
    uploads: CheckpointUploads | None,
) -> list[dict[str, Any]]:
    """`train` from the warm-up on, in this process, under the stop flag `flag`."""
    # A testbed run starts from the shared warm-up; a Hugging Face model's from its pretrained weights.
    origin = (
        f"pretrained {config.model.pretrained}"
        if config.model.kind == "hf"
        else "warm-up "
        + ensure_warmup(
            config, store, progress, say=tell, runner=runner, holder_ended=holder_ended, should_stop=flag
        )
    )
    tell(f"store: {store.url}")
    with (
        LeaseKeeper(take_lease(store, run_id, force=take_over, holder_ended=holder_ended)) as lease,
        tempfile.TemporaryDirectory(prefix=f"probepo-{run_id}-") as scratch,
        RunMetrics(store, run_id, tensorboard_dir) as metrics,
    ):
        start = resume_point(store, run_id, config)
        tell(_start_line(store, run_id, start, origin, config))
        if tensorboard_dir is not None and not start.done:
            tell(f"TensorBoard events: {tensorboard_dir}  (tensorboard --logdir {tensorboard_dir.parent})")
        # Updates before the resume point are committed whole; log any that a crash left out of metrics.
        first = config.num_updates + 1 if start.done else start.update
        for update in range(first):
            if metrics.missing(update):
                ctx = StageContext(store, run_id, update, config, Path(scratch))
                metrics.log(update, {s: drive_stage(ctx, s, runner) for s in _update_stages(config, update)})
        with nullcontext() if uploads is None else uploads.until_landed(store):
            for update in range(first, config.num_updates + 1):
                ctx = StageContext(store, run_id, update, config, Path(scratch), flag, uploads=uploads)
                summaries = {}
                for stage in _update_stages(config, update):
                    summaries[stage] = drive_stage(ctx, stage, runner, progress)
                    if STAGES[stage].commits_next_checkpoint and _full_after(config, update):
                        prune_parts(store, run_id, (update,))  # its parts: resume points nothing reads again
                        if uploads is None or not uploads.in_flight(update + 1):
                            _retain(store, run_id, retention, update + 1)  # else once it lands
                    if uploads is not None:
                        uploads.land(store)
                    lease.check()
                    if flag.raised:  # a stage boundary is a safe point: everything so far is committed
                        metrics.log(update, summaries)
                        raise Preempted(f"preempted after stage {stage} of update {update}; everything"
                                        " before is committed")  # fmt: skip
                metrics.log(update, summaries)
    return store.read_metrics(run_id)


def _retain(store: ArtifactStore, run_id: str, retention: Retention | None, checkpoint: int) -> None:
    """After full checkpoint `checkpoint` is committed: prune the older ones as the profile's `retention`
    says (it counts committed checkpoints only)."""
    if retention is not None and not retention.keeps_everything:
        retain_checkpoints(store, run_id, retention)


def _full_after(config: RunConfig, update: int) -> bool:
    """Whether update k's stage that commits the next checkpoint (optimize) committed policy k + 1 in full
    (and its parts): only then has retention work (a new full checkpoint changes what it keeps) and parts
    to prune."""
    return full_checkpoint(update + 1, num_updates=config.num_updates, every=config.checkpoint_every)


def _drive_in_a_job(
    config: RunConfig,
    run_id: str,
    store: ArtifactStore,
    runner: DriverRunner,
    tell: SayFn,
    progress: ProgressFn | None,
    retention: Retention | None,
) -> None:
    """Hand the whole run to one job of `runner` (which takes the lease there) and wait for it, telling
    `progress` of each stage the job commits as its metrics reach the store."""
    start = resume_point(store, run_id, config)
    tell(f"store: {store.url}")
    if start.done:
        tell(f"run {run_id} is complete ({config.num_updates} updates)")
        return
    tell(
        f"run {run_id}: one job runs the driver from update {start.update}, stage {start.stage}; follow it"
        f" with `probepo jobs {run_id}` and `probepo store ls {run_id}` (stopping this process leaves it"
        f" running: `probepo resume {run_id} --executor resident` waits for it again)"
    )
    flag = StopFlag()
    with flag.installed(), tempfile.TemporaryDirectory(prefix=f"probepo-{run_id}-") as scratch:
        ctx = StageContext(store, run_id, 0, config, Path(scratch), should_stop=flag)
        follow = MetricsFollower(store, run_id, progress) if progress else None
        request = replace(StageRequest.of(ctx, Stage.DRIVER), retention=retention)
        runner.run_driver(request, ctx, on_poll=follow)
        if follow is not None:
            follow()
    tell(f"run {run_id} is complete ({config.num_updates} updates)")


def _update_stages(config: RunConfig, update: int) -> list[str]:
    return stages_for_update(update, num_updates=config.num_updates, eval_every=config.eval.every)


def _start_line(store: ArtifactStore, run_id: str, start: ResumePoint, origin: str, config: RunConfig) -> str:
    if start.done:
        return f"run {run_id} is complete ({config.num_updates} updates)"
    if not store.updates(run_id):
        return f"starting run {run_id}: {config.num_updates} updates from {origin}"
    partial_note = f" (committed inside it: {', '.join(start.partials)})" if start.partials else ""
    return f"resuming run {run_id} at update {start.update}, stage {start.stage}{partial_note}"


def recorded_updates(store: ArtifactStore, run_id: str) -> int:
    """How many updates a run is to train: its frozen recipe's, raised by its recorded extensions."""
    frozen = int(store.read_run(run_id)["config"]["num_updates"])
    return max([frozen, *(int(e["to"]) for e in store.extensions(run_id))])


def freeze_recipe(store: ArtifactStore, run_id: str, config: RunConfig) -> None:
    """Freeze the recipe on a run's first start; later, require the same one. Only `num_updates` may
    differ from the frozen recipe, and only to the count of the run's latest recorded extension."""
    try:
        store.create_run(run_id, run_record(config))
    except RunConfigMismatch as exc:
        keys = _differing_after_defaults(store.read_run(run_id)["config"], config)
        if keys is None:
            raise
        if not keys:  # only fields added since, at their defaults: the same recipe
            return
        if keys != ["num_updates"]:
            raise RunConfigMismatch(run_id, [f"config.{key}" for key in keys]) from None
        current = recorded_updates(store, run_id)
        if config.num_updates != current:
            raise RunConfigMismatch(
                run_id,
                exc.keys,
                advice=f"it trains {current} updates, this config {config.num_updates}; to train it further,"
                f" extend it: `probepo resume {run_id} --updates N` (N > {current})",
            ) from None


def _differing_after_defaults(frozen: dict[str, Any], config: RunConfig) -> list[str] | None:
    """The dotted fields in which `config` differs from a frozen recipe read by this code's RunConfig
    (fields added since the run was made take their defaults, which keep what older code did); None if
    this code cannot read the frozen recipe."""
    try:
        stored = RunConfig.model_validate({**frozen, **{name: getattr(config, name) for name in NOT_RECIPE}})
    except ValueError:
        return None
    return differing_fields(stored.model_dump(mode="json"), config.model_dump(mode="json"))


def extend_run(store: ArtifactStore, run_id: str, updates: int) -> dict[str, Any]:
    """Raise a run's number of updates to `updates` (more than it has): recorded create-only in the store
    (when, from how many, to how many); nothing else of the recipe changes, and its first updates stay
    bitwise what they were (prompts and seeds derive from (seed, update), never from the horizon)."""
    current = recorded_updates(store, run_id)
    if updates <= current:
        raise ConfigError(
            f"--updates {updates}: run {run_id} already trains {current} updates; a run can only be"
            f" extended (N > {current}), never shortened"
        )
    return store.extend_run(run_id, from_updates=current, to_updates=updates)


def resume_point(store: ArtifactStore, run_id: str, config: RunConfig) -> ResumePoint:
    """The first stage the driver would run, with the partial progress committed inside it."""
    return Ledger(store, run_id).resume_point(partial(_update_stages, config), config.num_updates + 1)


def ensure_warmup(
    config: RunConfig,
    store: ArtifactStore,
    progress: ProgressFn | None = None,
    say: SayFn | None = None,
    runner: StageRunner | None = None,
    holder_ended: HolderEnded | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """Have `runner` (default: inline) run the warm-up unless its checkpoint is already committed; returns
    the warm-up run's id. Its lease is taken as `train` takes a run's (`holder_ended`: see there);
    `should_stop` (the driver's stop flag) ends the wait for its job (raising Preempted; the job goes on)."""
    run_id = warmup.warmup_run_id(config)
    tell = say or (lambda line: None)
    if store.committed(run_id, 0, warmup.STAGE):
        summary = store.marker(run_id, 0, warmup.STAGE)["summary"]
        accuracy, steps = 100 * summary["accuracy"], summary["steps"]
        tell(f"warm-up: {run_id} (reused: accuracy {accuracy:.1f}% after {steps} steps)")
        return run_id
    tell(
        f"warm-up: making {run_id}, the supervised starting checkpoint shared by every run with these task,"
        " model, sampling and warm-up settings (once; about 20-60 s on a CPU core)"
    )
    store.create_run(run_id, run_record(config, parts=warmup.KEY_FIELDS))
    with (
        LeaseKeeper(take_lease(store, run_id, holder_ended=holder_ended)),
        tempfile.TemporaryDirectory(prefix=f"probepo-{run_id}-") as scratch,
    ):
        ctx = StageContext(store, run_id, 0, config, Path(scratch), should_stop or (lambda: False))
        summary = drive_stage(ctx, warmup.STAGE, runner or InlineRunner(), progress)
    tell(
        f"warm-up: {run_id} ready (accuracy {100 * summary['accuracy']:.1f}% after {summary['steps']} steps)"
    )
    return run_id
