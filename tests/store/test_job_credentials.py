"""The S3 store's credentials as a job receives them (probepo.checks.credentials), against moto: keys only in
this process's environment refused naming them and the fix; a credentials file named by
AWS_SHARED_CREDENTIALS_FILE, the default one under HOME and a profile of a config file passed, naming the
file and profile, the store accepting them; session credentials warned about (expiring within a job's
time limit, or no expiry recorded) or refused (expired); no credentials at all a warning (an instance
role cannot be seen from here); an unknown profile refused. And `check_launch` with the slurm executor
refusing environment-only keys whether or not SLURM answers. HOME is a temporary folder in every test: the
real ~/.aws is never read."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
import yaml

from probepo.checks.credentials import job_credential_findings
from probepo.checks.findings import Findings
from probepo.checks.store import store_findings
from probepo.config import ExecutionProfile
from probepo.store.s3 import _session as store_sessions
from slurm.check import check_launch
from tests.pipeline.conftest import tiny_config
from tests.s3server import S3Server

pytestmark = pytest.mark.integration  # moto's server answers the listings

KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
NOW = datetime.now(UTC)


@pytest.fixture
def keys(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """The test endpoint's keys, left in this process's environment (where s3_server put them), the
    AWS files /dev/null, HOME a fresh folder, and the store's cached sessions dropped around the test."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    store_sessions.cache_clear()
    yield {name: s3_server.env[name] for name in KEYS}
    store_sessions.cache_clear()


def _judged(url: str, limit_min: int = 60) -> Findings:
    return job_credential_findings(url, ExecutionProfile().exported(dict(os.environ)), limit_min, now=NOW)


