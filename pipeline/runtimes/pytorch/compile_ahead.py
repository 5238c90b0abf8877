"""torch.compile at every shape point of every compiled engine of a run, side by side in processes
of their own, ahead of the profiles (a build asked for alone compiles its first point itself).

A compiled toolchain specialises its graph to each shape point (``dynamic = false``), and Inductor
takes about half a minute to compile ModernBERT-base at one point in one dtype: most of a sweep's
time when the points are compiled one after another as they are profiled. Compiling is mostly
single-threaded Python, so each engine's points are compiled as soon as its engine file is
written (pipeline/stages/build.py, _EarlyWork), in a few processes beside the builds still to
come, and the results left in Inductor's on-disk caches (FXGraphCache, AOTAutogradCache). Those
caches "avoid recompilation across process boundaries when it encounters the same graph with the
same Tensor input shapes (and the same configuration)" (PyTorch's Compile Time Caching
Configuration recipe,
docs.pytorch.org/tutorials/recipes/torch_compile_caching_configuration_tutorial.html). A point
is then compiled again by tracing with Dynamo and finding the rest there: in a run, by the run's
own process as each point comes back, while it waits (``finish``'s ``done``,
TorchRuntime.prepare_ahead); else by the point's profile. Its manifest's ``inductor_cache_hits``
says it did. Each process prepares exactly as the profile will (same inputs, same settings),
which is what makes the graphs the same. Starting a process (a new interpreter, torch, the model,
a CUDA context) costs about a minute, so all the engines' points share one set of
processes rather than each engine starting its own; the run waits for them before its first
profile, so nothing compiles while anything is measured.

A point that fails here (out of memory, a refusal) is left to its profile, which records the
reason for that point as it always did; nothing here decides anything about the engine. But a
kernel that faults leaves the process's CUDA context unusable for good (pipeline/running/faults.py):
the process says so for that point and ends, compiling and serving nothing more; the point's
profile records the fault (served.FaultedPoint) as the run's own process records one, and
the points that process kept are prepared by the run's process as points not kept are. A
process that dies outright (the kernel's OOM killer, a signal) says nothing: the point it had
been handed (launchers/handout.py) is recorded with how it ended and left to its profile, which
prepares it in the run's process; what it kept is prepared there too, and the other processes
compile the points not yet handed out. The wait ends as soon as they have, never on the dead.

In a run, each process keeps the points it compiled, ready, and once every point is compiled
serves them to the point's profile (pipeline/runtimes/pytorch/served.py): the run's process then
traces none of them. A process keeps a point only while AHEAD_FREE_GPU of the GPU's memory stays
free; a point not kept is prepared by the run's process, as it was before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.launchers.child import Child, ended_words, this_process_name
from pipeline.launchers.handout import Handout, Owed, report_job, take_job
from pipeline.running.errors import DeviceFault, PipelineError
from pipeline.running.faults import as_fault, fault_words
from pipeline.runtimes.base import AheadPool, too_little_to_keep
from pipeline.runtimes.pytorch.compile_process import TIMELINE, Starting, share_cpus, timeline
from pipeline.runtimes.pytorch.compile_sizing import MAX_PROCESSES, compile_threads, processes_for, usable_cpus
from pipeline.runtimes.pytorch.compile_sizing import gpu_free_bytes as _gpu_free_bytes
from pipeline.runtimes.pytorch.compile_sizing import host_free_bytes as _host_free_bytes
from pipeline.runtimes.pytorch.served import FaultedPoint, ServedPoint, ServingProcess, serve

# Seconds a compiling process has to end after an interruption before it is killed.
STOP_GRACE_S = 5
# What the build manifest keeps of each point's compilation (compiled_ahead.points).
POINT_FACTS = ("compile_s", "graphs", "graph_breaks", "inductor_cache_hits", "threads")


def graph_key(job: CompileJob) -> tuple | None:
    """What makes two jobs compile the same graph: the same engine (its file's name and size under
    each toolchain's folder), point and inputs, and the same toolchain settings but ``capture``
    (torch-compile and torch-reduce-overhead); None for a job whose graph is its own (a mode that
    captures CUDA graphs itself, or a dynamic compilation)."""
    spec = job.spec
    if getattr(spec, "backend", None) != "compile" or spec.dynamic or spec.mode in ("reduce-overhead", "max-autotune"):
        return None
    settings = spec.model_dump(exclude={"capture", "baselines", "source"})
    inputs = tuple(str(getattr(tensor, "path", "")) for tensor in job.workload.inputs)
    return (job.engine_path.name, job.engine_path.stat().st_size, job.workload.shape, inputs, repr(sorted(settings.items())))


@dataclass(frozen=True)
class CompileJob:
    """One engine compiled at one shape point: what a compiling process needs to prepare it as its
    profile will."""

    toolchain: str
    spec: Any  # the toolchain's ToolchainSpec
    workspace_root: Path
    engine_path: Path
    workload: Any  # the point's ReferenceBatch


class CompilePool(AheadPool):
    """Processes that compile shape points as the builds hand them over: each is handed one point
    at a time (launchers/handout.py), keeps the last model it read, and reports what each
    compilation took. A process starts when there is a point for it, up to one for each graph to
    compile where the machine allows (compile_sizing.py: its CPUs, host and GPU memory), so that
    they are compiled in one wave; all of them start once and stay until ``finish``, so the
    points of every compiled engine of a run share one set of processes, and their compiling
    overlaps the builds still to come. A process that ends before it reports the
    point it was handed (killed by the kernel's OOM killer, or by a signal) leaves that point to
    its profile, recorded with how the process ended; the others compile the points still to be
    handed out."""

    def __init__(self):
        self._handout = Handout()
        self._children: list[Child] = []
        # Each process as the points it kept are asked of it, once every point is compiled.
        self._serving: list[ServingProcess] = []
        self._pids: set[int] = set()
        self._works: list = []
        self._limit = 0
        self._machine: tuple | None = None  # (CPUs, free GPU and host memory) when the first work came
        self._largest = 0  # the largest engine file handed over
        self._expected: int | None = None  # the jobs the run said it may hand over (expect)
        self._threads = 1
        self._starting = Starting(self._start_child)  # the processes, started on a thread of their own
        self._closing = False
        self._started = 0.0
        self._started_at = 0.0  # the same instant on the wall clock, which the processes share
        self._reported = False
        self._points: dict[tuple[str, str], dict[str, Any]] = {}  # what became of each point (said)
        # By graph (graph_key): the job that compiles it, and the (work, job) pairs that share its
        # compiled graph instead of compiling it again.
        self._leaders: dict[tuple, CompileJob] = {}
        self._followers: dict[tuple, list] = {}
        self._keys: dict[tuple[str, str], tuple | None] = {}  # each job's graph_key, taken while its file is there

    def expect(self, jobs: int) -> None:
        self._expected = jobs

    def submit(self, work) -> bool:
        self._largest = max([self._largest, *(job.engine_path.stat().st_size for job in work.jobs)])
        if self._machine is None:  # the machine as the first work finds it, before any process holds any of it
            self._machine = (usable_cpus(), _gpu_free_bytes(), _host_free_bytes())
            self._starting.gpu = self._machine[1] is not None  # CUDA must be usable in the processes
            self._started, self._started_at = time.perf_counter(), time.time()
        # The most processes the machine allows (compile_sizing.py), for the largest model so far.
        self._limit = processes_for(MAX_PROCESSES, *self._machine, self._largest)
        if not self._works:  # each process's kernel-compiling workers: the CPUs shared out among those planned
            self._threads = compile_threads(self._machine[0], min(self._limit, self._expected or self._limit))
        self._works.append(work)
        if self._limit < 2 and not self._starting.wanted:
            return False  # finish says why nothing was compiled
        for job in work.jobs:
            key = self._keys[(str(job.engine_path), job.workload.shape)] = graph_key(job)
            if key is not None and key in self._leaders:
                self._followers.setdefault(key, []).append((work, job))
                continue
            if key is not None:
                self._leaders[key] = job
            self._handout.add(job)
        queued = sum(len(w.jobs) for w in self._works) - sum(len(f) for f in self._followers.values())
        self._starting.want(min(self._limit, queued))
        return True

    def _start_child(self, index: int, preload: tuple[str, ...]) -> None:
        """Compiling process ``index``, started (on Starting's thread) and handed points."""
        child = Child(
            _compile_points,
            self._threads,
            index,
            (self._started_at, time.time()),
            self._machine[1] is not None,
            name=f"pipeline-compile-{index}",
            requests=True,
            daemon=True,
            preload=preload,
        ).start()
        if self._closing:  # closed while it started (its start waits for the server's imports)
            child.stop(STOP_GRACE_S)
            return
        self._children.append(child)
        self._serving.append(ServingProcess(child, self._pids))
        self._pids.add(child.pid)
        self._handout.add_child(child)

    def finish(self, progress: Callable[[str], None], done: Callable | None = None) -> tuple[list[dict[str, Any]], str | None]:
        if not self._works:
            return [], None
        try:
            self._starting.wait()
        except BaseException:  # a process that could not start: those that did end now, not after the profiles
            self.close()
            raise
        if not self._children:
            why = "too few CPUs or too little free host or GPU memory to compile the points side by side; each profile compiles its own"
            return [{"compiler": {"compiled_ahead": {"skipped": why}}} for _ in self._works], why
        jobs = [job for work in self._works for job in work.jobs]
        self._handout.last()  # each process told so once no point is left for it
        progress(f"compiling {len(jobs)} shape points in {len(self._children)} processes")
        heard = _Heard(self, len(jobs), progress, done)
        kept = 0
        try:
            for event in self._handout.reports():
                heard.add(event)
            kept, seconds = _hand_over_kept(heard.to_serve, done)
            heard.preparing += seconds
            self._reported = True
        finally:
            if not kept:  # nothing to serve: the processes end now (close again is harmless)
                self.close()
        # Points no process took: every one that could have ended first.
        ended = ", ".join(sorted({ended_words(child.exitcode) for child in self._children if child.ended()}))
        for job in jobs:
            heard.outcomes.setdefault(
                (str(job.engine_path), job.workload.shape),
                {"error": f"the compiling processes ended ({ended}) before compiling it"},
            )
        facts = {
            "processes": len(self._children),
            "compile_threads": self._threads,
            # Forked from the server that imported what they need (compile_process.py), or each a
            # new interpreter, and why.
            "forked": not self._starting.not_forked,
            **({"not_forked_why": self._starting.not_forked} if self._starting.not_forked else {}),
            # From the first point handed over: to the last one compiled, and to the end of the
            # wait (this process preparing the points as they came back, done then or not).
            "compiled_s": round(heard.last_compiled - self._started_at, 3),
            "wall_s": round(time.perf_counter() - self._started, 3),
            "prepared_here_s": round(heard.preparing, 3),
            # Points their compiling process kept and serves to their profiles (pytorch/served.py).
            "served": kept,
            "engines": len(self._works),
        }
        self._points = outcomes = heard.outcomes
        evidence = []
        for work in self._works:
            points = {job.workload.shape: outcomes[(str(job.engine_path), job.workload.shape)] for job in work.jobs}
            evidence.append({"compiler": {"compiled_ahead": {**facts, "points": points}}})
        return evidence, None

    def said(self) -> str:
        """ "12 shape points compiled, 10 of them found in the cache; 12 more shared their graphs"."""
        points = self._points.values()
        compiled = [point for point in points if "compile_s" in point and "shares_graph_of" not in point]
        if not compiled:
            return ""
        hits = sum(1 for point in compiled if point.get("inductor_cache_hits"))
        shared = sum(1 for point in points if "shares_graph_of" in point)
        said = f"{len(compiled)} shape point{'s' if len(compiled) != 1 else ''} compiled, {hits} of them found in the cache"
        return said + (f"; {shared} more shared their graphs" if shared else "")

    def close(self) -> None:
        # Told to stop and every point reported: the processes are ending on their own once they
        # are told to stop serving. Otherwise (an interruption) whatever they are compiling is of
        # no use: stop them now.
        self._closing = True
        self._starting.stop(STOP_GRACE_S)
        self._handout.close()
        for serving in self._serving:
            serving.stop()
        grace = STOP_GRACE_S if self._reported else 0
        for child in self._children:
            child.join(grace)
            child.stop(STOP_GRACE_S)


class _Heard:
    """What ``CompilePool.finish`` has heard of the points so far, and what it did with each: the
    point's outcome, the graphs shared from it, and the point handed to its profile — served by
    the process that kept it (once every point is compiled: ``to_serve``), prepared here, or its
    fault to be recorded there."""

    def __init__(self, pool: CompilePool, jobs: int, progress: Callable[[str], None], done: Callable | None):
        self.pool, self.jobs, self.progress, self.done = pool, jobs, progress, done
        self.whose = {(str(job.engine_path), job.workload.shape): (work, job) for work in pool._works for job in work.jobs}
        self.outcomes: dict[tuple[str, str], Any] = {}
        self.last_compiled, self.preparing = pool._started_at, 0.0
        self.to_serve: list = []  # the points kept, handed over once every point is compiled (_hand_over_kept)

    def add(self, event) -> None:
        """A point reported by its process, or owed by one that ended before it reported it."""
        job, index = event.job, self.pool._children.index(event.child)
        engine, shape = str(job.engine_path), job.workload.shape
        if isinstance(event, Owed):  # its profile prepares it, in the run's process, and records what it finds
            outcome, keeps = {"error": f"the compiling process {event.child.name} ended ({event.ended}) before compiling it"}, False
        else:
            outcome, compiled_at, keeps = event.value
            self.last_compiled = max(self.last_compiled, compiled_at)
        self.outcomes[(engine, shape)] = outcome
        if "faulted" in outcome:  # that process ended: it serves nothing it kept
            self.pool._serving[index].faulted()
        self.progress(f"compiled {len(self.outcomes)} of {self.jobs} shape points ({Path(engine).stem} at {shape}: {_words(outcome)})")
        leader = self.whose.get((engine, shape))
        key = self.pool._keys.get((engine, shape))
        sharing = self.pool._followers.get(key, []) if leader is not None and key is not None else []
        for _, shared in sharing:  # the same graph: compiled once, by the leader's process
            self.outcomes[(str(shared.engine_path), shape)] = shared_outcome(outcome, leader[1].toolchain)
        if self.done is not None and "error" not in outcome and leader is not None:
            # Served by the process that compiled it, where it kept it (only once every point is
            # compiled: it asks nothing of that process before then); a job that shares its graph
            # is prepared there from it when first asked for.
            began = time.perf_counter()
            for work, each in [leader, *sharing]:
                shared_from = None if each is leader[1] else ((engine, shape), each)
                facts = self.outcomes[(str(each.engine_path), shape)]
                served = ServedPoint(self.pool._serving[index], each.engine_path, shape, facts, shared_from) if keeps else None
                if served is None:
                    self.done(work, each, None)
                else:
                    self.to_serve.append((work, each, served))
            self.preparing += time.perf_counter() - began
        elif self.done is not None and "faulted" in outcome and leader is not None:
            self.done(*leader, FaultedPoint(shape, outcome["faulted"]))  # recorded at its profile


def shared_outcome(outcome: dict[str, Any], toolchain: str) -> dict[str, Any]:
    """What the build manifest keeps of a point that shares another toolchain's compiled graph."""
    if "error" in outcome:
        return {"error": f"{toolchain}, whose compiled graph it shares, failed here: {outcome['error']}"}
    own = {key: value for key, value in outcome.items() if key not in TIMELINE}  # the leader's process's time, not its
    return {**own, "compile_s": 0.0, "shares_graph_of": toolchain}


def _hand_over_kept(kept: list, done) -> tuple[int, float]:
    """The points their compiling processes kept, handed over once every point is compiled: each to
    be served by its process where that still serves (ServedPoint), else — a kernel faulted there,
    and it ended — to be prepared by the run's process, as a point not kept is. How many are
    served, and the seconds this process spent preparing the others."""
    served, began = 0, time.perf_counter()
    for work, job, point in kept:
        alive = point.alive()
        served += alive
        done(work, job, point if alive else None)
    return served, time.perf_counter() - began


def _words(outcome: dict[str, Any]) -> str:
    if "compile_s" in outcome:
        return f"{outcome['compile_s']:.0f} s"
    return f"left to its profile: {outcome['error']}" if "error" in outcome else "left to its profile"


def _compile_points(channel, threads: int, index: int, clocks: tuple[float, float], gpu: bool = False) -> None:
    """In a new interpreter: prepare each point this process is handed, as its profile will, and
    report how each went (launchers/handout.py), until told every point is handed out; then serve
    the points kept (pytorch/served.py) over the same channel until told to stop. A toolchain's
    runtime keeps the model it last read, so consecutive points of one engine read it once; each
    point compiles its own graph. ``clocks``: the wall-clock instants of the pool's first hand-over
    and of this process's start, which its points' timeline is told from (compile_process.timeline). ``gpu``:
    the run's process has a GPU, which this one must have too, or it compiles nothing: a point
    compiled here on the CPU would be timed there as the GPU's."""
    entered = time.time()
    # Inductor compiles kernels in a pool of workers, one per CPU by default: shared out here, so
    # the processes together use the machine's CPUs, not each all of them. (Not part of the
    # cache's key. Inductor reads the variable when it is first imported, which a process forked
    # from the preloading server did before it: share_cpus sets its setting as well.)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime

    no_gpu = share_cpus(threads, gpu)
    primed = time.time()
    runtimes: dict[str, Any] = {}
    kept: dict[tuple[str, str], tuple[Any, Any]] = {}

    def runtime_for(job: CompileJob):
        if job.toolchain not in runtimes:
            runtimes[job.toolchain] = create_runtime(job.toolchain, job.spec, Reporter(), job.workspace_root)
        return runtimes[job.toolchain]

    first = True
    while (job := take_job(channel)) is not None:
        keeps, taken = False, time.time()
        try:
            if no_gpu:
                raise PipelineError(no_gpu)
            runtime = runtime_for(job)
            prepared = runtime.load(job.engine_path, job.workload)
            outcome = {key: prepared.facts[key] for key in POINT_FACTS if key in prepared.facts}
            keeps = _room_to_keep()
            if keeps:
                kept[(str(job.engine_path), job.workload.shape)] = (runtime, prepared)
        except Exception as exc:  # recorded for the point: its profile compiles it and says why it fails
            outcome = _failure(exc, this_process_name())
        outcome.update(timeline(clocks, (entered, primed) if first else None, taken, time.time()))
        # CUDA's context gone for good here (a fault): this process takes nothing more (the
        # others take the points still to hand out) and serves nothing it kept (the run's
        # process prepares those); it ends.
        faulted = "faulted" in outcome
        report_job(channel, (outcome, time.time(), keeps), more=not faulted)
        first = False
        if faulted:
            return
    _save_recorded(index)
    if kept:
        _stop_compile_workers()
    serve(channel, kept, this_process_name(), runtime_for)


def _save_recorded(index: int) -> None:
    """What this process compiled or found in the caches, saved for `pipeline cache export`
    (pytorch/cache.py). Never this process's failure: the caches themselves hold the work."""
    from pipeline.runtimes.pytorch.cache import save_recorded

    try:
        save_recorded(f"compile-{index}")
    except Exception:  # another torch's Mega-Cache, a full disk: nothing exported, nothing lost
        pass


def _failure(exc: Exception, name: str) -> dict[str, Any]:
    """What is recorded of a point that process ``name`` could not prepare: why (its profile
    prepares it again and says so), and where a kernel faulted, the fault (``faulted``: CUDA's
    words and where, as a profile's FaultFacts), which the run records for the point's profile."""
    if isinstance(exc, DeviceFault):
        words, during = exc.facts.get("error"), exc.facts.get("during")
    else:
        words, during = fault_words(exc), None
    fault = as_fault(RuntimeError(words), ", ".join(part for part in (during, f"compiling it ahead in {name}") if part)) if words else None
    if fault is not None:
        return {"error": fault.message, "faulted": fault.facts}
    if isinstance(exc, PipelineError):
        return {"error": exc.message}
    text = str(exc).strip()
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"}


def _stop_compile_workers() -> None:
    """End Inductor's kernel-compiling worker processes before serving: nothing compiles while
    anything is measured, and idle, they are still processes beside the measurement (a GPU's
    process list, a host's CPUs). Were anything to compile later (a reset's recompilation at the
    warm-up), Inductor starts them again."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
    except Exception:  # another torch's internals: they stay, idle
        pass


def _room_to_keep() -> bool:
    """Whether this process may keep the point it just compiled: on a GPU, while AHEAD_FREE_GPU of
    its memory is free (what is kept holds some); on the CPU, always."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    return too_little_to_keep(*torch.cuda.mem_get_info()) is None
