"""A tiny decoder-only transformer (pre-norm, learned positions, tied embeddings) with a KV cache.

Shapes: B batch rows, T new tokens, S cached key slots, V vocabulary, H heads, Dh head width.
Sequences in one batch may be left-padded: each row then carries its own positions and a key-validity
mask, so a padded row computes exactly what it would alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from torch.nn.functional import scaled_dot_product_attention

from probepo.config import ModelConfig
from probepo.streamed_save import save_streamed

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


@dataclass
class KVCache:
    """Preallocated keys and values of every layer: [n_layers, B, H, S_max, Dh]; slots [0, length) are
    filled."""

    keys: Tensor
    values: Tensor
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def expand(self, n: int) -> KVCache:
        """Each row repeated n times (row b → rows b·n … b·n + n − 1): forks samples from a prefix."""
        return KVCache(
            self.keys.repeat_interleave(n, dim=1), self.values.repeat_interleave(n, dim=1), self.length
        )

    def select(self, rows: Tensor) -> KVCache:
        """The cache of the given batch rows only (rows: LongTensor [R'])."""
        return KVCache(self.keys[:, rows], self.values[:, rows], self.length)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor, mask: Tensor | None, cache: KVCache | None, layer: int) -> Tensor:
        """x [B, T, D]; mask [B, 1, T, S] bool (True = may attend) or None for plain causal attention."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            end = cache.length + T
            cache.keys[layer, :, :, cache.length : end] = k
            cache.values[layer, :, :, cache.length : end] = v
            k, v = cache.keys[layer, :, :, :end], cache.values[layer, :, :, :end]
        y = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, hidden), nn.GELU(), nn.Linear(hidden, config.d_model)
        )

    def forward(self, x: Tensor, mask: Tensor | None, cache: KVCache | None, layer: int) -> Tensor:
        x = x + self.attn(self.ln1(x), mask, cache, layer)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer. `forward` serves training (no cache, causal) and incremental decoding
    (with a KVCache, per-row positions and key validity)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.apply(self._init_weights)
        for block in self.blocks:  # residual branches scaled down with depth (GPT-2)
            nn.init.normal_(block.attn.proj.weight, std=0.02 / (2 * config.n_layers) ** 0.5)
            nn.init.normal_(block.mlp[2].weight, std=0.02 / (2 * config.n_layers) ** 0.5)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty cache for `batch` rows of `capacity` slots (left padding may make it exceed the
        context: only positions are bounded by it)."""
        c = self.config
        shape = (c.n_layers, batch, c.n_heads, capacity, c.d_model // c.n_heads)
        weight = self.tok_emb.weight
        return KVCache(weight.new_zeros(shape), weight.new_zeros(shape))

    def forward(
        self,
        ids: Tensor,
        positions: Tensor | None = None,
        valid: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Logits [B, T, V] of the next token after each of ids [B, T].

        positions [B, T]: defaults to 0 … T − 1 after the cached slots. valid [B, S] bool, S ≥ cache.length
        + T: which key slots hold real tokens (left padding is False); None means all. With a cache, the
        new keys and values are written at slots [cache.length, cache.length + T) and the length advances.
        """
        B, T = ids.shape
        start = cache.length if cache is not None else 0
        if positions is None:
            if start + T > self.config.context:
                raise ValueError(f"{start + T} tokens exceed the model context of {self.config.context}")
            positions = torch.arange(start, start + T, device=ids.device).expand(B, T)
        mask = None
        if cache is not None or valid is not None:
            slots = torch.arange(start + T, device=ids.device)
            query_slots = slots[start:, None]
            mask = slots[None, :] <= query_slots  # causal [T, S]
            if valid is not None:
                # a padded query may still attend to itself, so no row of the mask is empty (NaN otherwise)
                mask = (mask & valid[:, None, : start + T]) | (slots[None, :] == query_slots)
            mask = mask.view(-1, 1, T, start + T)
        x = self.tok_emb(ids) + self.pos_emb(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask, cache, layer)
        if cache is not None:
            cache.length += T
        return self.ln_f(x) @ self.tok_emb.weight.T


def save_model(model: GPT, directory: str | Path) -> None:
    """Writes `model.safetensors` and `config.json` into `directory` (created if missing); the weights
    streamed to the file one tensor at a time (`save_streamed`: the bytes `save_file` writes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_streamed({k: v.contiguous() for k, v in model.state_dict().items()}, directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.model_dump(), indent=2) + "\n")


def load_model(directory: str | Path) -> GPT:
    """The model saved by `save_model` in `directory` (safetensors only: nothing is unpickled)."""
    directory = Path(directory)
    model = GPT(ModelConfig.model_validate_json((directory / CONFIG_FILE).read_text()))
    model.load_state_dict(load_file(directory / WEIGHTS_FILE))
    return model
