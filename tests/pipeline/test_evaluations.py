"""Checkpoints evaluated after the fact (probepo/run/evaluations.py): the selected pairs that lack an
evaluation, each committed create-only beside its run, the same numbers as the run's own evaluate stage
(which are taken instead where the run made them), from the weights alone."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from probepo.config import CheckpointSelection, Retention
from probepo.data.benchmarks import AVG6_BENCHMARKS, BENCHMARKS
from probepo.presets import load_run_config
from probepo.run.evaluations import EvaluationRequest, adopt_run_evaluation, evaluate_checkpoint, missing
from probepo.run.pipeline import run_record, train
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext
from probepo.stages.evaluate import benchmark_suite
from probepo.stages.warmup import warmup_run_id
from probepo.store import open_store
from probepo.store.retention import apply_retention
from probepo.store.store import ArtifactStore
from slurm.arrays import run_array
from slurm.backends import chunks
from tests.data.test_benchmarks import needs_shared
from tests.pipeline.conftest import tiny_config

EVALS_RUN = CheckpointSelection(runs=("evals-run",))
MATH_RECIPE = Path(__file__).resolve().parents[2] / "configs" / "r1-distill-qwen-1.5b.yaml"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "trainer.json", "optimizer.safetensors")


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
        # a glob of this test's own: the session's warm store holds other modules' runs (nightly-b)
        found = missing(trained, ["heldout"], CheckpointSelection(runs=("select-a", "sel*-b"), **fields))
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


@pytest.fixture(scope="module")
def sharded(warm_store) -> ArtifactStore:
    """Two runs of one recipe whose evaluations are four engine calls each (batch rows 4 over 16 problems),
    evaluated in the run at policies 0 and 2 only."""
    from probepo.config import RunConfig

    sampling = {**RunConfig().sampling.model_dump(), "batch_rows": 4}
    evaluated_at_ends = {**tiny_config().eval.model_dump(), "every": 10}
    for run_id in ("shards-a", "shards-b"):
        config = tiny_config(store=warm_store.url, sampling=sampling, eval=evaluated_at_ends)
        train(config, run_id, store=warm_store)
    return warm_store


def _in_array_task(monkeypatch, job: str) -> None:
    array, task = job.split("_")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", array)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)


def test_a_stopped_evaluation_keeps_its_shards_and_resumes_to_an_uninterrupted_ones_bits(
    sharded, monkeypatch
):
    """Stopped after the first of its four engine calls, that one is kept; a torn shard is named with what
    to do; the next run makes only what is missing, and the numbers equal those of a twin run's
    uninterrupted evaluation. The record names every array task that worked on it (their GPU-hours)."""
    from probepo.run.preemption import Preempted

    stopped = EvaluationRequest(sharded.url, "shards-a", 1, "heldout")
    kept = lambda: sharded.evaluation_shard_names("shards-a", 1, "heldout")  # noqa: E731
    _in_array_task(monkeypatch, "7_1")
    with pytest.raises(Preempted, match="1 of 4 shards committed") as raised:
        evaluate_checkpoint(stopped, should_stop=lambda: len(kept()) >= 1)
    assert raised.value.progressed and kept() == ["evaluate.heldout.shard-0000"]
    assert sharded.evaluation("shards-a", 1, "heldout") is None
    assert not any(name.startswith("evaluate.") for name in sharded.committed_stages("shards-a", 1))
    shard = (
        Path(sharded.url)
        / "runs/shards-a/evaluation-shards/000001/heldout/evaluate.heldout.shard-0000.parquet"
    )
    made = shard.read_bytes()
    shard.write_bytes(b"torn")
    _in_array_task(monkeypatch, "8_0")
    with pytest.raises(
        RuntimeError, match=r"shard-0000 of update 1 of run shards-a is unreadable .*: delete it"
    ):
        evaluate_checkpoint(stopped)
    shard.write_bytes(made)
    _in_array_task(monkeypatch, "9_3")
    assert evaluate_checkpoint(stopped) == "resumed" and kept() == []  # the shards go with the commit
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name)
    twin = EvaluationRequest(sharded.url, "shards-b", 1, "heldout")
    assert evaluate_checkpoint(twin) == "evaluated"
    resumed, whole = (
        sharded.evaluation("shards-a", 1, "heldout"),
        sharded.evaluation("shards-b", 1, "heldout"),
    )
    # the attempt that met the torn shard had made the other three: all four were kept before
    assert (resumed["resumed_shards"], resumed["shards"], whole["resumed_shards"]) == (4, 4, 0)
    assert (resumed["mean"], resumed["per_problem"]) == (whole["mean"], whole["per_problem"])
    assert resumed["source"] == "the testbed task's eval split, problems 0-15"
    assert (resumed["jobs"], whole["jobs"]) == (["7_1", "8_0", "9_3"], [])


def test_an_evaluation_whose_shards_a_concurrent_one_dropped_ends_as_existing(sharded):
    """An on-demand evaluation beside the nightly's task of the same pair: the other commits it and drops
    the shards while this one still reads them, and this one returns `exists`, leaving no shard behind."""
    from probepo.run.preemption import Preempted

    request = EvaluationRequest(sharded.url, "shards-a", 2, "heldout")
    kept = lambda: sharded.evaluation_shard_names("shards-a", 2, "heldout")  # noqa: E731
    with pytest.raises(Preempted):
        evaluate_checkpoint(request, should_stop=lambda: len(kept()) >= 1)  # shard 0 kept
    outcomes = []

    def the_other_commits_first() -> bool:  # this one has listed shard 0 as made: it will read it
        if not outcomes:
            outcomes.append(evaluate_checkpoint(request))
        return False

    assert evaluate_checkpoint(request, should_stop=the_other_commits_first) == "exists"
    assert outcomes == ["resumed"] and kept() == []
    assert sharded.evaluation("shards-a", 2, "heldout")["resumed_shards"] == 1  # the other's record stands


def math_run(store: ArtifactStore, run_id: str, updates: Sequence[int], evaluated_in_run: Sequence[int] = ()):
    """A maths run as the store holds it once trained, made without a model: the R1-Distill recipe (its
    `eval.benchmarks`: the study's six), a full checkpoint at each of `updates`, and its evaluate stage's
    numbers on the six (mean 0.1, 0.2, ... in AVG6_BENCHMARKS' order) at each of `evaluated_in_run`."""
    config = load_run_config(MATH_RECIPE)
    store.create_run(run_id, run_record(config))
    for update in updates:
        weights = {name: f"{name} of policy {update}".encode() for name in CHECKPOINT_FILES}
        store.commit_stage(run_id, update, Stage.CHECKPOINT, weights)
    numbers = {}
    for i, name in enumerate(AVG6_BENCHMARKS):
        scored = {"mean": 0.1 * (i + 1), "stderr": 0.01, "problems": 30, "k": BENCHMARKS[name].mean_at_k}
        numbers.update({f"{name}/{key}": value for key, value in scored.items()})
    for update in evaluated_in_run:
        tables = {f"eval-{name}.parquet": b"" for name in AVG6_BENCHMARKS}
        store.commit_stage(run_id, update, Stage.EVALUATE, tables, summary=numbers)
    return config


def test_by_default_each_run_is_evaluated_on_its_own_recipes_suites(trained, tmp_path):
    train(tiny_config(num_updates=2, store=trained.url), "evals-default", store=trained)  # policies 0-2
    testbed = missing(trained, None, CheckpointSelection(runs=("evals-default",)))
    assert {(r.checkpoint, r.suite, r.from_run) for r in testbed} == {(k, "heldout", True) for k in range(3)}

    store = open_store(tmp_path / "store")  # its own: no nightly elsewhere may meet these weights
    math_run(store, "evals-math", updates=(0, 1), evaluated_in_run=(0,))
    maths = missing(store, None)  # its eval.benchmarks: the six
    assert {(r.checkpoint, r.suite, r.from_run) for r in maths} == {
        (k, name, k == 0) for k in (0, 1) for name in AVG6_BENCHMARKS
    }
    asked = missing(store, ["heldout"])  # its eval split, where asked for: not what it scores
    assert [(r.checkpoint, r.suite, r.from_run) for r in asked] == [(k, "heldout", False) for k in (0, 1)]


@needs_shared
def test_a_maths_recipes_benchmarks_are_evaluated_at_the_studys_k(tmp_path):
    store = open_store(tmp_path / "store")
    config = math_run(store, "evals-math-k", updates=(0,))
    ctx = StageContext(store, "evals-math-k", 0, config, tmp_path)
    found = {name: (len(suite.problems), suite.k) for name in AVG6_BENCHMARKS
             if (suite := benchmark_suite(ctx, name))}  # fmt: skip
    assert found == {"math500": (500, 16), "olympiadbench": (675, 16), "college_math": (2818, 16),
                     "amc23": (40, 16), "minerva_math": (272, 16), "aime24": (30, 32)}  # fmt: skip


def test_gc_removes_the_shards_no_evaluation_will_read(tmp_path):
    """`store gc`: the shards of a committed evaluation go (its task died before dropping them), and those of
    a checkpoint whose weights were deleted unevaluated once old enough; a pending evaluation's stay."""
    store = open_store(tmp_path / "store")
    math_run(store, "gc-math", updates=(0, 1, 2, 3))
    apply_retention(store, "gc-math", Retention(optimizer_last=1, weights_every=2))  # 1 keeps no weights
    for update, suite in ((0, "math500"), (1, "aime24"), (2, "amc23")):
        store.commit_evaluation_shard("gc-math", update, suite, f"evaluate.{suite}.shard-0000", b"samples")
    store.record_evaluation_job("gc-math", 1, "aime24", "7_1")
    store.record_evaluation("gc-math", 0, "math500", {"mean": 0.5})
    young = store.gc("gc-math")
    assert (young.removed, young.kept_young) == (
        ["evaluation-shards/000000/math500/"],
        ["evaluation-shards/000001/aime24/"],
    )
    assert store.gc("gc-math", min_age_s=0).removed == ["evaluation-shards/000001/aime24/"]
    left = [info.key for info in store.objects.list("runs/gc-math/evaluation-shards/")]
    assert left == ["runs/gc-math/evaluation-shards/000002/amc23/evaluate.amc23.shard-0000.parquet"]
    assert store.gc("gc-math", min_age_s=0).removed == []  # the next night resumes from it
