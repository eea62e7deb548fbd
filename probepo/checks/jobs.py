"""What each job of the executor is given against what the recipe makes of it: a generating job's ranks
against the sample step's engine calls (`generation_rank_findings`), and GPUs where the recipe's engines
need them (`gpu_findings`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from probepo.checks.findings import Findings
from probepo.checks.memory import model_jobs
from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.presets import ConfigError, preset_fields
from probepo.run.schedule import Stage
from probepo.stages.shards import calls_for_every_rank, sample_step_calls

if TYPE_CHECKING:
    from probepo.checks.launch import Jobs, Launch

GENERATING_JOBS = (Stage.SAMPLE, Stage.PROBE, Stage.EVALUATE, Stage.DRIVER)
"""The jobs whose ranks share generation's engine calls: the generating stages' own, and the resident
driver's, which runs them."""

PRESETS = Path(__file__).resolve().parents[2] / "configs"


def check(launch: Launch) -> Findings:
    """The ranks and GPUs of the executor's jobs, of a valid recipe and a profile."""
    if launch.config is None or launch.profile is None or launch.executor is None:
        return Findings()
    found = generation_rank_findings(launch.config, launch.profile, launch.executor.stages)
    return found.extend(gpu_findings(launch.config, launch.profile, launch.executor))


def generation_rank_findings(config: RunConfig, profile: ExecutionProfile, stages: Iterable[str]) -> Findings:
    """A warning where a generating job among an executor's `stages` has more ranks than the recipe's
    sample step has engine calls (probepo.stages.shards.sample_step_calls): the ranks beyond them idle
    through every sample step. The calls are part of a recipe's bits and never follow the ranks, so the
    warning names the recipe to run instead: the settings that give every rank a call, and the preset in
    configs/ that is this recipe with them, where there is one."""
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


def gpu_findings(config: RunConfig, profile: ExecutionProfile, executor: Jobs) -> Findings:
    """A recipe for GPUs (its generator vLLM or its trainer DeepSpeed, whose CPU builds serve the test
    tiers only) on a profile that gives no GPU to any job that loads its model: a warning, as for a train
    deployment that opens on a site's only profile, a CPU cluster's. Some of its jobs may run on the CPU by
    design (checkpoint 0 builds DeepSpeed's trainer there); in process, the engines take this machine's."""
    model = config.model
    used = (
        ("generator vllm", model.generator == "vllm"),
        ("trainer deepspeed", model.trainer == "deepspeed"),
    )
    engines = " and ".join(setting for setting, uses in used if uses)
    jobs = model_jobs(config, executor)
    if not engines or not jobs or any(_has_gpus(profile.resources(stage)) for stage in jobs):
        return Findings()
    return Findings(
        warnings=[
            f"GPUs: the profile gives none to the jobs that load the model ({', '.join(jobs)}), yet the"
            f" recipe's {engines} run on GPUs: choose a profile with GPUs (a train deployment opens on the"
            " site file's `profile`; its `profiles` are the others its form offers)"
        ]
    )


def _has_gpus(resources: StageResources) -> bool:
    return bool(resources.gpus_per_node or resources.gpus_per_task)
