"""A checkpoint committed beside the updates (probepo/stages/uploads.py), in one process on a local store: its
marker only once every byte is up, one in flight at a time (the second waits, counted), a stop that
finishes it within the grace or abandons it (nothing of it left visible, the scratch freed), a failed upload
given up without a marker. The drills on the real cluster: tests/slurm/test_resident.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from probepo import spend
from probepo.run.faults import PAUSE_ENV, PAUSE_RELEASE_ENV
from probepo.run.preemption import StopFlag
from probepo.stages.context import StageContext
from probepo.stages.uploads import CheckpointUploads
from probepo.store import StoreUnreachable, open_store
from probepo.store.keys import RunLayout
from probepo.store.objects import UploadControl
from tests.pipeline.conftest import tiny_config

RUN = "beside"


@pytest.fixture
def store(tmp_path):
    opened = open_store(str(tmp_path / "store"))
    opened.create_run(RUN, {"config": {}, "code_version": "test"})
    return opened


def saved(ctx: StageContext, size: int = 4096) -> tuple[Path, dict[str, Path]]:
    """A trainer's state as optimize saves it into the scratch: two files."""
    folder = ctx.scratch / f"policy-{ctx.update + 1:06d}"
    folder.mkdir(parents=True)
    files = {"model.safetensors": folder / "model.safetensors", "trainer.json": folder / "trainer.json"}
    files["model.safetensors"].write_bytes(bytes(range(256)) * (size // 256))
    files["trainer.json"].write_text("{}\n")
    return folder, files


def context(store, tmp_path: Path, update: int) -> StageContext:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return StageContext(store, RUN, update, tiny_config(), scratch)


def paused_at(monkeypatch, tmp_path: Path, checkpoint: int, when: str = "started") -> Path:
    """Hold checkpoint `checkpoint`'s upload thread at a fault point until the returned file exists."""
    release = tmp_path / f"release-{checkpoint}"
    monkeypatch.setenv(PAUSE_ENV, f"{checkpoint}:checkpoint.upload:{when}")
    monkeypatch.setenv(PAUSE_RELEASE_ENV, str(release))
    return release


def release_after(path: Path, seconds: float) -> None:
    threading.Timer(seconds, path.touch).start()


def test_the_marker_lands_only_once_every_byte_is_up_and_then_retention_hears_of_it(
    store, tmp_path, monkeypatch
):
    landed: list[int] = []
    uploads = CheckpointUploads(StopFlag(), 60, on_landed=landed.append)
    ctx = context(store, tmp_path, 2)
    folder, files = saved(ctx)
    release = paused_at(monkeypatch, tmp_path, 3, "uploaded")  # every byte up, the thread not yet done
    uploads.start(ctx, folder, files, {"loss": 0.5})
    assert uploads.in_flight(3) and not uploads.land(store)
    assert store.marker(RUN, 3, "checkpoint") is None and landed == []
    release.touch()
    with spend.attempt_spend() as counters:
        uploads.finish(store)
    marker = store.marker(RUN, 3, "checkpoint")
    assert sorted(marker["files"]) == sorted(files) and marker["summary"] == {"loss": 0.5}
    assert store.read_stage(RUN, 3, "checkpoint")["trainer.json"] == b"{}\n"
    assert landed == [3] and not uploads.in_flight(3) and not folder.exists()  # the scratch is freed
    assert "checkpoint_wait" in counters.seconds  # the wait blocked the update: counted as such
    beside = [a for a in store.attempts(RUN, 3, "checkpoint") if a.get("beside")]
    assert len(beside) == 1 and beside[0]["outcome"] == "committed"  # what ran beside, on its own record
    assert beside[0]["spend"]["bytes"]["uploaded"] == 4096 + 3 and beside[0]["spend"]["seconds"]["commit"] > 0


def test_a_second_checkpoint_waits_for_the_one_in_flight_and_the_wait_is_counted(
    store, tmp_path, monkeypatch
):
    uploads = CheckpointUploads(StopFlag(), 60)
    release = paused_at(monkeypatch, tmp_path, 3)
    first = context(store, tmp_path, 2)
    uploads.start(first, *saved(first), {})
    second = context(store, tmp_path, 4)
    folder, files = saved(second)
    release_after(release, 0.3)
    with spend.attempt_spend() as counters:
        uploads.start(second, folder, files, {})
    assert store.marker(RUN, 3, "checkpoint") is not None  # landed before the second began
    assert counters.seconds["checkpoint_wait"] >= 0.2  # held until checkpoint 3's thread was let go
    uploads.finish(store)
    assert store.marker(RUN, 5, "checkpoint") is not None


def test_a_stop_abandons_an_upload_that_cannot_land_within_the_grace_leaving_nothing(
    store, tmp_path, monkeypatch
):
    flag = StopFlag()
    uploads = CheckpointUploads(flag, signal_grace_s=1)  # less than the margin kept for leaving: no time
    ctx = context(store, tmp_path, 2)
    folder, files = saved(ctx, size=1 << 20)
    release = paused_at(monkeypatch, tmp_path, 3)
    uploads.start(ctx, folder, files, {})
    flag.raised_at = time.monotonic()  # the stop's time, the flag left down: the thread stays held
    release_after(release, 0.5)
    uploads.settle(store)
    assert not uploads.in_flight(3) and not folder.exists()
    assert store.marker(RUN, 3, "checkpoint") is None
    assert not list(store.objects.list(f"{RunLayout(RUN).root}checkpoints/"))  # no object of it is left
    assert store.verify(RUN).problems == []


def test_a_stop_with_time_left_lands_the_checkpoint(store, tmp_path):
    flag = StopFlag()
    uploads = CheckpointUploads(flag, signal_grace_s=60)
    ctx = context(store, tmp_path, 2)
    uploads.start(ctx, *saved(ctx, size=1 << 20), {})
    flag.signalled()
    uploads.settle(store)
    assert store.marker(RUN, 3, "checkpoint") is not None and not uploads.in_flight(3)


def test_an_upload_the_store_refuses_is_given_up_without_a_marker(store, tmp_path, monkeypatch, caplog):
    def refused(*args, **kwargs):
        raise StoreUnreachable("the gateway refused the credentials")

    monkeypatch.setattr(type(store.objects), "put_file", refused)
    uploads = CheckpointUploads(StopFlag(), 60)
    ctx = context(store, tmp_path, 2)
    folder, files = saved(ctx)
    uploads.start(ctx, folder, files, {})
    uploads.finish(store)
    assert store.marker(RUN, 3, "checkpoint") is None and not folder.exists()
    assert (
        "checkpoint 3 of run beside was not committed" in caplog.text and "reachable by replay" in caplog.text
    )


def test_an_upload_measures_its_rate_to_say_what_is_left():
    from probepo.stages.uploads import _Upload

    upload = _Upload(RUN, 3, "a", Path("x"), {}, [0], nbytes=1000, control=UploadControl())
    assert upload.seconds_left() is None  # nothing read yet: no rate
    upload.started -= 2.0
    upload.control.bytes_read = 250  # 125 bytes a second
    assert upload.seconds_left() == pytest.approx(6.0, rel=0.05)


def test_rank_0_lands_a_checkpoint_only_once_the_other_nodes_leaders_said_they_are_done(
    store, tmp_path, monkeypatch
):
    """Two nodes: rank 0 uploads what its node holds, rank 2 (the other node's leader) its node's shard and
    then the record of it; the marker lists both only once that record is there, and a leader that gave
    up leaves the checkpoint uncommitted."""
    from probepo.stages import uploads as module
    from probepo.stages.uploads import manifest_name

    monkeypatch.setattr(module.distributed, "world_size", lambda: 4)
    monkeypatch.setattr(module.distributed, "broadcast_json", lambda message=None: message)
    monkeypatch.setattr(module, "file_owners", lambda files: {**dict.fromkeys(files, 0), "shard-2": 2})
    for update, outcome in ((2, "done"), (4, "gave up")):
        uploads = CheckpointUploads(StopFlag(), 60)
        ctx = context(store, tmp_path, update)
        folder, files = saved(ctx)
        uploads.start(ctx, folder, files, {})
        uploads._upload.thread.join()
        assert not uploads.land(store) and store.marker(RUN, update + 1, "checkpoint") is None
        attempt = uploads._upload.attempt
        report: dict = {"digests": None, "error": "abandoned"}
        if outcome == "done":  # what rank 2's thread writes once its files are up
            shard = store.upload_attempt_files(RUN, update + 1, "checkpoint", attempt, {"shard-2": b"2" * 64})
            report = {"digests": shard, "error": None}
        key = RunLayout(RUN).data_key(update + 1, "checkpoint", attempt, manifest_name(2))
        store.objects.put_bytes(key, json.dumps(report).encode())
        assert uploads.land(store) and not uploads.in_flight(update + 1)
        marker = store.marker(RUN, update + 1, "checkpoint")
        if outcome == "done":
            assert sorted(marker["files"]) == sorted([*files, "shard-2"])
            assert not store.objects.exists(key)  # the record goes once the marker is there
        else:
            assert marker is None
    assert store.verify(RUN).problems == []
