"""A committed checkpoint's sizes as the spend model takes them (probepo/spend/model.py: PolicySizes), from
its files as the store holds them: shared by tests/pipeline/test_spend_model.py and bench/overhead.py."""

from __future__ import annotations

from pathlib import Path

from probepo.checks.model import safetensors_tensor_bytes
from probepo.run.schedule import Stage
from probepo.spend.model import PolicySizes
from probepo.store import ArtifactStore


def committed_sizes(
    store: ArtifactStore, run: str, update: int, folder: Path, *, tied: int = 0
) -> PolicySizes:
    """Checkpoint `update`'s sizes: its files' sizes from the marker, its safetensors files' tensor bytes
    from their headers (each file downloaded into `folder`); `tied`: bytes of a tied LM head."""
    files = store.marker(run, update, Stage.CHECKPOINT)["files"]
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: safetensors_tensor_bytes(
            store.download_stage_file(run, update, Stage.CHECKPOINT, name, folder / name)
        )
        for name in files
        if name.endswith(".safetensors")
    }
    return PolicySizes.of_files({name: f["size"] for name, f in files.items()}, tensors, tied=tied)
