"""Energy per take (pipeline/measuring/energy.py): NVML's counter, faked by a stand-in with pynvml's
call that steps as the real one does; RAPL read from a fake powercap tree in the kernel's file
format; the rounds lengthening their takes until the counter resolves; why there is no energy."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pipeline.catalog import ProfileSettings
from pipeline.measuring import energy
from pipeline.measuring.energy import MIN_STEPS, NOT_ASKED, TOOL_TAKE, Energy, NoEnergy, NvmlEnergy, RaplEnergy
from pipeline.measuring.rounds import measure_in_rounds


class SteppingNvml:
    """pynvml's energy call as a GPU answers it: millijoules since the driver loaded, advanced by
    the driver every ``period_ms`` at ``watts`` (so a read between two updates sees the older one)."""

    def __init__(self, period_ms: float, watts: float = 300.0, counter: bool = True):
        self.period_ms, self.watts, self.counter = period_ms, watts, counter
        self.started = time.perf_counter()
        self.reads = 0

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.counter:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        self.reads += 1
        elapsed_ms = (time.perf_counter() - self.started) * 1000.0
        updates = int(elapsed_ms // self.period_ms)
        return 5_000_000 + int(updates * self.period_ms * self.watts)  # mJ: ms × W


def test_nvml_reads_joules_around_a_take_and_counts_the_counters_steps(monkeypatch):
    monkeypatch.setattr(energy, "POLL_S", 0.001)
    meter = NvmlEnergy(SteppingNvml(period_ms=4), "GPU-1")
    meter.poll_s = 0.001
    result, reading = meter.during(lambda: time.sleep(0.2) or "done")
    assert result == "done"
    # 200 ms at 300 W is 60 J; each end misses at most one 4 ms step (1.2 J).
    assert reading.joules == pytest.approx(60.0, abs=2 * 1.2 + 0.5)
    assert 40 <= reading.steps <= 51 and reading.resolved
    assert reading.wall_ms == pytest.approx(200, abs=30)


def test_a_take_shorter_than_min_steps_of_the_counter_does_not_resolve():
    meter = NvmlEnergy(SteppingNvml(period_ms=20), "GPU-1")
    _, reading = meter.during(lambda: time.sleep(0.03))
    assert reading.steps <= 2 and not reading.resolved  # 0 to 2 steps: a reading of 0 J or a whole step


def test_why_there_is_no_gpu_energy_is_said():
    assert NvmlEnergy.opened("GPU-1", nvml=SteppingNvml(20, counter=False)).why_not.startswith(
        "NVML has no energy counter for this GPU (Volta or later has one): NVML_ERROR_NOT_SUPPORTED"
    )

    def no_pynvml():
        raise ImportError("No module named 'pynvml'")

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    for opened, why in (
        (no_pynvml, "no NVML: nvidia-ml-py (pynvml) is not installed"),
        (no_driver, "no NVML: NVML Shared Library Not Found"),
    ):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("pipeline.measuring.nvml.opened", opened)
            assert NvmlEnergy.opened("GPU-1").why_not == why
    assert NvmlEnergy.opened("GPU-1", nvml=SteppingNvml(20)).why_not is None


# --- RAPL, from a fake powercap tree ----------------------------------------------------------------


def powercap(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """A /sys/class/powercap tree as the kernel lays it out: zone → (name, energy_uj, max_energy_range_uj)."""
    for zone, (name, uj, top) in zones.items():
        folder = root / zone
        folder.mkdir(parents=True)
        (folder / "name").write_text(name + "\n")
        (folder / "energy_uj").write_text(f"{uj}\n")
        (folder / "max_energy_range_uj").write_text(f"{top}\n")
    return root


def set_uj(root: Path, zone: str, uj: int) -> None:
    (root / zone / "energy_uj").write_text(f"{uj}\n")


def test_rapl_sums_the_packages_and_unwraps_each_at_its_range(tmp_path):
    top = 262_143_328_850
    root = powercap(
        tmp_path / "powercap",
        {
            "intel-rapl:0": ("package-0", top - 1_000_000, top),  # 1 J before it wraps
            "intel-rapl:0:0": ("core", 10, top),  # inside package 0: not added again
            "intel-rapl:1": ("package-1", 5_000_000, top),
            "intel-rapl:2": ("psys", 7, top),  # the platform: overlaps the packages
        },
    )
    meter = RaplEnergy.opened(root)
    assert meter.why_not is None and [zone.name for zone in meter.zones] == ["intel-rapl:0", "intel-rapl:1"]

    def take():
        time.sleep(0.02)
        set_uj(root, "intel-rapl:0", 2_000_000)  # wrapped: 1 J to the top, then 2 J
        set_uj(root, "intel-rapl:0:0", 99_999_999)
        set_uj(root, "intel-rapl:1", 5_500_000)

    _, reading = meter.during(take)
    assert reading.joules == pytest.approx(3.0 + 0.5)
    assert reading.steps is None and reading.resolved  # counted by its ~1 ms updates: 20 ms is 20 of them


def test_rapl_says_why_it_cannot_be_read(tmp_path, monkeypatch):
    assert RaplEnergy.opened(tmp_path / "absent").why_not == f"no RAPL: {tmp_path / 'absent'} absent"
    assert RaplEnergy.opened(tmp_path).why_not == f"no RAPL: no package zone (intel-rapl:<n> named package-<n>) under {tmp_path}"
    root = powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 1, 100)})
    real = Path.read_text

    def root_only(path, *args, **kwargs):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", root_only)
    assert (
        RaplEnergy.opened(root).why_not == f"no RAPL: {root / 'intel-rapl:0' / 'energy_uj'} is readable by root only (since CVE-2020-8694)"
    )


def test_this_machine_says_why_it_has_no_rapl():
    """The real path, on the machine the tests run on (a VM without /sys/class/powercap): a reason, never an error."""
    meter = RaplEnergy.opened()
    assert meter.why_not is None or meter.why_not.startswith("no RAPL: ")


# --- in the rounds ----------------------------------------------------------------------------------


class Sleeping:
    """An engine whose take lasts the length it is asked for, on the GPU: the counter runs meanwhile."""

    timing = "GPU time (CUDA events)"
    on_gpu = True

    def __init__(self, ms: float):
        self.ms, self.asked = ms, []

    def take(self, runs: int, min_ms: float) -> list[float]:
        self.asked.append(min_ms)
        count = max(runs, int(min_ms // self.ms))
        time.sleep(count * self.ms / 1000.0)
        return [self.ms] * count

    def evidence(self) -> dict:
        return {"device": "sleeping"}


def settings(**given) -> ProfileSettings:
    return ProfileSettings(**{"take_ms": 2, "take_runs": 1, "round_ms": 0, "min_rounds": 6, "budget_s": 30, "racing": False, **given})


def test_takes_grow_until_the_counter_resolves_and_the_manifest_says_how_it_was_read(monkeypatch):
    """A counter stepping every 4 ms cannot resolve a 2 ms take: the takes grow to MIN_STEPS steps
    and stay there, every engine's alike; the takes read before count for nothing."""
    monkeypatch.setattr(energy, "POLL_S", 0.0005)
    monkeypatch.setattr(NvmlEnergy, "poll_s", 0.0005)
    engines = {"a": Sleeping(1.0), "b": Sleeping(2.0)}
    meters = Energy(gpu=NvmlEnergy(SteppingNvml(period_ms=4), "GPU-1"), cpu=NoEnergy("no RAPL: /sys/class/powercap absent"))
    done = measure_in_rounds(engines, settings(), seed=1, energy=meters)
    record = done.record("a")
    how = record.energy
    assert how.source == "nvml" and how.min_steps == MIN_STEPS and how.scope.startswith("the whole GPU")
    assert how.least_take_ms >= MIN_STEPS * 4 * 0.9 and how.step_ms == pytest.approx(4, rel=0.3)
    assert engines["a"].asked[0] == 2 and engines["a"].asked[-1] == engines["b"].asked[-1] == pytest.approx(how.least_take_ms, abs=1e-3)
    assert not record.takes[0].energy_resolved and record.takes[-1].energy_resolved
    assert how.unresolved_takes == sum(1 for take in record.takes if not take.energy_resolved) >= 1
    last = record.takes[-1]
    assert last.energy_steps >= MIN_STEPS and last.energy_runs == last.runs + 1  # the untimed run is inside the reading
    assert last.joules == pytest.approx(300.0 * (last.energy_runs * 1.0) / 1000.0, rel=0.35)  # ~300 W over the take
    assert record.energy_why_not is None
    # When the counter was read, for a reading beside it: the takes follow each other in time.
    assert last.energy_ms >= how.least_take_ms * 0.9
    starts = [take.energy_from_s for take in sorted(record.takes, key=lambda take: take.round)]
    assert all(0 < later - earlier < 5 for earlier, later in zip(starts, starts[1:], strict=False))
    assert abs(starts[-1] - time.time()) < 60


