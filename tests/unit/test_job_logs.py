"""slurm/logs.py on job records and fake log files: a 2-node × 2-task job's paths are submitit's, only
existing files are listed (task by task, stdout then stderr), --tail keeps the last lines, a job with no
file yet gets the note saying why, and the job picked is the last submitted of the stage asked for."""

from __future__ import annotations

from pathlib import Path

from submitit.core.utils import JobPaths

from slurm import logs
from slurm.tables import jobs_table


def _record(folder: Path | None, **fields: object) -> dict[str, object]:
    return {
        "executor": "slurm",
        "job_id": "4242",
        "state": "RUNNING",
        "folder": str(folder) if folder else None,
        "resources": {"nodes": 2, "tasks_per_node": 2},
        "update": 3,
        "stage": "sample",
        **fields,
    }


def test_a_multi_task_jobs_existing_files_in_task_order(tmp_path: Path):
    record = _record(tmp_path)
    assert logs.task_count(record) == 4
    for task in range(4):
        paths = JobPaths(tmp_path, job_id="4242", task_id=task)
        assert (logs.log_path(record, task), logs.log_path(record, task, "err")) == (
            paths.stdout,
            paths.stderr,
        )
    for task in (0, 1, 3):  # task 2 has written nothing yet, task 3 its stdout only
        (tmp_path / f"4242_{task}_log.out").write_text("".join(f"out {task} line {i}\n" for i in range(5)))
        if task != 3:
            (tmp_path / f"4242_{task}_log.err").write_text(f"err {task}\n")
    assert [p.name for p in logs.log_files(record)] == [
        "4242_0_log.out", "4242_0_log.err", "4242_1_log.out", "4242_1_log.err", "4242_3_log.out"
    ]  # fmt: skip
    assert [p.name for p in logs.log_files(record, task=1)] == ["4242_1_log.out", "4242_1_log.err"]

    text = logs.render(record, tail=2, task=3).splitlines()
    assert text == [
        "job 4242 (update 3, stage sample; slurm, RUNNING, 4 tasks)",
        f"==> {tmp_path / '4242_3_log.out'} <==",
        "out 3 line 3",
        "out 3 line 4",
    ]
    full = logs.render(record)
    assert full.count("==> ") == 5 and "out 0 line 0" in full and "err 1" in full


def test_no_file_yet_is_a_note_and_records_without_resources_have_one_task(tmp_path: Path):
    record = _record(tmp_path / "not-shared", resources={}, state="PENDING")
    assert logs.task_count(record) == 1 and logs.log_files(record) == []
    note = logs.render(record)
    assert note.startswith("no log files yet for job 4242 (update 3, stage sample; slurm, PENDING)")
    assert str(tmp_path / "not-shared") in note and "pending" in note and "does not share" in note


def test_the_job_picked_and_the_stages_named(tmp_path: Path):
    records = [
        _record(tmp_path, job_id=str(n), update=k, stage=stage, submitted_epoch=float(n))
        for n, (k, stage) in enumerate(
            [(0, "checkpoint"), (0, "sample"), (0, "sample"), (1, "sample"), (3, "sample")]
        )
    ]
    assert logs.pick_job(records, None, None)["job_id"] == "4"
    assert logs.pick_job(records[::-1], 0, "sample")["job_id"] == "2"  # the last submitted, in any order
    assert logs.pick_job(records, None, "checkpoint")["job_id"] == "0"
    assert logs.pick_job(records, 2, None) is None and logs.pick_job(records, None, "driver") is None
    assert logs.stages_with_jobs(records) == "checkpoint (update 0), sample (updates 0-1, 3)"


def test_the_jobs_table_ends_with_each_jobs_stdout_path(tmp_path: Path):
    table = jobs_table([_record(tmp_path), _record(None, job_id="7", update=4)], []).splitlines()
    assert table[0].split()[-1] == "log"
    assert table[1].split()[-1] == str(tmp_path / "4242_0_log.out") and table[2].split()[-1] == "-"
