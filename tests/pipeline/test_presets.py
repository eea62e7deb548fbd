"""The presets in configs/ load, and the embedded default is exactly RunConfig's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.config import RunConfig
from probepo.presets import load_profile, load_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_cpu_demo_preset_is_the_embedded_default():
    assert load_run_config(CONFIGS / "cpu-demo.yaml") == RunConfig()


@pytest.mark.parametrize("preset", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_preset_is_valid(preset):
    assert isinstance(load_run_config(preset), RunConfig)


def test_dotted_overrides_and_errors_name_the_file_and_field(tmp_path):
    config = load_run_config(CONFIGS / "cpu-demo.yaml", {"algo.kappa": 0.0, "num_updates": 3})
    assert config.algo.kappa == 0.0 and config.num_updates == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  windw: 8\n")
    with pytest.raises(ValueError, match=r"bad\.yaml(.|\n)*algo\.windw"):
        load_run_config(bad)
    with pytest.raises(ValueError, match="rescue_suffix"):
        load_run_config(CONFIGS / "cpu-demo.yaml", {"algo.rescue_suffix": "\\boxed{"})


@pytest.mark.parametrize("path", sorted((CONFIGS / "profiles").glob("*.yaml")), ids=lambda p: p.name)
def test_every_execution_profile_is_valid(path):
    profile = load_profile(path)
    assert profile.resources("optimize").time_min >= 1
