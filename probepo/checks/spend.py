"""`probepo check`'s figures of what an update will move and how long that takes, before any allocation:
probepo/spend/model.py at the recipe's shape under the chosen executor and profile, a warning where a
per-stage executor would move more than a full checkpoint per update, and one where the trainer's job
has too short a grace window to commit a stop's part."""

from __future__ import annotations

from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.checks.model import tied_parameters
from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.methods import method_for
from probepo.run.schedule import Stage
from probepo.spend.model import GB, STATED, Estimate, PolicySizes, UpdateShape, estimate, stop_seconds

if TYPE_CHECKING:
    from probepo.checks.launch import Jobs, Launch


def check(launch: Launch) -> Findings:
    """What an update spends, of a valid recipe whose model's parameters are known, and a profile."""
    config, profile, executor = launch.config, launch.profile, launch.executor
    model = launch.model[1]
    if config is None or profile is None or executor is None or model.parameters is None:
        return Findings()
    tied = tied_parameters(model.folder)
    return spend_findings(config, profile, launch.executor_name, executor, model.parameters, tied)


def trainer_resources(profile: ExecutionProfile, jobs: Jobs) -> StageResources | None:
    """The resources of the job the trainer runs in under the executor `jobs` (None: in this process)."""
    if jobs.in_process:
        return None
    return profile.resources(Stage.DRIVER if Stage.DRIVER in jobs.stages else Stage.OPTIMIZE)


def recipe_shape(
    config: RunConfig, profile: ExecutionProfile, jobs: Jobs, parameters: int, tied: int = 0
) -> UpdateShape:
    """The spend model's view of `config` on the executor `jobs` with `profile`'s trainer resources
    (`parameters` of the model, `tied` of them a tied LM head's)."""
    model = config.model
    ranks, per_node, gpus = 1, 1, False  # in process: where the testbeds run, on this machine's CPU
    resources = trainer_resources(profile, jobs)
    if resources is not None:
        gpus = bool(resources.gpus_per_node or resources.gpus_per_task)
        if model.trainer == "deepspeed":  # the hf trainer holds everything on one rank
            ranks, per_node = resources.nodes * resources.tasks_per_node, resources.tasks_per_node
    probes = method_for(config.algo.algorithm).probes
    return UpdateShape(
        PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer, tied_parameters=tied),
        ranks=ranks,
        ranks_per_node=per_node,
        checkpoint_every=config.checkpoint_every,
        resident=jobs.resident,
        handoff="memory",  # vLLM too: its worker lives in the rank's process (engines/vllm_engine.py)
        accelerator=gpus,
        generation_stages=2 if probes else 1,
    )


def scratch_need(
    config: RunConfig, profile: ExecutionProfile, jobs: Jobs, parameters: int, tied: int = 0
) -> int:
    """The most bytes one update writes to a node's scratch ($TMPDIR) by the spend model: a checkpoint
    update's save, shared by the node's ranks."""
    found = estimate(recipe_shape(config, profile, jobs, parameters, tied))
    written = max(found.plain.bytes.get("scratch", 0), found.checkpoint.bytes.get("scratch", 0))
    resources = trainer_resources(profile, jobs)
    return written // (resources.nodes if resources is not None else 1)


def spend_findings(
    config: RunConfig, profile: ExecutionProfile, executor: str, jobs: Jobs, parameters: int, tied: int = 0
) -> Findings:
    """The estimate under the executor named `executor` (`jobs`) in one line; a warning where a per-stage
    executor moves more than a checkpoint, and one where the trainer's grace window is shorter than a stop's
    save and upload."""
    shape = recipe_shape(config, profile, jobs, parameters, tied)
    found = estimate(shape)
    line = f"spend: {describe(found, executor)}"
    warnings = []
    moved, checkpoint = found.moved_bytes(found.checkpoint), shape.sizes.checkpoint
    if not shape.resident and moved > checkpoint:
        warnings.append(
            f"the {executor} executor moves {moved / GB:.1f} GB per update,"
            f" {moved / checkpoint:.1f}× the {checkpoint / GB:.1f} GB checkpoint (each stage's job"
            " fetches the policy, optimize commits it in full every update): `--executor resident` keeps"
            " the engines resident and checkpoints every checkpoint_every updates"
        )
    resources, stop_s = trainer_resources(profile, jobs), stop_seconds(shape)
    if resources is not None and resources.signal_grace_s < stop_s:
        warnings.append(
            f"the trainer's job has signal_grace_s {resources.signal_grace_s} but a stop inside a checkpoint"
            f" update's optimizer saves and uploads {shape.node_share / GB:.1f} GB, ~{stop_s:.0f} s at stated"
            " bandwidths: a preemption would kill it mid-save and the update would rerun; raise"
            " signal_grace_s (and the partition's GraceTime) above that"
        )
    if warnings:
        return Findings(warnings=[f"{line}; {warning}" for warning in warnings])
    return Findings(passed=[line])


def describe(found: Estimate, executor: str) -> str:
    """The estimate in one line: the seconds per update the updates wait for and those beside them (a
    resident driver's checkpoint upload), amortised, by piece; and what plain and checkpoint updates move."""
    shape = found.shape
    blocking, beside = _pieces(found.amortised_seconds(beside=False)), _pieces(found.amortised_seconds(True))
    if shape.resident:
        beside = (
            f"{beside or 'none'}: each checkpoint's upload, {found.checkpoint.beside_s:.0f} s, while the"
            " next updates train; it blocks an update only where it outlasts checkpoint_every updates"
        )
    else:
        beside = "none: a job per stage commits each checkpoint inside optimize"
    plain = ", ".join(f"{k} {v / GB:.1f}" for k, v in sorted(found.plain.bytes.items()))
    full = ", ".join(f"{k} {v / GB:.1f}" for k, v in sorted(found.checkpoint.bytes.items()))
    every = found.every
    return (
        f"about {found.blocking_s:.1f} s of state movement blocking each update under {executor}"
        f" ({shape.ranks} trainer rank(s), amortised over checkpoint_every {every}: {blocking or 'none'})"
        f" + {found.beside_s:.1f} s beside the updates ({beside}); GB moved by rank 0 in a plain update:"
        f" {plain or 'none'}; in a checkpoint update ({shape.sizes.checkpoint / GB:.1f} GB checkpoint):"
        f" {full}; at stated bandwidths ({STATED.described()}: probepo/spend/model.py)"
    )


def _pieces(seconds: dict[str, float]) -> str:
    return ", ".join(f"{piece} {s:.2f}" for piece, s in seconds.items() if s >= 0.005)
