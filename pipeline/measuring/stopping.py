"""When a shape point's rounds end, and which engines leave them before: the rule the rounds loop
(pipeline/measuring/rounds.py) applies after every round.

* **Stop when decided**: the engine whose per-round times are lowest (the leader) against each of
  the others is "the same" (its ratio's interval within the tie band), or faster or slower (its
  interval excludes 1, whether or not it reaches across an edge of the band: "faster by 1.03×
  [1.02–1.04]" is a claim the interval backs as well as one wholly beyond the band); only an
  interval that holds 1 without lying within the band keeps the rounds going.
* **One confidence for the point**: every pair's interval is read at the level that makes all the
  pairs of the point's engines hold together at 95 % (stats.family_confidence), as the verdict
  reads them, so that what the rounds stop on is what the verdict then claims.
* **Racing**: an engine the leader is faster than, by the same interval, is out of the running — no further round can make it the answer — and leaves the rounds, which then
  time only the contenders. The baseline toolchain's engines stay, so that every speedup keeps its
  paired interval. As F-race and successive halving drop candidates, but by the paired interval the
  verdict itself decides by (pipeline/report/pairs.py), read at every look as a confidence
  sequence (pipeline/measuring/stats.py), so that leaving early claims no more than a decision at the end.
* **Grossly slower, before the interval can act**: the interval needs six rounds (more with more
  engines: stats.first_deciding_round), so from round GROSS_ROUNDS until then an engine whose every
  kept take, over at least GROSS_ROUNDS rounds, lasted more than GROSS_FACTOR times the leader's
  slowest take in the same rounds leaves too (``grossly_slower``). No interval backs it: its
  false-drop rate is what scripts/simulate_confidence.py measures on the noise shapes of this
  project's machines and the lent GPUs (docs/confidence.md). Comparing the engine's fastest take
  with the leader's slowest, one stalled take cannot make it leave, nor can a host spell that
  slows the leader; only the engine alone slowed by more than GROSS_FACTOR for GROSS_ROUNDS rounds
  could, well beyond the host spells measured (1.5-1.8x). The verdict reads the rule again from
  the takes (pipeline/report/pairs.py, grossly_beaten): an engine so dropped is no answer.

* **By a percentile** (``[profile] by = "p99"``, pipeline/measuring/ranking.py): the leader is the
  engine of least percentile, and each comparison is the ratio of two engines' own intervals of
  it, bounded by their takes from a confidence sequence at the level that holds the point's engines
  together; the rounds go on until those are decided or budget_s is spent, and racing drops by the
  same comparisons. The grossly-slower rule is a median's (a take's median says little of its
  tail) and does not act. scripts/simulate_tails.py measures the wrong claims of that procedure.
* **By energy** (``by = "energy"``): the rule above, paired round by round, read from each take's
  joules per inference instead of its median (ranking.Ranking.per_take); takes whose counter did
  not resolve give no figure, and an engine with none is left out of the comparisons (more rounds
  cannot give it a reading), as an engine with no kept take is. The grossly-slower rule reads
  times and does not act.

scripts/simulate_confidence.py measures how often the whole procedure, racing or not, names a wrong
fastest engine or makes a false claim about a pair ("faster" where the truth is not, "the same"
where the truth lies beyond the band).
"""

from __future__ import annotations

from typing import Protocol

from pipeline.measuring.ranking import MEDIAN, Ranking, ranking
from pipeline.measuring.records import RoundsOutcome
from pipeline.measuring.stats import RatioEstimate, at_band_edge, family_confidence, first_deciding_round, paired_ratio

# The early rule (grossly_slower): how many times the leader's slowest take every kept take of an
# engine must exceed, over at least how many rounds (docs/measurement.md: chosen from the
# simulation's false drops and catches).
GROSS_FACTOR = 3.0
GROSS_ROUNDS = 3
# Which rule took an engine out of the running (RoundsRecord.raced_out_by).
INTERVAL, GROSS = "interval", "grossly slower"


class Take(Protocol):
    """What the rule reads of a take (pipeline/measuring/rounds.py, Take): its round, its median and
    whether it was dropped."""

    round: int
    median_ms: float
    dropped: str | None


