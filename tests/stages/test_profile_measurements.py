"""What a profile makes of its measurements: repeats pooled, each after the first in a fresh
process, disagreeing repeats marked unstable, and a machine that was busy while it measured
flagged as such."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from pipeline.manifest import read_manifest
from pipeline.measuring import machine_watch
from pipeline.report.flags import watch_flags
from pipeline.runtimes.onnxrt.runtime import OnnxRuntimeRuntime
from tests.conftest import TINY_CATALOG, write_catalog


def catalog_with(tmp_path, profile: str):
    text = TINY_CATALOG.replace("[profile]\n", f"[profile]\n{profile}\n")
    return write_catalog(tmp_path / "ws", text)


class Fixed:
    """An engine every run of which takes ``ms`` (nothing is timed)."""

    timing = "host latency"

    def __init__(self, ms: float, seen: list | None = None):
        self.ms, self.seen = ms, seen

    def take(self, runs: int, min_ms: float) -> list[float]:
        if self.seen is not None:
            self.seen.append(os.sched_getaffinity(0))
        return [self.ms] * runs

    def evidence(self) -> dict:
        return {"device": "scripted", "metric": self.timing}


def scripted_measurements(monkeypatch, medians: list[float]):
    """ONNX Runtime's engine runs at these milliseconds, one per measurement of `--repeat`: the
    first here, the others where a fresh process would take them (run here: the scripting cannot
    reach a new interpreter; test_a_repeat_runs_in_a_fresh_process checks the real thing)."""
    from pipeline.measuring.rounds import SmClock, measure_in_rounds

    remaining = list(medians)
    monkeypatch.setattr(OnnxRuntimeRuntime, "prepare", lambda self, engine_path, workload=None: Fixed(remaining.pop(0)))

    def repeat_here(stages, settings):
        from pipeline.stages.point import entrant_name, point_seed

        engines = {entrant_name(stage): Fixed(remaining.pop(0)) for stage in stages}
        with machine_watch.MachineWatch():
            outcome = measure_in_rounds(engines, settings, point_seed(stages), None, SmClock())
        return outcome, {name: engine.evidence() for name, engine in engines.items()}

    monkeypatch.setattr("pipeline.stages.point._in_fresh_process", repeat_here)
    return remaining


def profile_details(catalog):
    return read_manifest(catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details


def test_repeats_are_pooled_and_each_median_kept(tmp_path, run_cli, monkeypatch):
    catalog = catalog_with(tmp_path, "")
    left = scripted_measurements(monkeypatch, [10.0, 10.2, 10.1])
    result = run_cli(catalog, "run", "--variant", "fp32", "--repeat", "3")
    assert result.exit_code == 0, result.err
    assert left == []
    details = profile_details(catalog)
    assert details.repeats_pooled == 3 and len(details.rounds) == 3  # each measurement's rounds kept
    assert len({record.group for record in details.rounds}) == 3
    pooled = [take.median_ms for record in details.rounds for take in record.takes for _ in range(take.runs)]
    assert sorted(details.per_iteration_ms) == sorted(pooled) and details.iterations == len(pooled)
    assert details.latency_ms.median == pytest.approx(statistics.median(pooled))
    assert details.repeat_medians_ms == pytest.approx([10.0, 10.2, 10.1])
    assert details.stable is True and details.retaken_medians_ms == []
    assert len(details.machine_load["during"]) == 3 and all(s["seconds"] >= 0 for s in details.machine_load["during"])
    assert f"over {len(pooled)} runs of 3 measurements pooled" in result.err


def test_repeats_that_disagree_are_recorded_as_unstable(tmp_path, run_cli, monkeypatch):
    """Repeats are independent measurements that show how repeatable the number is; they are not
    taken again until they agree (rounds, not retakes, are how a comparison is made to hold)."""
    catalog = catalog_with(tmp_path, "max_repeat_cv = 0.05")
    left = scripted_measurements(monkeypatch, [5.0, 9.0])
    result = run_cli(catalog, "run", "--variant", "fp32", "--repeat", "2")
    assert result.exit_code == 0, result.err
    assert left == []
    details = profile_details(catalog)
    assert details.stable is False and details.repeat_medians_ms == [5.0, 9.0] and details.retaken_medians_ms == []
    assert "unstable" in result.err
    compared = run_cli(catalog, "compare", "--format", "json")
    row = next(r for r in json.loads(compared.out)["rows"] if r["variant"] == "fp32")
    assert row["status"].startswith("unstable") and "disagree (CV" in row["status"] and "retake" not in row["status"]


def test_a_repeat_runs_in_a_fresh_process(tmp_path, run_cli, monkeypatch):
    """The first measurement is scripted in this process; the second cannot see the scripting, so
    its figures are ONNX Runtime's own, measured in a new interpreter."""
    catalog = catalog_with(tmp_path, "")
    monkeypatch.setattr(OnnxRuntimeRuntime, "prepare", lambda self, engine_path, workload=None: Fixed(1.0))
    result = run_cli(catalog, "-v", "run", "--variant", "fp32", "--repeat", "2")
    assert result.exit_code == 0, result.err
    assert "measurement 2 of 2, in a fresh process" in result.err
    details = profile_details(catalog)
    first, second = details.rounds
    assert {take.median_ms for take in first.takes} == {1.0} and 1.0 not in {take.median_ms for take in second.takes}
    assert details.device.startswith("onnxruntime") and details.repeats_pooled == 2
    assert len(details.machine_load["during"]) == 2


