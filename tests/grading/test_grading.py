"""probepo.grading.judge.grade: boxed-only rewards, equivalence, input checks, and robustness to adversarial
completions (deadline, SIGKILL and replacement of stuck workers, memory cap, no torch in workers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from probepo.grading import judge as grading
from probepo.grading.judge import ANSWER_CAP_CHARS, grade, last_boxed

BENCHMARKS = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks"


def _worker_pids() -> list[int]:
    """Pids of the shared pool's workers, started if need be (between calls all workers are idle)."""
    grade(["\\boxed{1}"] * 4, ["1"] * 4)
    return [worker.proc.pid for worker in grading._shared_pool()._idle]


# ---- extraction (parent side, no workers) ----


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\fbox{7}", "7"),
        ("\\boxed {x}", "x"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the box
        ("\\boxed{\\text{a \\boxed{b}}}", "\\text{a \\boxed{b}}"),  # last outermost box
        ("\\boxed{}", ""),
        ("no box, 42", None),
        ("\\boxed{1} and finally \\boxed{2", None),  # truncated last box: not an earlier one
        ("\\boxedx{3}", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


# ---- rewards ----


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("10.0", "10"),
        ("10", "10.0"),
        ("(3, \\pi/2)", "(3,\\frac{\\pi}{2})"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("[1, 2)", "[1,2)"),
        ("(-\\infty, 3]", "(-\\infty,3]"),
        ("\\sqrt{18}", "3\\sqrt{2}"),
        ("x = 5", "5"),
        ("\\text{Evelyn}", "\\text{Evelyn}"),
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
    ],
)
def test_equivalent_boxed_answer_scores_one(answer, gold):
    assert grade([f"Reasoning... so the answer is $\\boxed{{{answer}}}$."], [gold]) == [1.0]


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("\\boxed{3}", "4"),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}"),
        ("\\boxed{(\\pi/2, 3)}", "(3,\\frac{\\pi}{2})"),
        ("\\boxed{[1, 2]}", "[1,2)"),
        ("The answer is 10.", "10"),  # the last number is right, but there is no box
        ("Answer: $10$", "10"),
        ("\\boxed{10} is wrong; final answer \\boxed{11}", "10"),  # the last box counts
        ("\\boxed{}", "10"),
        ("\\boxed{10}", ""),
        ("final: \\boxed{1", "1"),
    ],
)
def test_wrong_or_unboxed_answer_scores_zero(completion, gold):
    assert grade([completion], [gold]) == [0.0]


def test_the_last_box_counts_wherever_it_is_and_its_content_is_capped():
    after = " Let me double-check." * 5_000  # 100,000 characters after the box
    within_cap = "\\boxed{7" + " " * (ANSWER_CAP_CHARS - 1) + "}"  # exactly the cap
    over_cap = "\\boxed{7" + " " * ANSWER_CAP_CHARS + "}"
    completions = ["\\boxed{7}" + after, "\\boxed{7}" + after + "\\boxed{8}", within_cap, over_cap]
    assert grading.grade_with_reasons(completions, ["7"] * 4) == ["correct", "wrong", "correct", "unparsable"]


def test_nested_braces_in_box():
    completion = "\\boxed{\\frac{\\sqrt{\\frac{1}{4}}}{{1}}}"
    assert grade([completion, completion], ["\\frac{1}{2}", "\\frac{1}{3}"]) == [1.0, 0.0]


def test_batch_keeps_input_order():
    items = [(f"\\boxed{{{n}}}", str(n if n % 3 else n + 1), float(n % 3 != 0)) for n in range(60)]
    items += [(f"the answer is {n}", str(n), 0.0) for n in range(10)]
    items = items[::2] + items[1::2]
    completions, golds, expected = zip(*items, strict=True)
    assert grade(list(completions), list(golds)) == list(expected)


def test_empty_batch():
    assert grade([], []) == []


# ---- bad input ----


def test_length_mismatch_names_both_lengths():
    with pytest.raises(ValueError, match=r"3 items but golds has 2"):
        grade(["a", "b", "c"], ["1", "2"])


@pytest.mark.parametrize(
    ("completions", "golds", "message"),
    [
        (["\\boxed{1}", None], ["1", "2"], r"completions\[1\] is NoneType"),
        (["\\boxed{1}", "\\boxed{2}"], ["1", 2], r"golds\[1\] is int"),
    ],
)
def test_non_str_item_names_the_index(completions, golds, message):
    with pytest.raises(TypeError, match=message):
        grade(completions, golds)


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s"):
        grade(["\\boxed{1}"], ["1"], timeout_s=0)


# ---- robustness ----

