"""Which GPU a rank takes, from what its job shows it (no GPU needed: CUDA_VISIBLE_DEVICES as SLURM sets
it), and the refusal of a model that does not fit one GPU."""

from __future__ import annotations

import pytest

from probepo.run.devices import ModelPastOneGPU, TooFewGPUs, assigned_gpu, check_fits_one_gpu, gpu_index


@pytest.mark.parametrize(
    ("visible", "local_rank", "index", "gpu"),
    [
        ("0,1,2,3,4,5,6,7", "5", 5, "5"),  # --gpus-per-node=8: every rank sees all, takes its own
        ("4,5", "1", 1, "5"),  # two GPUs of a shared node
        ("6", "3", 0, "6"),  # --gpus-per-task=1: the one it sees
        ("", "0", 0, None),  # a CPU job
    ],
)
def test_each_rank_takes_its_own_gpu(monkeypatch, visible, local_rank, index, gpu):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert gpu_index() == index and assigned_gpu() == gpu


def test_more_ranks_than_gpus_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(
        TooFewGPUs, match=r"local rank 2 sees 2 GPUs.*tasks_per_node no more than gpus_per_node"
    ):
        gpu_index()


def test_a_model_past_one_gpu_is_refused_naming_the_reason():
    gib = 2**30
    check_fits_one_gpu(40 * gib, 0.35, "model.vllm_memory", gpu_bytes=141 * gib)  # 40 < 49.35: fits
    with pytest.raises(
        ModelPastOneGPU, match=r"140\.0 GiB\) exceed 35% .*tensor parallel\) are not supported"
    ):
        check_fits_one_gpu(140 * gib, 0.35, "model.vllm_memory", gpu_bytes=141 * gib)
    check_fits_one_gpu(10**15, 0.35, "model.vllm_memory")  # no GPU here: nothing to check
