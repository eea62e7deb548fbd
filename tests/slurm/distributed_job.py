"""A job function for the multi-task test: each rank exports its rank environment, joins a gloo process
group through it, and all-reduces its rank."""

from __future__ import annotations


def all_reduce_ranks() -> dict[str, float | int | str]:
    import os

    import torch
    import torch.distributed as dist

    from slurm.ranks import job_ranks

    ranks = job_ranks()
    ranks.export()
    dist.init_process_group("gloo", init_method="env://")
    try:
        value = torch.tensor([float(ranks.rank)])
        dist.all_reduce(value)
        return {
            "rank": int(os.environ["RANK"]),
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"]),
            "master_port": int(os.environ["MASTER_PORT"]),
            "sum": float(value.item()),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }
    finally:
        dist.destroy_process_group()
