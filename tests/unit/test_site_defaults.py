"""What a job does to its node by default: its compile and kernel caches (vLLM's, Triton's, Inductor's,
CUDA's) go to a slot of the node's $TMPDIR of its own, not to $HOME on the shared file system
(slurm/job.py: node_local_caches)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import slurm.job
from slurm.job import NODE_LOCAL_CACHES, node_local_caches


def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """No cache variable set, as node_local_caches reads it (empty), each removed after the test."""
    for name in NODE_LOCAL_CACHES:
        monkeypatch.setenv(name, "")


@pytest.fixture
def node_tmp(tmp_path, monkeypatch) -> Iterator[Path]:
    """A node's $TMPDIR, no cache variable set (each put back after the test), and the slots this test's
    claims hold released, as the end of their processes would."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _unset(monkeypatch)
    held = len(slurm.job._held_cache_slots)
    yield tmp_path
    while len(slurm.job._held_cache_slots) > held:
        os.close(slurm.job._held_cache_slots.pop())


def test_each_live_process_of_a_node_gets_its_own_cache_slot_and_a_later_one_reuses_it(node_tmp, monkeypatch):
    root = node_tmp / f"probepo-caches-{os.getuid()}"
    first = node_local_caches()
    first_lock = slurm.job._held_cache_slots[-1]
    assert first == {
        "VLLM_CACHE_ROOT": str(root / "slot0" / "vllm"),
        "TRITON_CACHE_DIR": str(root / "slot0" / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "slot0" / "torchinductor"),
        "CUDA_CACHE_PATH": str(root / "slot0" / "cuda"),
    }
    assert {name: os.environ[name] for name in NODE_LOCAL_CACHES} == first
    assert node_local_caches() == {}  # set already: a second call in the process changes nothing

    _unset(monkeypatch)  # another rank of the node, while the first lives
    assert node_local_caches()["VLLM_CACHE_ROOT"] == str(root / "slot1" / "vllm")

    slurm.job._held_cache_slots.remove(first_lock)
    os.close(first_lock)
    _unset(monkeypatch)  # the first rank's process ended: a later job's rank compiles nothing again
    assert node_local_caches()["TRITON_CACHE_DIR"] == str(root / "slot0" / "triton")


def test_a_cache_the_job_sets_itself_is_kept(node_tmp, monkeypatch):
    """A setup line's `export VLLM_CACHE_ROOT=/shared/vllm-cache` reaches the ranks and wins."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/shared/vllm-cache")
    chosen = node_local_caches()
    assert "VLLM_CACHE_ROOT" not in chosen and os.environ["VLLM_CACHE_ROOT"] == "/shared/vllm-cache"
    assert os.environ["TRITON_CACHE_DIR"] == str(
        node_tmp / f"probepo-caches-{os.getuid()}" / "slot0" / "triton"
    )


def test_a_jobs_rank_has_its_caches_on_its_node_before_a_stage_starts(node_tmp, monkeypatch):
    """slurm/job.py's entry (every stage job and the resident driver job) sets them with the rank's
    variables, before any engine is made."""
    import submitit

    from probepo.run.distributed import NODE_ENV

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", NODE_ENV):
        monkeypatch.setenv(name, "")  # what the rank's export sets, removed after the test
    view = SimpleNamespace(
        job_id="7", global_rank=0, local_rank=0, num_tasks=1, hostnames=["localhost"], hostname="localhost"
    )
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: view)
    slurm.job._ranks_of_this_job()
    assert os.environ["VLLM_CACHE_ROOT"] == str(node_tmp / f"probepo-caches-{os.getuid()}" / "slot0" / "vllm")
