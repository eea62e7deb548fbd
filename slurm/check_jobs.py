"""`probepo check`'s figures of each job an executor runs that loads the recipe's model: its memory against
the profile's `mem_gb` and `gpu_memory_gb` for that stage (probepo/memory_model.py), its GPUs where the
recipe's engines need them, and the evaluation's shards against the grace window of the jobs that evaluate
(probepo/stages/evaluate.py)."""

from __future__ import annotations

import math

from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.memory_model import STAGE_LOADS, stage_memory_findings
from probepo.methods import method_for
from probepo.preflight import Findings
from probepo.schedule import Stage
from probepo.stages.evaluate import EVAL_DECODE_TOKENS_PER_S, ROW_DECODE_TOKENS_PER_S, largest_shard
from slurm.executors import Executor


def model_jobs(config: RunConfig, executor: Executor) -> list[Stage]:
    """The jobs of `executor` that load the model: its stages that do (probe where the method probes; the
    resident driver, every engine in one job), and the evaluation array tasks that the nightly evaluation
    and the evaluate flow run with the same profile. None in process."""
    if executor.in_process:
        return []
    probes = method_for(config.algo.algorithm).probes
    stages = [*executor.stages, Stage.EVAL_TASK]
    return [stage for stage in stages if stage in STAGE_LOADS and (stage != Stage.PROBE or probes)]


def memory_findings(
    config: RunConfig, profile: ExecutionProfile, executor: Executor, parameters: int
) -> Findings:
    """Each job's host memory and GPUs against what its stage holds (stage_memory_findings)."""
    found = Findings()
    for stage in model_jobs(config, executor):
        resources = profile.resources(stage)
        found.extend(stage_memory_findings(config, parameters, stage, resources, profile.entry(stage)))
    return found


def evaluation_shard_findings(config: RunConfig, profile: ExecutionProfile, executor: Executor) -> Findings:
    """The evaluation's largest shard and one row of it in seconds at the rates evaluate.py assumes (vLLM at
    7B on an H200), against the grace window of the job that evaluates in the run (the evaluate stage's, or
    the resident driver's): at a stop it finishes the shard in flight, so a shard longer than its
    signal_grace_s is lost to the kill and made again; a row longer than it, whatever the shards. An
    evaluation array task abandons its shard in flight at once (slurm/job.py: AbandoningStop): what a stop
    costs it is one shard's decoding. Only for a Hugging Face model on jobs: the rates are a GPU's."""
    if executor.in_process or config.model.kind != "hf":
        return Findings()
    shard = largest_shard(config)
    row_s = config.sampling.max_tokens / ROW_DECODE_TOKENS_PER_S
    stage = Stage.DRIVER if Stage.DRIVER in executor.stages else Stage.EVALUATE
    grace = profile.resources(stage).signal_grace_s
    line = (
        f"evaluation shards: at most {shard.rows} rows ({shard.suite}: {shard.chunks} chunk(s)), their"
        f" {shard.tokens:,} tokens at sampling.max_tokens ~{shard.seconds:.0f} s and one row's ~{row_s:.0f} s"
        f" at {EVAL_DECODE_TOKENS_PER_S:,.0f} and {ROW_DECODE_TOKENS_PER_S:g} tokens/s (vLLM at 7B on an"
        f" H200: probepo/stages/evaluate.py); an evaluation array task abandons the one in flight at a stop,"
        f" ~{shard.seconds:.0f} s made again"
    )
    where = f"{stage}'s signal_grace_s {grace} ({profile.entry(stage)})"
    if row_s > grace:
        return Findings(
            warnings=[
                f"{line}; {where} is shorter than one row: a stop loses the shard in flight whatever its"
                f" size: raise signal_grace_s (and the partition's GraceTime) above {math.ceil(row_s)} s, or"
                " lower sampling.max_tokens"
            ]
        )
    if shard.seconds > grace:
        return Findings(
            warnings=[
                f"{line}; {where} is shorter than a shard: a stop may lose the one in flight (made again on"
                f" resume): raise signal_grace_s (and the partition's GraceTime) above"
                f" {math.ceil(shard.seconds)} s"
            ]
        )
    return Findings(passed=[f"{line}; {where} holds one: a stop commits the shard in flight before the kill"])


def gpu_findings(config: RunConfig, profile: ExecutionProfile, executor: Executor) -> Findings:
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
