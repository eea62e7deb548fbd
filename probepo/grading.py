"""Grading math answers with math-verify 0.9.0, safely (NOTES.md "math-verify 0.9.0").

Rules: only a `\\boxed{...}` (or `\\fbox{...}`) answer earns a reward; the last complete box within the last
`TAIL_CHARS` characters of the completion counts; it is compared with the gold answer by math-verify
(`verify(gold, pred)`, gold first). No box, a wrong answer, a timeout, running out of memory or a crashed
worker all score 0.0; `grade_with_reasons` says which of these it was.

Why worker processes: math-verify's own timeouts use `signal.alarm` (main thread only, and they cancel any
outer SIGALRM), and an adversarial answer can keep a process busy inside C code where no signal handler
runs. So each answer is graded in a small pool of worker processes, each under an address-space cap; the
parent waits on pipes with a deadline (no signals, so any thread may call `grade`), SIGKILLs a worker that
misses it and starts a replacement.

Why plain subprocesses rather than a multiprocessing start method: spawn and forkserver re-import the
parent's `__main__` into the children (a training script that imports torch at the top would load torch
into every worker, and RLIMIT_AS would then break it), and fork copies a process that may hold threads and
CUDA state. A worker here is a fresh interpreter that runs this file as a script, so it imports nothing
but the standard library and math_verify (~0.6 s to start and warm up).
"""

from __future__ import annotations

import atexit
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import Connection, Pipe, wait
from typing import Literal, get_args

__all__ = ["MEMORY_CAP_BYTES", "REASONS", "TAIL_CHARS", "Reason", "grade", "grade_with_reasons"]

TAIL_CHARS = 4096
"""Only the last this many characters of a completion are searched for the answer box."""

MEMORY_CAP_BYTES = 2 << 30
"""Address-space cap (RLIMIT_AS) per worker: one idles at ~60 MB; adversarial answers peaked ~0.5 GB."""

_SOFT_FRACTION = 0.8
"""A worker abandons an answer itself after this fraction of the deadline, so that the usual slow answer
costs no worker restart; the parent's SIGKILL at the full deadline covers answers stuck where no signal
handler runs."""

_START_TIMEOUT_S = 60.0
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")

Reason = Literal["correct", "no_answer", "unparsable", "wrong", "timeout", "error", "bad_gold"]
"""Why an answer scored what it did: `correct` (reward 1.0); `no_answer`: no complete box in the tail, or
an empty one; `unparsable`: math-verify read no expression in the box (only its raw text, which did not
match the gold's); `wrong`: parsed but not equivalent; `timeout`: over the deadline; `error`: the worker
failed otherwise (memory cap, crash); `bad_gold`: the gold answer is empty or unparsable (a data problem,
not the model's)."""

REASONS: tuple[Reason, ...] = get_args(Reason)


def grade(completions: list[str], golds: list[str], *, timeout_s: float = 3.0) -> list[float]:
    """Score each completion against its gold answer: 1.0 if its boxed answer is equivalent, else 0.0
    (`grade_with_reasons` with the reasons mapped to rewards).

    Args:
        completions: model outputs; only the last complete `\\boxed{...}` / `\\fbox{...}` within the last
            `TAIL_CHARS` characters is read.
        golds: plain gold answers, one per completion, as LaTeX without delimiters (e.g. `\\frac{1}{2}`,
            `(3,\\frac{\\pi}{2})`); text already in `$...$` is used as it is.
        timeout_s: wall-clock budget per answer, counted from the moment a worker takes it.

    Returns:
        One reward per completion, in input order. Any failure (no box, parse error, timeout, memory cap,
        crashed worker) is 0.0.

    Raises:
        ValueError: the lists differ in length, or timeout_s is not positive.
        TypeError: an item is not a str (the message names the list and index).
        RuntimeError: grading workers cannot start (e.g. math-verify is not installed).

    Thread-safe; calls from several threads share one worker pool and run one at a time.
    """
    return [
        float(reason == "correct") for reason in grade_with_reasons(completions, golds, timeout_s=timeout_s)
    ]


