"""The store contract: every test runs against both backends (a local folder and a real S3 endpoint)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from probepo.store import (
    AlreadyCommitted,
    ArtifactStore,
    CorruptArtifact,
    InvalidKey,
    LeaseHeld,
    LeaseLost,
    Ledger,
    NotCommitted,
    ObjectMissing,
    ResumePoint,
    RunConfigMismatch,
    RunNotFound,
    StoreError,
    open_store,
)
from probepo.store.keys import RunLayout
from probepo.store.s3 import MULTIPART_THRESHOLD

RUN = "run-1"


def flip_byte(store: ArtifactStore, key: str, position: int = 0) -> None:
    """Corrupt one byte of a stored object behind the store's back."""
    data = bytearray(store.objects.get_bytes(key))
    data[position] ^= 0x01
    store.objects.put_bytes(key, bytes(data))


def data_key(store: ArtifactStore, update: int, stage: str, name: str) -> str:
    marker = store.marker(RUN, update, stage)
    assert marker is not None
    return RunLayout(RUN).data_key(update, stage, marker["attempt"], name)


def test_commit_then_read_round_trips_bytes_and_paths(store: ArtifactStore, tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 1000)
    marker = store.commit_stage(
        RUN,
        3,
        "sample",
        {"rollouts.parquet": b"abc", "shards/000.bin": b"", "weights.bin": path},
        summary={"reward_mean": 0.25, "count": 3},
    )
    assert marker["files"]["rollouts.parquet"]["size"] == 3
    assert marker["files"]["weights.bin"]["size"] == 256_000
    assert store.marker(RUN, 3, "sample") == marker
    files = store.read_stage(RUN, 3, "sample")
    assert sorted(files) == ["rollouts.parquet", "shards/000.bin", "weights.bin"]
    assert files["rollouts.parquet"] == b"abc"
    assert files["shards/000.bin"] == b""
    assert files["weights.bin"] == path.read_bytes()
    assert dict(store.read_stage(RUN, 3, "sample").prefetch(workers=2)) == dict(files)
    assert files.summary == {"reward_mean": 0.25, "count": 3}
    assert store.committed(RUN, 3, "sample")
    assert not store.committed(RUN, 3, "score")


def test_empty_stage_commits(store: ArtifactStore) -> None:
    store.commit_stage(RUN, 0, "probe", {})
    assert dict(store.read_stage(RUN, 0, "probe")) == {}


def test_second_commit_raises_already_committed_and_keeps_the_first(store: ArtifactStore) -> None:
    store.commit_stage(RUN, 0, "score", {"x": b"first"})
    with pytest.raises(AlreadyCommitted, match="already committed") as caught:
        store.commit_stage(RUN, 0, "score", {"x": b"second"})
    assert caught.value.winner is not None
    assert store.read_stage(RUN, 0, "score")["x"] == b"first"


def test_reading_an_uncommitted_stage_names_it(store: ArtifactStore) -> None:
    with pytest.raises(NotCommitted, match=r"run 'run-1' update 7 stage 'select'"):
        store.read_stage(RUN, 7, "select")
    assert store.marker(RUN, 7, "select") is None


def test_listing_runs_updates_and_stages(store: ArtifactStore) -> None:
    store.create_run(RUN, {"seed": 1})
    store.create_run("run-2", {"seed": 2})
    for update, stage in [(0, "sample"), (0, "score"), (0, "optimize.part-0001"), (2, "sample")]:
        store.commit_stage(RUN, update, stage, {"f": b"1"})
    assert store.runs() == ["run-1", "run-2"]
    assert store.updates(RUN) == [0, 2]
    assert store.committed_stages(RUN, 0) == ["optimize.part-0001", "sample", "score"]
    assert store.committed_stages(RUN, 1) == []
    assert store.ledger_entries(RUN) == {0: ["optimize.part-0001", "sample", "score"], 2: ["sample"]}


