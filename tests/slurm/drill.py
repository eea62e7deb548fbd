"""The preemption drill's moving parts: a driver (`probepo train --executor slurm`) in its own process, stage
jobs paused at named safe points (PROBEPO_PAUSE_AT), and what SLURM is told to do to them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from probepo.run.faults import PAUSE_ENV, PAUSE_MARK_ENV, PAUSE_RELEASE_ENV
from probepo.store import ArtifactStore

TIMEOUT_S = 240.0


def slurm(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
    return result.stdout


ACCOUNTED_AS_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def accounted_states(job_id: str, timeout_s: float = 60.0) -> list[str]:
    """The State of every record `sacct -D` keeps of the job, once its last one has ended. A job's result
    file is written before its batch script exits, so its accounting can still say RUNNING (or REQUEUED)
    for a moment after the caller has its result."""
    deadline = time.monotonic() + timeout_s
    while True:
        # a line a record: a state may hold spaces ("CANCELLED by 0")
        states = slurm("sacct", "-n", "-X", "-D", "-P", "-o", "State", "-j", job_id).splitlines()
        if states and states[-1].startswith(ACCOUNTED_AS_ENDED):
            return states
        assert time.monotonic() < deadline, f"job {job_id}: sacct still shows {states} after {timeout_s} s"
        time.sleep(0.5)


@dataclass
class Drill:
    """One run of the drill recipe on the cluster, and the hooks to act on its paused jobs."""

    store: ArtifactStore
    run_id: str
    folder: Path
    profile: Path
    config: object
    pause: tuple[str, ...] = ()
    executor: str = "slurm"
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def mark(self) -> Path:
        return self.folder / "paused"

    @property
    def release(self) -> Path:
        return self.folder / "release"

    def env(self) -> dict[str, str]:
        env = {**os.environ, PAUSE_MARK_ENV: str(self.mark), PAUSE_RELEASE_ENV: str(self.release)}
        if self.pause:
            env[PAUSE_ENV] = ",".join(self.pause)
        return env

    def _probepo(self, *args: str) -> subprocess.Popen:
        preset = self.folder / "drill.yaml"
        if not preset.exists():
            preset.write_text(yaml.safe_dump(self.config.model_dump(mode="json")))  # type: ignore[attr-defined]
        command = [sys.executable, "-m", "probepo.cli", *args]
        command += [
            "--store",
            self.store.url,
            "--executor",
            self.executor,
            "--profile",
            str(self.profile),
            "--quiet",
        ]
        command += ["--tensorboard", str(self.folder / "tb")]
        log = (self.folder / f"driver-{len(self.processes)}.log").open("w")
        process = subprocess.Popen(command, env=self.env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        self.processes.append(process)
        return process

    def train(self) -> subprocess.Popen:
        return self._probepo("train", str(self.folder / "drill.yaml"), "--run-id", self.run_id)

    def resume(self) -> subprocess.Popen:
        return self._probepo("resume", self.run_id)

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.folder.glob("driver-*.log")))

    def paused_at(self, point: str) -> int:
        """Wait until a stage job pauses at `point`; returns the pid of the paused process."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            if self.mark.exists():
                said = self.mark.read_text().split()
                if len(said) == 2 and said[1] == point:
                    self.mark.unlink()
                    return int(said[0])
            assert all(p.poll() is None for p in self.processes[-1:]), self.log()
            assert time.monotonic() < deadline, f"no job paused at {point}:\n{self.log()}"
            time.sleep(0.1)

    def job_id(self, update: int, stage: str) -> str:
        return self.store.jobs(self.run_id, update, stage)[-1]["job_id"]

    def wait_until_not_running(self, job_id: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while "RUNNING" in slurm("squeue", "-h", "-j", job_id, "-o", "%T"):
            assert time.monotonic() < deadline, f"job {job_id} still running"
            time.sleep(0.2)

    def node_down_under(self, job_id: str, node: str) -> None:
        """Set `node` DOWN under the running job until SLURM has taken the job off it (to requeue it), then
        back up."""
        slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=probepo-drill")
        try:
            self.wait_until_not_running(job_id)
        finally:
            slurm("scontrol", "update", f"nodename={node}", "state=resume")

    def finish(self) -> None:
        """The last driver ends the run successfully."""
        code = self.processes[-1].wait(timeout=TIMEOUT_S * 2)
        assert code == 0, self.log()

    def kill_driver(self) -> None:
        self.processes[-1].send_signal(signal.SIGKILL)
        self.processes[-1].wait(timeout=30)

    def submissions(self, update: int, stage: str) -> int:
        return len(self.store.jobs(self.run_id, update, stage))

    def check(self, baseline: dict[str, bytes]) -> None:
        """The run completed, no stage was committed twice, every update is there, and the final
        checkpoint is bitwise the inline run's."""
        final = self.store.read_stage(self.run_id, 1, "checkpoint")
        assert {name: final[name] for name in baseline} == baseline
        for update, stages in self.store.ledger_entries(self.run_id).items():
            for stage in stages:
                outcomes = [a["outcome"] for a in self.store.attempts(self.run_id, update, stage)]
                assert outcomes.count("committed") <= 1, (update, stage, outcomes)
        assert [m["update"] for m in self.store.read_metrics(self.run_id) if "sample/tokens" in m] == [0]
        assert {m["update"] for m in self.store.read_metrics(self.run_id)} == {0, 1}
