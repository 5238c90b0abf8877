"""Who sets a shape point's pace, the host or the GPU: what the rounds (rounds.py) read of each
engine's takes to hold the host, and to choose how long a round lasts.

A GPU run whose host needs much of its GPU time to issue it is launch-bound: the GPU waits for the
host between kernels, and the engine's time follows the host's speed, which on the lent GPUs' vCPUs
and the CI VM changes in spells of 0.4-4 s. Such an engine's point holds the host alone
(host_rounds.py), the report flags it (pipeline/report/flags.py), and while a pair the rounds still
have to decide has such a side the rounds last a second at least, so that six of them cannot fall
in one spell; a pair of engines the GPU times needs no such rounds.
"""

from __future__ import annotations

from pipeline.catalog import ProfileSettings
from pipeline.measuring.stats import median, tie_band

# The timing of an engine whose runs are timed by the host's clock (on the CPU, or a runtime that
# cannot time on the GPU).
HOST_LATENCY = "host latency"
# A GPU run whose host needs at least this share of the run's GPU time to issue it is near
# launch-bound: its time can follow the host's (pipeline/report/flags.py says why this share). Its
# point's rounds hold the host alone (pipeline/measuring/host_rounds.py).
NEAR_LAUNCH_BOUND_SHARE = 0.5
# How far the host's speed can move the time of an engine that follows it: its spells were 1.64x
# apart on the CI VM and 1.8x on the lent GPUs' vCPUs (docs/measurement.md), taken with a margin.
HOST_SWING = 2.0


def issue_share(takes) -> float | None:
    """The host's time to issue a run over the run's GPU time, medians over the takes kept that
    recorded it (in-process takes, or a manifest's); None where none did (a tool's runs, an engine
    timed by the host's clock). The one measure of launch-boundness: the rounds' host hold reads
    it here, the table's flags in pipeline/report/flags.py."""
    issued = [take for take in takes if take.issue_ms is not None and take.dropped is None]
    if not issued:
        return None
    return median([take.issue_ms for take in issued]) / median([take.median_ms for take in issued])


def follows_the_host(host_timed: bool, takes) -> bool:
    """Whether an engine's time moves with the host's speed: timed by the host's clock, or on the
    GPU with a host that needs NEAR_LAUNCH_BOUND_SHARE or more of a run's GPU time to issue it."""
    share = issue_share(takes)
    return host_timed or (share is not None and share >= NEAR_LAUNCH_BOUND_SHARE)


def gpu_timed(host_timed: bool, takes) -> bool:
    """Whether an engine's time is known to be the GPU's: timed on the GPU, by takes that recorded
    the host's time to issue a run, well under the run (under NEAR_LAUNCH_BOUND_SHARE). An engine
    that says nothing of it (a tool's runs in a process of its own) is not known to be."""
    share = issue_share(takes)
    return not host_timed and share is not None and share < NEAR_LAUNCH_BOUND_SHARE


def host_sets_the_pace(unsettled_pairs, engines, takes: dict, tie: float) -> bool:
    """Whether the next round's takes are lengthened to last ``round_ms`` (take_length): while some
    pair that more rounds could still move (``unsettled_pairs``, stopping.unsettled: undecided, or
    decided across an edge of the tie band) holds an engine not known to be GPU-timed
    (``gpu_timed``), and is not already beyond the host's reach (``beyond_the_hosts_reach``). The
    host's speed changes in spells of 0.4-4 s on the lent GPUs and the CI VM
    (docs/measurement.md); it moves a launch-bound engine and not a GPU-bound one, so only such a
    pair with a launch-bound side needs rounds that outlast a spell (the simulation of the rule
    measures both: docs/confidence.md). A pair decided beyond the band — the baseline racing
    keeps, far slower than the leader, say — pads nothing; were short rounds to bring it back to
    the band's edge, it would be unsettled again."""
    keys = {key for pair in unsettled_pairs if not beyond_the_hosts_reach(pair[2], tie) for key in pair[:2]}
    return any(not gpu_timed(engines[key].timing == HOST_LATENCY, takes[key]) for key in keys)


def beyond_the_hosts_reach(estimate, tie: float) -> bool:
    """Whether a pair not yet decided — before the first round that can decide it, at the level
    that holds a point's engines together (eleven rounds for ten engines) — has had every round's
    ratio (two rounds at least) so far beyond the tie band that no spell of the host could bring it
    into the band: more than HOST_SWING beyond its edges. Its rounds then need not outlast the
    host's spells (host_sets_the_pace), as a pair of engines the GPU times needs not: six rounds
    in one spell can make it look slower or faster by as much as the spell, not "the same", nor
    faster the other way. The interval decides it all the same, when it can; a launch-bound
    engine's ratio to another is the host's speed's anyway, and the report says so
    (pipeline/report/flags.py). At the seed matrix's small points eager PyTorch, the baseline that
    stays in every round, is 10-25x slower than the leader, and held every such point's rounds to a
    second each until the interval could first decide it, at round eleven (docs/results/sweeps.md)."""
    if estimate is None or (estimate.rounds or 0) < 2:
        return False
    low_edge, high_edge = tie_band(tie)
    return estimate.high < low_edge / HOST_SWING or estimate.low > high_edge * HOST_SWING


def take_length(settings: ProfileSettings, engines: int) -> float:
    """How long each take of a round of ``engines`` engines lasts at least where the host sets the
    pace (host_sets_the_pace): ``take_ms``, or longer where the round would otherwise last under
    ``round_ms`` (a point of few engines, or few left in the running); one engine alone has no
    pair to decide, and takes ``take_ms``: compared with an engine of another run, where either
    follows the host, the report reads the pair HOST_SWING wider (report/confidence.py, apart_ratio)."""
    if engines < 2:
        return settings.take_ms
    return max(settings.take_ms, settings.round_ms / engines)