def _medians(takes: dict[str, list[Take]], by: Ranking = MEDIAN) -> dict[str, dict[int, float]]:
    """Each engine's kept takes' figures by round (``by``'s per-take figure: their medians unless
    said; dropped takes and takes without the figure left out), engines with none left out."""
    figure = by.per_take or MEDIAN.per_take
    medians = {
        key: {take.round: value for take in entries if take.dropped is None and (value := figure(take)) is not None}
        for key, entries in takes.items()
    }
    return {key: rounds for key, rounds in medians.items() if rounds}


def _leader(medians: dict[str, dict[int, float]], tie: float) -> str:
    """The engine whose per-round times are lowest: each one's paired ratio to the first engine,
    the least of them (the point estimate: no interval is read)."""
    reference = next(iter(medians))

    def against_reference(key: str) -> float:
        estimate = paired_ratio(medians[key], medians[reference], tie)
        return estimate.ratio if estimate is not None else float("inf")

    return min(medians, key=against_reference)


def _faster(estimate: RatioEstimate | None) -> bool:
    """Whether the leader is faster by the interval: it excludes 1 (and does not lie within the tie
    band, which says "the same")."""
    return estimate is not None and estimate.outcome == "faster"


def _against_the_leader(
    takes: dict[str, list[Take]], tie: float, engines: int, by: Ranking = MEDIAN, times: dict[str, list[float]] | None = None
) -> list[tuple[str, str, RatioEstimate | None]]:
    """(leader, other, the leader's time over the other's) for each other engine with kept takes,
    read at the level that holds all pairs of ``engines`` engines together; none where fewer than
    two have takes. ``by`` a percentile: each engine's by its kept runs (``times``), below."""
    medians = _medians(takes, by if by.paired else MEDIAN)
    if len(medians) < 2:
        return []
    if not by.paired:
        readings = times if isinstance(times, Readings) else Readings(times or {})
        return _against_the_leader_by(by, medians, readings, tie, engines)
    leader = _leader(medians, tie)
    confidence = family_confidence(engines)
    return [(leader, other, paired_ratio(medians[leader], medians[other], tie, confidence)) for other in medians if other != leader]


class Readings:
    """Each engine's kept runs (``times``), and what a percentile ranking reads of them, read once
    a round however many of the rules below ask (racing asks up to four times)."""

    def __init__(self, times: dict[str, list[float]]):
        self.times = times
        self._read: dict[tuple, tuple] = {}

    def read(self, by: Ranking, key: str, kept: int, engines: int):
        at = (by.name, key, len(self.times.get(key, ())), kept, engines)
        if at not in self._read:
            self._read[at] = by.read(self.times.get(key, ()), kept, engines)
        return self._read[at]


def _against_the_leader_by(
    by: Ranking, medians, readings: Readings, tie: float, engines: int
) -> list[tuple[str, str, RatioEstimate | None]]:
    """As _against_the_leader, by a percentile: the leader the engine of least percentile of its
    kept runs, each pair the ratio of the two engines' own intervals (ranking.Ranking.ratio)."""
    # An engine's kept takes are its rounds with a kept take (one take a round).
    figures = {key: readings.read(by, key, len(medians[key]), engines) for key in medians}
    leader = min(figures, key=lambda key: figures[key][0] if figures[key][0] is not None else float("inf"))
    return [(leader, other, by.ratio(figures[leader], figures[other], tie, engines)) for other in figures if other != leader]


def undecided(
    takes: dict[str, list[Take]], tie: float, engines: int, by: Ranking = MEDIAN, times=None
) -> list[tuple[str, str, RatioEstimate | None]]:
    """The comparisons the verdict needs that the takes do not settle yet: the leader against each
    of the others, where their ratio's interval holds 1 without lying within the tie band (too
    few rounds for any interval counts as that). An interval that excludes 1 settles its pair
    even where it reaches across an edge of the band: the pair is faster or slower by it, and a
    second run that stops inside the band ("the same") says nothing its interval contradicts
    (docs/confidence.md, "Two runs of the same sweep"). ``engines``: how many the point's rounds
    time (those raced out too), whose pairs the intervals hold for together; ``by`` and ``times``:
    what they are compared by (_against_the_leader)."""
    return [pair for pair in _against_the_leader(takes, tie, engines, by, times) if pair[2] is None or pair[2].outcome == "ambiguous"]


