"""What a SLURM site must offer an execution profile, asked of the controller in seconds from the login node
(`scontrol`, `sacctmgr`), instead of learnt from a job refused or killed hours later: each stage's partition,
account and QOS exist and are the user's, its time limit is within the partition's MaxTime, its GPUs within
what a node of the partition has; the job folder is one the compute nodes share; and what a preempted job
will receive, which depends on the controller's settings (`preempt_send_user_signal`) and on whose
GraceTime counts: the partition's under `preempt/partition_prio`, the job's QOS's under `preempt/qos`
(SLURM's preempt/qos plugin takes a preempted job's grace time and preempt mode from its QOS alone).
"""

from __future__ import annotations

import dataclasses
import getpass
import re
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from probepo.checks.findings import Findings
from probepo.config import ExecutionProfile, StageResources

LOCAL_FOLDERS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
"""Folders every machine has a private one of: a job folder there is not seen by other nodes."""
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


@dataclass(frozen=True)
class Partition:
    name: str
    max_time_min: float | None
    """None: unlimited."""
    grace_s: int
    preempt_mode: str
    nodes: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class Qos:
    name: str
    grace_s: int
    preempt_mode: str
    """Its PreemptMode; `cluster`: the cluster's."""
    preempts: frozenset[str]
    """The QOS whose jobs its jobs may preempt (sacctmgr's `Preempt`)."""


@dataclass(frozen=True)
class Preemption:
    """How a stage's job is preempted: by whose setting (a partition's or a QOS's), with what grace."""

    source: str
    """`partition low`, `QOS standby`."""
    grace_s: int


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    gpus: int


@dataclass(frozen=True)
class Site:
    """What the controller says of its partitions, nodes, the user's associations and its preemption."""

    partitions: dict[str, Partition]
    nodes: dict[str, Node]
    accounts: dict[str, frozenset[str]] | None
    """The user's accounts, each with the QOS it may use; None where accounting does not answer."""
    qos: dict[str, Qos] | None
    """Every QOS by name; None where accounting does not answer."""
    config: dict[str, str]
    """`scontrol show config`, key to value."""
    default_qos: dict[str, str] = dataclasses.field(default_factory=dict)
    """Each of the user's accounts' default QOS, where its association sets one."""
    default_account: str | None = None
    """The user's default account (what a job without --account runs under)."""

    @property
    def default_partition(self) -> str | None:
        return next(iter(self.partitions), None)


def _fields(line: str) -> dict[str, str]:
    """`Key=Value Key=Value …` of scontrol's one-line output (values may hold `=`)."""
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


def minutes(limit: str) -> float | None:
    """A SLURM time (`UNLIMITED`, `D-HH:MM:SS`, `HH:MM:SS`, `MM:SS`, `MM`) in minutes; None: unlimited."""
    if limit.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    hours, mins, secs = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + hours * 60 + mins + secs / 60


