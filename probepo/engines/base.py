"""Engine interfaces: what stages call to sample, probe, score and optimise a policy.

The CPU testbed implements them in plain torch (sampler.py, trainer.py); GPU clusters implement them
again with vLLM and DeepSpeed. Token ids are plain lists; per-token tables are [N, T] tensors whose
position 0 is the first response token; a row's positions past its response length are padding (mask
False).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from torch import Tensor

from probepo.config import SamplingConfig
from probepo.spend import ByteKind

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one call. temperature 0 is greedy; max_tokens counts the stop token."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature = {self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p = {self.top_p}: must be in (0, 1]")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens = {self.max_tokens}: must be >= 0")

    @classmethod
    def from_config(cls, config: SamplingConfig, stop_token_ids: Sequence[int]) -> SamplingParams:
        return cls(config.temperature, config.top_p, config.max_tokens, tuple(stop_token_ids))


@dataclass(frozen=True)
class Completion:
    """One sampled continuation. ids: the generated tokens only (not the prompt or prefix), the stop
    token included when finish_reason is "stop", and for a rescued probe the rescue suffix and the greedy
    rescue tokens too."""

    ids: list[int]
    finish_reason: FinishReason
    rescued: bool = False


@dataclass(frozen=True)
class Chunk:
    """Prefixes decoded with one random stream (seeded `seed`), each with its limit of new tokens."""

    prefixes: list[list[int]]
    max_new_tokens: list[int]
    seed: int


@dataclass(frozen=True)
class TrainBatch:
    """One update's training data: N responses with their prompts, the old log-probs from `score`, and
    token advantages; old_logp and advantages are [N, T] with T ≥ the longest response. loss_mask [N, T]
    bool, where given, marks the response tokens that enter the loss (and its token counts); None: all."""

    prompts: list[list[int]]
    responses: list[list[int]]
    old_logp: Tensor
    advantages: Tensor
    loss_mask: Tensor | None = None


@dataclass(frozen=True)
class TrainerState:
    """Everything needed to resume optimisation bitwise: tensors (model weights under `model.`, optimizer
    moments under `optim.`) for safetensors, and small JSON-able metadata (step counts, hyperparameters)."""

    tensors: dict[str, Tensor]
    meta: dict[str, Any]


MinibatchCallback = Callable[[int, dict[str, float]], None]
"""Called after each optimizer step with the mini-batch index and its metrics; the caller may commit
`state()` there to resume from the next mini-batch."""


class GenerationEngine(Protocol):
    handoff: ByteKind
    """How a state dict given to `load_weights` reaches the engine: in memory, or through a file."""

    def generate(
        self, prompts: list[list[int]], n: int, params: SamplingParams, seed: int
    ) -> list[list[Completion]]:
        """n samples per prompt (prompt ids include BOS); result[i][j] is sample j of prompt i."""
        ...

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
        """n continuations of each prefix (prompt + partial response ids), each encoded once and forked.
        Prefix i may generate max_new_tokens[i] tokens (params.max_tokens is ignored). With rescue_tokens
        > 0, a continuation that reaches its limit without a stop token gets rescue_ids appended and up to
        rescue_tokens more tokens generated greedily (Completion.rescued).

        The same as decoding each call of `calls` with `decode_chunks`, chunk c of `chunks(prefixes, n)`
        with seed `chunk_seed(seed, c)`: what the generating stages do, one shard per call, over any number
        of ranks."""
        ...

    def chunks(self, prefixes: list[list[int]], n: int) -> list[list[int]]:
        """The indices of the prefixes `continue_from` decodes with one random stream, chunk by chunk: a
        function of the prefix lengths, n and the engine's batch rows only."""
        ...

    def calls(self, chunk_count: int) -> list[list[int]]:
        """The chunks (indices into `chunks`) decoded together by one engine call, call by call: a function
        of the chunk count and the recipe's `sampling.shards` only, never of the ranks."""
        ...

    def decode_chunks(
        self,
        chunks: Sequence[Chunk],
        n: int,
        params: SamplingParams,
        *,
        rescue_ids: Sequence[int] = (),
        rescue_tokens: int = 0,
    ) -> list[list[list[Completion]]]:
        """`continue_from` of the chunks' prefixes in one engine call, each chunk with randomness from its
        own seed alone; result[c][i][j] is sample j of prefix i of chunk c."""
        ...

    def load_weights(self, source: str | Path | dict[str, Tensor]) -> None:
        """Switch the policy: a checkpoint directory, a .safetensors file, or a model state dict."""
        ...

    def sleep(self) -> bool:
        """Give the device memory up to the trainer, which works next (score, optimize, a replay); nothing
        generates until `waking`. Returns whether the engine still holds its policy's weights: False where
        sleeping discarded them (vLLM's sleep level 2 on a GPU), and a policy must be loaded while waking."""
        ...

    def waking(self) -> AbstractContextManager[None]:
        """Wake from `sleep`, in two steps that never peak together: the weights' memory on entering (a
        policy's weights are loaded inside the block, while a trainer may lend its own), the rest (vLLM's KV
        cache) on leaving, ready to generate."""
        ...


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed of chunk `chunk` of a call seeded `seed` (63 bits of sha256): chunks draw independent
    streams, so any chunk is decoded without the ones before it."""
    digest = hashlib.sha256(f"{seed}/chunk/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def call_chunks(
    prefixes: list[list[int]], max_new_tokens: list[int], plan: list[list[int]], call: list[int], seed: int
) -> list[Chunk]:
    """The chunks an engine call decodes: chunk c of `call` (indices into `plan`, each chunk's prefix
    indices) with its prefixes, their limits and seed `chunk_seed(seed, c)`."""
    return [
        Chunk([prefixes[i] for i in plan[c]], [max_new_tokens[i] for i in plan[c]], chunk_seed(seed, c))
        for c in call
    ]


class TrainerEngine(Protocol):
    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
        """(logp, entropy, mask), each [N, T] with T the longest response: each response token's log-prob
        and the full-vocabulary entropy of the distribution it was drawn from, logits divided by the
        sampling temperature."""
        ...

    def train_step(
        self,
        batch: TrainBatch,
        *,
        seed: int,
        start_minibatch: int = 0,
        on_minibatch_done: MinibatchCallback | None = None,
    ) -> dict[str, float]:
        """PPO-clip over mini-batches (order shuffled from `seed`), skipping the first start_minibatch
        (already done before a resume); returns the mean metrics of the mini-batches it ran."""
        ...

    def weights(self) -> dict[str, Tensor]:
        """A copy of the policy's state dict, on the host (what outlives the trainer's next step)."""
        ...

    def live_weights(self) -> AbstractContextManager[dict[str, Tensor]]:
        """The policy's state dict as the trainer holds it, nothing copied (under ZeRO-3 gathered for the
        block: every rank enters it together): for GenerationEngine.load_weights, which copies it into its
        own memory inside the block."""
        ...

    def weights_fingerprint(self) -> str:
        """The fingerprint of the policy's weights (engines/fingerprint.py), computed where they are, without
        a host copy: the replay check's. Collective on the ranks of a job."""
        ...

    def state(self) -> TrainerState: ...

    def load_state(self, state: TrainerState) -> None: ...

    def save(self, directory: str | Path) -> None:
        """A checkpoint: model.safetensors + config.json (loadable by the generation engine), plus
        optimizer.safetensors + trainer.json."""
        ...

    def load(self, directory: str | Path) -> None: ...
