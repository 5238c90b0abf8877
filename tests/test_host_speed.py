"""The host's speed around each take (pipeline/host_speed.py), the flag a slowed row earns
(pipeline/report/flags.py), and how a point's rounds hold the host (pipeline/host_rounds.py)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from pipeline import host_speed
from pipeline.catalog import ProfileSettings
from pipeline.host_rounds import HostRounds
from pipeline.host_speed import HostSpeed
from pipeline.measurement import HOST_LATENCY, RoundsRecord, Take, measure_in_rounds
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
    monkeypatch.setattr(host_speed, "probe_ms", lambda: next(probes))
    monkeypatch.setattr(host_speed, "_throttled_ns", lambda files: 0)
    host = HostSpeed(alone_ms=2.0, source="this process")
    host.before_take()
    assert host.after_take() == pytest.approx(1.0)  # probes 2.0 either side, nothing throttled
    host.before_take()
    assert host.after_take() == pytest.approx(1.25)  # probes 2.0 and 3.0: CPUs 1.25x slower

    clock = iter([0, 100_000_000])
    monkeypatch.setattr(host_speed, "_throttled_ns", lambda files: next(clock))
    monkeypatch.setattr(host_speed, "_cpus", lambda: 1)
    monkeypatch.setattr(host_speed, "probe_ms", lambda: 2.0)
    host = HostSpeed(alone_ms=2.0, source="this process")
    host.before_take()
    time.sleep(0.2)  # throttled 0.1 s of about 0.2: held off half the take
    assert 1.7 < host.after_take() < 2.05


def test_alone_is_this_process_calibration_unless_others_used_the_cpus_and_the_host_was_faster_idle(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(host_speed, "_calibration", lambda: (1.5, 1.04, 0.1))  # the host otherwise idle
    first = HostSpeed.calibrated()
    assert (first.alone_ms, first.source, first.noise) == (1.5, "this process", 1.04)
    monkeypatch.setattr(host_speed, "_calibration", lambda: (2.5, 1.1, 3.0))  # beside another GPU's compiling
    later = HostSpeed.calibrated()
    assert (later.alone_ms, later.source, later.noise) == (1.5, "host record", 1.04)
    monkeypatch.setattr(host_speed, "_calibration", lambda: (1.2, 1.1, 3.0))  # faster than the record: its own
    assert HostSpeed.calibrated().alone_ms == 1.2
    monkeypatch.setattr(host_speed, "_calibration", lambda: (2.5, 1.1, 3.0))
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


def _takes(slowdowns, issue_ms=None, median_ms=10.0):
    return [Take(round=i, order=0, runs=5, median_ms=median_ms, issue_ms=issue_ms, host_slowdown=s) for i, s in enumerate(slowdowns)]


def test_a_row_whose_time_is_the_hosts_is_flagged_host_slowed_beyond_the_tie_band():
    slowed = host_slowed_flag(_details(_takes([1.0, 1.6, 1.7, 1.8, 1.6]), HOST_LATENCY))
    assert slowed.startswith("host slowed: its CPUs ran 1.60x slower than alone") and "worst 1.80x" in slowed
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


SETTINGS = ProfileSettings(take_ms=1, take_runs=2, min_rounds=3, budget_s=5)


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
