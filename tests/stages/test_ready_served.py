"""The engines their compiling processes serve are readied and checked before the first point, each
serving process's points in a thread of their own, side by side (pipeline/stages/point.py,
ready_served_ahead): what their points then find ready, what is left to its point, and a fault
recorded for its engine as at its point."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from pipeline.running.errors import DeviceFault, PipelineError
from pipeline.stages import point


class Runtime:
    def __init__(self, holders: dict):
        self.holders = holders

    def kept_elsewhere(self, engine_path, shape):
        return self.holders.get((engine_path, shape))


class Stage:
    def __init__(self, runtime, engine: str, shape: str):
        self.runtime, self.engine, self.shape, self.ahead = runtime, engine, shape, None
        self.progress_label, self.recorded = f"{engine} at {shape}", None
        self.ctx = SimpleNamespace(reporter=SimpleNamespace(progress=lambda text: None))

    def engine_file(self):
        return self.engine

    def skip_reason(self):
        return None

    def kept_outcome(self):
        return None

    def is_current(self):
        return False

    def run(self, force, measured):
        self.recorded = measured


def test_each_serving_processes_points_are_readied_side_by_side_and_the_rest_left_alone(monkeypatch):
    holders = {("a.pt", "2x8"): "process-0", ("a.pt", "4x8"): "process-0", ("b.pt", "2x8"): "process-1"}
    runtime = Runtime(holders)
    served = [Stage(runtime, "a.pt", "2x8"), Stage(runtime, "b.pt", "2x8"), Stage(runtime, "a.pt", "4x8")]
    here = Stage(runtime, "eager.pt", "2x8")  # prepared by this process: not this pass's
    both = threading.Barrier(2, timeout=10)  # the two processes' first points wait for each other
    threads = {}

    def readied(stage):
        threads.setdefault(stage.engine, set()).add(threading.current_thread().name)
        if stage.shape == "2x8":
            both.wait()  # a BrokenBarrierError (a test failure) unless they run side by side
        return ("engine", "accuracy", {"prepare": 0.1, "check": 0.1})

    monkeypatch.setattr(point, "_prepared_and_checked", readied)
    assert point.ready_served_ahead([[served[0], served[1], here], [served[2]]]) == 3
    assert all(stage.ahead == ("engine", "accuracy", {"prepare": 0.1, "check": 0.1}) for stage in served)
    assert here.ahead is None
    assert threads["a.pt"].isdisjoint(threads["b.pt"])  # one thread per serving process


def test_a_point_that_fails_is_left_to_its_point_and_a_fault_is_recorded_and_raised(monkeypatch):
    runtime = Runtime({("a.pt", "2x8"): "process-0", ("b.pt", "2x8"): "process-1"})
    refused, faulted = Stage(runtime, "a.pt", "2x8"), Stage(runtime, "b.pt", "2x8")
    fault = DeviceFault("faulted on the GPU in pipeline-compile-1: an illegal memory access was encountered")

    def readied(stage):
        raise PipelineError("out of room") if stage is refused else fault

    monkeypatch.setattr(point, "_prepared_and_checked", readied)
    with pytest.raises(DeviceFault):
        point.ready_served_ahead([[refused, faulted]])
    assert refused.ahead is None and refused.recorded is None  # its point tries again
    assert faulted.recorded is fault  # recorded for its engine, as at its point


def test_nothing_served_is_nothing_to_do():
    stage = Stage(Runtime({}), "a.pt", "2x8")
    assert point.ready_served_ahead([[stage]]) == 0 and stage.ahead is None
