"""Maths problems for real language models behind the Task interface: prompt templates per model family,
tokenizer-aware step boundaries, and boxed-answer rewards graded in worker processes (probepo.grading.judge).

Where problems come from is probepo.data.math_sources (benchmark files, reasoning-gym generators); a task
holds a fixed list of problems per split.

What `prompt_ids` starts with: for the template families (`deepseek-math`, `r1-distill`, `qwen3-base`)
the tokenizer's BOS when it has one (DeepSeek, R1-Distill: `<｜begin▁of▁sentence｜>`), else nothing: Qwen
tokenizers have no BOS, and the prompt starts with the template's first token, as Hugging Face and vLLM
feed Qwen models. For `chat` the tokenizer's own `apply_chat_template` decides (it writes BOS into the text
where the model wants one) and nothing is added.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal, get_args

from probepo.algo.pivots import step_end_from_text
from probepo.config.run import MATH_INSTRUCTION
from probepo.data.hf_tokenizer import HFTokenizer
from probepo.data.task import SPLITS, Problem, Task, golds_of
from probepo.grading.judge import Reason, grade_with_reasons

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Family = Literal["deepseek-math", "r1-distill", "qwen3-base", "chat"]
FAMILIES: tuple[Family, ...] = get_args(Family)

INSTRUCTION = MATH_INSTRUCTION
"""The instruction of DeepSeekMath's and DeepSeek-R1's model cards; every template asks it."""

RESCUE_SUFFIX = "\n\nFinal answer: \\boxed{"
"""Cutoff rescue (ALGORITHM.md §3): a probe cut off at its limit is asked for its boxed answer."""


@dataclass(frozen=True)
class MathProblem(Problem):
    """A maths problem: `prompt` is the problem statement (the template is applied by `prompt_ids`),
    `answer` the first of `golds`, the accepted gold answers as LaTeX; `solution` may be empty."""

    id: str = ""
    golds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.golds:
            object.__setattr__(self, "golds", (self.answer,))
        elif self.answer != self.golds[0]:
            raise ValueError(f"{self.id}: answer {self.answer!r} is not the first gold {self.golds[0]!r}")


def render_prompt(
    family: Family, problem: str, tokenizer: PreTrainedTokenizerBase, instruction: str = INSTRUCTION
) -> str:
    """The prompt text of `problem` for a model family (without BOS, which `MathTask.prompt_ids` adds),
    INSTRUCTION standing for `instruction`:

    - deepseek-math: `User: {problem}\\n{INSTRUCTION}\\n\\nAssistant:` (DeepSeekMath's chat format).
    - r1-distill: `<｜User｜>{problem}\\n{INSTRUCTION}<｜Assistant｜><think>\\n` (R1-Distill's chat format,
      the thinking section opened as DeepSeek recommends).
    - qwen3-base: `Question: {problem}\\n{INSTRUCTION}\\nAnswer:` (a plain completion prompt).
    - chat: the tokenizer's `apply_chat_template` of one user turn `{problem}\\n{INSTRUCTION}`, with the
      assistant's turn opened.
    """
    question = f"{problem}\n{instruction}"
    if family == "deepseek-math":
        return f"User: {question}\n\nAssistant:"
    if family == "r1-distill":
        return f"<｜User｜>{question}<｜Assistant｜><think>\n"
    if family == "qwen3-base":
        return f"Question: {question}\nAnswer:"
    if family == "chat":
        if not tokenizer.chat_template:
            raise ValueError(f"{type(tokenizer).__name__} has no chat template: use a template family")
        messages = [{"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    raise ValueError(f"family = {family!r}: expected one of {FAMILIES}")


class MathTask(Task):
    """Maths problems for a Hugging Face tokenizer and model family.

    `problems` maps each split ("train", "eval") to its problems, in file order: problem i of the eval split
    is row i of its set, and the held-out suite takes rows 0..n-1 of it, each once (`split_size` bounds n).
    `problem(index, split)` takes the index modulo the split's size, which only `Task.batch`'s draws over
    2**40 indices rely on; the seed only names the task. Rewards: 1.0 iff the last `\\boxed{}` of the
    completion matches one of the golds (probepo.grading.judge, `timeout_s` per answer).
    `instruction` follows the problem in every template; it must ask for a boxed answer.
    """

    rescue_suffix = RESCUE_SUFFIX

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        family: Family,
        problems: Mapping[str, Sequence[MathProblem]],
        *,
        seed: int = 0,
        instruction: str = INSTRUCTION,
        timeout_s: float = 3.0,
    ) -> None:
        super().__init__(seed)
        if "\\boxed" not in instruction:
            raise ValueError(
                f"instruction = {instruction!r}: must ask for a \\boxed{{}} answer (only boxes score)"
            )
        if family not in FAMILIES:
            raise ValueError(f"family = {family!r}: expected one of {FAMILIES}")
        if set(problems) != set(SPLITS) or not all(problems.values()):
            sizes = {split: len(rows) for split, rows in problems.items()}
            raise ValueError(f"problems needs non-empty splits {SPLITS}, got {sizes}")
        self.tokenizer = HFTokenizer(tokenizer)
        self.family = family
        self.problems = {split: list(rows) for split, rows in problems.items()}
        self.instruction = instruction
        self.timeout_s = timeout_s

    def _draw(self, rng: random.Random) -> Problem:
        raise TypeError("MathTask reads its problems from fixed lists (see problem()); it draws none")

    def problem(self, index: int, split: str) -> MathProblem:
        """Problem `index` of `split`, modulo the split's size."""
        if split not in SPLITS:
            raise ValueError(f"split = {split!r}: expected one of {SPLITS}")
        if index < 0:
            raise ValueError(f"index = {index}: must be >= 0")
        rows = self.problems[split]
        return rows[index % len(rows)]

    def split_size(self, split: str) -> int:
        return len(self.problems[split])

    def prompt_ids(self, problem: Problem) -> list[int]:
        """The rendered template's ids, after BOS where the module docstring says."""
        text = render_prompt(self.family, problem.prompt, self.tokenizer.hf, self.instruction)
        bos = [self.tokenizer.bos_id] if self.tokenizer.has_bos and self.family != "chat" else []
        return bos + self.tokenizer.encode(text)

    @cached_property
    def _longest_prompt(self) -> int:
        return max(len(self.prompt_ids(p)) for rows in self.problems.values() for p in rows)

    def longest_prompt(self) -> int:
        """The most prompt tokens of any problem of either split (counted once, then cached)."""
        return self._longest_prompt

    def step_end(self, token_ids: list[int]) -> list[bool]:
        """Token t ends a step if its decoded text contains a newline, or ends a sentence: after trailing
        whitespace, closing quotes, brackets and `*`, it ends in `.`, `!` or `?`, and it is not a decimal
        point (a `.` directly followed by a token that starts with a digit). Byte-level BPE merges
        punctuation with what follows (`.\\n\\n`, `?\\n`, `.)`, `. `), so the test is on each token's text,
        not on single characters (probepo.algo.pivots.step_end_from_text)."""
        return step_end_from_text([self.tokenizer.token_texts(token_ids)])[0].tolist()

    def grade_many(self, completions: list[str], problems: list[Problem]) -> list[Reason]:
        """The grading `Reason` of each completion (one grading call for all): "correct" if its boxed answer
        matches any gold, else the reason it failed against the first gold."""
        if len(completions) != len(problems):
            raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
        flat_completions, flat_golds, owners = [], [], []
        for index, (completion, problem) in enumerate(zip(completions, problems, strict=True)):
            golds = golds_of(problem)
            flat_completions += [completion] * len(golds)
            flat_golds += golds
            owners += [index] * len(golds)
        reasons: list[Reason | None] = [None] * len(completions)
        graded = grade_with_reasons(flat_completions, flat_golds, timeout_s=self.timeout_s)
        for index, reason in zip(owners, graded, strict=True):
            if reasons[index] is None or reason == "correct":
                reasons[index] = reason
        return reasons

    def verify(self, completion: str, problem: Problem) -> float:
        """1.0 if the completion's last boxed answer matches one of the problem's golds, else 0.0."""
        return self.verify_many([completion], [problem])[0]
