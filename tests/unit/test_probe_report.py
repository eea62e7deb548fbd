"""The probe job's report read against the profile (slurm/check.py: node_findings, probe_report_findings):
what only a job on a compute node can see, each finding naming the field to change. On the real cluster:
tests/slurm/test_check.py."""

from __future__ import annotations

from probepo.config import StageResources
from slurm.check import node_findings, probe_report_findings

WHERE = "probe job 7 on gpu01"


def _report(**fields: object) -> dict:
    report = {
        "python": "/shared/probepo/.venv/bin/python",
        "versions": {"probepo": "0.1", "torch": "2.13.0"},
        "gpus": "8 CUDA device(s)",
        "cuda_devices": 8,
        "cuda_build": True,
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "cpus": 64,
        "memory_bytes": 2048e9,
        "tmpdir": "/local/scratch",
        "tmpdir_free": 3e12,
        "store": {"failures": [], "warnings": [], "passed": ["store: s3://b/p: 0 run(s), writable"]},
    }
    return {**report, **fields}


H200 = StageResources(gpus_per_node=8, tasks_per_node=8, cpus_per_task=8, mem_gb=1024)


def test_a_node_that_has_what_the_profile_asks_passes():
    assert node_findings(WHERE, _report(), H200) == node_findings(WHERE, _report(), StageResources())
    assert not node_findings(WHERE, _report(), H200).failures
    found = probe_report_findings(WHERE, _report(), scratch_bytes=97 * 10**9)
    assert found.failures == [] and found.warnings == []
    assert f"{WHERE}: $TMPDIR /local/scratch, 3000.0 GB free for the 97.0 GB an update writes there" in (
        found.passed
    )


def test_less_memory_fewer_gpus_or_a_cpu_torch_than_the_profile_asks_are_named():
    (memory,) = node_findings(WHERE, _report(memory_bytes=512e9), H200).failures
    assert memory.startswith(f"{WHERE}: the node has 512.0 GB of memory, less than the profile's mem_gb")
    (gpus,) = node_findings(WHERE, _report(cuda_devices=0), H200).failures
    assert "sees 0 CUDA device(s), fewer than the 1 a task is given" in gpus
    cpu_torch = node_findings(WHERE, _report(cuda_devices=0, cuda_build=False), H200)
    assert cpu_torch.failures == [] and "its torch is a CPU build" in cpu_torch.warnings[0]
    (cpus,) = node_findings(WHERE, _report(cpus=4), H200).failures
    assert "a rank may use 4 CPU(s) (its affinity), fewer than the profile's cpus_per_task = 8" in cpus


def test_a_store_the_job_cannot_reach_and_a_small_tmpdir_fail_with_what_to_do():
    store = {"failures": ["store: s3://b/p: AccessDenied"], "warnings": [], "passed": []}
    found = probe_report_findings(WHERE, _report(store=store, tmpdir_free=10e9), scratch_bytes=97 * 10**9)
    denied, small = found.failures
    assert denied.startswith(f"{WHERE}: store: s3://b/p: AccessDenied — from inside the job")
    assert "AWS_SHARED_CREDENTIALS_FILE" in denied
    assert "has 10.0 GB free, less than the 97.0 GB an update writes there" in small and "TMPDIR" in small
