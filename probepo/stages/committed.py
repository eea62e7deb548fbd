"""Policy k as the store holds it: what its checkpoint still holds and which update's checkpoint is full
(the facts `location.locate` decides on), fetching a committed policy into the node's scratch, and saving
a trainer's state there to be committed. The engines on policy k: policy.py; rebuilding one by replay:
replay.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from probepo import spend
from probepo.engines.base import TrainerEngine
from probepo.run import distributed
from probepo.run.schedule import Stage, is_optimizer_state, optimizer_shard_rank
from probepo.stages.common import policy_files
from probepo.stages.context import StageContext
from probepo.stages.location import Committed
from probepo.store.retention import holds


def at_update(ctx: StageContext, update: int) -> StageContext:
    """The same stage context, pointed at another update of the run."""
    return replace(ctx, update=update)


def fetch_policy(ctx: StageContext, stage: str = Stage.CHECKPOINT, *, optimizer_state: bool = True) -> Path:
    """Download the policy committed as `stage` of this update (by default checkpoint k, i.e. policy k, in
    full) into scratch; returns its folder. Without `optimizer_state` only what generation reads (weights,
    config, tokenizer): at 7B the optimizer state is most of a checkpoint's bytes. A file already there is
    not fetched again (each appears only once verified). On the ranks of a distributed stage each node's
    leader downloads into its node's scratch what the node's ranks read (of the optimizer shards, only
    theirs), the node's other ranks wait (collective)."""
    update = ctx.update
    folder = ctx.scratch / f"policy-{update:06d}-{stage}"
    ranks_here = distributed.node_ranks()
    if distributed.is_node_leader():
        folder.mkdir(parents=True, exist_ok=True)
        names = ctx.store.read_stage(ctx.run_id, update, stage).marker["files"]
        for name in files_for_node(names, ranks_here, optimizer_state=optimizer_state):
            if not (folder / name).exists():
                landed = ctx.store.download_stage_file(ctx.run_id, update, stage, name, folder / name)
                spend.count("scratch", landed.stat().st_size)
        note_scratch(ctx)
    distributed.barrier()
    return folder


def files_for_node(names: Iterable[str], ranks: Iterable[int], *, optimizer_state: bool) -> list[str]:
    """The files of a checkpoint that a node whose ranks are `ranks` reads: all but the optimizer state,
    and with `optimizer_state` the optimizer files its ranks load (a sharded optimizer's shards of those
    ranks alone, each rank loading only its own)."""
    ranks = set(ranks)

    def wanted(name: str) -> bool:
        if not is_optimizer_state(name):
            return True
        shard = optimizer_shard_rank(name)
        return optimizer_state and (shard is None or shard in ranks)

    return [name for name in names if wanted(name)]


def committed_policy(ctx: StageContext) -> Committed:
    """What the store holds of policy k, for `locate`: what checkpoint k still holds, and the latest full
    checkpoint c <= k (k itself where checkpoint k is full: the ledger is not listed then)."""
    marker = ctx.store.marker(ctx.run_id, ctx.update, Stage.CHECKPOINT)
    checkpoint = None if marker is None else holds(marker)
    return Committed(checkpoint, ctx.update if checkpoint == "full" else latest_full_checkpoint(ctx))


def latest_full_checkpoint(ctx: StageContext) -> int | None:
    """The latest update c <= k whose policy is committed in full (weights and optimizer state: retention
    may have pruned the optimizer state of older ones); None where there is none."""
    for update in _committed_checkpoints(ctx):
        if holds(ctx.store.marker(ctx.run_id, update, Stage.CHECKPOINT) or {}) == "full":
            return update
    return None


def no_full_checkpoint(ctx: StageContext) -> RuntimeError:
    """The error of a run that has no full checkpoint c <= k to rebuild policy k from."""
    committed = _committed_checkpoints(ctx)
    pruned = (
        f" (retention pruned the optimizer state of checkpoints {sorted(committed)})" if committed else ""
    )
    return RuntimeError(
        f"run {ctx.run_id} has no committed full checkpoint at or before update {ctx.update}{pruned}"
    )


def _committed_checkpoints(ctx: StageContext) -> list[int]:
    """The updates <= k whose checkpoint is committed, latest first."""
    entries = ctx.store.ledger_entries(ctx.run_id)
    return sorted(
        (u for u, stages in entries.items() if u <= ctx.update and Stage.CHECKPOINT in stages), reverse=True
    )


@contextmanager
def saved_trainer(
    ctx: StageContext, engine: TrainerEngine, folder: Path, *, handed_on: bool = False
) -> Iterator[dict[str, Path]]:
    """The trainer's state saved into `folder` of the scratch, counted: the files for the block to commit.
    The folder goes after the block (its node's leader removes it): nothing reads a saved state back from
    scratch (a later stage takes it from the resident engine or the store), so a node's scratch holds one
    save at a time, not every part and checkpoint of a job. `handed_on`: the block hands the folder to an
    upload beside the updates (uploads.py), which removes it; it goes here only if the block fails."""
    try:
        with spend.timed("save"):
            engine.save(folder)
        files = policy_files(folder)
        spend.count("scratch", sum(path.stat().st_size for path in files.values()))
        note_scratch(ctx)
        yield files
    except BaseException:
        handed_on = False
        raise
    finally:
        if not handed_on and distributed.is_node_leader():
            shutil.rmtree(folder, ignore_errors=True)


def note_scratch(ctx: StageContext) -> None:
    """The scratch folder's bytes now, for the attempt's peak (after a save or a download: the moments
    it grows)."""
    spend.note_scratch(sum(path.stat().st_size for path in ctx.scratch.rglob("*") if path.is_file()))
