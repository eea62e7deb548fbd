"""A cancelled train flow run's line (flows/train.py: cancel_line) stays its final state message: set again
over the generic one Prefect's runner sets after the flow's process has exited (flows/cancelled.py:
restore), and nothing else is touched. Against the real worker and UI: tests/flows/test_ui.py."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

from prefect.states import Cancelled, Cancelling, Crashed, Running

from flows.cancelled import restore
from flows.runner import task_name
from flows.train import cancel_line
from probepo.run.execution import StageRequest
from probepo.run.schedule import Stage

OURS = "run r1 cancelled; jobs ended: 12, 13; to go on, run the resume deployment with run_id r1"
RUNNERS = "Flow run was cancelled successfully."


class Server:
    """A flow run's states as the server answers them, one per read (the last one from then on), and the
    states set on it."""

    def __init__(self, *states: object) -> None:
        self.states, self.set = list(states), []

    def read_flow_run(self, flow_run_id: object) -> SimpleNamespace:
        return SimpleNamespace(state=self.states.pop(0) if len(self.states) > 1 else self.states[0])

    def set_flow_run_state(self, flow_run_id: object, state: object, force: bool) -> None:
        self.set.append((state, force))


class Clock:
    """A monotonic clock that sleeping moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _restored(server: Server, within_s: float = 120.0) -> bool:
    clock = Clock()
    return restore(server, uuid4(), OURS, within_s=within_s, clock=clock, sleep=clock.sleep)


def test_the_line_is_set_again_once_the_runner_has_set_its_own():
    server = Server(
        Cancelling(), Cancelled(message=OURS), Cancelled(message=OURS), Cancelled(message=RUNNERS)
    )
    assert _restored(server)
    [(state, force)] = server.set
    assert state.is_cancelled() and state.message == OURS and force  # forced, as the runner's was


def test_nothing_is_set_over_another_end_or_once_the_wait_is_over():
    crashed = Server(Cancelled(message=OURS), Crashed(message="the runner could not persist Cancelled"))
    assert not _restored(crashed) and crashed.set == []
    never = Server(Running())  # a runner that never ends it
    assert not _restored(never, within_s=5) and never.set == []
    kept = Server(Cancelled(message=OURS))  # no runner's state after ours
    assert not _restored(kept, within_s=5) and kept.set == []


def test_the_line_says_what_ended_which_jobs_and_how_to_go_on():
    assert cancel_line("r1", None, ["12", "13"]) == OURS
    with_warm_up = cancel_line("r2", "warmup-ab12", [])
    assert with_warm_up.startswith(
        "run r2 cancelled with the warm-up warmup-ab12 it was making; jobs ended: none;"
    )


def test_the_warm_ups_task_run_is_named_as_such():
    def request(stage: Stage) -> StageRequest:
        return StageRequest("/store", "r1", 0, stage, "{}")

    assert task_name(request(Stage.WARMUP), "41") == "warm-up · job 41"
    assert task_name(request(Stage.WARMUP)) == "warm-up"
    assert task_name(request(Stage.SAMPLE), "42") == "sample · update 0 · job 42"
