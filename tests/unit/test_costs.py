"""GPU-hours from SLURM's accounting, on sacct text recorded on the test cluster (`sacct -D -X -a -n -P -o
JobID,AllocTRES,ElapsedRaw,State,Submit` with SLURM_TIME_FORMAT=%s): every record of a requeued job
counted, array tasks by their own id, never-started array tasks and a record cancelled while pending
costing nothing, an earlier job of a reused id left out; then how a run's costs are shared out over its
updates and stages (a resident driver job by its stages' wall time), and what the tables say."""

from __future__ import annotations

import pytest

from probepo.report.costs import RunCosts, StageCost
from slurm.accounting import JobCost, parse_costs
from slurm.costs import attribute, costs_table, stage_totals
from slurm.tables import duration, jobs_table

RECORDED = """\
1279_0|billing=1,cpu=1,gres/gpu=1,mem=256M,node=1|2|COMPLETED|1796326902
1279_1|billing=1,cpu=1,gres/gpu=1,mem=256M,node=1|2|COMPLETED|1796326902
1279_[2-3%2]||0|PENDING|1796326902
1280|billing=2,cpu=2,gres/gpu=2,mem=512M,node=1|1|REQUEUED|1796326902
1280|billing=2,cpu=2,gres/gpu=2,mem=512M,node=1|3|COMPLETED|1796326904
1259|billing=2,cpu=2,gres/gpu=2,mem=512M,node=1|2|REQUEUED|1796326547
1259||0|CANCELLED by 0|1796326549
1272|billing=16,cpu=16,gres/gpu=8,mem=4G,node=1|1|COMPLETED|1796326201
95|billing=1,cpu=1,mem=256M,node=1|3|NODE_FAIL|1796315938
95|billing=1,cpu=1,mem=256M,node=1|3|COMPLETED|1796315942
"""


def test_every_record_of_a_job_is_paid_for():
    costs = parse_costs(RECORDED)
    assert set(costs) == {"1279_0", "1279_1", "1280", "1259", "1272", "95"}  # no `1279_[2-3%2]`
    assert costs["1280"] == JobCost(
        "1280", gpus=2, cpus=2, elapsed_s=4, gpu_seconds=8, cpu_seconds=8, records=2, state="COMPLETED"
    )
    assert costs["1280"].gpu_hours == 8 / 3600
    assert costs["1279_1"].gpus == 1 and costs["1279_1"].gpu_seconds == 2
    # requeued, then cancelled while pending: the second record allocated nothing
    assert (costs["1259"].gpu_seconds, costs["1259"].records, costs["1259"].state) == (4, 2, "CANCELLED")
    assert (costs["1272"].gpus, costs["1272"].cpu_seconds) == (8, 16)
    assert (costs["95"].gpus, costs["95"].cpu_seconds) == (0, 6)  # a CPU job: no gres/gpu


def test_an_earlier_job_with_the_same_id_is_left_out():
    later = 1796315942 + 2 * 3600  # the store submitted job 95 two hours after these records
    assert "95" not in parse_costs(RECORDED, {"95": later})
    assert parse_costs(RECORDED, {"1280": 1796326903})["1280"].records == 2  # its requeue is not earlier


def _job(job_id: str, update: int, stage: str, executor: str = "slurm", **fields: object) -> dict:
    return {"job_id": job_id, "update": update, "stage": stage, "executor": executor, **fields}


def _cost(job_id: str, gpus: int, elapsed_s: int, cpus: int = 1) -> JobCost:
    return JobCost(job_id, gpus, cpus, elapsed_s, gpus * elapsed_s, cpus * elapsed_s, 1, "COMPLETED")


