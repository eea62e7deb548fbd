"""The synthetic task: determinism, disjoint splits, tokenizer, strict verifier, step boundaries."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from probepo.config import RunConfig, TaskConfig
from probepo.data import ModChainTask, build_task
from probepo.data.task import RL_STREAM, WARMUP_CHECK_STREAM, WARMUP_STREAM, split_of
from probepo.presets import ConfigError, validate_run_config

TASK = ModChainTask(steps=6, modulus=10, ops="+-", seed=3)
TOK = TASK.tokenizer


def test_problems_are_deterministic_and_seeded():
    again = ModChainTask(steps=6, modulus=10, ops="+-", seed=3)
    other = ModChainTask(steps=6, modulus=10, ops="+-", seed=4)
    first = [TASK.problem(i, "train") for i in range(20)]
    assert first == [again.problem(i, "train") for i in range(20)]
    assert first != [other.problem(i, "train") for i in range(20)]
    assert TASK.batch(RL_STREAM, 7, 2, 16) == again.batch(RL_STREAM, 7, 2, 16)
    assert TASK.batch(RL_STREAM, 7, 2, 16) != TASK.batch(RL_STREAM, 7, 3, 16)


def test_rl_prompts_never_replay_the_warmup_batches():
    """A run whose seed equals warmup.seed (both 0 by default) must not train RL update k on the first
    problems of warm-up batch k: the two are separate streams."""
    for k in range(5):
        rl = {p.prompt for p in TASK.batch(RL_STREAM, 0, k, 16)}
        assert not rl & {p.prompt for p in TASK.batch(WARMUP_STREAM, 0, k, 64)}
        assert not rl & {p.prompt for p in TASK.batch(WARMUP_CHECK_STREAM, 0, 0, 64)}


def test_splits_are_disjoint():
    train = {TASK.problem(i, "train").prompt for i in range(300)}
    evals = {TASK.problem(i, "eval").prompt for i in range(300)}
    assert not train & evals
    assert {split_of(p) for p in train} == {"train"} and {split_of(p) for p in evals} == {"eval"}


def reference_answer(prompt, modulus):
    """Left-to-right evaluation of `n op n op … =`, independent of the task's own code."""
    tokens = prompt[:-1]
    acc, i = int(tokens[0]), 1
    while i < len(tokens):
        op, n = tokens[i], int(tokens[i + 1])
        acc = {"+": acc + n, "-": acc - n, "*": acc * n}[op] % modulus
        i += 2
    return str(acc)


@pytest.mark.parametrize("ops", ["+-", "+-*", "*"])
def test_worked_solutions_are_right_and_score_one(ops):
    task = ModChainTask(steps=5, modulus=10, ops=ops, seed=1)
    for i in range(50):
        p = task.problem(i, "train")
        assert p.answer == reference_answer(p.prompt, 10)
        assert p.solution.count(";") == 5 and p.solution.endswith(">" + p.answer)
        assert set(p.prompt[1:-1:2]) <= set(ops)
        assert task.verify(task.tokenizer.decode(task.solution_ids(p)), p) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "3+5=8;",  # no answer
        ">{a}",  # no EOS
        ">{a}$$",
        ">{a}$;",  # text after EOS
        ">{a}>{a}$",  # two answers
        ">0{a}$",  # leading zero
        ">{a}7$",
        "3+5=8;>{a} $",
        "^>{a}$",  # BOS inside
        "",
    ],
)
def test_verifier_rejects_malformed(text):
    problem = TASK.problem(0, "train")
    assert TASK.verify(text.format(a=problem.answer), problem) == 0.0


def test_verifier_rewards_the_answer_not_the_chain():
    problem = TASK.problem(1, "train")
    wrong = str((int(problem.answer) + 1) % 10)
    assert TASK.verify(f"1+1=5;>{problem.answer}$", problem) == 1.0
    assert TASK.verify(f">{problem.answer}$", problem) == 1.0
    assert TASK.verify(problem.solution[:-1] + wrong + "$", problem) == 0.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*=;>$^_ab\n", max_size=60))
