"""The host's speed around each take (pipeline/measuring/host_speed.py), the flag a slowed row earns
(pipeline/report/flags.py), and how a point's rounds hold the host (pipeline/measuring/host_rounds.py)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from pipeline.catalog import ProfileSettings
from pipeline.measuring import host_speed
from pipeline.measuring.host_rounds import HostRounds
from pipeline.measuring.host_speed import HostSpeed
from pipeline.measuring.records import RoundsRecord, Take
from pipeline.measuring.rounds import HOST_LATENCY, measure_in_rounds
from pipeline.report.flags import host_slowed_flag


def test_throttled_time_is_read_from_cgroup_v1_and_v2_and_the_binding_group_counts(tmp_path):
    v1, v2 = tmp_path / "v1.stat", tmp_path / "v2.stat"
    v1.write_text("nr_periods 994\nnr_throttled 977\nthrottled_time 6635669874\n")
    v2.write_text("usage_usec 10\nnr_throttled 3\nthrottled_usec 2000000\n")
    assert host_speed._throttled_ns([v1]) == 6635669874
    assert host_speed._throttled_ns([v2]) == 2_000_000_000
    assert host_speed._throttled_ns([v2, v1]) == 6635669874
    assert host_speed._throttled_ns([tmp_path / "absent"]) == 0


def test_a_takes_slowdown_is_the_probe_against_alone_times_the_share_it_was_held_off(monkeypatch):
    probes = iter([2.0, 2.0, 3.0])
    monkeypatch.setattr(host_speed, "probe_ms", lambda cgroups=None: next(probes))
    monkeypatch.setattr(host_speed, "_throttled_ns", lambda files: 0)
    host = HostSpeed(alone_ms=2.0, source="this process")
    host.before_take()
    assert host.after_take().slowdown == pytest.approx(1.0)  # probes 2.0 either side, nothing throttled
    host.before_take()
    assert host.after_take().slowdown == pytest.approx(1.25)  # probes 2.0 and 3.0: CPUs 1.25x slower

    clock = iter([0, 100_000_000])
    monkeypatch.setattr(host_speed, "_throttled_ns", lambda files: next(clock))
    monkeypatch.setattr(host_speed, "_cpus", lambda: 1)
    monkeypatch.setattr(host_speed, "probe_ms", lambda cgroups=None: 2.0)
    host = HostSpeed(alone_ms=2.0, source="this process")
    host.before_take()
    time.sleep(0.2)  # throttled 0.1 s of about 0.2: held off half the take
    around = host.after_take()
    assert 1.7 < around.slowdown < 2.05 and 0.4 < around.throttled < 0.55


def test_a_take_counts_other_processes_cpus_over_a_quarter_second_up_to_its_end(monkeypatch):
    from pipeline.measuring import machine_watch

    now = [100.0]
    monkeypatch.setattr(host_speed.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(host_speed.time, "perf_counter_ns", lambda: int(now[0] * 1e9))
    monkeypatch.setattr(host_speed, "probe_ms", lambda cgroups=None: 2.0)
    # The machine busy 3 CPUs' worth, of which this process 1: others used 2.
    monkeypatch.setattr(machine_watch, "cpu_busy_s", lambda: 3.0 * now[0])
    monkeypatch.setattr(machine_watch, "own_cpu_s", lambda helpers=frozenset(): 1.0 * now[0])
    host = HostSpeed(alone_ms=2.0, source="this process")
    for _ in range(40):  # takes of 10 ms: each one's window reaches back past the take to a quarter second
        host.before_take()
        now[0] += 0.01
        around = host.after_take()
        assert around.others_cpus == pytest.approx(2.0)
    assert len(host._cpu_samples) <= 2 * 0.25 / 0.01 + 2  # the samples older than the window are let go
    monkeypatch.setattr(machine_watch, "cpu_busy_s", lambda: None)  # a kernel without /proc/stat
    host.before_take()
    now[0] += 0.01
    assert host.after_take().others_cpus is None


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_child_is_another_process_and_its_cpu_time_never_lands_on_this_one_when_reaped():
    """A child's CPU time joins the parent's os.times() only when it is reaped, all at once: counted
    as this process's own, a worker compiling ahead beside the rounds would make the window it
    ended in read "no other process", however busy the others were."""
    from pipeline.measuring.machine_watch import own_cpu_s

    before = own_cpu_s()
    child = multiprocessing.get_context("fork").Process(target=_burn, args=(0.5,))
    child.start()
    child.join()  # reaped: its half second is now the parent's children time
    assert own_cpu_s() - before < 0.25


def test_alone_is_this_process_calibration_unless_others_used_the_cpus_and_the_host_was_faster_idle(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(host_speed, "_calibration", lambda helpers=frozenset(): (1.5, 1.04, 0.1))  # the host otherwise idle
    first = HostSpeed.calibrated()
    assert (first.alone_ms, first.source, first.noise) == (1.5, "this process", 1.04)
    monkeypatch.setattr(host_speed, "_calibration", lambda helpers=frozenset(): (2.5, 1.1, 3.0))  # beside another GPU's compiling
    later = HostSpeed.calibrated()
    assert (later.alone_ms, later.source, later.noise) == (1.5, "host record", 1.04)
    monkeypatch.setattr(host_speed, "_calibration", lambda helpers=frozenset(): (1.2, 1.1, 3.0))  # faster than the record: its own
    assert HostSpeed.calibrated().alone_ms == 1.2
    monkeypatch.setattr(host_speed, "_calibration", lambda helpers=frozenset(): (2.5, 1.1, 3.0))
    monkeypatch.setattr(host_speed, "_host_key", lambda: "another boot")  # the record says nothing of it
    assert HostSpeed.calibrated().source == "this process"


def test_the_calibration_probes_for_as_long_as_a_take_and_says_who_else_ran():
    started = time.perf_counter()
    alone, noise, others = host_speed._calibration()
    assert time.perf_counter() - started >= host_speed.CALIBRATION_S
    assert 0.05 < alone < 50 and noise >= 1.0 and others >= 0.0


def _details(takes: list[Take], metric: str, noise: float | None = None):
    from types import SimpleNamespace

    rounds = RoundsRecord(
        group="g",
        entrant="fp32/onnxruntime",
        entrants=["fp32/onnxruntime"],
        takes=takes,
        rounds=len(takes),
        stop="alone",
        elapsed_s=1.0,
        take_ms=5,
        take_runs=1,
        min_rounds=3,
        budget_s=30,
        tie=0.03,
        seed=0,
        host_noise=noise,
    )
    return SimpleNamespace(rounds=[rounds], metric=metric)


def _takes(slowdowns, issue_ms=None, median_ms=10.0, others=2.0, throttled=0.0):
    return [
        Take(
            round=i,
            order=0,
            runs=5,
            median_ms=median_ms,
            issue_ms=issue_ms,
            host_slowdown=s,
            host_others_cpus=others,
            host_throttled=throttled,
        )
        for i, s in enumerate(slowdowns)
    ]


def test_a_row_whose_time_is_the_hosts_is_flagged_host_slowed_beyond_the_tie_band():
    slowed = host_slowed_flag(_details(_takes([1.0, 1.6, 1.7, 1.8, 1.6]), HOST_LATENCY))
    assert slowed.startswith("host slowed: its CPUs ran 1.60x slower than alone") and "worst 1.80x, 4 of 5 takes" in slowed
    assert "while other processes used 2.0 CPUs" in slowed
    assert host_slowed_flag(_details(_takes([1.0, 1.01, 1.02, 0.99, 1.6]), HOST_LATENCY)) is None  # one slow take
    # A GPU engine whose host issues a run in a tenth of its GPU time: the host can be 1.7x slower
    # and the GPU still never waits for it.
    assert host_slowed_flag(_details(_takes([1.7] * 5, issue_ms=1.0), "GPU time (CUDA events)")) is None
    # One whose host needs 80 % of it: its time follows the host's.
    assert host_slowed_flag(_details(_takes([1.7] * 5, issue_ms=8.0), "GPU time (CUDA events)")).startswith("host slowed")
    # Within a host's own noise: its CPUs come and go by 1.8x in spells alone.
    assert host_slowed_flag(_details(_takes([1.0, 1.6, 1.7, 1.8, 1.6]), HOST_LATENCY, noise=1.8)) is None
    assert "the host's own noise (1.20x)" in host_slowed_flag(_details(_takes([1.6] * 5), HOST_LATENCY, noise=1.2))
    # A manifest from before the host's speed was measured.
    assert host_slowed_flag(_details(_takes([None] * 5), HOST_LATENCY)) is None


def test_a_slowdown_with_nothing_beside_the_take_is_the_hosts_own_spell_and_not_flagged():
    # A 2-vCPU KVM guest of an AMD EPYC, idle: the probe runs 1.65x slower in spells, under 0.2 CPUs of others' work.
    assert host_slowed_flag(_details(_takes([1.0, 1.6, 1.7, 1.65, 1.6], others=0.16), HOST_LATENCY)) is None
    # Beside it for only two of five takes: the median take was not slowed by anyone.
    takes = _takes([1.0, 1.6, 1.7, 1.65, 1.6], others=0.1)
    takes[1].host_others_cpus = takes[2].host_others_cpus = 3.0
    assert host_slowed_flag(_details(takes, HOST_LATENCY)) is None
    takes[3].host_others_cpus = 3.0
    flag = host_slowed_flag(_details(takes, HOST_LATENCY))
    assert "3 of 5 takes" in flag and "worst 1.70x" in flag and "other processes used 3.0 CPUs" in flag
    # Held off by its cgroup's CPU quota with nothing else running: slowed.
    held = host_slowed_flag(_details(_takes([1.0, 9.0, 9.5, 10.0], others=0.0, throttled=0.9), HOST_LATENCY))
    assert "its cgroup's CPU quota held it off 90% of a take" in held and "other processes" not in held
    # A take recorded with its slowdown but before its evidence: taken as measured.
    assert host_slowed_flag(_details(_takes([1.6] * 5, others=None, throttled=None), HOST_LATENCY)).startswith("host slowed")


class _Engine:
    def __init__(self, timing: str, issue_ms: float | None = None):
        self.timing = timing
        self.issue_ms = issue_ms
        self.on_gpu = False  # no SM clock to read
        self.takes = 0

    def take(self, runs, min_ms):
        self.takes += 1
        return [1.0] * runs

    def evidence(self):
        return {}


SETTINGS = ProfileSettings(take_ms=1, take_runs=2, round_ms=0, min_rounds=3, budget_s=5)


def test_a_point_whose_engines_follow_the_host_holds_it_whole_from_its_first_round_on_a_free_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    engines = {"fp32/cpu": _Engine(HOST_LATENCY), "fp32/graphs": _Engine("GPU time (CUDA events)", issue_ms=0.05)}
    outcome = measure_in_rounds(engines, SETTINGS, seed=1)
    assert outcome.host_held == "whole" and outcome.rounds >= 3
    assert engines["fp32/cpu"].takes == outcome.rounds  # no round taken again: nothing else held the host
    assert [take.round for take in outcome.takes["fp32/cpu"]] == list(range(outcome.rounds))
    assert all(take.host_slowdown is not None for take in outcome.takes["fp32/cpu"])
    assert outcome.record("fp32/cpu").host_alone_probe_ms > 0


def test_a_point_whose_engines_are_all_gpu_bound_lets_go_to_shared_after_its_first_round(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    engines = {"a": _Engine("GPU time (CUDA events)", issue_ms=0.05), "b": _Engine("GPU time (CUDA events)", issue_ms=0.1)}
    outcome = measure_in_rounds(engines, SETTINGS, seed=1)
    assert outcome.host_held == "shared" and engines["a"].takes == outcome.rounds


def test_a_point_that_follows_the_host_waits_for_another_points_hold_and_takes_its_first_round_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    spawn = multiprocessing.get_context("spawn")
    ready, release = spawn.Event(), spawn.Event()
    other = spawn.Process(target=_hold, args=(tmp_path / "host-rounds.lock", "shared", ready, release))  # another GPU preparing
    other.start()
    try:
        assert ready.wait(60)
        releaser = spawn.Process(target=_release_after, args=(release, 1.0))
        releaser.start()
        said = []
        engines = {"fp32/cpu": _Engine(HOST_LATENCY), "fp32/graphs": _Engine("GPU time (CUDA events)", issue_ms=0.05)}
        outcome = measure_in_rounds(engines, SETTINGS, seed=1, progress=said.append)
        releaser.join()
    finally:
        release.set()
        other.join(30)
    assert outcome.host_held == "whole"
    assert engines["fp32/cpu"].takes == outcome.rounds + 1  # its first round, beside the other hold, taken again
    assert "waiting for another shape point's rounds on this host to end" in said


def _hold(path, mode, ready, release):
    with HostRounds(path) as held:
        held.take_whole() if mode == "whole" else held.share()
        ready.set()
        release.wait(30)


@pytest.mark.parametrize(("first", "second", "waits"), [("whole", "shared", True), ("shared", "whole", True), ("shared", "shared", False)])
def test_rounds_held_whole_wait_for_and_keep_out_every_other_points_rounds(tmp_path, first, second, waits):
    path = tmp_path / "host-rounds.lock"
    spawn = multiprocessing.get_context("spawn")
    ready, release = spawn.Event(), spawn.Event()
    other = spawn.Process(target=_hold, args=(path, first, ready, release))
    other.start()
    try:
        assert ready.wait(60)
        said = []
        with HostRounds(path, on_wait=said.append) as held:
            threading_release = spawn.Process(target=_release_after, args=(release, 0.5))
            threading_release.start()
            held.take_whole() if second == "whole" else held.share()
            assert held.mode == second
            threading_release.join()
        assert bool(said) is waits and (held.waited_s > 0.3) is waits
        if waits:
            assert said == ["waiting for another shape point's rounds on this host to end"]
    finally:
        release.set()
        other.join(30)


def _release_after(release, seconds):
    time.sleep(seconds)
    release.set()


def test_the_probe_leaves_out_the_time_a_quota_held_it_off_so_a_quota_counts_once(monkeypatch):
    throttled = [0]

    def burst():
        throttled[0] += 4_000_000  # each burst held off 4 ms of the 5 ms it took, on one CPU
        return 5.0

    monkeypatch.setattr(host_speed, "_burst_ms", burst)
    monkeypatch.setattr(host_speed, "_throttled_ns", lambda files: throttled[0])
    monkeypatch.setattr(host_speed, "_cpus", lambda: 1)
    assert host_speed.probe_ms([host_speed.Path("cpu.stat")]) == pytest.approx(1.0)
    assert host_speed.probe_ms([]) == pytest.approx(5.0)  # no cgroup to read: the wall clock's
