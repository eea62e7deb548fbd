"""Every configuration model of the project, in one place: the run's recipe (`run.py`: what is computed),
the execution profile (`execution.py`: where each stage runs, never part of the recipe), the site's
settings (`site.py`: what the Prefect deployments open on), the checkpoints an evaluation takes
(`evaluation.py`) and those a run keeps (`retention.py`, a profile setting).

The same pydantic models are the YAML presets in `configs/`, the CLI's input and the Prefect flows'
parameters (each field's docstring becomes the help text of the UI form). Invalid values are rejected
with a message that names the field; `probepo.presets` loads presets and words the errors for users.
"""

from probepo.config.evaluation import CheckpointSelection
from probepo.config.execution import ExecutionProfile, StageResources
from probepo.config.retention import Retention
from probepo.config.run import (
    NOT_RECIPE,
    AlgoConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SamplingConfig,
    TaskConfig,
    WarmupConfig,
)
from probepo.config.site import SiteConfig

__all__ = [
    "NOT_RECIPE",
    "AlgoConfig",
    "CheckpointSelection",
    "EvalConfig",
    "ExecutionProfile",
    "ModelConfig",
    "OptimConfig",
    "Retention",
    "RunConfig",
    "SamplingConfig",
    "SiteConfig",
    "StageResources",
    "TaskConfig",
    "WarmupConfig",
]
