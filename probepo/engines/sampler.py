"""The CPU generation engine: batched sampling and prefix-forked probing with a KV cache, in plain torch.

Every prefix of a call is encoded once (left-padded, per-row positions), its cache is forked into n
rows, and all rows decode in lockstep until each has stopped, hit its limit, or finished its rescue.
Probes are sorted by prefix length and chunked, so probing costs about its token count. The loop is
`LockstepDecoding`'s, shared with the Hugging Face engine: an engine supplies the model through its hooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Generic, TypeVar

import torch
from safetensors.torch import load_file
from torch import Tensor

from probepo.engines.base import Chunk, Completion, SamplingParams, call_chunks
from probepo.engines.decode_rows import DecodeRows, rescue_tokens_appended, sample_tokens
from probepo.models.gpt import GPT, WEIGHTS_FILE, KVCache
from probepo.spend import ByteKind

C = TypeVar("C")
"""An engine's KV cache."""


def chunk_plan(lengths: Sequence[int], n: int, batch_rows: int) -> list[list[int]]:
    """The prefix indices decoded with one random stream, chunk by chunk: sorted by length (stable),
    batch_rows // n prefixes at a time (at least one). A pure function of the lengths, n and the recipe's
    batch rows (never of how many ranks share the work), so every rank and every resume makes the same
    chunks."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    per_chunk = max(1, batch_rows // n)
    return [order[i : i + per_chunk] for i in range(0, len(order), per_chunk)]


def call_plan(chunk_count: int, shards: int | None) -> list[list[int]]:
    """The chunks decoded together by one engine call, call by call. With `shards` (the recipe's
    `sampling.shards`), the chunks (sorted by length) are dealt to the calls back and forth, 0, 1, …,
    shards − 1, shards − 1, …, 0, 0, 1, …: every call holds a spread of the lengths with no call always the
    longest of each round, so the calls take about as long, and the plan is the recipe's, never the ranks'.
    Without, one call per chunk."""
    if shards is None:
        return [[c] for c in range(chunk_count)]
    calls: list[list[int]] = [[] for _ in range(min(shards, chunk_count))]
    for chunk in range(chunk_count):
        round_, seat = divmod(chunk, shards)
        calls[seat if round_ % 2 == 0 else shards - 1 - seat].append(chunk)
    return calls


class ChunkedDecoding(ABC):
    """What all generation engines share: calls split into chunks of prefixes sorted by length, each chunk
    decoded with its own random stream, seeded from (the call's seed, the chunk's index), and the chunks
    dealt into engine calls (`calls`). A chunk's samples are thus a function of the chunk alone wherever and
    with whichever chunks it is decoded (bitwise on CPU; on GPU vLLM's batch-invariant mode promises it):
    the generating stages spread the engine calls over ranks and commit each as a shard. Subclasses call
    `_batching` and set `device` and the model's `vocab_size` and `context` (tokens a sequence may fill)
    that calls are checked against."""

    device: torch.device
    max_batch_rows: int
    shards: int | None
    vocab_size: int
    context: int
    handoff: ByteKind = "handoff_memory"
    """How a state dict given to `load_weights` reaches the engine (its spend counter): in memory here."""

    def _batching(self, max_batch_rows: int, shards: int | None) -> None:
        """Rows per chunk, and the engine calls a call's chunks are dealt into (None: one per chunk)."""
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows = {max_batch_rows}: must be >= 1")
        if shards is not None and shards < 1:
            raise ValueError(f"shards = {shards}: must be >= 1 (or None: one engine call per chunk)")
        self.max_batch_rows, self.shards = max_batch_rows, shards

    def generate(
        self, prompts: list[list[int]], n: int, params: SamplingParams, seed: int
    ) -> list[list[Completion]]:
        """n samples per prompt (ids include BOS), each of at most params.max_tokens tokens."""
        return self.continue_from(prompts, n, params, seed, [params.max_tokens] * len(prompts))

    def chunks(self, prefixes: list[list[int]], n: int) -> list[list[int]]:
        """`chunk_plan` of the prefixes' lengths with this engine's batch rows."""
        return chunk_plan([len(p) for p in prefixes], n, self.max_batch_rows)

    def calls(self, chunk_count: int) -> list[list[int]]:
        """`call_plan` with this engine's shards."""
        return call_plan(chunk_count, self.shards)

    def continue_from(
        self,
        prefixes: list[list[int]],
        n: int,
        params: SamplingParams,
        seed: int,
        max_new_tokens: list[int],
        *,
        rescue_ids: Sequence[int] = (),
        rescue_tokens: int = 0,
    ) -> list[list[Completion]]:
        """n continuations of each prefix; see GenerationEngine.continue_from: each call of `calls` decoded
        by `decode_chunks`, chunk c of `chunks` with seed `chunk_seed(seed, c)`."""
        rescue_len = rescue_tokens_appended(rescue_ids, rescue_tokens)
        self._check(prefixes, n, max_new_tokens, rescue_len, rescue_ids)  # every prefix, before any decoding
        plan = self.chunks(prefixes, n)
        results: list[list[Completion]] = [[] for _ in prefixes]
        for call in self.calls(len(plan)):
            chunks = call_chunks(prefixes, max_new_tokens, plan, call, seed)
            decoded = self._decode_chunks(chunks, n, params, rescue_ids, rescue_len)
            for c, rows in zip(call, decoded, strict=True):
                for i, row in zip(plan[c], rows, strict=True):
                    results[i] = row
        return results

    def decode_chunks(
        self,
        chunks: Sequence[Chunk],
        n: int,
        params: SamplingParams,
        *,
        rescue_ids: Sequence[int] = (),
        rescue_tokens: int = 0,
    ) -> list[list[list[Completion]]]:
        """n continuations of each prefix of each chunk, in one engine call, chunk c's randomness from
        `chunks[c].seed` alone: bitwise the same wherever and whenever it runs (on CPU; on CUDA as far as
        its kernels are deterministic)."""
        rescue_len = rescue_tokens_appended(rescue_ids, rescue_tokens)
        for chunk in chunks:
            self._check(chunk.prefixes, n, chunk.max_new_tokens, rescue_len, rescue_ids)
        return self._decode_chunks(chunks, n, params, rescue_ids, rescue_len)

    @abstractmethod
    def _decode_chunks(
        self,
        chunks: Sequence[Chunk],
        n: int,
        params: SamplingParams,
        rescue_ids: Sequence[int],
        rescue_len: int,
    ) -> list[list[list[Completion]]]:
        """`decode_chunks` of chunks already checked."""

    def _check(
        self,
        prefixes: list[list[int]],
        n: int,
        max_new_tokens: list[int],
        rescue_len: int,
        rescue_ids: Sequence[int],
    ) -> None:
        """Refuse a call the engine cannot decode (empty prefixes, ids outside the vocabulary, limits past
        the context), naming the prefix."""
        if n < 1:
            raise ValueError(f"n = {n}: must be >= 1")
        if len(max_new_tokens) != len(prefixes):
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {len(prefixes)} prefixes")
        for name, seq in [("rescue_ids", rescue_ids), *((f"prefix {i}", p) for i, p in enumerate(prefixes))]:
            bad = [t for t in seq if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"{name} holds token ids outside [0, {self.vocab_size}): {bad[:5]}")
        for i, (prefix, limit) in enumerate(zip(prefixes, max_new_tokens, strict=True)):
            if not prefix:
                raise ValueError(f"prefix {i} is empty (a prompt holds at least one token)")
            if limit < 0:
                raise ValueError(f"max_new_tokens[{i}] = {limit}: must be >= 0")
            if len(prefix) + limit + rescue_len > self.context:
                raise ValueError(
                    f"prefix {i}: {len(prefix)} tokens + {limit} new + {rescue_len} rescue exceed the model"
                    f" context of {self.context} tokens"
                )


class LockstepDecoding(ChunkedDecoding, Generic[C]):
    """Each chunk of an engine call as one lockstep loop over a KV cache of type C, chunk after chunk, for
    the engines that run the model themselves (vLLM decodes on its own); they supply the model through the
    hooks below."""

    def sleep(self) -> bool:
        """Nothing is freed: their KV cache lives only inside a call, and the weights stay (True)."""
        return True

    def waking(self) -> AbstractContextManager[None]:
        """Nothing to wake: the weights never left."""
        return nullcontext()

    def _decode_chunks(
        self,
        chunks: Sequence[Chunk],
        n: int,
        params: SamplingParams,
        rescue_ids: Sequence[int],
        rescue_len: int,
    ) -> list[list[list[Completion]]]:
        rescue = torch.tensor(list(rescue_ids), dtype=torch.long, device=self.device)
        decoded = []
        with torch.inference_mode():
            for chunk in chunks:
                generator = torch.Generator(device=self.device).manual_seed(chunk.seed)
                limits = torch.tensor(chunk.max_new_tokens, device=self.device)
                decoded.append(self._decode(chunk.prefixes, n, params, limits, rescue, rescue_len, generator))
        return decoded

    @abstractmethod
    def _prefill(self, ids: Tensor, positions: Tensor, pad: Tensor, new_max: int) -> tuple[Tensor, C, Tensor]:
        """Encodes ids [P, width] (row i left-padded with pad[i] tokens; positions [P, width]) into a new
        cache with room for new_max more tokens per row. Returns the last position's logits [P, V], the
        cache, and valid [P, S]: its key slots that are not padding, as `_step` takes it."""

    @abstractmethod
    def _fork(self, cache: C, n: int) -> C:
        """The cache with each row repeated n times (row b → rows b·n … b·n + n − 1)."""

    @abstractmethod
    def _select(self, cache: C, keep: Tensor) -> C:
        """The cache of the rows keep [R'] only."""

    @abstractmethod
    def _step(self, tokens: Tensor, positions: Tensor, valid: Tensor, cache: C) -> tuple[Tensor, Tensor]:
        """Feeds one token per row (tokens, positions: [R]), adding it to the cache. valid [R, S] as the last
        call returned it; returns the next-token logits [R, V] and valid for the next call."""

    @abstractmethod
    def _sample(self, logits: Tensor, temperature: float, top_p: float, generator: torch.Generator) -> Tensor:
        """One token per row of logits [R, V] → [R], drawn with `generator`."""

    def _decode(
        self,
        prefixes: list[list[int]],
        n: int,
        params: SamplingParams,
        limits: Tensor,
        rescue_ids: Tensor,
        rescue_len: int,
        generator: torch.Generator,
    ) -> list[list[Completion]]:
        """Decodes n rows per prefix of one chunk in lockstep. limits [P]: sampled tokens allowed per prefix;
        rows reaching it enter the rescue phase when rescue_len > 0: forced rescue_ids, then greedy tokens.
        Finished rows are dropped from the batch once they are a quarter of it, so dead rows cost little."""
        device = self.device
        P, width = len(prefixes), max(map(len, prefixes))
        lengths = torch.tensor([len(p) for p in prefixes], device=device)
        ids = torch.zeros(P, width, dtype=torch.long, device=device)
        for i, prefix in enumerate(prefixes):
            ids[i, width - len(prefix) :] = torch.tensor(prefix, device=device)
        pad = width - lengths
        positions = (torch.arange(width, device=device)[None, :] - pad[:, None]).clamp(min=0)
        new_max = int(limits.max()) + rescue_len
        logits, cache, valid = self._prefill(ids, positions, pad, new_max)

        # fork: row r continues prefix r // n
        R = P * n
        cache = self._fork(cache, n)
        logits = logits.repeat_interleave(n, dim=0)
        rows = DecodeRows.start(*(x.repeat_interleave(n, dim=0) for x in (lengths, limits, valid)), device)
        out = torch.zeros(R, new_max, dtype=torch.long, device=device)
        count = torch.zeros(R, dtype=torch.long, device=device)
        stopped, rescued = (torch.zeros(R, dtype=torch.bool, device=device) for _ in "sr")
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)

        rows.update_phase(rescue_len)
        any_done, all_done, compact, any_rescued = rows.flags()
        # a row is done after its limit + rescue_len <= new_max tokens: the last iteration only records
        for step in range(new_max + 1):
            if any_done:
                finished = rows.done
                count[rows.ids[finished]] = rows.count[finished]
                stopped[rows.ids[finished]] = rows.stopped[finished]
                rescued[rows.ids[finished]] = rows.rescued[finished]
                if all_done:
                    break
                if compact:  # drop finished rows
                    keep = (~finished).nonzero()[:, 0]
                    rows, logits = rows.select(keep), logits[keep]
                    cache = self._select(cache, keep)
                    any_rescued = bool(rows.rescued.any())
            token = self._sample(logits, params.temperature, params.top_p, generator)
            forced = torch.zeros_like(rows.done)
            if any_rescued:
                k = rows.count - rows.rescue_start
                forced = rows.rescued & (k < len(rescue_ids))
                token = torch.where(rows.rescued & ~forced, logits.argmax(-1), token)
                if len(rescue_ids):
                    token = torch.where(forced, rescue_ids[k.clamp(max=len(rescue_ids) - 1)], token)
            active = ~rows.done
            out[rows.ids, step] = torch.where(active, token, 0)
            rows.count += active
            hit_stop = active & ~forced & torch.isin(token, stop_ids)
            rows.stopped |= hit_stop
            rows.done |= hit_stop
            rows.update_phase(rescue_len)
            any_done, all_done, compact, any_rescued = rows.flags()
            if all_done:
                continue  # no logits needed: the next iteration records the rows and stops
            # Finished rows stay in the batch until compaction and are fed a dummy position: at
            # prefix length + step a finished long-prefix row would run past the context.
            positions = torch.where(rows.done, 0, rows.lengths + step)
            logits, rows.valid = self._step(token, positions, rows.valid, cache)

        counts, stops, rescues = count.tolist(), stopped.tolist(), rescued.tolist()
        out = out.cpu()
        return [
            [
                Completion(
                    ids=out[r, : counts[r]].tolist(),
                    finish_reason="stop" if stops[r] else "length",
                    rescued=bool(rescues[r]),
                )
                for r in range(i * n, (i + 1) * n)
            ]
            for i in range(P)
        ]


