"""How busy the 8 ranks of an H200 node are in the study recipes' sample and probe stages, on paper: the
stages' own chunk and call plans (probepo.engines.sampler.chunk_plan, call_plan) over response lengths
drawn from a stated model, each engine call decoded by a modelled vLLM (continuous batching) at a stated or
measured cost per decoding step, the calls claimed by the first free rank in plan order (what the stages
do). A rank's busy fraction is its seconds in engine calls over the stage's makespan. Beside them, two
measures of what a better schedule could do: calls streamed into a live engine (streamed_rank_seconds) and
the longest row decoded alone (longest_row_seconds), a floor under any schedule's makespan.

Everything modelled is stated here, so a reader can disagree with a number and rerun:
- Lengths (LENGTHS): prompts lognormal around 120 tokens; responses lognormal around a recipe's median,
  cut at its response budget (min(max_tokens, context − prompt)). Medians are ours, from what these models
  write on MATH (DeepSeekMath-Instruct a few hundred tokens, Qwen3-4B-Base longer, R1-Distill long enough
  that the 2K context binds); the study does not report them.
- Probes (ProbePO's plan): each prompt's probe_budget continuations are max_pivots prefixes of
  continuations_per_pivot rows; a pivot sits uniformly inside one of the group's responses (margins kept);
  a continuation's length is lognormal around what that response had left, cut at the budget, and a cut one
  gets the recipe's rescue_tokens in a second, greedy phase of its call (what VLLMGenerationEngine does).
- A decoding step (Decoder) costs fixed_s + Σ over its rows of (per_row_s + per_context_s × the row's
  context). A row joins a call's batch when vLLM has room: at most max_seqs rows, and their final contexts
  within the KV cache (no preemption modelled). Prefill is each distinct prefix once (prefix caching).
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from probepo.config import RunConfig
from probepo.engines.sampler import call_plan, chunk_plan

RANKS = 8
GPU_MEMORY = 141e9
"""An H200's bytes."""


@dataclass(frozen=True)
class Lengths:
    """The stated length model of one recipe's responses, in tokens."""

    response_median: float
    response_sigma: float = 0.6
    prompt_median: float = 120.0
    prompt_sigma: float = 0.4


@dataclass(frozen=True)
class Architecture:
    """What a step costs per row: parameters (2 FLOPs each per token) and KV bytes per context token
    (layers × 2 × KV heads × head dim × 2 bytes), from each model's published config."""

    parameters: float
    kv_bytes_per_token: float


LENGTHS = {
    "deepseekmath-7b-sft": Lengths(response_median=350),
    "qwen3-4b-base": Lengths(response_median=700, response_sigma=0.7),
    "r1-distill-qwen-1.5b": Lengths(response_median=1400, response_sigma=0.5),
}
ARCHITECTURES = {  # 30 × 2 × 32 × 128 × 2; 36 × 2 × 8 × 128 × 2; 28 × 2 × 2 × 128 × 2
    "deepseekmath-7b-sft": Architecture(6.9e9, 491_520),
    "qwen3-4b-base": Architecture(4.0e9, 147_456),
    "r1-distill-qwen-1.5b": Architecture(1.78e9, 28_672),
}

H200_BANDWIDTH = 4.8e12 * 0.7
"""HBM3e's 4.8 TB/s at 70 % (decoding reads the weights and each row's KV cache every step)."""
H200_FLOPS = 989e12 * 0.4
"""Dense bf16 at 40 %."""
STEP_OVERHEAD_S = 2e-3
"""vLLM's scheduler, sampler and kernel launches per step (CUDA graphs): stated, not measured here."""
MAX_SEQS = 1024
"""vLLM's max_num_seqs for offline `LLM` on a GPU of ≥ 70 GiB (its default; 256 on smaller ones)."""


@dataclass(frozen=True)
class Decoder:
    """The cost of one decoding step and the room of one engine's batch."""

    name: str
    fixed_s: float
    per_row_s: float
    per_context_s: float
    prefill_per_token_s: float
    max_seqs: int
    kv_tokens: float  # context tokens the KV cache holds (inf: unbounded)


