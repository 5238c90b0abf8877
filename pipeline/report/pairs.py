"""How two engines decide against each other in a verdict (pipeline/report/verdict.py): what a
pair's ratio interval says once the tie band is taken into account, which rows timed apart another
beats by their own intervals, and whether the answer's group is all "the same".

A pair is decided by its interval, as the rounds stop on it (pipeline/measuring/stopping.py,
``undecided``): "faster" or "slower" where it excludes 1 — also where it reaches across an edge of
the tie band, "faster by 1.03× [1.02–1.04]" — and "the same" where it lies within the band. Two runs
of the same engines may then say "faster by a little" and "the same": their intervals overlap, and
neither contradicts the other (docs/confidence.md, "Two runs of the same sweep";
scripts/check_rerun_agreement.py). ``on_band_edge`` marks such a pair in the JSON.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from pipeline.measuring.pace import HOST_SWING
from pipeline.measuring.stats import RatioEstimate, at_band_edge, tie_band
from pipeline.measuring.stopping import GROSS, gross
from pipeline.report.rows import ComparisonRow


class EachPairOnce:
    """A verdict's comparisons of its candidates, each pair estimated once (``estimate(a, b)``: A's
    figure over B's) and kept in the candidates' order, whichever way round it is asked for."""

    def __init__(self, candidates: list[ComparisonRow], estimate: Callable[[ComparisonRow, ComparisonRow], RatioEstimate | None]):
        self._order = {id(row): index for index, row in enumerate(candidates)}
        self._estimate = estimate
        self._made: dict[tuple[int, int], tuple[ComparisonRow, ComparisonRow, RatioEstimate | None]] = {}

    def __call__(self, a: ComparisonRow, b: ComparisonRow) -> RatioEstimate | None:
        first, second = (a, b) if self._order[id(a)] < self._order[id(b)] else (b, a)
        key = (id(first), id(second))
        if key not in self._made:
            self._made[key] = (first, second, self._estimate(first, second))
        estimate = self._made[key][2]
        return estimate if first is a or estimate is None else estimate.inverse()

    def made(self) -> list[tuple[ComparisonRow, ComparisonRow, RatioEstimate | None]]:
        """Every comparison made, in the candidates' order."""
        return [self._made[key] for key in sorted(self._made, key=lambda key: (self._order[key[0]], self._order[key[1]]))]


# Of the rows whose intervals end lowest, how many beaten_apart keeps at each step of its sweep.
_LOWEST_KEPT = 4


def beaten_apart(rows: list[ComparisonRow], tie: float) -> set[int]:
    """The ids of the rows another row is faster than with confidence by the two medians'
    intervals, among rows not timed together, as confidence.apart_ratio reads such a pair: A/B
    lies in [A's low / B's high, A's high / B's low], widened by HOST_SWING each way where either
    row follows the host; "faster" when that lies below 1 and not within the tie band.

    Two sweeps give every pair its interval: one over every row, the host-followers' own intervals
    widened by HOST_SWING (a pair with one follower widened by HOST_SWING, as apart_ratio widens
    it; a pair of two by its square, no claim the second sweep misses); one over the followers
    alone, each widened by its square root (a pair of two widened by HOST_SWING)."""
    timed = [row for row in rows if row.median_ci_ms is not None]
    followers = [row for row in timed if row.follows_the_host]
    beaten = _beaten_by([(row, _widened(row.median_ci_ms, HOST_SWING if row.follows_the_host else 1.0)) for row in timed], tie)
    if len(followers) > 1:
        beaten |= _beaten_by([(row, _widened(row.median_ci_ms, HOST_SWING**0.5)) for row in followers], tie)
    return beaten


def _widened(interval: tuple[float, float], factor: float) -> tuple[float, float]:
    return interval[0] / factor, interval[1] * factor


