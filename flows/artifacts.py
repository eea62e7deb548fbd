"""The artifacts a flow run shows: why a run was refused, its progress, metrics and curves while it trains,
where it resumed, and its cost and report at the end. Keys are per run (`<run id>-<what>`), so a run's page
and the artifacts page find them whichever flow run made them."""

from __future__ import annotations

import json
import math
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

from probepo import spend
from probepo.config import RunConfig
from probepo.costs import RunCosts
from probepo.pipeline import resume_point
from probepo.report import load_curves, markdown
from probepo.report_live import curves_markdown, metric_columns
from probepo.schedule import Stage
from probepo.store import ArtifactStore
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
    """What a run's page shows while it trains, updated as each update's optimizer step commits (a
    ProgressFn of the driver, also fed from the store while a resident job runs): its progress (a percent
    to one decimal, the updates done of the total in its description), its metrics table (`update` first,
    the columns grouped by stage) and its curves (a markdown chart of held-out accuracy and reward by
    update). Each is one artifact per flow run, updated in place, not a new version per update: a run's key
    gains one version per flow run that drives it (its start and each resume)."""

    def __init__(self, store: ArtifactStore, run_id: str, num_updates: int) -> None:
        self.store, self.run_id, self.num_updates = store, run_id, max(num_updates, 1)
        records = self._records()
        done = len({int(record["update"]) for record in records if "optimize/loss" in record})
        progress, said = self._progress(done)
        self.progress = create_progress_artifact(
            progress, key=artifact_key(run_id, "progress"), description=said
        )
        self.table = create_table_artifact(
            self._table(records), key=artifact_key(run_id, "metrics"), description=f"run {run_id}: per update"
        )
        self.curves = create_markdown_artifact(
            curves_markdown(run_id, records, self.num_updates),
            key=artifact_key(run_id, "curves"),
            description=f"run {run_id}: accuracy and reward by update",
        )

    def __call__(self, update: int, stage: str, summary: dict[str, Any], ran: bool) -> None:
        if stage == Stage.OPTIMIZE and ran:
            progress, said = self._progress(update + 1)
            update_progress_artifact(self.progress, progress, description=said)
            self.metrics()

    def metrics(self) -> None:
        """The metrics table and the curves of every update committed so far, in place."""
        records = self._records()
        with get_client(sync_client=True) as client:
            client.update_artifact(
                self.table, ArtifactUpdate(data=json.dumps(_sanitized(self._table(records))))
            )
            client.update_artifact(
                self.curves, ArtifactUpdate(data=curves_markdown(self.run_id, records, self.num_updates))
            )

    def _records(self) -> list[dict[str, Any]]:
        return self.store.read_metrics(self.run_id)

    def _progress(self, done: int) -> tuple[float, str]:
        return round(
            100.0 * done / self.num_updates, 1
        ), f"run {self.run_id}: {done} of {self.num_updates} updates done"

    @staticmethod
    def _table(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every update's metrics (the spend counters, ~40 columns, left to TensorBoard and `probepo
        report`), `update` first, grouped by stage."""
        keys = {key for record in records for key in record if "/" in key and not spend.is_spend_metric(key)}
        columns = metric_columns(keys)
        return [{key: record.get(key) for key in columns} for record in records]


def _sanitized(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A table as Prefect stores one: NaN as null (JSON has no NaN)."""
    return [
        {key: None if isinstance(v, float) and math.isnan(v) else v for key, v in row.items()} for row in rows
    ]


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
            "GPU-hours": None if costs.wall_time_only else round(cost.gpu_hours, 4),
            "CPU-hours": None if costs.wall_time_only else round(cost.cpu_hours, 4),
            "wall (s)": round(cost.wall_s, 1),
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
