"""The measurement protocol: how every engine that runs in this process is timed.

A runtime knows how to prepare an engine and time one *take* (:class:`PreparedEngine`); this module
owns the rest, once for all of them — as nvbench separates a benchmark from its measurement loop:

* **Takes**: at least ``take_runs`` inferences and ``take_ms`` milliseconds, back to back, after
  one untimed inference (another engine ran in between), longer where a round of few engines
  would last under ``round_ms`` (:func:`take_length`) — while the host's speed can move what
  the rounds still have to decide (:func:`host_sets_the_pace`): a round shorter than the host's
  slow spells would let several rounds fall in one spell and agree for that alone; where every
  pair still open is of engines the GPU times (not launch-bound), the host's spells move neither,
  and the takes keep ``take_ms``, so that a near-tie gets more rounds of its budget. On a GPU each
  inference is timed by CUDA events around it, enqueued without waiting (takes.py, trtexec's
  way); on a CPU by the host's clock.
* **Launch-bound or not**: a GPU take's untimed run is issued with the GPU idle, and the host's
  time to issue it is kept (takes.py): where it comes near the run's GPU time the GPU
  waits for the host, and the engine's figures are the host's speed.
* **Warm-up**: once every engine of the point is prepared, each runs once, untimed (preparing one
  engine may disturb another: a compiler's cache reset makes it recompile, here and not in a take).
* **Rounds**: every engine of a shape point takes one take per round, in an order drawn afresh
  each round from a generator seeded by the point, as Google Benchmark's random interleaving does.
  Engines compared in one round saw the same host and GPU: a host that changes speed between rounds
  moves them alike, and the per-round ratios (pipeline/measuring/stats.py, :func:`~pipeline.measuring.stats.paired_ratio`)
  stay put where medians taken at different moments would not.
* **Stopping**: after ``min_rounds`` rounds, as soon as every comparison the verdict needs is
  decided — the engine with the lowest time against each of the others (its ratio's interval
  excludes 1, or lies within 1 ± ``tie``) — or when ``budget_s`` is spent. A GPU-bound point
  decides in a few rounds; a launch-bound one, on a host of two speeds, takes more. Racing: an
  engine out of the running leaves the rounds before that, and one grossly slower than the leader
  before the interval can say so (pipeline/measuring/stopping.py, the rules).
* **The host's speed**: each take records how much slower the measuring process's CPUs ran than
  alone (pipeline/measuring/host_speed.py: a probe between takes, its cgroup's throttled time during one);
  a report flags an engine whose time is the host's when they ran slower by more than the tie band
  and the host's own noise. The rounds hold the host (pipeline/measuring/host_rounds.py): beside other
  points' while every engine is GPU-bound, alone once one is not.
* **Clocks**: each take records the GPU's SM clock (NVML, sampled while it runs); a take whose clock
  fell below three quarters of the default — the threshold nvbench discards a trial at
  (nvbench/benchmark_base.cuh, ``m_throttle_threshold`` 0.75 of the default SM clock) — is dropped
  and counted, so throttling never enters a ratio.

The report (pipeline/report/) decides what the takes say; nothing here ranks engines beyond the
stopping rule.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from pipeline.catalog import ProfileSettings
from pipeline.measuring.energy import Energy, EnergyReading, EnergyReads
from pipeline.measuring.host_rounds import HostRounds
from pipeline.measuring.host_speed import HostSpeed
from pipeline.measuring.pace import HOST_LATENCY, follows_the_host, host_sets_the_pace, take_length
from pipeline.measuring.ranking import ENERGY, MEDIAN, Ranking, ranking
from pipeline.measuring.records import RoundsOutcome, Take
from pipeline.measuring.sm_clock import THROTTLE_THRESHOLD, SmClock
from pipeline.measuring.stats import median
from pipeline.measuring.stopping import Readings, open_pair_words, race, undecided, unsettled
from pipeline.running.errors import DeviceFault, PipelineError

# Rounds, at most, whatever the budget: a guard against a take_ms of microseconds.
MAX_ROUNDS = 10_000


class PreparedEngine(Protocol):
    """An engine ready to run in this process (loaded, compiled, captured, warmed): what a
    runtime's ``prepare`` hands to the protocol."""

    #: What one time is: "GPU time (CUDA events)" or "host latency" (HOST_LATENCY).
    timing: str

    def take(self, runs: int, min_ms: float) -> list[float]:
        """At least ``runs`` inferences and at least ``min_ms`` of them, back to back, after one
        untimed inference; each one's time in milliseconds."""

    def evidence(self) -> dict[str, Any]:
        """How it ran, for the manifest (device, settings in force, memory, …)."""

    # Optional: ``warm()``, one untimed run before the first round, once every engine of the point
    # is prepared (preparing one may disturb another: a compiler's cache reset);
    # ``on_gpu``, whether its takes run on the GPU (absent: all but those timed by the host's
    # clock), whose SM clock is then read to drop throttled takes;
    # ``clock_while_busy`` True where a take is mostly not the GPU's work (a tool's process
    # starting), so its SM clock is read only while the GPU is busy, and no energy is read around
    # it; ``issue_ms``, the host's time to issue the last take's untimed run (cuda_take), kept with
    # the take; ``untimed_runs``, the untimed runs of the last take (absent: 1), inside its energy
    # reading; and
    # ``processes``, the pids of the processes besides this one that its takes run in or that hold
    # the GPU for it (helper_processes), whose CPU and GPU use is the measurement's own.


