"""What the machine was doing *while* a measurement ran, and whether that makes it untrustworthy.

A load average read before and after a profile misses contention that starts less than about a
minute earlier (it is a one-minute moving average), so the profile watches the measurement itself:

* **CPU contention**: Linux's pressure stall information (``/proc/pressure/cpu``, "some": the share
  of time at least one runnable task waited for a CPU; kernel 4.20+, Documentation/accounting/psi.rst),
  as the whole measurement's share and the worst half-second window's. Where the kernel has no PSI:
  the CPU time other processes took (``/proc/stat`` less this process's own), and whether the CPUs
  were saturated.
* **GPU state** through NVML (``nvidia-ml-py``, where it and a driver are present): clock event
  ("throttle") reasons, SM clocks, temperature, the other processes on the GPU and which of them
  ran kernels (per-process SM utilisation).

``findings`` picks out what was seen during a profile's measurements that makes them
untrustworthy; pipeline/report/flags.py words it as the flags a comparison shows (``busy: …``,
``throttled: …``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.measuring import nvml

PSI_CPU = Path("/proc/pressure/cpu")
SAMPLE_INTERVAL_S = 0.5
# A measurement is busy when tasks waited for a CPU this share of its time on average, or in its
# worst window — and other processes took at least OTHERS_CPUS_AT_LEAST CPUs then (over the
# measurement, or in their worst window), where that is known. The pipeline's own threads can
# reach it alone: on a quiet 2-CPU machine ONNX Runtime's and PyTorch's thread pools, timed in
# rounds, made tasks wait 11–48 % with other processes at 0.0 CPUs. That is the process measured,
# not another workload beside it.
BUSY_CPU_PRESSURE = 0.10
BUSY_CPU_PRESSURE_PEAK = 0.25
# Without PSI: the CPUs count as saturated above this share of their capacity, with at least half
# a CPU of it taken by other processes.
SATURATED_CPU_SHARE = 0.90
OTHERS_CPUS_AT_LEAST = 0.5

# NVML's clock event reasons that lower the clocks (nvml.h, nvmlClocksEventReason*; idle,
# application clocks, sync boost and display clocks do not). All are recorded.
CLOCK_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
# The ones that mark a measurement throttled. The software power cap is not among them: a
# datacenter GPU under full load runs at its power limit as a matter of course (an H100 does on
# every ViT-B measurement, its SM clock below the maximum), and so does the deployment.
THROTTLING = {0x8, 0x20, 0x40, 0x80}


def _psi_some_total_us() -> int | None:
    try:
        for line in PSI_CPU.read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_busy_s() -> float | None:
    """Seconds of CPU time the whole machine has spent busy since boot (every CPU together)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError, IndexError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s(helpers: frozenset[int] = frozenset()) -> float:
    """CPU seconds of this process's own threads, and of ``helpers``: the processes a measurement
    runs its takes in besides this one (a compiling process that serves the engine it compiled,
    pipeline/runtimes/pytorch/served.py), whose CPU time is the measurement's own. Not other
    children's: a child is another process beside a measurement while it runs (a worker compiling
    ahead), and the kernel adds its CPU time to the parent's only when it is reaped, all at that
    instant, which would hide every other process's use in the window it landed in."""
    times = os.times()
    return times.user + times.system + sum(_process_cpu_s(pid) for pid in helpers)


# The last CPU time read of each helper process: one that has ended keeps what it had used, so that
# a window across its end does not count its past CPU time as another process's.
_HELPER_CPU_S: dict[int, float] = {}


