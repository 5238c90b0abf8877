"""A compiled engine timed in the process that compiled it, at the point it compiled there.

A run that profiles compiles every point of its compiled engines in processes side by side
(pipeline/runtimes/pytorch/compile_ahead.py). Preparing such a point again in the run's own process
costs Dynamo's tracing even with every graph in Inductor's cache, seconds an engine and point,
paid one point after another while the compiling processes sit idle (measured:
docs/results/sweeps.md, 'Every point compiled side by side'). The compiling process already holds the point ready (traced,
compiled, run once), so it keeps it and, once every point is compiled and nothing compiles any
more, serves it: each request of the run's process — ready it, a take, the warm-up, its evidence,
its outputs on the reference batch — is one request over the channel to that child
(pipeline/launchers/child.py), answered when done. The rounds
(pipeline/measuring/rounds.py) time it as any engine of this process: a take is timed inside
the serving process, by the same code (takes.py), and only one process runs at a time, the
others waiting on their channels, so the GPU and the host see one take at a time, as before.

The run's process counts these processes as its own when it watches the machine (their CPU time
and their work on the GPU are the measurement's, not a neighbour's): ``ServedEngine.processes``.

Here, the two ends: ``serve`` runs in the compiling process; ``ServedPoint`` and
``ServedEngine`` in the run's.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.launchers.child import ENDS, ERROR, OK, ChildEnded, Reply, ended_words, serve_requests
from pipeline.measuring.serving import StartAt
from pipeline.running.errors import DeviceFault, PipelineError
from pipeline.running.faults import as_fault

# What a request asks of a point kept in a compiling process, by the word it is sent with.
READY, TAKE, WARM, EVIDENCE, REFERENCE, STREAMS = "ready", "take", "warm", "evidence", "reference", "streams"
# Prepare a point from another toolchain's compiled graph at that point, kept here (pytorch/compile_ahead.py, graph_key).
SHARE = "share"


class ProcessGone(PipelineError):
    """The serving process is no longer there (it crashed, was killed, or was told to stop)."""


# --- in the compiling process ----------------------------------------------------------------------


def serve(channel, points: dict[tuple[str, str], tuple[Any, Any]], name: str, runtime_for=None) -> None:
    """Answer the run's requests for the ``points`` this process kept (engine file, shape point →
    (its runtime, its prepared model)), one at a time, until told to stop or the run's end of the
    channel closes (pipeline/launchers/child.py, serve_requests). An error is answered as the run's
    process would have raised it itself, a kernel fault (DeviceFault) among them: this process's
    context is then gone, as the run's would be, so it serves nothing more and ends (the run's
    process prepares the points it kept). ``runtime_for(job)``: a compile job's runtime, for the
    points prepared here from another's graph (SHARE)."""

    def answer(request) -> Reply:
        what, key, args = request
        try:
            if what == SHARE:  # another toolchain's point, kept here: this one from its graph
                leader, job = args
                runtime = runtime_for(job)
                engine = Path(job.engine_path)  # read by its second name, gone by now: the engine's own
                points[key] = (runtime, runtime.prepared_from(points[leader][1], engine.with_name(engine_name(str(engine)))))
                return Reply(OK, None)
            return Reply(OK, _answer(what, key, *points[key], name, *args))
        except DeviceFault as exc:
            return Reply(ENDS, exc.plain())
        except PipelineError as exc:
            error = as_fault(exc, f"in {name}") or exc.plain()
        except Exception as exc:  # a bug here, or a tool's own: the engine's failure at this point, in words
            words = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            error = as_fault(exc, f"in {name}") or PipelineError(f"{type(exc).__name__} in {name}: {words}")
        return Reply(ENDS if isinstance(error, DeviceFault) else ERROR, error)

    serve_requests(channel, answer)


def _answer(what: str, key: tuple[str, str], runtime, prepared, name: str, *args):
    if what == READY:
        prepared.facts["prepared_ahead"] = True  # compiled and kept before any point was measured
        runtime.ready(prepared)
        prepared.execution["served_by"] = {"process": name, "pid": os.getpid()}
        return prepared.timing
    if what == TAKE:
        runs, min_ms, cpus = args
        with _on_cpus(cpus):
            times = prepared.take(runs, min_ms)
        return times, prepared.issue_ms, getattr(prepared, "untimed_runs", 1)
    if what == WARM:
        return prepared.warm()
    if what == EVIDENCE:
        return prepared.evidence()
    if what == REFERENCE:
        (reference,) = args
        return runtime.reference_run(prepared, reference, engine_name(key[0]))
    if what == STREAMS:  # its threads served here, where the compiled graph is
        streams, seconds, start_at = args
        return runtime.serve(prepared, streams, seconds, start_at)
    raise PipelineError(f"{name} was asked to {what!r}, which it does not know")


def engine_name(path: str) -> str:
    """An engine's file name from the second name its compilation ahead read it by (".vit_fp16.pt.ahead")."""
    return Path(path).name.lstrip(".").removesuffix(".ahead")