def unsettled(
    takes: dict[str, list[Take]], tie: float, engines: int, by: Ranking = MEDIAN, times=None
) -> list[tuple[str, str, RatioEstimate | None]]:
    """The leader's comparisons that more rounds could still move between "faster" and "the same":
    those undecided, and those decided by an interval that reaches across an edge of the tie band.
    What the rounds keep their pace for where the host may set it (pace.host_sets_the_pace): a pair
    decided beyond the band is left to rounds of any length."""

    def settled(estimate: RatioEstimate | None) -> bool:
        if estimate is None or estimate.outcome == "ambiguous":
            return False
        return estimate.outcome == "same" or not at_band_edge(estimate.low, estimate.high, tie)

    return [pair for pair in _against_the_leader(takes, tie, engines, by, times) if not settled(pair[2])]


def out_of_the_running(
    takes: dict[str, list[Take]], tie: float, stays: set[str], engines: int, by: Ranking = MEDIAN, times=None
) -> list[str]:
    """The engines the leader is faster than by the interval (decided, read as ``undecided`` reads
    it): out of the running at this point, they may leave its rounds; those in ``stays`` never do."""
    return [other for _, other, estimate in _against_the_leader(takes, tie, engines, by, times) if other not in stays and _faster(estimate)]


def gross(leader_by_round: dict, other_by_round: dict, factor: float = GROSS_FACTOR, least: int = GROSS_ROUNDS) -> bool:
    """Whether ``other`` is grossly slower than ``leader`` by their take medians by round: in at
    least ``least`` rounds where both have a kept take, every one of ``other``'s lasted more than
    ``factor`` times the slowest of ``leader``'s in those rounds."""
    shared = set(leader_by_round) & set(other_by_round)
    if len(shared) < least:
        return False
    return min(other_by_round[r] for r in shared) > factor * max(leader_by_round[r] for r in shared)


def gross_rule(leader: str = "the leader") -> str:
    """The early rule in words, as a row's note and the crossovers say it: "grossly slower, every
    take over 3× the leader's slowest" (``leader``: whose takes it was read against)."""
    return f"{GROSS}, every take over {GROSS_FACTOR:g}× {leader}'s slowest"


def grossly_slower(takes: dict[str, list[Take]], tie: float, stays: set[str], engines: int, rounds: int, min_rounds: int) -> list[str]:
    """The engines grossly slower than the leader (``gross``) after ``rounds`` rounds, from round
    GROSS_ROUNDS until the interval can act (``min_rounds`` and the first round a pair of
    ``engines`` engines can be decided at); none otherwise. Those in ``stays`` never are."""
    if not GROSS_ROUNDS <= rounds < max(min_rounds, first_deciding_round(engines)):
        return []
    medians = _medians(takes)
    if len(medians) < 2:
        return []
    leader = _leader(medians, tie)
    return [key for key in medians if key != leader and key not in stays and gross(medians[leader], medians[key])]


def race(
    takes: dict[str, list[Take]],
    tie: float,
    stays: set[str],
    engines: int,
    rounds: int,
    min_rounds: int,
    by: Ranking = MEDIAN,
    times: dict[str, list[float]] | None = None,
) -> tuple[dict[str, str], list[tuple[str, str, RatioEstimate | None]]]:
    """After ``rounds`` rounds of the engines still running (``takes``): those that leave them now,
    each with the rule that took it out (GROSS, INTERVAL), and the comparisons left open among the
    rest. The grossly slower leave whatever the rest do (the interval cannot decide yet); those
    out of the running by the interval (from ``min_rounds`` on) only while the rest stay
    undecided: a point decided now ends whole. ``by``, ``times``: what they are compared by
    (a percentile's or energy's rounds have no grossly-slower rule: the module's docstring says why)."""
    open_pairs = undecided(takes, tie, engines, by, times)
    if not open_pairs:
        return {}, open_pairs
    gross_out = grossly_slower(takes, tie, stays, engines, rounds, min_rounds) if by.paired and by.times else []
    out = dict.fromkeys(gross_out, GROSS)
    contenders = {key: value for key, value in takes.items() if key not in out}
    open_pairs = undecided(contenders, tie, engines, by, times) if out else open_pairs
    if rounds >= min_rounds and open_pairs:
        by_interval = out_of_the_running(contenders, tie, stays, engines, by, times)
        open_pairs = undecided({key: value for key, value in contenders.items() if key not in by_interval}, tie, engines, by, times)
        if open_pairs:  # the rounds go on, without those out of the running
            out.update(dict.fromkeys(by_interval, INTERVAL))
    return out, open_pairs


