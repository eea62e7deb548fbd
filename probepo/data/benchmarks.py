"""The evaluation sets of the ProbePO study (and two extras), read from offline JSON Lines copies, graded, and
summarised as Mean@k and Avg-6.

Six sets make up Avg-6 (ALGORITHM.md §7): MATH-500, OlympiadBench, CollegeMath, AMC23, MinervaMath, AIME24.
GSM8K test and the full MATH test (the source of the MATH training problems: `probepo.data.contamination`)
are extras. The files live outside the repository (`shared/benchmarks/README.md` describes them); the
registry here knows each set's folder, public hub id, k of Mean@k and gold-answer rule, and
`probepo.data.benchmark_rows` turns rows into problems. Nothing here copies the data.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from probepo.data.benchmark_rows import (
    BenchmarkFormatError,
    BenchmarkProblem,
    Row,
    read_college_math,
    read_competition,
    read_gsm8k,
    read_math500,
    read_math_test,
    read_math_train,
    read_minerva_math,
    read_olympiadbench,
)
from probepo.grading.judge import grade, unclosed_delimiter
from probepo.report.stats import mean_and_stderr

__all__ = [
    "AVG6_BENCHMARKS",
    "BENCHMARKS",
    "BENCHMARKS_ENV",
    "BenchmarkFormatError",
    "BenchmarkProblem",
    "BenchmarkSpec",
    "HubSource",
    "avg6",
    "benchmarks_root",
    "grade_problem",
    "grade_problems",
    "load_benchmark",
    "mean_at_k",
]

BENCHMARKS_ENV = "PROBEPO_BENCHMARKS"
"""Environment variable naming the folder that holds `<folder>/test.jsonl` for every set."""

_DEFAULT_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubSource:
    """Where a set is published on the Hugging Face hub, for clusters that can reach it."""

    dataset: str
    split: str | None = None
    config: str | None = None

    def __str__(self) -> str:
        """E.g. `openai/gsm8k (config main, split test)`."""
        details = []
        if self.config:
            details.append(f"config {self.config}")
        if self.split:
            details.append(f"split {self.split}")
        return f"{self.dataset} ({', '.join(details)})" if details else self.dataset


@dataclass(frozen=True)
class BenchmarkSpec:
    """What the project knows about one set: where it lies, where it is published, how it is scored."""

    name: str
    """Registry key."""
    title: str
    folder: str
    """Folder under the benchmarks root that holds `file`."""
    rows: int
    """Rows of the published file (README table)."""
    mean_at_k: int | None
    """k of Mean@k in the study; None for the extras, which are not part of Avg-6."""
    hub: HubSource | None
    """None where the set has no canonical hub id."""
    origin: str
    """Where the offline copy was taken from (repository @ commit, path)."""
    gold_rule: str
    """How the gold answer is read, in words."""
    licence_note: str | None
    """What a report must say about the set's licence, where it must say something."""
    read_row: Callable[[Row], BenchmarkProblem] = field(repr=False)
    file: str = "test.jsonl"


_ZUBINGOU = "ZubinGou/math-evaluation-harness @ db77bc6"
_QWEN = "QwenLM/Qwen2.5-Math @ a45202b"
_MAA = "AIME and AMC problems are the MAA's, commonly redistributed for research."