def h200_decoder(config: RunConfig, name: str) -> Decoder:
    """The roofline of the recipe's model on one H200 with model.vllm_memory of it for vLLM."""
    arch = ARCHITECTURES[name]
    weights = 2 * arch.parameters
    cache = config.model.vllm_memory * GPU_MEMORY - weights - 2e9  # 2 GB of activations and graphs
    return Decoder(
        name="h200_roofline",
        fixed_s=STEP_OVERHEAD_S + weights / H200_BANDWIDTH,
        per_row_s=2 * arch.parameters / H200_FLOPS,
        per_context_s=arch.kv_bytes_per_token / H200_BANDWIDTH,
        prefill_per_token_s=2 * arch.parameters / H200_FLOPS,
        max_seqs=MAX_SEQS,
        kv_tokens=cache / arch.kv_bytes_per_token,
    )


def measured_decoder(fixed_s: float, per_row_s: float) -> Decoder:
    """A step cost measured on this CPU (measure_cpu_step): no context term, no cache limit."""
    return Decoder("cpu_measured", fixed_s, per_row_s, 0.0, per_row_s, MAX_SEQS, float("inf"))


def call_seconds(prefixes: np.ndarray, new_tokens: np.ndarray, shared: np.ndarray, decoder: Decoder) -> float:
    """One engine call's sampling seconds: rows (in request order) of `prefixes` context tokens decoding
    `new_tokens` each, under continuous batching; `shared[i]`: row i's prefix was prefilled by an earlier row
    (the same prefix's other samples)."""
    seconds = float(decoder.prefill_per_token_s * prefixes[~shared].sum())
    final = prefixes + new_tokens
    left = new_tokens.astype(np.int64).copy()
    context = prefixes.astype(np.float64).copy()
    active = np.zeros(len(left), dtype=bool)
    waiting = 0  # rows before this one have joined
    held = 0.0  # KV tokens the joined, unfinished rows will fill
    while waiting < len(left) or active.any():
        while (
            waiting < len(left)
            and active.sum() < decoder.max_seqs
            and (held + final[waiting] <= decoder.kv_tokens or not active.any())
        ):
            active[waiting] = left[waiting] > 0
            held += final[waiting] if left[waiting] > 0 else 0.0
            waiting += 1
        if not active.any():
            continue
        seconds += decoder.fixed_s + float(
            (decoder.per_row_s + decoder.per_context_s * context[active]).sum()
        )
        context[active] += 1
        left[active] -= 1
        done = active & (left == 0)
        held -= float(final[done].sum())
        active &= left > 0
    return seconds


def rescue_seconds(rows: int, context: float, rescue: int, decoder: Decoder) -> float:
    """The greedy rescue phase of a call: `rows` cut rows decoding `rescue` more tokens together."""
    if rows == 0 or rescue == 0:
        return 0.0
    return rescue * (decoder.fixed_s + rows * (decoder.per_row_s + decoder.per_context_s * context))


def rank_seconds(times: list[float], ranks: int) -> list[float]:
    """Each rank's seconds in engine calls, the calls (in plan order) claimed by the first free rank (what
    the stages do): a rank's finishing time too, as it never waits between calls."""
    free = [(0.0, r) for r in range(ranks)]
    for t in times:
        at, r = heapq.heappop(free)
        heapq.heappush(free, (at + t, r))
    return [at for at, _ in sorted(free, key=lambda slot: slot[1])]