def helper_processes(engines: dict[str, PreparedEngine]) -> frozenset[int]:
    """The processes besides this one that the engines' takes run in, or that hold the GPU for
    them (``processes``: a compiling process serving what it compiled): the measurement's own."""
    return frozenset(pid for engine in engines.values() for pid in getattr(engine, "processes", ()) if pid)


def _on_gpu(engine: PreparedEngine) -> bool:
    """Whether a take of ``engine`` is the GPU's work, so that the GPU's SM clock says whether it
    throttled: an engine says so (``on_gpu``), else one timed by the host's clock runs on the CPU —
    beside an idle GPU, whose low clock says nothing of it."""
    return getattr(engine, "on_gpu", engine.timing != HOST_LATENCY)


# --- rounds --------------------------------------------------------------------------------------


def measure_in_rounds(
    engines: dict[str, PreparedEngine],
    settings: ProfileSettings,
    seed: int,
    progress: Callable[[str], None] | None = None,
    clock: SmClock | None = None,
    host: HostSpeed | None = None,
    held: HostRounds | None = None,
    stays: frozenset[str] = frozenset(),
    energy: Energy | None = None,
) -> RoundsOutcome:
    """Every engine of one shape point, measured in rounds until decided or out of budget. An
    engine that fails during a take (out of memory, say) is recorded with its reason and leaves the
    rounds; the others go on. A kernel fault ends the rounds (DeviceFault, pinned to the engine
    whose take saw it): CUDA's context is gone for every engine of the process. With racing
    (``settings.racing``) an engine out of the running leaves the rounds (pipeline/measuring/stopping.py);
    ``stays``, the baseline toolchain's engines, never do. The rounds hold the host as
    pipeline/measuring/host_rounds.py says: beside other points' rounds while every engine is GPU-bound,
    alone once one is not (``held``: the hold the point's preparation had, else one of their own). ``host``: the host's speed around
    each take (calibrated here, once the host is held, when not given). ``energy``: the counters
    read around each take (pipeline/measuring/energy.py); None reads none."""
    clock = clock if clock is not None and clock.available else None
    failed: dict[str, str] = {}
    errors: dict[str, PipelineError] = {}
    for key, engine in engines.items():
        warm = getattr(engine, "warm", None)
        if warm is not None:
            try:
                warm()
            except DeviceFault as exc:
                exc.pinned_to(key)  # the process is poisoned: no other engine can be timed in it
                raise
            except PipelineError as exc:
                failed[key], errors[key] = exc.message, exc
    with contextlib.ExitStack() as stack:
        if held is None:
            held = stack.enter_context(HostRounds(on_wait=progress))
        if not held.try_whole():  # the host held by others: beside them while they let it
            held.share()
        host = host if host is not None else HostSpeed.calibrated(helper_processes(engines))
        rng = random.Random(seed)
        outcome = rounds_loop(engines, settings, rng, progress, clock, host, held, failed, stays=stays, energy=energy)
    outcome.seed, outcome.errors = seed, {**errors, **outcome.errors}  # the warm-up's and the rounds' own
    return outcome


