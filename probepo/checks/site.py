"""The site the executor's jobs run on, in its backend's words (`Site.site_findings`): for SLURM, each
stage's partition, account, QOS, time limit, GPUs and nodes, what a preempted job receives and whether the
job folder is shared (slurm/site.py asks the controller); for the local executor, the job folder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from probepo.checks.findings import Findings

if TYPE_CHECKING:
    from probepo.checks.launch import Launch


def check(launch: Launch) -> Findings:
    """The site's word on the stages the executor submits, where its backend answered."""
    if launch.site is None or launch.executor is None:
        return Findings()
    return launch.site.site_findings(launch.executor.stages)
