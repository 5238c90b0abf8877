"""What makes a row's number one to read with care: a measurement on a noisy, busy or throttled
machine, repeats that disagree, an engine whose time is the host's (launch-bound). The verdict
(pipeline/report/verdict.py) leaves out what is untrustworthy and says why; the tables show it."""

from __future__ import annotations

from pipeline.measuring.host_speed import IDLE_OTHERS_CPUS
from pipeline.measuring.pace import NEAR_LAUNCH_BOUND_SHARE, follows_the_host, issue_share
from pipeline.measuring.stats import median

# A run whose spread is above this coefficient of variation is flagged noisy (`--noisy-cv`). ONNX
# Runtime on a quiet CPU stays within a few percent. The spread is the quartiles' (iqr_cv): host
# stalls that put a few runs at 2-3x the median raise the CV to 20-40% in measurements whose
# repeats' medians agree within 0.1%, which the CV would leave out of the verdict (docs/reports.md).
NOISY_CV = 0.10
# A machine whose 1-minute load average exceeds this many runnable tasks per CPU was busy: the
# measurement shared its cores (two concurrent profiles on 2 CPUs measured ~4; one alone ~2).
BUSY_LOAD_PER_CPU = 1.5


# A GPU run whose host needs at least this share of the run's GPU time to issue it is near
# launch-bound: the lent H100's host changes speed by 1.8x (1/1.8 = 0.56), so from about half a
# slow spell of the host can set its time. From LAUNCH_BOUND_SHARE on, it is launch-bound: the GPU
# waits for the host between kernels (eager ModernBERT at 2x512 there: 0.94-1.20; CUDA graphs:
# 0.01-0.03; reduce-overhead at 2x512: 0.45-0.55, its ratio to a CUDA graph steady across runs).
# NEAR_LAUNCH_BOUND_SHARE lives with the measurement, whose rounds hold the host by it.
LAUNCH_BOUND_SHARE = 0.9
# How a launch-bound row's flag begins (the answer reads it: pipeline/report/sweep.py).
LAUNCH_BOUND = "launch-bound"


def launch_bound(flags: list[str], near: bool = False) -> bool:
    """Whether a row's ``flags`` say its rounds were launch-bound (``near``: or near it)."""
    return any(flag.startswith(LAUNCH_BOUND) or (near and flag.startswith(f"near {LAUNCH_BOUND}")) for flag in flags)


def launch_bound_flag(details) -> str | None:
    """A flag for an engine whose runs were launch-bound, or near it, in its rounds (the takes'
    issue times against their GPU times, medians: measurement.issue_share), or None."""
    share = issue_share([take for rounds in details.rounds for take in rounds.takes])
    if share is None or share < NEAR_LAUNCH_BOUND_SHARE:
        return None
    needs = f"the host needs {share:.0%} of a run's GPU time to issue it"
    if share < LAUNCH_BOUND_SHARE:
        return f"near {LAUNCH_BOUND}: {needs}; a host {1 / share:.1f}x slower would set its time"
    return f"{LAUNCH_BOUND}: {needs}; its time is the host's speed, and its ratio to an engine that is not follows the host's"


# How a host-slowed row's flag begins (the verdict leaves such a row out: pipeline/report/verdict.py).
HOST_SLOWED = "host slowed"
# Flags that make a row's number untrustworthy for a verdict and the regression gate
# (rows.measurement_flags words them). A noisy row is not among them: its interval says how much
# it is worth, and the verdict compares by intervals.
UNTRUSTED = ("busy", "throttled", HOST_SLOWED)


# A take was slowed by something beside it when its cgroup's quota held it off at least this share
# of it, or other processes used IDLE_OTHERS_CPUS or more around it (pipeline/measuring/host_speed.py).
HELD_OFF_SHARE = 0.01


def _beside(take) -> bool:
    """Whether something beside the take slowed it: other processes on the CPUs, or its cgroup's
    quota. A take recorded before that evidence was (both None) is taken as it was measured."""
    if take.host_others_cpus is None and take.host_throttled is None:
        return True
    return (take.host_others_cpus or 0.0) >= IDLE_OTHERS_CPUS or (take.host_throttled or 0.0) >= HELD_OFF_SHARE


def _cause(slowed) -> str:
    """What the slowed takes saw beside them, in words ('' where nothing was recorded)."""
    causes = []
    others = [take.host_others_cpus for take in slowed if (take.host_others_cpus or 0.0) >= IDLE_OTHERS_CPUS]
    if others:
        causes.append(f"other processes used {median(others):.1f} CPUs")
    held = [take.host_throttled for take in slowed if (take.host_throttled or 0.0) >= HELD_OFF_SHARE]
    if held:
        causes.append(f"its cgroup's CPU quota held it off {median(held):.0%} of a take")
    return f" while {' and '.join(causes)}" if causes else ""


