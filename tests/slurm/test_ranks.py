"""Generation over the ranks of a job, on the real SLURM cluster with its fake GPU gres: sample, probe and
evaluate split their engine calls over 1, 2 or 3 ranks (each rank its own engine, on its own GPU), a call a
chunk or the chunks dealt into 2 calls (sampling.shards), commit the same bits, and grade each answer on one
rank only; a preempted 2-rank sample keeps the chunks one rank committed, and its next attempt, on 2 ranks
or on 1, makes only the missing ones.

The fake GPUs are /dev/null devices: nothing computes on them, but SLURM hands them out as it would real
ones (CUDA_VISIBLE_DEVICES per task), and each rank records, in every shard it commits, the GPU it was given
and the index its engines were built on."""

from __future__ import annotations

import time

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from probepo.run.pipeline import train
from probepo.store import ArtifactStore
from probepo.store.formats import table_from_parquet, tensors_from_bytes
from tests.pipeline.conftest import tiny_config
from tests.pipeline.test_trees import TREE_FIELDS, tree_config
from tests.slurm.conftest import drill_config
from tests.slurm.drill import TIMEOUT_S, Drill, slurm
from tests.slurm.test_drill import preempt_with_a_high_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

GENERATED = {"sample": "rollouts.parquet", "probe": "values.safetensors", "evaluate": "eval.parquet"}
LOW = StageResources(partition="low", time_min=15, signal_grace_s=30)


def ranks_config(shards: int | None = None):
    """The drill recipe with 4 rows per chunk: 4 chunks of sample, one probe prefix per chunk, one eval
    problem per chunk, so every rank has several chunks to make; `shards`: the engine calls they are dealt
    into (None: a call per chunk)."""
    return drill_config(sampling={**tiny_config().sampling.model_dump(), "batch_rows": 4, "shards": shards})


def write_profile(folder, stages: dict[str, StageResources]):
    profile = ExecutionProfile(
        job_folder=str(folder / "jobs"), poll_s=0.3, poll_max_s=0.3, defaults=LOW, stages=stages
    )
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json", exclude_defaults=True)))
    return path


def on_gpus(tasks: int, **gpus: int) -> StageResources:
    return LOW.model_copy(update={"tasks_per_node": tasks, **gpus})


@pytest.fixture(scope="module")
def inline_ranks(warm_store: ArtifactStore) -> str:
    """The recipe trained inline: one process, one rank, no GPU."""
    train(ranks_config(), "ranks-inline", store=warm_store)
    return "ranks-inline"


def generated(store: ArtifactStore, run_id: str) -> dict[tuple[int, str], bytes]:
    """What the generating stages committed (and the final policy), by (update, stage)."""
    found = {
        (update, stage): store.read_stage(run_id, update, stage)[name]
        for update, stages in store.ledger_entries(run_id).items()
        for stage, name in GENERATED.items()
        if stage in stages
    }
    found[(1, "checkpoint")] = store.read_stage(run_id, 1, "checkpoint")["model.safetensors"]
    return found


def shards(store: ArtifactStore, run_id: str, stage: str) -> list[dict]:
    """The summaries of every shard of `stage` (any update, any call)."""
    return [
        store.marker(run_id, update, name)["summary"]
        for update, names in store.ledger_entries(run_id).items()
        for name in names
        if name.startswith(f"{stage}.") and ".shard-" in name
    ]


