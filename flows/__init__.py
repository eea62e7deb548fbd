"""The control plane: Prefect flows over the one driver loop of `probepo.run.pipeline` (never a second
driver).
Each stage submission is a Prefect task run; the store, not Prefect, keeps every stage exactly once."""

import logging
import os

from prefect.exceptions import CancelledRun, FailedRun

# As the CLI: one torch thread per process unless OMP_NUM_THREADS says otherwise, set before torch is
# imported. The thread count changes float reductions, so a run driven by a worker gives the CLI's bits.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Run in process without PREFECT_API_URL (`probepo demo`), a flow gets a temporary server: give it time to
# start on a busy machine (Prefect's 20 s is not always enough on 2 cores), and send nothing anywhere.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


class _ReturnedStatesAreNotCrashes(logging.Filter):
    """Prefect's engine logs "Engine execution exited with unexpected exception" with a traceback when a
    deployment's flow run ends in a state the flow returned: a refusal, a failed stage, a cancellation, each
    already said in one line by the flow. That record goes; an exception a flow raises keeps its traceback
    (the engine raises it as itself, not as FailedRun or CancelledRun)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], FailedRun | CancelledRun))


logging.getLogger("prefect.flow_runs").addFilter(_ReturnedStatesAreNotCrashes())
