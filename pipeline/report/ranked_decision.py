"""The verdict by a percentile (``pipeline compare --by p99``) or by energy (``--by energy``): the
answer among a point's candidates when they are ranked by their p90 or p99, or their joules per
inference paired round by round (PairedReading), rather than their median
(pipeline/measuring/ranking.py says how two engines compare by each).

Each candidate's percentile is read from its runs, bounded by its takes from a confidence sequence
at the level that holds all the point's engines together (the same reading the rounds stopped on,
so a verdict read after rounds that stopped on a p99 claims what they decided). A candidate whose
takes cannot bound it at that level (fewer than ``takes_needed``) is compared with nothing: the
verdict names it among those it cannot tell apart and says how many takes the percentile needs,
rather than rank it by a figure its takes cannot back. The median's verdict
(pipeline/report/verdict.py, ``_decide``) is untouched by this module.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.measuring.ranking import Ranking
from pipeline.measuring.stats import RatioEstimate
from pipeline.report import pairs
from pipeline.report.confidence import energy_ratio, time_ratio
from pipeline.report.rows import ComparisonRow

# How two rows are compared round by round, by the row field a paired ranking reads
# (ranking.Ranking.row_field): the median's ratio of round medians, energy's of round energies.
PAIRED_RATIOS = {"median_ms": time_ratio, "joules_per_inference": energy_ratio}


class PairedReading:
    """The candidates by a paired ranking other than the median's own path (``--by energy``): each
    row's figure, and two rows compared round by round (PAIRED_RATIOS) at the family-wise level,
    as the median is. A row without the figure (no energy reading) is compared with nothing, and
    the verdict says why rather than rank it."""

    def __init__(self, by: Ranking):
        self.by, self._ratio = by, PAIRED_RATIOS[by.row_field]

    def figure(self, row: ComparisonRow) -> float | None:
        return getattr(row, self.by.row_field)

    def takes_needed(self) -> None:
        return None  # its rounds decide, as the median's do

    def short_of_takes(self, row: ComparisonRow) -> bool:
        return self.figure(row) is None

    def interval(self, row: ComparisonRow) -> None:
        return None  # a paired figure has an interval only against another row's

    def ratio(self, a: ComparisonRow, b: ComparisonRow, tie: float) -> RatioEstimate | None:
        if self.figure(a) is None or self.figure(b) is None:
            return None
        return self._ratio(a, b, tie)

    def words(self, row: ComparisonRow) -> str:
        """ "energy 0.0123 J/inf", or "" without a reading (``needs`` says why)."""
        figure = self.figure(row)
        return "" if figure is None else f"{self.by.name} {figure:.4g} {self.by.unit}/inf"

    def needs(self, row: ComparisonRow) -> str:
        why = getattr(row, f"{self.by.name}_why_not", None) or "none was read"
        return f"no {self.by.name} reading: {why}"


def reading_for(by: Ranking, candidates: list[ComparisonRow], samples=None):
    """How the verdict reads the candidates by ``by`` where it is not the median: round by round
    (PairedReading), or each by its own percentile interval (PercentileReading)."""
    return PairedReading(by) if by.paired else PercentileReading(by, point_engines(candidates), samples)


def _ranked(reading) -> Callable[[ComparisonRow], tuple[bool, float]]:
    """The order of rows by the reading's figure, rows without one last."""
    return lambda row: (reading.figure(row) is None, reading.figure(row) or 0.0)


