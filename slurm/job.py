"""What runs inside a stage's job (local subprocess or SLURM), or inside the resident executor's one job
that runs the driver itself: the preemption-aware wrapper.

submitit's own handlers do not fit a stage: on USR2 they checkpoint and exit at once, and they ignore
SIGTERM, so nothing waits for a stage to commit. Here USR2 and SIGTERM raise the stage's stop flag; the
stage commits its progress at its next safe point (a shard of sample or probe, a mini-batch of optimize;
the short stages simply rerun) and raises Preempted; then the job requeues itself (`scontrol requeue`),
so the same job id runs again later and resumes from those commits — unless the run was cancelled since
the job started (the canceller records it in the store before `scancel`'s SIGTERM arrives). The local
executor has no queue: its preempted job just ends, and the driver submits the stage again. A driver job
does the same: its stage commits at the safe point, its driver stops, and the job requeues itself; run
again, the driver resumes from the store (replaying optimize since the last full checkpoint).
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from probepo.run import distributed
from probepo.run.execution import InlineRunner, LockstepRunner, StageRequest, execute_stage, follow_stages
from probepo.run.preemption import PREEMPTED_EXIT, Preempted, StopFlag
from probepo.run.schedule import EVERY_RANK
from probepo.store import AlreadyCommitted, ArtifactStore, JobOutcome, StoreOutage
from probepo.store.outage import RIDER, STORE_UNREACHABLE_EXIT, OutageBudget
from slurm.ranks import Ranks, job_ranks


def _install_stop_flag() -> StopFlag:
    """USR2 (SLURM's warning before a time limit or at preemption) and SIGTERM raise the flag, replacing
    the handlers submitit installed before calling us."""
    flag = StopFlag()
    for signum in (signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, flag.signalled)
    return flag


def requeue_self() -> bool:
    """Put this SLURM job back in the queue (same job id, runs again later); False outside SLURM. A job
    that SLURM is already requeueing (preempted, `scontrol requeue` from outside, its node failed) refuses
    a second request; it goes back to the queue all the same."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return False
    asked = subprocess.run(["scontrol", "requeue", job_id], timeout=60, capture_output=True, text=True)
    if asked.returncode != 0:
        print(f"probepo: scontrol requeue {job_id}: {asked.stderr.strip()}", file=sys.stderr, flush=True)
    return True


RESTARTS_BEFORE_GIVING_UP = 3
"""An array task requeued this many times that stops again without committing anything new leaves instead of
requeueing itself (its progress stays for the next night): a task whose shards take longer than its time
limit must not requeue forever."""


class TaskAbandoned(BaseException):
    """Raised by an array task's stop signal out of whatever the task was doing. Not an Exception, so that
    no engine's or library's `except Exception` takes it for an error of its own."""


class AbandoningStop(StopFlag):
    """An array task's stop flag. USR2 (a preemption, or the time limit's warning `signal_grace_s` before
    it) or SIGTERM raises it and abandons what the task is doing at once (TaskAbandoned): the engine call in
    flight, the grading, a download. Only a commit (`held`) is never cut: a stop during one takes effect as
    it ends. Every write of an evaluation is one object, whole or absent, so an abandoned task leaves what a
    killed one would, tidily: the grace window need only cover the task's leaving (seconds), never a shard
    of work. `commits`: how many held sections this run of the task completed (its progress)."""

    def __init__(self) -> None:
        super().__init__()
        self.commits = 0
        self._holding = False
        self._settled = False

    def settle(self) -> None:
        """The work is over (returned, or stopped): a signal from now on only raises the flag, as the
        SIGTERM of the task's own `scontrol requeue` does."""
        self._settled = True

    def _abandon(self) -> None:
        if not self._settled:  # once: the unwinding's cleanup must not be cut again
            self._settled = True
            raise TaskAbandoned(f"stopped by a signal after {self.commits} commits of this run")

    def signalled(self, signum: int | None = None, frame: object = None) -> None:
        super().signalled(signum, frame)
        if not self._holding:
            self._abandon()

    @contextmanager
    def held(self) -> Iterator[None]:
        """A commit: a stop signal inside waits for its end."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.commits += 1
        if self.raised:
            self._abandon()

    def install(self) -> AbandoningStop:
        for signum in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(signum, self.signalled)
        return self


def run_array_task(fn: Callable[[Any, Callable[[], bool]], Any], item: Any) -> Any:
    """One task of a job array: `fn(item, should_stop)` under an AbandoningStop, which USR2 (a preemption,
    or the time limit's warning `signal_grace_s` before it) or SIGTERM raises, abandoning `fn` at once but
    for a commit. Stopped (abandoned, or Preempted at a safe point of its own), the task requeues itself
    (`scontrol requeue`: a time limit ends as a preemption does) and its next run, on any node, goes on
    from what was committed; unless it committed nothing new and was requeued RESTARTS_BEFORE_GIVING_UP
    times already, when it fails with that reason."""
    flag = AbandoningStop().install()
    node_local_caches()
    try:
        try:
            return fn(item, flag)
        finally:
            flag.settle()  # from here a signal only raises the flag (our own requeue sends SIGTERM)
    except (Preempted, TaskAbandoned) as exc:
        print(f"probepo: {exc}", file=sys.stderr, flush=True)
        progressed = exc.progressed if isinstance(exc, Preempted) else flag.commits > 0
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if (progressed or restarts < RESTARTS_BEFORE_GIVING_UP) and requeue_self():
            print(
                f"probepo: requeued array task {os.environ.get('SLURM_JOB_ID')}", file=sys.stderr, flush=True
            )
            sys.exit(PREEMPTED_EXIT)  # not an Exception: submitit writes no result for a requeued job
        raise RuntimeError(
            f"{exc}; stopped after {restarts} requeues without committing anything new (or outside SLURM):"
            " its progress is kept for the next run; give the eval_task more time (time_min) if a shard"
            " takes longer than the time limit leaves"
        ) from None


def _rides_out_the_store(job: Callable[[StageRequest, str], JobOutcome]) -> Callable[..., JobOutcome]:
    """A job function that waits for an unreachable store as its runner says (`store_outage`: the profile's
    store_outage_s, never past the job's time limit less its signal grace; probepo/store/outage.py), and
    that, having given up, exits STORE_UNREACHABLE_EXIT: its runner reads a death of the store's and
    submits it again (slurm/job_ends.py)."""

    @functools.wraps(job)
    def riding_out(
        request: StageRequest, job_id_variable: str, store_outage: OutageBudget | None = None
    ) -> JobOutcome:
        budget = RIDER.configured(store_outage) if store_outage is not None else nullcontext()
        try:
            with budget:
                return job(request, job_id_variable)
        except StoreOutage as exc:
            print(f"probepo: {exc}", file=sys.stderr, flush=True)
            sys.exit(STORE_UNREACHABLE_EXIT)  # not an Exception: submitit writes no result, SLURM the status

    return riding_out


@_rides_out_the_store
def run_stage_job(request: StageRequest, job_id_variable: str) -> JobOutcome:
    """Run one stage in this job, whose id is in the environment variable `job_id_variable` (the
    backend's); returns COMMITTED (also when an earlier run of the job committed it). A preempted stage
    requeues its SLURM job and exits with PREEMPTED_EXIT, or ends PREEMPTED locally.

    In a multi-task job (one node or several) the stages of EVERY_RANK run on every rank, in one process
    group, the ranks of each node sharing a scratch folder of that node: the generating stages split their
    chunks over the ranks (each rank commits the shards it makes), the trainer's shard DeepSpeed over them;
    rank 0 records the attempt and commits the stage, each node's leader uploading its node's files. Other
    stages run on rank 0 alone (the other ranks end at once)."""
    flag = _install_stop_flag()
    job_id = os.environ.get(job_id_variable)
    ranks = _ranks_of_this_job()
    if ranks.world_size > 1 and request.stage in EVERY_RANK:
        return _run_distributed(request, flag, ranks.rank, job_id)
    if ranks.rank != 0:
        return JobOutcome.COMMITTED
    from probepo.store import open_store

    store = open_store(request.store_url)
    if store.committed(request.run_id, request.update, request.stage):
        return JobOutcome.COMMITTED
    cancellations = len(store.cancellations(request.run_id))
    with tempfile.TemporaryDirectory(prefix=f"probepo-{request.run_id}-") as scratch:
        try:
            execute_stage(request.context(store, Path(scratch), flag), request.stage, job_id)
        except Preempted as exc:
            return _preempted(store, request, cancellations, exc, job_id)
    return JobOutcome.COMMITTED


def _run_distributed(request: StageRequest, flag: StopFlag, rank: int, job_id: str | None) -> JobOutcome:
    """A stage of EVERY_RANK on every rank of this job (see run_stage_job)."""
    from probepo.stages.runners import STAGES
    from probepo.store import open_store

    store = open_store(request.store_url)
    distributed.join()
    scratch = _node_scratch(request, job_id)
    cancellations = len(store.cancellations(request.run_id))
    preempted = None
    try:
        if not distributed.any_rank(
            rank == 0 and store.committed(request.run_id, request.update, request.stage)
        ):
            ctx = request.context(store, scratch, distributed.agreed(flag))
            if rank == 0:
                execute_stage(ctx, request.stage, job_id)  # records a lost race as such
            else:
                STAGES[request.stage](ctx)
    except AlreadyCommitted:
        pass  # every rank raises it at the same commit
    except Preempted as exc:  # every rank stops at the same safe point
        preempted = exc
    except BaseException:
        _remove_node_scratch(scratch)
        raise  # no barrier: the other ranks fail at their next collective
    distributed.barrier()
    _remove_node_scratch(scratch)
    distributed.leave()
    if preempted is None:
        return JobOutcome.COMMITTED
    if rank == 0:
        return _preempted(store, request, cancellations, preempted, job_id)
    return JobOutcome.PREEMPTED


@_rides_out_the_store
def run_driver_job(request: StageRequest, job_id_variable: str) -> JobOutcome:
    """Run the driver of `request`'s run in this job (the resident executor): every stage left, inline,
    the engines resident, each attempt recording the job's id (from `job_id_variable`); returns COMMITTED
    once the run is complete. Preempted, it requeues as a
    stage job does (the driver's own stop flag catches USR2 and SIGTERM). In a multi-task job every rank
    runs every stage in lockstep (LockstepRunner on rank 0, follow_stages on the others), so DeepSpeed
    shards the trainer over the job's ranks."""
    flag = _install_stop_flag()  # submitit's handlers off until the driver installs its own
    job_id = os.environ.get(job_id_variable)
    ranks = _ranks_of_this_job()
    from probepo.run.pipeline import train
    from probepo.store import open_store
    from slurm.holders import holder_ended

    lockstep = ranks.world_size > 1
    if lockstep:
        distributed.join()
        scratch = _node_scratch(request, job_id)
        if ranks.rank != 0:
            try:
                follow_stages(request, flag, scratch)
            finally:
                _remove_node_scratch(scratch)
            distributed.leave()
            return JobOutcome.COMMITTED
    runner = LockstepRunner(scratch, job_id) if lockstep else InlineRunner(job_id)
    store = open_store(request.store_url)
    cancellations = len(store.cancellations(request.run_id))
    say = lambda line: print(line, flush=True)  # noqa: E731
    # beside the job's logs: <job folder>/<run id>/tensorboard, where a flow's driver writes its own
    events = Path(os.environ["SUBMITIT_FOLDER"]) / "tensorboard" if "SUBMITIT_FOLDER" in os.environ else None
    try:
        # a resubmitted job takes over at once the lease of the job it replaces, which accounting shows ended
        train(
            request.config,
            request.run_id,
            store=store,
            say=say,
            runner=runner,
            tensorboard_dir=events,
            holder_ended=holder_ended,
            retention=request.retention,
            signal_grace_s=request.signal_grace_s,
        )
    except Preempted as exc:
        _finish_lockstep(runner)
        return _preempted(store, request, cancellations, exc, job_id)
    except BaseException:
        if isinstance(runner, LockstepRunner):
            _remove_node_scratch(runner.scratch)  # a checkpoint's worth of files on the node's disk
        raise  # the other ranks fail at their next collective
    _finish_lockstep(runner)
    return JobOutcome.COMMITTED


def _finish_lockstep(runner: InlineRunner) -> None:
    """Rank 0 of a multi-task driver job, done: release the other ranks, leave the group."""
    if isinstance(runner, LockstepRunner):
        runner.finish()
        _remove_node_scratch(runner.scratch)
        distributed.leave()


def _ranks_of_this_job() -> Ranks:
    """This task's ranks, exported for torch.distributed and DeepSpeed, and said in the task's log; its
    compile caches on its node (node_local_caches)."""
    ranks = job_ranks()
    ranks.export()
    node_local_caches()
    if ranks.world_size > 1:
        print(f"probepo: {ranks.describe()}", flush=True)
    return ranks


NODE_LOCAL_CACHES = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "CUDA_CACHE_PATH": "cuda",
}
"""The compile and kernel caches a rank writes, by the variable that moves each and its folder: vLLM's
(~/.cache/vllm, its torch.compile cache in it), Triton's (~/.triton), torch Inductor's and CUDA's PTX JIT
cache (~/.nv/ComputeCache). Left alone, most live under $HOME, on a cluster the shared file system, every
rank of every node writing them at once."""

_held_cache_slots: list[int] = []
"""The open lock of this process's cache slot (node_local_caches), held until the process ends."""


def node_local_caches() -> dict[str, str]:
    """Point this process's compile and kernel caches (NODE_LOCAL_CACHES) at a slot of its node's
    `$TMPDIR/probepo-caches-<uid>/`: the first slot no live process holds, locked until this one ends, so
    no two processes of a node (the ranks of a job, the tasks of an array) ever write one cache while a
    later job on the node reuses what an earlier one compiled. A variable the job sets already (a setup
    line's `export`) is kept. Returns what it set."""
    wanted = [name for name in NODE_LOCAL_CACHES if not os.environ.get(name)]
    if not wanted:
        return {}
    root = Path(tempfile.gettempdir()) / f"probepo-caches-{os.getuid()}"
    slot = 0
    while True:
        folder = root / f"slot{slot}"
        folder.mkdir(parents=True, exist_ok=True)
        lock = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process of this node holds it
            os.close(lock)
            slot += 1
            continue
        _held_cache_slots.append(lock)
        chosen = {name: str(folder / NODE_LOCAL_CACHES[name]) for name in wanted}
        os.environ.update(chosen)
        return chosen


def _node_scratch(request: StageRequest, job_id: str | None) -> Path:
    """The scratch folder of this job on this node (the nodes of a job share no file system here: each
    node's ranks download and save into their own), said in the task's log."""
    scratch = distributed.node_scratch(f"probepo-{request.run_id}-job{job_id}")
    where = f"rank {distributed.rank()}: scratch {scratch} of node {distributed.node_name()}"
    print(f"probepo: {where}", flush=True)
    return scratch


def _remove_node_scratch(scratch: Path) -> None:
    """Rank 0 of each node removes its node's scratch once the node's ranks are done with it."""
    if distributed.is_node_leader():
        shutil.rmtree(scratch, ignore_errors=True)


def _preempted(
    store: ArtifactStore, request: StageRequest, cancellations: int, exc: Preempted, job_id: str | None
) -> JobOutcome:
    """After a preemption: requeue this SLURM job and exit with PREEMPTED_EXIT, unless the run was
    cancelled since the job started (scancel's SIGTERM); outside SLURM, end `preempted`."""
    print(f"probepo: {exc}", file=sys.stderr, flush=True)
    if len(store.cancellations(request.run_id)) > cancellations:
        print(f"probepo: run {request.run_id} was cancelled: no requeue", file=sys.stderr)
        return JobOutcome.CANCELLED
    if requeue_self():
        print(f"probepo: requeued job {job_id}", file=sys.stderr, flush=True)
        sys.exit(PREEMPTED_EXIT)  # not an Exception: submitit writes no result for a requeued job
    return JobOutcome.PREEMPTED
