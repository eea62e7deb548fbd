"""The rank environment of a multi-task job, as torch.distributed and DeepSpeed expect it (the ranks join
their process group through it: probepo.distributed). A job's ranks may span several nodes: they meet at
the job's first node (SLURM_JOB_NODELIST), and each knows its own node by name (SLURMD_NODENAME). And
whether a recipe gives each rank of its generating jobs an engine call (`generation_rank_findings`)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from probepo.config import ExecutionProfile, RunConfig
from probepo.distributed import NODE_ENV
from probepo.preflight import Findings
from probepo.presets import ConfigError, preset_fields
from probepo.schedule import Stage

PORT_BASE, PORT_SPAN = 20000, 12000
"""Rendezvous ports 20000-31999: below Linux's ephemeral range (32768 up by default), where the node's own
outgoing connections take ports; a rank 0 that drew one held by such a socket failed with EADDRINUSE and
left the other ranks waiting on the rendezvous (seen in CI: port 34206 of local job 14206)."""


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in its job."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    node: str
    """The node this rank runs on, by SLURM's name for it."""
    nodes: tuple[str, ...]
    """The job's nodes (from SLURM_JOB_NODELIST, in its order); the first one is the rendezvous."""

    def export(self) -> None:
        """Set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (`init_process_group(init_method=
        "env://")` and DeepSpeed read them) and the node's name (probepo.distributed.NODE_ENV)."""
        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(self.world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            **{NODE_ENV: self.node},
        )

    def describe(self) -> str:
        """One line for the job's log: where this rank is and where the ranks meet."""
        return (
            f"rank {self.rank} of {self.world_size} (local rank {self.local_rank}) on node {self.node};"
            f" rendezvous {self.master_addr}:{self.master_port}, the address of {self.nodes[0]}, the first of"
            f" the job's {len(self.nodes)} node(s) {','.join(self.nodes)}"
        )


def job_ranks() -> Ranks:
    """This task's ranks from submitit's view of the job (SLURM's SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS
    and SLURM_JOB_NODELIST, or the local executor's equivalents). The job's first node is the rendezvous
    (SLURM starts rank 0 there); the port derives from the job id, so that jobs sharing a node do not
    collide and a requeued job finds the same one."""
    import submitit

    env = submitit.JobEnvironment()
    digits = "".join(ch for ch in str(env.job_id) if ch.isdigit()) or "0"
    nodes = tuple(env.hostnames)
    return Ranks(
        rank=env.global_rank,
        local_rank=env.local_rank,
        world_size=env.num_tasks,
        master_addr=address_of(nodes[0]),
        master_port=PORT_BASE + int(digits) % PORT_SPAN,
        node=os.environ.get("SLURMD_NODENAME") or env.hostname,
        nodes=nodes,
    )


def address_of(node: str) -> str:
    """An address other ranks can reach `node` at: its DNS name where it resolves (real clusters), else the
    NodeAddr SLURM knows it by (a node name that is only SLURM's, as on the test cluster)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    shown = subprocess.run(
        ["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=30
    )
    found = re.search(r"\bNodeAddr=(\S+)", shown.stdout)
    return found.group(1) if found else node


GENERATING_JOBS = (Stage.SAMPLE, Stage.PROBE, Stage.EVALUATE, Stage.DRIVER)
"""The jobs whose ranks share generation's engine calls: the generating stages' own, and the resident
driver's, which runs them."""

PRESETS = Path(__file__).resolve().parents[1] / "configs"


def generation_rank_findings(config: RunConfig, profile: ExecutionProfile, stages: Iterable[str]) -> Findings:
    """A warning where a generating job among an executor's `stages` has more ranks than the recipe's
    sample step has engine calls (probepo.stages.shards.sample_step_calls): the ranks beyond them idle
    through every sample step. The calls are part of a recipe's bits and never follow the ranks, so the
    warning names the recipe to run instead: the settings that give every rank a call, and the preset in
    configs/ that is this recipe with them, where there is one."""
    from probepo.stages.shards import calls_for_every_rank, sample_step_calls

    ranks = {profile.entry(stage): _job_ranks(profile, stage) for stage in GENERATING_JOBS if stage in stages}
    if max(ranks.values(), default=1) == 1:
        return Findings()
    sampling, calls = config.sampling, sample_step_calls(config)
    made = (
        f"the recipe's sample step makes {calls} engine call(s) (sampling.shards = {sampling.shards},"
        f" sampling.batch_rows = {sampling.batch_rows})"
    )
    jobs = ", ".join(f"{where} ({count} ranks)" for where, count in ranks.items())
    crowded = max(ranks.values()) - calls
    if crowded <= 0:
        return Findings(passed=[f"generation: {made}, one at least for each rank of {jobs}"])
    problem = f"generation: {jobs}, but {made}: {crowded} rank(s) idle through every sample step."
    fewer = f"give generation at most {calls} ranks"
    variant = calls_for_every_rank(config, max(ranks.values()))
    if variant is not None:
        preset = _preset_of(config.model_copy(update={"sampling": sampling.model_copy(update=variant)}))
        settings = " ".join(f"--set sampling.{name}={value}" for name, value in variant.items())
        other = "samples other than this recipe's: compare runs within one recipe"
        recipe = (
            f"{preset.relative_to(PRESETS.parent)} (this recipe with {settings}: {other})"
            if preset
            else f"this recipe with {settings} ({other})"
        )
        fewer = f"run {recipe}, or {fewer}"
    bits = "The calls are part of a recipe's bits, never set by the ranks"
    return Findings(warnings=[f"{problem} {bits}: {fewer}"])


def _job_ranks(profile: ExecutionProfile, stage: str) -> int:
    resources = profile.resources(stage)
    return resources.nodes * resources.tasks_per_node


def _preset_of(config: RunConfig) -> Path | None:
    """The preset in configs/ whose recipe is `config`, its store aside (None: no preset is)."""
    wanted = config.model_dump(mode="json", exclude={"store"})
    for path in sorted(PRESETS.glob("*.yaml")):
        try:
            preset = RunConfig.model_validate(preset_fields(path))
        except (ConfigError, ValidationError):
            continue
        if preset.model_dump(mode="json", exclude={"store"}) == wanted:
            return path
    return None
