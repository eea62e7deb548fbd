"""Checkpoints evaluated after the fact (probepo/evaluations.py): the selected pairs that lack an
evaluation, each committed create-only beside its run, the same numbers as the run's own evaluate stage
(which are taken instead where the run made them), from the weights alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from probepo.config import CheckpointSelection
from probepo.evaluations import EvaluationRequest, adopt_run_evaluation, evaluate_checkpoint, missing
from probepo.pipeline import train
from probepo.stages.warmup import warmup_run_id
from probepo.store.store import ArtifactStore
from slurm.arrays import run_array
from slurm.backends import chunks
from tests.pipeline.conftest import tiny_config

EVALS_RUN = CheckpointSelection(runs=("evals-run",))


@pytest.fixture(scope="module")
def trained(warm_store):
    train(tiny_config(num_updates=2, store=warm_store.url), "evals-run", store=warm_store)
    return warm_store


def test_each_checkpoint_is_evaluated_once_to_the_in_run_evaluations_bits(trained):
    wanted = missing(trained, ["heldout"], EVALS_RUN)
    assert [(r.checkpoint, r.suite) for r in wanted] == [(0, "heldout"), (1, "heldout"), (2, "heldout")]
    assert all(
        r.from_run for r in wanted
    )  # evaluated by the run itself (eval every update): done anyway here
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
    assert missing(trained, ["heldout"], EVALS_RUN) == []
    first = records[(1, "heldout")]
    assert evaluate_checkpoint(wanted[1]) == "exists"  # a second night, a concurrent run: nothing twice
    assert trained.evaluations("evals-run")[(1, "heldout")] == first
    assert trained.record_evaluation("evals-run", 1, "heldout", {"mean": 0.0}) is False


def test_only_applicable_suites_and_known_names(trained):
    assert missing(trained, ["math500"], EVALS_RUN) == []  # a testbed model cannot read maths
    warmup = warmup_run_id(tiny_config())
    trained.objects.put_bytes("runs/no-recipe/metrics.jsonl", b"")  # a run folder without run.json
    assert {warmup, "no-recipe"} <= set(trained.runs())
    assert not {warmup, "no-recipe"} & {r.run_id for r in missing(trained, ["heldout"])}  # both skipped
    with pytest.raises(ValueError, match="suites: nosuch — choose from heldout"):
        missing(trained, ["nosuch"])
    with pytest.raises(ValueError, match="suites: none given"):
        missing(trained, [])


def test_the_runs_own_evaluations_are_taken_with_the_numbers_an_evaluation_makes(trained):
    train(tiny_config(num_updates=2, store=trained.url), "evals-twin", store=trained)  # evals-run's recipe
    wanted = missing(trained, ["heldout"], CheckpointSelection(runs=("evals-twin",)))
    assert [adopt_run_evaluation(request) for request in wanted] == ["reused"] * 3
    assert adopt_run_evaluation(wanted[0]) == "exists"
    run_array("inline", evaluate_checkpoint, missing(trained, ["heldout"], EVALS_RUN), profile=None, name="e")
    for k in range(3):
        evaluated, taken = (
            trained.evaluation("evals-run", k, "heldout"),
            trained.evaluation("evals-twin", k, "heldout"),
        )
        assert [evaluated[key] for key in ("mean", "stderr", "problems", "k")] == [
            taken[key] for key in ("mean", "stderr", "problems", "k")
        ]
        assert taken["from_run"] == {"update": k, "stage": "evaluate", "file": "eval.parquet"}


def test_the_selection_takes_runs_by_pattern_and_checkpoints_latest_every_nth_or_since(trained):
    train(tiny_config(num_updates=2, store=trained.url), "select-a", store=trained)
    train(tiny_config(num_updates=2, store=trained.url), "select-b", store=trained)

    def chosen(**fields: object) -> list[tuple[str, int]]:
        found = missing(trained, ["heldout"], CheckpointSelection(runs=("select-a", "*-b"), **fields))
        return [(request.run_id, request.checkpoint) for request in found]

    a, b = [("select-a", k) for k in range(3)], [("select-b", k) for k in range(3)]
    assert chosen() == a + b  # and none of the module's other runs
    assert chosen(latest=True) == [a[2], b[2]]
    assert chosen(every=2) == [a[0], a[2], b[0], b[2]]
    assert chosen(every=2, updates=(0, 1)) == [a[0], b[0]]
    assert chosen(since=datetime.now(UTC) + timedelta(minutes=5)) == []
    assert chosen(since=datetime(2020, 1, 1), latest=True) == [a[2], b[2]]  # no zone: UTC
    with pytest.raises(ValueError, match="every"):
        CheckpointSelection(every=0)
    with pytest.raises(ValueError, match="empty run name"):
        CheckpointSelection(runs=("",))


def test_an_evaluation_downloads_the_weights_without_the_optimizer_state(trained, monkeypatch):
    fetched = []
    download = ArtifactStore.download_stage_file

    def spy(self, run_id, update, stage, name, dest):
        fetched.append(name)
        return download(self, run_id, update, stage, name, dest)

    train(tiny_config(num_updates=1, store=trained.url), "evals-weights", store=trained)
    monkeypatch.setattr(ArtifactStore, "download_stage_file", spy)
    checkpoint = trained.marker("evals-weights", 1, "checkpoint")["files"]
    assert "optimizer.safetensors" in checkpoint
    assert evaluate_checkpoint(EvaluationRequest(trained.url, "evals-weights", 1, "heldout")) == "evaluated"
    assert sorted(fetched) == sorted(name for name in checkpoint if name != "optimizer.safetensors")


def test_an_items_error_is_its_outcome_and_the_others_go_on(trained):
    broken = EvaluationRequest(trained.url, "evals-run", 7, "heldout")  # no checkpoint 7
    outcomes = run_array("inline", evaluate_checkpoint, [broken], profile=None, name="evals")
    assert outcomes[0].result is None and "7" in outcomes[0].error


def test_arrays_split_to_max_array_size():
    assert chunks(5, 2) == [range(0, 2), range(2, 4), range(4, 5)] and chunks(0, 100) == []


def test_a_stopped_evaluation_keeps_its_shards_and_resumes_to_an_uninterrupted_ones_bits(warm_store):
    """Four engine calls (batch rows 4 over 16 problems): stopped after the first, that one is kept; a torn
    shard is named with what to do; the next run makes only what is missing, and the numbers equal those
    of a twin run's uninterrupted evaluation."""
    from probepo.config import RunConfig
    from probepo.preemption import Preempted

    sampling = {**RunConfig().sampling.model_dump(), "batch_rows": 4}
    evaluated_at_ends = {**tiny_config().eval.model_dump(), "every": 10}  # policies 0 and 2 in the run
    for run_id in ("shards-a", "shards-b"):
        config = tiny_config(store=warm_store.url, sampling=sampling, eval=evaluated_at_ends)
        train(config, run_id, store=warm_store)
    stopped = EvaluationRequest(warm_store.url, "shards-a", 1, "heldout")
    kept = lambda: warm_store.evaluation_shard_names("shards-a", 1, "heldout")  # noqa: E731
    with pytest.raises(Preempted, match="1 of 4 shards committed") as raised:
        evaluate_checkpoint(stopped, should_stop=lambda: len(kept()) >= 1)
    assert raised.value.progressed and kept() == ["evaluate.heldout.shard-0000"]
    assert warm_store.evaluation("shards-a", 1, "heldout") is None
    assert not any(name.startswith("evaluate.") for name in warm_store.committed_stages("shards-a", 1))
    shard = (
        Path(warm_store.url)
        / "runs/shards-a/evaluation-shards/000001/heldout/evaluate.heldout.shard-0000.parquet"
    )
    made = shard.read_bytes()
    shard.write_bytes(b"torn")
    with pytest.raises(
        RuntimeError, match=r"shard-0000 of update 1 of run shards-a is unreadable .*: delete it"
    ):
        evaluate_checkpoint(stopped)
    shard.write_bytes(made)
    assert evaluate_checkpoint(stopped) == "resumed" and kept() == []  # the shards go with the commit
    twin = EvaluationRequest(warm_store.url, "shards-b", 1, "heldout")
    assert evaluate_checkpoint(twin) == "evaluated"
    resumed, whole = (
        warm_store.evaluation("shards-a", 1, "heldout"),
        warm_store.evaluation("shards-b", 1, "heldout"),
    )
    # the attempt that met the torn shard had made the other three: all four were kept before
    assert (resumed["resumed_shards"], resumed["shards"], whole["resumed_shards"]) == (4, 4, 0)
    assert (resumed["mean"], resumed["per_problem"]) == (whole["mean"], whole["per_problem"])
    assert resumed["source"] == "the testbed task's eval split, problems 0-15"


def test_by_default_each_run_is_evaluated_on_its_own_recipes_suites(trained):
    wanted = missing(trained, None, EVALS_RUN)  # the testbed's recipe scores its held-out split
    assert {(r.checkpoint, r.suite) for r in wanted} <= {(k, "heldout") for k in range(3)}