def test_stage_jobs_count_for_their_stage_and_local_jobs_for_nothing():
    records = [
        _job("10", 0, "sample"),
        _job("11", 0, "optimize", resources={"gpus_per_node": 2}),
        _job("11", 0, "optimize"),  # the same job under a second record: paid once
        _job("12", 1, "evaluate"),
        _job("4242", 1, "sample", executor="local"),
        _job("13", 1, "optimize"),  # not in accounting yet
    ]
    costs = {"10": _cost("10", 1, 360), "11": _cost("11", 2, 900), "12": _cost("12", 1, 36)}
    metrics = [
        {"update": 0, "sample/wall_s": 300.0, "optimize/wall_s": 850.0},
        {"update": 1, "evaluate/wall_s": 30},
    ]
    run = attribute("r", records, costs, [], metrics)
    assert (run.jobs, run.accounted_jobs, run.wall_time_only) == (5, 3, False)
    by_pair = {(c.update, c.stage): c for c in run.stages}
    assert by_pair[0, "sample"] == StageCost(0, "sample", 0.1, 0.1, 300.0)
    assert by_pair[0, "optimize"].gpu_hours == 0.5 and by_pair[1, "evaluate"].gpu_hours == 0.01
    assert run.gpu_hours == pytest.approx(0.61) and run.training_gpu_hours(0) == pytest.approx(0.6)
    assert run.training_gpu_hours(1) == 0.0  # evaluations are not training
    assert [c.stage for c in stage_totals(run)] == ["evaluate", "sample", "optimize", "run"]
    assert any("jobs 13" in note for note in run.notes) and any(
        "1 job(s) of the local" in n for n in run.notes
    )
    table = costs_table(run).splitlines()
    assert table[0].split() == ["stage", "GPU-h", "CPU-h", "wall", "(s)"]
    assert table[4].split() == ["run", "0.6100", "0.3600", "1180.0"]


def test_a_resident_driver_job_is_shared_out_by_its_stages_wall_time():
    attempts = [
        {"job_id": "20", "update": 0, "stage": "sample"},
        {"job_id": "20", "update": 0, "stage": "optimize"},
        {"job_id": "20", "update": 0, "stage": "optimize"},  # preempted, then committed
        {"job_id": "20", "update": 1, "stage": "sample"},
        {"job_id": "7", "update": 5, "stage": "sample"},  # another job's
    ]
    metrics = [
        {"update": 0, "sample/wall_s": 10.0, "optimize/wall_s": 20.0},
        {"update": 1, "sample/wall_s": 10.0},
    ]
    run = attribute("r", [_job("20", 0, "driver")], {"20": _cost("20", 8, 3600)}, attempts, metrics)
    shares = {(c.update, c.stage): c.gpu_hours for c in run.stages}
    assert shares == {(0, "sample"): 2.0, (0, "optimize"): 4.0, (1, "sample"): 2.0}
    assert run.gpu_hours == 8.0 and "split over them in proportion to their wall time" in run.notes[0]
    # no wall time recorded (a driver that committed nothing yet): all to the driver's own record
    alone = attribute("r", [_job("20", 0, "driver")], {"20": _cost("20", 8, 3600)}, [], [])
    assert [(c.update, c.stage, c.gpu_hours) for c in alone.stages] == [(0, "driver", 8.0)]


def test_without_accounting_a_run_reports_wall_time_only():
    metrics = [{"update": 0, "sample/wall_s": 1.5, "optimize/wall_s": 2.5}]
    inline = attribute("r", [], {}, [], metrics)
    assert inline.wall_time_only and inline.jobs == 0 and inline.gpu_hours == 0.0
    assert costs_table(inline).splitlines() == [
        "stage     wall (s)", "sample    1.5", "optimize  2.5", "run       4.0"
    ]  # fmt: skip
    silent = attribute("r", [_job("10", 0, "sample")], None, [], metrics)
    assert silent.wall_time_only and "did not answer" in silent.notes[0]
    untracked = attribute(
        "r", [_job("10", 0, "sample", resources={"gpus_per_task": 1})], {"10": _cost("10", 0, 60)}, [], []
    )
    assert "AccountingStorageTRES lacks gres/gpu" in untracked.notes[0]
    assert RunCosts("r").wall_time_only


def test_the_jobs_table_shows_each_jobs_accounted_cost():
    requeued = JobCost("1280", 2, 2, 4, 8, 8, 2, "COMPLETED")
    records = [
        _job("1280", 0, "optimize", state="COMPLETED"),
        _job("77", 0, "sample", "local", state="COMPLETED", elapsed="0:05"),
    ]
    header, optimize, sample = (
        line.split() for line in jobs_table(records, [], {"1280": requeued}).splitlines()
    )
    assert header[6:11] == ["elapsed", "runs", "GPUs", "GPU-h", "CPU-h"]
    assert optimize[6:11] == ["00:00:04", "2", "2", "0.0022", "0.0022"]
    assert sample[6:11] == ["0:05", "-", "-", "-", "-"]
    assert duration(2 * 86400 + 3661) == "2-01:01:01"
