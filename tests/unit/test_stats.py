"""probepo.report.stats: means with standard errors, the paired bootstrap, reading curves between
evaluations."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probepo.report.stats import (
    first_reach,
    mean_and_stderr,
    paired_bootstrap_ci,
    paired_t_ci95,
    paired_t_power,
    value_at,
)

values = st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=30)


@given(values)
def test_mean_and_stderr_match_the_textbook(xs):
    mean, se = mean_and_stderr(xs)
    assert mean == pytest.approx(statistics.fmean(xs))
    assert se == pytest.approx(statistics.stdev(xs) / math.sqrt(len(xs)), abs=1e-12)
    assert mean_and_stderr([0.3]) == (0.3, 0.0)
    with pytest.raises(ValueError, match="no values"):
        mean_and_stderr([])


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=20))
def test_bootstrap_interval_brackets_the_paired_mean_and_ignores_order(pairs):
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    mean, low, high = paired_bootstrap_ci(a, b, resamples=500)
    diffs = [x - y for x, y in pairs]
    assert mean == pytest.approx(statistics.fmean(diffs))
    assert min(diffs) - 1e-12 <= low <= high <= max(diffs) + 1e-12
    # Resampling is over pairs: swapping which arm is which mirrors the interval.
    neg_mean, neg_low, neg_high = paired_bootstrap_ci(b, a, resamples=500)
    assert neg_mean == pytest.approx(-mean)
    assert (neg_low, neg_high) == pytest.approx((-high, -low), abs=1e-9)


def test_bootstrap_pairs_by_seed():
    # Each pair differs by exactly +1 while the arms vary widely across seeds: pairing removes that
    # variation, so the interval is the single point +1 (unpaired, it would straddle zero).
    a = [10.0, 20.0, 30.0, 40.0, 50.0]
    b = [x - 1.0 for x in a]
    assert paired_bootstrap_ci(a, b) == (1.0, 1.0, 1.0)
    mean, low, high = paired_bootstrap_ci([0.0, 1.0, 0.0, 1.0] * 5, [0.5] * 20, seed=3)
    assert mean == 0.0 and low < 0.0 < high
    with pytest.raises(ValueError, match="equal"):
        paired_bootstrap_ci([1.0], [1.0, 2.0])


def test_value_at_and_first_reach_read_a_piecewise_linear_curve():
    xs, ys = [0.0, 10.0, 20.0, 40.0], [0.2, 0.3, 0.25, 0.5]
    assert value_at(xs, ys, 5.0) == pytest.approx(0.25)
    assert value_at(xs, ys, 30.0) == pytest.approx(0.375)
    assert value_at(xs, ys, 40.0) == 0.5 and math.isnan(value_at(xs, ys, 41.0))
    assert first_reach(xs, ys, 0.2) == 0.0
    assert first_reach(xs, ys, 0.28) == pytest.approx(8.0)  # the first crossing, not a later one
    assert first_reach(xs, ys, 0.4) == pytest.approx(32.0)
    assert math.isnan(first_reach(xs, ys, 0.6)) and math.isnan(first_reach([], [], 0.1))


@given(st.lists(st.floats(0, 1), min_size=2, max_size=12), st.floats(0, 1))
def test_first_reach_is_a_point_where_the_curve_has_the_target(ys, target):
    xs = [float(i) for i in range(len(ys))]
    x = first_reach(xs, ys, target)
    if math.isnan(x):
        assert max(ys) < target
    else:
        assert value_at(xs, ys, x) >= target - 1e-9
        assert all(y < target for y in ys[: math.floor(x)]) or x == 0.0


def test_paired_t_interval_matches_a_worked_example():
    mean, low, high = paired_t_ci95([1.0, 2.0, 3.0, 4.0, 5.0], [0.0] * 5)
    # mean 3, s.d. 1.5811, s.e. 0.7071, t(4) = 2.776: half-width 1.963
    assert (mean, low, high) == pytest.approx((3.0, 1.037, 4.963), abs=1e-3)
    # wider than the percentile bootstrap on few seeds
    _, b_low, b_high = paired_bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0], [0.0] * 5)
    assert low < b_low and b_high < high
    with pytest.raises(ValueError, match=">= 2 values"):
        paired_t_ci95([1.0], [0.0])


def test_paired_t_power_matches_the_normal_approximation_and_its_limits():
    # No effect: the test's level. A large effect: almost sure. Between: the noncentral-t power, close
    # to the normal approximation Φ(δ − t_crit) for δ = effect / (sd / √n).
    assert paired_t_power(0.0, 2.2, 30) == pytest.approx(0.05, abs=0.003)
    assert paired_t_power(10.0, 2.2, 10) > 0.999
    delta = 1.2 / (2.2 / math.sqrt(30))
    approximation = 0.5 * (1 + math.erf((delta - 2.045) / math.sqrt(2)))
    assert paired_t_power(1.2, 2.2, 30) == pytest.approx(approximation, abs=0.03)
    assert paired_t_power(1.2, 2.2, 10) == pytest.approx(0.34, abs=0.02)  # the audit's 0.33
    with pytest.raises(ValueError, match="n >= 2"):
        paired_t_power(1.0, 1.0, 1)