def test_engines_without_a_counter_say_why_and_are_not_lengthened():
    class OnTheCpu(Sleeping):
        timing, on_gpu = "host latency", False

    class ToolRun(Sleeping):
        clock_while_busy = True  # a take is a run of a tool in a process of its own

    engines = {"cpu": OnTheCpu(1.0), "tool": ToolRun(1.0)}
    meters = Energy(gpu=NvmlEnergy(SteppingNvml(period_ms=50), "GPU-1"), cpu=NoEnergy("no RAPL: /sys/class/powercap absent"))
    done = measure_in_rounds(engines, settings(), seed=1, energy=meters)
    assert done.record("cpu").energy is None and done.record("cpu").energy_why_not == "no RAPL: /sys/class/powercap absent"
    assert done.record("tool").energy_why_not == TOOL_TAKE
    assert set(engines["cpu"].asked) == {2} and all(take.joules is None for take in done.takes["cpu"])
    plain = measure_in_rounds({"a": OnTheCpu(1.0)}, settings(), seed=1)  # nothing asked to read: nothing said
    assert plain.record("a").energy is None and plain.record("a").energy_why_not is None


def test_energy_not_asked_opens_no_counter_polls_nothing_and_grows_no_take(monkeypatch):
    """The default: no counter opened, no thread beside a take, every take as long as asked, and
    each engine's record saying energy was not asked for (a tool's take too: nobody asked)."""

    def opened(*args, **kwargs):
        raise AssertionError("a counter was opened where energy was not asked for")

    monkeypatch.setattr(NvmlEnergy, "opened", classmethod(opened))
    monkeypatch.setattr(RaplEnergy, "opened", classmethod(opened))
    pollers = []

    class Watching(Sleeping):
        def take(self, runs, min_ms):
            pollers.extend(thread.name for thread in threading.enumerate() if thread.name.endswith("-energy"))
            return super().take(runs, min_ms)

    class ToolRun(Watching):
        clock_while_busy = True

    engines = {"gpu": Watching(1.0), "tool": ToolRun(1.0)}
    done = measure_in_rounds(engines, settings(), seed=1, energy=Energy.where_asked(False, "GPU-1"))
    assert not pollers and set(engines["gpu"].asked) == {2}
    for key in engines:
        assert done.record(key).energy is None and done.record(key).energy_why_not == NOT_ASKED
        assert all(take.joules is None for take in done.takes[key])
    assert not ProfileSettings().reads_energy and ProfileSettings(energy=True).reads_energy


def test_energy_is_a_yes_or_no():
    with pytest.raises(ValueError, match="energy"):
        ProfileSettings(energy="sometimes")
