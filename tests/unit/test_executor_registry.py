"""The executor registry: every name the CLI and the flows accept is one entry, unknown names are refused
naming the choices, and the flows' parameters offer exactly the registry's names."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args, get_type_hints

import pytest

from flows.evaluate import evaluate
from flows.train import train
from slurm.executors import EXECUTORS, UnknownExecutor, executor_for, make_runner


def test_unknown_executors_are_refused_naming_the_choices():
    with pytest.raises(
        UnknownExecutor, match=r"executor 'pbs': choose one of inline, local, slurm, resident"
    ):
        make_runner("pbs")
    with pytest.raises(UnknownExecutor, match=r"executor 'resident': choose one of inline, local, slurm$"):
        executor_for("resident", arrays=True)
    assert UnknownExecutor.user_error


def test_the_flows_offer_the_registrys_names():
    assert get_args(get_type_hints(train.fn)["executor"]) == tuple(EXECUTORS)
    arrays = tuple(name for name, executor in EXECUTORS.items() if executor.arrays)
    assert get_args(get_type_hints(evaluate.fn)["executor"]) == arrays


def test_the_cli_help_names_every_executor():
    shown = subprocess.run(
        [sys.executable, "-m", "probepo.cli", "train", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert all(f"{name} (" in " ".join(shown.split()) for name in EXECUTORS)


def test_an_executor_says_whether_its_runner_keeps_engines_resident():
    """`probepo check` refuses checkpoint_every > 1 by the entry, train by the runner: they must agree."""
    from probepo.config import ExecutionProfile

    for name, executor in EXECUTORS.items():
        assert executor.resident == executor.runner(None, ExecutionProfile()).resident, name


@pytest.mark.parametrize("name", ["slurm", "resident"])
def test_without_slurm_the_refusal_names_the_executor_asked_for(name, tmp_path, monkeypatch):
    """`probepo check --executor resident` on a machine without SLURM said `--executor slurm needs ...`."""
    from probepo.config import ExecutionProfile
    from slurm.accounting import SlurmUnavailable

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, sacct, squeue or scontrol
    said = rf"^--executor {name} needs SLURM's commands, and sbatch, sacct, squeue, scontrol is not on PATH"
    with pytest.raises(SlurmUnavailable, match=said):
        make_runner(name)
    with pytest.raises(SlurmUnavailable, match=said):  # as `probepo check` asks the executor's backend
        EXECUTORS[name].backend(ExecutionProfile()).check()
