"""Ranking by a percentile (pipeline/measuring/ranking.py, ``[profile] by``): each engine's p90 or
p99 bounded by its takes at the level that holds the point's engines together, the rounds running
until those comparisons are decided (pipeline/measuring/stopping.py), racing by them, and the
catalog's ``by`` checked against the rankings there are."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from pydantic import ValidationError

from pipeline.catalog import ProfileSettings
from pipeline.catalog.settings import RANKED_BY
from pipeline.measuring.ranking import MEDIAN, RANKINGS, ranking
from pipeline.measuring.rounds import rounds_loop
from pipeline.measuring.stopping import INTERVAL, _against_the_leader, undecided
from pipeline.running.errors import UsageError
from tests.measuring.test_early_drop import _QuietHost, _Unheld

P90, P99 = RANKINGS["p90"], RANKINGS["p99"]


class Tailed:
    """An engine whose every take runs ``runs`` (its tail in each take: a take's runs share its
    host and clock), at once."""

    timing = "GPU time (CUDA events)"

    def __init__(self, runs: list[float]):
        self.runs = runs

    def take(self, runs: int, min_ms: float) -> list[float]:
        return list(self.runs)

    def evidence(self) -> dict:
        return {}


# Medians 1.0 and 1.2; p99s 2.0 and 1.2: one is faster by its median, the other by its p99.
SPIKY, STEADY = [1.0] * 9 + [2.0], [1.2] * 10


def rounds(engines: dict, by: str, racing: bool = False, stays=frozenset()):
    """The rounds on a clock of their own, a millisecond a look: the budget (a second) is about
    a thousand rounds, however loaded the machine running the test."""
    clock = itertools.count()
    settings = ProfileSettings(take_ms=1, take_runs=10, round_ms=0, min_rounds=6, budget_s=1, racing=racing, by=by)
    return rounds_loop(
        engines, settings, random.Random(3), None, None, _QuietHost(), _Unheld(), {}, now=lambda: next(clock) / 1000, stays=stays
    )


def test_the_catalog_takes_the_rankings_registered_and_names_the_others():
    assert tuple(RANKINGS) == RANKED_BY and ProfileSettings().by == "median" and ranking("median") is MEDIAN
    with pytest.raises(ValidationError, match=r"by = 'p95' is no ranking; use one of median, p90, p99"):
        ProfileSettings(by="p95")
    with pytest.raises(UsageError, match="'p95' is no ranking"):
        ranking("p95")


def test_each_engines_interval_is_read_so_that_all_of_the_point_hold_together():
    # Bonferroni across the engines: two hold together at 95 % when each holds at 97.5 %.
    assert P99.engine_confidence(2) == pytest.approx(0.975) and P99.engine_confidence(4) == pytest.approx(0.9875)
    # A confidence sequence at that level needs more takes than the 368 of one fixed look at 95 %.
    assert (P99.takes_needed(2), P99.takes_needed(3), P90.takes_needed(2)) == (437, 477, 42)
    assert MEDIAN.takes_needed(2) is None
    runs = [float(value) for value in range(1000)]
    figure, interval = P99.read(runs, 500, 2)
    assert figure == pytest.approx(989.01) and interval[0] <= figure <= interval[1]
    assert P99.read(runs, 400, 2) == (pytest.approx(989.01), None)  # too few takes: a figure, no interval


def test_the_rounds_by_p99_run_until_every_p99_is_bounded_and_name_the_steadier_engine():
    by_median = rounds({"spiky": Tailed(SPIKY), "steady": Tailed(STEADY)}, "median")
    assert (by_median.stop, by_median.rounds) == ("decided", 6)
    by_p99 = rounds({"spiky": Tailed(SPIKY), "steady": Tailed(STEADY)}, "p99")
    # Decided at the first round two engines' p99 can be bounded, by their intervals: steady's
    # p99 1.2 against spiky's 2.0.
    assert (by_p99.stop, by_p99.rounds) == ("decided", 437)
    ((leader, other, estimate),) = _against_the_leader(by_p99.takes, 0.03, 2, P99, by_p99.times_ms)
    assert (leader, other, estimate.outcome, estimate.paired) == ("steady", "spiky", "faster", False)
    assert (estimate.low, estimate.high) == (pytest.approx(0.6), pytest.approx(0.6))


def test_before_its_takes_can_bound_a_percentile_the_pair_is_open_not_guessed():
    done = rounds({"spiky": Tailed(SPIKY), "steady": Tailed(STEADY)}, "p99")
    takes = {key: entries[:436] for key, entries in done.takes.items()}
    times = {key: runs[: 436 * 10] for key, runs in done.times_ms.items()}
    assert undecided(takes, 0.03, 2, P99, times) == [("steady", "spiky", None)]
    assert undecided(done.takes, 0.03, 2, P99, done.times_ms) == []


class Jittered(Tailed):
    """An engine whose take's runs all lie at ``ms`` times a log-normal jitter of the take."""

    def __init__(self, ms: float, seed: int):
        self.ms, self.rng = ms, random.Random(seed)

    def take(self, runs: int, min_ms: float) -> list[float]:
        return [self.ms * math.exp(self.rng.gauss(0.0, 0.05))] * 10


def test_racing_by_p99_drops_the_engine_whose_p99_is_beaten_and_the_baseline_stays():
    # Two alike with jitter keep their pair open to the budget; spiky's p99 is beaten by the
    # first look that bounds a p99 of four engines, and it leaves; the baseline, slower still, stays.
    engines = {"base": Tailed([3.0] * 10), "spiky": Tailed(SPIKY), "one": Jittered(1.2, 1), "other": Jittered(1.2, 2)}
    done = rounds(engines, "p99", racing=True, stays=frozenset({"base"}))
    assert done.raced_out == {"spiky": P99.takes_needed(4)} and done.raced_out_by == {"spiky": INTERVAL}
    assert done.stop == "budget" or done.rounds > P99.takes_needed(4)
