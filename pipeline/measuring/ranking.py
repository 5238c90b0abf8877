"""What a verdict ranks engines by (``[profile] by``, ``--by``): the median, as ever, or a
percentile of the per-iteration times — and how two engines compare by it, the same way for the
rounds' stopping rule (pipeline/measuring/stopping.py) and the report's verdict
(pipeline/report/ranked_decision.py), so that what the rounds stop on is what the verdict claims.

* **median** (the default): the paired ratio of the take medians round by round, read at the
  level that holds every pair of the point's engines together (stats.family_confidence).
* **p90, p99**: a percentile of an engine's runs has no paired reading — a round's two takes say
  nothing of either tail on their own — so each engine's percentile is bounded by itself, by its
  takes (a take's runs share the take's host and clock and count about as one:
  quantiles.take_quantile_interval), from a confidence sequence, so that the interval holds at
  whichever round the rounds stopped at. Each engine's interval is read at 1 − 5 %/K for the K
  engines of the point (Bonferroni across engines): all K hold together at 95 %, and then so does
  every pair's ratio interval, [A's low / B's high, A's high / B's low] (stats.unpaired_ratio).
  Where an engine's takes cannot bound its percentile at that level (a p99 of two engines needs
  437 takes, quantiles.sequential_takes_needed) the pair is undecided, never a guess.

Another ranking (energy per inference, say) is one more entry of RANKINGS with its own reading of
a row and of the rounds' takes; its name then goes in catalog/settings.py's RANKED_BY, which the
catalog validates ``by`` against (the catalog is a floor below this package and cannot import it;
a test holds the two lists equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.catalog.settings import RANKED_BY
from pipeline.measuring.quantiles import sequential_take_ranks, sequential_takes_needed
from pipeline.measuring.stats import CONFIDENCE, RatioEstimate, unpaired_ratio
from pipeline.running.errors import UsageError


@dataclass(frozen=True)
class Ranking:
    """A figure engines are ranked by: its name (``--by``), and the quantile of the per-iteration
    times it is (None: the median, compared round by round)."""

    name: str
    quantile: float | None = None

    @property
    def paired(self) -> bool:
        """Whether two engines timed together are compared round by round (the median), rather than
        each by its own interval."""
        return self.quantile is None

    def engine_confidence(self, engines: int) -> float:
        """The level each engine's own interval is read at so that all ``engines`` hold together at
        95 % (Bonferroni across the engines, not the pairs: K intervals, not K(K-1)/2)."""
        return 1.0 - (1.0 - CONFIDENCE) / max(engines, 1)

    def takes_needed(self, engines: int) -> int | None:
        """The fewest takes whose runs can bound this percentile at the level of ``engines``
        engines; None for the median (its rounds decide, stats.first_deciding_round)."""
        if self.quantile is None:
            return None
        return sequential_takes_needed(self.quantile, self.engine_confidence(engines))

    def read(self, runs: Sequence[float], takes: int, engines: int) -> tuple[float | None, tuple[float, float] | None]:
        """(figure, interval) of an engine's runs (in any order) in ``takes`` kept takes: the
        percentile (numpy's linear interpolation, as every figure printed) and its interval at the
        level of ``engines`` engines, None where the takes are too few. Only the few order
        statistics they need are found (numpy's partition): the rounds read every engine's after
        every round, and a p99's thousand rounds of launch-bound takes hold tens of thousands of runs."""
        import numpy as np

        if self.quantile is None:
            raise ValueError("the median is compared round by round, not by each engine's interval")
        count = len(runs)
        if count == 0:
            return None, None
        position = self.quantile * (count - 1)
        below = int(position)
        ranks = sequential_take_ranks(count, takes, self.quantile, self.engine_confidence(engines))
        wanted = {below, min(below + 1, count - 1), *((ranks[0] - 1, ranks[1] - 1) if ranks else ())}
        values = np.partition(np.asarray(runs, dtype=float), sorted(wanted))
        low, high = float(values[below]), float(values[min(below + 1, count - 1)])
        figure = low + (high - low) * (position - below)
        return figure, (float(values[ranks[0] - 1]), float(values[ranks[1] - 1])) if ranks else None

    def ratio(
        self, a: tuple[float, tuple[float, float] | None], b: tuple[float, tuple[float, float] | None], tie: float, engines: int
    ) -> RatioEstimate | None:
        """A's figure over B's, each given as (figure, its interval at the level of ``engines``
        engines); None where either interval is missing (too few takes). The pair holds where both
        engines' intervals do: at least 1 − 2 × 5 %/K, the level the estimate records."""
        (a_figure, a_interval), (b_figure, b_interval) = a, b
        if a_interval is None or b_interval is None or not a_figure or not b_figure:
            return None
        estimate = unpaired_ratio(a_figure, a_interval, b_figure, b_interval, tie)
        return estimate.model_copy(update={"confidence": 1.0 - 2 * (1.0 - self.engine_confidence(engines))})


MEDIAN = Ranking("median")
RANKINGS = {ranking.name: ranking for ranking in (MEDIAN, Ranking("p90", 0.90), Ranking("p99", 0.99))}
assert tuple(RANKINGS) == RANKED_BY, "catalog/settings.py's RANKED_BY names the rankings registered here"


def ranking(name: str) -> Ranking:
    """The ranking called ``name`` (``--by``); a UsageError naming the ones there are otherwise."""
    if name not in RANKINGS:
        raise UsageError(f"--by {name!r} is no ranking.", hint=f"use one of {', '.join(RANKINGS)}")
    return RANKINGS[name]
