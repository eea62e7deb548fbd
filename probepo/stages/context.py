"""What a stage sees: the store, its place in the run, the run's config, and a stop flag.

A stage reads and writes only through the store, derives all randomness from (run seed, update, stage),
and never imports Prefect or submitit, so it runs the same inline, in a subprocess or in a SLURM job.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probepo import spend
from probepo.config import RunConfig
from probepo.run import distributed
from probepo.run.faults import fault_point
from probepo.store import AlreadyCommitted, ArtifactStore

if TYPE_CHECKING:
    from probepo.stages.policy import PolicyEngines
    from probepo.stages.uploads import CheckpointUploads


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes and Python versions, unlike hash())."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def never_stop() -> bool:
    """The stop flag of work that nothing preempts (inline, a test): it never rises."""
    return False


@dataclass
class StageContext:
    """One stage of one update of one run."""

    store: ArtifactStore
    run_id: str
    update: int
    config: RunConfig
    scratch: Path
    """A local folder for temporary files (large checkpoints are written here, then committed)."""
    should_stop: Callable[[], bool] = field(default=never_stop)
    """True once a preemption signal arrived: stages check it at safe points and commit partial progress."""
    stage_started: float = field(default_factory=time.perf_counter)
    """When the running stage started (perf_counter); commits record the wall time since then."""
    attempt_notes: dict[str, Any] = field(default_factory=dict)
    """What the running attempt reports about itself beyond its commits (e.g. how much committed work it
    resumed from): the driver adds it to the attempt record."""
    engines: PolicyEngines | None = None
    """The engines the runner keeps alive across stages and updates (the inline runner's), or None: the
    stage builds its own on policy k from the store."""
    uploads: CheckpointUploads | None = None
    """The driver's checkpoint uploads beside the updates (a resident driver's), or None: optimize commits
    a checkpoint before it ends (a stage job's process ends with its stage)."""

    def seed(self, stage: str, *extra: object) -> int:
        """The seed of this stage of this update: the same on every attempt, so a rerun is bitwise equal."""
        return derive_seed(self.config.seed, self.update, stage, *extra)

    def read(self, stage: str, update: int | None = None) -> Mapping[str, bytes]:
        """Files of a committed stage (checksums verified by the store)."""
        return self.store.read_stage(self.run_id, self.update if update is None else update, stage)

    def commit_own(self, stage: str, files: Mapping[str, bytes], summary: Mapping[str, Any]) -> None:
        """Commit a sub-stage this rank made alone (a shard of generation), with no rank waiting for another:
        the fault points see this rank's own stop flag (the agreed one is a collective)."""
        summary = {**summary, "wall_s": round(time.perf_counter() - self.stage_started, 4)}
        stop_here = distributed.own_flag(self.should_stop)
        fault_point(self.update, stage, "before-commit", stop_here)
        with spend.timed("commit"):
            self.store.commit_stage(self.run_id, self.update, stage, files, summary=summary)
        fault_point(self.update, stage, "after-commit", stop_here)

    def commit(
        self,
        stage: str,
        files: Mapping[str, bytes | PathLike[str]],
        summary: Mapping[str, Any],
        update: int | None = None,
    ) -> dict:
        """Commit a stage's (or a partial sub-stage's) outputs; returns the marker. The summary gets the
        stage's wall time so far (`wall_s`). On the ranks of a distributed stage every rank calls it, each
        with the files as its node's scratch holds them (the trainer's ranks each save their optimizer
        shard on their own node): each node's leader uploads the files only its node has, rank 0 the rest,
        and rank 0 creates the marker once all are up; every rank returns it, or raises the same error."""
        update = self.update if update is None else update
        summary = {**summary, "wall_s": round(time.perf_counter() - self.stage_started, 4)}
        fault_point(update, stage, "before-commit", self.should_stop)
        with spend.timed("commit"):
            if distributed.world_size() == 1:
                marker = self.store.commit_stage(self.run_id, update, stage, files, summary=summary)
            else:
                marker = self._commit_from_every_node(stage, update, files, summary)
        fault_point(update, stage, "after-commit", self.should_stop)
        return marker

    def _commit_from_every_node(
        self, stage: str, update: int, files: Mapping[str, bytes | PathLike[str]], summary: Mapping[str, Any]
    ) -> dict:
        # Every rank reaches this commit before rank 0 makes it: no rank can then read the store's
        # progress (committed shards, parts) in a state another rank did not see.
        distributed.barrier()
        attempt, lost = None, None
        if distributed.rank() == 0:
            try:
                attempt = self.store.begin_commit(self.run_id, update, stage)
            except AlreadyCommitted as exc:
                lost = exc
        self._stop_at_a_lost_race(lost, stage, update)
        attempt = distributed.broadcast_json(attempt)
        owners = file_owners(files)
        mine = {name: files[name] for name, owner in owners.items() if owner == distributed.rank()}
        uploaded: dict[str, dict] = {}
        for part in distributed.all_gather_json(
            self.store.upload_attempt_files(self.run_id, update, stage, attempt, mine)
        ):
            uploaded.update(part)
        marker = None
        if distributed.rank() == 0:
            try:
                marker = self.store.finish_commit(
                    self.run_id, update, stage, attempt, uploaded, summary=summary
                )
            except AlreadyCommitted as exc:
                lost = exc
        self._stop_at_a_lost_race(lost, stage, update)
        return marker or self.store.marker(self.run_id, update, stage) or {}

    def _stop_at_a_lost_race(self, lost: AlreadyCommitted | None, stage: str, update: int) -> None:
        """Every rank raises AlreadyCommitted where rank 0 found another attempt's marker (collective)."""
        if distributed.any_rank(lost is not None):
            winner = self.store.marker(self.run_id, update, stage)
            raise lost or AlreadyCommitted(self.run_id, update, stage, winner)


def file_owners(files: Mapping[str, bytes | PathLike[str]]) -> dict[str, int]:
    """Which rank uploads each file of a distributed commit (collective): rank 0 all it holds (its bytes,
    its node's files), each other node's leader what its node alone holds. Raises FileNotFoundError on
    every rank, naming them, where a file some rank names is on no node."""

    def held(value: bytes | PathLike[str]) -> bool:
        if isinstance(value, bytes | bytearray | memoryview):
            return distributed.rank() == 0
        return distributed.is_node_leader() and Path(value).is_file()

    offered = [name for name, value in files.items() if held(value)]
    named: set[str] = set()
    owners: dict[str, int] = {}
    for rank, (names, holds) in enumerate(distributed.all_gather_json([sorted(files), offered])):
        named.update(names)
        for name in holds:
            owners.setdefault(name, rank)
    missing = sorted(named - set(owners))
    if missing:
        raise FileNotFoundError(f"no node of the job holds {', '.join(missing)} to commit")
    return owners
