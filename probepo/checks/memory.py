"""What each stage's job holds in memory, from the recipe's model and the profile's resources, before any
allocation: `probepo check` weighs every job that loads a model (`model_jobs`) against its host memory
(`mem_gb`, per node) and GPUs (`gpu_memory_gb`), and refuses one that cannot fit (`memory_findings`).

Per rank, P parameters of w bytes, W trainer ranks:
- a generation engine holds the weights, P·w, on its GPU (vLLM within its share of it, the rest its KV
  cache: model.vllm_memory, or computed from what a trainer beside it keeps resident, spend/model.py
  `generation_share`; vLLM sleeps while that trainer works);
- a DeepSpeed trainer peaks at its initialisation (the weights as moved to its device, the fp32 masters and
  the fp32 gradient partition DeepSpeed allocates there) and, where it trains, at its first optimizer step
  (AdamW's moments are created then): DeepSpeed 0.19.8's allocations, cited at spend/model.py
  `_deepspeed_peaks`;
- the Hugging Face trainer holds everything on one device.
On the host, a trainer's weights are loaded before they move to the GPU (engines/build.py, stages/
checkpoint.py), and a training rank's optimizer shard passes through host memory when loaded and saved;
a job without GPUs holds everything on the host. Activations, the CUDA context and each process's own
memory are not counted: a fit is necessary, not sufficient. Sizes are the spend model's (PolicySizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.methods import method_for
from probepo.run.schedule import STAGES, Stage
from probepo.spend.model import (
    GB,
    GENERATION_MARGIN_GB,
    Peaks,
    PolicySizes,
    TrainerUse,
    trainer_peaks,
    vllm_share,
)

if TYPE_CHECKING:
    from probepo.checks.launch import Jobs, Launch


@dataclass(frozen=True)
class StageLoad:
    """The engines a stage's job builds on each rank that runs it."""

    trainer: TrainerUse | None = None
    """fresh: built on the pretrained weights and saved, never stepped (checkpoint 0); weights: on a
    policy's weights alone, for forward passes (score); training: with its optimizer state (optimize)."""
    generator: bool = False


STAGE_LOADS: dict[Stage, StageLoad] = {
    Stage.CHECKPOINT: StageLoad(trainer="fresh"),
    Stage.SCORE: StageLoad(trainer="weights"),
    Stage.OPTIMIZE: StageLoad(trainer="training"),
    Stage.SAMPLE: StageLoad(generator=True),
    Stage.PROBE: StageLoad(generator=True),
    Stage.EVALUATE: StageLoad(generator=True),
    Stage.EVAL_TASK: StageLoad(generator=True),
    # every engine in one job: the trainer (checkpoint 0's on the job's ranks, then the training one) and a
    # generator beside it on each GPU
    Stage.DRIVER: StageLoad(trainer="training", generator=True),
}
"""The stages whose jobs load a Hugging Face policy (select and advantage load none; a warm-up is the
testbed's)."""


def _every_rank(stage: Stage) -> bool:
    """Every rank of the stage's job runs it (the stage table says; the resident driver and an evaluation
    task always do); else rank 0 alone."""
    return STAGES[stage].every_rank if stage in STAGES else True


def host_bytes(
    config: RunConfig, parameters: int, load: StageLoad, trainer_ranks: int, on_gpu: bool
) -> Peaks:
    """What one rank of the job holds on its node's host at its peak, by part (one peak, named)."""
    model = config.model
    sizes = PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer)
    weights = float(sizes.weights)
    if not on_gpu:  # the trainer's device is the host, and a generator's weights are there beside it
        when, parts = "as loaded", {}
        if load.trainer is not None:
            when, parts = _highest(trainer_peaks(config, parameters, trainer_ranks, load.trainer, False))
        if load.generator:
            parts = {**parts, "generator's weights": weights}
        return {f"{when}, without a GPU": parts}
    shard = sizes.optimizer / trainer_ranks
    if load.trainer == "training" and shard > weights:
        return {"as it loads and saves its optimizer shard": {"optimizer shard": shard}}
    return {"as loaded, before they move to the GPU": {"weights": weights}}