def rounds_loop(
    engines,
    settings: ProfileSettings,
    rng: random.Random,
    progress,
    clock,
    host: HostSpeed,
    held: HostRounds,
    failed: dict[str, str],
    now: Callable[[], float] = time.perf_counter,
    stays: frozenset[str] = frozenset(),
    energy: Energy | None = None,
) -> RoundsOutcome:
    """The rounds themselves, once the engines are warm and the host is held: what
    measure_in_rounds runs, and what the simulation of the rule (scripts/simulate_confidence.py)
    drives with synthetic engines and ``now``, a clock of their own."""
    entrants = list(engines)
    takes: dict[str, list[Take]] = {key: [] for key in entrants}
    times: dict[str, list[float]] = {key: [] for key in entrants}
    errors: dict[str, PipelineError] = {}
    started = now()
    raced_out: dict[str, int] = {}
    raced_out_by: dict[str, str] = {}
    short_rounds: list[int] = []
    reads = EnergyReads.of(engines, energy, _on_gpu)  # takes grow until the counters resolve, every engine's alike
    by = stopping_rule(settings, reads, len(entrants))  # what the comparisons the rounds stop on are made by
    padded = True  # the first round: nothing is known yet of whether the host sets any engine's time
    rounds, stop = 0, "rounds"
    while rounds < MAX_ROUNDS:
        order = [key for key in entrants if key not in failed and key not in raced_out]
        rng.shuffle(order)
        take_ms = max(take_length(settings, len(order)) if padded else settings.take_ms, reads.least_ms)
        if not padded and take_ms < take_length(settings, len(order)):
            short_rounds.append(rounds)
        for position, key in enumerate(order):
            try:
                take, measured, reading = _take(engines[key], key, rounds, position, settings, clock, host, take_ms, reads)
            except DeviceFault:
                raise  # the process is poisoned: no other engine can be timed in it
            except PipelineError as exc:
                failed[key], errors[key] = exc.message, exc
                continue
            takes[key].append(take)
            if take.dropped is None:
                times[key].extend(measured)
        rounds += 1
        if rounds == 1 and held.mode is not None:
            following = any(follows_the_host(engines[k].timing == HOST_LATENCY, takes[k]) for k in entrants if k not in failed)
            if following and held.mode == "shared":
                # Its time is the host's: the point holds the host alone, and its first round,
                # taken beside whatever else held the host then, is taken again.
                held.take_whole()
                takes, times = {key: [] for key in entrants}, {key: [] for key in entrants}
                rounds, started, short_rounds = 0, now(), []
                reads.restart()
                continue
            if not following and held.mode == "whole":
                held.share()  # every engine GPU-bound: other points may be timed beside it
        running = {k: v for k, v in takes.items() if k not in failed and k not in raced_out}
        readings = Readings(times)  # a percentile's reading of each engine, once this round
        if settings.racing:  # those out of the running leave (a point decided now ends whole)
            out, open_pairs = race(running, settings.tie, stays, len(entrants), rounds, settings.min_rounds, by, readings)
            raced_out.update(dict.fromkeys(out, rounds))
            raced_out_by.update(out)
        else:
            open_pairs = undecided(running, settings.tie, len(entrants), by, readings)
        settling = {key: entries for key, entries in running.items() if key not in raced_out}
        padded = host_sets_the_pace(unsettled(settling, settings.tie, len(entrants), by, readings), engines, takes, settings.tie)
        elapsed = now() - started
        if progress is not None:
            progress(_progress_text(rounds, open_pairs, elapsed, settings, len(raced_out), by.takes_needed(len(entrants))))
        stop = _stop(len(entrants) - len(failed), rounds, open_pairs, elapsed, settings) or stop
        if stop != "rounds":
            break
    return RoundsOutcome(
        group=uuid.uuid4().hex[:12],
        entrants=entrants,
        takes=takes,
        times_ms=times,
        rounds=rounds,
        stop=stop,
        elapsed_s=now() - started,
        settings=settings,
        seed=0,
        default_sm_clock_mhz=clock.default_mhz if clock is not None else None,
        failed=failed,
        raced_out=raced_out,
        raced_out_by=raced_out_by,
        short_rounds=short_rounds,
        errors=errors,
        host_alone_probe_ms=host.alone_ms,
        host_alone_from=host.source,
        host_noise=host.noise,
        host_held=held.mode,
        energy=reads.outcome(),
        stopped_by=by.name,
    )


