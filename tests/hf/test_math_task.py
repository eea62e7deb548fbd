"""MathTask on Qwen's real tokenizer: prompt templates per family, step boundaries on hand-made text, the
verifier's reasons and batch path, and the problem sources."""

from __future__ import annotations

import pytest

from probepo.data.benchmarks import benchmarks_root
from probepo.data.math_sources import (
    DEMO_INSTRUCTION,
    benchmark_problems,
    demo_problems,
    reasoning_gym_problems,
)
from probepo.data.math_task import FAMILIES, INSTRUCTION, MathProblem, MathTask
from probepo.data.task import RL_STREAM, split_of

PROBLEMS = {
    "train": [
        MathProblem(prompt="What is $1+1$?", answer="2", solution="", id="t0"),
        MathProblem(prompt="Solve $x^2 = 4$ for $x > 0$.", answer="2", solution="", id="t1"),
        MathProblem(prompt="Name the pair.", answer="(1,2)", solution="", id="t2", golds=("(1,2)", "(2,1)")),
    ],
    "eval": [MathProblem(prompt="Compute $\\frac{1}{2}+\\frac{1}{2}$.", answer="1", solution="", id="e0")],
}


@pytest.fixture
def task(tokenizer) -> MathTask:
    return MathTask(tokenizer, "chat", PROBLEMS)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_renders_a_boxed_answer_prompt(tokenizer, family):
    task = MathTask(tokenizer, family, PROBLEMS)
    problem = PROBLEMS["train"][1]
    ids = task.prompt_ids(problem)
    text = task.tokenizer.decode(ids)
    assert problem.prompt in text and INSTRUCTION in text and "\\boxed{}" in INSTRUCTION
    expected_start = {
        "deepseek-math": "User: Solve",
        "r1-distill": "<｜User｜>Solve",
        "qwen3-base": "Question: Solve",
        "chat": "<|im_start|>user\nSolve",
    }[family]
    assert text.startswith(expected_start)  # Qwen's tokenizer has no BOS: nothing before the template
    expected_end = {"deepseek-math": "Assistant:", "r1-distill": "<think>\n", "qwen3-base": "Answer:"}
    assert text.endswith(expected_end.get(family, "<|im_start|>assistant\n"))
    assert ids[-1] != task.tokenizer.eos_id
    assert task.longest_prompt() == max(len(task.prompt_ids(p)) for rows in PROBLEMS.values() for p in rows)


def test_bos_starts_template_prompts_when_the_tokenizer_has_one(tokenizer):
    problem = PROBLEMS["train"][0]
    chat_ids = MathTask(tokenizer, "chat", PROBLEMS).prompt_ids(problem)
    tokenizer.bos_token = "<|im_start|>"  # the session's tokenizer (a copy takes seconds): restored below
    try:
        for family in ("deepseek-math", "r1-distill", "qwen3-base"):
            ids = MathTask(tokenizer, family, PROBLEMS).prompt_ids(problem)
            assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
        # chat: the template decides, and this one writes no BOS
        assert MathTask(tokenizer, "chat", PROBLEMS).prompt_ids(problem) == chat_ids
    finally:
        tokenizer.bos_token = None
    assert tokenizer.bos_token_id is None


def test_the_instruction_may_change_but_must_ask_for_a_box(tokenizer):
    task = MathTask(tokenizer, "chat", PROBLEMS, instruction=DEMO_INSTRUCTION)
    assert DEMO_INSTRUCTION in task.tokenizer.decode(task.prompt_ids(PROBLEMS["train"][0]))
    with pytest.raises(ValueError, match="boxed"):
        MathTask(tokenizer, "chat", PROBLEMS, instruction="Answer briefly.")


def test_chat_needs_a_chat_template(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "chat_template", None)
    with pytest.raises(ValueError, match="no chat template"):
        MathTask(tokenizer, "chat", PROBLEMS).prompt_ids(PROBLEMS["train"][0])


def test_step_ends_on_newlines_and_sentence_ends_not_decimal_points(task):
    text = 'We add 3.5 and 2. So x = 5.5, then\n\nDone! Really? (Yes.) "End." Now **done.** \\boxed{5}.\n'
    ids = task.tokenizer.encode(text)
    texts = task.tokenizer.token_texts(ids)
    assert "".join(texts) == text
    ends = [token for token, end in zip(texts, task.step_end(ids), strict=True) if end]
    # BPE merges: ".)", '."', "}.\n", "\n\n" are single tokens; the "." of 3.5 and 5.5 are decimal points
    assert ends == [".", "\n\n", "!", "?", ".)", '."', ".", "}.\n"]


