"""A writer SIGKILLed between its data and its marker leaves nothing visible, and a retry commits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from probepo.store import ArtifactStore, NotCommitted, open_store
from probepo.store.keys import RunLayout

REPO = Path(__file__).resolve().parents[2]
WRITER = textwrap.dedent(
    """
    import sys, time
    from probepo.store import open_store

    store = open_store(sys.argv[1])
    original = store.objects.put_if_absent

    def stall_before_marker(key, data):
        if "/ledger/" in key:
            print("DATA-WRITTEN", flush=True)
            time.sleep(600)
        return original(key, data)

    store.objects.put_if_absent = stall_before_marker
    store.commit_stage("killed", 5, "sample", {"rollouts.parquet": b"r" * 5000, "meta.json": b"{}"})
    """
)


def test_writer_killed_between_data_and_marker_leaves_nothing_visible(
    store: ArtifactStore, store_url: str
) -> None:
    store.create_run("killed", {})
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, store_url], cwd=REPO, stdout=subprocess.PIPE, env=os.environ.copy()
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == b"DATA-WRITTEN"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL

    orphaned = list(store.objects.list(RunLayout("killed").data_roots[0]))
    assert len(orphaned) == 2  # the data landed ...
    assert not store.committed("killed", 5, "sample")  # ... but readers see nothing
    assert store.committed_stages("killed", 5) == []
    try:
        store.read_stage("killed", 5, "sample")
        raise AssertionError("an uncommitted stage was readable")
    except NotCommitted:
        pass

    retry = open_store(store_url).commit_stage("killed", 5, "sample", {"rollouts.parquet": b"again"})
    assert store.read_stage("killed", 5, "sample")["rollouts.parquet"] == b"again"
    report = store.gc("killed", min_age_s=0)
    assert len(report.removed) == 1 and retry["attempt"] not in report.removed[0]
    assert store.verify("killed").problems == []