def host_slowed_flag(details) -> str | None:
    """A flag for an engine whose time is the host's and whose takes ran on CPUs slowed by
    something beside them — other processes, or its cgroup's CPU quota — by more than the tie band
    and the host's own noise (the median take's slowdown: pipeline/measuring/host_speed.py), or None. A take
    slower than alone with nothing beside it is the host's own spell: it counts as unslowed (the
    rounds' interleaving keeps its comparisons fair; docs/measurement.md)."""
    for rounds in details.rounds:
        kept = [take for take in rounds.takes if take.dropped is None and take.host_slowdown is not None]
        if not kept or not follows_the_host("host" in (details.metric or "").lower(), kept):
            continue
        noise = rounds.host_noise or 1.0
        bar = max(1.0 + rounds.tie, noise)
        slowdown = median([take.host_slowdown if _beside(take) else 1.0 for take in kept])
        if slowdown > bar:
            slowed = [take for take in kept if _beside(take) and take.host_slowdown > bar]
            worst = max(take.host_slowdown for take in slowed)
            return (
                f"{HOST_SLOWED}: its CPUs ran {slowdown:.2f}x slower than alone over its median take (worst {worst:.2f}x, "
                f"{len(slowed)} of {len(kept)} takes){_cause(slowed)}, beyond the tie band of {rounds.tie:.0%} and the "
                f"host's own noise ({noise:.2f}x); its time is the host's"
            )
    return None


def measurement_flags(details, noisy_cv: float = NOISY_CV) -> list[str]:
    """Why a measurement may not be trusted, from what the profile recorded; empty when none."""
    flags = []
    launch_bound = launch_bound_flag(details)
    if launch_bound:
        flags.append(launch_bound)
    slowed = host_slowed_flag(details)
    if slowed:
        flags.append(slowed)
    spread = details.latency_ms.iqr_cv
    if spread is None:  # a manifest from before the quartiles were recorded
        if details.latency_ms.cv > noisy_cv:
            flags.append(f"noisy: CV {details.latency_ms.cv:.1%} is above {noisy_cv:.0%}")
    elif spread > noisy_cv:
        flags.append(f"noisy: interquartile CV {spread:.1%} is above {noisy_cv:.0%}")
    load = details.machine_load or {}
    if load.get("during"):
        # What was seen while each measurement ran (pipeline/measuring/machine_watch.py); the load averages
        # around it are older evidence, kept for manifests written before the measurement was watched.
        return flags + watch_flags(load["during"])
    for when in ("start", "end"):
        facts = load.get(when) or {}
        averages, cpus = facts.get("load_average"), facts.get("cpu_count")
        if averages and cpus and averages[0] > BUSY_LOAD_PER_CPU * cpus:
            flags.append(f"busy machine: load average {averages[0]:g} on {cpus} CPUs at the {when}")
            break
    for when in ("start", "end"):
        others = (load.get(when) or {}).get("gpu_processes") or []
        if others:
            names = ", ".join(sorted({f"{p['name']} (pid {p['pid']})" for p in others}))
            flags.append(f"busy GPU: other processes used it at the {when}: {names}")
            break
    return flags


def watch_flags(summaries: list[dict]) -> list[str]:
    """The flags what was seen during a profile's measurements earns (machine_watch.findings):
    ``busy: …``, ``throttled: …``."""
    from pipeline.measuring.machine_watch import CpuPressure, CpusSaturated, GpuShared, findings

    flags = []
    for found in findings(summaries):
        if isinstance(found, CpuPressure):
            flags.append(
                f"busy: runnable tasks waited for a CPU {found.average:.0%} of the measurement (worst half second {found.peak:.0%})"
                + (f"; other processes used {found.others:.1f} of {found.cpu_count} CPUs" if found.others is not None else "")
            )
        elif isinstance(found, CpusSaturated):
            flags.append(f"busy: the {found.cpu_count} CPUs were saturated; other processes used {found.others:.1f} of them")
        elif isinstance(found, GpuShared):
            flags.append(f"busy: {found.processes} other process(es) ran on GPU {found.index} during the measurement")
        else:
            clocks, hottest = found.sm_clock_mhz, found.max_temperature_c
            seen = [f"SM clock {clocks[0]}–{clocks[1]} MHz"] if clocks else []
            seen += [f"up to {hottest} °C"] if hottest is not None else []
            flags.append(f"throttled: GPU {found.index} {', '.join(found.reasons)}" + (f" ({', '.join(seen)})" if seen else ""))
    return flags
