"""The nightly evaluation against the real Prefect server and SLURM cluster: the selected checkpoints lacking
an evaluation done once, as one-GPU job array tasks (split to MaxArraySize, throttled), or taken from the
run's own evaluate stage; a third night doing nothing, yet listing every pair it selects as reused with
the GPU-hours the earlier night's jobs cost; the cost line naming the executor; a maths checkpoint's six
benchmarks and their Avg-6 in the artifact; and the `evaluate` flow's bad input refused before anything
is submitted."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from probepo.config import CheckpointSelection
from probepo.run.pipeline import ensure_warmup, train
from probepo.store import open_store
from tests.flows import NEEDS_PREFECT
from tests.flows.test_launch import _artifact
from tests.flows.test_train_flow import _task_run_names
from tests.pipeline.test_evaluations import math_run
from tests.slurm.conftest import drill_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    NEEDS_PREFECT,
]


def test_nights_evaluate_each_selected_checkpoint_once_on_one_gpu_and_take_the_runs_own(
    tmp_path, monkeypatch
):
    import slurm.accounting
    from flows.evaluate import nightly_eval

    store = open_store(tmp_path / "store")
    ensure_warmup(drill_config(), store)
    sparse = {"num_updates": 2, "eval": {**drill_config().eval.model_dump(), "every": 10}}  # policies 0, 2
    train(drill_config(store=store.url, **sparse), "night-a", store=store)
    for seed, run_id in ((1, "night-c"), (2, "night-d")):
        train(drill_config(store=store.url, seed=seed, **sparse), run_id, store=store)
    dense = {**sparse, "eval": {**sparse["eval"], "every": 1}}  # night-a's recipe, evaluated at every update
    train(drill_config(store=store.url, **dense), "night-b", store=store)
    profile = tmp_path / "profile.yaml"  # the evaluate stage on 2 GPUs: its array tasks take one each
    profile.write_text(yaml.safe_dump({
        "job_folder": str(tmp_path / "jobs"), "poll_s": 0.3,
        "defaults": {"partition": "low", "time_min": 15, "signal_grace_s": 30},
        "stages": {"evaluate": {"gpus_per_node": 2, "tasks_per_node": 2}},
    }))  # fmt: skip
    on_slurm = {"executor": "slurm", "profile": str(profile)}

    latest_of_a = CheckpointSelection(runs=("night-a",), latest=True)
    first = nightly_eval(store.url, selection=latest_of_a, **on_slurm, return_state=True)
    assert first.is_completed(), first.message  # policy 2 was evaluated by the run itself: nothing submitted
    assert first.result() == {"evaluated": 0, "resumed": 0, "reused": 1, "exists": 0, "failed": 0}
    assert sorted(store.evaluations("night-a")) == [(2, "heldout")]
    assert _task_run_names(first.state_details.flow_run_id, 0) == set()

    monkeypatch.setattr(slurm.accounting, "max_array_size", lambda: 2)  # 3 pairs to run: arrays of 2 and 1
    second = nightly_eval(store.url, max_parallel=2, **on_slurm, return_state=True)
    assert second.is_completed(), second.message
    assert second.result() == {
        "evaluated": 3,
        "resumed": 0,
        "reused": 9,
        "exists": 0,
        "failed": 0,
    }  # policy 1 of a, c, d; reused: the runs' own 8 and night-a's policy 2, which the first night took
    names = _task_run_names(second.state_details.flow_run_id, 2)  # "evaluate · array <id> · <n> tasks"
    assert sorted(name.rsplit(" · ", 1)[1] for name in names) == ["1 task", "2 tasks"], names
    array_ids = [name.split(" · ")[1].removeprefix("array ") for name in names]
    tasks = _array_task_states(array_ids)
    assert len(tasks) == 3 and all(line.endswith("|COMPLETED") for line in tasks), tasks
    assert all("gres/gpu=1" in line.split("|")[1] for line in tasks), tasks  # one GPU each, not the stage's 2
    table = _artifact("nightly-eval-evaluations")  # each array task's GPU-hours, from accounting
    assert table.description.startswith("nightly-eval: evaluations; executor slurm: tonight "), (
        table.description
    )
    assert " GPU-hours, " in table.description and " over 3 jobs (accounting)" in table.description
    cost = {row["outcome"]: row["GPU-h"] for row in json.loads(table.data)}
    assert {row["status"] for row in json.loads(table.data)} == {"complete"}
    assert cost["evaluated"] > 0 and cost["reused"] is None
    # max_parallel 2 over two arrays: one task of each at a time
    scripts = [path.read_text() for path in (tmp_path / "jobs" / "nightly-eval").glob("*_submission.sh")]
    assert sum("#SBATCH --array=0-1%1" in script for script in scripts) == 1, scripts
    # The array task's evaluation of night-a's policy 1 is night-b's in-run one, to the bit (same policy)
    assert (
        store.evaluation("night-a", 1, "heldout")["mean"]
        == store.marker("night-b", 1, "evaluate")["summary"]["accuracy"]
    )
    stamps = {}
    for run_id in ("night-a", "night-b", "night-c", "night-d"):
        records = store.evaluations(run_id)
        assert sorted(records) == [(0, "heldout"), (1, "heldout"), (2, "heldout")]
        stamps[run_id] = {key: record["at"] for key, record in records.items()}

    third = nightly_eval(store.url, **on_slurm, return_state=True)
    assert third.is_completed() and third.result() == {
        "evaluated": 0,
        "resumed": 0,
        "reused": 12,
        "exists": 0,
        "failed": 0,
    }  # every pair an earlier night's (or a run's own), listed again, done again never
    assert _task_run_names(third.state_details.flow_run_id, 0) == set()  # no job submitted
    table = _artifact("nightly-eval-evaluations")
    listed = json.loads(table.data)
    assert [(row["run"], row["checkpoint"], row["outcome"]) for row in listed] == [
        (run_id, k, "reused") for run_id in ("night-a", "night-b", "night-c", "night-d") for k in range(3)
    ]
    assert table.description.endswith(
        "executor slurm: no job tonight, nothing left to evaluate (no GPU-hours)"
    )
    assert next(row for row in listed if row["run"] == "night-c" and row["checkpoint"] == 1)["GPU-h"] > 0
    for run_id in stamps:
        assert {key: record["at"] for key, record in store.evaluations(run_id).items()} == stamps[run_id]


def _array_task_states(array_ids: list[str], timeout_s: float = 60.0) -> list[str]:
    """`JobID|AllocTRES|State` of every task of the arrays, once none is pending or running: the flow ends
    when the store holds every evaluation, and a task may still be exiting then."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "JobID,AllocTRES,State", "-j", ",".join(array_ids)],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        if not any(line.endswith(("|PENDING", "|RUNNING", "|COMPLETING")) for line in tasks):
            return tasks
        if time.monotonic() > deadline:
            return tasks
        time.sleep(0.5)