BENCHMARKS: Mapping[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            name="math500",
            title="MATH-500",
            folder="math500",
            rows=500,
            mean_at_k=16,
            hub=HubSource("HuggingFaceH4/MATH-500", split="test"),
            origin=f"{_ZUBINGOU}, data/math_oai/test.jsonl",
            gold_rule="field `answer`",
            licence_note=None,
            read_row=read_math500,
        ),
        BenchmarkSpec(
            name="olympiadbench",
            title="OlympiadBench",
            folder="olympiadbench",
            rows=675,
            mean_at_k=16,
            hub=HubSource("Hothan/OlympiadBench", config="OE_TO_maths_en_COMP"),
            origin=f"{_QWEN}, evaluation/data/olympiadbench/test.jsonl",
            gold_rule="field `final_answer` (a list; any element), `$` dropped; "
            "`is_multiple_answer` rows need every part",
            licence_note=None,
            read_row=read_olympiadbench,
        ),
        BenchmarkSpec(
            name="college_math",
            title="CollegeMath",
            folder="college_math",
            rows=2818,
            mean_at_k=16,
            hub=None,
            origin=f"{_QWEN}, evaluation/data/college_math/test.jsonl",
            gold_rule="field `answer`",
            licence_note="CollegeMath rows carry a `license` each, and part of the set is CC BY-NC-SA "
            "(non-commercial): say so wherever results on it are published.",
            read_row=read_college_math,
        ),
        BenchmarkSpec(
            name="amc23",
            title="AMC23",
            folder="amc23",
            rows=40,
            mean_at_k=16,
            hub=HubSource("math-ai/amc23", split="test"),
            origin=f"{_QWEN}, evaluation/data/amc23/test.jsonl",
            gold_rule="field `answer` (a number; 27.0 read as 27)",
            licence_note=_MAA,
            read_row=read_competition("amc23"),
        ),
        BenchmarkSpec(
            name="minerva_math",
            title="MinervaMath",
            folder="minerva_math",
            rows=272,
            mean_at_k=16,
            hub=HubSource("math-ai/minervamath", split="test"),
            origin=f"{_QWEN}, evaluation/data/minerva_math/test.jsonl",
            gold_rule="last `\\boxed{}` of field `solution`",
            licence_note=None,
            read_row=read_minerva_math,
        ),
        BenchmarkSpec(
            name="aime24",
            title="AIME24",
            folder="aime24",
            rows=30,
            mean_at_k=32,
            hub=HubSource("HuggingFaceH4/aime_2024", split="train"),
            origin=f"{_QWEN}, evaluation/data/aime24/test.jsonl",
            gold_rule="field `answer` (an integer; 025 read as 25)",
            licence_note=_MAA,
            read_row=read_competition("aime24"),
        ),
        BenchmarkSpec(
            name="gsm8k_test",
            title="GSM8K test",
            folder="gsm8k_test",
            rows=1319,
            mean_at_k=None,
            hub=HubSource("openai/gsm8k", split="test", config="main"),
            origin=f"{_ZUBINGOU}, data/gsm8k/test.jsonl",
            gold_rule="text after `####` in field `answer`, thousands separators removed",
            licence_note=None,
            read_row=read_gsm8k,
        ),
        BenchmarkSpec(
            name="math_test",
            title="MATH test",
            folder="math_test",
            rows=5000,
            mean_at_k=None,
            hub=None,
            origin=f"{_ZUBINGOU}, data/math/test.jsonl (the hendrycks MATH test split)",
            gold_rule="last `\\boxed{}` of field `solution`",
            licence_note=None,
            read_row=read_math_test,
        ),
        BenchmarkSpec(
            name="math_train",
            title="MATH train",
            folder="math_train",
            rows=7500,
            mean_at_k=None,
            hub=None,
            origin="the hendrycks MATH train split, staged by the user (not shipped here)",
            gold_rule="last `\\boxed{}` of field `solution`",
            licence_note=None,
            read_row=read_math_train,
            file="train.jsonl",
        ),
    )
}
"""Every known set, by name."""

SHIPPED_BENCHMARKS: tuple[str, ...] = tuple(name for name in BENCHMARKS if name != "math_train")
"""The sets of the shared offline folder; the MATH train split is staged by users on their cluster."""

AVG6_BENCHMARKS: tuple[str, ...] = tuple(name for name, spec in BENCHMARKS.items() if spec.mean_at_k)
"""The six evaluation sets of the study, whose unweighted mean is Avg-6."""


