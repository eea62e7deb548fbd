"""Statistics for comparing runs: means with standard errors, paired bootstrap intervals, and reading a
curve at a budget (sampled tokens, wall time) that falls between its evaluations."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (Bessel-corrected; 0 for a single value)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_and_stderr of no values")
    mean = sum(values) / n
    variance = sum((x - mean) ** 2 for x in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(variance / n)


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high) of mean(a − b) over pairs (a[i], b[i]), with a percentile bootstrap interval that
    resamples the pairs (a pair is one seed of both arms: same warm-up, same prompts, same eval stream)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_bootstrap_ci needs two equal, non-empty lists (got {len(a)} and {len(b)})")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low = means[min(resamples - 1, math.floor(tail * resamples))]
    high = means[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return sum(diffs) / n, low, high


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x on the piecewise-linear curve through (xs, ys) (xs ascending); NaN outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] or x > xs[-1]:
        return math.nan
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):  # noqa: B905
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def first_reach(xs: Sequence[float], ys: Sequence[float], target: float) -> float:
    """The smallest x at which the piecewise-linear curve through (xs, ys) reaches `target`; NaN if never."""
    if not xs:
        return math.nan
    if ys[0] >= target:
        return xs[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):  # noqa: B905
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return math.nan


# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip


def paired_t_ci95(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of mean(a − b) with the paired Student-t 95 % interval. With few seeds the
    percentile bootstrap is too narrow (it ignores that the spread itself is estimated); this is the
    conservative companion. Beyond 30 degrees of freedom, 1.96 + 2.4 / df (within 0.003 of the exact)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired_t_ci95 needs two equal lists of >= 2 values (got {len(a)} and {len(b)})")
    mean, se = mean_and_stderr([x - y for x, y in zip(a, b, strict=True)])
    df = len(a) - 1
    half = (_T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df) * se
    return mean, mean - half, mean + half


def paired_t_power(effect: float, sd: float, n: int, *, draws: int = 200_000, seed: int = 0) -> float:
    """Power of the two-sided paired-t test at the 5 % level: the chance that `n` paired differences drawn
    from Normal(effect, sd) give a 95 % interval excluding zero. Monte Carlo over `draws` experiments
    (fixed seed: the same answer every call; its standard error is below 0.0012)."""
    if n < 2 or sd <= 0:
        raise ValueError(f"paired_t_power needs n >= 2 and sd > 0 (got n = {n}, sd = {sd})")
    import numpy as np

    diffs = np.random.default_rng(seed).normal(effect, sd, size=(draws, n))
    t = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / math.sqrt(n))
    df = n - 1
    critical = _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df
    return float((np.abs(t) > critical).mean())
