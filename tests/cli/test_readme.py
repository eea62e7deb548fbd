"""The README's commands and the site's guides, followed as written. The "Your first `train`" block runs
here, from a folder laid out like the repository root (the venv and the presets), and does what the
section says; every other `probepo` command of a bash block (a cluster's, which cannot run here, and the
quick start's list of commands on runs it names but never makes) is parsed against the CLI's own options
(click's parser from `typer.main.get_command`, without running it), and every script a block runs with
`bash` exists. The README's other runnable blocks run elsewhere: `bash scripts/demo` in
tests/cli/test_first_hour.py (on a tiny preset), `bash scripts/test` is `.ci/run` itself, and the Prefect
block's `infra/prefect/deploy.sh` deploys the flows the tests/flows tests launch."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.exceptions import Exit, TyperException

from probepo.cli import app

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Your first `train`"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
STAGED_RECIPE = "/shared/probepo/staged/dsm7b/recipe.yaml"


def bash_blocks(text: str) -> list[list[str]]:
    """Each bash block's commands: continuation lines joined, comments and blank lines left out."""
    blocks = re.findall(r"^ *```bash\n(.*?)^ *```", text, re.S | re.M)
    joined = [re.sub(r"\\\n\s*", " ", block) for block in blocks]
    return [[line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
            for block in joined]  # fmt: skip


def first_train_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = bash_blocks(section)
    assert blocks, f"README's {SECTION} section has no bash block"
    return blocks[0]


def probepo_commands() -> list[tuple[str, list[str]]]:
    """(document, argv after `probepo`) of every probepo command of every bash block."""
    found = []
    for document in DOCUMENTS:
        for block in bash_blocks(document.read_text()):
            for command in block:
                words = shlex.split(command, comments=True)
                if words and words[0] in ("probepo", ".venv/bin/probepo"):
                    found.append((document.name, words[1:]))
    return found


def parsed(argv: list[str]) -> Any:
    """The context the CLI's parser makes of `probepo ARGV`, resilient parsing off, without running it: an
    unknown command or option, a missing argument or a value of the wrong type raises click's UsageError
    (a TyperException)."""
    command, context, name, rest = typer.main.get_command(app), None, "probepo", list(argv)
    while hasattr(command, "commands"):
        context = command.context_class(command, info_name=name, parent=context)
        if not rest:
            context.fail("a command is missing")
        name, command, rest = command.resolve_command(context, rest)
    return command.make_context(name, rest, parent=context, resilient_parsing=False)


def test_every_documented_probepo_command_parses():
    commands = probepo_commands()
    assert {"README.md", "cluster.md", "quickstart.md"} <= {document for document, _ in commands}
    refused = []
    for document, argv in commands:
        try:
            parsed(argv)
        except Exit as done:  # `--help` prints and exits while parsing
            if done.exit_code != 0:
                refused.append(f"{document}: probepo {' '.join(argv)}: exit {done.exit_code}")
        except TyperException as exc:
            refused.append(f"{document}: probepo {' '.join(argv)}: {exc}")
    assert not refused, "\n".join(refused)
    cluster_train = next(argv for _, argv in commands if argv[:2] == ["train", STAGED_RECIPE])
    options = parsed(cluster_train).params  # what the parse gives is what the command would run with
    assert (options["executor"], options["run_id"]) == ("resident", "r1")
    assert options["profile"] == Path("my-site.yaml") and options["store"] == "s3://my-bucket/probepo"


def test_a_command_the_cli_does_not_take_is_refused_by_the_parse():
    refusals = {
        "No such option: --profle": ["train", "configs/cpu-demo.yaml", "--run-id", "r", "--profle", "p.yaml"],
        "valid integer": ["logs", "r1", "--tail", "fifty"],
        "No such command 'stag'": ["stag", "configs/cpu-demo.yaml", "--to", "out"],
        "Missing parameter: run": ["store", "gc"],
        "a command is missing": ["store"],
    }
    for message, argv in refusals.items():
        with pytest.raises(TyperException, match=message):
            parsed(argv)


def test_every_script_a_block_runs_exists():
    scripts = [
        (document.name, script)
        for document in DOCUMENTS
        for block in bash_blocks(document.read_text())
        for command in block
        for script in re.findall(r"\bbash (\S+\.sh|scripts/\w+)", command)
    ]
    assert ("README.md", "scripts/demo") in scripts and ("README.md", "infra/prefect/deploy.sh") in scripts
    assert not [found for found in scripts if not (ROOT / found[1]).is_file()]


def test_the_quick_start_shows_the_readmes_first_train():
    quickstart = (ROOT / "docs" / "guides" / "quickstart.md").read_text()
    assert first_train_commands() in bash_blocks(quickstart)


@pytest.mark.integration
@pytest.mark.timeout(900)
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