def gpus_in_gres(gres: str) -> int:
    """The GPUs a node's `Gres=` names (`gpu:8`, `gpu:h200:8(S:0-1)`, several types summed)."""
    return sum(int(count) for count in _GPUS.findall(gres))


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(command)}`: {done.stderr.strip() or done.returncode}")
    return done.stdout


def read_site(user: str | None = None) -> Site:
    """Ask the controller (and accounting, where it answers) about the site."""
    partitions, default = {}, []
    for line in _run(["scontrol", "show", "partition", "-o"]).splitlines():
        if not line.strip():
            continue
        f = _fields(line)
        partition = Partition(
            f["PartitionName"],
            minutes(f.get("MaxTime", "UNLIMITED")),
            int(f.get("GraceTime", "0")),  # seconds
            f.get("PreemptMode", "OFF"),
            tuple(_expand(f.get("Nodes", ""))),
            f.get("State", "UP"),
        )
        (default if f.get("Default") == "YES" else []).append(partition.name)
        partitions[partition.name] = partition
    ordered = {name: partitions[name] for name in [*default, *partitions]}  # the default first
    nodes = {}
    for line in _run(["scontrol", "show", "node", "-o"]).splitlines():
        if line.strip():
            f = _fields(line)
            gres = gpus_in_gres(f.get("Gres", ""))
            nodes[f["NodeName"]] = Node(f["NodeName"], f.get("NodeAddr", f["NodeName"]), gres)
    config = {}
    for line in _run(["scontrol", "show", "config"]).splitlines():
        key, equals, value = line.partition("=")
        if equals:
            config[key.strip()] = value.strip()
    try:
        accounts, qos, default_qos, default_account = _associations(user or getpass.getuser())
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired):
        return Site(ordered, nodes, None, None, config)
    return Site(ordered, nodes, accounts, qos, config, default_qos, default_account)


def _associations(
    user: str,
) -> tuple[dict[str, frozenset[str]], dict[str, Qos], dict[str, str], str | None]:
    """The user's accounts (each with its QOS and default QOS), default account, and every QOS, from
    accounting (`sacctmgr`)."""
    rows = _run(
        ["sacctmgr", "-nP", "show", "assoc", "where", f"user={user}", "format=account,qos,defaultqos"]
    )
    accounts: dict[str, frozenset[str]] = {}
    default_qos = {}
    for row in rows.splitlines():
        account, allowed, default = row.split("|")[:3]  # -P: one column a field, empty ones too
        accounts[account] = accounts.get(account, frozenset()) | frozenset(filter(None, allowed.split(",")))
        if default:
            default_qos[account] = default
    table = _run(["sacctmgr", "-nP", "show", "qos", "format=name,gracetime,preemptmode,preempt"])
    qos = {}
    for row in table.splitlines():
        name, grace, mode, preempts = row.split("|")[:4]
        if name:  # GraceTime as sacctmgr prints it, HH:MM:SS
            grace_s = round((minutes(grace or "0") or 0.0) * 60)
            qos[name] = Qos(name, grace_s, mode or "cluster", frozenset(filter(None, preempts.split(","))))
    defaults = _run(["sacctmgr", "-nP", "show", "user", user, "format=defaultaccount"]).split()
    return accounts, qos, default_qos, defaults[0] if defaults else None


def _expand(hosts: str) -> list[str]:
    """A SLURM host list (`gpu[01-03],login`) as names, through scontrol."""
    if not hosts or hosts == "(null)":
        return []
    if "[" not in hosts:
        return hosts.split(",")
    return _run(["scontrol", "show", "hostnames", hosts]).split()


def _is_this_host(node: Node) -> bool:
    return node.address in ("127.0.0.1", "::1", "localhost") or node.name == socket.gethostname()


def stage_findings(site: Site, where: str, resources: StageResources) -> Findings:
    """What the site says of one set of resources, set in the profile's `where` (`defaults`,
    `stages.optimize`, …: named in every line)."""
    found = Findings()
    fix = f"the execution profile's {where}"
    name = resources.partition or site.default_partition
    partition = site.partitions.get(name or "")
    if partition is None:
        found.failures.append(
            f"partition {resources.partition!r} does not exist (partitions:"
            f" {', '.join(site.partitions)}): fix {fix}"
        )
        return found
    if partition.state != "UP":
        found.warnings.append(f"partition {name} is {partition.state}: jobs will wait until it is UP")
    if partition.max_time_min is not None and resources.time_min > partition.max_time_min:
        found.failures.append(
            f"time_min = {resources.time_min} is over partition {name}'s MaxTime of"
            f" {partition.max_time_min:g} minutes (a stage past it carries on in its next job): lower it in"
            f" {fix}"
        )
    node_gpus = max((site.nodes[n].gpus for n in partition.nodes if n in site.nodes), default=0)
    asked = resources.gpus_per_node or resources.gpus_per_task * resources.tasks_per_node
    if asked > node_gpus:
        found.failures.append(
            f"{asked} GPUs per node asked, but partition {name}'s nodes have at most {node_gpus}: lower"
            f" gpus_per_node (or gpus_per_task × tasks_per_node) in {fix}"
        )
    if too_many := too_many_nodes(site, where, resources):
        found.failures.append(too_many)
    found.extend(_association_findings(site, resources, fix))
    if not found.failures:
        found.passed.append(
            f"slurm: {where}: partition {name} ({len(partition.nodes)} node(s), MaxTime"
            f" {'unlimited' if partition.max_time_min is None else f'{partition.max_time_min:g} min'},"
            f" {node_gpus} GPUs a node), {resources.time_min} min, {resources.nodes} node(s) x"
            f" {resources.tasks_per_node} rank(s), {asked} GPUs a node"
        )
    return found


def too_many_nodes(site: Site, where: str, resources: StageResources) -> str | None:
    """Why the partition cannot run a job of `resources.nodes` nodes (set in the profile's `where`), or
    None when it can (a partition that does not exist is stage_findings' to say)."""
    name = resources.partition or site.default_partition
    partition = site.partitions.get(name or "")
    if partition is None or resources.nodes <= len(partition.nodes):
        return None
    return (
        f"nodes = {resources.nodes}, but partition {name} has {len(partition.nodes)} node(s)"
        f" ({', '.join(partition.nodes)}): lower nodes, or give a partition of {resources.nodes}, in the"
        f" execution profile's {where}"
    )


def _association_findings(site: Site, resources: StageResources, fix: str) -> Findings:
    found = Findings()
    if site.accounts is None:
        if resources.account or resources.qos:
            found.warnings.append("accounting (sacctmgr) did not answer: account and QOS left unchecked")
        return found
    if resources.account and resources.account not in site.accounts:
        found.failures.append(
            f"account {resources.account!r} is not one of yours ({', '.join(site.accounts) or 'none'}): fix"
            f" {fix}"
        )
    if resources.qos:
        allowed = site.accounts.get(resources.account or "", frozenset().union(*site.accounts.values()))
        if site.qos is not None and resources.qos not in site.qos:
            found.failures.append(
                f"QOS {resources.qos!r} does not exist (QOS: {', '.join(sorted(site.qos))}): fix {fix}"
            )
        elif allowed and resources.qos not in allowed:
            found.failures.append(
                f"QOS {resources.qos!r} is not allowed to you (yours: {', '.join(sorted(allowed))}):"
                f" fix {fix}"
            )
    return found


def job_qos(site: Site, resources: StageResources) -> str | None:
    """The QOS a job of `resources` runs under: the profile's `qos`, else its account's default QOS (the
    user's default account where the profile names none), else the association's only QOS, else SLURM's
    `normal`; None where accounting does not answer."""
    if resources.qos or site.accounts is None:
        return resources.qos
    account = resources.account or site.default_account or ""
    allowed = site.accounts.get(account, frozenset())
    return site.default_qos.get(account) or (next(iter(allowed)) if len(allowed) == 1 else "normal")


def preemption_of(site: Site, resources: StageResources) -> Preemption | None:
    """Whose GraceTime a preempted job of `resources` gets, or None where it is not preempted: under
    `preempt/qos`, its QOS's when another QOS may preempt it (SLURM's preempt/qos plugin reads the QOS's
    grace and mode alone); under `preempt/partition_prio`, its partition's when preemptable. A site whose
    accounting does not answer under `preempt/qos` is taken as preempting with no grace."""
    preempt_type = site.config.get("PreemptType", "preempt/none")
    if preempt_type == "preempt/qos":
        name = job_qos(site, resources)
        if site.qos is None or name is None:
            return Preemption(f"QOS {name or '(unknown: accounting did not answer)'}", 0)
        qos = site.qos.get(name)
        if qos is None or not any(name in other.preempts for other in site.qos.values()):
            return None
        mode = site.config.get("PreemptMode", "OFF") if qos.preempt_mode == "cluster" else qos.preempt_mode
        return None if mode.upper().startswith("OFF") else Preemption(f"QOS {name}", qos.grace_s)
    if preempt_type == "preempt/none":
        return None
    name = resources.partition or site.default_partition or ""
    partition = site.partitions.get(name)
    if partition is None or partition.preempt_mode.upper() == "OFF":
        return None
    return Preemption(f"partition {name}", partition.grace_s)


def preemption_findings(site: Site, stages: Iterable[StageResources], profile: ExecutionProfile) -> Findings:
    """What a preempted job of these stages receives: USR2 `signal_grace_s` before the kill only where
    the controller sends the job's own signal at preemption (`preempt_send_user_signal`)."""
    preempt_type = site.config.get("PreemptType", "preempt/none")
    preempted = {p.source: p for r in stages if (p := preemption_of(site, r))}
    if not preempted:
        return Findings(passed=["preemption: the profile's stages are not preempted"])
    names = ", ".join(f"{p.source} (GraceTime {p.grace_s} s)" for p in preempted.values())
    if "preempt_send_user_signal" in site.config.get("SlurmctldParameters", ""):
        return Findings(
            passed=[
                f"preemption: {preempt_type}: {names} send the job's USR2 at preemption, then kill after"
                " GraceTime"
            ]
        )
    return Findings(
        warnings=[
            f"preemption: {preempt_type} may preempt jobs of {names}, and SlurmctldParameters lacks"
            " preempt_send_user_signal: a preempted job gets SIGTERM and then SIGKILL after its GraceTime,"
            " not USR2 signal_grace_s before, so the stage loses the work since its last commit and is run"
            " again; ask the admins for SlurmctldParameters=preempt_send_user_signal and a GraceTime of at"
            f" least the profile's signal_grace_s ({profile.defaults.signal_grace_s} s)"
        ]
    )


def grace_findings(site: Site, where: str, resources: StageResources) -> Findings:
    """A preemptable stage whose GraceTime (signal to kill at preemption: the partition's or the QOS's, as
    the site preempts) is shorter than the stage's `signal_grace_s` (the time it may need to reach its safe
    point) is refused: preempted, it would be killed before it commits, and its work since the last commit
    lost."""
    preemption = preemption_of(site, resources)
    if preemption is None or preemption.grace_s >= resources.signal_grace_s:
        return Findings()
    ask = "the QOS" if preemption.source.startswith("QOS") else "the partition"
    return Findings(
        failures=[
            f"{where}: signal_grace_s = {resources.signal_grace_s} s is longer than {preemption.source}'s"
            f" GraceTime ({preemption.grace_s} s): a preempted job is killed that long after its signal,"
            " before the stage may reach its safe point; lower signal_grace_s to it (the stage must then"
            f" commit that fast), or ask the admins for a GraceTime on {ask} of at least signal_grace_s"
        ]
    )


def job_folder_findings(site: Site | None, profile: ExecutionProfile, partitions: Iterable[str]) -> Findings:
    """The job folder is writable here and, where jobs run on other machines, not a machine's own."""
    folder = Path(profile.job_folder).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probepo-check-{socket.gethostname()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return Findings(
            failures=[f"job_folder = {folder}: not writable ({exc.strerror or exc}): fix the profile"]
        )
    if site is not None and any(folder.is_relative_to(local) for local in LOCAL_FOLDERS):
        used = [site.partitions[name] for name in dict.fromkeys(partitions) if name in site.partitions]
        remote = [n for p in used for n in p.nodes if n in site.nodes and not _is_this_host(site.nodes[n])]
        if remote:
            return Findings(
                failures=[
                    f"job_folder = {folder} is on this machine's own disk, which {remote[0]} and the other"
                    " compute nodes do not see: set the profile's job_folder to a shared file system"
                ]
            )
    return Findings(passed=[f"job folder: {folder}, writable"])
