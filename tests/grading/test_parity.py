"""The answer formats of docs/GRADING.md's parity table, graded by probepo.grading.judge (one batch for all),
and
the rules behind them: the math of a gold or a box (`math_of`), and the loader's report of golds whose
math delimiter never closes."""

from __future__ import annotations

import json
import logging

import pytest

from probepo.data.benchmarks import load_benchmark
from probepo.grading.judge import grade_with_reasons, math_of, unclosed_delimiter
from tests.grading.test_grading import BENCHMARKS

PROSE = "$R=0$, converges only when $x=2$"
LINE = "$(-3 t+4,-6 t-6,2, t)$ for all real numbers $t$"
UNCLOSED = "$-317^{\\circ} 3^{\\prime} 36^{\\prime \\prime} \\quad"  # CollegeMath row 1102


def boxed(answer: str) -> str:
    return f"So the final answer is $\\boxed{{{answer}}}$."


# (table row, completion, gold, reason for ours): the rows of docs/GRADING.md, in its order.
CASES = [
    ("decimal percent", boxed("4.2\\%"), "4.2", "correct"),
    ("decimal percent 12.5", boxed("12.5\\%"), "12.5", "correct"),
    ("integer percent", boxed("12\\%"), "12", "correct"),
    ("percent gold, number answer", boxed("4.2"), "4.2\\%", "correct"),
    ("percent gold, fraction answer", boxed("0.042"), "4.2\\%", "correct"),
    ("percent answer, fraction gold", boxed("4.2\\%"), "0.042", "correct"),
    ("fraction answer, number gold", boxed("0.042"), "4.2", "wrong"),
    ("answer 100x the gold", boxed("420"), "4.2", "wrong"),
    ("degrees answer", boxed("30^\\circ"), "30", "correct"),
    ("degrees gold", boxed("30"), "30^\\circ", "correct"),
    ("radians for degrees", boxed("\\frac{\\pi}{6}"), "30^\\circ", "wrong"),
    ("unit in answer", boxed("5 \\text{ cm}"), "5", "correct"),
    ("unit in gold", boxed("5"), "5 \\text{ cm}", "correct"),
    ("mathrm unit", boxed("5\\,\\mathrm{cm}"), "5", "correct"),
    ("dollar sign", boxed("\\$18.90"), "18.90", "correct"),
    ("same \\text", boxed("\\text{Evelyn}"), "\\text{Evelyn}", "correct"),
    ("bare word for \\text gold", boxed("Evelyn"), "\\text{Evelyn}", "correct"),
    ("choice letter", boxed("\\text{(C)}"), "\\text{(C)}", "correct"),
    ("choice letter vs bare", boxed("C"), "\\text{(C)}", "correct"),
    ("words gold, \\text answer", boxed("\\text{all real numbers}"), "all real numbers", "correct"),
    ("words gold, other case", boxed("\\text{No Solution}"), "no solution", "correct"),
    ("bare words for words gold", boxed("not a function"), "Not a function", "correct"),
    ("separator in answer", boxed("1,000"), "1000", "correct"),
    ("separator in gold", boxed("1000"), "1,000", "correct"),
    ("braced separator", boxed("1{,}000"), "1000", "correct"),
    ("millions", boxed("12,345,678"), "12345678", "correct"),
    ("same set", boxed("2, 3"), "2, 3", "correct"),
    ("other order", boxed("3, 2"), "2, 3", "correct"),
    ("one of two", boxed("2"), "2, 3", "wrong"),
    ("\\text{ and }", boxed("2 \\text{ and } 3"), "2, 3", "correct"),
    ("two boxes, gold both", "x = \\boxed{2} or x = \\boxed{3}", "2, 3", "wrong"),
    ("two boxes, gold last", "first \\boxed{2}, finally \\boxed{3}", "3", "correct"),
    ("two boxes, gold first", "first \\boxed{2}, finally \\boxed{3}", "2", "wrong"),
    ("period in box", boxed("5."), "5", "correct"),
    ("period after equation", boxed("x = 5."), "5", "correct"),
    ("box split over two spans", boxed("x+$ $1"), "x+1", "correct"),
    ("last number", "so the answer is 5.", "5", "no_answer"),
    ("math span", "Final answer: $5$", "5", "no_answer"),
    ("box then 5,000 chars", boxed("5") + " Let me double-check." * 250, "5", "correct"),
    ("box of 5,000 chars", boxed("5" + "+0" * 2500), "5", "unparsable"),
    ("truncated last box", "\\boxed{5} hmm, actually \\boxed{6", "5", "no_answer"),
    ("prose gold boxed whole", boxed(PROSE), PROSE, "correct"),
    ("both parts", boxed("R=0, x=2"), PROSE, "correct"),
    ("last span only", boxed("x=2"), PROSE, "wrong"),
    ("parameter only", boxed("t"), LINE, "wrong"),
    ("the line", boxed("(-3t+4, -6t-6, 2, t)"), LINE, "wrong"),
    ("unclosed $ gold boxed whole", boxed(UNCLOSED), UNCLOSED, "correct"),
    (
        "unclosed $ gold, its math",
        boxed("-317^{\\circ} 3^{\\prime} 36^{\\prime\\prime}"),
        UNCLOSED,
        "correct",
    ),
]


