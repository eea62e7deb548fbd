"""The control plane: Prefect flows over the one driver loop of `probepo.pipeline` (never a second driver).
Each stage submission is a Prefect task run; the store, not Prefect, keeps every stage exactly once."""
