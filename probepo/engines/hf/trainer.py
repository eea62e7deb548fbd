"""TrainerEngine on a Hugging Face causal LM: scoring (old log-probs, full-vocabulary entropies) and PPO-clip.

The language-model head runs over chunks of response positions, never over every position at once: a
[tokens, vocab] table of 4K tokens × 150K entries is 2.4 GB in float32, so the body's last hidden states
are computed in one pass and the head (plus log-softmax and entropy, in float32) `score_chunk_tokens`
positions at a time. In training each chunk is activation-checkpointed, so its logits are recomputed in
the backward pass instead of kept. Everything else (mini-batch plan, gradient accumulation with the global
token count, resumable state) is the CPU testbed's TorchTrainerEngine.

Checkpoints are Hugging Face folders: `config.json` + `model.safetensors` (what `from_pretrained` and the
generation engine load) and the tokenizer files, plus `optimizer.safetensors` (AdamW moments and step
counts) and `trainer.json`. Nothing is pickled.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from probepo import spend
from probepo.engines.base import TrainerState
from probepo.engines.hf.loading import read_weights, with_tied_weights
from probepo.engines.packing import pack_responses
from probepo.engines.trainer import OPTIMIZER_FILE, TRAINER_FILE, TorchTrainerEngine
from probepo.streamed_save import save_streamed, streamed_pretrained_saves

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from probepo.config import AlgoConfig, OptimConfig

# Config fields with which a model's logits are not plain `lm_head(last hidden state)` (Gemma 2, Cohere,
# Granite): the chunked head would silently score the wrong distribution.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class HFTrainerEngine(TorchTrainerEngine):
    """TrainerEngine on a transformers causal LM whose logits are `get_output_embeddings()` applied to the
    base model's last hidden state (Llama, Qwen, Mistral, SmolLM).

    `temperature`: the sampling temperature (logits are divided by it). `response_budget`: the most tokens
    a response may have (Dr.GRPO's constant). `score_batch_rows`: rows per scoring forward pass.
    `score_chunk_tokens`: response positions per head pass (bounds the [chunk, vocab] logits).
    `autocast_dtype`: compute dtype of forward passes (e.g. torch.bfloat16 on CUDA) while parameters and
    AdamW moments stay in the model's dtype; None computes in the model's dtype. `tokenizer`: saved with
    each checkpoint.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        optim: OptimConfig,
        algo: AlgoConfig | None = None,
        *,
        response_budget: int,
        temperature: float = 1.0,
        score_batch_rows: int = 64,
        score_chunk_tokens: int = 1024,
        autocast_dtype: torch.dtype | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        if score_chunk_tokens < 1:
            raise ValueError(f"score_chunk_tokens = {score_chunk_tokens}: must be >= 1")
        text_config = model.config.get_text_config()
        transforms = [name for name in _LOGIT_TRANSFORMS if getattr(text_config, name, None) not in (None, 1)]
        if transforms:
            raise ValueError(f"{type(model).__name__} transforms its logits ({transforms}): not supported")
        super().__init__(
            model,
            optim,
            algo,
            response_budget=response_budget,
            temperature=temperature,
            score_batch_rows=score_batch_rows,
        )
        self.score_chunk_tokens = score_chunk_tokens
        self.autocast_dtype = autocast_dtype
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.forward_scores: nn.Module = ResponseScorer(model, temperature, score_chunk_tokens)
        """The forward pass of scoring and training (a DeepSpeed engine wraps it)."""

    def _autocast(self) -> AbstractContextManager[None]:
        enabled = self.autocast_dtype is not None
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=enabled)

    def response_logp_entropy(
        self, prompts: list[list[int]], responses: list[list[int]], *, grad: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One forward pass over each prompt + response (right-padded: causal attention never sees the pad).

        Returns (logp, entropy, mask), each [B, T] on the model's device, T the longest response (at least
        1): float32 log-prob of response token t of row i and the entropy of the distribution it was drawn
        from (logits / temperature); zeros where mask is False. With grad, logp carries the gradient and
        each head chunk is checkpointed; entropy never does.
        """
        ids, at, targets, mask = (x.to(self.device) for x in pack_responses(prompts, responses))
        with torch.set_grad_enabled(grad), self._autocast():
            logp, entropy = self.forward_scores(ids, at, targets[mask], mask)
        table = torch.zeros(mask.shape, dtype=torch.float32, device=self.device)
        return table.masked_scatter(mask, logp), table.masked_scatter(mask, entropy.detach()), mask

    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
        """(logp, entropy, mask), each [N, T] on CPU (float32), T the longest response; zeros where mask is
        False."""
        self.model.eval()
        T = max((len(r) for r in responses), default=0)
        logp = torch.zeros(len(responses), T)
        entropy = torch.zeros(len(responses), T)
        mask = torch.zeros(len(responses), T, dtype=torch.bool)
        for start in range(0, len(responses), self.score_batch_rows):
            rows = slice(start, start + self.score_batch_rows)
            chunk_logp, chunk_entropy, chunk_mask = self.response_logp_entropy(prompts[rows], responses[rows])
            width = chunk_mask.shape[1] if T else 0
            mask[rows, :width] = chunk_mask[:, :width].cpu()
            logp[rows, :width] = chunk_logp[:, :width].cpu()
            entropy[rows, :width] = chunk_entropy[:, :width].cpu()
        return logp, entropy, mask

    def training_logp_entropy(
        self, prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[Tensor, Tensor, Tensor]:
        return self.response_logp_entropy(prompts, responses, grad=True)

    def save(self, directory: str | Path) -> None:
        """config.json + model.safetensors (+ generation_config.json) and the tokenizer files, as
        `save_pretrained` writes them, then optimizer.safetensors + trainer.json. Every tensor is streamed
        to its file one at a time, through the pinned staging buffer from a GPU (`save_streamed`; the
        weights by routing `save_pretrained`'s writer to it)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with streamed_pretrained_saves():
            self.model.save_pretrained(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)
        optimizer = self.optimizer_tensors()
        save_streamed({k: v.contiguous() for k, v in optimizer.items()}, directory / OPTIMIZER_FILE)
        untied = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        spend.count_written([*untied.values(), *optimizer.values()])
        (directory / TRAINER_FILE).write_text(json.dumps(self.meta(), indent=2) + "\n")

    def load(self, directory: str | Path) -> None:
        """Restores what `save` wrote: weights, AdamW moments and step counts, bitwise."""
        directory = Path(directory)
        weights = with_tied_weights(self.model, read_weights(directory))
        tensors = {f"model.{k}": v for k, v in weights.items()}
        tensors.update(load_file(directory / OPTIMIZER_FILE))
        self.load_state(TrainerState(tensors, json.loads((directory / TRAINER_FILE).read_text())))


class ResponseScorer(nn.Module):
    """A causal LM's body and chunked head as one module: packed rows in, each response token's log-prob
    and entropy out (chunks checkpointed while grad is enabled). One module, so that a wrapper such as
    DeepSpeed's engine sees every forward pass."""

    def __init__(self, model: PreTrainedModel, temperature: float, chunk_tokens: int) -> None:
        super().__init__()
        self.model, self.temperature, self.chunk_tokens = model, temperature, chunk_tokens

    def forward(self, ids: Tensor, at: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """ids [B, width] packed prompt + response rows, at [B, T] the position predicting each response
        token, targets [M] the response tokens where mask [B, T] holds. Returns (logp [M], entropy [M]),
        float32."""
        hidden = self.model.base_model(input_ids=ids, use_cache=False).last_hidden_state  # [B, width, H]
        picked = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))[mask]  # [M, H]
        return chunked_logp_entropy(
            self.model.get_output_embeddings(),
            picked,
            targets,
            self.temperature,
            self.chunk_tokens,
            checkpointed=torch.is_grad_enabled(),
        )


