"""The run ledger: what is committed for each update and stage, where to resume, the latest checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from probepo.store.keys import CHECKPOINT_STAGE
from probepo.store.lease import read_lease
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
        with_checkpoint = [update for update, stages in self.entries().items() if CHECKPOINT_STAGE in stages]
        return max(with_checkpoint, default=None)

    def summary(self) -> str:
        """A human summary: run, lease, latest checkpoint, committed stages per update, attempts."""
        run = self.store.read_run(self.run_id)
        entries = self.entries()
        attempts = self.store.attempts(self.run_id)
        lease = read_lease(self.store, self.run_id)
        lines = [f"run {self.run_id} in {self.store.url}"]
        if isinstance(run.get("code_version"), str):
            lines.append(f"  code version: {run['code_version']}")
        lines.append(
            "  lease: none"
            if lease is None
            else f"  lease: {lease.get('holder')} on {lease.get('host')} until {lease.get('expires_at')}"
        )
        latest = self.latest_checkpoint()
        lines.append(f"  latest checkpoint: {'none' if latest is None else f'update {latest}'}")
        lines.append(f"  updates with commits: {len(entries)}")
        for update, stages in entries.items():
            main = [name for name in stages if "." not in name]
            partial_count = len(stages) - len(main)
            extra = f" (+{partial_count} partial)" if partial_count else ""
            lines.append(f"    {update:6d}: {', '.join(main) or '-'}{extra}")
        outcomes: dict[str, int] = {}
        for record in attempts:
            outcome = str(record.get("outcome", "unknown")).split(":")[0]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        described = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
        lines.append(f"  attempts: {len(attempts)}" + (f" ({described})" if described else ""))
        if attempts:
            last = (
                attempts[-1] if len(attempts) == 1 else max(attempts, key=lambda r: str(r.get("start", "")))
            )
            lines.append(
                f"  last attempt: update {last.get('update')} stage {last.get('stage')} "
                f"on {last.get('host')} job {last.get('job_id')} -> {last.get('outcome')}"
            )
        return "\n".join(lines)
