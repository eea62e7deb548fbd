"""Chained arithmetic modulo m with a worked chain of thought: the CPU testbed's verifiable task.

Prompt `3+5-2=`, response `3+5=8;8-2=6;>6` then EOS. Each `;` ends a reasoning step (a pivot candidate);
the reward is 1 iff the text after the single `>` is the right answer, immediately followed by EOS.
"""

from __future__ import annotations

import random
import re

from probepo.data.task import Problem, Task

_SPECIALS = "_^$"  # PAD, BOS, EOS: one character each, so decode/encode round-trip on any id sequence
_ARITHMETIC = "0123456789+-*=;>"
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class CharTokenizer:
    """One token per character. Ids 0, 1, 2 are PAD, BOS, EOS, rendered as `_`, `^`, `$`."""

    def __init__(self, symbols: str = _ARITHMETIC) -> None:
        self.alphabet = _SPECIALS + symbols
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"symbols = {symbols!r}: duplicate characters or reserved ones ({_SPECIALS})")
        self._ids = {ch: i for i, ch in enumerate(self.alphabet)}
        self.vocab_size = len(self.alphabet)
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; raises ValueError naming the first character outside the vocabulary."""
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as err:
            pos = next(i for i, ch in enumerate(text) if ch not in self._ids)
            raise ValueError(
                f"character {text[pos]!r} at position {pos} of {text!r} is not in the vocabulary"
                f" {self.alphabet!r}"
            ) from err

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included (EOS as `$`)."""
        return "".join(self.token_texts(ids))

    def token_texts(self, ids: list[int]) -> list[str]:
        """The text of each token."""
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return [self.alphabet[i] for i in ids]


class StepChainTask(Task):
    """A character-level task whose worked solution is steps that each end in `;`, then `>`, the answer
    and EOS. Subclasses give the symbols, the characters a chain may use and the answer's pattern."""

    rescue_suffix = ">"

    def __init__(self, seed: int, symbols: str, chain_chars: str, answer_pattern: str) -> None:
        super().__init__(seed)
        self.tokenizer = CharTokenizer(symbols)
        self._step_end_id = self.tokenizer.encode(";")[0]
        self._answer_re = re.compile(rf"[{chain_chars};]*>({answer_pattern})\$")

    def verify(self, completion: str, problem: Problem) -> float:
        """1.0 iff the completion is chain text, one `>`, the right answer, EOS, and nothing else. The chain
        itself is not checked: the reward is on the final answer."""
        match = self._answer_re.fullmatch(completion)
        return float(match is not None and match.group(1) == problem.answer)

    def step_end(self, token_ids: list[int]) -> list[bool]:
        """True at each `;`."""
        return [i == self._step_end_id for i in token_ids]


class ModChainTask(StepChainTask):
    """Chained arithmetic modulo `modulus`: `steps` operations drawn from `ops`, solved left to right."""

    def __init__(self, steps: int = 6, modulus: int = 10, ops: str = "+-", seed: int = 0) -> None:
        if steps < 1 or modulus < 2 or not ops or set(ops) - set(_APPLY):
            raise ValueError(
                f"steps = {steps} (>= 1), modulus = {modulus} (>= 2), ops = {ops!r} (from '+-*')"
            )
        super().__init__(seed, _ARITHMETIC, chain_chars=r"0-9+\-*=", answer_pattern="0|[1-9][0-9]*")
        self.steps, self.modulus, self.ops = steps, modulus, ops

    def longest_prompt(self) -> int:
        """BOS, steps + 1 numbers of the most digits, steps operators and `=`."""
        return 1 + (self.steps + 1) * len(str(self.modulus - 1)) + self.steps + 1

    def _draw(self, rng: random.Random) -> Problem:
        numbers = [rng.randrange(self.modulus) for _ in range(self.steps + 1)]
        ops = [rng.choice(self.ops) for _ in range(self.steps)]
        prompt = str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(ops, numbers[1:], strict=True)) + "="
        acc, chain = numbers[0], []
        for op, n in zip(ops, numbers[1:], strict=True):
            new = _APPLY[op](acc, n) % self.modulus
            chain.append(f"{acc}{op}{n}={new};")
            acc = new
        return Problem(prompt=prompt, answer=str(acc), solution="".join(chain) + f">{acc}")
