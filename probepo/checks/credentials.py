"""The S3 store's credentials as a job receives them. Jobs get only the execution profile's allow-listed
environment (sbatch --export; the local executor's stage jobs the same), never keys or tokens: keys that
reach S3 here only as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY pass the store's own check and fail every
job after its queue wait. Session credentials in a credentials file do reach jobs, until they expire.

botocore's own chain runs in a child process given exactly that environment (0.5 s, idle), so it reads
what a job's botocore reads: the credentials and config files the environment names (else ~/.aws/ under
its HOME), AWS_PROFILE, credential_process, the endpoint, CA bundle and proxies; a session in this process
would read this process's os.environ. An instance role cannot be seen from a login node: the child leaves
it out, and finding nothing else is a warning. The child imports this module: its top level stays
standard library (and checks.findings, which is).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probepo.checks.findings import Findings

if TYPE_CHECKING:
    from probepo.checks.launch import Launch

ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
"""The credentials botocore reads from the environment; the allow-list never passes them to a job."""
EXPIRY_KEYS = ("x_security_token_expires", "aws_expiration", "expiration")
"""Where tools that write session credentials into a profile record their expiry, ISO-8601 (saml2aws and
gimme-aws-creds: x_security_token_expires); botocore reads no expiry from a file."""
RESOLVE_TIMEOUT_S = 60.0
"""The child's limit: a credential_process or the listing may be slow, a check must still end."""
_FILES = {"shared-credentials-file": "AWS_SHARED_CREDENTIALS_FILE", "config-file": "AWS_CONFIG_FILE"}


def check(launch: Launch) -> Findings:
    """An S3 store's credentials as the executor's jobs receive them: every backend's jobs get only the
    profile's allow-listed environment, the local executor's included; jobs that run in this process have
    this process's."""
    store = launch.config.store if launch.config is not None else launch.fields.get("store")
    profile, executor = launch.profile, launch.executor
    if profile is None or executor is None or executor.in_process:
        return Findings()
    if not isinstance(store, str) or not store.startswith("s3://"):
        return Findings()
    longest = max(profile.resources(stage).time_min for stage in executor.stages)
    return job_credential_findings(store, profile.exported(dict(os.environ)), longest)


def job_credential_findings(
    url: str,
    exported: dict[str, str],
    time_limit_min: int,
    *,
    environ: dict[str, str] | None = None,
    now: datetime | None = None,
) -> Findings:
    """The credentials a job given `exported` (`profile.exported(dict(os.environ))`) reaches the S3 store
    `url` with: their source (and the store accepting them, on a listing), the expiry of session
    credentials against a job of `time_limit_min` started `now`, or a failure naming the variables of
    `environ` (this process's) that jobs never get."""
    environ = dict(os.environ) if environ is None else environ
    job, where = _resolve_in_child(url, exported), f"store {url}"
    if "unjudged" in job:  # not a finding about the credentials: the store check and --probe-job remain
        return Findings(warnings=[f"{where}: the credentials jobs get are unchecked: {job['unjudged']}"])
    files = f"credentials file {job['credentials_file']}, config file {job['config_file']}"
    files += f", profile {job['profile']}"
    if "error" in job:
        fix = "fix AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE or AWS_CONFIG_FILE, or the files they name"
        return Findings(failures=[f"{where}: the credentials jobs get ({files}): {job['error']}: {fix}"])
    stripped = [name for name in ENV_KEYS if environ.get(name) and name not in exported]
    if job["method"] is None and stripped:
        return Findings(
            failures=[
                f"{where}: this process reaches S3 with {', '.join(stripped)} from its environment, which"
                f" jobs never get, and jobs find no other credentials (in {files}): put them in a credentials"
                " file on a shared file system and export AWS_SHARED_CREDENTIALS_FILE naming it"
                " (allow-listed), or use a profile (AWS_PROFILE) or an instance role; never add keys to"
                " env_allow (refused by design: every job's environment would hold them)"
            ]
        )
    if job["method"] is None:
        return Findings(
            warnings=[
                f"{where}: jobs find no credentials (in {files}, no credential_process): they need an"
                " instance role on the compute nodes, which cannot be seen from here (`--probe-job` tries"
                " from a job); without one, put keys in a credentials file on a shared file system and export"
                " AWS_SHARED_CREDENTIALS_FILE naming it"
            ]
        )
    source = _source(job, exported)
    found = Findings()
    if job["token"]:
        session = f"{where}: the session credentials (aws_session_token) jobs get from {source}"
        expired, line = _expiry(session, job["expiry"], time_limit_min, now or datetime.now(UTC))
        (found.failures if expired else found.warnings).append(line)
        if expired:
            return found
    if job["listing"] not in ("ok", "NoSuchBucket", None):  # no bucket, unreachable: the store check says
        found.failures.append(
            f"{where}: the store refuses the credentials jobs get from {source} ({job['listing']}, on a"
            " listing made as a job would): update them there"
        )
        return found
    passed = f"{where}: jobs get credentials from {source}"
    if job["listing"] == "ok":
        passed += ", which the store accepts (a listing made as a job would)"
    if stripped:
        passed += f"; not this process's {', '.join(stripped)}, which jobs never get"
    found.passed.append(passed)
    return found