def stage_memory_findings(
    config: RunConfig, parameters: int, stage: Stage, resources: StageResources, entry: str
) -> Findings:
    """The memory of `stage`'s job (`resources`, from the profile's `entry`: `stages.<stage>` or
    `defaults`) for a model of `parameters`: a line for its GPUs (where it has any) and one for its host
    memory, each a failure where it cannot fit, naming what to change. The resident driver's trainer
    shares each GPU with vLLM, which sleeps while the trainer works."""
    load = STAGE_LOADS[stage]
    per_node = resources.tasks_per_node if _every_rank(stage) else 1
    world = resources.nodes * per_node
    trainer_ranks = world if config.model.trainer == "deepspeed" else 1
    on_gpu = bool(resources.gpus_per_node or resources.gpus_per_task)
    found = Findings()
    if on_gpu:
        found.extend(_gpu_findings(config, parameters, stage, load, world, resources.gpu_memory_gb, entry))
    when, parts = _highest(host_bytes(config, parameters, load, trainer_ranks, on_gpu))
    rank_gb = sum(parts.values()) / GB
    node_gb = rank_gb * per_node
    text = (
        f"memory of {stage}: about {node_gb:.1f} GB of host memory per node ({per_node} rank(s) ×"
        f" {rank_gb:.1f} GB {when}: {_detail(parts)})"
    )
    if resources.mem_gb is None:
        return found.extend(
            Findings(passed=[f"{text}; {entry} sets no mem_gb (the partition's default): not compared"])
        )
    if node_gb <= resources.mem_gb:
        return found.extend(Findings(passed=[f"{text}: within the mem_gb {resources.mem_gb:g} of {entry}"]))
    options = [
        f"give {stage} mem_gb ≥ {math.ceil(node_gb)} and room for the processes' own (a"
        f" `stages.{stage}` entry of the profile)"
    ]
    if per_node > 1:
        options.append("fewer tasks_per_node")
    if load.trainer is not None and not on_gpu:
        options.append(f"a GPU for its trainer (gpus_per_node: 1 and gpu_memory_gb in `stages.{stage}`)")
    problem = f"{text}: MORE than the mem_gb {resources.mem_gb:g} of {entry}; {_listed(options)}"
    return found.extend(Findings(failures=[problem]))


def _gpu_findings(
    config: RunConfig,
    parameters: int,
    stage: Stage,
    load: StageLoad,
    world: int,
    gpu_gb: float | None,
    entry: str,
) -> Findings:
    """A line for the trainer's part of each GPU and one for the generator's (vLLM's share, or a Hugging Face
    generator with no trainer beside it; one beside the trainer is counted in the trainer's line)."""
    model = config.model
    weights = float(PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer).weights)
    vllm = load.generator and model.generator == "vllm"
    found = Findings()
    if load.trainer is not None:
        trainer_ranks = world if model.trainer == "deepspeed" else 1
        peaks = trainer_peaks(config, parameters, trainer_ranks, load.trainer, True)
        if load.generator and not vllm:  # the Hugging Face generator's own copy beside the trainer
            peaks = {when: {**parts, "generator's weights": weights} for when, parts in peaks.items()}
        found.extend(_trainer_gpu(config, parameters, stage, load, world, peaks, gpu_gb, entry))
    if vllm or (load.generator and load.trainer is None):
        share, engine = 1.0, "the Hugging Face generator"
        if vllm:
            beside = (world if model.trainer == "deepspeed" else 1) if load.trainer is not None else 0
            share = vllm_share(config, parameters, gpu_gb, beside) if gpu_gb else model.vllm_memory or 1.0
            source = (
                "model.vllm_memory" if model.vllm_memory is not None else "computed: model.vllm_memory unset"
            )
            engine = f"vLLM ({share:.0%} of each GPU, {source})"
        text = (
            f"memory of {stage}: {engine} holds the weights, {weights / GB:.1f} GB, on each of {world} GPU(s)"
        )
        room = f"the {gpu_gb * share:.1f} GB it is given of each {gpu_gb:g} GB GPU" if gpu_gb else ""
        cache = f", {gpu_gb * share - weights / GB:.1f} GB of it for its KV cache" if gpu_gb and vllm else ""
        fix = "use GPUs with more memory: an engine is not split over GPUs"
        if vllm and gpu_gb and weights / GB < gpu_gb:
            needed = weights / GB / gpu_gb
            fix = (
                f"raise model.vllm_memory above {needed:.0%} (its KV cache needs room beyond them), or {fix}"
            )
        found.extend(_gpu_verdict(text, weights / GB, gpu_gb, share, room, fix, cache))
    return found


