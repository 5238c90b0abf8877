"""Percentiles with the bounds their runs allow (pipeline/measuring/quantiles.py): the textbook
order-statistic interval, the runs it needs, a confidence sequence that is the median's at q = 1/2,
and the interval read by takes, whose runs count about as one."""

from __future__ import annotations

import math
import random

import pytest

from pipeline.measuring import quantiles, stats


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("n", [40, 97, 368, 700])
def test_the_ranks_are_the_binomials_tails_summed_term_by_term(n, q):
    tail = 0.025
    if q**n > tail:
        assert quantiles.quantile_ranks(n, q) is None
        return
    lower, upper = quantiles.quantile_ranks(n, q)
    pmf = [
        math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(q) + (n - k) * math.log1p(-q))
        for k in range(n + 1)
    ]
    at_most = [sum(pmf[: k + 1]) for k in range(n + 1)]  # P(B <= k), B the runs below the quantile
    # The lower end misses when B < lower; the upper end when B >= upper: each within the tail, and
    # one rank further out each would not be.
    assert at_most[lower - 1] <= tail < at_most[lower]
    assert 1.0 - at_most[upper - 1] <= tail < 1.0 - at_most[upper - 2]


def test_a_p99_needs_368_runs_and_a_p90_36():
    assert quantiles.runs_needed(0.99) == 368 and quantiles.runs_needed(0.9) == 36 and quantiles.runs_needed(0.5) == 6
    assert quantiles.quantile_interval(list(range(367)), 0.99) is None
    assert quantiles.quantile_interval(list(range(368)), 0.99) == (359, 367)  # the 360th and the slowest


def test_at_one_half_the_sequence_is_the_medians():
    """The same walk and spending as the median's sign test (stats._SequentialRanks)."""
    sequence, median = quantiles._SequentialQuantileRanks(0.05, 0.5), stats._SequentialRanks(0.05)
    for n in range(1, 300):
        k = median.rank(n)
        assert sequence.rank(n) == ((k, n + 1 - k) if k else (0, 0))


def test_the_sequence_holds_the_quantile_at_every_look_as_often_as_it_claims():
    rng = random.Random(3)
    q, true, misses, points = 0.9, -math.log(0.1), 0, 400  # exponential runs: the p90 is ln 10
    for _ in range(points):
        runs = [rng.expovariate(1.0) for _ in range(600)]
        looks = [quantiles.sequential_quantile_interval(runs[:n], q) for n in range(36, 601, 12)]
        misses += any(look is not None and not look[0] <= true <= look[1] for look in looks)
    assert misses / points <= 0.05


def test_takes_of_alike_runs_count_as_one_each():
    """60 takes of 10 runs each, all alike within a take: read by its takes, the p90's interval is
    the takes' own, not the far narrower one of 600 independent runs."""
    rng = random.Random(5)
    levels = [rng.uniform(10.0, 20.0) for _ in range(60)]
    takes = [[level] * 10 for level in levels]
    by_takes = quantiles.take_quantile_interval(takes, 0.9)
    assert by_takes == quantiles.quantile_interval(levels, 0.9)
    as_runs = quantiles.quantile_interval([run for take in takes for run in take], 0.9)
    assert as_runs[1] - as_runs[0] < by_takes[1] - by_takes[0]
    assert quantiles.take_quantile_interval(takes[:35], 0.9) is None  # a p90 needs 36 takes
