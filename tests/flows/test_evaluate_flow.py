"""The nightly evaluation against the real Prefect server and SLURM cluster: every checkpoint lacking an
evaluation done once as job array tasks (split to MaxArraySize), a second night doing nothing; and the
`evaluate` flow's bad input refused before anything is submitted."""

from __future__ import annotations

import subprocess
import time

import pytest

from probepo.pipeline import ensure_warmup, train
from probepo.store import open_store
from tests.flows import NEEDS_PREFECT
from tests.flows.test_train_flow import _task_run_names
from tests.slurm.conftest import drill_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    NEEDS_PREFECT,
]


def test_two_nightly_runs_evaluate_each_checkpoint_exactly_once(tmp_path, profile_path, monkeypatch):
    import slurm.accounting
    from flows.evaluate import nightly_eval

    store = open_store(tmp_path / "store")
    ensure_warmup(drill_config(), store)
    for seed, run_id in enumerate(("night-a", "night-b")):
        train(drill_config(store=store.url, seed=seed), run_id, store=store)
    monkeypatch.setattr(slurm.accounting, "max_array_size", lambda: 3)  # 4 pairs: arrays of 3 and 1

    first = nightly_eval(store.url, executor="slurm", profile=str(profile_path), return_state=True)
    assert first.is_completed(), first.message
    assert first.result() == {"evaluated": 4, "exists": 0, "failed": 0}
    names = _task_run_names(first.state_details.flow_run_id, 2)  # "evaluate · array <id> · <n> tasks"
    assert sorted(name.rsplit(" · ", 1)[1] for name in names) == ["1 task", "3 tasks"], names
    array_ids = [name.split(" · ")[1].removeprefix("array ") for name in names]
    tasks = _array_task_states(array_ids)
    assert len(tasks) == 4 and all(line.endswith("|COMPLETED") for line in tasks), tasks

    stamps = {}
    for run_id in ("night-a", "night-b"):
        records = store.evaluations(run_id)
        assert sorted(records) == [(0, "heldout"), (1, "heldout")]
        for k in (0, 1):  # the run's own evaluation of update k, to the bit, from a job array task
            assert (
                records[(k, "heldout")]["mean"] == store.marker(run_id, k, "evaluate")["summary"]["accuracy"]
            )
        stamps[run_id] = {key: record["at"] for key, record in records.items()}

    second = nightly_eval(store.url, executor="slurm", profile=str(profile_path), return_state=True)
    assert second.is_completed() and second.result() == {"evaluated": 0, "exists": 0, "failed": 0}
    assert _task_run_names(second.state_details.flow_run_id, 0) == set()  # no job submitted
    for run_id in ("night-a", "night-b"):
        assert {key: record["at"] for key, record in store.evaluations(run_id).items()} == stamps[run_id]


def _array_task_states(array_ids: list[str], timeout_s: float = 60.0) -> list[str]:
    """`JobID|State` of every task of the arrays, once none is pending or running: the flow ends when the
    store holds every evaluation, and a task may still be exiting then."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(array_ids)],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        if not any(line.endswith(("|PENDING", "|RUNNING", "|COMPLETING")) for line in tasks):
            return tasks
        if time.monotonic() > deadline:
            return tasks
        time.sleep(0.5)


def test_the_evaluate_flow_refuses_bad_input_before_submitting(warm_store):
    from flows.evaluate import evaluate

    with pytest.raises(ValueError, match="suites: nosuch — choose from heldout"):
        evaluate("drill-inline", store=warm_store.url, suites=["nosuch"])
    with pytest.raises(Exception, match="no-such-run"):
        evaluate("no-such-run", store=warm_store.url)
