"""How fast the measuring process's CPUs ran during each take, against how fast they ran alone:
the evidence behind a row's ``host slowed`` flag (pipeline/report/flags.py).

A launch-bound GPU engine's time, and a CPU engine's, is the host's speed. Two things slow it
without anything queueing for a CPU beside it, which the busy flag (pipeline/measuring/machine_watch.py,
CPU pressure with other processes' CPU time) would see:

* **Slower CPUs.** Clocks fall when other cores of the package get busy, a hypervisor's vCPU shares
  a physical core or is descheduled: a one-thread loop can run 1.7x slower while any other core is
  busy (docs/measurement.md). This shows in a
  **probe**: a fixed piece of interpreter work, timed by the wall clock on the measuring thread
  between takes (so never beside a take, whose host thread it would slow), the median of
  PROBE_BURSTS bursts, against the same probe calibrated before the rounds.
* **A process held off its CPUs.** A cgroup's CPU quota (a container's CPU limit) stops the whole
  group for the rest of each period once its quota is spent; the kernel counts that time in the
  group's ``cpu.stat`` (``throttled_time`` ns in cgroup v1, ``throttled_usec`` in v2; kernel docs,
  Documentation/scheduler/sched-bwc.rst). A probe of a few milliseconds mostly lands between the
  stops and would not see it, so each take reads the throttled time of the process's cgroup and
  its ancestors around it instead.

A take's slowdown is the two together: (probe time / alone probe time) / (1 - throttled share of
the take). 1.0 is the host as fast as alone. "Alone" is the probe calibrated before the rounds, the
probe kept busy for as long as a take; where other processes used the CPUs meanwhile (a point
whose rounds start beside another GPU's compiling), the host's latest calibration taken while it
was otherwise idle, this boot, if that was faster (HOST_RECORD). The calibration also measures the
host's own short-term noise.

Each take also keeps the evidence of who slowed it: the CPUs other processes used over the last
OTHERS_WINDOW_S up to its end (``/proc/stat``, steal time included, less this process's own threads and those of
the processes its takes run in, ``helpers``: its other children count as others), and
the share of it its cgroup was held off. A host's CPUs also change speed with nothing beside them:
a 2-vCPU KVM guest of an AMD EPYC, idle, runs the probe at 1.65 ms or 2.7 ms in spells of 0.5-3 s with
under 0.2 CPUs of steal and other work, and a quarter-second calibration sees one spell or the
other; the lent H100's vCPUs change speed by 1.8x alike. A slowdown with neither is the host's
own, and the flag leaves it be (pipeline/report/flags.py).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

# Iterations of the probe's loop: about 1 ms of CPython on a 3 GHz core (1.4-1.6 ms on a 2-vCPU
# KVM guest of an AMD EPYC at its fastest).
PROBE_LOOPS = 25_000
PROBE_BURSTS = 3
# The calibration probes for this long, back to back, as a take keeps a CPU busy: a CPU that boosts
# its clock while idle around it runs a busy thread slower after a while.
CALIBRATION_S = 0.25
# The share of a CPU other processes may have used during the calibration for it to count as the
# host's idle speed, kept for the processes that calibrate beside others (HOST_RECORD).
IDLE_OTHERS_CPUS = 0.5
# A take's evidence of other processes is their CPU use over at least this long up to its end: the
# kernel counts CPU time in ticks of 10 ms, too coarse for one take of a few milliseconds.
OTHERS_WINDOW_S = CALIBRATION_S
# Where the host's latest idle calibration is kept, under the pipeline's cache.
HOST_RECORD = "host-speed.json"
CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup"))


def _burst_ms() -> float:
    value = 0
    started = time.perf_counter_ns()
    for i in range(PROBE_LOOPS):
        value = (value * 31 + i) & 0xFFFF
    return (time.perf_counter_ns() - started) / 1e6


def probe_ms(cgroups: list[Path] | None = None) -> float:
    """The probe's time now, in milliseconds: the median of PROBE_BURSTS bursts (one burst that an
    interrupt or a context switch lands in does not move it). With the process's cgroups, the time
    their CPU quota held each burst off is left out: the probe then says how fast the CPUs ran, and
    a take's own held-off share how long they were kept from it (else a quota counts twice)."""

    def burst() -> float:
        if not cgroups:
            return _burst_ms()
        held = _throttled_ns(cgroups)
        ms = _burst_ms()
        return max(0.0, ms - (_throttled_ns(cgroups) - held) / _cpus() / 1e6)

    return statistics.median(burst() for _ in range(PROBE_BURSTS))