def _process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (its own threads), from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        _HELPER_CPU_S[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        pass
    return _HELPER_CPU_S.get(pid, 0.0)


class _Nvml:
    """The GPUs through NVML; absent (``available`` False) without nvidia-ml-py or a driver.
    ``uuid``: only that GPU, the one measured on. NVML lists every GPU of the machine whatever
    CUDA_VISIBLE_DEVICES says: watching all of them, a point timed on GPU 1 of two H200s beside
    another point on GPU 0 was flagged busy for the process on GPU 0."""

    def __init__(self, uuid: str | None = None):
        self.available = False
        try:
            self.nvml = pynvml = nvml.opened()
            self.handles = nvml.handles(pynvml, uuid)
            self.available = bool(self.handles)
        except Exception:  # not installed, no driver, no permission: nothing to watch
            return
        # Renamed from "throttle reasons" to "clock event reasons" in recent drivers; either works.
        self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def sample(self, since_us: int) -> list[dict[str, Any]]:
        lib, samples = self.nvml, []
        for index, handle in self.handles:
            sample: dict[str, Any] = {"index": index}
            for key, read in (
                ("reasons", lambda h: self._reasons(h) if self._reasons else 0),
                ("sm_clock_mhz", lambda h: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM)),
                ("temperature_c", lambda h: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)),
                ("processes", lambda h: [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(h)]),
                ("sm_use", lambda h: self._sm_use(h, since_us)),
            ):
                try:
                    sample[key] = read(handle)
                except Exception:  # a query this GPU or driver does not support
                    pass
            samples.append(sample)
        return samples

    def _sm_use(self, handle, since_us: int) -> dict[int, int]:
        """Each process's SM utilisation (%) in NVML's samples since ``since_us`` (CPU time, µs)."""
        try:
            found = self.nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except self.nvml.NVMLError_NotFound:  # no process used the GPU since then
            return {}
        use: dict[int, int] = {}
        for process in found:
            use[process.pid] = max(use.get(process.pid, 0), int(process.smUtil))
        return use

    def close(self):
        if self.available:
            nvml.close(self.nvml)


class MachineWatch:
    """Samples the machine every SAMPLE_INTERVAL_S while the block runs; ``summary`` afterwards.

    >>> with MachineWatch() as watch:
    ...     measure()
    >>> watch.summary  # {"seconds": …, "cpu_pressure": {"average": …, "peak": …}, …}
    """

    def __init__(
        self,
        interval_s: float = SAMPLE_INTERVAL_S,
        watch_gpus: bool = True,
        gpu_uuid: str | None = None,
        helpers: frozenset[int] = frozenset(),
    ):
        self.interval_s = interval_s
        self.watch_gpus = watch_gpus
        self.gpu_uuid = gpu_uuid  # the GPU measured on (environment.measuring_gpu); None: every GPU
        # Processes that are the measurement's own beside this one (own_cpu_s): not others on the CPUs or the GPU.
        self.helpers = frozenset(helpers)
        self.summary: dict[str, Any] = {}
        self._stop = threading.Event()
        self._windows: list[float] = []
        self._others_windows: list[float] = []
        self._gpu_samples: list[list[dict[str, Any]]] = []

    def __enter__(self):
        self._nvml = _Nvml(self.gpu_uuid) if self.watch_gpus else None
        self._started = time.monotonic()
        self._since_us = int(time.time() * 1e6)
        self._psi_start = _psi_some_total_us()
        self._busy_start, self._own_start = cpu_busy_s(), own_cpu_s(self.helpers)
        self._thread = threading.Thread(target=self._sample_until_stopped, name="machine-watch", daemon=True)
        self._thread.start()
        return self

    def _sample_until_stopped(self):
        last_psi, last_at = self._psi_start, time.monotonic()
        last_busy, last_own = self._busy_start, self._own_start
        while not self._stop.wait(self.interval_s):
            now, psi = time.monotonic(), _psi_some_total_us()
            busy, own = cpu_busy_s(), own_cpu_s(self.helpers)
            if psi is not None and last_psi is not None and now > last_at:
                self._windows.append((psi - last_psi) / 1e6 / (now - last_at))
            if busy is not None and last_busy is not None and now > last_at:
                self._others_windows.append(max(0.0, (busy - last_busy) - (own - last_own)) / (now - last_at))
            last_psi, last_at, last_busy, last_own = psi, now, busy, own
            if self._nvml is not None and self._nvml.available:
                self._gpu_samples.append(self._nvml.sample(self._since_us))
                self._since_us = int(time.time() * 1e6)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        seconds = time.monotonic() - self._started
        summary: dict[str, Any] = {"seconds": round(seconds, 3), "cpu_count": os.cpu_count() or 1}
        psi_end = _psi_some_total_us()
        if self._psi_start is not None and psi_end is not None and seconds > 0:
            average = (psi_end - self._psi_start) / 1e6 / seconds
            summary["cpu_pressure"] = {"average": round(average, 4), "peak": round(max(self._windows, default=average), 4)}
        busy_end = cpu_busy_s()
        if self._busy_start is not None and busy_end is not None and seconds > 0:
            own = own_cpu_s(self.helpers) - self._own_start
            others = max(0.0, busy_end - self._busy_start - own) / seconds
            summary["cpus_used"] = {
                "all": round((busy_end - self._busy_start) / seconds, 3),
                "others": round(others, 3),
                # Their worst half second: a burst beside a long measurement.
                "others_peak": round(max(self._others_windows, default=others), 3),
            }
        if self._gpu_samples:
            summary["gpus"] = _summarise_gpus(self._gpu_samples, self.helpers)
        if self._nvml is not None:
            self._nvml.close()
        self.summary = summary
        return False


