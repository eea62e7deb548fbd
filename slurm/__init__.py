"""The execution layer: the executor registry (executors.py) and its backends, stage runners that run each
stage of each update as a job submitted through submitit (a local subprocess, or a SLURM job with per-stage
resources), the preemption-aware wrapper that runs inside the job, and the accounting that watches jobs.
`probepo.run.pipeline.train` takes any of their runners.
"""

from slurm.executors import EXECUTORS, executor_for, make_runner
from slurm.runner import DriverStopped, JobRunner, StageFailed

__all__ = ["EXECUTORS", "DriverStopped", "JobRunner", "StageFailed", "executor_for", "make_runner"]
