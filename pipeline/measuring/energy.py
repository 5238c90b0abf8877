"""Energy per take: a hardware energy counter read around each take of the rounds (rounds.py), one
meter per source, and a meter that says why there is none.

* **nvml**: ``nvmlDeviceGetTotalEnergyConsumption``, the GPU's energy in millijoules since the
  driver was loaded, on Volta and later (NVML API reference, Device Queries). It counts the whole
  board — every process on the GPU, and its idle power — and it advances in steps: the driver
  updates it from a power sample taken every few tens of milliseconds, about every 100 ms on recent
  GPUs (ml.energy, "Thermally Stable Profiling for Accurate GPU Energy Measurement"; Yang et al.,
  "Part-time Power Measurements: nvidia-smi's Lack of Attention", SC24, arXiv 2312.02741, measured
  the period on over 70 GPUs and found it differs between them). So the period is not assumed: the
  counter is read every POLL_S while a take runs, and the steps it took are counted.
* **rapl**: Linux's powercap files, ``/sys/class/powercap/intel-rapl:<n>/energy_uj`` of every
  package (``name`` ``package-<n>``; subzones such as ``core`` are inside it, ``psys`` overlaps it),
  wrapping at ``max_energy_range_uj`` (Documentation/power/powercap/powercap.rst). The whole
  package, every process on it. Its register is updated about every millisecond (Intel SDM vol. 3B,
  MSR_PKG_ENERGY_STATUS: "updated every ~1 msec", wrapping in about 60 s at high power), so it is
  read around the take only: a thread polling it would take CPU from the take it measures. Since
  CVE-2020-8694 the kernel lets only root read ``energy_uj``.

A take's reading *resolves* when the counter took at least MIN_STEPS steps in it (RAPL: when the
take lasted MIN_STEPS of its updates): each end of a take can miss up to one step, so its reading
is then within about 2/MIN_STEPS of the energy it spent, and that error, its sign random, averages
out over the takes. Takes that do not resolve make the rounds lengthen the next ones (EnergyPace).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.measuring import nvml as nvml_access

# Steps of the counter a take needs for its energy to count (see the module's docstring).
MIN_STEPS = 10
# How often a stepped counter (NVML's) is read while a take runs: well inside the shortest update
# period reported (about 20 ms), so that no step goes unseen.
POLL_S = 0.005
# RAPL's update period (Intel SDM, above), by which a take's steps are counted from its length.
RAPL_UPDATE_MS = 1.0
# The longest a take is lengthened to for its energy to resolve: past it, a counter that still has
# not stepped enough says more of the counter than of the engine.
MAX_ENERGY_TAKE_MS = 4000.0
# Where Linux keeps its powercap zones.
POWERCAP = Path("/sys/class/powercap")

GPU_SCOPE = "the whole GPU (every process on it), idle power included"
CPU_SCOPE = "the whole CPU package (every process on it), idle power included"


@dataclass(frozen=True)
class EnergyReading:
    """One take's energy: joules from the counter's first read to its last, the steps the counter
    took between (None where they are not counted but follow from the take's length: RAPL), the
    take's wall time, and whether the reading resolved; ``started_s``: the epoch time (time.time())
    it started at, so that a reading taken beside it (scripts/check_serving_agreement.py) can be
    read over the same span."""

    joules: float
    steps: int | None
    wall_ms: float
    resolved: bool
    started_s: float = 0.0


class EnergyHow(BaseModel):
    """How a set of rounds read one engine's energy, as its manifest keeps it (RoundsRecord.energy)."""

    # "nvml" or "rapl".
    source: str
    # What the counter counts: GPU_SCOPE or CPU_SCOPE.
    scope: str
    # The call or file read, and how often.
    counter: str
    # Steps a take needed to count (MIN_STEPS), the median wall time of a counter step seen in the
    # takes (None where not counted), the least take length the rounds grew to for the counter
    # (0: never lengthened), and the takes whose reading did not resolve.
    min_steps: int
    step_ms: float | None = None
    least_take_ms: float = 0.0
    unresolved_takes: int = 0


class EnergyMeter:
    """A counter of energy read around a take. ``why_not`` says why a meter reads nothing (then
    ``during`` returns no reading)."""

    source = "none"
    scope = ""
    counter = ""
    why_not: str | None = None

    def during(self, work: Callable[[], Any]) -> tuple[Any, EnergyReading | None]:
        return work(), None


class NoEnergy(EnergyMeter):
    def __init__(self, why: str):
        self.why_not = why


class _Counter(EnergyMeter):
    """A monotonic counter in joules (``read``), read around ``work`` and, where ``poll_s``, every
    poll_s while it runs, counting the distinct values it passed through."""

    poll_s: float | None = None

    def read(self) -> float:
        raise NotImplementedError

    def during(self, work: Callable[[], Any]) -> tuple[Any, EnergyReading | None]:
        seen: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.wait(self.poll_s):
                value = self._read_or_none()
                if value is not None and value != seen[-1]:
                    seen.append(value)

        first = self._read_or_none()
        if first is None:
            return work(), None
        seen.append(first)
        poller = threading.Thread(target=poll, name=f"{self.source}-energy", daemon=True) if self.poll_s else None
        started, started_s = time.perf_counter(), time.time()
        if poller is not None:
            poller.start()
        try:
            result = work()
        finally:
            wall_ms = (time.perf_counter() - started) * 1000.0
            done.set()
            if poller is not None:
                poller.join()
        last = self._read_or_none()
        if last is None:
            return result, None
        if last != seen[-1]:
            seen.append(last)
        joules = last - first
        if self.poll_s:
            steps: int | None = len(seen) - 1
            resolved = steps >= MIN_STEPS
        else:
            steps, resolved = None, joules > 0 and wall_ms >= MIN_STEPS * RAPL_UPDATE_MS
        return result, EnergyReading(joules=joules, steps=steps, wall_ms=wall_ms, resolved=resolved, started_s=started_s)

    def _read_or_none(self) -> float | None:
        try:
            return self.read()
        except Exception:  # a counter that failed once (a driver hiccup) spoils that take's reading only
            return None


class NvmlEnergy(_Counter):
    """NVML's energy counter of one GPU (``nvml``: pynvml or a stand-in with the same calls)."""

    source, scope, poll_s = "nvml", GPU_SCOPE, POLL_S
    counter = f"nvmlDeviceGetTotalEnergyConsumption, read around each take and every {POLL_S * 1000:g} ms in it"

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle
        self.read()  # raises where the GPU has no counter (before Volta), for ``opened`` to say so

    def read(self) -> float:
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) / 1000.0

    @classmethod
    def opened(cls, gpu_uuid: str | None, nvml=None) -> EnergyMeter:
        """The counter of the GPU with this UUID, or NoEnergy saying why there is none."""
        try:
            nvml = nvml if nvml is not None else nvml_access.opened()
        except ImportError:
            return NoEnergy("no NVML: nvidia-ml-py (pynvml) is not installed")
        except Exception as exc:
            return NoEnergy(f"no NVML: {_said(exc)}")
        try:
            handle = nvml_access.handle(nvml, gpu_uuid)
        except Exception as exc:
            return NoEnergy(f"NVML has no GPU {gpu_uuid or 0}: {_said(exc)}")
        try:
            return cls(nvml, handle)
        except Exception as exc:
            return NoEnergy(f"NVML has no energy counter for this GPU (Volta or later has one): {_said(exc)}")


