"""The evaluation's shards against the grace window of the jobs that evaluate (probepo/stages/evaluate.py):
what a stop costs the evaluation in flight."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.config import ExecutionProfile, RunConfig
from probepo.run.schedule import Stage
from probepo.stages.evaluate import EVAL_DECODE_TOKENS_PER_S, ROW_DECODE_TOKENS_PER_S, largest_shard

if TYPE_CHECKING:
    from probepo.checks.launch import Jobs, Launch


def check(launch: Launch) -> Findings:
    """The evaluation's shards, of a valid recipe whose model's parameters are known, and a profile."""
    config, profile, executor = launch.config, launch.profile, launch.executor
    if config is None or profile is None or executor is None or launch.model[1].parameters is None:
        return Findings()
    return evaluation_shard_findings(config, profile, executor)


def evaluation_shard_findings(config: RunConfig, profile: ExecutionProfile, executor: Jobs) -> Findings:
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