def test_flipped_byte_is_caught_on_read_naming_run_update_stage_and_file(store: ArtifactStore) -> None:
    store.commit_stage(RUN, 4, "advantage", {"adv.safetensors": b"0123456789" * 100, "ok": b"fine"})
    flip_byte(store, data_key(store, 4, "advantage", "adv.safetensors"), position=500)
    with pytest.raises(CorruptArtifact, match=r"adv\.safetensors"):
        store.read_stage(RUN, 4, "advantage").prefetch()
    files = store.read_stage(RUN, 4, "advantage")
    assert files["ok"] == b"fine"  # lazy: an intact file still reads
    with pytest.raises(CorruptArtifact) as caught:
        files["adv.safetensors"]
    message = str(caught.value)
    for part in ("run-1", "update 4", "'advantage'", "'adv.safetensors'", "sha256"):
        assert part in message


def test_missing_data_file_is_corrupt(store: ArtifactStore) -> None:
    store.commit_stage(RUN, 0, "sample", {"a": b"data"})
    store.objects.delete(data_key(store, 0, "sample", "a"))
    with pytest.raises(CorruptArtifact, match="missing"):
        store.read_stage(RUN, 0, "sample")["a"]


def test_garbled_marker_is_corrupt(store: ArtifactStore) -> None:
    store.commit_stage(RUN, 0, "sample", {"a": b"data"})
    store.objects.put_bytes(RunLayout(RUN).marker(0, "sample"), b"{not json")
    with pytest.raises(CorruptArtifact, match="commit marker"):
        store.read_stage(RUN, 0, "sample")


def test_marker_naming_a_file_outside_the_run_is_rejected(store: ArtifactStore) -> None:
    marker = store.commit_stage(RUN, 0, "sample", {"a": b"data"})
    marker["files"] = {"../../../other-run/run.json": marker["files"]["a"]}
    store.objects.put_bytes(RunLayout(RUN).marker(0, "sample"), json.dumps(marker).encode())
    with pytest.raises(CorruptArtifact, match="malformed"):
        store.read_stage(RUN, 0, "sample")


def test_invalidate_refuses_healthy_then_quarantines_corrupt_and_allows_recompute(
    store: ArtifactStore,
) -> None:
    first = store.commit_stage(RUN, 1, "optimize", {"ckpt": b"weights" * 10})
    with pytest.raises(StoreError, match="refusing"):
        store.invalidate(RUN, 1, "optimize")
    assert store.committed(RUN, 1, "optimize")

    flip_byte(store, data_key(store, 1, "optimize", "ckpt"))
    record = store.invalidate(RUN, 1, "optimize")
    assert "ckpt" in record["problems"][0]
    assert not store.committed(RUN, 1, "optimize")
    quarantined = list(store.objects.list(RunLayout(RUN).quarantine_root))
    assert len(quarantined) == 1
    assert json.loads(json.loads(store.objects.get_bytes(quarantined[0].key))["marker_raw"]) == first

    store.commit_stage(RUN, 1, "optimize", {"ckpt": b"recomputed"})
    assert store.read_stage(RUN, 1, "optimize")["ckpt"] == b"recomputed"


def test_invalidate_with_force_recomputes_a_healthy_stage(store: ArtifactStore) -> None:
    store.commit_stage(RUN, 0, "evaluate", {"scores": b"1"})
    assert store.invalidate(RUN, 0, "evaluate", force=True)["forced"] is True
    assert not store.committed(RUN, 0, "evaluate")
    with pytest.raises(NotCommitted):
        store.invalidate(RUN, 0, "evaluate")


