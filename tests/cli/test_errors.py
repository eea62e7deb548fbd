"""What `probepo train` does with each kind of failure: a user's error (config, profile, the site, a refused
submission) is one `error:` line and exit 2; a stage that failed in its job is its message (with the
job's stderr) and exit 1; anything else is a bug and keeps its traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from probepo.cli.train import _train
from probepo.config import ExecutionProfile
from probepo.presets import ConfigError
from probepo.run.execution import StageRequest
from probepo.stages.context import StageContext
from slurm.accounting import SlurmUnavailable
from slurm.backends import SubmitFailed, SubmitRefused
from slurm.runner import StageFailed
from tests.pipeline.conftest import tiny_config


class Raising:
    """A stage runner whose every stage raises `error`."""

    resident = True

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        raise self.error


def _train_with(error: BaseException, tmp_path: Path) -> None:
    _train(
        tiny_config("grpo"),
        "errors",
        store=str(tmp_path / "store"),
        tensorboard=tmp_path / "tb",
        quiet=True,
        take_over=False,
        command="probepo train",
        runner=Raising(error),
        profile=ExecutionProfile(),
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("sampling.context = 8 leaves no room"), 2),
        (SlurmUnavailable("slurmctld is not answering"), 2),
        (SubmitRefused("sbatch refused stage sample: Invalid partition name specified"), 2),
        (SubmitFailed("submitting stage sample failed 4 times"), 2),
        (StageFailed("job 7 ended FAILED (exit 1:0), the stage failed: KeyError: 'x'; stderr: ..."), 1),
    ],
)
def test_known_failures_are_an_error_line_with_their_exit_code(error, code, tmp_path, capsys):
    with pytest.raises(typer.Exit) as ended:
        _train_with(error, tmp_path)
    assert ended.value.exit_code == code
    assert capsys.readouterr().err.startswith(f"error: {error}")


def test_a_bug_keeps_its_traceback(tmp_path):
    with pytest.raises(TypeError, match="a bug"):  # not turned into an error line
        _train_with(TypeError("a bug"), tmp_path)
    with pytest.raises(ValueError, match="also a bug"):  # ValueError was caught as a user error before
        _train_with(ValueError("also a bug"), tmp_path)