def stopping_rule(settings: ProfileSettings, reads: EnergyReads, entrants: int) -> Ranking:
    """What the rounds stop on: the catalog's ranking (``by``), but the medians where it is energy
    and fewer than two of the point's engines have a meter that reads: no round could give the
    others a reading, so by energy the rounds would be decided with nothing compared, after
    ``min_rounds``, and the times measured no longer than that (the run says so:
    stages/point.py)."""
    by = ranking(settings.by)
    if by is ENERGY and entrants > 1 and len(reads.readable()) < 2:
        return MEDIAN
    return by


def _stop(measuring: int, rounds: int, open_pairs: list, elapsed: float, settings: ProfileSettings) -> str | None:
    """Why the rounds end after this one ("failed": no engine left to time, "decided" or "alone",
    "budget"), or None while they go on."""
    if measuring == 0:
        return "failed"
    if rounds >= settings.min_rounds and not open_pairs:
        return "decided" if measuring > 1 else "alone"
    if elapsed >= settings.budget_s:
        return "budget"
    return None


def _take(
    engine: PreparedEngine,
    key: str,
    round_: int,
    position: int,
    settings: ProfileSettings,
    clock,
    host: HostSpeed,
    take_ms: float,
    reads: EnergyReads | None = None,
) -> tuple[Take, list[float], EnergyReading | None]:
    """One take of ``engine`` (at least ``take_ms``), with the GPU's clock read while it ran, the
    host's speed around it and, where ``reads`` has a meter for it, the energy counter around it."""

    def timed():
        if clock is not None and _on_gpu(engine):
            busy_only = getattr(engine, "clock_while_busy", False)
            return clock.during(lambda: engine.take(settings.take_runs, take_ms), busy_only)
        return engine.take(settings.take_runs, take_ms), None

    try:
        host.before_take()
        (measured, mhz), reading = reads.during(key, timed) if reads is not None else (timed(), None)
    except DeviceFault as exc:
        exc.pinned_to(key)
        raise
    around = host.after_take()
    issued = getattr(engine, "issue_ms", None)
    dropped = None
    if mhz is not None and clock.default_mhz and mhz < THROTTLE_THRESHOLD * clock.default_mhz:
        dropped = f"throttled: SM clock {mhz:.0f} MHz, below {THROTTLE_THRESHOLD:.0%} of its default {clock.default_mhz:.0f} MHz"
    take = Take(
        round=round_,
        order=position,
        runs=len(measured),
        median_ms=round(median(measured), 6),
        sm_clock_mhz=mhz,
        dropped=dropped,
        issue_ms=None if issued is None else round(issued, 6),
        host_slowdown=round(around.slowdown, 4),
        host_others_cpus=None if around.others_cpus is None else round(around.others_cpus, 3),
        host_throttled=round(around.throttled, 4),
    )
    if reading is not None:  # the untimed runs before the timed ones are inside the counter's span
        take.joules, take.energy_steps, take.energy_resolved = round(reading.joules, 6), reading.steps, reading.resolved
        take.energy_runs = len(measured) + getattr(engine, "untimed_runs", 1)
        take.energy_from_s, take.energy_ms = round(reading.started_s, 6), round(reading.wall_ms, 3)
    return take, measured, reading


def _progress_text(rounds: int, open_pairs, elapsed: float, settings: ProfileSettings, out: int = 0, needed: int | None = None) -> str:
    text = f"round {rounds} ({elapsed:.0f} of at most {settings.budget_s:g} s)"
    if out:
        text += f", {out} out of the running"
    if needed and rounds < needed:  # a percentile ranking: no interval before its takes, whatever the pairs
        return f"{text}: {settings.by} needs {needed} takes of each engine"
    if not open_pairs:
        return text + (": decided" if rounds >= settings.min_rounds else f": at least {settings.min_rounds} rounds")
    more = f" and {len(open_pairs) - 1} more" if len(open_pairs) > 1 else ""
    return f"{text}: {open_pair_words(*open_pairs[0])}{more}"