@pytest.mark.parametrize(
    ("completion", "reason"),
    [
        ("1 + 1 = 2, so the answer is 2.<|endoftext|>", "no_answer"),
        ("So the answer is \\boxed{3}.<|endoftext|>", "wrong"),
        ("So the answer is \\boxed{\\frac{4}{2}}.<|endoftext|>", "correct"),
        ("So the answer is \\boxed{\\frac{}}.<|endoftext|>", "unparsable"),
    ],
)
def test_verify_and_its_reasons(task, completion, reason):
    problem = PROBLEMS["train"][0]
    assert task.grade_many([completion], [problem]) == [reason]
    assert task.verify(completion, problem) == float(reason == "correct")


def test_verify_many_equals_verify_per_item_and_takes_any_gold(task):
    pair = PROBLEMS["train"][2]
    completions = ["\\boxed{(2,1)}", "\\boxed{(1,2)}", "\\boxed{(1,3)}", "no box", "\\boxed{2}", "\\boxed{1}"]
    problems = [pair, pair, pair, pair, PROBLEMS["train"][0], PROBLEMS["eval"][0]]
    rewards = task.verify_many(completions, problems)
    assert rewards == [task.verify(c, p) for c, p in zip(completions, problems, strict=True)]
    assert rewards == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert task.grade_many(completions[2:4], problems[2:4]) == ["wrong", "no_answer"]


def test_problems_and_batches_come_from_the_split_lists(task):
    assert [task.problem(i, "train").id for i in range(4)] == ["t0", "t1", "t2", "t0"]
    assert task.problem(7, "eval").id == "e0"
    batch = task.batch(RL_STREAM, seed=1, index=0, size=6)
    assert batch == task.batch(RL_STREAM, seed=1, index=0, size=6)
    assert {p.id for p in batch} <= {"t0", "t1", "t2"}
    with pytest.raises(ValueError, match="split"):
        task.problem(0, "test")
    with pytest.raises(ValueError, match="non-empty splits"):
        MathTask(task.tokenizer.hf, "chat", {"train": PROBLEMS["train"], "eval": []})


def test_reasoning_gym_problems_are_deterministic_and_split_by_hash():
    problems = demo_problems(size=200, seed=3)
    assert problems == demo_problems(size=200, seed=3)
    assert problems != demo_problems(size=200, seed=4)
    for split, rows in problems.items():
        assert rows and all(split_of(p.prompt) == split for p in rows)
        assert all(p.answer.lstrip("-").isdigit() for p in rows)
    texts = [p.prompt for rows in problems.values() for p in rows]
    assert len(texts) == len(set(texts))
    arithmetic = reasoning_gym_problems("basic_arithmetic", size=20, seed=0, config={"max_terms": 2})
    assert sum(map(len, arithmetic.values())) == 20


@pytest.mark.skipif(
    not (benchmarks_root() / "math500").is_dir(), reason="the shared benchmark files are absent"
)
def test_benchmark_problems_train_on_math_and_evaluate_on_math500():
    problems = benchmark_problems("math500")
    assert len(problems["train"]) == 4497 and len(problems["eval"]) == 500
    assert all(p.golds and p.answer == p.golds[0] for rows in problems.values() for p in rows)


def test_the_heldout_suite_of_a_maths_run_takes_each_eval_problem_once(task):
    """eval.problems 1,024 over a 1-problem eval split: that problem once, never wrapped round to 1,024."""
    from types import SimpleNamespace

    from probepo.config.run import EvalConfig
    from probepo.stages.evaluate import heldout_suite

    math_run = SimpleNamespace(kind="math", source="benchmarks", eval_set="math500")
    ctx = SimpleNamespace(config=SimpleNamespace(eval=EvalConfig(problems=1024), task=math_run))
    suite = heldout_suite(ctx, task)  # type: ignore[arg-type]
    assert task.split_size("eval") == 1 and [p.id for p in suite.problems] == ["e0"]
    assert suite.source == "math500 (the task's eval split), problems 0-0"