@pytest.fixture(scope="module")
def graded() -> dict[str, str]:
    """Every case graded in one call (the workers start once)."""
    reasons = grade_with_reasons([c for _, c, _, _ in CASES], [g for _, _, g, _ in CASES], timeout_s=10.0)
    return {row: reason for (row, _, _, _), reason in zip(CASES, reasons, strict=True)}


@pytest.mark.parametrize(("row", "completion", "gold", "reason"), CASES, ids=[row for row, *_ in CASES])
def test_parity_table_row(row, completion, gold, reason, graded):
    assert graded[row] == reason


def test_cases_are_the_rows_of_the_table():
    assert len({row for row, *_ in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("text", "math"),
    [
        ("4", "4"),
        ("$x=-\\frac{3}{10}$", "x=-\\frac{3}{10}"),
        (PROSE, "R=0, x=2"),  # every span, words dropped
        ("Solution is: $[x=-1, y=2, z=-1]$.", "[x=-1, y=2, z=-1]"),
        ("$$\nX=1\n$$ and \\(y\\) or \\[z\\]", "X=1, y, z"),
        ("$a$$b$", "a, b"),
        ("\\$5 and \\$6", "\\$5 and \\$6"),  # escaped dollars are not delimiters
        ("$a \\\\$ b", "a \\\\"),  # a TeX line break before the closing $
        (UNCLOSED, "-317^{\\circ} 3^{\\prime} 36^{\\prime \\prime} \\quad"),  # whole, delimiter dropped
        ("x_0 \\cos t+$ $\\dot{x}_0 \\sin t", "x_0 \\cos t+ \\dot{x}_0 \\sin t"),  # MinervaMath row 72
        ("x\n\n+ 1", "x + 1"),
        ("5.", "5"),
        ("\\left\\{ x \\right.", "\\left\\{ x \\right."),  # an invisible delimiter, not a full stop
        ("1, 2, \\ldots", "1, 2, \\ldots"),
        ("No solution.", "\\text{no solution}"),
        ("\\text {Converges conditionally}", "\\text{converges conditionally}"),
        ("x y", "x y"),  # one-letter words: a product
        ("abc - d", "abc - d"),
        ("diverges", "diverges"),  # one word: math-verify already matches it with \text{diverges}
        ("$ $", ""),
    ],
)
def test_math_of(text, math):
    assert math_of(text) == math


def test_unclosed_delimiter():
    assert unclosed_delimiter(UNCLOSED) == "$"
    assert unclosed_delimiter("so \\(x") == "\\("
    assert unclosed_delimiter(PROSE) is None
    assert unclosed_delimiter("costs \\$5") is None


def _college_math_row(answer: str) -> str:
    return json.dumps(
        {"question": "q", "answer": answer, "data_topic": "t", "data_source": "s", "license": "l"}
    )


def test_loader_reports_golds_whose_delimiter_never_closes(tmp_path, caplog):
    path = tmp_path / "college_math" / "test.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(_college_math_row(a) for a in ["$1$", UNCLOSED, "2", "Yes, since $v=0"]) + "\n")
    with caplog.at_level(logging.WARNING, logger="probepo.data.benchmarks"):
        problems = load_benchmark("college_math", tmp_path)
    assert len(problems) == 4  # kept: graded as their whole text, like Qwen2.5-Math's reader
    (record,) = caplog.records
    assert str(path) in record.message
    assert "2 gold answer(s)" in record.message
    assert "line 2 (row 1)" in record.message and "line 4 (row 3)" in record.message


def test_loader_is_quiet_on_well_formed_golds(tmp_path, caplog):
    path = tmp_path / "college_math" / "test.jsonl"
    path.parent.mkdir()
    path.write_text(_college_math_row(PROSE) + "\n")
    with caplog.at_level(logging.WARNING, logger="probepo.data.benchmarks"):
        load_benchmark("college_math", tmp_path)
    assert caplog.records == []


def test_shared_college_math_row_1102_is_reported(caplog):
    if not (BENCHMARKS / "college_math" / "test.jsonl").exists():
        pytest.skip(f"CollegeMath not found under {BENCHMARKS} (the shared benchmarks folder is missing)")
    with caplog.at_level(logging.WARNING, logger="probepo.data.benchmarks"):
        load_benchmark("college_math", BENCHMARKS)
    (record,) = caplog.records
    assert "line 1103 (row 1102)" in record.message