class TorchGenerationEngine(LockstepDecoding[KVCache]):
    """GenerationEngine on a GPT in this process. `max_batch_rows` caps the rows (prefixes × n) decoded
    together: 256 made probing cost about its token count on one core (bench/sampler.py), where one
    batch of every probe paid for rows whose prefix lengths, and so whose remaining lengths, differ.
    `shards` deals a call's chunks into engine calls (ChunkedDecoding)."""

    def __init__(self, model: GPT, *, max_batch_rows: int = 256, shards: int | None = None) -> None:
        self._batching(max_batch_rows, shards)
        self.model = model.eval()
        self.device = torch.device("cpu")
        self.vocab_size = model.config.vocab_size
        self.context = model.config.context

    def load_weights(self, source: str | Path | dict[str, Tensor]) -> None:
        """Switch the policy: a checkpoint directory, a .safetensors file, or a model state dict."""
        if not isinstance(source, dict):
            path = Path(source)
            source = load_file(path / WEIGHTS_FILE if path.is_dir() else path)
        self.model.load_state_dict(source)

    def _prefill(
        self, ids: Tensor, positions: Tensor, pad: Tensor, new_max: int
    ) -> tuple[Tensor, KVCache, Tensor]:
        """The cache is preallocated for all new tokens, and valid [P, width + new_max] covers its slots."""
        P, width = ids.shape
        cache = self.model.new_cache(P, width + new_max)
        valid = torch.arange(width + new_max, device=self.device)[None, :] >= pad[:, None]
        return self.model(ids, positions, valid, cache)[:, -1], cache, valid

    def _fork(self, cache: KVCache, n: int) -> KVCache:
        return cache.expand(n)

    def _select(self, cache: KVCache, keep: Tensor) -> KVCache:
        return cache.select(keep)

    def _step(
        self, tokens: Tensor, positions: Tensor, valid: Tensor, cache: KVCache
    ) -> tuple[Tensor, Tensor]:
        """valid already covers every slot: the model reads the filled ones."""
        return self.model(tokens[:, None], positions[:, None], valid, cache)[:, 0], valid

    def _sample(self, logits: Tensor, temperature: float, top_p: float, generator: torch.Generator) -> Tensor:
        return sample_tokens(logits, temperature, top_p, generator)