def test_a_repeat_whose_process_fails_names_the_engine(tmp_path, run_cli, monkeypatch):
    """The engine file is damaged while the fresh process loads it (and restored after, so the
    profile's own check of its inputs passes): the repeat's failure is named, not a traceback."""
    from pipeline.stages import point

    catalog = catalog_with(tmp_path, "")
    in_fresh_process = point._in_fresh_process

    def damaged_meanwhile(stages, settings):
        engine = stages[0].engine_file()
        kept = engine.read_bytes()
        engine.write_bytes(b"not an ONNX model any more")
        try:
            return in_fresh_process(stages, settings)
        finally:
            engine.write_bytes(kept)

    monkeypatch.setattr(point, "_in_fresh_process", damaged_meanwhile)
    result = run_cli(catalog, "run", "--variant", "fp32", "--repeat", "2")
    assert result.exit_code == 1, result.err
    assert "ERROR ONNX Runtime could not load tiny_fp32.onnx" in result.err and "Traceback" not in result.err


def start_cpu_hogs(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


@pytest.fixture(params=["pressure stall information", "other processes' CPU time"])
def cpu_evidence(request, monkeypatch, tmp_path):
    """Each way the watch sees CPU contention: PSI where the kernel has it, CPU time otherwise."""
    if request.param.startswith("pressure"):
        if machine_watch._psi_some_total_us() is None:
            pytest.skip("this kernel has no /proc/pressure/cpu (PSI); the CPU-time fallback is tested beside this")
    else:
        monkeypatch.setattr(machine_watch, "PSI_CPU", tmp_path / "no-psi")
    return request.param


def test_cpu_hogs_started_just_before_a_profile_mark_the_row_busy(tmp_path, run_cli, cpu_evidence):
    catalog = catalog_with(tmp_path, "").parent / "pipeline.toml"
    catalog.write_text(catalog.read_text().replace("duration_s = 0.05", "duration_s = 1.5"))
    result = run_cli(catalog, "build", "--variant", "fp32")
    assert result.exit_code == 0, result.err
    quiet = run_cli(catalog, "profile", "--variant", "fp32", "--force")
    assert quiet.exit_code == 0, quiet.err
    assert not [f for f in watch_flags(profile_details(catalog).machine_load["during"]) if f.startswith("busy")]

    hogs = start_cpu_hogs(os.cpu_count() or 1)
    try:
        time.sleep(1.0)  # far too short for the one-minute load average to notice
        busy = run_cli(catalog, "profile", "--variant", "fp32", "--force")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy.exit_code == 0, busy.err
    assert "busy:" in busy.err
    compared = run_cli(catalog, "compare", "--format", "json")
    row = next(r for r in json.loads(compared.out)["rows"] if r["variant"] == "fp32")
    assert any(flag.startswith("busy: ") for flag in row["flags"]), row["flags"]


def test_gpu_throttling_and_other_processes_seen_during_a_measurement_are_flagged():
    me = os.getpid()
    samples = [
        [{"index": 0, "reasons": 0x1, "sm_clock_mhz": 1980, "temperature_c": 60, "processes": [me]}],
        [{"index": 0, "reasons": 0x20 | 0x4, "sm_clock_mhz": 1410, "temperature_c": 87, "processes": [me, 4242]}],
    ]
    (gpu,) = machine_watch._summarise_gpus(samples)
    assert gpu["clock_reasons"] == ["software power cap", "software thermal slowdown"] and gpu["sm_clock_mhz"] == [1410, 1980]
    assert gpu["throttled_by"] == ["software thermal slowdown"]
    quiet = {"seconds": 1.0, "cpu_count": 16, "cpu_pressure": {"average": 0.0, "peak": 0.01}}
    flags = watch_flags([quiet, {**quiet, "gpus": [gpu]}])
    assert flags == [
        "busy: 1 other process(es) ran on GPU 0 during the measurement",
        "throttled: GPU 0 software thermal slowdown (SM clock 1410–1980 MHz, up to 87 °C)",
    ]


def test_running_at_the_power_limit_is_recorded_but_is_not_throttling():
    # What the lent H100 reports under a ViT-B load: its software power cap, clocks below maximum.
    samples = [
        [{"index": 0, "reasons": 0x4, "sm_clock_mhz": clock, "temperature_c": 58, "processes": [os.getpid()]}] for clock in (1605, 1815)
    ]
    (gpu,) = machine_watch._summarise_gpus(samples)
    assert gpu["clock_reasons"] == ["software power cap"] and gpu["throttled_by"] == []
    assert watch_flags([{"seconds": 3.0, "cpu_count": 16, "gpus": [gpu]}]) == []


def test_in_a_container_the_one_process_nvml_lists_is_the_measurement():
    # NVML lists host pids inside a container: one process that is not this one is the measurement's own.
    (alone,) = machine_watch._summarise_gpus([[{"index": 0, "reasons": 0x1, "processes": [31337]}]])
    assert alone["other_processes"] == 0 and watch_flags([{"seconds": 1.0, "cpu_count": 1, "gpus": [alone]}]) == []


def test_a_process_that_holds_the_gpu_but_runs_nothing_is_not_contention():
    # Seen on the lent H100: the process that launched the pipeline held a CUDA context, idle.
    me = os.getpid()
    samples = [[{"index": 0, "reasons": 0x4, "processes": [me, 4242], "sm_use": {me: 97, 4242: 0}}]]
    (gpu,) = machine_watch._summarise_gpus(samples)
    assert gpu["other_processes"] == 1 and gpu["competing_processes"] == 0
    assert watch_flags([{"seconds": 1.0, "cpu_count": 16, "gpus": [gpu]}]) == []
    # One that ran kernels meanwhile is; in a container (host pids) the busiest process is the measurement.
    (shared,) = machine_watch._summarise_gpus([[{"index": 0, "processes": [100, 200], "sm_use": {100: 90, 200: 35}}]])
    assert shared["competing_processes"] == 1
    assert watch_flags([{"seconds": 1.0, "cpu_count": 16, "gpus": [shared]}]) == [
        "busy: 1 other process(es) ran on GPU 0 during the measurement"
    ]


def test_the_processes_that_serve_a_measurements_engines_are_its_own_on_the_gpu():
    """A compiled engine timed in the process that compiled it (pipeline/runtimes/pytorch/served.py):
    that process, and its companions holding the GPU idle, are the measurement's, not contention;
    any other process running kernels still is. In a container (host pids) the measurement is the
    busiest processes, as many as it has."""
    me = os.getpid()
    helpers = frozenset({5001, 5002})
    samples = [[{"index": 0, "processes": [me, 5001, 5002, 4242], "sm_use": {me: 60, 5001: 35, 5002: 0, 4242: 0}}]]
    (gpu,) = machine_watch._summarise_gpus(samples, helpers)
    assert gpu["other_processes"] == 1 and gpu["competing_processes"] == 0, gpu
    assert watch_flags([{"seconds": 1.0, "cpu_count": 16, "gpus": [gpu]}]) == []
    # Where NVML gives no per-process use, idle companions holding a context count as ours too.
    (unmeasured,) = machine_watch._summarise_gpus([[{"index": 0, "processes": [me, 5001, 5002]}]], helpers)
    assert unmeasured["competing_processes"] == 0, unmeasured
    busy = [[{"index": 0, "processes": [me, 5001, 4242], "sm_use": {me: 60, 5001: 35, 4242: 20}}]]
    (shared,) = machine_watch._summarise_gpus(busy, helpers)
    assert shared["competing_processes"] == 1, shared
    hosted = [[{"index": 0, "processes": [900, 901, 902, 903], "sm_use": {900: 50, 901: 40, 902: 1, 903: 30}}]]
    (container,) = machine_watch._summarise_gpus(hosted, helpers)
    assert container["competing_processes"] == 1, container  # 902, the least busy of the four


def test_the_cpu_time_of_the_processes_that_serve_a_measurement_is_its_own():
    """Their CPU time counts with this process's, so a take served elsewhere is not a busy host;
    one that has ended keeps what it had used."""
    import subprocess
    import sys
    import time

    # The child burns 0.3 s of CPU, says so, and waits to be read.
    burn = "import time\nwhile time.process_time() < 0.3: pass\nprint('burnt', flush=True)\ntime.sleep(5)"
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        before, alone = machine_watch.own_cpu_s(frozenset({child.pid})), machine_watch.own_cpu_s()
        assert child.stdout.readline().strip() == "burnt"
        during, alone_during = machine_watch.own_cpu_s(frozenset({child.pid})), machine_watch.own_cpu_s()
    finally:
        child.kill()
        child.wait(10)
    counted = (during - before) - (alone_during - alone)
    assert 0.25 <= counted <= 1.0, counted  # its 0.3 s (less what it had used when first read), in ticks of 10 ms
    time.sleep(0.05)
    ended = machine_watch.own_cpu_s(frozenset({child.pid})) - machine_watch.own_cpu_s()
    assert ended == pytest.approx(during - alone_during, abs=0.02)  # gone, it keeps what it had used


def test_several_measurements_are_judged_together():
    calm = {"seconds": 3.0, "cpu_count": 2, "cpu_pressure": {"average": 0.01, "peak": 0.02}, "cpus_used": {"all": 1.0, "others": 0.0}}
    contended = {"seconds": 1.0, "cpu_count": 2, "cpu_pressure": {"average": 0.30, "peak": 0.50}, "cpus_used": {"all": 2.0, "others": 1.0}}
    merged = machine_watch.merge([calm, contended])
    assert merged["cpu_pressure"] == {"average": pytest.approx(0.0825), "peak": 0.5}
    assert merged["cpus_used"] == {"all": 1.25, "others": 0.25, "others_peak": 1.0}
    (flag,) = watch_flags([calm, contended])
    assert flag.startswith("busy: runnable tasks waited for a CPU 8% of the measurement (worst half second 50%)")


def test_the_pipelines_own_threads_waiting_on_each_other_are_not_a_busy_machine():
    """ONNX Runtime's and PyTorch's thread pools on a 2-CPU machine make tasks wait with no other
    process running (seen in CI: 11 %, other processes 0.0 CPUs): the process measured, not another
    workload. Others taking CPUs while tasks wait is busy, over the measurement or in a burst."""
    own = {
        "seconds": 3.0,
        "cpu_count": 2,
        "cpu_pressure": {"average": 0.11, "peak": 0.48},
        "cpus_used": {"all": 2.0, "others": 0.0, "others_peak": 0.02},
    }
    assert watch_flags([own]) == []
    beside = {**own, "cpus_used": {"all": 2.0, "others": 1.2, "others_peak": 1.9}}
    assert watch_flags([beside])[0].startswith("busy: runnable tasks waited for a CPU 11%")
    burst = {**own, "cpu_pressure": {"average": 0.04, "peak": 0.48}, "cpus_used": {"all": 2.0, "others": 0.1, "others_peak": 1.5}}
    assert watch_flags([burst])[0].startswith("busy: runnable tasks waited for a CPU 4% of the measurement (worst half second 48%)")
    # Without the CPU-time figure (or from an older manifest without its peak), the pressure alone decides, as before.
    assert watch_flags([{k: v for k, v in own.items() if k != "cpus_used"}])
    older = {**own, "cpus_used": {"all": 2.0, "others": 0.7}}
    assert watch_flags([older])


def test_host_cpus_pins_each_measurement_and_lets_go_after(tmp_path, run_cli, monkeypatch):
    before = os.sched_getaffinity(0)
    seen = []
    monkeypatch.setattr(OnnxRuntimeRuntime, "prepare", lambda self, engine_path, workload=None: Fixed(1.0, seen))
    plain = catalog_with(tmp_path, "")
    assert run_cli(plain, "run", "--variant", "fp32").exit_code == 0
    assert seen and set(map(frozenset, seen)) == {frozenset(before)}
    # Pinning re-measures (the manifest records where it ran); leaving it unset kept the fingerprint
    # of measurements taken before the setting existed, so the run above has no `host_cpus` in its params.
    assert "host_cpus" not in read_manifest(plain.parent / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.params["settings"]
    cpu = min(before)
    plain.write_text(plain.read_text().replace("[profile]\n", f"[profile]\nhost_cpus = [{cpu}]\n"))
    seen.clear()
    result = run_cli(plain, "run", "--variant", "fp32")
    assert result.exit_code == 0, result.err
    assert seen and set(map(frozenset, seen)) == {frozenset({cpu})} and os.sched_getaffinity(0) == before
    assert profile_details(plain).settings.host_cpus == (cpu,)


def test_host_cpus_the_process_may_not_use_are_named_with_those_it_may(tmp_path, run_cli):
    allowed = os.sched_getaffinity(0)
    missing = max(allowed) + 1000
    catalog = catalog_with(tmp_path, f"host_cpus = [{missing}]")
    result = run_cli(catalog, "run", "--variant", "fp32")
    assert result.exit_code == 1 and "Traceback" not in result.err
    assert f"[profile] host_cpus = [{missing}]: this process may not run on CPU {missing}" in result.err
    assert os.sched_getaffinity(0) == allowed
    negative = catalog_with(tmp_path / "negative", "host_cpus = [-1]")
    refused = run_cli(negative, "run", "--variant", "fp32")
    assert refused.exit_code == 2 and "host_cpus" in refused.err and "CPU numbers start at 0" in refused.err


def test_cpu_ranges_read_as_a_person_writes_them():
    from pipeline.machine.environment import _ranges

    assert _ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3, 8, 10-11" and _ranges([5]) == "5"


def test_only_the_gpu_measured_on_is_watched(monkeypatch):
    """NVML lists every GPU of the machine: a point measured on GPU 1 beside another process's
    work on GPU 0 (two points at once, --gpus 0,1) is not busy; unknown which GPU, all are watched."""
    import types

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: [b"GPU-aaaa", "GPU-bbbb"][h],  # older bindings answer bytes
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
        nvmlDeviceGetClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetTemperature=lambda h, sensor: 40,
        # GPU 0: two other processes at work (another point's, and one beside it); GPU 1: this one.
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=pid) for pid in ([4242, 4343] if h == 0 else [os.getpid()])
        ],
        nvmlDeviceGetProcessUtilization=lambda h, since: (
            [types.SimpleNamespace(pid=4242, smUtil=90), types.SimpleNamespace(pid=4343, smUtil=30)] if h == 0 else []
        ),
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        NVMLError_NotFound=LookupError,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    def watched(uuid):
        with machine_watch.MachineWatch(interval_s=0.02, gpu_uuid=uuid) as watch:
            time.sleep(0.1)
        return watch.summary

    on_second = watched("GPU-bbbb")
    assert [gpu["index"] for gpu in on_second["gpus"]] == [1]
    assert not [flag for flag in watch_flags([on_second]) if "GPU" in flag]
    assert [gpu["index"] for gpu in watched("GPU-aaaa")["gpus"]] == [0]
    every = watched(None)
    assert [gpu["index"] for gpu in every["gpus"]] == [0, 1]
    assert "busy: 1 other process(es) ran on GPU 0 during the measurement" in watch_flags([every])
