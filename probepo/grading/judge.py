"""Grading math answers with math-verify 0.9.0, safely (NOTES.md "math-verify 0.9.0"; docs/GRADING.md sets
these rules beside verl's and Qwen2.5-Math's graders).

Rules: only a `\\boxed{...}` (or `\\fbox{...}`) answer earns a reward: the last complete box of the
completion, wherever it is (a box whose content is longer than `ANSWER_CAP_CHARS` is not parsed). Gold and
answer are each read as their math (`math_of`: the `$...$` spans of a text with words around them, joined)
and compared by math-verify (`verify(gold, pred)`, gold first); a percentage also matches its number of
percent. No box, a wrong answer, a timeout, running out of memory or a crashed worker all score 0.0;
`grade_with_reasons` says which of these it was.

Why worker processes: math-verify's own timeouts use `signal.alarm` (main thread only, and they cancel any
outer SIGALRM), and an adversarial answer can keep a process busy inside C code where no signal handler
runs. So each answer is graded in a small pool of worker processes, each under an address-space cap; the
parent waits on pipes with a deadline (no signals, so any thread may call `grade`), SIGKILLs a worker that
misses it and starts a replacement.

Why plain subprocesses rather than a multiprocessing start method: spawn and forkserver re-import the
parent's `__main__` into the children (a training script that imports torch at the top would load torch
into every worker, and RLIMIT_AS would then break it), and fork copies a process that may hold threads and
CUDA state. A worker is a fresh interpreter that runs `probepo/grading/worker.py` as a script, so it
imports nothing but the standard library and math_verify (~0.6 s to start and warm up).
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Literal, get_args

from probepo.grading import worker as grading_worker
from probepo.grading.worker import MEMORY_CAP_BYTES

__all__ = [
    "ANSWER_CAP_CHARS",
    "MEMORY_CAP_BYTES",
    "REASONS",
    "Reason",
    "grade",
    "grade_with_reasons",
    "last_boxed",
    "math_of",
    "unclosed_delimiter",
]

ANSWER_CAP_CHARS = 4096
"""A box whose content is longer than this is not parsed (reason `unparsable`): math-verify's time and
memory grow with the text it reads. The longest gold of the shipped benchmarks has 992 characters."""

_SOFT_FRACTION = 0.8
"""A worker abandons an answer itself after this fraction of the deadline, so that the usual slow answer
costs no worker restart; the parent's SIGKILL at the full deadline covers answers stuck where no signal
handler runs."""

_START_TIMEOUT_S = 60.0
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_OR_ESCAPE = re.compile(r"[{}\\]")
_MATH_MARK = re.compile(r"\\.|\$\$|\$", re.DOTALL)
"""An escaped character (`\\$` is a dollar sign, `\\(` and `\\[` open maths) or a `$$` / `$` delimiter."""
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_DELIMITERS = {*_CLOSER, *_CLOSER.values()}
_TRAILING_PERIOD = re.compile(r"(?<![.\\])(?<!\\right)\.$")
_WORD = r"[A-Za-z]+(?:['-][A-Za-z]+)*"
_WORDS = re.compile(rf"(?:\\text\s*\{{)?\s*({_WORD}(?: +{_WORD})+)\s*\}}?")
"""Two or more words and nothing else, bare or in one `\\text{...}` (braces checked by the caller)."""
"""A sentence's full stop at the end of an answer (`\\boxed{5.}`); not `..`, `\\.` or `\\right.`."""

Reason = Literal["correct", "no_answer", "unparsable", "wrong", "timeout", "error", "bad_gold"]
"""Why an answer scored what it did: `correct` (reward 1.0); `no_answer`: no complete box, or one with no
math in it; `unparsable`: math-verify read no expression in the box (only its raw text, which did not match
the gold's), or the box holds more than `ANSWER_CAP_CHARS` characters; `wrong`: parsed but not equivalent;
`timeout`: over the deadline; `error`: the worker failed otherwise (memory cap, crash); `bad_gold`: the gold
answer is empty or unparsable (a data problem, not the model's)."""

REASONS: tuple[Reason, ...] = get_args(Reason)