ADVERSARIAL = {
    "tower of tens": "\\boxed{10^{10^{10^{10}}}}",
    "power tower of twos": "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "huge factorial": "\\boxed{(10^{6})!}",
    "50k nested braces": "\\boxed{" + "{" * 50_000 + "1" + "}" * 50_000 + "}",
    "1.5k nested braces": "\\boxed{" + "{" * 1_500 + "1" + "}" * 1_500 + "}",
    "nested square roots": "\\boxed{" + "\\sqrt{" * 400 + "2" + "}" * 400 + "}",
    "big integer power": "\\boxed{123456789^{123456789}}",
    "1 MB completion": "\\frac{1}{2}+" * 90_000 + "\\boxed{1}",
    "1 MB box (over the cap)": "\\boxed{" + "\\frac{1}{2}+" * 90_000 + "1}",
    "long sum under the cap": "\\boxed{" + "x^{2}+" * 600 + "1}",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_completion_finishes_within_deadline(name):
    timeout_s = 1.0
    start = time.monotonic()
    reward = grade([ADVERSARIAL[name]], ["1"], timeout_s=timeout_s)
    elapsed = time.monotonic() - start
    assert reward in ([0.0], [1.0])
    # Margin: unwinding, or SIGKILL and a replacement worker's start-up: ~0.7 s on 2 idle cores, up to
    # 1.8 s seen on a loaded machine. A grade that ignored its deadline takes far longer (or never ends).
    assert elapsed < timeout_s + 5.0, f"{name}: {elapsed:.2f} s"
    assert grade(["\\boxed{0.5}"], ["\\frac{1}{2}"]) == [1.0]


def test_stuck_workers_are_killed_at_the_deadline_and_replaced():
    pids = _worker_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # stuck where not even the worker's own timer can run
    start = time.monotonic()
    assert grade(["\\boxed{1}"] * len(pids), ["1"] * len(pids), timeout_s=0.5) == [0.0] * len(pids)
    # Generous: 4 replacement workers start on a loaded machine; without the deadline it blocks for good.
    assert time.monotonic() - start < 0.5 + 30.0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
    assert grade(["\\boxed{1}", "\\boxed{2}"], ["1", "2"]) == [1.0, 1.0]
    assert not set(_worker_pids()) & set(pids)


def test_worker_that_died_while_idle_is_replaced_without_losing_the_answer():
    _worker_pids()
    for worker in grading._shared_pool()._idle:
        os.kill(worker.proc.pid, signal.SIGKILL)  # e.g. the kernel's OOM killer
        worker.proc.wait(timeout=10)
    assert grade(["\\boxed{1}", "\\boxed{3}", "\\boxed{2}"], ["1", "2", "2"]) == [1.0, 0.0, 1.0]


def test_workers_are_capped_and_do_not_import_torch():
    for pid in _worker_pids():
        limits = Path(f"/proc/{pid}/limits").read_text()
        (cap,) = [line.split()[3] for line in limits.splitlines() if line.startswith("Max address space")]
        assert int(cap) == grading.MEMORY_CAP_BYTES
        assert "torch" not in Path(f"/proc/{pid}/maps").read_text()


def test_grade_from_worker_threads():
    batch = (["\\boxed{0.5}", "\\boxed{2}", "42"], ["\\frac{1}{2}", "3", "42"])
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(grade, *batch) for _ in range(3)]
        assert [f.result(timeout=60) for f in futures] == [[1.0, 0.0, 0.0]] * 3
    assert threading.current_thread() is threading.main_thread()


# ---- real gold answers ----


@pytest.mark.integration
def test_math500_golds_grade_themselves():
    path = BENCHMARKS / "math500" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"MATH-500 not found at {path} (the shared benchmarks folder is missing)")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    golds = [row["answer"] for row in rows[::5]]  # 100 rows, all subjects and levels
    rewards = grade([f"The final answer is $\\boxed{{{gold}}}$." for gold in golds], golds)
    failures = [gold for gold, reward in zip(golds, rewards, strict=True) if reward != 1.0]
    assert len(failures) <= 0.02 * len(golds), f"golds that do not grade as themselves: {failures}"


# ---- line breaks in answers, and the reasons of each score ----


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("\\boxed{x\n+1}", "x+1"),  # math-verify does not read a $...$ span across a line break
        ("\\boxed{\\frac{1}\n{2}}", "\\frac{1}{2}"),
        ("\\boxed{3}", "3\n"),
        ("\\boxed{\n\n  7 \n}", "7"),
    ],
)
def test_answer_with_line_breaks_scores_one(completion, gold):
    assert grade([completion], [gold]) == [1.0]


def test_grade_with_reasons_names_why_each_answer_scored():
    cases = {
        "the answer is 4": ("4", "no_answer"),
        "\\boxed{}": ("4", "no_answer"),
        "\\boxed{2+2}": ("4", "correct"),
        "\\boxed{5}": ("4", "wrong"),
        "\\boxed{\\frac{}}": ("4", "unparsable"),
        "\\boxed{4} ": ("", "bad_gold"),
    }
    completions = list(cases)
    golds = [gold for gold, _ in cases.values()]
    assert grading.grade_with_reasons(completions, golds) == [reason for _, reason in cases.values()]
    assert grade(completions, golds) == [float(reason == "correct") for _, reason in cases.values()]


def test_a_stuck_answer_is_a_timeout():
    pids = _worker_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert grading.grade_with_reasons(["\\boxed{1}"], ["1"], timeout_s=0.5) == ["timeout"]
    finally:  # the workers it did not need stay stopped in the pool: later tests would time out on them
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