class RaplEnergy(_Counter):
    """The sum of every CPU package's RAPL counter, each unwrapped at its max_energy_range_uj."""

    source, scope = "rapl", CPU_SCOPE

    def __init__(self, zones: list[Path]):
        self.zones = zones
        self.ranges = [int((zone / "max_energy_range_uj").read_text()) for zone in zones]
        self.counter = f"{' + '.join(str(zone / 'energy_uj') for zone in zones)}, read around each take"
        self._last: list[int] = [int((zone / "energy_uj").read_text()) for zone in zones]
        self._total_uj = 0

    def read(self) -> float:
        """Joules since this meter opened: each package's counter, unwrapped (a take far shorter
        than the wrap time, about 60 s, wraps at most once between reads)."""
        for index, zone in enumerate(self.zones):
            now = int((zone / "energy_uj").read_text())
            step = now - self._last[index]
            self._total_uj += step if step >= 0 else step + self.ranges[index]
            self._last[index] = now
        return self._total_uj / 1e6

    @classmethod
    def opened(cls, root: Path | None = None) -> EnergyMeter:
        """The packages' counters under ``root`` (POWERCAP, the kernel's, unless given), or
        NoEnergy saying why they cannot be read."""
        root = root if root is not None else POWERCAP
        if not root.is_dir():
            return NoEnergy(f"no RAPL: {root} absent")
        zones = []
        for zone in sorted(root.glob("intel-rapl:*")):
            if zone.name.count(":") != 1:  # a subzone (core, uncore, dram): inside its package
                continue
            try:
                name = (zone / "name").read_text().strip()
            except OSError:
                continue
            if name.startswith("package"):  # psys, where there is one, overlaps the packages
                zones.append(zone)
        if not zones:
            return NoEnergy(f"no RAPL: no package zone (intel-rapl:<n> named package-<n>) under {root}")
        try:
            return cls(zones)
        except PermissionError:
            return NoEnergy(f"no RAPL: {zones[0] / 'energy_uj'} is readable by root only (since CVE-2020-8694)")
        except (OSError, ValueError) as exc:
            return NoEnergy(f"no RAPL: {zones[0]} cannot be read: {_said(exc)}")


# Why a row has no energy where nobody asked for it: said in its manifest, and no note under a table.
NOT_ASKED = "not read: energy is read where asked ([profile] energy = true, --energy)"


