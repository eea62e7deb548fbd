"""`check_launch` names every problem it can find at once, each on its own line: a recipe that fails
validation still has its model, store and checkpoint_every checked, and a bad profile hides no unknown
executor. The local executor and a folder store: nothing here needs a service (the same on the SLURM
cluster: tests/slurm/test_check.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from slurm.check import check_launch

ROOT = Path(__file__).resolve().parents[2]


def _seven_b(tmp_path: Path, **model: str) -> dict:
    """The study's 7B recipe, its model a folder that does not exist."""
    fields = yaml.safe_load((ROOT / "configs" / "deepseekmath-7b-sft.yaml").read_text())
    fields["model"].update(pretrained=str(tmp_path / "deepseek-math-7b"), **model)
    return fields


def test_an_invalid_recipe_still_has_its_model_store_and_executor_checked(tmp_path):
    fields = _seven_b(tmp_path)
    fields["algo"]["kappa"] = -1
    store = tmp_path / "store"
    found = check_launch(fields, "local", None, store=str(store), source="7b.yaml").findings
    kappa, model, executor = found.failures
    assert kappa.startswith("7b.yaml: algo.kappa: -1 is refused")
    assert model == f"model.pretrained = {tmp_path / 'deepseek-math-7b'}: no such folder"
    assert executor.startswith("executor local: checkpoint_every = 10 needs engines that stay resident")
    assert any(line.startswith(f"store: {store}: 0 run(s), writable") for line in found.passed)


def test_a_model_invalid_on_its_own_is_left_to_the_recipes_failure(tmp_path):
    fields = _seven_b(tmp_path, dtype="float8")
    found = check_launch(fields, "inline", None, store=str(tmp_path / "store")).findings
    (dtype,) = found.failures
    assert dtype.startswith("config: model.dtype: 'float8' is refused")


def test_a_bad_profile_and_an_unknown_executor_are_both_named(tmp_path):
    fields = _seven_b(tmp_path)
    missing = tmp_path / "profile.yaml"
    found = check_launch(fields, "slurmm", missing, store=str(tmp_path / "store")).findings
    assert found.failures == [
        f"{missing}: cannot read the execution profile: No such file or directory",
        "executor 'slurmm': choose one of inline, local, slurm, resident",
        f"model.pretrained = {tmp_path / 'deepseek-math-7b'}: no such folder",
    ]
