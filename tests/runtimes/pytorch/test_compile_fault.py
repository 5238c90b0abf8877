"""A kernel that faults in a process compiling points ahead of the profiles (pipeline/runtimes/
pytorch/compile_ahead.py), or serving the points it kept to them (pytorch/served.py): CUDA's context is
gone for good in that process, so it stops there — it compiles nothing more and serves nothing it
kept — the faulted point is recorded as faulted for its engine, as a fault in the run's own process
is, the points it had kept are prepared by the run's process, and the run goes on.

On the CPU, the fault planted as the other fault tests plant theirs: a module that raises CUDA's
words for a device-side assert (tests/data/python_models/faulting_compiled.py), here only in the
compiling processes."""

from __future__ import annotations

import multiprocessing
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.manifest import read_manifest
from pipeline.running.errors import DeviceFault
from tests.conftest import DATA, catalog_head, write_catalog
from tests.runtimes.pytorch.test_pytorch_runtime import needs_inductor

DEVICE_SIDE_ASSERT = "CUDA error: device-side assert triggered"
SHAPES = ["1x16", "2x16", "4x16", "4x64"]
CATALOG = (
    catalog_head(["faulty"], ["fp32"])
    + f"""
[models.faulty]
python = "models-in/faulting_compiled.py:make"
config = {{ features = 8, longest = 32 }}
shapes = {SHAPES}

[variants.fp32]
precision = "fp32"

[toolchains.onnxruntime]
kind = "onnxruntime"

[toolchains.torch-eager]
kind = "torch"
backend = "eager"

[toolchains.torch-compile]
kind = "torch"
backend = "compile"
"""
)


class FakePrepared:
    def __init__(self, shape: str):
        self.facts = {"compile_s": 1.0, "graphs": 1, "shape": shape}


class FakeRuntime:
    """A compiled toolchain whose kernel faults at 4x64 (CUDA's words in a RuntimeError, as PyTorch
    raises them), every point's preparation recorded."""

    def __init__(self):
        self.loaded: list[str] = []

    def load(self, engine_path, workload):
        self.loaded.append(workload.shape)
        if workload.shape == "4x64":
            raise RuntimeError(f"{DEVICE_SIDE_ASSERT}\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")
        return FakePrepared(workload.shape)


def _job(shape: str):
    from pipeline.runtimes.pytorch.compile_ahead import CompileJob

    return CompileJob("torch-compile", None, Path("/tmp"), Path("/engines/.m_fp32.pt.ahead"), SimpleNamespace(shape=shape))


def test_a_compiling_process_whose_kernel_faults_compiles_and_serves_nothing_more(monkeypatch):
    """The process compiles 1x16 and keeps it, then faults at 4x64: it says so for that point (the
    fault in CUDA's words, in that process), asks for nothing more and ends there — 2x16, not yet
    handed out, is left to the other processes, and 1x16, kept, is not served from a context that
    is gone."""
    import pipeline.runtimes
    from pipeline.runtimes.pytorch import compile_ahead

    runtime = FakeRuntime()
    monkeypatch.setattr(pipeline.runtimes, "create_runtime", lambda *args: runtime)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # the function sets it: restored after
    ours, theirs = multiprocessing.Pipe()
    compiling = threading.Thread(target=compile_ahead._compile_points, args=(theirs, 1, 0, (time.time(), time.time())), daemon=True)
    compiling.start()
    reported = []
    for shape in ("1x16", "4x64", "2x16"):  # each handed over once the last is reported, as the handout does
        ours.send(_job(shape))
        if not ours.poll(10):
            break
        reported.append((shape, ours.recv()))
        if not reported[-1][1][1]:  # it takes nothing more
            break
    compiling.join(10)
    ended = not compiling.is_alive()
    if not ended:  # serving what it kept: told to stop, so that the test ends
        ours.send(None)
        compiling.join(10)
    assert [(shape, keeps, more) for shape, ((_, _, keeps), more) in reported] == [("1x16", True, True), ("4x64", False, False)], reported
    faulted = reported[1][1][0][0]
    assert faulted["faulted"]["error"] == DEVICE_SIDE_ASSERT and "MainProcess" in faulted["faulted"]["during"], faulted
    assert faulted["error"].startswith("faulted on the GPU") and DEVICE_SIDE_ASSERT in faulted["error"], faulted
    assert runtime.loaded == ["1x16", "4x64"]  # nothing compiled after the fault: 2x16 stays with the others
    assert ended  # and nothing served: it ended, its kept point with it