def benchmarks_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the sets: `root` if given, else `$PROBEPO_BENCHMARKS`, else `../shared/benchmarks`
    next to the repository root."""
    if root is not None:
        return Path(root)
    from_env = os.environ.get(BENCHMARKS_ENV, "").strip()
    return Path(from_env) if from_env else _DEFAULT_ROOT


def load_benchmark(name: str, root: str | os.PathLike[str] | None = None) -> list[BenchmarkProblem]:
    """The problems of set `name` (a key of `BENCHMARKS`), in file order, from `<root>/<folder>/test.jsonl`
    (root as `benchmarks_root` resolves it). Blank lines are skipped.

    A gold answer with a math delimiter that never closes (CollegeMath line 1103: `$-317^{\\circ} ...`) is
    kept, and graded as its whole text with the delimiters dropped (`probepo.grading.judge.math_of`); a
    warning
    names the file and every such line, so that the reading is never silent.

    Raises:
        KeyError: an unknown name (the message lists the known ones).
        FileNotFoundError: no file; the message says how to point at the copies, or which hub id to use.
        BenchmarkFormatError: a row that is not a JSON object or lacks a usable field (file, line, field).
    """
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    path = benchmarks_root(root) / spec.folder / spec.file
    if not path.is_file():
        raise FileNotFoundError(_missing_file_message(spec, path, root))
    problems = []
    malformed = []
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise BenchmarkFormatError(f"{path}, line {line_number}: not valid JSON ({error})") from None
            if not isinstance(data, dict):
                raise BenchmarkFormatError(f"{path}, line {line_number}: not a JSON object")
            problem = spec.read_row(Row(path, line_number, len(problems), data))
            malformed += [
                f"line {line_number} (row {len(problems)}): {delimiter!r} in {gold[:50]!r}"
                for gold in problem.golds
                if (delimiter := unclosed_delimiter(gold))
            ]
            problems.append(problem)
    if malformed:
        log.warning(
            "%s: %d gold answer(s) with a math delimiter that never closes, graded as their whole text with "
            "the delimiters dropped (docs/GRADING.md): %s",
            path,
            len(malformed),
            "; ".join(malformed),
        )
    return problems


def _missing_file_message(spec: BenchmarkSpec, path: Path, root: str | os.PathLike[str] | None) -> str:
    if root is not None:
        source = "the root argument"
    elif os.environ.get(BENCHMARKS_ENV, "").strip():
        source = f"${BENCHMARKS_ENV}"
    else:
        source = "the default, ../shared/benchmarks next to the repository"
    hub = (
        f"on a cluster with hub access, {spec.title} is {spec.hub}"
        if spec.hub
        else f"{spec.title} has no canonical hub id (the offline copy is from {spec.origin})"
    )
    return (
        f"{spec.title}: {path} not found (root from {source}). Point at the folder that holds "
        f"{spec.folder}/{spec.file} with load_benchmark(..., root=DIR) or {BENCHMARKS_ENV}=DIR; {hub}."
    )


def grade_problems(
    completions: Sequence[Sequence[str]], problems: Sequence[BenchmarkProblem], *, timeout_s: float = 3.0
) -> list[list[float]]:
    """Score each problem's completions: 1.0 where the last `\\boxed{}` matches any of its golds, else 0.0.

    `completions[i]` are the samples for `problems[i]`; the result has the same shape and feeds `mean_at_k`.
    One `probepo.grading.judge.grade` call grades the whole batch (per-answer `timeout_s`). A multiple-answer
    problem needs all its parts in that one box: its gold lists them, and math-verify compares them as sets.
    """
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} lists of completions for {len(problems)} problems")
    flat_completions: list[str] = []
    flat_golds: list[str] = []
    owners: list[tuple[int, int]] = []
    for problem_index, (samples, problem) in enumerate(zip(completions, problems, strict=True)):
        if isinstance(samples, str):
            raise TypeError(f"completions[{problem_index}] is a str; expected a list of completions")
        for sample_index, completion in enumerate(samples):
            for gold in problem.golds:
                flat_completions.append(completion)
                flat_golds.append(gold)
                owners.append((problem_index, sample_index))
    rewards = grade(flat_completions, flat_golds, timeout_s=timeout_s)
    scores = [[0.0] * len(samples) for samples in completions]
    for (problem_index, sample_index), reward in zip(owners, rewards, strict=True):
        scores[problem_index][sample_index] = max(scores[problem_index][sample_index], reward)
    return scores


def grade_problem(
    completions: Sequence[str], problem: BenchmarkProblem, *, timeout_s: float = 3.0
) -> list[float]:
    """`grade_problems` for the completions of one problem."""
    if isinstance(completions, str):
        raise TypeError("completions is a str; expected a list of completions")
    return grade_problems([completions], [problem], timeout_s=timeout_s)[0]


def mean_at_k(correct: Sequence[Sequence[float]], *, k: int | None = None) -> tuple[float, float]:
    """Mean@k and its standard error over problems (ALGORITHM.md §7), on the scale of the scores.

    `correct[i][j]` is the score of sample j of problem i: each problem's samples are averaged, then the
    problems, and the standard error is that of the per-problem means. Every problem must have the same
    number of samples (and exactly `k`, when given).
    """
    if not correct:
        raise ValueError("mean_at_k of no problems")
    samples = len(correct[0])
    for index, scores in enumerate(correct):
        if len(scores) != samples:
            raise ValueError(
                f"ragged samples: problem 0 has {samples}, problem {index} has {len(scores)}; "
                "Mean@k needs the same k for every problem"
            )
    if samples == 0:
        raise ValueError("mean_at_k of problems with no samples")
    if k is not None and samples != k:
        raise ValueError(f"expected k = {k} samples per problem, got {samples}")
    return mean_and_stderr([sum(scores) / samples for scores in correct])


def avg6(results: Mapping[str, float]) -> float:
    """Avg-6: the unweighted mean of the scores of the six study benchmarks, keyed by registry name (other
    keys, such as gsm8k_test, are ignored)."""
    missing = [name for name in AVG6_BENCHMARKS if name not in results]
    if missing:
        raise ValueError(f"Avg-6 needs all of {', '.join(AVG6_BENCHMARKS)}; missing: {', '.join(missing)}")
    return sum(results[name] for name in AVG6_BENCHMARKS) / len(AVG6_BENCHMARKS)
