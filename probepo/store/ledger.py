"""The run ledger: what is committed for each update and stage, where to resume, the latest checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from probepo.run.schedule import Stage, stages_for_update
from probepo.store.formats import format_bytes
from probepo.store.lease import holder_is_dead, read_lease
from probepo.store.records import AttemptOutcome
from probepo.store.retention import checkpoint_markers, holds
from probepo.store.store import ArtifactStore


@dataclass(frozen=True)
class ResumePoint:
    """The first (update, stage) not committed, and that stage's committed partial sub-stages.

    When every stage of every update is committed, `update == num_updates` and `stage is None`.
    """

    update: int
    stage: str | None
    partials: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.stage is None


class Ledger:
    """A read-only view of one run's commits (one listing of the ledger per query)."""

    def __init__(self, store: ArtifactStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def entries(self) -> dict[int, list[str]]:
        """Committed stages (and sub-stages) per update."""
        return self.store.ledger_entries(self.run_id)

    def resume_point(
        self, stage_order: Sequence[str] | Callable[[int], Sequence[str]], num_updates: int
    ) -> ResumePoint:
        """Where a resumed run starts: the first stage not committed in updates 0..n-1, walking
        `stage_order` (the same stages every update, or a function of the update)."""
        entries = self.entries()
        for update in range(num_updates):
            committed = set(entries.get(update, []))
            for stage in stage_order(update) if callable(stage_order) else stage_order:
                if stage not in committed:
                    partials = sorted(name for name in committed if name.startswith(stage + "."))
                    return ResumePoint(update, stage, partials)
        return ResumePoint(num_updates, None, [])

    def latest_checkpoint(self) -> int | None:
        """The highest update with a committed `checkpoint` stage, or None."""
        with_checkpoint = [update for update, stages in self.entries().items() if Stage.CHECKPOINT in stages]
        return max(with_checkpoint, default=None)

    def stage_order(self) -> tuple[Callable[[int], Sequence[str]], int] | None:
        """(stages of update k, number of updates + 1) from the run's frozen recipe and its extensions,
        read as plain JSON (no validation: a recipe this code can no longer load still has a status); a
        warm-up run is its single stage. None when run.json holds no recipe of this shape."""
        config = self.store.read_run(self.run_id).get("config")
        try:
            if "num_updates" not in config:
                return (lambda update: [Stage.WARMUP]), 1
            extended = [int(e["to"]) for e in self.store.extensions(self.run_id)]
            updates = max([int(config["num_updates"]), *extended])
            every = int(config.get("eval", {}).get("every", 1))
        except (TypeError, ValueError, KeyError, AttributeError):
            return None
        return partial(stages_for_update, num_updates=updates, eval_every=every), updates + 1

    def summary(self) -> str:
        """A human summary: the recipe, where the run stands (complete, or the exact resume point), its
        lease, latest checkpoint, committed stages per update (with what is in flight), and attempts
        (those killed outright marked dead)."""
        run = self.store.read_run(self.run_id)
        config = run.get("config")
        entries = self.entries()
        schedule = self.stage_order()
        start = None if schedule is None else self.resume_point(*schedule)
        lines = [f"run {self.run_id} in {self.store.url}"]
        recipe = [str(config.get("algo", {}).get("algorithm", "warm-up"))] if isinstance(config, dict) else []
        if schedule is not None and "num_updates" in config:
            recipe.append(f"{schedule[1] - 1} updates")
            recipe += [
                f"extended from {e['from']} to {e['to']} at {e['at'][:19]}Z"
                for e in self.store.extensions(self.run_id)
            ]
        recipe.append(f"code version {run.get('code_version', 'unknown')}")
        lines.append(f"  recipe: {', '.join(recipe)}")
        attempts = self.store.attempts(self.run_id)
        if schedule is not None and "num_updates" in config:
            lines += _determinism_lines(config.get("determinism", "bitwise"), attempts)
        if start is None:
            lines.append("  status: unknown (run.json holds no recipe this version can read)")
        elif start.done:
            lines.append("  status: complete")
        else:
            inside = f" (committed inside it: {', '.join(start.partials)})" if start.partials else ""
            lines.append(f"  status: resumes at update {start.update}, stage {start.stage}{inside}")
        lines.append(f"  lease: {self._lease_line()}")
        lines += [
            f"  cancelled at {c['at'][:19]}Z by {c.get('by', '?')} ({len(c.get('jobs', []))} jobs ended)"
            for c in self.store.cancellations(self.run_id)
        ]
        latest = self.latest_checkpoint()
        lines.append(f"  latest checkpoint: {'none' if latest is None else f'update {latest}'}")
        if latest is not None:
            lines.append(f"  checkpoints: {self._checkpoints_line()}")
        lines.append(f"  updates with commits: {len(entries)}")
        for update, stages in entries.items():
            whole = [name for name in stages if "." not in name]
            parts: dict[str, int] = {}
            for name in stages:
                stage = name.split(".")[0]
                if "." in name and stage not in whole:  # parts of a stage not yet committed: in flight
                    parts[stage] = parts.get(stage, 0) + 1
            flight = "; in flight: " + ", ".join(f"{s} ({n} part(s) committed)" for s, n in parts.items())
            lines.append(f"    {update:6d}: {', '.join(whole) or '-'}{flight if parts else ''}")
        lines += self._attempt_lines(attempts, entries, start is not None and start.done)
        return "\n".join(lines)

    def _checkpoints_line(self) -> str:
        """What the checkpoints hold and weigh, and what retention freed of them."""
        markers = checkpoint_markers(self.store, self.run_id)
        by_holds: dict[str, list[int]] = {}
        for update, marker in sorted(markers.items()):
            by_holds.setdefault(holds(marker), []).append(update)
        kept = sum(entry["size"] for marker in markers.values() for entry in marker["files"].values())
        freed = sum(
            entry["size"]
            for marker in markers.values()
            for entry in (marker.get("pruned") or {}).get("files", {}).values()
        )
        what = {"full": "whole", "weights": "weights only", "record": "deleted"}
        counts = ", ".join(
            f"{len(updates)} {what[kind]} ({_updates(updates)})" for kind, updates in by_holds.items()
        )
        return f"{counts}; {format_bytes(kept)} kept" + (
            f", {format_bytes(freed)} freed by retention" if freed else ""
        )

    def _lease_line(self) -> str:
        lease = read_lease(self.store, self.run_id)
        if lease is None:
            return "none"
        line = f"{lease.get('holder')} on {lease.get('host')} until {lease.get('expires_at')}"
        if holder_is_dead(lease):
            line += " (its process is gone: the next train or resume takes the run over)"
        return line

    def _attempt_lines(
        self, attempts: list[dict], entries: dict[int, list[str]], complete: bool
    ) -> list[str]:
        by_stage: dict[tuple[int, str], list[dict]] = {}
        for record in attempts:
            by_stage.setdefault((record.get("update", 0), record.get("stage", "")), []).append(record)

        def outcome(record: dict) -> str:
            said = AttemptOutcome.of(record)
            if said is None:
                return "unknown"
            if said != AttemptOutcome.RUNNING:
                return said
            key = (record.get("update", 0), record.get("stage", ""))
            superseded = record is not by_stage[key][-1] or key[1] in entries.get(key[0], [])
            return "dead" if complete or superseded or holder_is_dead(record) else "running"

        counts: dict[str, int] = {}
        for record in attempts:
            counts[outcome(record)] = counts.get(outcome(record), 0) + 1
        described = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
        lines = [f"  attempts: {len(attempts)}" + (f" ({described})" if described else "")]
        if attempts:
            last = max(attempts, key=lambda r: str(r.get("start", "")))
            job = f", SLURM job {last['job_id']}" if last.get("job_id") else ""
            ended = f"ended {last['end']}" if last.get("end") else "never ended"
            lines.append(
                f"  last attempt: update {last.get('update')} stage {last.get('stage')} on {last.get('host')}"
                f" (pid {last.get('pid')}{job}; started {last.get('start')}, {ended}) -> {outcome(last)}"
            )
        return lines


DETERMINISM_PROMISES = {
    "bitwise": "a replay must reproduce the weights it committed",
    "fast": "replays are checked but not expected to match",
}
"""What `store ls` says each RunConfig.determinism promises of the replays (docs/DETERMINISM.md)."""


def _determinism_lines(determinism: str, attempts: list[dict]) -> list[str]:
    """The run's determinism and what its replays did: how many optimize stages were replayed (checked
    against the fingerprints they committed) and which did not reproduce their weights."""
    lines = [
        f"  determinism: {determinism} ({DETERMINISM_PROMISES.get(determinism, 'unknown to this code')})"
    ]
    replayed = sum(int(record.get("replayed_updates", 0)) for record in attempts)
    if replayed:
        diverged = sorted({u for record in attempts for u in record.get("replay_diverged", [])})
        verdict = f"updates {_updates(diverged)} did not (replay_diverged)" if diverged else "all matched"
        lines.append(f"  replays: {replayed} optimize stage(s) replayed and checked, {verdict}")
    return lines


def _updates(updates: list[int], shown: int = 6) -> str:
    """A list of updates as people read it: all of a few, else the first and last ones."""
    if len(updates) <= shown:
        return ", ".join(map(str, updates))
    return f"{', '.join(map(str, updates[:3]))}, …, {', '.join(map(str, updates[-2:]))}"