def _file(path: Path, keys: dict[str, str], section: str = "default", **more: str) -> Path:
    lines = [f"[{section}]", *(f"{name.lower()} = {value}" for name, value in {**keys, **more}.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _utc(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def test_keys_only_in_the_environment_are_refused_naming_them_and_the_fix(keys, s3_bucket):
    (failure,) = _judged(f"s3://{s3_bucket}/p").failures
    assert failure.startswith(
        f"store s3://{s3_bucket}/p: this process reaches S3 with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"
        " from its environment, which jobs never get"
    )
    assert "export AWS_SHARED_CREDENTIALS_FILE naming it (allow-listed)" in failure
    assert "never add keys to env_allow" in failure
    assert keys["AWS_SECRET_ACCESS_KEY"] not in failure


def test_a_credentials_file_named_by_the_variable_passes_and_the_store_check_passes_through_it(
    keys, s3_bucket, tmp_path, monkeypatch
):
    credentials = _file(tmp_path / "shared" / "credentials", keys)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    url = f"s3://{s3_bucket}/p"
    found = _judged(url)
    assert found.failures == found.warnings == []
    assert found.passed == [
        f"store {url}: jobs get credentials from {credentials} (AWS_SHARED_CREDENTIALS_FILE, profile"
        " default), which the store accepts (a listing made as a job would); not this process's"
        " AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, which jobs never get"
    ]
    for name in KEYS:  # as on a compute node: the file alone
        monkeypatch.delenv(name)
    store_sessions.cache_clear()
    assert store_findings(url).passed[0].startswith(f"store: {url}: 0 run(s), writable")
    (passed,) = _judged(url).passed
    assert passed.endswith("(a listing made as a job would)")


def test_the_default_credentials_file_under_home_passes_naming_it(keys, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")
    credentials = _file(tmp_path / "home" / ".aws" / "credentials", keys)
    (passed,) = _judged(f"s3://{s3_bucket}/p").passed
    assert f"from {credentials} (the default under HOME, your home in a job too, profile default)" in passed


def test_a_profile_of_a_config_file_passes_naming_file_and_profile(keys, s3_bucket, tmp_path, monkeypatch):
    config = _file(tmp_path / "shared" / "config", keys, section="profile team")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "team")
    found = _judged(f"s3://{s3_bucket}/p")
    assert found.failures == found.warnings == []
    (passed,) = found.passed
    assert (
        f"jobs get credentials from {config} (AWS_CONFIG_FILE, profile team), which the store accepts"
        in passed
    )


def test_session_credentials_expiring_within_a_jobs_time_limit_are_warned_about_with_both_times(
    keys, s3_bucket, tmp_path, monkeypatch
):
    expires = NOW + timedelta(minutes=10)
    credentials = _file(
        tmp_path / "credentials",
        keys,
        aws_session_token="session",
        x_security_token_expires=expires.isoformat(),
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    found = _judged(f"s3://{s3_bucket}/p", limit_min=60)
    (warning,) = found.warnings
    assert f"the session credentials (aws_session_token) jobs get from {credentials}" in warning
    assert (
        f"expire at {_utc(expires)} (x_security_token_expires), before a job started now reaches its time"
        f" limit of 60 min ({_utc(NOW + timedelta(minutes=60))}): a job still running then fails"
    ) in warning
    assert found.failures == [] and len(found.passed) == 1


def test_expired_session_credentials_are_refused(keys, s3_bucket, tmp_path, monkeypatch):
    expired = (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")  # as saml2aws writes it
    credentials = _file(
        tmp_path / "credentials", keys, aws_session_token="s", x_security_token_expires=expired
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    found = _judged(f"s3://{s3_bucket}/p")
    (failure,) = found.failures
    assert f"expired at {_utc(NOW - timedelta(minutes=5))} (x_security_token_expires), before now" in failure
    assert "refresh them" in failure and found.passed == []


def test_session_credentials_without_an_expiry_are_warned_about(keys, s3_bucket, tmp_path, monkeypatch):
    credentials = _file(tmp_path / "credentials", keys, aws_session_token="session")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    (warning,) = _judged(f"s3://{s3_bucket}/p").warnings
    assert "record no expiry (x_security_token_expires, aws_expiration, expiration)" in warning
    assert "a session token typically lasts 1–12 h, and a job fails when it expires" in warning


def test_no_credentials_at_all_is_a_warning_for_an_instance_role(keys, s3_bucket, monkeypatch):
    for name in KEYS:
        monkeypatch.delenv(name)
    found = _judged(f"s3://{s3_bucket}/p")
    (warning,) = found.warnings
    assert (
        "jobs find no credentials" in warning and "they need an instance role on the compute nodes" in warning
    )
    assert found.failures == []


def test_an_unknown_profile_is_refused_naming_it(keys, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "nobody")
    (failure,) = _judged(f"s3://{s3_bucket}/p").failures
    assert "profile nobody" in failure and "The config profile (nobody) could not be found" in failure


def test_check_launch_with_the_slurm_executor_refuses_keys_only_in_the_environment(keys, s3_bucket, tmp_path):
    """Said whether SLURM answers here or not: the finding does not wait for the backend."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"job_folder": str(tmp_path / "jobs")}))
    url = f"s3://{s3_bucket}/lab"
    found = check_launch(tiny_config("probepo", store=url), "slurm", profile).findings
    assert any(line.startswith(f"store: {url}: 0 run(s), writable") for line in found.passed)  # this process
    assert any(
        line.startswith(f"store {url}: this process reaches S3 with AWS_ACCESS_KEY_ID")
        for line in found.failures
    )
    inline = check_launch(tiny_config("probepo", store=url), "inline", None).findings
    assert not any("jobs never get" in line for line in inline.failures)  # in this process: its own keys


def test_a_child_that_cannot_resolve_is_a_warning_not_a_finding_about_the_credentials(tmp_path):
    found = job_credential_findings("s3://b/p", {"PYTHONHOME": str(tmp_path)}, 60)  # no Python starts there
    (warning,) = found.warnings
    assert warning.startswith(
        "store s3://b/p: the credentials jobs get are unchecked: resolving them as a job"
    )
    assert found.failures == found.passed == []