def test_verifier_never_crashes_and_scores_zero_or_one(text):
    assert TASK.verify(text, TASK.problem(2, "train")) in (0.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*=;>", max_size=60))
def test_tokenizer_round_trip(text):
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text and len(ids) == len(text)
    assert TOK.encode(TOK.decode([1, *ids, 2, 0])) == [1, *ids, 2, 0]


def test_tokenizer_names_bad_characters_and_ids():
    with pytest.raises(ValueError, match=r"'x' at position 3"):
        TOK.encode("1+2x=")
    with pytest.raises(ValueError, match="token id 19"):
        TOK.decode([19])
    assert TOK.vocab_size == 19 and (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
    assert TOK.token_texts([1, 3, 2]) == ["^", "0", "$"]


def test_step_end_marks_semicolons():
    ids = [*TOK.encode("3+5=8;8-2=6;>6"), TOK.eos_id]
    marks = TASK.step_end(ids)
    assert [i for i, m in enumerate(marks) if m] == [5, 11]


def test_prompt_ids_start_with_bos():
    problem = TASK.problem(0, "eval")
    assert TASK.prompt_ids(problem) == [TOK.bos_id, *TOK.encode(problem.prompt)]
    assert TASK.solution_ids(problem)[-1] == TOK.eos_id


def test_bad_split_index_and_config_are_named():
    with pytest.raises(ValueError, match="split"):
        TASK.problem(0, "test")
    with pytest.raises(ValueError, match="index"):
        TASK.problem(-1, "train")
    with pytest.raises(ValidationError, match="ops"):
        TaskConfig(ops="+/")
    with pytest.raises(ValidationError, match="modulus"):
        TaskConfig(modulus=1)
    task = build_task(TaskConfig(steps=2, modulus=7, ops="*", seed=1))
    assert task.problem(0, "train").prompt.count("*") == 2


POINTER = build_task(TaskConfig(kind="pointer", letters=8, hops=5, seed=2))


def follow(prompt):
    """The answer by following the prompt's links, independent of the task's own code."""
    links, start = prompt[:-1].split("|")
    following = dict(link for link in links.split(","))
    here = start
    for _ in range(5):
        here = following[here]
    return here, following


def test_pointer_problems_are_single_cycles_with_right_solutions():
    for i in range(100):
        p = POINTER.problem(i, "train")
        answer, following = follow(p.prompt)
        assert p.answer == answer and answer != p.prompt[-2]
        seen, here = set(), "a"  # one cycle through all letters: no shortcut to the answer
        while here not in seen:
            seen.add(here)
            here = following[here]
        assert len(seen) == 8
        assert p.solution.count(";") == 5
        assert POINTER.verify(POINTER.tokenizer.decode(POINTER.solution_ids(p)), p) == 1.0
        assert POINTER.step_end(POINTER.solution_ids(p)).count(True) == 5


def test_pointer_verifier_is_strict_and_splits_are_disjoint():
    p = POINTER.problem(0, "eval")
    wrong = next(ch for ch in "abcdefgh" if ch != p.answer)
    assert POINTER.verify(f">{p.answer}$", p) == 1.0
    for text in (f">{wrong}$", f">{p.answer}", f">{p.answer}{p.answer}$", f"ab;>{p.answer}$x", ""):
        assert POINTER.verify(text, p) == 0.0
    train = {POINTER.problem(i, "train").prompt for i in range(200)}
    assert not train & {POINTER.problem(i, "eval").prompt for i in range(200)}


def test_pointer_config_rejects_a_trivial_hop_count():
    with pytest.raises(ValidationError, match="hops = 16 is a multiple of letters = 8"):
        TaskConfig(kind="pointer", letters=8, hops=16)


@pytest.mark.parametrize(
    "config", [TaskConfig(modulus=100, steps=3), TaskConfig(), TaskConfig(kind="pointer", letters=5, hops=3)]
)
def test_longest_prompt_bounds_every_prompt_and_is_reached(config):
    task = build_task(config)
    lengths = [len(task.prompt_ids(task.problem(i, "train"))) for i in range(400)]
    assert max(lengths) == task.longest_prompt()


def test_the_context_check_reads_the_longest_prompt_not_problem_0():
    """Problem 0 may have short numbers; the context must fit the longest prompt the task can make."""
    for seed in range(50):
        task = build_task(TaskConfig(modulus=100, steps=3, seed=seed))
        first = len(task.prompt_ids(task.problem(0, "train")))
        if first < task.longest_prompt():
            break
    fields = {"task": {"modulus": 100, "steps": 3, "seed": seed}, "model": {"vocab_size": 19}}
    fits_problem_0 = {**fields, "sampling": {"max_tokens": 64}, "algo": {"rescue_tokens": 0}}
    with pytest.raises(ConfigError, match="longest prompt"):  # where a recipe is composed: it needs the task
        validate_run_config({**fits_problem_0, "model": {"context": first + 64}}, "recipe")


def test_every_way_a_recipe_misfits_its_task_is_named_at_once():
    fields = {"model": {"vocab_size": 23, "context": 16}}
    with pytest.raises(ConfigError) as refused:
        validate_run_config(fields, "recipe.yaml")
    lines = str(refused.value).splitlines()
    assert [line.split(" = ")[0] for line in lines] == [
        "recipe.yaml: model.vocab_size",
        "recipe.yaml: model.context",
    ]
    assert RunConfig.model_validate(fields).model.vocab_size == 23  # the model alone cannot see the task