# --- cgroup CPU throttling ---------------------------------------------------------------------------


def _cgroup_stat_files(pid: int | str = "self") -> list[Path]:
    """The ``cpu.stat`` files of the process's CPU cgroup and each of its ancestors that this
    mount namespace shows (a container sees its own group as the root)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    files: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers and "cpu" not in controllers.split(","):
            continue
        roots = CGROUP_ROOTS[:2] if controllers else CGROUP_ROOTS[2:]  # v1 "cpu" hierarchy, or v2's unified one
        for root in roots:
            if not (root / "cpu.stat").exists() and not (root / path.lstrip("/") / "cpu.stat").exists():
                continue
            group = root / path.lstrip("/")
            while True:
                if (group / "cpu.stat").exists():
                    files.append(group / "cpu.stat")
                if group == root or root not in group.parents:
                    break
                group = group.parent
            break
    return list(dict.fromkeys(files))


def _throttled_ns(files: list[Path]) -> int:
    """The most throttled time of any of the groups, in ns (the group whose quota binds)."""
    most = 0
    for path in files:
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "throttled_time":  # cgroup v1, ns
                    most = max(most, int(value))
                elif key == "throttled_usec":  # cgroup v2, µs
                    most = max(most, int(value) * 1000)
        except (OSError, ValueError):
            continue
    return most


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --- the host's record ---------------------------------------------------------------------------------


def _host_key() -> str:
    """This host as it is now: its name, CPU model and boot (a calibration of an earlier boot, or
    of other hardware behind the same name, says nothing of this one)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}|{model}|{os.cpu_count()}|{boot}"


def _record_path() -> Path:
    from pipeline.running.cache import cache_dir

    return cache_dir() / HOST_RECORD


