"""The spend model (probepo/spend/model.py: what `probepo check` prints and bench/overhead.py extrapolates to
7B with) predicts, byte for byte, what a real run's counters record: a plain update and a checkpoint update
of the tiny recipe under the inline executor, engines resident."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.run.pipeline import train
from probepo.spend.model import UpdateShape, estimate
from probepo.store import ArtifactStore
from tests.pipeline.conftest import tiny_config
from tests.pipeline.sizes import committed_sizes

pytestmark = pytest.mark.integration


def counted(metrics: dict, kind: str, stages: tuple[str, ...] | None = None) -> int:
    """An update's `bytes/<stage>/<kind>` summed over `stages` (None: every stage)."""
    return sum(
        value
        for key, value in metrics.items()
        if key.startswith("bytes/")
        and key.endswith(f"/{kind}")
        and (stages is None or key.split("/")[1] in stages)
    )


def test_the_model_predicts_the_counted_bytes_of_plain_and_checkpoint_updates(
    warm_store: ArtifactStore, tmp_path: Path
) -> None:
    # update 0 starts (downloads checkpoint 0), update 1 is plain (policy 2 stays in memory), update 2 ends
    # on the final full checkpoint
    config = tiny_config("probepo", num_updates=3, checkpoint_every=3)
    by_update = {m["update"]: m for m in train(config, "model", store=warm_store)}
    sizes = committed_sizes(warm_store, "model", 3, tmp_path)
    shape = UpdateShape(sizes, checkpoint_every=3, handoff="memory", accelerator=False)
    found = estimate(shape)
    for update, predicted in ((1, found.plain.bytes), (2, found.checkpoint.bytes)):
        metrics = by_update[update]
        # the trainer's and hand-off's bytes wherever they fall; the store's and disk's of optimize (the other
        # stages commit their rows, a few KB the model leaves out)
        assert counted(metrics, "host_copy") == predicted.get("host_copy", 0), update
        assert counted(metrics, "handoff_memory") == predicted["handoff_memory"], update
        assert counted(metrics, "handoff_file") == 0, update
        for kind in ("uploaded", "scratch"):
            assert counted(metrics, kind, ("optimize",)) == predicted.get(kind, 0), (update, kind)
    assert sizes.checkpoint == sum(
        f["size"] for f in warm_store.marker("model", 3, "checkpoint")["files"].values()
    )
