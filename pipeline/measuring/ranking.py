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

* **energy**: joules per inference, paired round by round as the median is: each round's two
  takes are read by one counter under the same conditions, so the per-round ratio of their
  energies per inference is what is compared, by the median's rule (stats.paired_ratio), read at
  the same family-wise level. Only takes whose counter resolved give a figure
  (pipeline/measuring/energy.py); an engine without any (no counter, a tool's take) has nothing to
  pair and is compared with nothing.

A paired ranking differs from another only in the figure one take gives (``per_take``): the
rounds' stopping rule and racing read it the same way whatever it is. Another ranking is one more
entry of RANKINGS; its name then goes in catalog/settings.py's RANKED_BY, which the catalog
validates ``by`` against (the catalog is a floor below this package and cannot import it; a test
holds the two lists equal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.catalog.settings import RANKED_BY
from pipeline.measuring.quantiles import sequential_take_ranks, sequential_takes_needed
from pipeline.measuring.stats import CONFIDENCE, RatioEstimate, unpaired_ratio
from pipeline.running.errors import UsageError


def take_median(take: Any) -> float | None:
    """A take's figure when ranking by the median: its median time."""
    return take.median_ms


def take_energy(take: Any) -> float | None:
    """A take's figure when ranking by energy: its joules per inference, where its counter resolved."""
    if not getattr(take, "energy_resolved", False) or take.joules is None or not take.energy_runs:
        return None
    return take.joules / take.energy_runs


@dataclass(frozen=True)
class Ranking:
    """A figure engines are ranked by: its name (``--by``), and either the quantile of the
    per-iteration times it is, or the figure each take gives that two engines' takes of a round
    are paired by (``per_take``: the median's, or the energy's)."""

    name: str
    quantile: float | None = None
    per_take: Callable[[Any], float | None] | None = None
    # The unit of its figure, and the row's field that holds it where paired (ranking by a
    # percentile reads ``<name>_ms``).
    unit: str = "ms"
    row_field: str | None = None
    # How the verdict names its answer, and what it beat the others by.
    best: str = "fastest"
    beats: str = "faster than"

    @property
    def paired(self) -> bool:
        """Whether two engines timed together are compared round by round (the median, energy),
        rather than each by its own interval."""
        return self.per_take is not None

    @property
    def times(self) -> bool:
        """Whether it ranks by time: the rules that read times alone (the grossly-slower rule,
        stopping.py) act only then."""
        return self.unit == "ms"

    @property
    def reads_energy(self) -> bool:
        return self.per_take is take_energy

    def engine_confidence(self, engines: int) -> float:
        """The level each engine's own interval is read at so that all ``engines`` hold together at
        95 % (Bonferroni across the engines, not the pairs: K intervals, not K(K-1)/2)."""
        return 1.0 - (1.0 - CONFIDENCE) / max(engines, 1)

    def takes_needed(self, engines: int) -> int | None:
        """The fewest takes whose runs can bound this percentile at the level of ``engines``
        engines; None for a paired ranking (its rounds decide, stats.first_deciding_round)."""
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
            raise ValueError(f"{self.name} is compared round by round, not by each engine's interval")
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


MEDIAN = Ranking("median", per_take=take_median, row_field="median_ms")
ENERGY = Ranking(
    "energy", per_take=take_energy, unit="J", row_field="joules_per_inference", best="least energy", beats="less energy per inference than"
)
RANKINGS = {ranking.name: ranking for ranking in (MEDIAN, Ranking("p90", 0.90), Ranking("p99", 0.99), ENERGY)}
assert tuple(RANKINGS) == RANKED_BY, "catalog/settings.py's RANKED_BY names the rankings registered here"


def ranking(name: str) -> Ranking:
    """The ranking called ``name`` (``--by``); a UsageError naming the ones there are otherwise."""
    if name not in RANKINGS:
        raise UsageError(f"--by {name!r} is no ranking.", hint=f"use one of {', '.join(RANKINGS)}")
    return RANKINGS[name]
