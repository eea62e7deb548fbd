"""The execution layer: stage runners that run each stage of each update as a job submitted through
submitit (a local subprocess, or a SLURM job with per-stage resources), the preemption-aware wrapper that
runs inside the job, and the accounting that watches jobs. `probepo.pipeline.train` takes any of them.
"""

from slurm.runner import EXECUTORS, DriverStopped, JobRunner, StageFailed, make_runner

__all__ = ["EXECUTORS", "DriverStopped", "JobRunner", "StageFailed", "make_runner"]