def test_generation_is_the_same_bits_on_one_two_and_three_ranks(
    warm_store, inline_ranks, tmp_path, slurm_cluster
):
    every = on_gpus(3, gpus_per_node=3)
    runs = {  # run id → (executor, the stages' resources, ranks per generating stage, engine calls)
        "ranks-resident-2": (
            "resident",
            {"driver": on_gpus(2, gpus_per_node=2)},
            dict.fromkeys(GENERATED, 2),
            None,
        ),
        "ranks-resident-3": ("resident", {"driver": every}, dict.fromkeys(GENERATED, 3), None),
        # the chunks dealt into 2 engine calls a step: on the lockstep engines the same bits as a call each
        "ranks-resident-3-calls": ("resident", {"driver": every}, dict.fromkeys(GENERATED, 3), 2),
        "ranks-stage-jobs": (
            "slurm",
            # generation alone may take one GPU per task; the trainer's stages stay on one rank here
            {"sample": on_gpus(2, gpus_per_node=2), "probe": on_gpus(3, gpus_per_task=1), "evaluate": every},
            {"sample": 2, "probe": 3, "evaluate": 3},
            None,
        ),
    }
    drills = []
    for run_id, (executor, stages, _, calls) in runs.items():
        folder = tmp_path / run_id
        folder.mkdir()
        drill = Drill(warm_store, run_id, folder, write_profile(folder, stages), ranks_config(calls))
        drill.executor = executor
        drill.train()
        drills.append(drill)
    for drill in drills:
        drill.finish()

    reference = generated(warm_store, inline_ranks)
    assert len(reference) == 5  # sample, probe, evaluate of updates 0 and 1, the final policy
    for run_id, (_, _, ranks, calls) in runs.items():
        assert generated(warm_store, run_id) == reference, run_id
        for stage, world in ranks.items():
            made = shards(warm_store, run_id, stage)
            assert made and all(0 <= shard["rank"] < world for shard in made), (run_id, stage)
            if calls is not None:  # a shard a call: `calls` of them per step
                assert len(made) % calls == 0 and {s["prefixes"] for s in made} != {1}, (run_id, stage)
            assert_graded_once(warm_store, run_id, stage, world)
            # each rank on a GPU of its own (jobs running side by side hold different GPUs of the node):
            # visible GPU r of the job's (gpus_per_node), or the one GPU its task sees (gpus_per_task)
            gpus = {shard["rank"]: (shard["gpu"], shard["gpu_index"]) for shard in made}
            assert len({gpu for gpu, _ in gpus.values()}) == len(gpus), (run_id, stage, gpus)
            per_task = run_id == "ranks-stage-jobs" and stage == "probe"
            assert all(index == (0 if per_task else rank) for rank, (_, index) in gpus.items()), gpus
    inline = shards(warm_store, inline_ranks, "sample")
    assert {(s["rank"], s["gpu"]) for s in inline} == {(0, None)}  # no GPU on this machine


def assert_graded_once(store: ArtifactStore, run_id: str, stage: str, world: int) -> None:
    """Each answer of the committed attempts of `stage` was graded by one rank: every rank notes its count,
    and the counts sum to the rows graded (sample's rollouts, probe's continuations), as even as can be."""
    for update, stages in store.ledger_entries(run_id).items():
        if stage not in stages:
            continue
        graded = store.attempts(run_id, update, stage)[-1]["graded"]
        assert len(graded) == world, (run_id, update, stage, graded)
        if stage in ("sample", "probe"):  # one grading call: the counts differ by one at most
            assert max(graded) - min(graded) <= 1, (run_id, update, stage, graded)
        if stage == "sample":
            rows = len(table_from_parquet(store.read_stage(run_id, update, stage)[GENERATED[stage]])["group"])
            assert sum(graded) == rows, (run_id, update, graded, rows)
        if stage == "probe":
            trials = tensors_from_bytes(store.read_stage(run_id, update, stage)[GENERATED[stage]])["trials"]
            assert sum(graded) == int(trials.sum()), (run_id, update, graded)


@pytest.mark.parametrize("algorithm", sorted(TREE_FIELDS))
def test_a_tree_grows_the_same_bits_on_two_ranks_and_grades_each_leaf_once(
    algorithm, warm_store, tmp_path, slurm_cluster
):
    """The tree baselines' engine calls (SPO-tree's levels, TreePO's steps) split over the ranks like
    sample's chunks: the trees, the rollouts and the final policy are the inline run's bits, and every
    leaf is graded by one rank."""
    tree = tree_config(algorithm)
    config = ranks_config().model_copy(update={"algo": tree.algo})
    inline, resident = f"ranks-{algorithm}-inline", f"ranks-{algorithm}-resident-2"
    train(config, inline, store=warm_store)
    folder = tmp_path / resident
    folder.mkdir()
    profile = write_profile(folder, {"driver": on_gpus(2, gpus_per_node=2)})
    drill = Drill(warm_store, resident, folder, profile, config)
    drill.executor = "resident"
    drill.train()
    drill.finish()
    # the trees (tree.parquet) and the rollouts, then every generating stage and the final policy
    assert warm_store.read_stage(resident, 0, "sample") == warm_store.read_stage(inline, 0, "sample")
    assert generated(warm_store, resident) == generated(warm_store, inline)
    levels = shards(warm_store, resident, "sample")
    assert {shard["rank"] for shard in levels} == {0, 1}  # both ranks grew the trees
    assert_graded_once(warm_store, resident, "sample", 2)