def test_a_large_file_is_stored_whole_with_the_digest_of_its_bytes(
    store: ArtifactStore, tmp_path: Path
) -> None:
    # Past S3's multipart threshold (parts sent in parallel, the last one short) and several times the
    # local backend's early-writeback step: one read of the file hashes what is stored.
    path = tmp_path / "optimizer.safetensors"
    path.write_bytes(os.urandom(MULTIPART_THRESHOLD + (5 << 20) + 7))
    marker = store.commit_stage(RUN, 4, "checkpoint", {"optimizer.safetensors": path})
    data = path.read_bytes()
    assert marker["files"]["optimizer.safetensors"] == {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert store.objects.get_bytes(data_key(store, 4, "checkpoint", "optimizer.safetensors")) == data


def test_download_stage_file_streams_and_verifies(store: ArtifactStore, tmp_path: Path) -> None:
    source = tmp_path / "model.safetensors"
    source.write_bytes(b"w" * 300_000)
    store.commit_stage(RUN, 2, "checkpoint", {"model.safetensors": source})
    assert data_key(store, 2, "checkpoint", "model.safetensors").startswith("runs/run-1/checkpoints/000002/")
    dest = store.download_stage_file(RUN, 2, "checkpoint", "model.safetensors", tmp_path / "out.safetensors")
    assert dest.read_bytes() == source.read_bytes()

    flip_byte(store, data_key(store, 2, "checkpoint", "model.safetensors"), position=123_456)
    with pytest.raises(CorruptArtifact, match=r"model\.safetensors"):
        store.download_stage_file(RUN, 2, "checkpoint", "model.safetensors", tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(ObjectMissing):
        store.download_stage_file(RUN, 2, "checkpoint", "nope", tmp_path / "nope")


def test_run_metadata_is_create_only(store: ArtifactStore) -> None:
    with pytest.raises(RunNotFound, match=r"run 'run-1' not found in store"):
        store.read_run(RUN)
    record = {"config": {"lr": 1e-4, "algo": "grpo"}, "code_version": "0.1.0"}
    assert store.create_run(RUN, record) == record
    assert store.create_run(RUN, record) == record
    with pytest.raises(RunConfigMismatch, match=r"differing: config\.lr\)"):
        store.create_run(RUN, {"config": {"lr": 3e-4, "algo": "grpo"}, "code_version": "0.1.0"})
    assert store.read_run(RUN) == record


def test_metrics_append_and_read_in_order(store: ArtifactStore) -> None:
    assert store.read_metrics(RUN) == []
    for update in range(5):
        store.append_metrics(RUN, {"update": update, "reward": update / 10})
    assert [m["update"] for m in store.read_metrics(RUN)] == [0, 1, 2, 3, 4]


def test_concurrent_metric_appends_lose_nothing(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]

    def append(index: int) -> None:
        for step in range(5):
            stores[index].append_metrics(RUN, {"writer": index, "step": step})

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = stores[0].read_metrics(RUN)
    assert sorted((r["writer"], r["step"]) for r in records) == [(w, s) for w in range(4) for s in range(5)]


def test_attempt_records(store: ArtifactStore) -> None:
    first = store.record_attempt(
        RUN, 0, "sample", {"job_id": "17", "host": "n1", "pid": 5, "outcome": "preempted"}
    )
    second = store.record_attempt(RUN, 0, "sample", {"job_id": "18", "host": "n2", "pid": 6, "start": "t0"})
    store.record_attempt(RUN, 0, "sample", {"job_id": "18", "outcome": "committed"}, attempt_id=second)
    store.record_attempt(RUN, 1, "score", {"job_id": "19", "outcome": "failed: OOM"})
    records = store.attempts(RUN, 0, "sample")
    assert [(r["attempt_id"], r["job_id"], r["outcome"]) for r in records] == [
        (first, "17", "preempted"),
        (second, "18", "committed"),
    ]
    assert len(store.attempts(RUN)) == 3
    assert [r["stage"] for r in store.attempts(RUN, update=1)] == ["score"]


def test_lease_is_exclusive_renewable_and_expires(store: ArtifactStore) -> None:
    lease = store.acquire_lease(RUN, "driver-a", ttl_s=60)
    with pytest.raises(LeaseHeld) as caught:
        store.acquire_lease(RUN, "driver-b", ttl_s=60)
    message = str(caught.value)
    assert "driver-a" in message and "until" in message and "--force" not in message  # advice: the CLI's
    before = lease.expires_at
    time.sleep(0.01)
    lease.renew()
    assert lease.expires_at > before
    lease.release()
    with store.acquire_lease(RUN, "driver-b", ttl_s=0.05) as short:
        time.sleep(0.1)
        taken = store.acquire_lease(RUN, "driver-c", ttl_s=60)  # expired: taken over
        with pytest.raises(LeaseLost):
            short.renew()
    # The context manager's release did not remove driver-c's lease.
    with pytest.raises(LeaseHeld, match="driver-c"):
        store.acquire_lease(RUN, "driver-d", ttl_s=60)
    forced = store.acquire_lease(RUN, "driver-d", ttl_s=60, force=True)
    with pytest.raises(LeaseLost):
        taken.renew()
    forced.release()


def test_only_one_of_many_racing_drivers_gets_the_lease(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    outcomes: list[str] = []

    def contend(index: int) -> None:
        barrier.wait()
        try:
            stores[index].acquire_lease(RUN, f"driver-{index}", ttl_s=60)
            outcomes.append("won")
        except LeaseHeld:
            outcomes.append("held")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["held"] * 7 + ["won"]


def test_sixteen_racing_writers_exactly_one_marker_wins_every_trial(store_url: str) -> None:
    writers = 16
    stores = [open_store(store_url) for _ in range(writers)]
    marker_contenders = []
    for trial in range(20):
        barrier = threading.Barrier(writers)
        winners: list[tuple[int, dict]] = []
        losers: list[int] = []
        contenders = [0]

        def write(
            index: int,
            update: int = trial,
            barrier: threading.Barrier = barrier,
            winners=winners,
            losers=losers,
            contenders=contenders,
        ) -> None:
            objects = stores[index].objects
            original = objects.put_if_absent

            def counted(key: str, data: bytes) -> str | None:
                contenders[0] += 1  # this writer reached the create-only marker write
                return original(key, data)

            objects.put_if_absent = counted  # type: ignore[method-assign]
            barrier.wait()
            try:
                winners.append(
                    (index, stores[index].commit_stage(RUN, update, "sample", {"w": str(index).encode()}))
                )
            except AlreadyCommitted:
                losers.append(index)
            finally:
                del objects.put_if_absent

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1, f"trial {trial}: {len(winners)} winners"
        assert len(losers) == writers - 1
        index, marker = winners[0]
        assert stores[0].marker(RUN, trial, "sample") == marker
        assert stores[0].read_stage(RUN, trial, "sample")["w"] == str(index).encode()
        marker_contenders.append(contenders[0])
    # The race is real: several writers reached the marker write at once in some trial.
    assert max(marker_contenders) > 1, marker_contenders


def test_gc_removes_orphaned_attempts_only(store: ArtifactStore) -> None:
    store.create_run(RUN, {})
    store.commit_stage(RUN, 0, "sample", {"a": b"kept"})
    layout = RunLayout(RUN)
    orphan = layout.data_key(0, "sample", "20200101T000000Z-orphan", "a")
    store.objects.put_bytes(orphan, b"garbage")
    young = store.gc(RUN)  # default minimum age protects attempts that may still be uploading
    assert young.removed == [] and young.kept_young == ["updates/000000/sample/20200101T000000Z-orphan/"]
    assert store.gc(RUN, min_age_s=0, dry_run=True).removed == young.kept_young
    assert store.objects.exists(orphan)
    report = store.gc(RUN, min_age_s=0)
    assert report.removed == young.kept_young and report.bytes == len(b"garbage")
    assert not store.objects.exists(orphan)
    assert store.read_stage(RUN, 0, "sample")["a"] == b"kept"
    assert store.gc(RUN, min_age_s=0).removed == []


def test_gc_keeps_data_of_quarantined_markers(store: ArtifactStore) -> None:
    store.create_run(RUN, {})
    store.commit_stage(RUN, 0, "score", {"a": b"old"})
    old_key = data_key(store, 0, "score", "a")
    store.invalidate(RUN, 0, "score", force=True)
    assert store.gc(RUN, min_age_s=0).removed == []
    assert store.objects.exists(old_key)


def test_verify_reports_every_corrupt_file(store: ArtifactStore) -> None:
    store.create_run(RUN, {})
    store.commit_stage(RUN, 0, "sample", {"a": b"x" * 10, "b": b"y" * 10})
    store.commit_stage(RUN, 1, "sample", {"a": b"z"})
    assert store.verify(RUN).problems == []
    flip_byte(store, data_key(store, 0, "sample", "b"))
    store.objects.delete(data_key(store, 1, "sample", "a"))
    report = store.verify(RUN)
    assert (report.stages, report.files) == (2, 3)
    assert sorted((p.update, p.name) for p in report.problems) == [(0, "b"), (1, "a")]


@pytest.mark.parametrize(
    ("run_id", "update", "stage", "name"),
    [
        ("../escape", 0, "sample", "a"),
        ("/abs", 0, "sample", "a"),
        ("run", -1, "sample", "a"),
        ("run", True, "sample", "a"),
        ("run", 0, "Sample", "a"),
        ("run", 0, "a..b", "a"),
        ("run", 0, "sample", "../x"),
        ("run", 0, "sample", "/etc/passwd"),
        ("run", 0, "sample", "a//b"),
        ("run", 0, "sample", ".hidden"),
        ("run", 0, "sample", "a\\b"),
    ],
)
def test_keys_that_could_escape_are_rejected(store: ArtifactStore, run_id, update, stage, name) -> None:
    with pytest.raises(InvalidKey):
        store.commit_stage(run_id, update, stage, {name: b"x"})


def test_ledger_resume_point_and_latest_checkpoint(store: ArtifactStore) -> None:
    order = ["sample", "score", "optimize"]
    store.create_run(RUN, {"code_version": "0.1.0"})
    ledger = Ledger(store, RUN)
    assert ledger.resume_point(order, 3) == ResumePoint(0, "sample", [])
    assert ledger.latest_checkpoint() is None
    for stage in order:
        store.commit_stage(RUN, 0, stage, {})
    store.commit_stage(RUN, 0, "checkpoint", {"w": b"0"})
    store.commit_stage(RUN, 1, "sample", {})
    store.commit_stage(RUN, 1, "score.shard-0000", {})
    store.commit_stage(RUN, 1, "score.shard-0001", {})
    assert ledger.resume_point(order, 3) == ResumePoint(1, "score", ["score.shard-0000", "score.shard-0001"])
    assert ledger.latest_checkpoint() == 0
    assert "1: sample; in flight: score (2 part(s) committed)" in ledger.summary()
    for stage in order[1:]:
        store.commit_stage(RUN, 1, stage, {})
    assert ledger.resume_point(order, 2).done
    store.record_attempt(
        RUN, 1, "score", {"job_id": "42", "host": "n1", "outcome": "committed", "start": "t"}
    )
    summary = ledger.summary()
    assert "latest checkpoint: update 0" in summary
    assert "checkpoint, optimize, sample, score" in summary
    assert "in flight" not in summary and "1 committed" in summary  # a committed stage's parts are history


def test_open_store_accepts_file_urls(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/s")
    store.commit_stage(RUN, 0, "sample", {"a": b"1"})
    assert open_store(tmp_path / "s").read_stage(RUN, 0, "sample")["a"] == b"1"
    with pytest.raises(InvalidKey):
        open_store("gs://bucket/x")


def test_local_symlink_cannot_lead_outside_the_store(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    (tmp_path / "outside").mkdir()
    (tmp_path / "s" / "runs").mkdir(parents=True)
    (tmp_path / "s" / "runs" / RUN).symlink_to(tmp_path / "outside")
    with pytest.raises(InvalidKey, match="outside the store"):
        store.commit_stage(RUN, 0, "sample", {"a": b"1"})
