"""Latency statistics, computed in one place for every runtime.

ONNX Runtime timings and trtexec's ``--exportTimes`` per-iteration records both go through
:meth:`LatencyStats.from_values`, so numbers from different runtimes are comparable.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

# The interquartile range of a normal distribution, in standard deviations (2 × 0.6745).
NORMAL_IQR_IN_STDEVS = 1.349


class LatencyStats(BaseModel):
    """Summary of per-iteration times in milliseconds."""

    count: int
    min: float
    max: float
    mean: float
    median: float
    p90: float
    p95: float
    p99: float
    stdev: float
    # Coefficient of variation (stdev / mean). A few stalls of the host (a run 3x the median) raise
    # it to 20-40% while the median does not move, so noise is judged by the quartiles (iqr_cv).
    cv: float
    # The quartiles; None in manifests written before they were recorded.
    p25: float | None = None
    p75: float | None = None

    @property
    def iqr_cv(self) -> float | None:
        """The spread of the middle half of the runs, as the CV of a normal distribution with that
        interquartile range (IQR = 1.349 standard deviations): equal to the CV for well-behaved
        runs, blind to a few outliers. None when the quartiles were not recorded."""
        if self.p25 is None or self.p75 is None or self.median <= 0:
            return None
        return (self.p75 - self.p25) / NORMAL_IQR_IN_STDEVS / self.median

    @classmethod
    def from_values(cls, values_ms: Sequence[float]) -> LatencyStats:
        import numpy as np

        if len(values_ms) == 0:
            raise ValueError("cannot summarise an empty series of timings")
        values = np.asarray(values_ms, dtype=np.float64)
        mean = float(values.mean())
        # Sample standard deviation: these are samples of the engine's latency distribution.
        stdev = float(values.std(ddof=1)) if values.size > 1 else 0.0
        p25, p75, p90, p95, p99, median = (float(v) for v in np.percentile(values, [25, 75, 90, 95, 99, 50]))
        return cls(
            count=int(values.size),
            min=float(values.min()),
            max=float(values.max()),
            mean=mean,
            median=median,
            p90=p90,
            p95=p95,
            p99=p99,
            stdev=stdev,
            cv=stdev / mean if mean > 0 else math.nan,
            p25=p25,
            p75=p75,
        )


# --- which of two engines is faster, and how sure that is ---------------------------------------
#
# A comparison's outcome is one of those NVIDIA's nvbench-compare-robust reports for two
# benchmarks: "faster", "slower", "same" (the difference inside a tie width) or "ambiguous" (the
# data cannot tell). Here each is read off an interval of the ratio of two engines' times: paired,
# the per-round ratios of takes measured side by side (pipeline/measuring/rounds.py); unpaired,
# the two medians' own intervals.

CONFIDENCE = 0.95


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The distribution-free confidence interval of the median of ``values``: the order statistics
    x(k) and x(n+1-k), k the largest rank with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (the
    sign-test interval; any continuous distribution, no resampling, the same numbers every time).
    Below MIN_VALUES_FOR[confidence] values the interval cannot reach the confidence: it is then
    their whole range (reaches_confidence says which)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no values to bound the median of")
    tail = (1.0 - confidence) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) < k + 1)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def reaches_confidence(n: int, confidence: float = CONFIDENCE) -> bool:
    """Whether n values bound their median at ``confidence``: the widest interval, their range,
    misses it with probability 2 × 2**-n (six values for 95 %)."""
    return n > 0 and 2 * 0.5**n <= 1.0 - confidence


def tie_band(tie: float) -> tuple[float, float]:
    """The ratios A/B too close to 1 to matter: from 1/(1 + tie) to 1 + tie. Symmetric in A and B
    (B/A is in the band exactly when A/B is), so which of two engines is named first never
    changes whether they are "the same"; 1 - tie would not be (0.97 inverted is 1.0309)."""
    return 1.0 / (1.0 + tie), 1.0 + tie


def outcome(low: float, high: float, tie: float) -> str:
    """What an interval of the ratio A/B says of A: "same" when it lies within the tie band
    (whatever else is true, the difference is too small to matter), else "faster" when it lies
    below 1, "slower" above 1, "ambiguous" when it holds 1."""
    lowest, highest = tie_band(tie)
    if lowest <= low and high <= highest:
        return "same"
    if high < 1.0:
        return "faster"
    if low > 1.0:
        return "slower"
    return "ambiguous"


def at_band_edge(low: float, high: float, tie: float) -> bool:
    """Whether an interval that excludes 1 still reaches across an edge of the tie band ([1.016,
    1.031] with a 3 % tie): faster or slower now, but more rounds may narrow it into the band
    ("same") as easily as out of it; two runs that stopped there could name different answers."""
    return any(low < edge < high for edge in tie_band(tie))


class RatioEstimate(BaseModel):
    """A over B as a time ratio (below 1: A is faster), with its interval and what it says."""

    ratio: float
    low: float
    high: float
    # How many rounds paired the two (None: unpaired, from the two medians' own intervals).
    rounds: int | None = None
    outcome: str
    # The level the interval was read at: for a pair timed together, the level that holds every
    # pair of its set of rounds at 95 % together (family_confidence); 95 % for one timed apart.
    confidence: float = CONFIDENCE
    # False: too few rounds for any interval at that level; low and high are then the rounds' whole
    # range, no interval, and the outcome "ambiguous" (ratio_of_rounds).
    bounded: bool = True
    # How far each end of an interval of two medians timed apart was widened for what neither
    # interval could see (unpaired_ratio's swing: the host's speed, pace.HOST_SWING); 1 otherwise.
    widened_by: float = 1.0

    @property
    def paired(self) -> bool:
        return self.rounds is not None

    def inverse(self) -> RatioEstimate:
        """B over A."""
        flipped = {"faster": "slower", "slower": "faster"}.get(self.outcome, self.outcome)
        return RatioEstimate(
            ratio=1 / self.ratio,
            low=1 / self.high,
            high=1 / self.low,
            rounds=self.rounds,
            outcome=flipped,
            confidence=self.confidence,
            bounded=self.bounded,
            widened_by=self.widened_by,
        )


# --- the paired ratio's interval, valid at every look ---------------------------------------------
#
# The rounds look at a pair after every round from min_rounds on and stop once it is decided (and,
# racing, drop an engine once it is out of the running), so a fixed-n sign-test interval, checked
# again and again, would exclude the true ratio more often than 5 % of the time: on the CI VM's
# spells a pair of engines whose true ratio lay on the tie band's edge was called "slower" in 13 %
# of points (scripts/simulate_confidence.py). The paired interval is therefore a confidence
# sequence: order statistics x(k_n) and x(n+1-k_n) whose ranks k_n are computed, look by look, so
# that a median outside them at *any* look from the first has probability at most 1 - confidence
# (the sign test's own walk, computed exactly; any continuous distribution of independent rounds).
# The first look may spend what n0 rounds all on one side cost (2 / 2**n0, so a point whose rounds
# all agree still decides in min_rounds rounds); the rest of the error is spent as 1/n, so later
# looks keep the power to decide a noisy pair. scripts/simulate_confidence.py measures what that
# does for the whole procedure, on the host spells measured here as well.


class _SequentialRanks:
    """k_n for n = 0, 1, …: the sign test's confidence sequence for the median at one level.
    0 where no interval is possible yet (the interval is then the whole range, and says nothing)."""

    def __init__(self, alpha: float):
        import numpy as np

        self.alpha = alpha
        # The first look: the fewest values whose range alone bounds the median at this level.
        self.first = next(n for n in range(1, 64) if reaches_confidence(n, 1.0 - alpha))
        self.ranks = [0]  # n = 0
        # P(S_n = s and no look so far excluded the median), S_n the count of values below it.
        self._alive = np.ones(1)
        self._spent = 0.0

    def _spend(self, n: int) -> float:
        """The error that may have been spent by the look at n values."""
        first_share = 2 * 0.5**self.first / self.alpha
        return self.alpha * (1.0 - (1.0 - first_share) * self.first / n)

    def rank(self, n: int) -> int:
        import numpy as np

        while len(self.ranks) <= n:
            look = len(self.ranks)
            grown = np.zeros(look + 1)  # one more value: above the median or below it, 1/2 each
            grown[:-1] += self._alive * 0.5
            grown[1:] += self._alive * 0.5
            self._alive = grown
            if look < self.first:
                self.ranks.append(0)
                continue
            # The interval (x(k), x(n+1-k)) excludes the median when at most k-1 values lie on one
            # side of it: k grows while the walk's mass newly excluded (both sides alike) fits in
            # what may be spent by this look. Mass excluded at an earlier look is gone, so k never
            # shrinks from one look to the next.
            allowed = self._spend(look)
            k, excluded = 0, 0.0
            while k < look // 2 and self._spent + excluded + 2 * self._alive[k] <= allowed * (1 + 1e-12):
                excluded += 2 * self._alive[k]
                k += 1
            self._spent += excluded
            self._alive[:k] = 0.0
            self._alive[look - k + 1 :] = 0.0
            self.ranks.append(k)
        return self.ranks[n]


@functools.lru_cache(maxsize=64)  # a level per family size (stats.family_confidence) a compare meets
def _sequential_ranks(alpha: float) -> _SequentialRanks:
    return _SequentialRanks(alpha)


# --- one confidence for every pair of a point ----------------------------------------------------
#
# A point of k engines has k(k-1)/2 pairs, and its output makes claims about many of them at once
# (the verdict's comparisons, the table's marks, the sweep's crossover sentences), about an engine
# chosen *because* it timed fastest. Each pair's confidence sequence read at 95 % would let a
# point of ten equal engines carry some false "faster" in a quarter to two thirds of points
# (scripts/simulate_confidence.py measured it). So each pair's sequence is read at
# 1 - (1 - confidence) / pairs (Bonferroni over the point's pairs): with probability at least
# ``confidence`` every pair's interval holds its true ratio at every look together — whichever
# pairs are then compared, whichever engine leads, however the rounds stopped. The union bound
# needs no independence between the pairs (they share engines and rounds). Its price is the first
# look: a pair of a point of ten engines can decide from round 11 on (two engines: round 6).


def family_confidence(engines: int, confidence: float = CONFIDENCE) -> float:
    """The confidence each pair's interval is read at so that all pairs of ``engines`` engines
    timed together hold at ``confidence`` together (above)."""
    pairs = engines * (engines - 1) // 2
    return 1.0 - (1.0 - confidence) / max(pairs, 1)


def first_deciding_round(engines: int, confidence: float = CONFIDENCE) -> int:
    """The first round at which a pair of a point of ``engines`` engines can be decided: the
    fewest rounds whose range alone bounds a median at the pair's level (6 for two engines, 7
    for three, 11 for ten)."""
    return _sequential_ranks(round(1.0 - family_confidence(engines, confidence), 12)).first


def sequential_median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The median's interval from a confidence sequence at ``confidence`` (above): valid whichever
    look it is read at. None before the first look that can bound it."""
    ordered = sorted(values)
    k = _sequential_ranks(round(1.0 - confidence, 12)).rank(len(ordered))
    if k == 0:
        return None
    return ordered[k - 1], ordered[len(ordered) - k]


