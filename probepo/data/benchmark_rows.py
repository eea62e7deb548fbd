"""How each benchmark file's rows become `BenchmarkProblem`s: ids, problem text, gold answers, solutions.

Each reader knows one file's fields (`/work/shared/benchmarks/README.md`) and writes the gold answers as
LaTeX that `probepo.grading.judge.grade` accepts. A row missing a usable field raises `BenchmarkFormatError`
naming the file, the 1-based line and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from probepo.grading.judge import last_boxed


class BenchmarkFormatError(ValueError):
    """A benchmark file has a row this module cannot read (the message names file, line and field)."""


@dataclass(frozen=True)
class BenchmarkProblem:
    """One problem of a benchmark.

    `golds` are the accepted gold answers as LaTeX the grader takes; a completion is right if it matches any
    of them. On a `multiple_answer` row (OlympiadBench) each gold holds every part, comma-separated, and
    math-verify reads that as a set: all parts are needed, in any order, and no extra ones.
    """

    id: str
    """Stable id: MATH-500's `unique_id`, else `<set>/<the row's own id>` or `<set>/<0-based row index>`."""
    benchmark: str
    problem: str
    golds: tuple[str, ...]
    solution: str | None = None
    """The reference solution, where the set has one."""
    multiple_answer: bool = False
    meta: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Small descriptive fields where the set has them: subject, level, unit, answer_type, licence, url."""


@dataclass(frozen=True)
class Row:
    """One parsed line of a benchmark file, with what it takes to name it in an error."""

    path: Path
    line: int
    """1-based line number in the file."""
    index: int
    """0-based position among the file's rows (blank lines are not rows)."""
    data: Mapping[str, object]

    def error(self, name: str, problem: str) -> BenchmarkFormatError:
        """The error for field `name` of this row, e.g. "is missing"."""
        return BenchmarkFormatError(f"{self.path}, line {self.line}: field {name!r} {problem}")

    def value(self, name: str) -> object:
        """Field `name`, which must be present (it may be null)."""
        if name not in self.data:
            raise self.error(name, "is missing")
        return self.data[name]

    def text(self, name: str) -> str:
        """A non-empty string field."""
        value = self.value(name)
        if not isinstance(value, str):
            raise self.error(name, f"is {type(value).__name__}, expected a string")
        if not value.strip():
            raise self.error(name, "is empty")
        return value

    def key(self, name: str) -> str:
        """An id-like field written as a string or an integer."""
        value = self.value(name)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self.error(name, f"is {type(value).__name__}, expected a string or an integer")
        return str(value)

    def boxed(self, name: str) -> str:
        """The content of the last complete `\\boxed{}` of a string field (braces balanced)."""
        answer = last_boxed(self.text(name))
        if answer is None or not answer.strip():
            raise self.error(name, "has no complete, non-empty \\boxed{...} answer")
        return one_line(answer)


def one_line(answer: str) -> str:
    """A gold answer with each run of whitespace (newlines included) made one space. The grader hands answers
    to math-verify 0.9.0 as `$...$`, which it reads only within one line, so a gold with a line break in it
    matches nothing, not even itself; in LaTeX maths a newline is a space anyway."""
    return " ".join(answer.split())


def _number(row: Row, name: str) -> str:
    """A numeric answer as the grader should see it: 27.0 becomes "27", "025" becomes "25"."""
    value = row.value(name)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise row.error(name, f"is {type(value).__name__}, expected a number")
    try:
        number = float(value)
    except ValueError:
        raise row.error(name, f"is {value!r}, expected a number") from None
    if not math.isfinite(number):
        raise row.error(name, f"is {value!r}, expected a finite number")
    return str(int(number)) if number.is_integer() else str(value).strip()


def _level(value: object) -> str:
    """MATH levels appear as 3 (MATH-500) and as "Level 3" (MATH test); keep the digit."""
    return str(value).removeprefix("Level ").strip()


def read_math500(row: Row) -> BenchmarkProblem:
    """MATH-500: the id is `unique_id` (`test/<subject>/<n>.json`), the gold is `answer`."""
    return BenchmarkProblem(
        id=row.text("unique_id"),
        benchmark="math500",
        problem=row.text("problem"),
        golds=(one_line(row.text("answer")),),
        solution=row.text("solution"),
        meta={"subject": row.text("subject"), "level": _level(row.value("level"))},
    )


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def read_olympiadbench(row: Row) -> BenchmarkProblem:
    """OlympiadBench: every element of the `final_answer` list is an accepted gold; the reference solution is
    the first of the `solution` list; `is_multiple_answer` rows need every part of the gold."""
    answers = row.value("final_answer")
    if not isinstance(answers, list) or not answers:
        raise row.error("final_answer", "is not a non-empty list")
    golds = []
    for answer in answers:
        if not isinstance(answer, str) or not answer.strip():
            raise row.error("final_answer", f"has an element {answer!r} that is not a non-empty string")
        # One bare expression, `$` delimiters dropped: multi-part answers are written as several math spans
        # ("$69$,$84$") and one is broken ("$221,$8$"); as "69,84" math-verify reads every part into one set.
        golds.append(one_line(_UNESCAPED_DOLLAR.sub("", answer)))
    multiple = row.value("is_multiple_answer")
    if not isinstance(multiple, bool):
        raise row.error("is_multiple_answer", f"is {multiple!r}, expected true or false")
    solutions = row.value("solution")
    if not isinstance(solutions, list) or not all(isinstance(s, str) for s in solutions):
        raise row.error("solution", "is not a list of strings")
    context = row.data.get("context")
    has_context = isinstance(context, str) and bool(context.strip())
    question = row.text("question")
    meta = {"subject": row.text("subfield"), "answer_type": row.text("answer_type")}
    unit = row.data.get("unit")
    if isinstance(unit, str) and unit.strip():
        meta["unit"] = unit.strip()
    return BenchmarkProblem(
        id=f"olympiadbench/{row.key('id')}",
        benchmark="olympiadbench",
        problem=f"{context.strip()}\n\n{question}" if has_context else question,
        golds=tuple(golds),
        solution=solutions[0] if solutions else None,
        multiple_answer=multiple,
        meta=meta,
    )


def read_college_math(row: Row) -> BenchmarkProblem:
    """CollegeMath: the gold is `answer`; each row's licence goes into meta (part of the set is NC)."""
    return BenchmarkProblem(
        id=f"college_math/{row.index}",  # question_number repeats across the source books
        benchmark="college_math",
        problem=row.text("question"),
        golds=(one_line(row.text("answer")),),
        meta={
            "subject": row.text("data_topic"),
            "source": row.text("data_source"),
            "licence": row.text("license"),
        },
    )


def read_competition(name: str) -> Callable[[Row], BenchmarkProblem]:
    """The reader of AMC23 or AIME24 (`name`): a numeric `answer`, a source `url`, AIME's worked solution."""

    def read(row: Row) -> BenchmarkProblem:
        solution = row.data.get("solution")
        return BenchmarkProblem(
            id=f"{name}/{row.key('id')}",
            benchmark=name,
            problem=row.text("problem"),
            golds=(_number(row, "answer"),),
            solution=solution if isinstance(solution, str) and solution.strip() else None,
            meta={"url": row.text("url")},
        )

    return read


def read_minerva_math(row: Row) -> BenchmarkProblem:
    """MinervaMath: the gold is the last `\\boxed{}` of `solution`."""
    return BenchmarkProblem(
        id=f"minerva_math/{row.key('idx')}",
        benchmark="minerva_math",
        problem=row.text("problem"),
        golds=(row.boxed("solution"),),
        solution=row.text("solution"),
        meta={"subject": row.text("type")},
    )


def _math_row(row: Row, benchmark: str, key: str) -> BenchmarkProblem:
    """A hendrycks MATH row: the gold is the last `\\boxed{}` of `solution`; `type` is the subject."""
    return BenchmarkProblem(
        id=f"{benchmark}/{key}",
        benchmark=benchmark,
        problem=row.text("problem"),
        golds=(row.boxed("solution"),),
        solution=row.text("solution"),
        meta={"subject": row.text("type"), "level": _level(row.text("level"))},
    )


def read_math_test(row: Row) -> BenchmarkProblem:
    """The full MATH test, named by its `idx` field."""
    return _math_row(row, "math_test", row.key("idx"))


def read_math_train(row: Row) -> BenchmarkProblem:
    """The MATH train split as the hendrycks release writes it (no id field): named by its position."""
    return _math_row(row, "math_train", str(row.index))


_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def read_gsm8k(row: Row) -> BenchmarkProblem:
    """GSM8K: the gold follows the last `####` of `answer` (thousands separators removed); the worked
    solution precedes it."""
    worked, marker, final = row.text("answer").rpartition("####")
    gold = one_line(_THOUSANDS_SEPARATOR.sub("", final))
    if not marker or not gold:
        raise row.error("answer", "has no final answer after '####'")
    return BenchmarkProblem(
        id=f"gsm8k_test/{row.key('idx')}",
        benchmark="gsm8k_test",
        problem=row.text("question"),
        golds=(gold,),
        solution=worked.strip() or None,
    )
