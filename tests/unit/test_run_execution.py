"""The one rule by which `probepo check`, `train`, `resume` and `launch` take their executor and profile
(probepo/cli/site.py: run_execution): the site file's, else inline for the testbed or where sbatch is not
on PATH, else resident; each taken by default said with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.cli.site import run_execution
from probepo.presets import ConfigError


@pytest.fixture
def no_site(monkeypatch, tmp_path: Path) -> Path:
    """No site file (neither $PROBEPO_SITE nor the checkout's site.yaml), and a PATH of an empty folder:
    no SLURM on this machine. Returns that folder."""
    monkeypatch.delenv("PROBEPO_SITE", raising=False)
    monkeypatch.setattr("probepo.config.site.SITE_FILE", tmp_path / "no-site.yaml")
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


def test_the_testbed_runs_inline_without_slurm(no_site):
    chosen = run_execution(True, None, None)
    assert (chosen.executor, chosen.profile) == ("inline", None)
    (note,) = chosen.notes
    assert note == "executor: inline (the testbed runs in this process; --executor chooses another)"


def test_a_cluster_recipe_is_resident_where_sbatch_is_on_path_and_inline_where_not(no_site):
    chosen = run_execution(False, None, None)
    assert chosen.executor == "inline"
    assert chosen.notes[0].startswith("executor: inline (no SLURM on this machine (sbatch is not on PATH)")
    sbatch = no_site / "sbatch"  # only its presence on PATH counts: nothing runs it
    sbatch.write_text("#!/bin/sh\nexit 1\n")
    sbatch.chmod(0o755)
    chosen = run_execution(False, None, None)
    assert chosen.executor == "resident"
    assert chosen.notes == (
        "executor: resident (a cluster recipe: one job runs every stage, its engines resident;"
        " --executor chooses another)",
    )
    assert run_execution(True, None, None).executor == "inline"  # the testbed needs no cluster


def test_the_site_files_executor_and_profile_come_first_and_given_ones_win(no_site, monkeypatch, tmp_path):
    site = tmp_path / "site" / "site.yaml"
    site.parent.mkdir()
    site.write_text("executor: slurm\nprofile: profiles/gpu.yaml\n")
    monkeypatch.setenv("PROBEPO_SITE", str(site))
    profile = str(tmp_path / "site" / "profiles" / "gpu.yaml")
    chosen = run_execution(True, None, None)
    assert (chosen.executor, chosen.profile) == ("slurm", profile)
    assert chosen.notes == (
        f"executor: slurm (the site's, {site}; --executor chooses another)",
        f"profile: {profile} (the site's, {site}; --profile chooses another)",
    )
    given = run_execution(False, "local", Path("mine.yaml"))
    assert (given.executor, given.profile, given.notes) == ("local", "mine.yaml", ())
    # a recipe whose checkpoint_every the site's per-stage executor cannot run takes resident, as its form
    every_10 = run_execution(False, None, None, checkpoint_every=10)
    assert every_10.executor == "resident"
    assert every_10.notes[0] == (
        f"executor: resident (the site's, {site}; slurm keeps no engines resident;"
        " --executor chooses another)"
    )


def test_a_site_file_that_does_not_read_is_refused_naming_it(no_site, monkeypatch, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("exectuor: slurm\n")
    monkeypatch.setenv("PROBEPO_SITE", str(site))
    with pytest.raises(ConfigError, match=rf"^{site}: exectuor: no such field; did you mean executor\?"):
        run_execution(True, None, None)
