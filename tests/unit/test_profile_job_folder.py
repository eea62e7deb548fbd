"""A profile's relative job folder is its own file's (probepo/presets.py: load_profile), so a worker started
in the checkout does not write job logs and TensorBoard events into it; one in the home (`~/...`) is the
home's."""

from __future__ import annotations

import os

from probepo.presets import load_profile


def test_a_relative_job_folder_is_taken_from_the_profiles_folder(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "profile.yaml").write_text("job_folder: jobs\n")
    (site / "absolute.yaml").write_text(f"job_folder: {tmp_path / 'shared'}\n")
    monkeypatch.chdir(tmp_path)
    assert load_profile("site/profile.yaml").job_folder == str(site / "jobs")
    assert load_profile(site / "absolute.yaml").job_folder == str(tmp_path / "shared")
    assert load_profile(None).job_folder == "out/jobs"  # no file: the reader's own folder
    assert os.path.isabs(load_profile("site/profile.yaml").job_folder)


def test_a_job_folder_in_the_home_is_written_out(tmp_path, monkeypatch):
    """`~/probepo-jobs` names the reader's home; left as it is, a resolve() would make a folder named `~`."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "profile.yaml").write_text("job_folder: ~/probepo-jobs\n")
    assert load_profile(tmp_path / "profile.yaml").job_folder == str(tmp_path / "home" / "probepo-jobs")