def preempted_two_rank_sample(warm_store, tmp_path, run_id: str) -> Drill:
    """A run whose sample stage (2 ranks) is preempted once one rank has committed chunk 1 and the other
    holds chunk 0, claimed and not decoded; returns the drill once the preemption is recorded."""
    folder = tmp_path / run_id
    folder.mkdir()
    profile = write_profile(folder, {"sample": on_gpus(2, gpus_per_node=2)})
    drill = Drill(warm_store, run_id, folder, profile, ranks_config())
    # whichever rank claims chunk 0 waits there; the other makes chunk 1 and waits on claiming chunk 2
    drill.pause = ("0:sample.shard-0000:claimed", "0:sample.shard-0002:claimed")
    drill.train()
    drill.paused_at("0:sample.shard-0002:claimed")
    assert warm_store.committed(run_id, 0, "sample.shard-0001")
    preempt_with_a_high_job()
    deadline = time.monotonic() + TIMEOUT_S
    while "preempted" not in [a["outcome"] for a in warm_store.attempts(run_id, 0, "sample")]:
        assert time.monotonic() < deadline, drill.log()
        time.sleep(0.2)
    committed = [s for s in warm_store.committed_stages(run_id, 0) if s.startswith("sample.")]
    assert committed == ["sample.shard-0001"]  # the rank holding chunk 0 committed nothing
    return drill


def test_a_preempted_two_rank_sample_resumes_with_only_the_missing_chunks(
    warm_store, inline_ranks, tmp_path, slurm_cluster
):
    drill = preempted_two_rank_sample(warm_store, tmp_path, "ranks-preempted")
    first = warm_store.marker("ranks-preempted", 0, "sample.shard-0001")["summary"]
    drill.release.touch()  # the requeued job (the same id) goes on without pausing
    drill.finish()
    assert generated(warm_store, "ranks-preempted") == generated(warm_store, inline_ranks)
    attempts = warm_store.attempts("ranks-preempted", 0, "sample")
    assert [a["outcome"] for a in attempts] == ["preempted", "committed"]
    assert attempts[-1]["resumed_shards"] == 1 and drill.submissions(0, "sample") == 1
    again = shards(warm_store, "ranks-preempted", "sample")
    assert len(again) == 4 and [s["pid"] for s in again].count(first["pid"]) == 1  # chunk 1 made once


def test_a_preempted_two_rank_sample_resumes_on_one_rank(warm_store, inline_ranks, tmp_path, slurm_cluster):
    drill = preempted_two_rank_sample(warm_store, tmp_path, "ranks-to-one")
    drill.kill_driver()
    job = drill.job_id(0, "sample")
    slurm("scancel", job)  # the requeued job, pending or paused again at its claims: it commits nothing
    deadline = time.monotonic() + TIMEOUT_S
    while slurm("squeue", "-h", "-j", job, "-o", "%T").strip():
        assert time.monotonic() < deadline, f"job {job} still in the queue"
        time.sleep(0.2)
    train(ranks_config(), "ranks-to-one", store=warm_store)  # inline: one rank, here
    assert generated(warm_store, "ranks-to-one") == generated(warm_store, inline_ranks)
    resumed = warm_store.attempts("ranks-to-one", 0, "sample")[-1]
    assert resumed["outcome"] == "committed" and resumed["resumed_shards"] == 1 and resumed["shards_run"] == 3
