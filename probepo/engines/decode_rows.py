"""What the lockstep decoding loop (sampler.py) keeps per row, and how it draws a token: the rows still in a
call's batch with their limits and cutoff rescues, and temperature / top-p sampling from one generator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass
class DecodeRows:
    """Decoding state of the rows still in the batch, each [R]; valid [R, S] marks real key slots."""

    ids: Tensor  # row index in the call's output
    lengths: Tensor  # prefix length: position of the first new token
    limits: Tensor
    valid: Tensor
    count: Tensor  # tokens emitted
    done: Tensor
    stopped: Tensor
    rescued: Tensor
    rescue_start: Tensor  # count when the rescue began

    @classmethod
    def start(cls, lengths: Tensor, limits: Tensor, valid: Tensor, device: torch.device) -> DecodeRows:
        R = len(lengths)
        zeros = torch.zeros(R, dtype=torch.long, device=device)
        false = torch.zeros(R, dtype=torch.bool, device=device)
        ids = torch.arange(R, device=device)
        return cls(ids, lengths, limits, valid, zeros, false, false.clone(), false.clone(), zeros.clone())

    def select(self, keep: Tensor) -> DecodeRows:
        return DecodeRows(*(getattr(self, f.name)[keep] for f in fields(self)))

    def flags(self) -> list[bool]:
        """[any done, all done, done are a quarter or more, any rescued]: the step's one device sync."""
        done = self.done
        return torch.stack([done.any(), done.all(), 4 * done.sum() >= len(done), self.rescued.any()]).tolist()

    def update_phase(self, rescue_len: int) -> None:
        """Rows at their limit enter the rescue (or finish without one); rescues that are over finish."""
        at_limit = ~self.done & ~self.rescued & (self.count >= self.limits)
        if rescue_len:
            self.rescued |= at_limit
            self.rescue_start = torch.where(at_limit, self.count, self.rescue_start)
            self.done |= self.rescued & (self.count - self.rescue_start >= rescue_len)
        else:
            self.done |= at_limit


def rescue_tokens_appended(rescue_ids: Sequence[int], rescue_tokens: int) -> int:
    """Tokens a cutoff rescue appends (its forced ids, then its greedy tokens); 0 without one."""
    return len(rescue_ids) + rescue_tokens if rescue_tokens > 0 else 0


def sample_tokens(logits: Tensor, temperature: float, top_p: float, generator: torch.Generator) -> Tensor:
    """One token per row of logits [R, V] → [R]: greedy at temperature 0, else a draw from the
    temperature-scaled softmax restricted to its top-p nucleus (exponential race: argmax p / Exp(1))."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, index = probs.sort(dim=-1, descending=True)
        outside = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p  # the first token always stays
        probs = probs.masked_fill(outside.scatter(-1, index, outside), 0.0)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(-1)
