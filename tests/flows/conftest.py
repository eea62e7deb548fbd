"""The SLURM cluster's fixtures, shared with tests/slurm."""

from tests.slurm.conftest import drill_baseline, profile_path, slurm_cluster

__all__ = ["drill_baseline", "profile_path", "slurm_cluster"]