def test_the_points_a_process_kept_before_it_faulted_are_handed_over_to_be_prepared_by_the_run():
    """Once every point is compiled, each kept point is handed over to be served by the process that
    kept it; one whose process faulted since (and ended) is handed over as a point not kept, which
    the run's process prepares itself."""
    from pipeline.runtimes.pytorch.compile_ahead import _hand_over_kept
    from pipeline.runtimes.pytorch.served import ProcessGone, ServedPoint, ServingProcess

    class Child:
        name, pid = "pipeline-compile-1", 1234

        def alive(self):
            return True

    healthy, faulted = ServingProcess(Child(), set()), ServingProcess(Child(), set())
    faulted.faulted()
    kept = [
        ("work", shape, ServedPoint(process, Path("/engines/.m_fp32.pt.ahead"), shape, {}))
        for process, shape in ((healthy, "1x16"), (faulted, "2x16"))
    ]
    handed = []
    served, _ = _hand_over_kept(kept, lambda work, job, point: handed.append((job, point)))
    assert served == 1 and handed == [("1x16", kept[0][2]), ("2x16", None)]
    with pytest.raises(ProcessGone, match=r"pipeline-compile-1, which compiled and kept it, faulted on the GPU"):
        kept[1][2].ready()  # nothing is asked of it


@needs_inductor
def test_a_run_records_a_fault_in_a_compiling_process_and_prepares_what_that_process_kept(tmp_path, run_cli, monkeypatch):
    """Four points of one compiled engine in two compiling processes; whichever compiles 4x64
    faults there, and from then on every call in it fails (a sticky error). 4x64 is recorded as
    faulted for the engine, in the compiling process's words, and the run goes on (in a fresh
    process, as after any fault); every other point is measured, none of them by the process that
    faulted: what it kept before the fault is prepared by the run's process instead."""
    from pipeline.runtimes.pytorch import compile_ahead

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)  # two processes
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / "faulting_compiled.py", tmp_path / "models-in")
    catalog = write_catalog(tmp_path, CATALOG)
    result = run_cli(catalog, "run", "--model", "faulty", "--toolchain", "torch-compile")
    assert result.exit_code == 1, result.err  # the fault named, in the fresh process that went on
    assert "Traceback" not in result.err
    assert "faulted on the GPU" in result.err and "compiling it ahead in pipeline-compile-" in result.err, result.err
    manifests = tmp_path / "manifests" / "torch-compile"
    ahead = read_manifest(manifests / "faulty_fp32.json").build.details.compiler["compiled_ahead"]
    assert ahead["points"]["4x64"]["faulted"]["error"] == DEVICE_SIDE_ASSERT, ahead
    faulted = read_manifest(manifests / "faulty_fp32@4x64.json").profile
    assert faulted.status == "faulted" and faulted.fault.error == DEVICE_SIDE_ASSERT, faulted
    where = faulted.fault.during.rsplit(" ", 1)[-1]  # the compiling process it faulted in
    assert where.startswith("pipeline-compile-"), faulted.fault
    for shape in SHAPES[:-1]:
        profile = read_manifest(manifests / f"faulty_fp32@{shape}.json").profile
        assert profile.status == "done", (shape, profile.reason)
        served_by = profile.details.execution.get("served_by", {}).get("process")
        assert served_by != where, (shape, profile.details.execution)  # served by the other process, or prepared here
        assert f"in {where}" not in profile.details.accuracy["checked_by"], profile.details.accuracy


def test_a_faulted_point_handed_over_raises_its_fault_at_its_profile():
    """What the run's process is handed for a point whose compilation ahead faulted: its profile's
    preparation raises the fault, recorded for that engine as one of the run's own would be."""
    from pipeline.runtimes.pytorch.served import FaultedPoint

    point = FaultedPoint("4x64", {"error": DEVICE_SIDE_ASSERT, "during": "at shape 4×64, compiling it ahead in pipeline-compile-1"})
    assert not point.alive() and point.shape == "4x64" and point.facts == {}
    for ask in (point.ready, lambda: point.reference_run(None)):  # each time it is asked, a fault of its own
        with pytest.raises(DeviceFault, match="4×64") as raised:
            ask()
        assert raised.value.facts == {"error": DEVICE_SIDE_ASSERT, "during": "at shape 4×64, compiling it ahead in pipeline-compile-1"}
        assert raised.value.message == f"faulted on the GPU at shape 4×64, compiling it ahead in pipeline-compile-1: {DEVICE_SIDE_ASSERT}"


def test_a_compiling_process_shares_the_cpus_out_on_a_gpu_and_keeps_them_all_on_a_cpu(monkeypatch):
    """On a GPU, each compiling process's PyTorch threads are its share of the CPUs; on a CPU, where
    what it keeps is timed there, PyTorch keeps its own count."""
    import torch

    from pipeline.runtimes.pytorch import compile_process

    own = torch.get_num_threads()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        compile_process.share_cpus(1)
        assert torch.get_num_threads() == own
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        compile_process.share_cpus(1)
        assert torch.get_num_threads() == 1
        compile_process.share_cpus(0)  # never none
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(own)


@pytest.fixture(autouse=True)
def _inductor_threads_restored():
    """_compile_points sets Inductor's compile_threads in the process it runs in: restored after."""
    from torch._inductor import config

    kept = config.compile_threads
    yield
    config.compile_threads = kept


