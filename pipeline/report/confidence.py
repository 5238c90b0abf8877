"""Which of two comparison rows is faster, and how sure that is.

Rows timed together in rounds (pipeline/measuring/rounds.py) are compared round by round: the median of
the per-round ratios of their take medians, with the sign test's confidence sequence for that median
(pipeline/measuring/stats.py), read at the level that makes every pair of the set of rounds' engines
hold together at 95 % (``pair_confidence``). Rows measured apart — another run, a trtexec or TensorRT-RTX engine measured
alone — are compared by their medians' own intervals. Either way the comparison is one of the four
outcomes NVIDIA's nvbench-compare-robust reports: faster, slower, same (the ratio's interval lies
within the tie band, 1/(1 + tie) to 1 + tie) or ambiguous.
"""

from __future__ import annotations

from pipeline.measuring.pace import HOST_SWING
from pipeline.measuring.stats import RatioEstimate, family_confidence, ratio_of_rounds, unpaired_ratio
from pipeline.report.rows import ComparisonRow


def time_ratio(a: ComparisonRow, b: ComparisonRow, tie: float) -> RatioEstimate | None:
    """A's time over B's (below 1: A is faster), paired where they share rounds; None when either
    has no number or no interval."""
    if a.median_ms is None or b.median_ms is None:
        return None
    shared = set(a.round_medians) & set(b.round_medians)
    if shared:
        estimate = ratio_of_rounds(a.round_ratios(b, shared), tie, pair_confidence(a, shared))
        if estimate is not None:
            return estimate
    if a.median_ci_ms is None or b.median_ci_ms is None:
        return None
    return apart_ratio(a, b, tie)


def apart_ratio(a: ComparisonRow, b: ComparisonRow, tie: float) -> RatioEstimate:
    """A's time over B's for rows timed apart (another run, a tool's engine profiled alone), from
    their medians' own intervals; widened by pace.HOST_SWING each way where either follows the
    host (ComparisonRow.follows_the_host). Each interval sees only the host of its own run: an
    engine whose time is the host's speed, profiled in a slow spell of it, is slower by the spell
    within its interval, and its six takes can fit in one spell (scripts/simulate_apart.py: two
    equal engines, one launch-bound, in two runs on the lent GPUs' spells were told apart falsely
    at 23 of 60 points unwidened). The host's speed changes by up to HOST_SWING, so the ratio of
    their medians can too, and no more, whichever of the two follows it."""
    swing = HOST_SWING if a.follows_the_host or b.follows_the_host else 1.0
    return unpaired_ratio(a.median_ms, a.median_ci_ms, b.median_ms, b.median_ci_ms, tie, swing)


def energy_ratio(a: ComparisonRow, b: ComparisonRow, tie: float) -> RatioEstimate | None:
    """A's joules per inference over B's (below 1: A spends less; the outcome "faster" reads "less
    energy"), paired by round as time_ratio pairs times: the median of the per-round ratios of
    their takes' energies, read at the level that holds every pair of their set of rounds together.
    None where they share no round whose both takes read the same counter: rows measured apart
    (another run, a tool alone) have no figure to pair, and one take's counter reading has no
    interval of its own to compare them unpaired; nor do readings of two counters (a GPU's and a
    CPU package's) compare."""
    if a.energy_source is None or a.energy_source != b.energy_source:
        return None
    shared = set(a.round_energies) & set(b.round_energies)
    ratios = [
        mine / theirs
        for group in shared
        for mine, theirs in zip(a.round_energies[group], b.round_energies[group])
        if mine is not None and theirs is not None and theirs > 0
    ]
    return ratio_of_rounds(ratios, tie, pair_confidence(a, shared)) if ratios else None


def pair_confidence(row: ComparisonRow, shared) -> float:
    """The level a pair of rows timed together in the sets of rounds ``shared`` is read at: the
    one that holds for every pair of the largest of those sets' engines at once
    (stats.family_confidence), as the rounds read it when they stopped. A set's engines are
    recorded in each of its manifests (``round_entrants``)."""
    engines = max((len(row.round_entrants.get(group, ("", ()))[1]) for group in shared), default=2)
    return family_confidence(engines)


def interval_words(estimate: RatioEstimate) -> str:
    """ "[6.31–6.47], 12 rounds" (paired) or "[5.9–7.0], unpaired"."""
    how = f"{estimate.rounds} rounds" if estimate.paired else "unpaired"
    return f"[{estimate.low:.2f}–{estimate.high:.2f}], {how}"
