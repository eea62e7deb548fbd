"""Checkpoint retention: deleting the optimizer state, then the weights, of full checkpoints a run no
longer needs (probepo.config.retention.Retention says which), and the optimizer's parts of every update
whose optimize is committed (`prune_parts`: nothing reads them then).

A checkpoint's marker says what it still holds. Pruning first replaces the marker (a conditional write on
its current version) with one whose `files` lists only what is kept and whose `pruned` names what went,
then deletes those files: a reader that reads the marker never meets a listed file that is gone, `store
verify` checks exactly what is listed, and the ledger still records that the checkpoint was committed
(a resume point never moves back). A crash between the two steps leaves unlisted files that
`sweep_pruned` (`probepo store gc --checkpoints`) deletes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from probepo.config.retention import Retention
from probepo.run.schedule import Stage, is_optimizer_state
from probepo.store.errors import StoreError
from probepo.store.formats import to_json_bytes
from probepo.store.keys import RunLayout, utc_now

if TYPE_CHECKING:
    from probepo.store.store import ArtifactStore

Holds = Literal["full", "weights", "record"]
"""What a committed checkpoint still holds: everything; its weights (config, tokenizer, trainer.json
included) without the optimizer state; or nothing but the record that it was committed."""
_ORDER: dict[Holds, int] = {"record": 0, "weights": 1, "full": 2}
log = logging.getLogger("probepo.store")


def holds(marker: Mapping[str, Any]) -> Holds:
    """What a checkpoint's marker says it still holds."""
    return (marker.get("pruned") or {}).get("kept", "full")


def plan_retention(
    checkpoints: Mapping[int, Holds], retention: Retention, pending: Iterable[int] = ()
) -> dict[int, Holds]:
    """What each checkpoint is to hold under `retention` ({update: what it holds now} in): the optimizer state
    of the last `optimizer_last` full ones, the weights of every `weights_every`-th update's and of the
    `pending` (still to be evaluated); never more than it holds now. Only the checkpoints that change."""
    full = sorted(update for update, now in checkpoints.items() if now == "full")
    keep_state = set(full if retention.optimizer_last is None else full[-retention.optimizer_last :])
    keep_weights = set(pending)
    changes: dict[int, Holds] = {}
    for update, now in checkpoints.items():
        target: Holds = (
            "full"
            if update in keep_state
            else "weights"
            if update % retention.weights_every == 0 or update in keep_weights
            else "record"
        )
        if _ORDER[target] < _ORDER[now]:
            changes[update] = target
    return changes


@dataclass
class RetentionReport:
    """What a retention pass did (or would do, in a dry run), and the bytes of checkpoints it left."""

    pruned: dict[int, Holds] = field(default_factory=dict)
    """Checkpoints pruned now: {update: what each still holds}."""
    freed_bytes: int = 0
    kept_bytes: int = 0
    """Bytes of every checkpoint of the run after the pass."""
    held: dict[int, Holds] = field(default_factory=dict)
    """What every checkpoint holds after the pass."""


def checkpoint_markers(
    store: ArtifactStore, run_id: str, entries: Mapping[int, list[str]] | None = None
) -> dict[int, dict[str, Any]]:
    """Every committed checkpoint's marker, by update (`entries`: the run's ledger, if already listed)."""
    found = {}
    for update, stages in (store.ledger_entries(run_id) if entries is None else entries).items():
        if Stage.CHECKPOINT in stages and (marker := store.marker(run_id, update, Stage.CHECKPOINT)):
            found[update] = marker
    return found