def chunked_logp_entropy(
    head: nn.Module,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    chunk_tokens: int,
    *,
    checkpointed: bool = False,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target and the full-vocabulary entropy of softmax(head(hidden) / temperature), in
    float32, `chunk_tokens` positions at a time.

    Args:
        head: maps [M', H] hidden states to [M', V] logits.
        hidden: [M, H] hidden states.
        targets: [M] token ids.
        checkpointed: recompute each chunk's logits in the backward pass instead of keeping them.

    Returns:
        (logp [M], entropy [M]).
    """
    logps, entropies = [], []
    # at least one (maybe empty) chunk, so that no positions still give a loss with a graph to backward
    for start in range(0, max(hidden.shape[0], 1), chunk_tokens):
        piece = slice(start, start + chunk_tokens)
        args = (head, hidden[piece], targets[piece], temperature)
        if checkpointed:
            logp, entropy = checkpoint(_head_logp_entropy, *args, use_reentrant=False)
        else:
            logp, entropy = _head_logp_entropy(*args)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), torch.cat(entropies)


def _head_logp_entropy(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float
) -> tuple[Tensor, Tensor]:
    logp_all = torch.log_softmax(head(hidden).float() / temperature, dim=-1)  # [chunk, V]
    return logp_all.gather(-1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)