def grade_with_reasons(completions: list[str], golds: list[str], *, timeout_s: float = 3.0) -> list[Reason]:
    """Like `grade`, but the `Reason` of each score: "correct" is reward 1.0, every other reason 0.0.

    Same arguments and errors as `grade`.
    """
    if len(completions) != len(golds):
        raise ValueError(f"completions has {len(completions)} items but golds has {len(golds)}")
    for name, items in (("completions", completions), ("golds", golds)):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise TypeError(f"{name}[{i}] is {type(item).__name__}, expected str")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")

    reasons: list[Reason] = []
    jobs: list[_Job] = []
    for i, (completion, gold) in enumerate(zip(completions, golds, strict=True)):
        answer = last_boxed(completion[-TAIL_CHARS:])
        if answer is None or not answer.strip():
            reasons.append("no_answer")
        elif not gold.strip():
            reasons.append("bad_gold")
        else:
            reasons.append("error")  # until the worker answers
            jobs.append(_Job(i, _as_latex(gold), _as_latex(answer)))
    if jobs:
        for index, reason in _shared_pool().run(jobs, timeout_s).items():
            reasons[index] = reason
    return reasons


def last_boxed(text: str) -> str | None:
    """Content of the last complete outermost `\\boxed{...}` or `\\fbox{...}` in text, or None.

    Braces are matched (escaped `\\{`, `\\}` do not count). A last box left unclosed (a truncated answer)
    gives None rather than an earlier box, which may be an intermediate result. Linear in len(text).
    """
    content = None
    pos = 0
    while match := _BOX_START.search(text, pos):
        end = _closing_brace(text, match.end())
        if end is None:
            return None
        content = text[match.end() : end]
        pos = end + 1
    return content


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the brace closing the group opened just before start, or None if it never closes."""
    depth = 1
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # an escaped character, e.g. the literal braces of a set \{1, 2\}
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _as_latex(answer: str) -> str:
    """Math-verify extracts LaTeX only from math environments: wrap a bare answer in $...$.

    Whitespace runs become one space first: math-verify does not read a `$...$` span across a line break
    (a box such as `\\boxed{x\n+1}` would score 0), and in TeX math a line break is a space anyway."""
    collapsed = " ".join(answer.split())
    if collapsed.startswith(("$", "\\(", "\\[")):
        return collapsed
    return f"${collapsed}$"


@dataclass(frozen=True)
class _Job:
    index: int
    gold: str
    answer: str


class _Worker:
    """One grading process and the parent's end of its socket pair."""

    def __init__(self) -> None:
        parent_end, child_end = Pipe()
        self.conn: Connection = parent_end
        # -P: no script directory or cwd on sys.path, so the worker cannot pick up a stray `probepo`.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__), str(child_end.fileno())],
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        child_end.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