def streamed_rank_seconds(
    rows: StageRows, batch_rows: int, keep_rows: int, rescue: int, decoder: Decoder
) -> list[float]:
    """Each rank's seconds when its engine is never drained between calls: the stage's chunks (the stages'
    own plan at `batch_rows`) are claimed in plan order by a rank whenever fewer than `keep_rows` of its rows
    are running, and join its running batch at once (requests added to a live engine), the ranks sharing one
    clock. A cut row decodes its `rescue` tokens as it goes on (no separate phase). Not what the stages do:
    the alternative this model weighs against their fixed calls."""
    plan = chunk_plan(rows.prefixes.tolist(), rows.n, batch_rows)
    queue = iter(plan)
    pending = next(queue, None)
    left = [np.zeros(0, np.int64) for _ in range(RANKS)]
    context = [np.zeros(0) for _ in range(RANKS)]
    clock = [(0.0, r) for r in range(RANKS)]
    finished = [0.0] * RANKS
    while clock:
        at, r = heapq.heappop(clock)
        while pending is not None and len(left[r]) < keep_rows:
            owners = np.repeat(pending, rows.n)
            picked = owners * rows.n + np.tile(np.arange(rows.n), len(pending))
            at += decoder.prefill_per_token_s * float(rows.prefixes[pending].sum())
            left[r] = np.concatenate([left[r], rows.new_tokens[picked] + rescue * rows.cut[picked]])
            context[r] = np.concatenate([context[r], rows.prefixes[owners].astype(np.float64)])
            pending = next(queue, None)
        if len(left[r]) == 0:  # nothing running and nothing left to claim: this rank is done
            finished[r] = at
            continue
        at += decoder.fixed_s + float((decoder.per_row_s + decoder.per_context_s * context[r]).sum())
        left[r], context[r] = left[r] - 1, context[r] + 1
        running = left[r] > 0
        left[r], context[r] = left[r][running], context[r][running]
        heapq.heappush(clock, (at, r))
    return finished


def longest_row_seconds(rows: StageRows, rescue: int, decoder: Decoder) -> float:
    """A lower bound on any schedule's makespan: the stage's longest row decoded alone from the start (a
    row's tokens come one step after another, whatever the other rows do)."""
    new = rows.new_tokens + rescue * rows.cut
    prefixes = np.repeat(rows.prefixes, rows.n)
    steps = np.arange(int(new.max()))
    costs = [
        decoder.prefill_per_token_s * p
        + float((decoder.fixed_s + decoder.per_row_s + decoder.per_context_s * (p + steps[:t])).sum())
        for p, t in zip(prefixes, new, strict=True)
        if t == new.max()
    ]
    return min(costs)


@dataclass(frozen=True)
class StageRows:
    """A generating stage's prefixes (context tokens), samples per prefix, and each row's new tokens and
    whether it was cut at its budget; rows are prefix-major ([prefixes × n])."""

    prefixes: np.ndarray
    n: int
    new_tokens: np.ndarray
    cut: np.ndarray


def draw_update(config: RunConfig, lengths: Lengths, rng: np.random.Generator) -> tuple[StageRows, StageRows]:
    """One update's sample and probe rows under the length model."""
    sampling, algo = config.sampling, config.algo
    prompts_n, group = config.prompts_per_update, config.group_size
    prompts = np.maximum(8, rng.lognormal(np.log(lengths.prompt_median), lengths.prompt_sigma, prompts_n))
    prompts = prompts.round().astype(np.int64)
    budget = np.minimum(sampling.max_tokens, (sampling.context or 10**9) - prompts)
    drawn = rng.lognormal(np.log(lengths.response_median), lengths.response_sigma, (prompts_n, group))
    responses = np.minimum(np.maximum(1, drawn.round()), budget[:, None]).astype(np.int64)
    sample = StageRows(prompts, group, responses.reshape(-1), (responses == budget[:, None]).reshape(-1))
    pivots = algo.probe_budget // algo.continuations_per_pivot
    owner = rng.integers(0, group, (prompts_n, pivots))
    length = np.take_along_axis(responses, owner, axis=1)
    margin = min(algo.margin, 1)
    at = (margin + rng.random((prompts_n, pivots)) * np.maximum(0, length - 2 * margin)).astype(np.int64)
    left = np.maximum(1, length - at)
    n = algo.continuations_per_pivot
    drawn = rng.lognormal(np.log(left)[..., None], lengths.response_sigma, (prompts_n, pivots, n))
    room = (budget[:, None] - at)[..., None]
    continuations = np.minimum(np.maximum(1, drawn.round()), room).astype(np.int64)
    probe = StageRows(
        (prompts[:, None] + at).reshape(-1),
        n,
        continuations.reshape(-1),
        (continuations == room).reshape(-1),
    )
    return sample, probe


