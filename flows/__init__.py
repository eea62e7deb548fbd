"""The control plane: Prefect flows over the one driver loop of `probepo.pipeline` (never a second driver).
Each stage submission is a Prefect task run; the store, not Prefect, keeps every stage exactly once."""

import os

# As the CLI: one torch thread per process unless OMP_NUM_THREADS says otherwise, set before torch is
# imported. The thread count changes float reductions, so a run driven by a worker gives the CLI's bits.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Run in process without PREFECT_API_URL (`probepo demo`), a flow gets a temporary server: give it time to
# start on a busy machine (Prefect's 20 s is not always enough on 2 cores), and send nothing anywhere.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
