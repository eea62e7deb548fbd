"""A cancelled train flow run keeps its own line (what ended, which jobs, how to go on) as its final state
message, where the run's page shows it.

Prefect 3.9's runner, which the process worker uses, ends a cancelled flow run in this order
(prefect/runner/_cancellation_manager.py, CancellationManager.cancel): SIGTERM to the flow run's process
group, a wait until the whole group has exited (polled every 3 s, at most 30 s), the flow's
on_cancellation hooks (in a subprocess it waits for), and last a forced Cancelled state with its own
message, "Flow run was cancelled successfully.". Nothing of the flow runs after that, its hooks included.
So the flow, as it ends Cancelled with its line, starts this module in a session of its own (outside the
group the runner waits for): it waits for the runner's state and sets the flow's line over it, once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.states import Cancelled

ROOT = Path(__file__).resolve().parent.parent
RUNNER_ENV = "PREFECT__FLOW_RUN_ID"
"""Set by a runner (a worker's, `serve`'s) in the process it starts for a flow run: only such a run gets the
runner's state after its own."""
WITHIN_S = 120.0
"""How long the line waits for the runner's state: the runner's 30 s grace, its hooks and polls, with room."""


def restore(
    client: Any,
    flow_run_id: UUID,
    message: str,
    within_s: float = WITHIN_S,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> bool:
    """Wait until the flow run is Cancelled with a message other than `message` (the runner's) and set
    `message` over it; returns whether it did. Any other end is left alone (the Crashed state a runner
    falls back to where it cannot persist Cancelled), and so is a run still without one after `within_s`."""
    deadline = clock() + within_s
    while clock() < deadline:
        state = client.read_flow_run(flow_run_id).state
        if state is not None and state.is_final():
            if not state.is_cancelled():
                return False
            if state.message != message:
                client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)
                return True
        sleep(poll_s)
    return False


def keep_after_the_runner(flow_run_id: UUID, message: str) -> None:
    """Have `restore` set `message` once the runner that started this flow run has set its own; nothing
    where no runner started it (a flow run in process ends with the flow's own state)."""
    if not os.environ.get(RUNNER_ENV):
        return
    # a session of its own: the runner waits for the flow run's process group to exit before it sets its
    # state; and no pipe of the runner's, which would keep the flow run's output open
    subprocess.Popen(
        [sys.executable, "-m", "flows.cancelled", str(flow_run_id), message],
        cwd=ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    from prefect import get_client

    flow_run_id, message = sys.argv[1:3]
    with get_client(sync_client=True) as client:
        restore(client, UUID(flow_run_id), message)


if __name__ == "__main__":
    main()
