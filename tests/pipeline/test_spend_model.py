"""The spend model (probepo/spend/model.py: what `probepo check` prints and bench/overhead.py extrapolates to
7B with) predicts, byte for byte, what a real run's counters record: a plain update, a checkpoint update whose
checkpoint uploads beside the next updates (what blocks in its optimize, what its `beside` attempt record
counts) and the run's last checkpoint update (committed inside its optimize), of the tiny recipe under the
inline executor, engines resident."""

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
    # update 0 starts (downloads checkpoint 0); update 1 ends on checkpoint 2, which uploads beside update 2
    # (plain: policy 3 stays in memory); update 3 ends on the run's last checkpoint, committed inside optimize
    config = tiny_config("probepo", num_updates=4, checkpoint_every=2)
    by_update = {m["update"]: m for m in train(config, "model", store=warm_store)}
    # each checkpoint update at its own checkpoint's sizes (trainer.json's counts may differ by a digit)
    found, last = (
        estimate(UpdateShape(sizes, checkpoint_every=2, handoff="memory", accelerator=False))
        for sizes in (committed_sizes(warm_store, "model", k, tmp_path / str(k)) for k in (2, 4))
    )
    assert found.checkpoint.beside_bytes == {"uploaded": found.shape.node_share}
    assert not found.plain.beside_bytes and not found.plain.beside_seconds
    blocking = found.checkpoint.blocking_bytes
    for update, predicted in ((2, found.plain.bytes), (1, blocking), (3, last.checkpoint.bytes)):
        metrics = by_update[update]
        # the trainer's and hand-off's bytes wherever they fall; the store's and disk's of optimize (the other
        # stages commit their rows, a few KB the model leaves out)
        assert counted(metrics, "host_copy") == predicted.get("host_copy", 0), update
        assert counted(metrics, "handoff_memory") == predicted["handoff_memory"], update
        assert counted(metrics, "handoff_file") == 0, update
        for kind in ("uploaded", "scratch"):
            assert counted(metrics, kind, ("optimize",)) == predicted.get(kind, 0), (update, kind)
    # checkpoint 2's upload ran beside update 2, on its own attempt record; optimize 1 fingerprinted policy 2
    (beside,) = [a for a in warm_store.attempts("model", 2, "checkpoint") if a.get("beside")]
    assert beside["spend"]["bytes"] == found.checkpoint.beside_bytes
    assert set(beside["spend"]["seconds"]) == set(found.checkpoint.beside_seconds) == {"commit"}
    assert by_update[1]["timing/optimize/digest"] > 0 and "digest" in found.checkpoint.blocking_seconds
    for k, estimated in ((2, found), (4, last)):
        files = warm_store.marker("model", k, "checkpoint")["files"]
        assert estimated.shape.sizes.checkpoint == sum(f["size"] for f in files.values())
