"""Engines behind interfaces (base.py): generation (sampling, probing) and training (scoring, PPO), with
the CPU testbed's torch implementations and the supervised warm-up."""

from probepo.engines.base import (
    Completion,
    GenerationEngine,
    SamplingParams,
    TrainBatch,
    TrainerEngine,
    TrainerState,
)
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.trainer import TorchTrainerEngine

__all__ = [
    "Completion",
    "GenerationEngine",
    "SamplingParams",
    "TorchGenerationEngine",
    "TorchTrainerEngine",
    "TrainBatch",
    "TrainerEngine",
    "TrainerState",
]
