"""The interface every verifiable task implements, so testbeds plug into the same pipeline.

A task owns its problems (a pure function of task seed, split and index), its tokenizer, its verifier,
its step boundaries (pivot candidates) and its cutoff-rescue suffix.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

SPLITS = ("train", "eval")
RL_STREAM = "rl"
"""The prompt batches of RL updates: batch k is update k's prompts."""
WARMUP_STREAM = "warmup"
"""The supervised warm-up's batches: batch k is its step k's worked solutions."""
WARMUP_CHECK_STREAM = "warmup-check"
"""The fixed train problems on which the warm-up measures accuracy."""
_EVAL_PERMILLE = 100  # share of the problem space reserved for the eval split (hash buckets of 1000)


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt text, the gold answer, and a worked solution (the ideal response text,
    without the stop token)."""

    prompt: str
    answer: str
    solution: str


def golds_of(problem: Problem) -> tuple[str, ...]:
    """Every accepted answer of a problem (`golds` where a task gives several, else its one answer)."""
    return tuple(getattr(problem, "golds", ())) or (problem.answer,)


class Tokenizer(Protocol):
    """What the pipeline needs of a tokenizer. `decode` renders special tokens as text, so the verifier
    sees whether the stop token was emitted."""

    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_texts(self, ids: list[int]) -> list[str]: ...


class Task(ABC):
    """A verifiable task. Subclasses draw a problem from a seeded `random.Random` (`_draw`); this base
    makes the draw deterministic and keeps the splits disjoint: a problem belongs to the split its prompt
    hashes to, and a draw landing in the other split is redrawn."""

    tokenizer: Tokenizer
    rescue_suffix: str
    """Appended to a probe continuation cut off at its token limit before a greedy rescue."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @abstractmethod
    def _draw(self, rng: random.Random) -> Problem:
        """A random problem (any split)."""

    @abstractmethod
    def verify(self, completion: str, problem: Problem) -> float:
        """1.0 if `completion` (the decoded response, stop token included) answers `problem`, else 0.0."""

    def grade_many(self, completions: list[str], problems: list[Problem]) -> list[str]:
        """Each (completion, problem) pair's grading outcome, in order: "correct", or why not ("wrong" here;
        a maths task tells no_answer, unparsable, wrong and timeout apart). A task whose verifier costs per
        call (grading in worker processes) overrides it, so a stage grades all its completions at once."""
        return [
            "correct" if self.verify(c, p) else "wrong" for c, p in zip(completions, problems, strict=True)
        ]

    def verify_many(self, completions: list[str], problems: list[Problem]) -> list[float]:
        """The reward of each (completion, problem) pair: 1.0 where `grade_many` says correct, else 0.0."""
        return [float(outcome == "correct") for outcome in self.grade_many(completions, problems)]

    @abstractmethod
    def longest_prompt(self) -> int:
        """The most tokens `prompt_ids` can return for any problem of the task (BOS included)."""

    @abstractmethod
    def step_end(self, token_ids: list[int]) -> list[bool]:
        """Per token: does it end a reasoning step? (A pivot at t needs token t − 1 to end a step.)"""

    def problem(self, index: int, split: str) -> Problem:
        """Problem `index` of `split` ("train" or "eval"): a pure function of (task seed, split, index)."""
        if split not in SPLITS:
            raise ValueError(f"split = {split!r}: expected one of {SPLITS}")
        if index < 0:
            raise ValueError(f"index = {index}: must be >= 0")
        for attempt in range(10_000):
            problem = self._draw(random.Random(f"{self.seed}/{split}/{index}/{attempt}"))
            if split_of(problem.prompt) == split:
                return problem
        raise RuntimeError(f"no {split} problem found for index {index}: the problem space is too small")

    def split_size(self, split: str) -> int | None:
        """How many distinct problems `split` holds; None: unbounded (a generated task draws without end)."""
        return None

    def batch(self, stream: str, seed: int, index: int, size: int, split: str = "train") -> list[Problem]:
        """Batch `index` of a named stream: `size` problems drawn deterministically (with replacement) from
        the split. Streams are independent draws, so the RL prompts of a run (`RL_STREAM`) never replay the
        warm-up's batches (`WARMUP_STREAM`) even when the two seeds are equal."""
        rng = random.Random(f"batch/{stream}/{seed}/{index}")
        return [self.problem(rng.randrange(2**40), split) for _ in range(size)]

    def prompt_ids(self, problem: Problem) -> list[int]:
        """Token ids fed to the model: BOS, then the prompt."""
        return [self.tokenizer.bos_id, *self.tokenizer.encode(problem.prompt)]

    def solution_ids(self, problem: Problem) -> list[int]:
        """Token ids of the worked solution as the model should emit it: the solution, then EOS."""
        return [*self.tokenizer.encode(problem.solution), self.tokenizer.eos_id]


def split_of(prompt: str) -> str:
    """The split a prompt belongs to (a fixed hash partition of the problem space)."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 1000
    return "eval" if bucket < _EVAL_PERMILLE else "train"
