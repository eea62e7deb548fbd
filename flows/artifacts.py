"""The artifacts a flow run shows: why a run was refused, its progress, metrics and curves while it trains,
where it resumed, and its cost and report at the end. Keys are per run (`<run id>-<what>`), so a run's page
and the artifacts page find them whichever flow run made them."""

from __future__ import annotations

import json
import re
from typing import Any

from prefect import get_client, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.states import Failed, State

from probepo.config import RunConfig
from probepo.report.costs import RunCosts
from probepo.report.live import (
    curves_markdown,
    lead_row,
    rows_by_update,
    significant,
    stage_table,
    updates_done,
)
from probepo.report.summary import load_curves, markdown
from probepo.run.pipeline import resume_point
from probepo.run.schedule import Stage
from probepo.store import ArtifactStore
from probepo.store.outage import RIDER
from slurm.costs import run_costs, stage_totals


def artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{what}".lower()).strip("-")


def refused(what: str, problems: list[str]) -> State:
    """The flow run ends Failed with `problems` in its one-line message, and a markdown artifact listing
    them; nothing was submitted."""
    line = "; ".join(problems)
    get_run_logger().error(f"refused: {line}")
    listed = "\n".join(f"- {item}" for item in problems)
    create_markdown_artifact(
        f"# {what} refused\n\n{listed}\n\nNothing was submitted; fix these and start it again.",
        key=artifact_key(what, "refused"),
        description=f"{what}: why it did not start",
    )
    return Failed(message=f"refused: {line}")


class Published:
    """What a run's page shows while it trains: its progress (a percent to one decimal, which its card's
    description repeats with the updates done of the total), its metrics (the lead table: a row per update
    with the numbers a user scans, `<run id>-metrics`; and every metric by stage, `<run id>-metrics-by-stage`,
    both rounded: probepo/report/live.py) and its curves (held-out accuracy and reward over the whole run,
    charted in markdown). A ProgressFn of the driver (also fed from the store while a resident job runs):
    each stage's summary joins its update's row as it commits, and all four are updated in place when an
    update's optimizer step commits, so the tables hold that update already. Each is one artifact per flow
    run, not a new version per update: a run's key gains one version per flow run that drives it (its start
    and each resume). Where the store stays unreachable, they show what was seen, and say so."""

    def __init__(self, store: ArtifactStore, run_id: str, num_updates: int) -> None:
        self.store, self.run_id, self.num_updates = store, run_id, max(num_updates, 1)
        self.rows: dict[int, dict[str, Any]] = {}
        self._reread("reading the run's metrics for its progress")
        percent, said = self._progress()
        self.progress = create_progress_artifact(
            percent, key=artifact_key(run_id, "progress"), description=said
        )
        by_stage = artifact_key(run_id, "metrics-by-stage")
        self.table = create_table_artifact(
            self._lead(),
            key=artifact_key(run_id, "metrics"),
            description=f"run {run_id}: per update (every metric by stage: {by_stage})",
        )
        self.stage_table = create_table_artifact(
            self._by_stage(), key=by_stage, description=f"run {run_id}: every metric per update, by stage"
        )
        self.curves = create_markdown_artifact(
            self._curves(),
            key=artifact_key(run_id, "curves"),
            description=f"run {run_id}: accuracy and reward by update",
        )

    def __call__(self, update: int, stage: str, summary: dict[str, Any], ran: bool) -> None:
        if stage == Stage.WARMUP:  # a run of its own (shared by others), with its own metrics
            return
        row = self.rows.setdefault(update, {"update": update})
        row.update({f"{stage}/{name}": value for name, value in summary.items()})
        if stage == Stage.OPTIMIZE and ran:
            self._publish()

    def metrics(self) -> None:
        """Progress, tables and curves of every update the store holds (at the end: the final evaluation
        too), in place."""
        self._reread("reading the run's final metrics")
        self._publish()

    def _reread(self, doing: str) -> None:
        """The rows as the store's metrics have them; those seen so far where it stays unreachable."""
        read, records = RIDER.unless_unreachable(doing, lambda: self.store.read_metrics(self.run_id))
        if read:
            self.rows = rows_by_update(records or [])

    def _publish(self) -> None:
        percent, said = self._progress()
        update_progress_artifact(self.progress, percent, description=said)
        with get_client(sync_client=True) as client:
            client.update_artifact(self.table, ArtifactUpdate(data=json.dumps(self._lead())))
            client.update_artifact(self.stage_table, ArtifactUpdate(data=json.dumps(self._by_stage())))
            client.update_artifact(self.curves, ArtifactUpdate(data=self._curves()))

    def _progress(self) -> tuple[float, str]:
        """The percent of updates done, to one decimal, and the card's line, which says it too (the UI's own
        rendering of a progress artifact shows only its whole part)."""
        done = updates_done(self.rows.values())
        percent = round(100.0 * done / self.num_updates, 1)
        return percent, f"run {self.run_id}: {percent:.1f}% ({done} of {self.num_updates} updates done)"

    def _curves(self) -> str:
        return curves_markdown(self.run_id, list(self.rows.values()), self.num_updates)

    def _lead(self) -> list[dict[str, Any]]:
        return [lead_row(row) for row in self.rows.values()]

    def _by_stage(self) -> list[dict[str, Any]]:
        return stage_table(self.rows.values())


def show_resume_point(store: ArtifactStore, run_id: str, config: RunConfig) -> None:
    """When a run starts again, where it goes on: a markdown artifact (the driver logs it too)."""
    if run_id not in store.runs():  # a first start: its recipe is frozen by the driver
        return
    start = resume_point(store, run_id, config)
    if start.done:
        return
    inside = f" (committed inside it: {', '.join(start.partials)})" if start.partials else ""
    create_markdown_artifact(
        f"# Run {run_id} resumed\n\nat update {start.update} of {config.num_updates}, stage"
        f" `{start.stage}`{inside}; everything before is committed in `{store.url}` and is not run again.",
        key=artifact_key(run_id, "resume"),
        description=f"run {run_id}: where it resumed",
    )


def publish_costs(store: ArtifactStore, run_id: str) -> RunCosts:
    """What the run cost per stage, as a table artifact: GPU-hours and CPU-hours of its SLURM jobs (every
    run of a requeued job; slurm/costs.py) and each stage's wall time; a run without accounted jobs
    (inline, local executor) shows its wall time only."""
    costs = run_costs(store, run_id)
    table = [
        {
            "stage": cost.stage,
            "GPU-hours": None if costs.wall_time_only else significant(cost.gpu_hours),
            "CPU-hours": None if costs.wall_time_only else significant(cost.cpu_hours),
            "wall (s)": significant(cost.wall_s),
        }
        for cost in stage_totals(costs)
    ]
    create_table_artifact(
        table, key=artifact_key(run_id, "costs"), description=f"run {run_id}: cost per stage"
    )
    return costs


def publish_report(store: ArtifactStore, run_id: str, costs: RunCosts) -> None:
    """The markdown report of a finished run (with its GPU-hours where `costs` accounts for its jobs), as
    an artifact of this flow run."""
    report = f"# Run {run_id}\n\nstore: `{store.url}`\n\n" + markdown([load_curves(store, run_id, costs)])
    report += f"\n\nPlots: `probepo report {run_id} --store {store.url}`.\n"
    create_markdown_artifact(report, key=artifact_key(run_id, "report"), description=f"run {run_id}: report")
