"""A run's engines prepared and checked for their points while it waits for its compilations
(pipeline/stages/point.py, prepare_points_ahead): only those prepared in this process with no work
ahead of their own, only the profiles that will measure, while there is room; a failure there left
to the point, a kernel fault recorded for its engine and raised."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.running.errors import DeviceFault, OutOfMemory
from pipeline.stages.point import prepare_points_ahead


class Runtime:
    def __init__(self, done: list, in_this_process: bool = True, builds_long: bool = False, fails=None):
        self.done, self.measures_in_this_process, self.builds_long, self.fails = done, in_this_process, builds_long, fails

    def prepare(self, engine_path, workload):
        if self.fails is not None:
            raise self.fails
        self.done.append(f"prepared {engine_path} at {workload}")
        return f"engine {engine_path}@{workload}"


class Stage:
    def __init__(self, runtime, toolchain: str, shape: str, current: bool = False, skipped: str | None = None):
        self.runtime, self.toolchain, self.shape = runtime, toolchain, shape
        self.current, self.skipped, self.ahead, self.recorded = current, skipped, None, None
        self.engine = SimpleNamespace(variant="bf16", name="m_bf16")
        self.settings = SimpleNamespace(host_cpus=None)
        self.ctx = SimpleNamespace(reporter=SimpleNamespace(step=lambda text: None, progress=runtime.done.append))
        self.progress_label = f"m_bf16 on {toolchain} at {shape}"

    def skip_reason(self):
        return self.skipped

    def kept_outcome(self):
        return False

    def is_current(self):
        return self.current

    def engine_file(self):
        return self.toolchain

    def workload(self):
        return self.shape

    def check_accuracy(self, engine_path, workload):
        self.runtime.done.append(f"checked {engine_path} at {workload}")
        return {"cosine_similarity": 1.0}

    def run(self, force=False, measured=None):
        self.recorded = (force, measured)


def test_the_engines_prepared_here_without_work_of_their_own_are_made_ready_for_their_points():
    done = []
    eager, compiled, tool = Runtime(done), Runtime(done, builds_long=True), Runtime(done, in_this_process=False)
    first = [Stage(eager, "torch-eager", "2x512"), Stage(compiled, "torch-compile", "2x512"), Stage(tool, "trt10.14", "2x512")]
    measured_again = [Stage(eager, "torch-eager", "4x512"), Stage(eager, "torch-cudagraphs", "4x512", current=True)]
    current = [Stage(eager, "torch-eager", "2x2048", current=True), Stage(eager, "torch-cudagraphs", "2x2048", current=True)]
    refused = [Stage(eager, "torch-eager", "4x2048", skipped="fp8 in PyTorch is fake quantization")]
    count = prepare_points_ahead([first, measured_again, current, refused], lambda: None)
    assert count == 3
    # Both engines of a point any of whose profiles measures again, in the point's order, each
    # checked right after it is prepared; nothing of a point all of whose profiles are current.
    assert done == [
        "prepared torch-eager at 2x512",
        "checked torch-eager at 2x512",
        "prepared torch-eager at 4x512",
        "checked torch-eager at 4x512",
        "prepared torch-cudagraphs at 4x512",
        "checked torch-cudagraphs at 4x512",
    ]
    engine, accuracy, cost = first[0].ahead
    assert engine == "engine torch-eager@2x512" and accuracy == {"cosine_similarity": 1.0} and set(cost) == {"prepare", "check"}
    assert first[1].ahead is None and first[2].ahead is None and current[0].ahead is None and refused[0].ahead is None


def test_preparing_ahead_stops_where_there_is_no_room_and_leaves_a_failure_to_its_point():
    done = []
    eager = Runtime(done)
    rooms = iter([None, None, "30.2 GiB of 140.0 GiB GPU memory free"])
    stages = [
        Stage(Runtime(done, fails=OutOfMemory("out of GPU memory at shape 4×4096.")), "torch-eager-attn", "4x4096"),
        Stage(eager, "torch-eager", "4x4096"),
        Stage(eager, "torch-cudagraphs", "4x4096"),
    ]
    assert prepare_points_ahead([stages], lambda: next(rooms)) == 1
    assert stages[0].ahead is None and stages[0].recorded is None  # its point prepares it again and records what it finds
    assert stages[1].ahead is not None and stages[2].ahead is None
    assert done[-1] == "engines left to their profiles from m_bf16 on torch-cudagraphs at 4x4096 on: 30.2 GiB of 140.0 GiB GPU memory free"
    assert "not prepared ahead: m_bf16 on torch-eager-attn at 4x4096: out of GPU memory at shape 4×4096." in done


def test_a_kernel_fault_while_preparing_ahead_is_recorded_for_its_engine_and_raised():
    done = []
    fault = DeviceFault("faulted on the GPU: an illegal memory access was encountered")
    faulting = Stage(Runtime(done, fails=fault), "torch-cudagraphs", "2x512")
    after = Stage(Runtime(done), "torch-eager", "4x512")
    with pytest.raises(DeviceFault):
        prepare_points_ahead([[faulting], [after]], lambda: None)
    assert faulting.recorded == (True, fault)  # its manifest says so; this process is then replaced
    assert after.ahead is None and done == []
