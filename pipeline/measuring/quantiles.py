"""Percentiles of per-run times with the bounds the runs allow: a p90 or p99 with its interval, or
the number of runs it needs.

A percentile read off n runs (numpy's p99 of 40 runs is an interpolation between the two slowest)
says nothing of how far the engine's true p99 may be from it; with too few runs no interval can
hold it at all. So each percentile is bounded the distribution-free way, by order statistics of the
runs: for the true q-quantile ξ of a continuous distribution, the count B of runs below ξ is
Binomial(n, q), so the k-th smallest run lies above ξ exactly when B < k. The interval
[x(l), x(u)] takes l and u where the binomial's two tails each hold at most (1 − confidence) / 2
(the textbook interval for a quantile, e.g. Hahn & Meeker, Statistical Intervals, 2nd ed., §5.2);
where even the slowest run cannot be the upper end — q^n above that tail — the runs cannot bound
it, and ``runs_needed`` says how many could (368 for a two-sided 95 % interval of a p99, 36 for a
p90). MLPerf LoadGen likewise reports a tail only from as many queries as its early-stopping rule
asks for (662 for a p99 in SingleStream, a one-sided rule with its own tolerance).

That reading holds for independent runs. The runs of one take are not: they share the take's
host and clock (a take of a GPU-bound engine lies within about 1 % of itself, and a clock dip
moves the whole take), so n runs of T takes say about as much of a tail as T runs. Read as if
independent, a p90 interval missed the truth in 20-100 % of simulated points
(scripts/simulate_tails.py). So a profile timed in takes is bounded by its takes
(``take_quantile_interval``): the ranks come from Binomial(T, q), T the takes, and are scaled to
the runs sorted together — exact where a take's runs are all alike, wider than needed where they
are independent — and a p99 needs 368 takes, a p90 36. The simulation measures its coverage on
the noise shapes of this project's machines and the lent GPUs.

The rounds look at the runs after every round and may stop on what they see, so where the ranks
must hold at whichever look the rounds stopped at, they come from a confidence sequence: the same
order statistics, with ranks that grow look by look so that the chance of missing ξ at any look,
from the first, stays within (1 − confidence) — the walk of B computed exactly, as
pipeline/measuring/stats.py does for the median's sign test.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence

# The percentiles a row carries with their bounds (the table's p99 column, the JSON's p90 and p99).
TAIL_PERCENTS = (90, 99)


# How far either side of the binomial's mode its probabilities are summed: beyond this many standard
# deviations (and a margin for small n) what is left is below 1e-20, far under any tail read here.
_WINDOW_SD, _WINDOW_MARGIN = 12, 40


def _binomial_cumulative(n: int, q: float) -> tuple[int, list[float]]:
    """(first, cdf): P(B <= k) for B ~ Binomial(n, q) at k = first, first + 1, …, over a window
    around the mode outside which the probabilities are negligible (below it P(B <= k) is taken as
    0, above it as 1). The probabilities are built from the mode's by their ratios, in log space,
    so thousands of runs cost a few numpy operations."""
    import numpy as np

    mode = min(n, int((n + 1) * q))
    width = int(_WINDOW_SD * math.sqrt(n * q * (1.0 - q))) + _WINDOW_MARGIN
    first, last = max(0, mode - width), min(n, mode + width)
    at_mode = math.lgamma(n + 1) - math.lgamma(mode + 1) - math.lgamma(n - mode + 1) + mode * math.log(q) + (n - mode) * math.log1p(-q)
    odds = math.log(q) - math.log1p(-q)
    up = np.arange(mode, last)  # log pmf(k + 1) - log pmf(k) = log((n - k) / (k + 1)) + log(q / (1 - q))
    down = np.arange(first + 1, mode + 1)  # log pmf(k - 1) - log pmf(k) = log(k / (n - k + 1)) - log(q / (1 - q))
    log_up = at_mode + np.cumsum(np.log((n - up) / (up + 1.0)) + odds)
    log_down = at_mode + np.cumsum((np.log(down / (n - down + 1.0)) - odds)[::-1])[::-1]
    pmf = np.exp(np.concatenate([log_down, [at_mode], log_up]))
    return first, np.cumsum(pmf).tolist()


@functools.lru_cache(maxsize=4096)
def quantile_ranks(n: int, q: float, confidence: float = 0.95) -> tuple[int, int] | None:
    """The 1-based ranks (l, u) of the order statistics that bound the q-quantile of n runs at
    ``confidence``: l the largest with P(B <= l - 1) within (1 - confidence) / 2, u the smallest
    with P(B >= u) within it; None where n runs cannot (the slowest run is no upper bound: q^n
    above the tail, or the fastest no lower one)."""
    if n < 1 or not 0.0 < q < 1.0:
        return None
    tail = (1.0 - confidence) / 2
    if q**n > tail or (1.0 - q) ** n > tail:
        return None
    first, cdf = _binomial_cumulative(n, q)
    # l: the smallest k with P(B <= k) above the tail (so P(B <= l - 1) is within it); u: one past
    # the smallest k with P(B <= k) at least 1 - tail (so P(B >= u) is within it).
    lower = max(1, first + bisect.bisect_right(cdf, tail))
    upper = min(n, first + bisect.bisect_left(cdf, 1.0 - tail) + 1)
    return lower, max(upper, lower)


def runs_needed(q: float, confidence: float = 0.95) -> int:
    """The fewest runs whose order statistics can bound the q-quantile at ``confidence`` (both
    ends): n with max(q, 1 - q)^n at most (1 - confidence) / 2."""
    tail = (1.0 - confidence) / 2
    return math.ceil(math.log(tail) / math.log(max(q, 1.0 - q)))


def quantile_interval(values: Sequence[float], q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free ``confidence`` interval of the q-quantile of ``values`` (quantile_ranks);
    None where there are too few of them (runs_needed)."""
    ranks = quantile_ranks(len(values), q, confidence)
    if ranks is None:
        return None
    ordered = sorted(values)
    return ordered[ranks[0] - 1], ordered[ranks[1] - 1]