@contextmanager
def _on_cpus(cpus):
    """On the CPUs the run's process measures on while it asks (``[profile] host_cpus``, else all of
    its own): a take here runs where it would have run there."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:  # a CPU this process may not use: it stays where it is
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# --- in the run's process --------------------------------------------------------------------------


class ServingProcess:
    """The run's end of one compiling process (a launchers.child.Child that answers requests): one
    request at a time, its answer awaited. ``siblings``: the pids of every process of its pool,
    which all hold the GPU while the run measures (shared by the pool's ServingProcess objects,
    filled as they start)."""

    def __init__(self, child, siblings: set[int]):
        self.child, self.siblings = child, siblings
        self._lock = threading.Lock()
        self.gone: str | None = None  # why it can serve no more

    @property
    def pid(self) -> int | None:
        return self.child.pid

    @property
    def name(self) -> str:
        return self.child.name

    def alive(self) -> bool:
        return self.gone is None and self.child.alive()

    def ask(self, what: str, key: tuple[str, str], *args):
        with self._lock:
            if self.gone is not None:
                raise ProcessGone(self.gone)
            try:
                return self.child.ask((what, key, args))
            except ChildEnded as exc:
                self.gone = f"{self.name}, which compiled and kept it, ended ({ended_words(self.child.exitcode)})"
                raise ProcessGone(self.gone, hint="run the same command again; -v shows what the process printed") from exc
            except DeviceFault:  # it answered the fault and ended
                self.gone = self.gone or _FAULTED.format(name=self.name)
                raise

    def faulted(self) -> None:
        """A kernel faulted in it: its CUDA context is gone, it ended, and nothing more is asked of it
        (each point it kept is prepared in the run's process instead)."""
        with self._lock:
            if self.gone is None:
                self.gone = _FAULTED.format(name=self.name)

    def stop(self) -> None:
        """Ask it to stop serving (it then ends); quietly, whatever state its channel is in."""
        with self._lock:
            if self.gone is None:
                self.gone = f"{self.name} was told to stop"
        self.child.stop_serving()


_FAULTED = "{name}, which compiled and kept it, faulted on the GPU (its CUDA context is gone)"


class ServedPoint:
    """One engine file's point kept by the compiling process that compiled it: what the torch
    runtime of the run's process is handed (TorchRuntime.prepare_ahead) and prepares and checks
    through, instead of tracing the point itself."""

    def __init__(self, process: ServingProcess, engine_path: Path, shape: str, facts: dict[str, Any], shared_from=None):
        self.process, self.key = process, (str(engine_path), shape)
        # What compiling it found (compile time, graphs, graph breaks: compile_ahead.POINT_FACTS).
        self.facts = facts
        # (the kept point's key, this point's compile job): prepared there from that point's graph,
        # when first asked for (pytorch/compile_ahead.py, graph_key); None: that process compiled it.
        self._shared_from = shared_from

    @property
    def shape(self) -> str:
        return self.key[1]

    def alive(self) -> bool:
        return self.process.alive()

    def ready(self) -> ServedEngine:
        """The point ready for its takes (as TorchRuntime.ready readies one of this process)."""
        self._share()
        return ServedEngine(self, self.process.ask(READY, self.key))

    def reference_run(self, reference):
        self._share()
        return self.process.ask(REFERENCE, self.key, reference)

    def _share(self) -> None:
        if self._shared_from is not None:
            self.process.ask(SHARE, self.key, *self._shared_from)
            self._shared_from = None


class FaultedPoint:
    """A point whose compilation ahead faulted on the GPU, in a process that then ended: what the
    torch runtime of the run's process is handed instead of a ServedPoint, so that the point's
    profile records the fault for its engine, as a fault of the run's own process is recorded
    (preparing it raises it), instead of compiling the point again. ``fault``: CUDA's words and
    where (DeviceFault.facts)."""

    def __init__(self, shape: str, fault: dict[str, Any]):
        self.shape, self.fault = shape, fault
        self.facts: dict[str, Any] = {}  # nothing was compiled

    def alive(self) -> bool:
        return False

    def ready(self):
        raise self._raised()

    def reference_run(self, reference):
        raise self._raised()

    def _raised(self) -> DeviceFault:
        words, during = self.fault.get("error") or "", self.fault.get("during")
        return as_fault(RuntimeError(words), during) or DeviceFault(f"faulted on the GPU {during}: {words}", facts=self.fault)


class ServedEngine:
    """A served point as the rounds time it (pipeline/measuring/rounds.py, PreparedEngine): each call
    one request to the process that holds it."""

    def __init__(self, point: ServedPoint, timing: str):
        self.point, self.timing = point, timing
        # The host's time to issue the last take's untimed run (takes.py, cuda_take), as that process measured it.
        self.issue_ms: float | None = None
        # The untimed runs of the last take, inside its energy reading (takes.py, cuda_take's untimed).
        self.untimed_runs = 1

    @property
    def processes(self) -> frozenset[int]:
        """The processes beside the run's own that a measurement of this engine keeps busy or holds
        the GPU in: its serving process and that process's companions."""
        return frozenset(self.point.process.siblings)

    def take(self, runs: int, min_ms: float) -> list[float]:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        times, self.issue_ms, self.untimed_runs = self.point.process.ask(TAKE, self.point.key, runs, min_ms, cpus)
        return times

    def warm(self) -> None:
        self.point.process.ask(WARM, self.point.key)

    def evidence(self) -> dict[str, Any]:
        return self.point.process.ask(EVIDENCE, self.point.key)

    def serve_streams(self, streams: int, seconds: float, start_at: StartAt = None):
        """Its ``streams`` threads served by the process that holds it (a ServedRun). A call that
        gives the start (serve_threads) cannot cross to that process: it is asked here, before
        that process warms its threads, which then start late by that warming (the span counts
        from the instant: serve_threads). The run serves a held point in its own process, with no
        instant (pipeline/stages/serving.py); a process serving alone prepares its own engine."""
        if callable(start_at):
            start_at = start_at()
        return self.point.process.ask(STREAMS, self.point.key, streams, seconds, start_at)
