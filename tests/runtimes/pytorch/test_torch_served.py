"""A compiled point served by the process that compiled it (pipeline/runtimes/pytorch/served.py): each
request answered there as the run's process would have answered it itself, its errors raised
here as they were raised there, and a process that is gone said once, in words, for every point it
held — and the torch runtime preparing the point itself instead, where one was gone before its
profile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.launchers.child import Child
from pipeline.running.errors import DeviceFault, OutOfMemory, PipelineError
from pipeline.runtimes.pytorch.served import ProcessGone, ServedPoint, ServingProcess, serve

KEY = ("/engines/torch-compile/.bert_fp32.pt.ahead", "2x8")


class FakeRuntime:
    """What serve asks of a torch runtime: to ready a point, and its outputs on a reference batch."""

    def ready(self, prepared):
        prepared.execution = {"backend": "compile", **prepared.facts}
        return prepared

    def reference_run(self, prepared, reference, name):
        return {"outputs": reference * 2, "name": name}

    def serve(self, prepared, streams, seconds, start_at=None):
        from pipeline.measuring.serving import THREADS, ServedRun

        return ServedRun(streams, THREADS, seconds, 3 * streams, [1.0] * 3 * streams, how=f"served by pid {os.getpid()}")


class FakePrepared:
    """A prepared point whose takes say where they ran, and which fails as told."""

    timing = "GPU time (CUDA events)"

    def __init__(self):
        self.facts, self.execution, self.issue_ms, self.warmed = {"compile_s": 12.5}, {}, None, 0

    def take(self, runs, min_ms):
        if min_ms == 13.0:
            raise OutOfMemory("out of GPU memory at shape 2×8.", facts={"memory": "GPU"})
        if min_ms == 66.0:
            raise DeviceFault("faulted on the GPU: an illegal memory access was encountered", facts={"error": "illegal"})
        if min_ms == 99.0:
            raise ZeroDivisionError("division by zero")
        if min_ms == 77.0:  # CUDA's words, as PyTorch raises them
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nCompile with `TORCH_USE_CUDA_DSA`")
        if min_ms == 0.0:
            os._exit(7)  # the process dies in the middle of a take
        self.issue_ms = 0.25
        return [float(cpu) for cpu in sorted(os.sched_getaffinity(0))] + [float(runs)]

    def warm(self):
        self.warmed += 1

    def evidence(self):
        return {"device": "torch compile on GPU", "execution": self.execution, "warmed": self.warmed}


def _serve_fakes(connection):
    serve(connection, {KEY: (FakeRuntime(), FakePrepared())}, "pipeline-compile-0")


@pytest.fixture
def served():
    """A real serving process holding one fake point: (the ServedPoint, its process)."""
    child = Child(_serve_fakes, name="pipeline-compile-0", requests=True, daemon=True).start()
    serving = ServingProcess(child, {child.pid})
    yield ServedPoint(serving, Path(KEY[0]), KEY[1], {"graphs": 1}), child.process
    serving.stop()
    child.stop(5)


def test_a_served_point_answers_as_the_process_that_holds_it(served):
    point, process = served
    engine = point.ready()
    assert engine.timing == "GPU time (CUDA events)" and engine.processes == frozenset({process.pid})
    # A take runs on the CPUs this process measures on, and its untimed run's issue time comes back.
    cpus = sorted(os.sched_getaffinity(0))
    pinned = cpus[-1:]
    os.sched_setaffinity(0, pinned)
    try:
        times = engine.take(3, 5.0)
    finally:
        os.sched_setaffinity(0, cpus)
    assert times == [float(pinned[0]), 3.0] and engine.issue_ms == 0.25
    assert engine.take(1, 5.0)[:-1] == [float(cpu) for cpu in cpus]  # and where it was before
    engine.warm()
    said = engine.evidence()
    # Its execution is what the process that holds it readied: who it is, and what compiling it found there.
    assert said["warmed"] == 1 and said["execution"]["compile_s"] == 12.5 and said["execution"]["prepared_ahead"] is True
    assert said["execution"]["served_by"] == {"process": "pipeline-compile-0", "pid": process.pid}
    # Its reference run, with the engine's own name (not the second name the compilation read it by).
    assert point.reference_run(21) == {"outputs": 42, "name": "bert_fp32.pt"}


def test_a_served_points_streams_are_served_by_the_process_that_holds_it(served):
    """torch.compile's graph is in the compiling process: the torch runtime asks it to serve the
    threads there (they were "not measured" before)."""
    from pipeline.runtimes.pytorch.runtime import TorchRuntime

    point, process = served
    engine = point.ready()
    run = TorchRuntime.serve(object(), engine, 2, 0.5)  # the runtime's own state is not read for a served point
    assert (run.streams, run.completed, run.span_s, run.why_not) == (2, 6, 0.5, None)
    assert run.how == f"served by pid {process.pid}"


def test_a_served_points_errors_are_raised_here_as_they_were_there(served):
    point, process = served
    engine = point.ready()
    with pytest.raises(OutOfMemory) as ran_out:
        engine.take(1, 13.0)
    assert ran_out.value.facts == {"memory": "GPU"}  # a result of the point, with its facts
    with pytest.raises(PipelineError, match=r"ZeroDivisionError in pipeline-compile-0: division by zero"):
        engine.take(1, 99.0)
    assert engine.take(1, 5.0)  # the process serves on after each
    with pytest.raises(DeviceFault) as fault:
        engine.take(1, 66.0)
    assert "illegal memory access" in fault.value.message and fault.value.facts == {"error": "illegal"}
    # A kernel fault is the last thing it answers: its CUDA context is gone, so it ends, and what
    # it kept is asked of it no more (the run's process prepares it instead).
    process.join(10)
    assert process.exitcode == 0 and not point.alive()
    with pytest.raises(ProcessGone, match=r"pipeline-compile-0, which compiled and kept it, faulted on the GPU"):
        point.ready()


def test_a_served_points_error_in_cudas_fault_words_is_a_fault_and_ends_its_process(served):
    point, process = served
    engine = point.ready()
    with pytest.raises(DeviceFault) as fault:
        engine.take(1, 77.0)
    assert fault.value.message == "faulted on the GPU in pipeline-compile-0: CUDA error: an illegal memory access was encountered"
    assert fault.value.facts["error"] == "CUDA error: an illegal memory access was encountered"
    process.join(10)
    assert process.exitcode == 0 and not point.alive()


def test_a_process_gone_is_said_once_in_words_for_every_point_it_held(served):
    point, process = served
    engine = point.ready()
    with pytest.raises(ProcessGone, match=r"pipeline-compile-0, which compiled and kept it, ended \(exit status 7\)"):
        engine.take(1, 0.0)
    assert not point.alive()
    with pytest.raises(ProcessGone, match="exit status 7"):  # said again at once, without asking a dead pipe
        point.ready()


def test_a_point_whose_process_is_gone_is_prepared_here(tmp_path, monkeypatch):
    """The torch runtime of the run's process, handed a served point whose process has gone by its
    profile, says so and prepares the point itself, as it would have without one."""
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime, spec_class
    from pipeline.runtimes.pytorch import runtime as pytorch

    class Gone:
        shape, facts = "2x8", {"graph_breaks": 0}

        def ready(self):
            raise ProcessGone("pipeline-compile-1, which compiled and kept it, ended (exit status -9)")

    warned = []
    reporter = Reporter()
    monkeypatch.setattr(reporter, "warn", warned.append)
    spec = spec_class("torch").model_validate({"kind": "torch", "backend": "compile"})
    runtime = create_runtime("torch-compile", spec, reporter, tmp_path)
    engine = tmp_path / "m.pt"
    engine.write_bytes(b"weights")
    point = type("Point", (), {"shape": "2x8"})()
    assert runtime.prepare_ahead(engine, point, Gone()) is None
    prepared_here = []
    monkeypatch.setattr(pytorch.TorchRuntime, "load", lambda self, path, workload: prepared_here.append(workload.shape) or "loaded")
    monkeypatch.setattr(pytorch.TorchRuntime, "ready", lambda self, prepared: f"{prepared}, ready")
    assert runtime.prepare(engine, point) == "loaded, ready" and prepared_here == ["2x8"]
    assert warned == ["m.pt at 2x8: pipeline-compile-1, which compiled and kept it, ended (exit status -9); preparing it in this process"]
    assert runtime.prepare(engine, point) == "loaded, ready" and len(warned) == 1  # forgotten once gone
