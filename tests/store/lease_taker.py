"""A driver process for the lease takeover race: `python -m tests.store.lease_taker STORE RUN DIR INDEX`.

It reads the run's (dead) lease, then waits at the write until every taker has read it too, so that all
of them judge the same dead lease before any writes: the interleaving in which two drivers could both
take over. It prints `won` or `held`, then stays alive until every taker has printed, so that the others
judge a live holder.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from probepo.run.driver_lease import take_lease
from probepo.store import LeaseHeld, open_store
from probepo.store.keys import RunLayout

TAKERS = 2
TIMEOUT_S = 60.0


def _wait_for(paths: list[Path]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {TIMEOUT_S} s for {paths}")
        time.sleep(0.02)


def main(url: str, run_id: str, folder: str, index: int) -> None:
    where = Path(folder)
    store = open_store(url)
    objects = store.objects
    write = objects.put_if_match
    lease_key = RunLayout(run_id).lease
    first = [True]

    def put_if_match(key: str, data: bytes, etag: str) -> str | None:
        if key == lease_key and first[0]:
            first[0] = False
            (where / f"read-{index}").touch()
            _wait_for([where / f"read-{i}" for i in range(TAKERS)])
        return write(key, data, etag)

    objects.put_if_match = put_if_match  # type: ignore[method-assign]
    try:
        take_lease(store, run_id)
        outcome = "won"
    except LeaseHeld:
        outcome = "held"
    (where / f"outcome-{index}").write_text(outcome)
    print(outcome, flush=True)
    _wait_for([where / f"outcome-{i}" for i in range(TAKERS)])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
