"""README's "Your first `train`" section, followed verbatim: its commands run as written, from a folder
laid out like the repository root (the venv and the presets), and do what the section says."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Your first `train`"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def first_train_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"README's {SECTION} section has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_first_train_section_works_as_written(tmp_path):
    for name in (".venv", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {key: value for key, value in os.environ.items() if key != "PROBEPO_STORE"}
    outputs = []
    for command in first_train_commands():
        result = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    train, ls, resume, report = outputs
    assert "warm-up: making warmup-" in train and "starting run first: 4 updates" in train
    assert "status: complete" in ls and "4 updates" in ls
    assert "extended from 4 to 6 updates" in resume
    assert "first was extended from 4 to 6 updates" in report
    assert (tmp_path / "store" / "runs" / "first").is_dir()
    assert list((tmp_path / "out" / "tensorboard" / "first").glob("events.out.tfevents.*"))
    assert (tmp_path / "out" / "first" / "curves.png").is_file()