def _beaten_by(timed: list[tuple[ComparisonRow, tuple[float, float]]], tie: float) -> set[int]:
    """beaten_apart's sweep over rows each given with the interval it is read by, in n log n, not
    n²: with the rows sorted by their interval's high end, those whose high is under B's low are a
    prefix; of them, those of lowest low end are the ones that can also be beyond the band, and any
    of those timed apart from B beats it (a "faster" A: its high under B's low, and its low under
    B's high over 1 + tie). Rows timed together with B are skipped here (their comparison is paired)."""
    lowest, _ = tie_band(tie)
    apart = sorted(timed, key=lambda entry: entry[1][1])
    highs = [interval[1] for _, interval in apart]
    kept: list[list[tuple[ComparisonRow, tuple[float, float]]]] = []  # per prefix of `apart`: its entries of lowest low end
    for entry in apart:
        previous = kept[-1] if kept else []
        kept.append(sorted([*previous, entry], key=lambda e: e[1][0])[:_LOWEST_KEPT])
    beaten = set()
    for row, (low, high) in apart:
        below_end = bisect_left(highs, low)  # apart[:below_end] end under this row's low: their ratio's interval is below 1
        if below_end == 0:
            continue
        rounds, beyond = set(row.round_medians), high * lowest  # a low end under `beyond`: not "the same"
        lowest_lows = kept[below_end - 1]
        timed_apart = any(interval[0] < beyond and not rounds & set(other.round_medians) for other, interval in lowest_lows)
        if not timed_apart and len(lowest_lows) == _LOWEST_KEPT and all(interval[0] < beyond for _, interval in lowest_lows):
            # each kept one was timed with it: any other of the prefix may beat it
            timed_apart = any(interval[0] < beyond and not rounds & set(other.round_medians) for other, interval in apart[:below_end])
        if timed_apart:
            beaten.add(id(row))
    return beaten


def followers_timed_apart(group: list[ComparisonRow]) -> list[ComparisonRow]:
    """The rows of ``group`` that follow the host and were timed apart from another of it: their
    pairs are read HOST_SWING wider (confidence.apart_ratio)."""
    return [
        row
        for row in group
        if row.follows_the_host and any(not set(row.round_medians) & set(other.round_medians) for other in group if other is not row)
    ]


def undecided(front: list[ComparisonRow], compare, tie: float) -> bool:
    """Whether some two engines of the answer's group are not "the same" (within the tie band).
    Rows timed apart whose intervals all lie within the band of each other are the same pairwise
    (every ratio lies between the lowest low over the highest high and its inverse), without a
    comparison each."""
    if len(front) < 2:
        return False
    intervals = [row.median_ci_ms for row in front]
    sets_of_rounds = [name for row in front for name in row.round_medians]
    # Rows that follow the host are compared apart by intervals HOST_SWING wider (apart_ratio), never "the same".
    apart_unwidened = not any(row.follows_the_host for row in front)
    if apart_unwidened and all(intervals) and len(sets_of_rounds) == len(set(sets_of_rounds)):
        lowest, highest = tie_band(tie)
        low, high = min(i[0] for i in intervals), max(i[1] for i in intervals)
        if high > 0 and low > 0 and lowest <= low / high and high / low <= highest:
            return False
    return any(outcome(compare(a, b)) != "same" for i, a in enumerate(front) for b in front[i + 1 :])


def outcome(estimate: RatioEstimate | None) -> str:
    return estimate.outcome if estimate is not None else "ambiguous"


def on_band_edge(estimate: RatioEstimate | None, tie: float) -> bool:
    """Whether ``estimate`` is faster or slower by an interval that reaches across an edge of the tie
    band ("faster by 1.03× [1.02–1.04]": by less or more than the tie width). Decided all the same;
    the JSON marks it (``at_band_edge``)."""
    return estimate is not None and estimate.outcome in ("faster", "slower") and at_band_edge(estimate.low, estimate.high, tie)


def grossly_beaten(least: ComparisonRow, row: ComparisonRow) -> bool:
    """Whether ``row`` left its rounds grossly slower (pipeline/measuring/stopping.py, ``gross``)
    and is so against ``least`` in a set of rounds they shared: too few rounds for its interval to
    say anything, so it is out of the answer by the rule that took it out, whose false drops the
    simulation measures (scripts/simulate_confidence.py), and no comparison is made of it."""
    if row.raced_out_by != GROSS:
        return False
    shared = set(least.round_medians) & set(row.round_medians)
    return any(gross(least.medians_by_round({group}), row.medians_by_round({group})) for group in shared)