class _Pool:
    """A fixed number of workers, started on first use, replaced when they die or miss a deadline."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pid = os.getpid()
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def run(self, jobs: list[_Job], timeout_s: float) -> dict[int, Reason]:
        """Grade jobs on the workers; returns {job index: reason}."""
        with self._lock:
            self._start(min(self.size, len(jobs)) - len(self._idle))
            reasons: dict[int, Reason] = {}
            pending = deque(jobs)
            busy: dict[Connection, tuple[_Worker, int, float]] = {}
            try:
                while pending or busy:
                    while pending and self._idle:
                        worker, job = self._idle.pop(), pending.popleft()
                        try:
                            worker.conn.send((job.gold, job.answer, timeout_s * _SOFT_FRACTION))
                        except OSError:  # died while idle
                            worker.kill()
                            self._start(1)
                            pending.appendleft(job)
                            continue
                        busy[worker.conn] = (worker, job.index, time.monotonic() + timeout_s)
                    first_deadline = min(deadline for _, _, deadline in busy.values())
                    for conn in wait(list(busy), timeout=max(0.0, first_deadline - time.monotonic())):
                        worker, index, _ = busy.pop(conn)
                        try:
                            reasons[index] = conn.recv()
                            self._idle.append(worker)
                        except (EOFError, OSError):  # crashed (e.g. a segfault deep in a parser)
                            reasons[index] = "error"
                            worker.kill()
                            self._start(1)
                    now = time.monotonic()
                    for conn, (worker, index, deadline) in list(busy.items()):
                        if deadline <= now:
                            del busy[conn]
                            reasons[index] = "timeout"
                            worker.kill()
                            self._start(1)
            finally:
                # Only on an error or interrupt: a worker still busy would later answer the wrong job.
                for worker, _, _ in busy.values():
                    worker.kill()
            return reasons

    def _start(self, count: int) -> None:
        """Start count workers (none if count <= 0) and wait until they are ready, then add them to idle.

        Waiting here keeps start-up out of the first answer's deadline.
        """
        starting = {}
        for _ in range(count):
            worker = _Worker()
            starting[worker.conn] = worker
        give_up = time.monotonic() + _START_TIMEOUT_S
        try:
            while starting:
                ready = wait(list(starting), timeout=max(0.0, give_up - time.monotonic()))
                if not ready:
                    raise RuntimeError(f"grading workers did not start within {_START_TIMEOUT_S:.0f} s")
                for conn in ready:
                    try:
                        conn.recv()
                    except EOFError:
                        raise RuntimeError(
                            "a grading worker exited at start-up (its stderr is above); is "
                            "math-verify[antlr4_13_2]==0.9.0 installed in this environment?"
                        ) from None
                    self._idle.append(starting.pop(conn))
        finally:
            for worker in starting.values():
                worker.kill()

    def shutdown(self) -> None:
        with self._lock:
            if self.pid == os.getpid():  # a forked child must not kill its parent's workers
                for worker in self._idle:
                    worker.kill()
            self._idle.clear()


_POOL: _Pool | None = None
_POOL_GUARD = threading.Lock()


def _shared_pool() -> _Pool:
    """The process's pool, created on first use (and anew in a forked child, which must not share pipes)."""
    global _POOL
    with _POOL_GUARD:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = _Pool(min(4, len(os.sched_getaffinity(0))))
            atexit.register(_POOL.shutdown)
        return _POOL


# ---- worker side: runs as `python -P grading.py FD` ----


class _SoftTimeout(BaseException):
    """Raised by the worker's own timer; a BaseException so math-verify's `except Exception` lets it pass."""


def _serve(fd: int) -> None:
    """Worker loop: receive (gold, answer, budget_s), send back a `Reason` until the parent goes away."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = MEMORY_CAP_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_CAP_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    import logging

    from math_verify import LatexExtractionConfig, parse, verify

    # Timeouts and parse failures are expected here and end as reward 0; don't flood the trainer's log.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    config = [LatexExtractionConfig()]

    @lru_cache(maxsize=4096)  # a group of completions shares one gold
    def parse_gold(gold: str) -> tuple[object, ...]:
        return tuple(parse(gold, config, parsing_timeout=None))

    def judge(gold: str, answer: str) -> str:
        # Timeouts off (None): math-verify's alarms would replace the timer below.
        gold_parsed = parse_gold(gold)
        if not gold_parsed:
            return "bad_gold"
        target = parse(answer, config, parsing_timeout=None)
        if target and verify(list(gold_parsed), target, timeout_seconds=None):
            return "correct"
        # math-verify keeps the raw string beside what it parsed: only strings means it parsed nothing
        return "wrong" if any(not isinstance(item, str) for item in target) else "unparsable"

    def on_alarm(signum: int, frame: object) -> None:
        raise _SoftTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    # Load the grammar and sympy's lazily imported pieces (tuples, intervals, sets, fractions, roots,
    # polynomials) now, not within the first answer's deadline: a cold path took 0.1-0.25 s idle.
    for warm_up in ("$1$", "$(1,2)$", "$[1,2)$", "$\\{1,2\\}$", "$\\frac{1}{2}$", "$\\sqrt{2}$", "$x^2+1$"):
        judge(warm_up, warm_up)
    conn = Connection(fd)
    conn.send("ready")
    while True:
        try:
            gold, answer, budget_s = conn.recv()
        except EOFError:
            return
        try:
            # Nested so that the one-shot timer can only fire inside the outer try.
            try:
                signal.setitimer(signal.ITIMER_REAL, budget_s)
                result = judge(gold, answer)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            result = "timeout"
        except Exception:  # a parser error, or MemoryError at the address-space cap
            result = "error"
        conn.send(result)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