def paired_ratio(
    a_by_round: dict[Any, float], b_by_round: dict[Any, float], tie: float, confidence: float = CONFIDENCE
) -> RatioEstimate | None:
    """A/B from takes measured side by side: the median of the rounds' ratios of A's take median
    to B's, with the sign test's confidence sequence for that median (valid at whichever round
    the rounds stopped, above). Both saw the host and the GPU as they were
    in that round, so a host that changes speed between rounds moves both alike. None when no
    round has both."""
    rounds = sorted(set(a_by_round) & set(b_by_round))
    return ratio_of_rounds([a_by_round[r] / b_by_round[r] for r in rounds if b_by_round[r] > 0], tie, confidence)


def ratio_of_rounds(ratios: list[float], tie: float, confidence: float = CONFIDENCE) -> RatioEstimate | None:
    """paired_ratio from the rounds' ratios of A's take median to B's, in any order (their median
    and its interval depend on the values alone): for callers that hold the takes round by round
    already. None when there are none."""
    if not ratios:
        return None
    interval = sequential_median_interval(ratios, confidence)
    # Too few rounds to reach the confidence: their whole range, and no decision (never a guess).
    low, high = interval if interval is not None else (min(ratios), max(ratios))
    said = outcome(low, high, tie) if interval is not None else "ambiguous"
    return RatioEstimate(
        ratio=ratio_median(ratios),
        low=low,
        high=high,
        rounds=len(ratios),
        outcome=said,
        confidence=confidence,
        bounded=interval is not None,
    )