def _summarise_gpus(samples: list[list[dict[str, Any]]], helpers: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    measurement = {os.getpid(), *helpers}  # the processes that are this measurement
    gpus = []
    for position in range(len(samples[0])):
        seen = [sample[position] for sample in samples if position < len(sample)]
        index = seen[0]["index"]
        reasons = 0
        for sample in seen:
            reasons |= int(sample.get("reasons") or 0)
        clocks = [s["sm_clock_mhz"] for s in seen if "sm_clock_mhz" in s]
        temperatures = [s["temperature_c"] for s in seen if "temperature_c" in s]
        # Inside a container NVML may list processes by the host's pids, so the measurement's
        # processes need not appear as themselves; then they are the busiest (or the only) ones,
        # as many as there are of them.
        most = max((s.get("processes") or [] for s in seen), key=len, default=[])
        use: dict[int, int] = {}
        for sample in seen:
            for pid, percent in (sample.get("sm_use") or {}).items():
                use[pid] = max(use.get(pid, 0), percent)
        listed = list(dict.fromkeys([*use, *most]))
        ours = measurement & set(listed)
        if not ours:
            ours = set(sorted(listed, key=lambda pid: -use.get(pid, -1))[: len(measurement)])
        others = len([pid for pid in listed if pid not in ours])
        # A process that holds a context but runs nothing does not compete for the GPU; where NVML
        # reports per-process use, only the ones that ran kernels count as contention.
        measured_use = any("sm_use" in sample for sample in seen)
        competing = len([pid for pid, percent in use.items() if pid not in ours and percent > 0]) if measured_use else others
        gpus.append(
            {
                "index": index,
                "clock_reasons": [name for bit, name in CLOCK_REASONS.items() if reasons & bit],
                "throttled_by": [name for bit, name in CLOCK_REASONS.items() if reasons & bit and bit in THROTTLING],
                "sm_clock_mhz": [min(clocks), max(clocks)] if clocks else None,
                "max_temperature_c": max(temperatures) if temperatures else None,
                "other_processes": others,
                "competing_processes": competing,
            }
        )
    return gpus


def merge(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary for several measurements: CPU shares weighted by their durations, the worst
    window, every GPU's reasons together, its clock range and its hottest reading."""
    summaries = [s for s in summaries if s]
    if len(summaries) <= 1:
        return summaries[0] if summaries else {}
    seconds = sum(s["seconds"] for s in summaries) or 1.0
    merged: dict[str, Any] = {"seconds": round(seconds, 3), "cpu_count": summaries[0]["cpu_count"]}

    def weighted(key, field):
        return round(sum(s[key][field] * s["seconds"] for s in summaries) / seconds, 4)

    if all("cpu_pressure" in s for s in summaries):
        merged["cpu_pressure"] = {"average": weighted("cpu_pressure", "average"), "peak": max(s["cpu_pressure"]["peak"] for s in summaries)}
    if all("cpus_used" in s for s in summaries):
        merged["cpus_used"] = {
            "all": weighted("cpus_used", "all"),
            "others": weighted("cpus_used", "others"),
            "others_peak": max(s["cpus_used"].get("others_peak", s["cpus_used"]["others"]) for s in summaries),
        }
    gpus: dict[int, dict[str, Any]] = {}
    for summary in summaries:
        for gpu in summary.get("gpus") or []:
            into = gpus.setdefault(
                gpu["index"],
                {"index": gpu["index"], "clock_reasons": [], "throttled_by": [], "other_processes": 0, "competing_processes": 0},
            )
            for key in ("clock_reasons", "throttled_by"):
                into[key] = [name for name in CLOCK_REASONS.values() if name in into[key] or name in (gpu.get(key) or [])]
            for key in ("other_processes", "competing_processes"):
                into[key] = max(into[key], gpu.get(key, gpu.get("other_processes")) or 0)
            if gpu.get("sm_clock_mhz"):
                low, high = into.get("sm_clock_mhz") or gpu["sm_clock_mhz"]
                into["sm_clock_mhz"] = [min(low, gpu["sm_clock_mhz"][0]), max(high, gpu["sm_clock_mhz"][1])]
            if gpu.get("max_temperature_c") is not None:
                into["max_temperature_c"] = max(into.get("max_temperature_c") or gpu["max_temperature_c"], gpu["max_temperature_c"])
    if gpus:
        merged["gpus"] = [gpus[index] for index in sorted(gpus)]
    return merged


@dataclass(frozen=True)
class CpuPressure:
    """Runnable tasks waited for a CPU: the shares of the measurement (``average``) and of its worst
    half second (``peak``); the CPUs other processes used over it, where known."""

    average: float
    peak: float
    others: float | None
    cpu_count: int


@dataclass(frozen=True)
class CpusSaturated:
    """Without PSI: the CPUs were saturated, ``others`` of them used by other processes."""

    cpu_count: int
    others: float


@dataclass(frozen=True)
class GpuShared:
    """Other processes ran kernels on GPU ``index`` during the measurement."""

    index: int
    processes: int


@dataclass(frozen=True)
class GpuThrottled:
    """GPU ``index`` lowered its clocks for these reasons (CLOCK_REASONS' names in THROTTLING)."""

    index: int
    reasons: tuple[str, ...]
    sm_clock_mhz: tuple[int, int] | None
    max_temperature_c: float | None


Finding = CpuPressure | CpusSaturated | GpuShared | GpuThrottled


def findings(summaries: list[dict[str, Any]]) -> list[Finding]:
    """What, seen during a profile's measurements, makes them untrustworthy: a busy CPU or GPU, a
    throttled GPU (pipeline/report/flags.py words them as the comparison's flags)."""
    summary = merge(summaries)
    found: list[Finding] = []
    pressure, used = summary.get("cpu_pressure"), summary.get("cpus_used")
    if pressure is not None:
        # Others' share, where known (older manifests have no peak: their average stands for it).
        others = used["others"] if used else None
        others_peak = used.get("others_peak", others) if used else None

        def beside(share) -> bool:
            return share is None or share >= OTHERS_CPUS_AT_LEAST

        if (pressure["average"] >= BUSY_CPU_PRESSURE and beside(others)) or (
            pressure["peak"] >= BUSY_CPU_PRESSURE_PEAK and beside(others_peak)
        ):
            found.append(CpuPressure(pressure["average"], pressure["peak"], others, summary["cpu_count"]))
    elif used is not None:
        cpus = summary["cpu_count"]
        if used["all"] >= SATURATED_CPU_SHARE * cpus and used["others"] >= OTHERS_CPUS_AT_LEAST:
            found.append(CpusSaturated(cpus, used["others"]))
    for gpu in summary.get("gpus") or []:
        competing = gpu.get("competing_processes", gpu.get("other_processes"))
        if competing:
            found.append(GpuShared(gpu["index"], competing))
        if gpu.get("throttled_by"):
            clocks = gpu.get("sm_clock_mhz")
            found.append(
                GpuThrottled(gpu["index"], tuple(gpu["throttled_by"]), tuple(clocks) if clocks else None, gpu.get("max_temperature_c"))
            )
    return found
