"""Pointer chasing over one random cycle: a task where the chain of thought is necessary.

The prompt lists a permutation of `letters` letters as `xy` links (in alphabetical order of x), then a
start letter: `ac,ba,cb|b=` reads a→c, b→a, c→b, start at b. The worked solution follows `hops` links, one
step each, then states where it lands (2 hops: `ba;ac;>c`) then EOS. The permutation is a single cycle
through all letters (NOTES.md, "Pointer-chasing traps"): with a random function wrong chains could
converge on the right answer, and with a random permutation "answer = start" would often pay. On one
cycle with hops not a multiple of its length, a wrong chain lands on the right letter by chance only.
"""

from __future__ import annotations

import random
import string

from probepo.data.synthetic import StepChainTask
from probepo.data.task import Problem


class PointerTask(StepChainTask):
    """Follow `hops` links of a random `letters`-cycle from a start letter."""

    def __init__(self, letters: int = 8, hops: int = 5, seed: int = 0) -> None:
        if not 3 <= letters <= 26 or hops < 1 or hops % letters == 0:
            raise ValueError(
                f"letters = {letters} (3..26), hops = {hops} (>= 1 and not a multiple of letters: the"
                " answer would always be the start letter)"
            )
        self.letters, self.hops = string.ascii_lowercase[:letters], hops
        super().__init__(
            seed, self.letters + ",|=;>", chain_chars=self.letters, answer_pattern=f"[{self.letters}]"
        )

    def longest_prompt(self) -> int:
        """Every prompt has the same length: BOS, `letters` two-letter links with commas between, `|`, the
        start letter and `=`."""
        return 1 + 3 * len(self.letters) - 1 + 3

    def _draw(self, rng: random.Random) -> Problem:
        cycle = rng.sample(self.letters, len(self.letters))
        following = {a: cycle[(i + 1) % len(cycle)] for i, a in enumerate(cycle)}
        links = [f"{a}{following[a]}" for a in self.letters]
        start = rng.choice(self.letters)
        here, chain = start, []
        for _ in range(self.hops):
            chain.append(f"{here}{following[here]};")
            here = following[here]
        return Problem(
            prompt=",".join(links) + f"|{start}=", answer=here, solution="".join(chain) + f">{here}"
        )
