"""Taking over a dead driver's lease: conditional on the dead lease's version, by real processes, on both
backends; a holder on another host is never judged dead."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from probepo.store import ArtifactStore, LeaseHeld, open_store, read_lease
from probepo.store.formats import to_json_bytes
from probepo.store.keys import RunLayout
from probepo.store.lease import take_lease
from tests.store.lease_taker import TAKERS

RUN = "leased"


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _plant_lease(store: ArtifactStore, host: str, pid: int) -> None:
    """A live (unexpired) lease held by `pid` on `host`, as a driver writes it."""
    record = {
        "holder": f"{host}:{pid}",
        "host": host,
        "pid": pid,
        "token": "planted",
        "ttl_s": 600.0,
        "expires_at": "later",
        "expires_at_epoch": time.time() + 600,
    }
    store.objects.put_bytes(RunLayout(RUN).lease, to_json_bytes(record))


@pytest.mark.integration
def test_two_processes_racing_for_a_dead_lease_one_wins(store_url: str, tmp_path) -> None:
    store = open_store(store_url)
    _plant_lease(store, socket.gethostname(), _dead_pid())
    takers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.store.lease_taker", store_url, RUN, str(tmp_path), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(TAKERS)
    ]
    results = [taker.communicate(timeout=120) for taker in takers]
    assert [taker.returncode for taker in takers] == [0] * TAKERS, [err for _, err in results]
    outcomes = [out.strip() for out, _ in results]
    assert sorted(outcomes) == ["held", "won"]
    winner = takers[outcomes.index("won")]
    lease = read_lease(store, RUN)
    assert lease is not None and lease["pid"] == winner.pid  # the loser overwrote nothing


def test_a_holder_on_another_host_is_never_taken_over(store: ArtifactStore) -> None:
    _plant_lease(store, "some-other-node", _dead_pid())  # that pid means nothing on another host
    with pytest.raises(LeaseHeld, match="some-other-node"):
        take_lease(store, RUN, "me", 60.0)


def test_a_dead_holder_of_this_host_is_taken_over(store: ArtifactStore) -> None:
    pid = _dead_pid()
    _plant_lease(store, socket.gethostname(), pid)
    lease = take_lease(store, RUN, "me", 60.0)
    assert lease.replaced is not None and lease.replaced["pid"] == pid
    assert read_lease(store, RUN)["holder"] == "me"
