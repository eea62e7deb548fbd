"""What the nightly's artifact says of each (checkpoint, suite) (flows/evaluate.py: evaluation_row):
complete, resumed from an earlier task's shards, or pending with the shards kept so far, beside tonight's
job and the GPU-hours of every job that worked on it. The tasks themselves: tests/slurm/test_nightly.py;
the artifact of a maths night: tests/flows/test_evaluate_flow.py."""

from __future__ import annotations

from flows.evaluate import evaluation_row, gpu_hours
from probepo.run.evaluations import EvaluationRequest
from slurm.accounting import JobCost
from slurm.arrays import ItemOutcome

REQUEST = EvaluationRequest("s3://b/p", "grpo-7b", 40, "college_math")
COST = JobCost(job_id="9_3", gpus=1, cpus=8, elapsed_s=5400, gpu_seconds=5400, cpu_seconds=43200, records=2,
               state="COMPLETED")  # fmt: skip
EARLIER = JobCost(job_id="7_1", gpus=1, cpus=8, elapsed_s=1800, gpu_seconds=1800, cpu_seconds=14400,
                  records=1, state="TIMEOUT")  # fmt: skip


class Kept:
    """A store's view of one pair: its record, its kept shards and the jobs that worked on it."""

    def __init__(self, record: dict | None, shards: int = 0, jobs: tuple[str, ...] = ()) -> None:
        self.record, self.shards = record, [f"evaluate.college_math.shard-{i:04d}" for i in range(shards)]
        self.jobs = list(jobs)

    def evaluation(self, run_id: str, checkpoint: int, suite: str) -> dict | None:
        return self.record

    def evaluation_shard_names(self, run_id: str, checkpoint: int, suite: str) -> list[str]:
        return self.shards

    def evaluation_jobs(self, run_id: str, checkpoint: int, suite: str) -> list[str]:
        return self.jobs


def test_a_pair_is_complete_resumed_or_pending_with_the_gpu_hours_of_every_night():
    numbers = {"mean": 0.4166666, "stderr": 0.01, "k": 16, "jobs": ["9_3"], "at": "2026-12-02T02:41:07+00:00"}
    whole = evaluation_row(REQUEST, ItemOutcome(0, "9_3", "evaluated", cost=COST), Kept(numbers))  # type: ignore[arg-type]
    assert (whole["status"], whole["jobs"], whole["mean"]) == ("complete", ["9_3"], 0.4167)  # 4 digits
    assert whole["committed"] == numbers["at"]
    assert gpu_hours(whole["jobs"], {"9_3": COST}) == 1.5

    # resumed tonight from the shards of a task of two nights ago: both jobs' GPU-hours count
    resumed_record = {**numbers, "resumed_shards": 3, "shards": 8, "jobs": ["7_1", "9_3"]}
    resumed = evaluation_row(REQUEST, ItemOutcome(0, "9_3", "resumed", cost=COST), Kept(resumed_record))  # type: ignore[arg-type]
    assert resumed["status"] == "resumed: 3 of 8 shards kept before" and resumed["k"] == 16
    assert resumed["jobs"] == ["7_1", "9_3"] and resumed["job"] == "9_3"
    assert gpu_hours(resumed["jobs"], {"9_3": COST, "7_1": EARLIER}) == 2.0

    died = ItemOutcome(0, "9_3", error="killed", cost=COST)  # killed before it noted its job
    pending = evaluation_row(REQUEST, died, Kept(None, shards=5, jobs=("7_1",)))  # type: ignore[arg-type]
    assert (pending["status"], pending["outcome"], pending["jobs"]) == (
        "pending: 5 shards kept",
        "failed",
        ["7_1", "9_3"],
    )
    assert "mean" not in pending
    assert gpu_hours(pending["jobs"], {"9_3": COST}) == 1.5  # accounting forgot the earlier job
    taken = evaluation_row(REQUEST, ItemOutcome(0, None, "reused"), Kept({**numbers, "jobs": []}))  # type: ignore[arg-type]
    assert taken["jobs"] == [] and gpu_hours(taken["jobs"], {"9_3": COST}) is None


class Evaluated:
    def __init__(self, means: dict[str, float]) -> None:
        self.means = means

    def evaluations(self, run_id: str) -> dict:
        return {(40, suite): {"mean": mean} for suite, mean in self.means.items()}


def test_a_checkpoint_with_all_six_benchmarks_gets_its_avg6():
    from flows.evaluate import avg6_rows
    from probepo.data.benchmarks import AVG6_BENCHMARKS

    six = {name: 0.1 * (i + 1) for i, name in enumerate(AVG6_BENCHMARKS)}
    (row,) = avg6_rows([REQUEST, REQUEST], {REQUEST.store_url: Evaluated(six)})  # type: ignore[dict-item]
    assert row["suite"] == "avg6" and abs(row["mean"] - 0.35) < 1e-12
    five = dict(list(six.items())[:5])
    assert avg6_rows([REQUEST], {REQUEST.store_url: Evaluated(five)}) == []  # type: ignore[dict-item]