@pytest.mark.parametrize("unusable", ["no GPU", "a bad fork"])
def test_a_compiling_process_without_the_runs_gpu_compiles_nothing(monkeypatch, tmp_path, unusable):
    """Where the run's process has a GPU and a compiling process finds none usable — none there, or
    forked from a process that had initialised CUDA (PyTorch then refuses it there) — every point it
    is handed is left to its profile with why: never compiled on the CPU, to be timed as the GPU's."""
    import torch

    import pipeline.runtimes
    from pipeline.runtimes.pytorch import compile_ahead

    runtime = FakeRuntime()
    monkeypatch.setattr(pipeline.runtimes, "create_runtime", lambda *args: runtime)
    if unusable == "no GPU":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    else:  # as on the lent H100: the device count answers, and the first compilation fails
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # What it saves for `pipeline cache export` once handed no more (this process's records) goes here.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    ours, theirs = multiprocessing.Pipe()
    clocks = (time.time(), time.time())
    compiling = threading.Thread(target=compile_ahead._compile_points, args=(theirs, 1, 0, clocks, True), daemon=True)
    compiling.start()
    reported = []
    for shape in ("1x16", "2x16"):
        ours.send(_job(shape))
        assert ours.poll(10)
        reported.append(ours.recv())
    ours.send(None)  # no more points
    ours.send(None)  # and it serves nothing: told to stop, so that the test ends
    compiling.join(10)
    assert not compiling.is_alive() and runtime.loaded == []
    for (outcome, _, keeps), more in reported:
        assert not keeps and more and "CUDA is not usable in the compiling process" in outcome["error"], outcome
    assert "start_s" in reported[0][0][0] and "start_s" not in reported[1][0][0]  # its first point says how it started


def test_whether_a_process_forked_from_the_compiling_server_can_use_cuda_is_asked_of_one(monkeypatch):
    """The compiling processes are forked from a server that imported torch first, unless a process
    forked from it says CUDA is unusable there (an import initialised CUDA's driver before the fork):
    then each is a new interpreter. Here (no CUDA) a forked process can, and says so; one in a bad
    fork says why."""
    import torch

    from pipeline.runtimes.pytorch import compile_process

    monkeypatch.setattr(compile_process, "_not_forked", None)
    assert compile_process.forking_usable() is None
    assert compile_process._not_forked == ""  # asked once
    ours, theirs = multiprocessing.Pipe()
    compile_process._cuda_after_fork(theirs, True)  # where the run has a GPU, this process finds none
    assert ours.recv().result() == "torch.cuda finds no GPU"
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    compile_process._cuda_after_fork(theirs, False)
    assert ours.recv().result() == "torch.cuda reports a bad fork"


def test_compiling_processes_start_on_a_thread_of_their_own_and_its_failure_is_said_where_waited_for(monkeypatch):
    """Asking for compiling processes returns at once, however long each takes to start (a forked
    one waits for its server's imports); waiting for them returns once each asked for is started,
    forked or not as a first forked process said; what went wrong starting one is raised there."""
    from pipeline.runtimes.pytorch import compile_process

    monkeypatch.setattr(compile_process, "forking_usable", lambda gpu=False: None)
    release, started = threading.Event(), []

    def start(index, preload):
        assert release.wait(10)
        started.append((index, preload))

    starting = compile_process.Starting(start)
    began = time.perf_counter()
    starting.want(2)
    starting.want(1)  # never fewer than asked before
    assert time.perf_counter() - began < 1 and started == []
    release.set()
    starting.wait()
    assert started == [(0, compile_process.PRELOAD), (1, compile_process.PRELOAD)] and starting.not_forked == ""
    starting.want(3)
    starting.wait()
    assert [index for index, _ in started] == [0, 1, 2]

    monkeypatch.setattr(compile_process, "forking_usable", lambda gpu=False: "told so")
    spawned = []
    failing = compile_process.Starting(lambda index, preload: spawned.append(preload) if index == 0 else 1 / 0)
    failing.want(2)
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    assert spawned == [()] and failing.not_forked == "told so"  # each a new interpreter
    failing.want(4)  # none more after a failure
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    assert spawned == [()]
    stopped = compile_process.Starting(lambda index, preload: pytest.fail("started after stop"))
    stopped.stop(1)
    stopped.want(1)
    stopped.wait()


def test_a_compiling_process_that_cannot_start_ends_those_started_where_the_run_waits_for_them(monkeypatch, tmp_path):
    """The second compiling process fails to start (the server gone, say): the run, waiting for the
    compilations, is told so, and the first process ends then — not after the profiles, compiling
    and holding memory beside their measurements."""
    from pipeline.runtimes.pytorch import compile_ahead, compile_process

    monkeypatch.setattr(compile_process, "forking_usable", lambda gpu=False: None)
    started: list = []

    class Started:
        def __init__(self, index):
            self.index, self.stopped = index, False

        def stop(self, grace_s=0):
            self.stopped = True

    pool = compile_ahead.CompilePool()

    def start_child(index, preload):
        if index:
            raise OSError("the server is gone")
        started.append(Started(index))
        pool._children.append(started[-1])

    pool._starting = compile_process.Starting(start_child)
    pool._works.append(object())
    pool._starting.want(2)
    closed = []
    monkeypatch.setattr(pool, "close", lambda: closed.append(True))
    with pytest.raises(OSError, match="the server is gone"):
        pool.finish(lambda words: None)
    assert closed == [True] and [child.index for child in started] == [0]
