"""When a shape point's rounds end, and which engines leave them before: the rule the rounds loop
(pipeline/measuring/rounds.py) applies after every round.

* **Stop when decided**: the engine whose per-round times are lowest (the leader) against each of
  the others is "the same" (its ratio's interval within the tie band), or faster or slower beyond
  the band; an interval that holds 1, or excludes it but reaches across an edge of the band, keeps
  the rounds going.
* **One confidence for the point**: every pair's interval is read at the level that makes all the
  pairs of the point's engines hold together at 95 % (stats.family_confidence), as the verdict
  reads them, so that what the rounds stop on is what the verdict then claims.
* **Racing**: an engine the leader is faster than beyond the tie band, by the same interval, is out
  of the running — no further round can make it the answer — and leaves the rounds, which then
  time only the contenders. The baseline toolchain's engines stay, so that every speedup keeps its
  paired interval. As F-race and successive halving drop candidates, but by the paired interval the
  verdict itself decides by (pipeline/report/pairs.py), read at every look as a confidence
  sequence (pipeline/measuring/stats.py), so that leaving early claims no more than a decision at the end.

scripts/simulate_confidence.py measures how often the whole procedure, racing or not, names a wrong
fastest engine or claims a difference inside the tie band.
"""

from __future__ import annotations

from typing import Protocol

from pipeline.measuring.stats import RatioEstimate, at_band_edge, family_confidence, paired_ratio


class Take(Protocol):
    """What the rule reads of a take (pipeline/measuring/rounds.py, Take): its round, its median and
    whether it was dropped."""

    round: int
    median_ms: float
    dropped: str | None


def _medians(takes: dict[str, list[Take]]) -> dict[str, dict[int, float]]:
    """Each engine's kept take medians by round (dropped takes left out), engines with none left out."""
    medians = {key: {take.round: take.median_ms for take in entries if take.dropped is None} for key, entries in takes.items()}
    return {key: rounds for key, rounds in medians.items() if rounds}


def _leader(medians: dict[str, dict[int, float]], tie: float) -> str:
    """The engine whose per-round times are lowest: each one's paired ratio to the first engine,
    the least of them (the point estimate: no interval is read)."""
    reference = next(iter(medians))

    def against_reference(key: str) -> float:
        estimate = paired_ratio(medians[key], medians[reference], tie)
        return estimate.ratio if estimate is not None else float("inf")

    return min(medians, key=against_reference)


def _beyond_the_band(estimate: RatioEstimate | None, tie: float) -> bool:
    """Whether the leader is faster beyond the tie band: its decided outcome (pairs.decided)."""
    return estimate is not None and estimate.outcome == "faster" and not at_band_edge(estimate.low, estimate.high, tie)


def undecided(takes: dict[str, list[Take]], tie: float, engines: int) -> list[tuple[str, str, RatioEstimate | None]]:
    """The comparisons the verdict needs that the takes do not settle yet: the leader against each
    of the others, where their ratio's interval holds 1 without lying within the tie band, or
    excludes 1 but reaches across an edge of the band (more rounds could still make it "the same":
    stopping there would let two runs disagree). ``engines``: how many the point's rounds time
    (those raced out too), whose pairs the intervals hold for together."""
    medians = _medians(takes)
    if len(medians) < 2:
        return []
    leader = _leader(medians, tie)
    confidence = family_confidence(engines)
    open_pairs = []
    for other in medians:
        if other == leader:
            continue
        estimate = paired_ratio(medians[leader], medians[other], tie, confidence)
        if (
            estimate is None
            or estimate.outcome == "ambiguous"
            or (estimate.outcome != "same" and at_band_edge(estimate.low, estimate.high, tie))
        ):
            open_pairs.append((leader, other, estimate))
    return open_pairs


def out_of_the_running(takes: dict[str, list[Take]], tie: float, stays: set[str], engines: int) -> list[str]:
    """The engines the leader is faster than beyond the tie band (decided, not at the band's edge,
    read as ``undecided`` reads it): out of the running at this point, they may leave its rounds;
    those in ``stays`` never do."""
    medians = _medians(takes)
    if len(medians) < 2:
        return []
    leader = _leader(medians, tie)
    confidence = family_confidence(engines)
    return [
        key
        for key in medians
        if key != leader and key not in stays and _beyond_the_band(paired_ratio(medians[leader], medians[key], tie, confidence), tie)
    ]


def open_pair_words(leader: str, other: str, estimate: RatioEstimate | None) -> str:
    """Why a comparison is still open: "a against b undecided (0.962–1.041)", or, for an interval
    that excludes 1 but reaches across an edge of the tie band, "a faster than b, by less or more
    than the tie width (0.963–0.988)"."""
    if estimate is None:
        return f"{leader} against {other} undecided (too few rounds)"
    interval = f"({estimate.low:.3f}–{estimate.high:.3f})"
    if estimate.outcome in ("faster", "slower"):
        return f"{leader} {estimate.outcome} than {other}, by less or more than the tie width {interval}"
    return f"{leader} against {other} undecided {interval}"