def open_pair_words(leader: str, other: str, estimate: RatioEstimate | None) -> str:
    """Why a comparison is still open: "a against b undecided (0.962–1.041)"."""
    if estimate is None:
        return f"{leader} against {other} undecided (too few rounds)"
    return f"{leader} against {other} undecided ({estimate.low:.3f}–{estimate.high:.3f})"


# --- what a stop leaves open, in words (the run warns with them: stages/point.py) ---------------------


def stop_words(outcome: RoundsOutcome) -> list[str]:
    """What the run warns of when a point's rounds end: what the budget left open, a ranking
    that had nothing to rank, a lone engine's unbounded percentile."""
    words = [undecided_words(outcome)] if outcome.stop == "budget" else []
    if outcome.stopped_by and outcome.stopped_by != outcome.settings.by:
        words.append(unranked_words(outcome))
    if outcome.stop == "alone" and (alone := alone_words(outcome)):
        words.append(alone)
    return words


def undecided_words(outcome: RoundsOutcome) -> str:
    """What the budget left open: "undecided after 8 rounds (budget_s = 30): bf16/torch-compile
    against bf16/torch-reduce-overhead undecided (0.981–1.034)"."""
    running = {k: v for k, v in outcome.takes.items() if k not in outcome.failed and k not in outcome.raced_out}
    by = ranking(outcome.stopped_by or outcome.settings.by)  # the pairs the rounds stopped on: by the median, energy or a percentile
    needed = by.takes_needed(len(outcome.entrants))
    kept = [sum(1 for take in takes if take.dropped is None) for takes in running.values()]
    if needed and kept and min(kept) < needed:  # no interval can be read yet: that, not the pairs, is what is open
        pairs = f"{by.name} needs {needed} takes of each engine, has {min(kept)}"
    else:
        pairs = "; ".join(
            open_pair_words(*pair) for pair in undecided(running, outcome.settings.tie, len(outcome.entrants), by, outcome.times_ms)
        )
    which = "" if by is MEDIAN else f" by {by.name}"
    return f"undecided{which} after {outcome.rounds} rounds (budget_s = {outcome.settings.budget_s:g})" + (f": {pairs}" if pairs else "")


def alone_words(outcome: RoundsOutcome) -> str | None:
    """What a percentile asked of an engine timed alone cannot give: "alone: nothing to rank by
    p99, and its p99 is unbounded (it needs 437 takes, has 6): raise [profile] min_rounds to bound
    it"; None where it is bounded or the ranking is not a percentile. Engines that failed are no
    part of it."""
    by = ranking(outcome.settings.by)
    # At the level compare reads a point's percentiles at, never below two engines' (report/
    # ranked_decision.py, point_engines): 437 takes for a p99 of one engine too.
    needed = by.takes_needed(max(len(outcome.entrants), 2))
    kept = [sum(1 for take in takes if take.dropped is None) for key, takes in outcome.takes.items() if key not in outcome.failed]
    if not needed or not kept or min(kept) >= needed:
        return None
    return (
        f"alone: nothing to rank by {by.name}, and its {by.name} is unbounded (it needs {needed} takes, has {min(kept)}): "
        "raise [profile] min_rounds to bound it (docs/tails.md)"
    )


def unranked_words(outcome: RoundsOutcome) -> str:
    """Why the rounds stopped on the medians where energy was asked for: "nothing to rank by energy:
    no engine read (no RAPL: /sys/class/powercap absent); the rounds stopped on the medians"."""
    whys = {key: why_not for key, (_, why_not) in outcome.energy.items() if why_not}
    # One reason for all (no RAPL here) is said once.
    why = next(iter(whys.values())) if len(set(whys.values())) == 1 else "; ".join(f"{key}: {why}" for key, why in whys.items())
    read = [key for key, (how, _) in outcome.energy.items() if how is not None]
    count = f"{len(read)} of {len(outcome.entrants)} engines read" if read else "no engine read"
    return (
        f"nothing to rank by {outcome.settings.by}: {count}"
        + (f" ({why})" if why else "")
        + f"; the rounds stopped on the {outcome.stopped_by}s"
    )
