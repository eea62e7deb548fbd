"""vLLM's KV cache in the generation phase, per job that generates: the tokens it holds (vLLM's share of each
GPU, `model.vllm_memory` or computed from what the trainer keeps resident: spend/model.py
`generation_share`, less the weights and vLLM's activations, over the bytes of a token from the model's
config.json), the tokens one engine call of each generating stage needs at worst, and how many of its rows
that lets vLLM decode at once. A row that cannot fit alone fails; a call that does not fit whole warns
(vLLM then preempts rows and recomputes them inside the call).

A call is `sampling.batch_rows` rows per chunk, its chunks dealt into `sampling.shards` calls
(engines/sampler.py `call_plan`); each prefix is one request of n samples, which share the prefix's full
blocks (vLLM's prefix caching) and hold their own tokens in blocks of their own. Every row is counted at the
longest prompt and its most new tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.checks.memory import STAGE_LOADS, model_jobs
from probepo.checks.model import model_config_json
from probepo.config import RunConfig, StageResources
from probepo.methods import method_for
from probepo.run.schedule import Stage
from probepo.spend.model import (
    GB,
    GENERATION_MARGIN_GB,
    PolicySizes,
    generation_share,
    trainer_resident,
    vllm_share,
)
from probepo.stages.evaluate import largest_shard

if TYPE_CHECKING:
    from probepo.checks.launch import Launch

BLOCK_TOKENS = 16
"""Tokens of one block of vLLM's paged KV cache (its default block_size; engines/vllm_engine.py sets none)."""
VLLM_ACTIVATIONS_GB = 2.0
"""GB of vLLM's share that its forward pass's activations and CUDA graphs take (vLLM profiles them when it
is built and gives the KV cache the rest): a stated figure at 7B, as bench/ranks_model.py's."""

GENERATES: dict[Stage, tuple[Stage, ...]] = {
    Stage.DRIVER: (Stage.SAMPLE, Stage.PROBE, Stage.EVALUATE),
    Stage.SAMPLE: (Stage.SAMPLE,),
    Stage.PROBE: (Stage.PROBE,),
    Stage.EVALUATE: (Stage.EVALUATE,),
    Stage.EVAL_TASK: (Stage.EVALUATE,),
}
"""The generating stages whose engine calls each job's engine decodes."""


