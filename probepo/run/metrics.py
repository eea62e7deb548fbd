"""The run's metrics as the driver writes them: metrics.jsonl in the store (and TensorBoard), a record per
update of its stages' summaries and summed spend, and a follower that tells a waiting process of the
summaries a job writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from probepo import spend
from probepo.store import ArtifactStore

ProgressFn = Callable[[int, str, dict[str, Any], bool], None]
"""Called after each stage with (update, stage, summary, ran): `ran` is False for a stage that was already
committed (skipped on resume). The CLI prints progress with it."""


def stage_spend(store: ArtifactStore, run_id: str, update: int, stage: str) -> dict[str, Any]:
    """What every attempt at a committed stage spent, summed (probepo.spend): its metrics' timing/ and
    bytes/ entries."""
    return spend.summed(store.attempts(run_id, update, stage))


class MetricsFollower:
    """Tells a ProgressFn of each stage summary that appears in a run's metrics (written by a job), once;
    the summaries there before it started count as told."""

    def __init__(self, store: ArtifactStore, run_id: str, progress: ProgressFn) -> None:
        self.store, self.run_id, self.progress = store, run_id, progress
        self.told = {told for record in store.read_metrics(run_id) for told in self._summaries(record)}

    @staticmethod
    def _summaries(record: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
        summaries: dict[tuple[int, str], dict[str, Any]] = {}
        for key, value in record.items():
            stage, slash, name = key.partition("/")
            if slash and not spend.is_spend_metric(key):
                summaries.setdefault((int(record["update"]), stage), {})[name] = value
        return summaries

    def __call__(self) -> bool:
        """Tell what is new; returns whether there was anything."""
        told = len(self.told)
        for record in self.store.read_metrics(self.run_id):
            for (update, stage), summary in self._summaries(record).items():
                if (update, stage) not in self.told:
                    self.told.add((update, stage))
                    self.progress(update, stage, summary, True)
        return len(self.told) > told


class RunMetrics:
    """metrics.jsonl (and TensorBoard) records, one per update and stage set: a stage's summary is logged
    once, whenever it is first seen committed (a resumed update logs only what it had not logged; an
    extended run's last update logs its new training stages). The TensorBoard writer opens only when
    there is something to write, so a no-op resume leaves no empty event file."""

    def __init__(self, store: ArtifactStore, run_id: str, tensorboard_dir: Path | None) -> None:
        self.store, self.run_id, self.tensorboard_dir = store, run_id, tensorboard_dir
        self.logged: dict[int, set[str]] = {}
        for record in store.read_metrics(run_id):
            stages = {key.split("/", 1)[0] for key in record if "/" in key and not spend.is_spend_metric(key)}
            self.logged.setdefault(int(record["update"]), set()).update(stages)
        self.writer = None

    def missing(self, update: int) -> bool:
        return update not in self.logged

    def log(self, update: int, summaries: dict[str, dict[str, Any]]) -> None:
        done = self.logged.setdefault(update, set())
        record: dict[str, Any] = {"update": update}
        for stage, summary in summaries.items():
            if stage not in done:
                record.update({f"{stage}/{key}": value for key, value in summary.items()})
                record.update(spend.spend_metrics(stage, stage_spend(self.store, self.run_id, update, stage)))
                done.add(stage)
        if len(record) == 1:
            return
        self.store.append_metrics(self.run_id, record)
        if self.tensorboard_dir is not None:
            if self.writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(self.tensorboard_dir))
            for key, value in record.items():
                if isinstance(value, int | float) and key != "update":
                    self.writer.add_scalar(key, value, update)
            self.writer.flush()

    def __enter__(self) -> RunMetrics:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.writer is not None:
            self.writer.close()
