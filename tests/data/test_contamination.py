"""probepo.data.contamination: problem-text normalisation, the contamination check, and the MATH training
set (MATH test minus every evaluation problem: 4,497 problems on the shared files)."""

from __future__ import annotations

import json

import pytest

from probepo.data.benchmarks import (
    AVG6_BENCHMARKS,
    BENCHMARKS,
    SHIPPED_BENCHMARKS,
    BenchmarkProblem,
    benchmarks_root,
    load_benchmark,
)
from probepo.data.contamination import (
    REVIEWED_RESTATEMENTS,
    ContaminationError,
    check_contamination,
    math_training_set,
    normalise_problem_text,
)

SHARED = benchmarks_root()
needs_shared = pytest.mark.skipif(
    not all((SHARED / BENCHMARKS[name].folder / "test.jsonl").is_file() for name in SHIPPED_BENCHMARKS),
    reason=f"the shared benchmark files are not at {SHARED} (set PROBEPO_BENCHMARKS to where they are)",
)


def _problem(problem_id: str, text: str) -> BenchmarkProblem:
    return BenchmarkProblem(id=problem_id, benchmark=problem_id.split("/")[0], problem=text, golds=("1",))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is $x^2 + 1$?", "what  is\nx^{2}+1?"),
        ("Find $\\left( 3, \\frac{\\pi}{2} \\right)$.", "Find \\((3,\\,\\dfrac{\\pi}{2})\\)."),
        ("Let $a_1,$ $a_2,$ $\\dots$ be", "Let $a_{1}, a_{2}, \\ldots$ be"),
        ("Compute\n\\[\\cos^3 \\frac{2 \\pi}{7}.\\]", "Compute $\\cos ^{3} \\frac{2 \\pi}{7}$."),
        ("$x\\quad y\\hspace{1em}z~w$", "xyzw"),
        ("ÉTÉ ﬁle", "été file"),  # Unicode NFKC and case folding
    ],
)
def test_texts_that_differ_only_in_typesetting_normalise_equal(a, b):
    assert normalise_problem_text(a) == normalise_problem_text(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("costs \\$5", "costs 5"),  # an escaped dollar is content, not a delimiter
        ("the set \\{1, 2\\}", "the set 1, 2"),
        ("$2x + 1$", "$2x - 1$"),
    ],
)
def test_texts_that_differ_in_content_stay_apart(a, b):
    assert normalise_problem_text(a) != normalise_problem_text(b)


def test_check_contamination_fires_on_a_planted_duplicate():
    evaluation = {"amc23": [_problem("amc23/7", "What is $1 + 1$?"), _problem("amc23/8", "What is 2 + 2?")]}
    train = [_problem("train/0", "Name a prime."), _problem("train/1", "  WHAT is\n$1+1$?"),
             _problem("train/2", "what is $2+2$?")]  # fmt: skip
    with pytest.raises(ContaminationError, match=r"2 training problems .*\(2 in amc23\)") as caught:
        check_contamination(train, evaluation)
    assert "e.g. train/1 = amc23 amc23/7; train/2 = amc23 amc23/8" in str(caught.value)
    assert caught.value.matches == [("train/1", "amc23", "amc23/7"), ("train/2", "amc23", "amc23/8")]
    check_contamination(train[:1], evaluation)  # a clean training set passes


@needs_shared
def test_math_test_contains_all_of_math500():
    with pytest.raises(ContaminationError, match=r"^500 training problems .*\(500 in math500\)"):
        check_contamination(load_benchmark("math_test"), {"math500": load_benchmark("math500")})


@needs_shared
def test_the_math_training_set_has_4497_problems_and_no_evaluation_problem():
    train = math_training_set()
    # 5,000 - 500 (MATH-500) - 2 (in OlympiadBench too, typeset differently) - 1 (a MATH-500 problem reworded)
    assert len(train) == 4497
    ids = {problem.id for problem in train}
    assert not ids & {"math_test/2680", "math_test/4640", *REVIEWED_RESTATEMENTS}
    assert all(len(problem.golds) == 1 and problem.golds[0] for problem in train)
    check_contamination(train, {name: load_benchmark(name) for name in (*AVG6_BENCHMARKS, "gsm8k_test")})


@needs_shared
def test_a_staged_math_train_split_joins_without_its_evaluation_problems(tmp_path):
    for name in SHIPPED_BENCHMARKS:
        (tmp_path / name).symlink_to(SHARED / name)
    math500 = load_benchmark("math500")[0]
    rows = [
        {"problem": "What is $3 + 4$?", "solution": "So \\boxed{7}.", "level": "Level 1", "type": "Algebra"},
        {"problem": math500.problem, "solution": "So \\boxed{0}.", "level": "Level 2", "type": "Algebra"},
    ]  # the second is planted: a MATH-500 problem
    (tmp_path / "math_train").mkdir()
    (tmp_path / "math_train" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert [p.id for p in math_training_set(tmp_path, ("math_train",))] == ["math_train/0"]
    both = math_training_set(tmp_path, ("math_test", "math_train"))
    assert len(both) == 4497 + 1 and both[-1].golds == ("7",)
    with pytest.raises(ValueError, match="choose one or more of math_test, math_train"):
        math_training_set(tmp_path, ("gsm8k_test",))
