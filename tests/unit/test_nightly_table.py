"""What the nightly evaluation lists and says (flows/evaluate.py): every pair of its selection, those
evaluated on an earlier night among them (listed as reused, never done again), counts in words, and the
night's cost naming the executor that ran it. Three nights on SLURM: tests/flows/test_evaluate_flow.py."""

from __future__ import annotations

import pytest

from flows.evaluate import cost_line, counted, selected, split_evaluated
from probepo.config import CheckpointSelection
from probepo.run.evaluations import EvaluationRequest
from probepo.store import open_store
from slurm.accounting import JobCost
from tests.pipeline.test_evaluations import math_run

COST = JobCost(job_id="9_3", gpus=1, cpus=8, elapsed_s=5400, gpu_seconds=5400, cpu_seconds=43200, records=2,
               state="COMPLETED")  # fmt: skip


def test_counts_are_said_in_words():
    assert [counted(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]


def test_the_cost_line_names_the_executor_and_why_there_are_no_gpu_hours():
    assert cost_line("slurm", False, 1, {"9_3": COST}) == (
        "executor slurm: tonight 1.5 GPU-hours, 12 CPU-hours over 1 job (accounting); a pair's GPU-h counts"
        " every job that worked on it, earlier nights' too"
    )
    assert cost_line("slurm", False, 0, {}) == (
        "executor slurm: no job tonight, nothing left to evaluate (no GPU-hours)"
    )
    assert (
        cost_line("local", False, 2, {})
        == "executor local: 2 jobs tonight, none in its accounting (no GPU-hours)"
    )
    assert cost_line("inline", True, 0, {}) == (
        "executor inline: no jobs, every pair in the worker's process (no GPU-hours)"
    )


def test_pairs_are_split_by_whether_their_evaluation_is_held():
    pairs = [EvaluationRequest("/s", run, k, "heldout") for run in ("a", "b") for k in (0, 1)]
    split = split_evaluated(pairs, {"a": {(1, "heldout")}, "b": {(0, "math500")}})
    assert [(r.run_id, r.checkpoint) for r in split.earlier] == [("a", 1)]
    assert [(r.run_id, r.checkpoint) for r in split.missing] == [("a", 0), ("b", 0), ("b", 1)]


def test_a_checkpoint_evaluated_on_an_earlier_night_stays_in_the_selection_as_done(tmp_path):
    store = open_store(tmp_path / "store")
    math_run(store, "night", updates=(0, 15), evaluated_in_run=(0,))
    every = CheckpointSelection(runs=("night",))
    first = selected(store, ["math500"], every)
    assert [(r.checkpoint, r.from_run) for r in first.missing] == [
        (0, True),
        (15, False),
    ] and not first.earlier
    store.record_evaluation("night", 15, "math500", {"mean": 0.5, "stderr": 0.1, "k": 16})  # that night's
    second = selected(store, ["math500"], every)
    assert [(r.checkpoint, r.from_run) for r in second.missing] == [(0, True)]
    assert [r.checkpoint for r in second.earlier] == [15]
    latest = selected(store, ["math500"], CheckpointSelection(runs=("night",), latest=True))
    assert latest.missing == [] and [r.checkpoint for r in latest.earlier] == [15]  # listed, not done again


@pytest.mark.parametrize(
    ("every", "said"),
    [(2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (21, "21st"), (123, "123rd")],
)
def test_the_selection_names_its_stride_as_an_ordinal(every, said):
    selection = CheckpointSelection(runs=("grpo-*",), latest=False, every=every)
    assert selection.describe() == f"runs grpo-*, checkpoints, every {said} update"
