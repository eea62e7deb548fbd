"""How many of a run's full checkpoints keep what: an execution setting (the profile's `retention`), never
part of the recipe. At 7B a full checkpoint is ~100 GB, most of it the optimizer state that only a resume
reads; the weights are what evaluations read."""

from __future__ import annotations

from pydantic import Field

from probepo.config.base import Strict
from probepo.config.evaluation import CheckpointSelection


class Retention(Strict):
    """What the driver deletes after each full checkpoint (and `probepo store gc --checkpoints` on demand).
    The latest full checkpoint is always kept whole: it is where a resume starts. The default keeps
    everything."""

    optimizer_last: int | None = Field(None, ge=1)
    """Keep the optimizer state of the last this many full checkpoints (a resume restarts from the latest;
    2 leaves one to fall back on should the latest be found corrupt); None: every checkpoint's."""

    weights_every: int = Field(1, ge=1)
    """Keep the weights of the checkpoints whose update is a multiple of this, besides those that keep their
    optimizer state; 1: every checkpoint's weights."""

    pending_evaluation: CheckpointSelection | None = Field(default_factory=CheckpointSelection)
    """Never delete the weights of a checkpoint this selection (the nightly evaluation's) takes that still
    lacks an evaluation on `evaluation_suites` (one the run made itself counts: the nightly takes its
    numbers); None: no such guard, the two settings above alone decide."""

    evaluation_suites: tuple[str, ...] | None = Field(None, min_length=1)
    """The suites the nightly evaluation runs, for `pending_evaluation`; None (the nightly's default too):
    each run's own, its `eval.benchmarks` (a maths run's six at the study's k) or else its held-out split.
    Not empty: leave it unset for each run's own."""

    @property
    def keeps_everything(self) -> bool:
        """Nothing would ever be deleted (the default)."""
        return self.optimizer_last is None and self.weights_every == 1