def _source(job: dict[str, Any], exported: dict[str, str]) -> str:
    """Where a job's credentials come from, in words: the file and profile, never the secret."""
    method, profile = job["method"], job["profile"]
    if method in _FILES:
        named = (
            _FILES[method] if _FILES[method] in exported else "the default under HOME, your home in a job too"
        )
        return f"{job['file']} ({named}, profile {profile})"
    if method == "custom-process":
        return f"profile {profile}'s credential_process (run in each job: the compute nodes need its program)"
    if method == "assume-role":
        return f"profile {profile}'s role_arn (assumed in each job)"
    return f"botocore's {method} provider, profile {profile}"


def _expiry(session: str, expiry: list[str] | None, limit_min: int, now: datetime) -> tuple[bool, str]:
    """Whether session credentials have expired, and the line that says when they expire, against the end of
    a job started `now` (`expiry`: the profile's key and text; None: how long such tokens last)."""
    if expiry is None:
        return False, (
            f"{session} record no expiry ({', '.join(EXPIRY_KEYS)}): a session token typically lasts 1–12 h,"
            " and a job fails when it expires: refresh them before each launch, or use long-lived keys or an"
            " instance role"
        )
    key, text = expiry
    try:
        expires = datetime.fromisoformat(text)
    except ValueError:
        return False, f"{session}: {key} = {text!r} is not an ISO-8601 time: a job fails when they expire"
    expires = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    end = now + timedelta(minutes=limit_min)
    if expires <= now:
        return True, (
            f"{session} expired at {_utc(expires)} ({key}), before now ({_utc(now)}): refresh them (re-run"
            " the tool that wrote them, e.g. `saml2aws login`) and check again"
        )
    ends = f"a job started now reaches its time limit of {limit_min} min ({_utc(end)})"
    if expires < end:
        return False, (
            f"{session} expire at {_utc(expires)} ({key}), before {ends}: a job still running then fails, as"
            " does every job started after: refresh them before launching, or use long-lived keys"
        )
    return False, (
        f"{session} expire at {_utc(expires)} ({key}), after {ends}; every job started after"
        f" {_utc(expires)} fails: refresh them before then"
    )


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _resolve_in_child(url: str, exported: dict[str, str]) -> dict[str, Any]:
    """`_resolve(url)` in a child of this interpreter whose whole environment is `exported`."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r});"
        " from probepo.checks.credentials import _resolve; print(json.dumps(_resolve(sys.argv[1])))"
    )
    command = [sys.executable, "-c", code, url]
    try:
        done = subprocess.run(
            command, env=exported, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"unjudged": f"resolving them as a job would took over {RESOLVE_TIMEOUT_S:g} s"}
    try:
        return json.loads(done.stdout)
    except ValueError:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        said = next((line for line in reversed(lines) if "Error" in line), lines[-1])  # the exception's line
        return {"unjudged": f"resolving them as a job would failed: {said.strip()}"}


def _resolve(url: str) -> dict[str, Any]:
    """In the child: botocore's chain bar the instance and container roles, what it found (its method, the
    profile, the file, a session token and its recorded expiry) and one listing under `url` with it."""
    import botocore.session
    from botocore.config import Config
    from botocore.configloader import load_config, raw_config_parse
    from botocore.exceptions import BotoCoreError, ClientError

    session = botocore.session.Session()
    profile = session.get_config_variable("profile") or "default"
    names = {"credentials_file": "shared-credentials-file", "config_file": "config-file"}
    files = {name: os.path.expanduser(session.get_config_variable(name)) for name in names}
    report: dict[str, Any] = {"profile": profile, **files, "method": None}
    try:
        resolver = session.get_component("credential_provider")  # reads the config file: ProfileNotFound
        for method in ("container-role", "iam-role"):
            resolver.remove(method)  # invisible from a login node, and looking waits for a timeout
        credentials = session.get_credentials()
    except BotoCoreError as exc:  # an unknown profile, a credential_process that fails
        return {**report, "error": str(exc)}
    if credentials is None:
        return report
    report["method"] = credentials.method
    section: dict[str, str] = {}  # other providers refresh their own credentials
    if credentials.method == "shared-credentials-file":
        section = raw_config_parse(files["credentials_file"]).get(profile, {})
    elif credentials.method == "config-file":
        section = load_config(files["config_file"])["profiles"].get(profile, {})
    report["file"] = next(
        (files[name] for name, method in names.items() if method == credentials.method), None
    )
    report["token"] = any(section.get(key) for key in ("aws_session_token", "aws_security_token"))
    report["expiry"] = next(((key, section[key]) for key in EXPIRY_KEYS if section.get(key)), None)
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    config = Config(connect_timeout=5, read_timeout=15, retries={"total_max_attempts": 2})
    try:
        session.create_client("s3", config=config).list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        report["listing"] = "ok"
    except ClientError as exc:
        report["listing"] = exc.response.get("Error", {}).get("Code", "refused")
    except BotoCoreError:  # unreachable from here: the store check names the endpoint
        report["listing"] = None
    return report
