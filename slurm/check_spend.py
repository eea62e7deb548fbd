"""`probepo check`'s figures of what an update will move and how long that takes, before any allocation:
probepo/spend_model.py at the recipe's shape under the chosen executor and profile, and a warning where a
per-stage executor would move more than a full checkpoint per update."""

from __future__ import annotations

from probepo.config import ExecutionProfile, RunConfig
from probepo.methods import method_for
from probepo.methods.pivots import no_pivots
from probepo.preflight import Findings
from probepo.schedule import Stage
from probepo.spend_model import GB, STATED, Estimate, PolicySizes, UpdateShape, estimate
from slurm.executors import executor_for


def recipe_shape(
    config: RunConfig, profile: ExecutionProfile, executor: str, parameters: int, tied: int = 0
) -> UpdateShape:
    """The spend model's view of `config` on `executor` with `profile`'s trainer resources (`parameters` of
    the model, `tied` of them a tied LM head's)."""
    chosen = executor_for(executor)
    model = config.model
    ranks, per_node, gpus = 1, 1, False  # in process: where the testbeds run, on this machine's CPU
    if not chosen.in_process:
        resources = profile.resources(Stage.DRIVER if Stage.DRIVER in chosen.stages else Stage.OPTIMIZE)
        gpus = bool(resources.gpus_per_node or resources.gpus_per_task)
        if model.trainer == "deepspeed":  # the hf trainer holds everything on one rank
            ranks, per_node = resources.nodes * resources.tasks_per_node, resources.tasks_per_node
    responses = config.prompts_per_update * config.group_size
    probes = method_for(config.algo.algorithm).pivots is not no_pivots
    return UpdateShape(
        PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer, tied_parameters=tied),
        ranks=ranks,
        ranks_per_node=per_node,
        minibatches=-(-responses // config.optim.minibatch_size),
        checkpoint_every=config.checkpoint_every,
        resident=chosen.resident,
        handoff="file" if model.generator == "vllm" else "memory",
        accelerator=gpus,
        generation_stages=2 if probes else 1,
    )


def spend_findings(
    config: RunConfig, profile: ExecutionProfile, executor: str, parameters: int, tied: int = 0
) -> Findings:
    """The estimate in one line; a warning where a per-stage executor moves more than a checkpoint."""
    shape = recipe_shape(config, profile, executor, parameters, tied)
    found = estimate(shape)
    line = f"spend: {describe(found, executor)}"
    moved, checkpoint = found.moved_bytes(found.checkpoint), shape.sizes.checkpoint
    if not shape.resident and moved > checkpoint:
        return Findings(
            warnings=[
                f"{line}; the {executor} executor moves {moved / GB:.1f} GB per update,"
                f" {moved / checkpoint:.1f}× the {checkpoint / GB:.1f} GB checkpoint (each stage's job"
                " fetches the policy, optimize commits it in full every update): `--executor resident` keeps"
                " the engines resident and checkpoints every checkpoint_every updates"
            ]
        )
    return Findings(passed=[line])


def describe(found: Estimate, executor: str) -> str:
    """The estimate in one line: amortised seconds by piece, and what plain and checkpoint updates move."""
    shape = found.shape
    pieces = ", ".join(f"{p} {s:.1f}" for p, s in found.amortised_seconds().items() if s >= 0.05)
    plain = ", ".join(f"{k} {v / GB:.1f}" for k, v in sorted(found.plain.bytes.items()))
    full = ", ".join(f"{k} {v / GB:.1f}" for k, v in sorted(found.checkpoint.bytes.items()))
    return (
        f"about {found.total_s:.1f} s of state movement per update under {executor} ({shape.ranks} trainer"
        f" rank(s), amortised over checkpoint_every {found.every}: {pieces or 'none'}); GB moved by rank 0"
        f" in a plain update: {plain or 'none'}; in a checkpoint update ({shape.sizes.checkpoint / GB:.1f} GB"
        f" checkpoint, {shape.minibatches} mini-batch(es)): {full}; at stated bandwidths"
        f" ({STATED.described()}: probepo/spend_model.py)"
    )
