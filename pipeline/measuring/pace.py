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
from pipeline.measuring.stats import median

# The timing of an engine whose runs are timed by the host's clock (on the CPU, or a runtime that
# cannot time on the GPU).
HOST_LATENCY = "host latency"
# A GPU run whose host needs at least this share of the run's GPU time to issue it is near
# launch-bound: its time can follow the host's (pipeline/report/flags.py says why this share). Its
# point's rounds hold the host alone (pipeline/measuring/host_rounds.py).
NEAR_LAUNCH_BOUND_SHARE = 0.5


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


def host_sets_the_pace(unsettled_pairs, engines, takes: dict) -> bool:
    """Whether the next round's takes are lengthened to last ``round_ms`` (take_length): while some
    pair that more rounds could still move (``unsettled_pairs``, stopping.unsettled: undecided, or
    decided across an edge of the tie band) holds an engine not known to be GPU-timed
    (``gpu_timed``). The host's speed changes in spells of 0.4-4 s on the lent GPUs and the CI VM
    (docs/measurement.md); it moves a launch-bound engine and not a GPU-bound one, so only such a
    pair with a launch-bound side needs rounds that outlast a spell (the simulation of the rule
    measures both: docs/confidence.md). A pair decided beyond the band — the baseline racing
    keeps, far slower than the leader, say — pads nothing; were short rounds to bring it back to
    the band's edge, it would be unsettled again."""
    keys = {key for pair in unsettled_pairs for key in pair[:2]}
    return any(not gpu_timed(engines[key].timing == HOST_LATENCY, takes[key]) for key in keys)


def take_length(settings: ProfileSettings, engines: int) -> float:
    """How long each take of a round of ``engines`` engines lasts at least where the host sets the
    pace (host_sets_the_pace): ``take_ms``, or longer where the round would otherwise last under
    ``round_ms`` (a point of few engines, or few left in the running); one engine alone is
    compared with nothing, and takes ``take_ms``."""
    if engines < 2:
        return settings.take_ms
    return max(settings.take_ms, settings.round_ms / engines)