def _trainer_gpu(
    config: RunConfig,
    parameters: int,
    stage: Stage,
    load: StageLoad,
    world: int,
    peaks: Peaks,
    gpu_gb: float | None,
    entry: str,
) -> Findings:
    """The trainer's line: the training trainer's as `probepo check` has always printed it (`memory: …`)."""
    model = config.model
    deepspeed = model.trainer == "deepspeed"
    when, parts = _highest(peaks)
    need = sum(parts.values()) / GB
    sharding = f"ZeRO-{model.zero_stage}" if deepspeed else "the hf trainer"
    if load.trainer == "training":  # the line `probepo check` has always printed
        text = f"memory: {parameters / 1e9:.2f} B parameters train on {world} GPU(s) with {sharding}"
    else:
        role = "builds checkpoint 0" if load.trainer == "fresh" else "scores"
        text = (
            f"memory of {stage}: the trainer ({sharding}) {role} with the {parameters / 1e9:.2f} B parameters"
            f" on {world} GPU(s)"
        )
    text += f": about {need:.1f} GB per GPU {when} ({_detail(parts)}) before activations"
    # vLLM sleeps while the trainer works (its weights and KV cache released): the trainer's peaks have the
    # GPU but the margin; what it keeps while vLLM generates is the KV cache check's (kv_cache.py)
    shared = stage == Stage.DRIVER and model.generator == "vllm"
    share = 1 - GENERATION_MARGIN_GB / gpu_gb if shared and gpu_gb else 1.0
    vllm = f" while vLLM sleeps, less the {GENERATION_MARGIN_GB:g} GB margin" if shared else ""
    room = f"the {gpu_gb * share:.1f} GB of each {gpu_gb:g} GB GPU{vllm}" if gpu_gb else ""
    if not _every_rank(stage):  # one rank alone: neither ranks nor ZeRO-3 shard it
        fix = f"give {stage} GPUs with more memory, or none and mem_gb ≥ {math.ceil(need)} (`stages.{stage}`)"
        return _gpu_verdict(text, need, gpu_gb, share, room, fix)
    options = []
    if not deepspeed:
        options.append("shard further (model.zero_stage: 3) under model.trainer: deepspeed")
    elif model.zero_stage == 2:
        options.append("shard further (model.zero_stage: 3)")
    if deepspeed:
        options.append(f"add ranks (nodes × tasks_per_node of {entry})")
    return _gpu_verdict(text, need, gpu_gb, share, room, _listed(options))


def _gpu_verdict(
    text: str, need: float, gpu_gb: float | None, share: float, room: str, fix: str, spare: str = ""
) -> Findings:
    """`need` GB per GPU against `share` of the GPU's `gpu_gb` (`room` in words; `spare`: what a fit leaves
    over, in words): within it, more (with `fix`), or no figure to compare with."""
    if gpu_gb is None:
        return Findings(warnings=[f"{text}; give the profile's gpu_memory_gb to compare it with the GPUs"])
    if need <= gpu_gb * share:
        return Findings(passed=[f"{text}: leaving {room}{spare}"])
    return Findings(failures=[f"{text}: MORE than {room}; {fix}"])


def _highest(peaks: Peaks) -> tuple[str, dict[str, float]]:
    """The moment whose parts weigh most, with its parts."""
    return max(peaks.items(), key=lambda peak: sum(peak[1].values()))


def _detail(parts: dict[str, float]) -> str:
    return ", ".join(f"{name} {value / GB:.1f}" for name, value in parts.items())


def _listed(options: list[str]) -> str:
    """`a`, `a or b`, `a, b, or c`."""
    if len(options) < 3:
        return " or ".join(options)
    return f"{', '.join(options[:-1])}, or {options[-1]}"


def check(launch: Launch) -> Findings:
    """Each job's memory, of a valid recipe whose model's parameters are known, and a profile."""
    config, profile, executor = launch.config, launch.profile, launch.executor
    parameters = launch.model[1].parameters
    if config is None or profile is None or executor is None or parameters is None:
        return Findings()
    return memory_findings(config, profile, executor, parameters)


def model_jobs(config: RunConfig, executor: Jobs) -> list[Stage]:
    """The jobs of `executor` that load the model: its stages that do (probe where the method probes; the
    resident driver, every engine in one job), and the evaluation array tasks that the nightly evaluation
    and the evaluate flow run with the same profile. None in process."""
    if executor.in_process:
        return []
    probes = method_for(config.algo.algorithm).probes
    stages = [*executor.stages, Stage.EVAL_TASK]
    return [stage for stage in stages if stage in STAGE_LOADS and (stage != Stage.PROBE or probes)]


def memory_findings(
    config: RunConfig, profile: ExecutionProfile, executor: Jobs, parameters: int
) -> Findings:
    """Each job's host memory and GPUs against what its stage holds (stage_memory_findings)."""
    found = Findings()
    for stage in model_jobs(config, executor):
        resources = profile.resources(stage)
        found.extend(stage_memory_findings(config, parameters, stage, resources, profile.entry(stage)))
    return found
