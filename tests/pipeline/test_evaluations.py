"""Checkpoints evaluated after the fact (probepo/evaluations.py): the pairs that lack an evaluation, each
committed create-only beside its run, the same numbers as the run's own evaluate stage."""

from __future__ import annotations

import pytest

from probepo.evaluations import EvaluationRequest, evaluate_checkpoint, missing
from probepo.pipeline import train
from probepo.stages.warmup import warmup_run_id
from slurm.arrays import run_array
from slurm.backends import chunks
from tests.pipeline.conftest import tiny_config


@pytest.fixture(scope="module")
def trained(warm_store):
    train(tiny_config(num_updates=2, store=warm_store.url), "evals-run", store=warm_store)
    return warm_store


def test_each_checkpoint_is_evaluated_once_to_the_in_run_evaluations_bits(trained):
    wanted = missing(trained, ["heldout"], runs=["evals-run"])
    assert [(r.checkpoint, r.suite) for r in wanted] == [(0, "heldout"), (1, "heldout"), (2, "heldout")]
    outcomes = run_array("inline", evaluate_checkpoint, wanted, profile=None, name="evals")
    assert [o.result for o in outcomes] == ["evaluated"] * 3 and all(o.error is None for o in outcomes)
    records = trained.evaluations("evals-run")
    for k in range(3):
        in_run = trained.marker("evals-run", k, "evaluate")["summary"]
        record = records[(k, "heldout")]
        assert (record["mean"], record["stderr"], record["problems"]) == (
            in_run["accuracy"], in_run["stderr"], in_run["problems"]
        )  # fmt: skip
        assert len(record["per_problem"]["correct"]) == 16
    assert missing(trained, ["heldout"], runs=["evals-run"]) == []
    first = records[(1, "heldout")]
    assert evaluate_checkpoint(wanted[1]) == "exists"  # a second night, a concurrent run: nothing twice
    assert trained.evaluations("evals-run")[(1, "heldout")] == first
    assert trained.record_evaluation("evals-run", 1, "heldout", {"mean": 0.0}) is False


def test_only_applicable_suites_and_known_names(trained):
    assert missing(trained, ["math500"], runs=["evals-run"]) == []  # a testbed model cannot read maths
    warmup = warmup_run_id(tiny_config())
    trained.objects.put_bytes("runs/no-recipe/metrics.jsonl", b"")  # a run folder without run.json
    assert {warmup, "no-recipe"} <= set(trained.runs())
    assert not {warmup, "no-recipe"} & {r.run_id for r in missing(trained, ["heldout"])}  # both skipped
    with pytest.raises(ValueError, match="suites: nosuch — choose from heldout"):
        missing(trained, ["nosuch"])
    with pytest.raises(ValueError, match="suites: none given"):
        missing(trained, [])


def test_an_items_error_is_its_outcome_and_the_others_go_on(trained):
    broken = EvaluationRequest(trained.url, "evals-run", 7, "heldout")  # no checkpoint 7
    outcomes = run_array("inline", evaluate_checkpoint, [broken], profile=None, name="evals")
    assert outcomes[0].result is None and "7" in outcomes[0].error


def test_arrays_split_to_max_array_size():
    assert chunks(5, 2) == [range(0, 2), range(2, 4), range(4, 5)] and chunks(0, 100) == []