class _SequentialQuantileRanks:
    """(l_n, u_n) for n = 0, 1, …: a confidence sequence for the q-quantile at one level, as
    stats._SequentialRanks is for the median (which it equals at q = 1/2): the interval is the
    l-th smallest and the h-th largest run, l and h never shrinking; each end may miss with
    probability at most (1 - confidence) / 2 over every look together, spent as the median's is
    (what the extreme runs cost at the first look that can bound the quantile, the rest as 1/n).
    (0, 0) where no interval is possible yet."""

    def __init__(self, alpha: float, q: float):
        import numpy as np

        self.alpha, self.q = alpha, q
        self.first = runs_needed(q, 1.0 - alpha)
        self.ranks: list[tuple[int, int]] = [(0, 0)]
        # P(B_n = b and no look so far missed the quantile), B_n the count of runs below it.
        self._alive = np.ones(1)
        self._spent = [0.0, 0.0]  # by the lower end, by the upper end
        self._below = 0  # l: the lower end is the l-th smallest run; it misses when B_n < l
        self._above = 0  # h: the upper end is the h-th largest run; it misses when n - B_n < h

    def _allowed(self, n: int) -> float:
        """What each end may have spent by the look at n runs."""
        half = self.alpha / 2
        first_share = min(max(self.q, 1.0 - self.q) ** self.first / half, 1.0)
        return half * (1.0 - (1.0 - first_share) * self.first / n)

    def rank(self, n: int) -> tuple[int, int]:
        import numpy as np

        while len(self.ranks) <= n:
            look = len(self.ranks)
            grown = np.zeros(look + 1)  # one more run: above the quantile (1 - q) or below it (q)
            grown[:-1] += self._alive * (1.0 - self.q)
            grown[1:] += self._alive * self.q
            self._alive = grown
            if look < self.first:
                self.ranks.append((0, 0))
                continue
            # Raising an end's rank newly excludes one count of B_n: kept while it fits what that end
            # may have spent. Counts excluded at earlier looks hold no mass any more (they were
            # removed), so the ranks never shrink.
            allowed = self._allowed(look) * (1 + 1e-12)
            while self._below + self._above < look and self._spent[0] + self._alive[self._below] <= allowed:
                self._spent[0] += self._alive[self._below]
                self._alive[self._below] = 0.0
                self._below += 1
            while self._below + self._above < look and self._spent[1] + self._alive[look - self._above] <= allowed:
                self._spent[1] += self._alive[look - self._above]
                self._alive[look - self._above] = 0.0
                self._above += 1
            bounded = self._below > 0 and self._above > 0
            self.ranks.append((self._below, look + 1 - self._above) if bounded else (0, 0))
        return self.ranks[n]


@functools.lru_cache(maxsize=64)
def _sequential_quantile_ranks(alpha: float, q: float) -> _SequentialQuantileRanks:
    return _SequentialQuantileRanks(alpha, q)


def sequential_quantile_interval(values: Sequence[float], q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """The q-quantile's interval from a confidence sequence at ``confidence``: valid whichever look
    it is read at. None where the runs cannot bound it yet."""
    lower, upper = _sequential_quantile_ranks(round(1.0 - confidence, 12), q).rank(len(values))
    if lower == 0 or upper == 0:
        return None
    ordered = sorted(values)
    return ordered[lower - 1], ordered[upper - 1]


def take_quantile_interval(takes: Sequence[Sequence[float]], q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """The q-quantile of the runs of ``takes`` (each take's runs), bounded by the takes: ranks (l, u)
    from Binomial(T, q) for T takes, scaled to the N runs sorted together (the runs from the
    (l - 1)·N/T + 1-th to the u·N/T-th), so that a take whose runs are all alike counts once. None
    where the takes are too few (runs_needed of them)."""
    kept = [take for take in takes if len(take)]
    ranks = quantile_ranks(len(kept), q, confidence)
    if ranks is None:
        return None
    ordered = sorted(value for take in kept for value in take)
    scale = len(ordered) / len(kept)
    lower = math.floor((ranks[0] - 1) * scale) + 1
    upper = min(len(ordered), math.ceil(ranks[1] * scale))
    return ordered[lower - 1], ordered[upper - 1]


def sequential_take_ranks(runs: int, takes: int, q: float, confidence: float) -> tuple[int, int] | None:
    """The 1-based ranks, among ``runs`` runs of ``takes`` kept takes sorted together, of the ends
    of the q-quantile's interval bounded by the takes, as take_quantile_interval scales them, but
    from the confidence sequence (_SequentialQuantileRanks), so that it holds at whichever round the
    rounds stopped at: what a ranking by a percentile (pipeline/measuring/ranking.py) decides on.
    None where the takes cannot bound it yet (sequential_takes_needed says how many could)."""
    if takes < 1 or runs < 1:
        return None
    lower, upper = _sequential_quantile_ranks(round(1.0 - confidence, 12), q).rank(takes)
    if lower == 0 or upper == 0:
        return None
    scale = runs / takes
    return math.floor((lower - 1) * scale) + 1, min(runs, math.ceil(upper * scale))


def sequential_takes_needed(q: float, confidence: float) -> int:
    """The fewest takes at which the confidence sequence can bound the q-quantile at ``confidence``."""
    return _sequential_quantile_ranks(round(1.0 - confidence, 12), q).first