@dataclass
class Energy:
    """The meters a point's takes are read with: the GPU's for engines whose takes are its work, the
    CPU packages' for those the host's clock times."""

    gpu: EnergyMeter
    cpu: EnergyMeter

    @classmethod
    def opened(cls, gpu_uuid: str | None, nvml=None, rapl_root: Path | None = None) -> Energy:
        return cls(gpu=NvmlEnergy.opened(gpu_uuid, nvml), cpu=RaplEnergy.opened(rapl_root))

    @classmethod
    def where_asked(cls, asked: bool, gpu_uuid: str | None) -> Energy:
        """The point's meters where energy is asked for ([profile] energy, or ranking by it); else
        meters that read nothing, so that no counter is opened, no thread polls and no take grows,
        and each engine's record says why it has none."""
        if asked:
            return cls.opened(gpu_uuid)
        return cls(gpu=NoEnergy(NOT_ASKED), cpu=NoEnergy(NOT_ASKED))


# Why an engine whose take is a run of a tool in a process of its own gets no energy.
TOOL_TAKE = "each take is a run of its tool, the tool's start and end with an idle GPU included: not per inference"


def meter_for(engine, energy: Energy | None, on_gpu: bool) -> EnergyMeter | None:
    """The meter an engine's takes are read with: the GPU's where its takes are the GPU's work (the
    rounds' own test, rounds._on_gpu), else the CPU packages'; none where its take is a tool's whole
    run; None where nothing is read (``energy`` None)."""
    if energy is None:
        return None
    if energy.gpu.why_not == NOT_ASKED:  # not asked says more than why it could not have been read
        return energy.gpu
    if getattr(engine, "clock_while_busy", False):
        return NoEnergy(TOOL_TAKE)
    return energy.gpu if on_gpu else energy.cpu


def how_read(meter: EnergyMeter, readings: list[EnergyReading], least_ms: float) -> EnergyHow:
    """What a manifest keeps of how one engine's takes were read."""
    paces = sorted(r.wall_ms / r.steps for r in readings if r.steps)
    return EnergyHow(
        source=meter.source,
        scope=meter.scope,
        counter=meter.counter,
        min_steps=MIN_STEPS,
        step_ms=round(paces[len(paces) // 2], 3) if paces else None,
        least_take_ms=round(least_ms, 3),
        unresolved_takes=sum(1 for r in readings if not r.resolved),
    )


class EnergyReads:
    """The energy side of one point's rounds: each engine's meter (None: nothing read), the readings
    its takes gave, and the least take length they set (EnergyPace)."""

    def __init__(self, meters: dict[str, EnergyMeter | None]):
        self.meters, self.pace = meters, EnergyPace()
        self.readings: dict[str, list[EnergyReading]] = {key: [] for key in meters}

    @classmethod
    def of(cls, engines: dict[str, Any], energy: Energy | None, on_gpu: Callable[[Any], bool]) -> EnergyReads:
        return cls({key: meter_for(engine, energy, on_gpu(engine)) for key, engine in engines.items()})

    @property
    def least_ms(self) -> float:
        return self.pace.least_ms

    def during(self, key: str, work: Callable[[], Any]) -> tuple[Any, EnergyReading | None]:
        """``work()`` (a take of engine ``key``) with its meter read around it, and what it read."""
        meter = self.meters.get(key)
        if meter is None:
            return work(), None
        result, reading = meter.during(work)
        self.readings[key] += [reading] if reading is not None else []
        self.pace.after(reading)
        return result, reading

    def readable(self) -> list[str]:
        """The engines whose takes a meter reads (none where it says why not)."""
        return [key for key, meter in self.meters.items() if meter is not None and not meter.why_not]

    def restart(self) -> None:
        """The readings forgotten, as the rounds forget takes they take again (the pace stays)."""
        self.readings = {key: [] for key in self.meters}

    def outcome(self) -> dict[str, tuple[EnergyHow | None, str | None]]:
        """Per engine read or refused: how its energy was read, or why not (RoundsRecord.energy, energy_why_not)."""
        return {
            key: (None, meter.why_not) if meter.why_not else (how_read(meter, self.readings[key], self.least_ms), None)
            for key, meter in self.meters.items()
            if meter is not None
        }


class EnergyPace:
    """The least length of a take for the counters to resolve, grown from the takes that did not:
    to MIN_STEPS steps at the pace the counter stepped in them (a quarter over), or twice as long
    where it did not step at all; never past MAX_ENERGY_TAKE_MS. One for every engine of a point,
    so that their takes stay alike in length."""

    def __init__(self):
        self.least_ms = 0.0

    def after(self, reading: EnergyReading | None) -> None:
        if reading is None or reading.resolved:
            return
        if reading.steps:
            wanted = reading.wall_ms * MIN_STEPS / reading.steps * 1.25
        else:
            wanted = 2 * max(reading.wall_ms, self.least_ms, 1.0)
        self.least_ms = min(MAX_ENERGY_TAKE_MS, max(self.least_ms, wanted))


def _said(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