def apply_retention(
    store: ArtifactStore,
    run_id: str,
    retention: Retention,
    pending: Iterable[int] = (),
    *,
    markers: Mapping[int, dict[str, Any]] | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Prune the run's checkpoints as `retention` says, keeping the weights of `pending` ones (`markers`:
    the checkpoints' markers, if already read). Run it where the run's lease is held (the driver, `probepo
    store gc`): two pruners of one checkpoint would race."""
    markers = dict(checkpoint_markers(store, run_id) if markers is None else markers)
    changes = plan_retention({u: holds(m) for u, m in markers.items()}, retention, pending)
    report = RetentionReport()
    for update, target in sorted(changes.items()):
        freed, markers[update] = _prune(store, markers[update], target, dry_run=dry_run)
        report.freed_bytes += freed
        report.pruned[update] = target
    for update, marker in sorted(markers.items()):
        report.held[update] = holds(marker)
        report.kept_bytes += sum(entry["size"] for entry in marker["files"].values())
    if report.pruned and not dry_run:
        log.info("run %s: checkpoints pruned %s, %d bytes freed", run_id, report.pruned, report.freed_bytes)
    return report


def _prune(
    store: ArtifactStore, marker: dict[str, Any], target: Holds, *, dry_run: bool
) -> tuple[int, dict[str, Any]]:
    """Replace the marker by one holding `target`, then delete the files it no longer lists; returns the
    bytes freed and the new marker."""
    run_id, update = marker["run_id"], marker["update"]
    drop = {
        name: entry
        for name, entry in marker["files"].items()
        if target == "record" or is_optimizer_state(name)
    }
    freed = sum(entry["size"] for entry in drop.values())
    pruned = marker.get("pruned") or {"files": {}}
    updated = {
        **marker,
        "files": {name: entry for name, entry in marker["files"].items() if name not in drop},
        "pruned": {"kept": target, "at": utc_now(), "files": {**pruned["files"], **drop}},
    }
    if dry_run:
        return freed, updated
    stage = marker["stage"]
    key = RunLayout(run_id).marker(update, stage)
    current = store.objects.get_versioned(key)
    changed = f"the marker of {stage} {update} of run {run_id!r} changed while pruning it: run again"
    if current is None or store.parse_marker(current.data, run_id, update, stage) != marker:
        raise StoreError(changed)
    if store.objects.put_if_match(key, to_json_bytes(updated), current.etag) is None:
        raise StoreError(changed)
    _delete(store, updated, drop)
    return freed, updated


def _delete(store: ArtifactStore, marker: Mapping[str, Any], names: Iterable[str]) -> None:
    layout = RunLayout(marker["run_id"])
    for name in names:
        store.objects.delete(layout.data_key(marker["update"], marker["stage"], marker["attempt"], name))


PART_PREFIX = f"{Stage.OPTIMIZE}.part-"
"""The optimizer's parts of an update (`optimize.part-NNNN`): its trainer state after a mini-batch, where a
stopped optimize resumes."""


def is_part(stage: str) -> bool:
    return stage.startswith(PART_PREFIX)


def prune_parts(
    store: ArtifactStore,
    run_id: str,
    updates: Iterable[int] | None = None,
    *,
    entries: Mapping[int, list[str]] | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Delete the files of the optimizer's parts of `updates` (None: every update) whose optimize and
    checkpoint k + 1 are committed: no stage reads them again. Each part's marker is rewritten first (the
    record of its commit stays, `pruned` naming its files), then its files go; `pruned` reports each
    update's parts as "record"."""
    entries = store.ledger_entries(run_id) if entries is None else entries
    report = RetentionReport()
    for update in sorted(entries if updates is None else updates):
        stages = entries.get(update, [])
        done = Stage.OPTIMIZE in stages and Stage.CHECKPOINT in entries.get(update + 1, [])
        for part in (p for p in stages if is_part(p)) if done else ():
            marker = store.marker(run_id, update, part)
            if marker is not None and marker["files"]:
                freed, _ = _prune(store, marker, "record", dry_run=dry_run)
                report.freed_bytes += freed
                report.pruned[update] = "record"
    if report.pruned and not dry_run:
        log.info(
            "run %s: optimizer parts of updates %s pruned, %d bytes freed",
            run_id,
            sorted(report.pruned),
            report.freed_bytes,
        )
    return report


def sweep_pruned(store: ArtifactStore, run_id: str) -> int:
    """Delete the files pruned checkpoints and parts no longer list but that a pruner stopped between its
    two steps left behind; returns how many there were."""
    swept = 0
    layout = RunLayout(run_id)
    entries = store.ledger_entries(run_id)
    pruned = [
        marker
        for update, stages in entries.items()
        for stage in stages
        if (stage == Stage.CHECKPOINT or is_part(stage)) and (marker := store.marker(run_id, update, stage))
    ]
    for marker in pruned:
        gone = (marker.get("pruned") or {}).get("files", {})
        if not gone:
            continue
        folder = layout.attempt_dir(marker["update"], marker["stage"], marker["attempt"])
        present = {info.key[len(folder) :] for info in store.objects.list(folder)}
        left = [name for name in gone if name in present]
        _delete(store, marker, left)
        swept += len(left)
    return swept