@dataclass(frozen=True)
class KVLayout:
    """What one token's KV cache holds, from the model's config.json."""

    layers: int
    kv_heads: int
    head_dim: int
    width: int
    """Bytes of one element (the model's dtype: vLLM's KV cache dtype `auto`)."""

    @property
    def token_bytes(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.width  # keys and values

    def described(self) -> str:
        return (
            f"{self.token_bytes / 1e6:.2f} MB a token: {self.layers} layers × {self.kv_heads} KV heads ×"
            f" {self.head_dim} × 2 (keys, values) × {self.width} bytes"
        )


def kv_layout(folder: Path | None, dtype: str) -> KVLayout | None:
    """The model's KV layout from its config.json (or its text config's); None where it lacks the fields."""
    data = model_config_json(folder)
    data = data.get("text_config", data)
    try:
        heads = int(data["num_attention_heads"])
        return KVLayout(
            layers=int(data["num_hidden_layers"]),
            kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or int(data["hidden_size"]) // heads),
            width=2 if dtype in ("bfloat16", "float16") else 4,
        )
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class EngineCall:
    """The largest engine call of a generating stage: `prefixes` requests of `n` samples each, every prefix
    `prompt` tokens, every sample up to `new` tokens."""

    stage: Stage
    prefixes: int
    n: int
    prompt: int
    new: int

    @property
    def rows(self) -> int:
        return self.prefixes * self.n

    @property
    def shared_blocks(self) -> int:
        """A prefix's full blocks, which its samples share."""
        return self.prompt // BLOCK_TOKENS

    @property
    def own_blocks(self) -> int:
        """A sample's own blocks: its prefix's last partial block and its new tokens."""
        return math.ceil((self.prompt + self.new) / BLOCK_TOKENS) - self.shared_blocks

    @property
    def tokens(self) -> int:
        """Cache tokens the whole call holds at once, every row at its longest."""
        return BLOCK_TOKENS * (self.prefixes * self.shared_blocks + self.rows * self.own_blocks)

    @property
    def row_tokens(self) -> int:
        """Cache tokens one row alone holds."""
        return BLOCK_TOKENS * (self.shared_blocks + self.own_blocks)

    def rows_at_once(self, cache_tokens: int) -> int:
        """How many of its rows fit the cache together (whole prefixes' samples, a prefix's blocks shared)."""
        per_prefix = BLOCK_TOKENS * (self.shared_blocks + self.n * self.own_blocks)
        whole, left = divmod(cache_tokens, per_prefix)
        partial = max(0, left - BLOCK_TOKENS * self.shared_blocks) // (BLOCK_TOKENS * self.own_blocks)
        return min(self.rows, whole * self.n + min(self.n - 1, partial))


def _call_prefixes(prefixes: int, n: int, config: RunConfig) -> int:
    """The prefixes of a stage's largest engine call: its chunks of batch_rows // n prefixes, dealt into
    `sampling.shards` calls (one chunk a call without)."""
    per_chunk = max(1, config.sampling.batch_rows // n)
    chunks = math.ceil(prefixes / per_chunk)
    per_call = math.ceil(chunks / config.sampling.shards) if config.sampling.shards else 1
    return min(prefixes, per_call * per_chunk)


def engine_calls(config: RunConfig, prompt: int, rescue: int) -> dict[Stage, EngineCall]:
    """The largest engine call of each generating stage of the recipe, the longest prompt `prompt` tokens and
    a cut probe's rescue (suffix and rescue tokens) `rescue`: sample, G samples of each of the update's
    prompts; probe (where the method probes), `continuations_per_pivot` of each pivot's prefix, up to
    `probe_budget` a prompt, counted at a pivot at the response's start (its prefix the prompt: the most new
    tokens); evaluate, the largest evaluation shard (stages/evaluate.py), its samples counted apart."""
    sampling, algo = config.sampling, config.algo
    group = config.group_size
    sample = _call_prefixes(config.prompts_per_update, group, config)
    calls = {Stage.SAMPLE: EngineCall(Stage.SAMPLE, sample, group, prompt, sampling.max_tokens)}
    if method_for(algo.algorithm).probes:
        n = algo.continuations_per_pivot
        pivots = config.prompts_per_update * (algo.probe_budget // n)
        calls[Stage.PROBE] = EngineCall(
            Stage.PROBE, _call_prefixes(pivots, n, config), n, prompt, sampling.max_tokens + rescue
        )
    calls[Stage.EVALUATE] = EngineCall(
        Stage.EVALUATE, largest_shard(config).rows, 1, prompt, sampling.max_tokens
    )
    return calls


def check(launch: Launch) -> Findings:
    """The KV cache of every job that generates on vLLM, of a valid recipe whose model and task were found,
    and a profile."""
    config, profile, executor = launch.config, launch.profile, launch.executor
    _, files = launch.model
    if config is None or profile is None or executor is None or files.parameters is None:
        return Findings()
    layout = kv_layout(files.folder, config.model.dtype)
    if config.model.generator != "vllm" or layout is None:
        return Findings()
    _, task = launch.task
    if task is None:
        return Findings()  # the data check says why
    suffix = task.tokenizer.encode(config.algo.rescue_suffix) if config.algo.rescue_tokens else []
    calls = engine_calls(config, task.longest_prompt(), len(suffix) + config.algo.rescue_tokens)
    found = Findings()
    for stage in model_jobs(config, executor):
        if stage in GENERATES:
            found.extend(
                job_findings(config, files.parameters, layout, calls, stage, profile.resources(stage))
            )
    return found


def job_findings(
    config: RunConfig,
    parameters: int,
    layout: KVLayout,
    calls: dict[Stage, EngineCall],
    job: Stage,
    resources: StageResources,
) -> Findings:
    """The KV cache of `job`'s engine on each of its GPUs (`resources`), and a line for each generating
    stage it runs: its largest engine call against it."""
    gpu_gb = resources.gpu_memory_gb
    if gpu_gb is None or not (resources.gpus_per_node or resources.gpus_per_task):
        return Findings()  # the memory check asks for gpu_memory_gb; vLLM on CPU has no GPU to weigh
    model = config.model
    beside = STAGE_LOADS[job].trainer is not None  # the resident driver: its trainer keeps its state
    ranks = (
        (resources.nodes * resources.tasks_per_node if model.trainer == "deepspeed" else 1) if beside else 0
    )
    share = vllm_share(config, parameters, gpu_gb, ranks)
    computed = generation_share(config, parameters, gpu_gb, ranks)
    found = Findings()
    if beside and model.vllm_memory is not None and share > computed:
        resident = max(sum(p.values()) for p in trainer_resident(config, parameters, ranks).values()) / GB
        found.failures.append(
            f"KV cache of {job}: model.vllm_memory {share:.2f} of each {gpu_gb:g} GB GPU leaves its trainer"
            f" {gpu_gb * (1 - share):.1f} GB while vLLM generates, less than the {resident:.1f} GB it keeps"
            f" resident and the {GENERATION_MARGIN_GB:g} GB margin: lower model.vllm_memory to {computed:.2f}"
            " or below, or unset it (computed)"
        )
    tokens = cache_tokens(config, parameters, layout, share * gpu_gb)
    source = "model.vllm_memory" if model.vllm_memory is not None else "computed: model.vllm_memory unset"
    weights = PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer).weights / GB
    head = (
        f"KV cache of {job}: vLLM's {share:.2f} of each {gpu_gb:g} GB GPU ({source}), less the weights"
        f" {weights:.1f} GB and {VLLM_ACTIVATIONS_GB:g} GB of activations, holds {tokens:,} tokens"
        f" ({layout.described()})"
    )
    if beside and model.trainer == "deepspeed":
        offload = generation_share(config, parameters, gpu_gb, ranks, offload_optimizer=True)
        head += (
            f"; the optimizer shard offloaded to host between phases would give vLLM {offload:.2f}"
            f" ({cache_tokens(config, parameters, layout, offload * gpu_gb):,} tokens)"
        )
    found.passed.append(head)
    for stage in GENERATES[job]:
        if stage in calls:
            found.extend(call_findings(job, calls[stage], tokens))
    return found


def cache_tokens(config: RunConfig, parameters: int, layout: KVLayout, vllm_gb: float) -> int:
    """The tokens vLLM's KV cache holds in `vllm_gb` GB, whole blocks, beside the weights and activations."""
    model = config.model
    weights = PolicySizes.of(parameters, dtype=model.dtype, trainer=model.trainer).weights
    room = vllm_gb * GB - weights - VLLM_ACTIVATIONS_GB * GB
    return max(0, int(room // (layout.token_bytes * BLOCK_TOKENS))) * BLOCK_TOKENS


def call_findings(job: Stage, call: EngineCall, tokens: int) -> Findings:
    """One engine call of `call.stage` against a KV cache of `tokens`: a row alone past it fails, the whole
    call past it warns (vLLM preempts inside the call), else passes."""
    text = (
        f"KV cache of {job}, {call.stage}: one engine call of {call.rows} rows ({call.prefixes} prefixes ×"
        f" {call.n}, up to {call.prompt} + {call.new} tokens each, a prefix's samples sharing its blocks)"
        f" needs {call.tokens:,} tokens"
    )
    if call.row_tokens > tokens:
        return Findings(
            failures=[
                f"{text}, and one row alone {call.row_tokens:,}: MORE than the {tokens:,} its KV cache holds;"
                " lower sampling.max_tokens, give vLLM a larger share (model.vllm_memory), or use GPUs with"
                " more memory"
            ]
        )
    if call.tokens > tokens:
        return Findings(
            warnings=[
                f"{text}, MORE than the {tokens:,} its KV cache holds: {call.rows_at_once(tokens)} of its"
                f" {call.rows} rows fit at once, and vLLM preempts (and recomputes) the others inside the"
                " call; raise sampling.shards (fewer rows a call), lower sampling.max_tokens, or give vLLM a"
                " larger share (model.vllm_memory)"
            ]
        )
    return Findings(passed=[f"{text} of the {tokens:,}: all {call.rows} rows at once"])
