"""The grading worker of `probepo.grading.judge`: a fresh interpreter that runs this file as a script
(`python -P grading_worker.py FD`) and judges one (gold, answer) pair at a time with math-verify 0.9.0.

It imports nothing but the standard library and, once started, math_verify (and sympy through it): a
training script's torch never reaches it, so the address-space cap below cannot break it. The parent
(`probepo.grading.judge`) imports this module only for `MEMORY_CAP_BYTES` and its path.
"""

from __future__ import annotations

import resource
import signal
import sys
from functools import lru_cache
from multiprocessing.connection import Connection

MEMORY_CAP_BYTES = 2 << 30
"""Address-space cap (RLIMIT_AS) per worker: one idles at ~60 MB; adversarial answers peaked ~0.5 GB."""


class _SoftTimeout(BaseException):
    """Raised by the worker's own timer; a BaseException so math-verify's `except Exception` lets it pass."""


def serve(fd: int) -> None:
    """Worker loop: receive (gold, answer, budget_s) on the connection `fd`, send back a grading reason
    (`probepo.grading.judge.Reason`) until the parent goes away. Gold and answer arrive as `$...$` LaTeX."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = MEMORY_CAP_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_CAP_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    import logging

    from math_verify import LatexExtractionConfig, parse, verify
    from sympy import Mul, Rational, UnevaluatedExpr

    # Timeouts and parse failures are expected here and end as reward 0; don't flood the trainer's log.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    config = [LatexExtractionConfig()]
    per_cent = UnevaluatedExpr(Rational(1, 100))

    def readings(text: str) -> list[object]:
        """What math-verify parses from text (expressions, then the raw string), plus the number of percent
        of a percentage: math-verify reads `4.2\\%` as 4.2 x 1/100 only, and compares it with 4.2 as 0.042
        (while `12\\%` equals 12: its integer rule), so `4.2\\%` for a gold 4.2 would score 0."""
        parsed = parse(text, config, parsing_timeout=None)
        numbers = [
            item.args[0]
            for item in parsed
            if isinstance(item, Mul) and len(item.args) == 2 and item.args[1] == per_cent
        ]
        return [*parsed, *numbers]

    @lru_cache(maxsize=4096)  # a group of completions shares one gold
    def parse_gold(gold: str) -> tuple[object, ...]:
        return tuple(readings(gold))

    def judge(gold: str, answer: str) -> str:
        # Timeouts off (None): math-verify's alarms would replace the timer below.
        gold_parsed = parse_gold(gold)
        if not gold_parsed:
            return "bad_gold"
        target = readings(answer)
        if target and verify(list(gold_parsed), target, timeout_seconds=None):
            return "correct"
        # math-verify keeps the raw string beside what it parsed: only strings means it parsed nothing
        return "wrong" if any(not isinstance(item, str) for item in target) else "unparsable"

    def on_alarm(signum: int, frame: object) -> None:
        raise _SoftTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    # Load the grammar and sympy's lazily imported pieces (tuples, intervals, sets, fractions, roots,
    # polynomials, percentages) now, not within the first answer's deadline: a cold path took 0.1-0.25 s.
    for warm_up in (
        "$1$",
        "$(1,2)$",
        "$[1,2)$",
        "$\\{1,2\\}$",
        "$\\frac{1}{2}$",
        "$\\sqrt{2}$",
        "$x^2+1$",
        "$5\\%$",
    ):
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
    serve(int(sys.argv[1]))
