"""probepo.data.benchmarks: the registry, reading the shared benchmark files (row counts, golds of
hand-picked rows, error messages), grading against a problem's golds (multi-part answers need every part),
Mean@k and Avg-6."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from probepo.data.benchmarks import (
    AVG6_BENCHMARKS,
    BENCHMARKS,
    BENCHMARKS_ENV,
    SHIPPED_BENCHMARKS,
    BenchmarkFormatError,
    BenchmarkProblem,
    avg6,
    benchmarks_root,
    grade_problem,
    grade_problems,
    load_benchmark,
    mean_at_k,
)

SHARED = benchmarks_root()
needs_shared = pytest.mark.skipif(
    not all((SHARED / BENCHMARKS[name].folder / "test.jsonl").is_file() for name in SHIPPED_BENCHMARKS),
    reason=f"the shared benchmark files are not at {SHARED} (set {BENCHMARKS_ENV} to where they are)",
)


@pytest.fixture(scope="module")
def shared() -> dict[str, dict[str, BenchmarkProblem]]:
    """Every shared set, loaded once: set name -> problem id -> problem."""
    return {name: {p.id: p for p in load_benchmark(name)} for name in SHIPPED_BENCHMARKS}


# ---- registry ----


def test_registry_knows_the_study_sets_and_their_k():
    assert AVG6_BENCHMARKS == ("math500", "olympiadbench", "college_math", "amc23", "minerva_math", "aime24")
    assert {name: spec.mean_at_k for name, spec in BENCHMARKS.items()} == {
        "math500": 16, "olympiadbench": 16, "college_math": 16, "amc23": 16, "minerva_math": 16, "aime24": 32,
        "gsm8k_test": None, "math_test": None, "math_train": None,
    }  # fmt: skip
    assert str(BENCHMARKS["math500"].hub) == "HuggingFaceH4/MATH-500 (split test)"
    assert str(BENCHMARKS["aime24"].hub) == "HuggingFaceH4/aime_2024 (split train)"
    assert str(BENCHMARKS["gsm8k_test"].hub) == "openai/gsm8k (config main, split test)"
    assert str(BENCHMARKS["olympiadbench"].hub) == "Hothan/OlympiadBench (config OE_TO_maths_en_COMP)"
    assert BENCHMARKS["college_math"].hub is None
    assert "CC BY-NC-SA" in BENCHMARKS["college_math"].licence_note


# ---- the shared files ----


@needs_shared
@pytest.mark.parametrize("name", SHIPPED_BENCHMARKS)
def test_every_shared_file_loads_with_its_published_row_count(name, shared):
    problems = list(shared[name].values())
    assert len(problems) == BENCHMARKS[name].rows  # ids are unique too: `shared` is keyed by id
    assert all(p.benchmark == name and p.problem.strip() and p.golds and all(p.golds) for p in problems)


@needs_shared
@pytest.mark.parametrize(
    ("name", "problem_id", "golds"),
    [
        ("math500", "test/precalculus/807.json", ("\\left( 3, \\frac{\\pi}{2} \\right)",)),
        ("olympiadbench", "olympiadbench/1606", ("2",)),
        ("olympiadbench", "olympiadbench/1664", ("69,84",)),  # file: "$69$,$84$"
        ("olympiadbench", "olympiadbench/2349", ("221,8",)),  # file: "$221,$8$"
        ("olympiadbench", "olympiadbench/2334", ("\\frac{41}{12}",)),
        ("college_math", "college_math/0", ("$10-4 n$",)),
        ("college_math", "college_math/2136", (  # line breaks made spaces
            "$\\mathbf{w}(1)=(.5, .25, .25)$ $\\mathbf{w}(2)=(.4375, .1875, .375)$ "
            "$\\mathbf{w}(3)=(.40625, .203125, .390625)$",
        )),
        ("amc23", "amc23/0", ("27",)),  # file: 27.0
        ("amc23", "amc23/17", ("-1",)),
        ("aime24", "aime24/60", ("204",)),
        ("aime24", "aime24/67", ("25",)),  # file: "025"
        ("minerva_math", "minerva_math/0", ("1.6",)),
        ("minerva_math", "minerva_math/7", ("100",)),
        ("gsm8k_test", "gsm8k_test/0", ("18",)),
        ("gsm8k_test", "gsm8k_test/146", ("2125",)),  # file: "#### 2,125"
        ("gsm8k_test", "gsm8k_test/201", ("114200",)),
        ("math_test", "math_test/0", ("2",)),
        ("math_test", "math_test/15", ("\\frac{11}{2}",)),  # braces nested in the box
        ("math_test", "math_test/91", ("161",)),  # the last of two different boxes
    ],
)  # fmt: skip
def test_golds_of_hand_picked_rows(name, problem_id, golds, shared):
    assert shared[name][problem_id].golds == golds


@needs_shared
def test_problem_fields_of_hand_picked_rows(shared):
    first = shared["math500"]["test/precalculus/807.json"]
    assert first.problem.startswith("Convert the point $(0,3)$ in rectangular coordinates")
    assert first.solution.startswith("We have that $r = \\sqrt{0^2 + 3^2} = 3.$")
    assert first.meta == {"subject": "Precalculus", "level": "2"}
    assert shared["math_test"]["math_test/0"].meta == {"subject": "Algebra", "level": "3"}
    multi = shared["olympiadbench"]["olympiadbench/1760"]
    assert multi.multiple_answer and multi.meta["unit"] == "^{\\circ}"
    assert multi.golds == ("\\angle B E A_{1}=90,\\angle A E B_{1}=90",)
    assert not shared["olympiadbench"]["olympiadbench/1606"].multiple_answer
    assert sum(p.multiple_answer for p in shared["olympiadbench"].values()) == 94
    assert "NonCommercial" in shared["college_math"]["college_math/2509"].meta["licence"]
    assert shared["college_math"]["college_math/0"].solution is None
    gsm = shared["gsm8k_test"]["gsm8k_test/0"]
    assert gsm.solution.startswith("Janet sells 16 - 3 - 4") and "####" not in gsm.solution


# ---- errors ----


def _write_rows(root: Path, folder: str, lines: list[str]) -> Path:
    path = root / folder / "test.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


MATH500_ROW = {"problem": "1+1?", "solution": "$\\boxed{2}$", "answer": "2", "subject": "Algebra", "level": 1,
               "unique_id": "test/algebra/1.json"}  # fmt: skip


def test_a_row_missing_a_field_names_file_line_and_field(tmp_path):
    broken = {key: value for key, value in MATH500_ROW.items() if key != "answer"}
    path = _write_rows(tmp_path, "math500", [json.dumps(MATH500_ROW), "", json.dumps(broken)])
    with pytest.raises(BenchmarkFormatError, match=r"line 3: field 'answer' is missing") as caught:
        load_benchmark("math500", root=tmp_path)
    assert str(path) in str(caught.value)  # and the blank line 2 is skipped, not counted away


@pytest.mark.parametrize(
    ("folder", "row", "message"),
    [
        ("math500", "{not json", r"line 1: not valid JSON"),
        ("math500", "[1, 2]", r"line 1: not a JSON object"),
        ("math500", json.dumps({**MATH500_ROW, "answer": 2}), r"line 1: field 'answer' is int, expected"),
        ("olympiadbench", json.dumps({"final_answer": "2"}), r"line 1: field 'final_answer' is not a"),
        ("minerva_math", json.dumps({"problem": "p", "solution": "so 3", "type": "t", "idx": 0}),
         r"line 1: field 'solution' has no complete, non-empty \\boxed"),
        ("gsm8k_test", json.dumps({"question": "q", "answer": "it is 3", "idx": 0}),
         r"line 1: field 'answer' has no final answer after '####'"),
        ("amc23", json.dumps({"id": 0, "problem": "p", "answer": "many", "url": "u"}),
         r"line 1: field 'answer' is 'many', expected a number"),
    ],
)  # fmt: skip
def test_malformed_rows_are_reported(tmp_path, folder, row, message):
    path = _write_rows(tmp_path, folder, [row])
    with pytest.raises(BenchmarkFormatError, match=message) as caught:
        load_benchmark(folder, root=tmp_path)
    assert str(path) in str(caught.value)


def test_a_missing_file_says_how_to_point_at_it_and_names_the_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        load_benchmark("math500", root=tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "math500" / "test.jsonl") in message
    assert "root=" in message and BENCHMARKS_ENV in message
    assert "hub access" in message and "HuggingFaceH4/MATH-500 (split test)" in message
    with pytest.raises(FileNotFoundError, match="CollegeMath has no canonical hub id"):
        load_benchmark("college_math", root=tmp_path)


def test_the_environment_variable_points_at_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv(BENCHMARKS_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=rf"root from \${BENCHMARKS_ENV}"):
        load_benchmark("math500")
    _write_rows(tmp_path, "math500", [json.dumps(MATH500_ROW)])
    assert [p.id for p in load_benchmark("math500")] == ["test/algebra/1.json"]
    assert benchmarks_root() == tmp_path
    assert benchmarks_root(tmp_path / "elsewhere") == tmp_path / "elsewhere"  # the argument wins


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="math500, olympiadbench"):
        load_benchmark("MATH-500")


# ---- grading ----


def _problem(golds: tuple[str, ...], multiple: bool = False) -> BenchmarkProblem:
    return BenchmarkProblem(id="t/0", benchmark="t", problem="?", golds=golds, multiple_answer=multiple)


def test_any_accepted_gold_counts_and_only_boxed_answers_score():
    problem = _problem(("2", "7"))
    assert grade_problem(["\\boxed{7}", "so \\boxed{2}.", "\\boxed{5}", "7"], problem) == [1.0, 1.0, 0.0, 0.0]
    assert grade_problems([["\\boxed{7}"], []], [problem, _problem(("1",))]) == [[1.0], []]
    with pytest.raises(TypeError, match="is a str"):
        grade_problem("\\boxed{7}", problem)
    with pytest.raises(ValueError, match="2 lists of completions for 1 problems"):
        grade_problems([[], []], [problem])


@needs_shared
@pytest.mark.parametrize(
    ("problem_id", "right", "wrong"),
    [
        ("olympiadbench/1664", ["69, 84", "84, 69", "\\{69, 84\\}", "69 \\text{ and } 84"],
         ["69", "84", "69, 84, 1"]),
        ("olympiadbench/2349", ["221, 8", "8, 221"], ["221", "8"]),
        ("olympiadbench/1618", ["(1,8,19), (2,7,13), (4,5,7)", "(4,5,7), (1,8,19), (2,7,13)"],
         ["(1,8,19), (2,7,13)", "(1,8,19)"]),
        ("olympiadbench/1938", ["f(x)=-1, f(x)=x+1", "f(x)=x+1, f(x)=-1"], ["f(x)=x+1", "f(x)=-1"]),
    ],
)  # fmt: skip
def test_a_multiple_answer_row_needs_every_part(problem_id, right, wrong, shared):
    problem = shared["olympiadbench"][problem_id]
    assert problem.multiple_answer
    scores = grade_problem([f"The answer is $\\boxed{{{answer}}}$." for answer in right + wrong], problem)
    assert scores == [1.0] * len(right) + [0.0] * len(wrong)


@needs_shared
def test_parts_in_separate_boxes_do_not_count_since_only_the_last_box_is_read(shared):
    problem = shared["olympiadbench"]["olympiadbench/1664"]
    assert grade_problem(["\\boxed{69} and \\boxed{84}", "\\boxed{69, 84}"], problem) == [0.0, 1.0]


@needs_shared
@pytest.mark.parametrize("name", ["amc23", "aime24", "gsm8k_test"])
def test_every_gold_grades_as_correct_against_its_own_box(name, shared):
    problems = list(shared[name].values())
    scores = grade_problems([[f"The final answer is $\\boxed{{{p.golds[0]}}}$."] for p in problems], problems)
    assert [p.id for p, (score,) in zip(problems, scores, strict=True) if score != 1.0] == []
    if name != "gsm8k_test":  # and the grader is not accepting anything: off by one is wrong
        off_by_one = [[f"\\boxed{{{int(p.golds[0]) + 1}}}"] for p in problems]
        assert grade_problems(off_by_one, problems) == [[0.0]] * len(problems)


# ---- Mean@k and Avg-6 ----


def test_mean_at_k_averages_samples_then_problems_with_the_stderr_over_problems():
    mean, stderr = mean_at_k([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    # per problem 0.5, 1, 0 -> mean 0.5; sample sd 0.5 -> stderr 0.5 / sqrt(3)
    assert mean == pytest.approx(0.5)
    assert stderr == pytest.approx(0.5 / math.sqrt(3))
    assert mean_at_k([[1.0, 0.0]], k=2) == (0.5, 0.0)


def test_mean_at_k_refuses_ragged_or_empty_input():
    with pytest.raises(ValueError, match="ragged samples: problem 0 has 2, problem 1 has 3"):
        mean_at_k([[1, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="expected k = 16 samples per problem, got 2"):
        mean_at_k([[1, 0]], k=16)
    with pytest.raises(ValueError, match="no problems"):
        mean_at_k([])
    with pytest.raises(ValueError, match="no samples"):
        mean_at_k([[], []])


def test_avg6_is_the_unweighted_mean_of_the_six_and_names_missing_ones():
    results = {"math500": 0.6, "olympiadbench": 0.3, "college_math": 0.4, "amc23": 0.5, "minerva_math": 0.2,
               "aime24": 0.1, "gsm8k_test": 0.9}  # fmt: skip
    assert avg6(results) == pytest.approx(0.35)  # 2.1 / 6; gsm8k_test is not one of the six
    del results["amc23"], results["aime24"]
    with pytest.raises(ValueError, match="missing: amc23, aime24"):
        avg6(results)