class PercentileReading:
    """The candidates' percentile by ``by``: each row's figure and its interval at the level of
    ``engines`` engines, read once per row (a row's runs are sorted once)."""

    def __init__(self, by: Ranking, engines: int, samples: Callable[[ComparisonRow], list[float]] | None = None):
        self.by, self.engines = by, engines
        # A cached row keeps no per-iteration times: ``samples`` reads them again (row_cache.samples).
        self._samples = samples or (lambda row: row.samples_ms)
        self._intervals: dict[int, tuple[float, float] | None] = {}

    def figure(self, row: ComparisonRow) -> float | None:
        return getattr(row, f"{self.by.name}_ms")

    def takes_needed(self) -> int:
        return self.by.takes_needed(self.engines)

    def short_of_takes(self, row: ComparisonRow) -> bool:
        """Whether the row's takes cannot bound its percentile at the point's level (or it was not
        timed in takes at all: a tool's one run)."""
        return self.interval(row) is None

    def interval(self, row: ComparisonRow) -> tuple[float, float] | None:
        if id(row) not in self._intervals:
            bounded = None
            if row.tail_takes:
                bounded = self.by.read(self._samples(row), row.tail_takes, self.engines)[1]
            self._intervals[id(row)] = bounded
        return self._intervals[id(row)]

    def ratio(self, a: ComparisonRow, b: ComparisonRow, tie: float) -> RatioEstimate | None:
        """A's percentile over B's with its interval; None where either row's takes are too few."""
        return self.by.ratio((self.figure(a), self.interval(a)), (self.figure(b), self.interval(b)), tie, self.engines)

    def words(self, row: ComparisonRow) -> str:
        """ "p99 12.412 ms [11.9–13.1]", or "p99 12.412 ms unbounded" where the takes cannot
        bound it at the point's level (``needs`` says how many could). The tables' own interval
        is the row's alone, at 95 %: from 368 takes a p99 is bounded there and may not be here."""
        figure = f"{self.by.name} {self.figure(row):.3f} ms"
        interval = self.interval(row)
        return f"{figure} unbounded" if interval is None else f"{figure} [{interval[0]:.3f}–{interval[1]:.3f}]"

    def needs(self, row: ComparisonRow) -> str:
        if not row.tail_takes:
            return "not timed in takes: no interval"
        return f"{self.by.name} needs {self.takes_needed()} takes, has {row.tail_takes}"


def point_engines(candidates: list[ComparisonRow]) -> int:
    """How many engines the point's intervals hold together for: its candidates, or the largest
    set of rounds any of them was timed in (what the rounds read their intervals at), whichever is
    more."""
    entrants = max((len(names) for row in candidates for _, names in row.round_entrants.values()), default=0)
    return max(len(candidates), entrants, 2)


def decide_by_percentile(verdict, candidates: list[ComparisonRow], group: list[ComparisonRow], baseline_toolchain, reading) -> None:
    """The answer among ``candidates`` by ``reading``'s figure (a percentile, or a paired figure
    such as energy; rows without it last and compared with nothing), as _decide finds it by the
    median: the candidate of least percentile against each other one, then every two of those it
    does not beat, and the fastest of those none beats is the answer, the rest tied with it."""
    verdict.candidates = candidates
    compare = pairs.EachPairOnce(candidates, lambda a, b: reading.ratio(a, b, verdict.tie))

    least = min(candidates, key=_ranked(reading))
    close = [row for row in candidates if row is least or pairs.outcome(compare(least, row)) != "faster"]
    beaten = set()
    for i, a in enumerate(close):
        for b in close[i + 1 :]:
            outcome = pairs.outcome(compare(a, b))
            if outcome == "faster":
                beaten.add(id(b))
            elif outcome == "slower":
                beaten.add(id(a))
    front = [row for row in close if id(row) not in beaten] or close
    verdict.fastest = min(front, key=_ranked(reading))
    verdict.tied = sorted((row for row in front if row is not verdict.fastest), key=_ranked(reading))
    if verdict.fastest is not least:
        for row in candidates:
            if row is not verdict.fastest:
                compare(verdict.fastest, row)
    group_ = [verdict.fastest, *verdict.tied]
    verdict.undecided_among = any(pairs.outcome(compare(a, b)) != "same" for i, a in enumerate(group_) for b in group_[i + 1 :])
    bases = [r for r in group if r.toolchain == baseline_toolchain and reading.figure(r) is not None]
    same = [r for r in bases if r.variant == verdict.fastest.variant]
    verdict.baseline = (same or sorted(bases, key=_ranked(reading)) or [None])[0]
    verdict.baseline_unranked = verdict.baseline is None and any(r.toolchain == baseline_toolchain for r in candidates)
    verdict.comparisons = compare.made()
    if verdict.baseline is not None:
        for row in group_:
            if row is not verdict.baseline and not verdict.compared(verdict.baseline, row):
                verdict.comparisons.append((verdict.baseline, row, reading.ratio(verdict.baseline, row, verdict.tie)))