def ratio_median(ratios: Sequence[float]) -> float:
    """The median of ratios, the geometric mean of the two middle ones for an even count: so that
    B over A is exactly 1 over A over B, whichever of the two a report computes (the arithmetic
    mean of 105.0 and 115.0 inverts to 1/110 where 1/105 and 1/115 average to 1/109.8)."""
    ordered = sorted(ratios)
    n = len(ordered)
    return float(ordered[n // 2] if n % 2 else math.sqrt(ordered[n // 2 - 1] * ordered[n // 2]))


def unpaired_ratio(
    a_median: float,
    a_interval: tuple[float, float],
    b_median: float,
    b_interval: tuple[float, float],
    tie: float,
    swing: float = 1.0,
) -> RatioEstimate:
    """A/B from two medians measured apart, each with its own interval: the ratio's interval is
    the widest the two allow (A's low over B's high, A's high over B's low), widened by ``swing``
    each way where something the two intervals cannot see may have moved one against the other
    between their measurements (the host's speed: pipeline/report/confidence.py, apart_ratio)."""
    low = a_interval[0] / b_interval[1] / swing if b_interval[1] > 0 else math.inf
    high = a_interval[1] / b_interval[0] * swing if b_interval[0] > 0 else math.inf
    return RatioEstimate(ratio=a_median / b_median, low=low, high=high, outcome=outcome(low, high, tie), widened_by=swing)


def median(values: Sequence[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
