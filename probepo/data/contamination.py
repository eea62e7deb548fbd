"""Keeping evaluation problems out of training: problem-text normalisation, the contamination check, and the
MATH training set (the full MATH test minus everything that is, or restates, an evaluation problem).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from probepo.data.benchmarks import AVG6_BENCHMARKS, BenchmarkProblem, load_benchmark

__all__ = [
    "REVIEWED_RESTATEMENTS",
    "ContaminationError",
    "check_contamination",
    "math_training_set",
    "normalise_problem_text",
]

# A spacing command with its argument, another command, an escaped character, a brace, `$`, `~`, whitespace.
_TOKEN = re.compile(r"\\[hv]space\*?\{[^{}]*\}|\\[a-zA-Z]+|\\.|[{}$~]|\s+", re.DOTALL)
_SPACING = ("quad", "qquad", "enspace", "thinspace", "medspace", "thickspace", "negthinspace", "negmedspace",
            "negthickspace")  # fmt: skip
_SIZING = ("left", "right", "big", "bigl", "bigr", "Big", "Bigl", "Bigr", "bigg", "biggl", "biggr", "Bigg",
           "Biggl", "Biggr", "displaystyle", "textstyle")  # fmt: skip
_PRESENTATION_COMMANDS = frozenset(_SPACING + _SIZING)
_SYNONYMS = {
    "dfrac": "\\frac",
    "tfrac": "\\frac",
    "cfrac": "\\frac",
    **{dots: "..." for dots in ("dots", "ldots", "cdots", "dotsb", "dotsc", "dotsm")},
}
_DROPPED_ESCAPES = frozenset(("\\,", "\\;", "\\:", "\\!", "\\(", "\\)", "\\[", "\\]"))


def _normalise_token(match: re.Match[str]) -> str:
    token = match.group(0)
    if token.startswith("\\") and token[1:2].isalpha():
        name = token[1:]
        if name in _PRESENTATION_COMMANDS or name.startswith(("hspace", "vspace")):
            return ""
        return _SYNONYMS.get(name, token)
    if token in _DROPPED_ESCAPES or token[0] in "{}$~" or token.isspace() or token[1:].isspace():
        return ""
    return token  # an escaped character that is content: \$ \{ \} \\ \%


def normalise_problem_text(text: str) -> str:
    """The problem text reduced to what identifies the problem, so that copies typeset differently compare
    equal (e.g. `$\\cos^3 \\frac{2 \\pi}{7}$` and `\\[\\cos ^{3} \\frac{2\\pi}{7}\\]`).

    Unicode NFKC; all whitespace removed (not only collapsed: `x^2 + 1` is `x^2+1`); math delimiters
    (`$`, `\\(`, `\\)`, `\\[`, `\\]`), grouping braces (`a_{1}` is `a_1`; escaped `\\{`, `\\}` stay), `~` and
    the spacing and sizing commands (`\\,`, `\\;`, `\\quad`, `\\hspace{..}`, `\\left`, `\\right`, `\\big`,
    `\\displaystyle`, ...) dropped; `\\dfrac`/`\\tfrac`/`\\cfrac` read as `\\frac`, and `\\dots`/`\\ldots`/
    `\\cdots` as `...`; case folded. It errs towards calling problems equal, the safe side for a
    contamination check (on the shipped files it still matches MATH-500 to MATH test one to one).
    """
    return _TOKEN.sub(_normalise_token, unicodedata.normalize("NFKC", text)).casefold()


class ContaminationError(ValueError):
    """Training problems that are evaluation problems; `matches` holds (training id, set, evaluation id)."""

    def __init__(self, message: str, matches: list[tuple[str, str, str]]) -> None:
        super().__init__(message)
        self.matches = matches


def check_contamination(
    train: Iterable[BenchmarkProblem], evaluation_sets: Mapping[str, Iterable[BenchmarkProblem]]
) -> None:
    """Raise `ContaminationError` if any training problem's normalised text equals that of a problem in one
    of `evaluation_sets` (set name -> problems); the message counts them per set and names a few."""
    evaluation_index: dict[str, tuple[str, str]] = {}
    for set_name, problems in evaluation_sets.items():
        for problem in problems:
            evaluation_index.setdefault(normalise_problem_text(problem.problem), (set_name, problem.id))
    matches = [
        (problem.id, *evaluation_index[text])
        for problem in train
        if (text := normalise_problem_text(problem.problem)) in evaluation_index
    ]
    if matches:
        per_set = Counter(set_name for _, set_name, _ in matches)
        counts = ", ".join(f"{count} in {set_name}" for set_name, count in per_set.items())
        examples = "; ".join(f"{tid} = {name} {eid}" for tid, name, eid in matches[:3])
        raise ContaminationError(
            f"{len(matches)} training problems are evaluation problems ({counts}), e.g. {examples}", matches
        )


REVIEWED_RESTATEMENTS: Mapping[str, str] = {
    "math_test/652": "math500 test/intermediate_algebra/1566.json: the same question reworded (answer 2k)",
}
"""MATH test problems that restate an evaluation problem in other words, which no text normalisation
catches. Found by a near-duplicate search of the MATH test against the six evaluation sets (pairs sharing a
6-token run, difflib ratio > 0.4, golds that grade as equal: 169 pairs), read by hand. Besides this one and
the two OlympiadBench copies that normalisation catches, they are different problems: MATH's template
siblings (other numbers) or unrelated problems with the same answer. A search, so not a proof of absence."""


TRAINING_SOURCES: tuple[str, ...] = ("math_test", "math_train")
"""Sets a MATH training set may draw from."""


def math_training_set(
    root: str | os.PathLike[str] | None = None, sources: Sequence[str] = ("math_test",)
) -> list[BenchmarkProblem]:
    """The MATH training problems of `sources`, minus every problem whose normalised text is that of a
    problem in one of the six evaluation sets, minus `REVIEWED_RESTATEMENTS`.

    `math_test` (shipped) alone gives 5,000 − 500 (MATH-500) − 2 (in OlympiadBench too: math_test/2680,
    math_test/4640) − 1 (math_test/652) = 4,497 problems; with `math_train` (the 7,500-problem train split,
    staged by the user) it is the study's PRM800K-style repartition for DeepSeekMath and R1. Each problem
    keeps its gold from its solution's last box. The result is checked with `check_contamination` against
    the six sets before it is returned.
    """
    unknown = sorted(set(sources) - set(TRAINING_SOURCES))
    if unknown or not sources:
        choices = ", ".join(TRAINING_SOURCES)
        raise ValueError(f"training sources {list(sources)}: choose one or more of {choices}")
    evaluation_sets = {name: load_benchmark(name, root) for name in AVG6_BENCHMARKS}
    held_out = {normalise_problem_text(p.problem) for problems in evaluation_sets.values() for p in problems}
    train = [
        problem
        for source in sources
        for problem in load_benchmark(source, root)
        if normalise_problem_text(problem.problem) not in held_out and problem.id not in REVIEWED_RESTATEMENTS
    ]
    check_contamination(train, evaluation_sets)
    return train
