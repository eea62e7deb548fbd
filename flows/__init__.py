"""The control plane: Prefect flows over the one driver loop of `probepo.pipeline` (never a second driver).
Each stage submission is a Prefect task run; the store, not Prefect, keeps every stage exactly once."""

import os

# As the CLI: one torch thread per process unless OMP_NUM_THREADS says otherwise, set before torch is
# imported. The thread count changes float reductions, so a run driven by a worker gives the CLI's bits.
os.environ.setdefault("OMP_NUM_THREADS", "1")