def stage_calls(
    rows: StageRows, batch_rows: int, shards: int | None, rescue: int, decoder: Decoder
) -> list[float]:
    """Each engine call's seconds for a stage under (batch_rows, shards), by the stages' own plans: its rows
    sampled together, then its cut rows' `rescue` tokens."""
    plan = chunk_plan(rows.prefixes.tolist(), rows.n, batch_rows)
    times = []
    for call in call_plan(len(plan), shards):
        owners = np.repeat([i for c in call for i in plan[c]], rows.n)
        picked = owners * rows.n + np.tile(np.arange(rows.n), len(owners) // rows.n)
        prefixes, new_tokens, cut = rows.prefixes[owners], rows.new_tokens[picked], rows.cut[picked]
        shared = np.tile(np.arange(rows.n) > 0, len(owners) // rows.n)
        sampled = call_seconds(prefixes, new_tokens, shared, decoder)
        context = float((prefixes + new_tokens)[cut].mean()) if cut.any() else 0.0
        times.append(sampled + rescue_seconds(int(cut.sum()), context, rescue, decoder))
    return times


PLANS = {"before": (256, None), "after": None, "16_calls": (64, 16), "40_calls": (64, 40)}
"""(batch_rows, shards): before this change every recipe kept the default 256 rows and a call per chunk;
after, the recipe's own sampling settings; two alternatives with more, smaller calls for the ranks to claim
(a shard a call)."""
STREAMED = {"streamed_16": (16, 64), "streamed_8": (8, 32)}
"""(batch_rows, keep_rows) of the streamed alternative (streamed_rank_seconds): small chunks claimed into a
live engine whenever fewer than keep_rows of a rank's rows run."""


def busy_fractions(
    config: RunConfig, name: str, decoder: Decoder, draws: int, seed: int = 0
) -> dict[str, Any]:
    """Per stage and plan: calls, rows, each rank's busy fraction in the first drawn update (busiest
    first), the lowest rank's over `draws` updates (median and worst) and the stage's median makespan."""
    rng = np.random.default_rng(seed)
    updates = [draw_update(config, LENGTHS[name], rng) for _ in range(draws)]
    result: dict[str, Any] = {}
    for stage, index, rescue in (("sample", 0, 0), ("probe", 1, config.algo.rescue_tokens)):
        rows = len(updates[0][index].new_tokens)
        for plan, settings in PLANS.items():
            batch_rows, shards = settings or (config.sampling.batch_rows, config.sampling.shards)
            per_update = [stage_calls(u[index], batch_rows, shards, rescue, decoder) for u in updates]
            result[f"{stage}_{plan}"] = {
                "batch_rows": batch_rows,
                "shards": shards,
                "calls": len(per_update[0]),
                "rows": rows,
                **_busy_summary([rank_seconds(times, RANKS) for times in per_update]),
            }
        for plan, (batch_rows, keep_rows) in STREAMED.items():
            per_update = [
                streamed_rank_seconds(u[index], batch_rows, keep_rows, rescue, decoder) for u in updates
            ]
            result[f"{stage}_{plan}"] = {
                "batch_rows": batch_rows,
                "keep_rows": keep_rows,
                "rows": rows,
                **_busy_summary(per_update),
            }
        bound = [longest_row_seconds(u[index], rescue, decoder) for u in updates]
        result[f"{stage}_longest_row_s"] = round(statistics.median(bound), 2)
    return result


def _busy_summary(per_update: list[list[float]]) -> dict[str, Any]:
    """Each rank's busy fraction in the first update (busiest first), the lowest rank's over every update
    (median and worst) and the median makespan, from each update's seconds per rank."""
    lowest = [min(seconds) / max(seconds) for seconds in per_update]
    first = per_update[0]
    return {
        "busy_per_rank": [round(s / max(first), 3) for s in sorted(first, reverse=True)],
        "lowest_rank_median": round(statistics.median(lowest), 3),
        "lowest_rank_worst": round(min(lowest), 3),
        "makespan_s": round(statistics.median(max(seconds) for seconds in per_update), 2),
    }
