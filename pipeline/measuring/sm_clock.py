"""The SM clock of the GPU a point is measured on, read through NVML while a take runs: a take whose
clock fell below THROTTLE_THRESHOLD of the default is dropped (pipeline/measuring/rounds.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pipeline.measuring import nvml

# A take is dropped when the GPU's SM clock fell below this share of its default clock.
THROTTLE_THRESHOLD = 0.75
# How often the SM clock is read while a take runs.
CLOCK_INTERVAL_S = 0.02
# NVML's utilisation (the share of its last sample period, 1/6 s to 1 s, in which a kernel ran) at
# which the GPU counts as busy, for the takes whose clock is read only while it is.
BUSY_UTILIZATION = 50


class SmClock:
    """The SM clock of the GPU engines run on — the one of UUID ``gpu_uuid`` (the GPU the point is
    measured on: environment.measuring_gpu), else the first NVML lists — and its default clock;
    ``available`` False without NVML or a GPU. NVML numbers every GPU of the machine whatever
    CUDA_VISIBLE_DEVICES says, so a run told to use GPU 1 would otherwise read GPU 0's clock."""

    def __init__(self, gpu_uuid: str | None = None):
        self.available, self.default_mhz = False, None
        try:
            self.nvml = pynvml = nvml.opened()
            self.handle = nvml.handle(pynvml, gpu_uuid)
            try:
                self.default_mhz = float(pynvml.nvmlDeviceGetDefaultApplicationsClock(self.handle, pynvml.NVML_CLOCK_SM))
            except Exception:  # not every GPU has application clocks
                self.default_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM))
            self.available = self.default_mhz > 0
        except Exception:  # not installed, no driver, no GPU
            return

    def read_mhz(self) -> float | None:
        try:
            return float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        except Exception:
            return None

    def busy(self) -> bool:
        """Whether the GPU ran a kernel for most of NVML's last sample period."""
        try:
            return self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu >= BUSY_UTILIZATION
        except Exception:
            return True

    def during(self, work: Callable[[], Any], busy_only: bool = False) -> tuple[Any, float | None]:
        """``work()`` and the median SM clock read while it ran (every CLOCK_INTERVAL_S, on a
        thread of its own; once after it when it was shorter). ``busy_only``: only the reads taken
        while the GPU was busy (a take that is mostly a tool starting up; None when it never was)."""
        samples: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(CLOCK_INTERVAL_S):
                value = self.read_mhz()
                if value is not None and (not busy_only or self.busy()):
                    samples.append(value)

        sampler = threading.Thread(target=sample, name="sm-clock", daemon=True)
        sampler.start()
        try:
            result = work()
        finally:
            done.set()
            sampler.join()
        if not samples and not busy_only:
            last = self.read_mhz()
            samples = [last] if last is not None else []
        return result, (sorted(samples)[len(samples) // 2] if samples else None)