def _read_record() -> tuple[float, float] | None:
    try:
        record = json.loads(_record_path().read_text())
        if record.get("host") == _host_key():
            return float(record["alone_probe_ms"]), float(record["noise"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _write_record(alone_ms: float, noise: float) -> None:
    from pipeline.running.files import atomic_write_text

    try:
        path = _record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"host": _host_key(), "alone_probe_ms": round(alone_ms, 6), "noise": round(noise, 4)}
        atomic_write_text(path, json.dumps(record) + "\n")
    except OSError:  # a read-only cache: this process's calibration stands alone
        pass


def _calibration(helpers: frozenset[int] = frozenset()) -> tuple[float, float, float]:
    """The probe's median over CALIBRATION_S of back-to-back probes, the host's own noise (their
    90th percentile against it) and the CPUs other processes (not ``helpers``) used meanwhile."""
    from pipeline.measuring.machine_watch import cpu_busy_s, own_cpu_s

    cgroups = _cgroup_stat_files()
    busy, own, started = cpu_busy_s(), own_cpu_s(helpers), time.perf_counter()
    probes = [probe_ms(cgroups)]
    while time.perf_counter() - started < CALIBRATION_S:
        probes.append(probe_ms(cgroups))
    seconds = time.perf_counter() - started
    busy_after = cpu_busy_s()
    others = 0.0 if busy is None or busy_after is None else max(0.0, busy_after - busy - (own_cpu_s(helpers) - own)) / seconds
    alone = statistics.median(probes)
    return alone, sorted(probes)[int(0.9 * (len(probes) - 1))] / alone, others


# --- a take's slowdown ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostTake:
    """The host around one take: how much slower the process's CPUs ran than alone (1.0: as fast),
    the CPUs other processes used meanwhile (None where the kernel does not say) and the share of
    the take its cgroup's CPU quota held it off."""

    slowdown: float
    others_cpus: float | None
    throttled: float


class HostSpeed:
    """The host's speed around each take of a set of rounds.

    >>> host = HostSpeed.calibrated()
    >>> host.before_take(); measure(); around = host.after_take()
    """

    def __init__(self, alone_ms: float, source: str, noise: float = 1.0, helpers: frozenset[int] = frozenset()):
        self.alone_ms = alone_ms
        # Whose calibration "alone" is: "this process" (the host otherwise idle, or slower beside
        # others than the host's record) or "host record" (an idle calibration of an earlier process).
        self.source = source
        # The host's own short-term spread of the probe, alone (>= 1.0): a slowdown within it is
        # the host's noise, not a neighbour's doing.
        self.noise = noise
        # The processes the takes run in besides this one (a compiling process serving its engine,
        # pipeline/runtimes/pytorch/served.py): their CPU time is the takes', not others'.
        self.helpers = frozenset(helpers)
        self._cgroups = _cgroup_stat_files()
        self._last_probe: float | None = None
        self._throttled_at = 0
        self._take_started = 0
        # (when, machine busy s, own CPU s), oldest first: what a take's window of others starts from.
        self._cpu_samples: deque[tuple[float, float | None, float]] = deque()

    @classmethod
    def calibrated(cls, helpers: frozenset[int] = frozenset()) -> HostSpeed:
        """Calibrated now; where other processes (not ``helpers``) used the CPUs meanwhile, the
        host's latest idle calibration if it was faster."""
        alone, noise, others = _calibration(helpers)
        if others < IDLE_OTHERS_CPUS:
            _write_record(alone, noise)
            return cls(alone, "this process", noise, helpers)
        recorded = _read_record()
        if recorded is not None and recorded[0] < alone:
            return cls(recorded[0], "host record", recorded[1], helpers)
        return cls(alone, "this process", noise, helpers)

    def _sample_cpus(self) -> tuple[float, float | None, float]:
        from pipeline.measuring.machine_watch import cpu_busy_s, own_cpu_s

        sample = (time.perf_counter(), cpu_busy_s(), own_cpu_s(self.helpers))
        self._cpu_samples.append(sample)
        return sample

    def _others_cpus(self, now: tuple[float, float | None, float], take_started: float) -> float | None:
        """The CPUs other processes used from OTHERS_WINDOW_S before the take's end (or its start,
        if longer ago) to its end."""
        since = min(take_started, now[0] - OTHERS_WINDOW_S)
        while len(self._cpu_samples) > 1 and self._cpu_samples[1][0] <= since:
            self._cpu_samples.popleft()
        then = self._cpu_samples[0]
        if now[1] is None or then[1] is None or now[0] <= then[0]:
            return None
        return max(0.0, (now[1] - then[1]) - (now[2] - then[2])) / (now[0] - then[0])

    def before_take(self) -> None:
        # Read again each take: a process can be moved to another group while it runs (a test's
        # quota, a container runtime's update); the take compares one group's figures either side.
        self._cgroups = _cgroup_stat_files()
        if self._last_probe is None:
            self._last_probe = probe_ms(self._cgroups)
        self._throttled_at = _throttled_ns(self._cgroups)
        self._sample_cpus()
        self._take_started = time.perf_counter_ns()

    def after_take(self) -> HostTake:
        """The host around the take: its slowdown, from the probes either side of it and the share
        of it the process's cgroup was throttled, and the evidence of who slowed it."""
        wall = time.perf_counter_ns() - self._take_started
        throttled = max(0, _throttled_ns(self._cgroups) - self._throttled_at)
        before, after = self._last_probe or probe_ms(self._cgroups), probe_ms(self._cgroups)
        self._last_probe = after
        speed = ((before + after) / 2) / self.alone_ms
        # The kernel adds up a group's throttled time over the CPUs it was throttled on, so a share
        # of the take's wall clock is over the CPUs the process may use.
        held_off = min(0.95, throttled / (wall * _cpus())) if wall > 0 else 0.0
        others = self._others_cpus(self._sample_cpus(), self._take_started / 1e9)
        return HostTake(slowdown=speed / (1.0 - held_off), others_cpus=others, throttled=held_off)