def grade(completions: list[str], golds: list[str], *, timeout_s: float = 3.0) -> list[float]:
    """Score each completion against its gold answer: 1.0 if its boxed answer is equivalent, else 0.0
    (`grade_with_reasons` with the reasons mapped to rewards).

    Args:
        completions: model outputs; only the last complete `\\boxed{...}` / `\\fbox{...}` is read, wherever
            it is (`last_boxed`), and only if its content has at most `ANSWER_CAP_CHARS` characters.
        golds: gold answers, one per completion, as LaTeX without delimiters (e.g. `\\frac{1}{2}`,
            `(3,\\frac{\\pi}{2})`) or as text with `$...$` math in it, of which only the math counts
            (`math_of`).
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
        box = last_boxed(completion)
        if box is not None and len(box) > ANSWER_CAP_CHARS:
            reasons.append("unparsable")  # not handed to math-verify at all
            continue
        answer = "" if box is None else math_of(box)
        gold_math = math_of(gold)
        if not answer:
            reasons.append("no_answer")
        elif not gold_math:
            reasons.append("bad_gold")
        else:
            reasons.append("error")  # until the worker answers
            # math-verify extracts LaTeX only from math environments, hence the $...$
            jobs.append(_Job(i, f"${gold_math}$", f"${answer}$"))
    if jobs:
        for index, reason in _shared_pool().run(jobs, timeout_s).items():
            reasons[index] = reason
    return reasons


def last_boxed(text: str) -> str | None:
    """Content of the last complete outermost `\\boxed{...}` or `\\fbox{...}` in text, or None.

    Braces are matched (escaped `\\{`, `\\}` do not count). A box left unclosed (a truncated answer) runs
    to the end of the text, so it gives None rather than an earlier box, which may be an intermediate
    result. Linear in len(text): each character is looked at once, plain text skipped by a regex.
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
    pos = start
    while match := _BRACE_OR_ESCAPE.search(text, pos):
        char = match.group()
        pos = match.end()
        if char == "\\":
            pos += 1  # an escaped character, e.g. the literal braces of a set \{1, 2\}
        elif char == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return match.start()
    return None


def math_of(text: str) -> str:
    """The math of a gold or a boxed answer, as the grader hands it to math-verify (without delimiters).

    - Text with math delimiters (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`; `\\$` is a dollar sign)
      is read as its math spans, in order, joined by ", ", and the words around them are dropped:
      `$R=0$, converges only when $x=2$` is `R=0, x=2`, which math-verify compares as a set (every
      span needed, none alone enough).
    - A delimiter that never closes (`unclosed_delimiter`), or delimiters around no math at all (a box
      split over two spans, `a+$ $b`): the whole text with its delimiters dropped.
    - Text without delimiters is math as a whole.

    Whitespace runs become one space (math-verify reads no `$...$` span across a line break, and in TeX
    math a line break is a space), and a sentence's full stop at the end is dropped (`5.` is 5). Two or
    more words and nothing else (`No solution`, `\\text{converges conditionally}`) become `\\text{...}` in
    lower case: math-verify reads bare words as a product of letters, which no `\\text{}` answer matches.
    """
    collapsed = " ".join(text.split())
    spans, unclosed = _math_spans(collapsed)
    maths = [span.strip() for span in spans if span.strip()]
    if unclosed is not None or (spans and not maths):
        math = _MATH_MARK.sub(lambda mark: "" if mark.group() in _DELIMITERS else mark.group(), collapsed)
    else:
        math = ", ".join(maths) if maths else collapsed
    math = _TRAILING_PERIOD.sub("", math.strip()).strip()
    words = _WORDS.fullmatch(math)
    if words and math.startswith("\\text") == math.endswith("}") and max(map(len, words[1].split())) > 2:
        return f"\\text{{{words[1].lower()}}}"
    return math


def unclosed_delimiter(text: str) -> str | None:
    """The math delimiter of text that opens a span never closed (e.g. `$`), or None if all pair up."""
    return _math_spans(text)[1]


def _math_spans(text: str) -> tuple[list[str], str | None]:
    """The contents of text's math spans, and the opening delimiter of a last span left open (else None).

    Inside a `$` span, `$$` closes it and opens the next (`$a$$b$` is two spans)."""
    spans: list[str] = []
    opener: str | None = None
    start = 0
    for mark in _MATH_MARK.finditer(text):
        token = mark.group()
        if opener is None:
            if token in _CLOSER:
                opener, start = token, mark.end()
        elif token == _CLOSER[opener] or (opener == "$" and token == "$$"):
            spans.append(text[start : mark.start()])
            opener, start = ("$", mark.end()) if token != _CLOSER[opener] else (None, 0)
    return spans, opener


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
            [sys.executable, "-P", os.path.abspath(grading_worker.__file__), str(child_end.fileno())],
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