def test_a_maths_checkpoint_gets_a_row_per_benchmark_and_its_avg6(tmp_path):
    """The evaluate flow's whole path (flows/evaluate.py: _evaluate) by default on a maths run whose
    checkpoint has its six benchmarks, taken from its evaluate stage: a row each and the Avg-6 row."""
    from flows.evaluate import evaluate
    from probepo.data.benchmarks import AVG6_BENCHMARKS, avg6

    store = open_store(tmp_path / "store")
    math_run(store, "math-night", updates=(0,), evaluated_in_run=(0,))
    state = evaluate("math-night", store=store.url, return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == {"evaluated": 0, "resumed": 0, "reused": 6, "exists": 0, "failed": 0}
    rows = json.loads(_artifact("evaluate-math-night-evaluations").data)
    means = {row["suite"]: row["mean"] for row in rows}
    assert list(means) == [*AVG6_BENCHMARKS, "avg6"]
    assert means["avg6"] == pytest.approx(avg6({name: means[name] for name in AVG6_BENCHMARKS})) == 0.35
    assert {row["status"] for row in rows} == {"complete"}


def test_the_evaluate_flow_refuses_bad_input_before_submitting(warm_store):
    from flows.evaluate import evaluate

    with pytest.raises(ValueError, match="suites: nosuch — choose from heldout"):
        evaluate("drill-inline", store=warm_store.url, suites=["nosuch"])
    with pytest.raises(Exception, match="no-such-run"):
        evaluate("no-such-run", store=warm_store.url)
