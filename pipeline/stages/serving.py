"""A shape point's engines serving concurrent streams, after its rounds (docs/streams.md).

The rounds (pipeline/stages/point.py) time one inference at a time and decide which engine is
fastest; that is untouched. Where the catalog's ``[profile] streams`` (or ``--streams``) asks for
more than one stream, each engine the rounds timed then serves each count for ``serve_s`` seconds:
in this process, its runtime's way (EngineRuntime.serve: threads, each its own inputs — and on a
GPU its own CUDA stream — or a tool's own streams), and, for a runtime whose threads the GIL
serialises (EngineRuntime.serves_in_processes), also by N processes, each its own interpreter,
engine and inputs, released at one instant and timed over the same span. A runtime that cannot
serve a count says why, and that is recorded at that count.

A count's ``serve_s`` is served in ``serve_rounds`` takes, in rounds, as the rounds time a point:
each round serves every engine at every count once, in an order drawn from the point's seed, so
that a spell of the host's falls on all of them alike; each count's figures pool its takes
(measuring/serving.pooled). N processes hold N copies of one engine, so they serve one engine's
counts in rounds, engine after engine; a runtime whose take is a whole run of a tool
(EngineRuntime.serves_in_rounds false) serves each count in one take.
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.launchers.child import ERROR, OK, Child, Reply, serve_requests
from pipeline.measuring.serving import PROCESSES, ServedRun, pooled
from pipeline.running.errors import DeviceFault, EnvironmentMissing, PipelineError

# Seconds between the last process saying its stream is warmed and the instant all of them start:
# enough for the start message to reach every one of them (a pipe, well under a millisecond).
START_MARGIN_S = 0.1
# What a serving process says once its stream is warmed, before it is told when to start.
WARMED = "warmed"
# Seconds a serving process has to end once asked before it is killed.
STOP_GRACE_S = 10


def serve_point(engines: dict[Any, Any], settings, reporter, seed: int = 0) -> dict[Any, list[ServedRun]]:
    """Each profile's (``engines``: stage → its prepared engine) runs at every stream count of
    ``settings``, in this process, in rounds drawn from ``seed``, and, where its runtime asks, in
    processes; {} where the settings serve nothing."""
    if not settings.serves:
        return {}
    reporter.measuring(f"serving {', '.join(map(str, settings.streams))} streams")
    out = _served_in_rounds(engines, settings, reporter, seed)
    for stage in engines:
        if stage.runtime.serves_in_processes:
            reporter.measuring(f"{_name(stage)} serving {', '.join(map(str, settings.streams))} streams in as many processes")
            with _pinned(stage):
                where = (stage.ctx.catalog, stage.toolchain, stage.engine_file(), stage.workload())
                out[stage] += serve_in_processes(*where, settings, seed, _takes(stage.runtime, settings))
    return out


def serving_words(runtime, settings) -> str:
    """What serving will do for an engine of ``runtime``, for --dry-run."""
    counts = ", ".join(map(str, settings.streams))
    processes = " and in as many processes" if runtime.serves_in_processes else ""
    takes = _takes(runtime, settings)
    split = f" in {takes} takes interleaved with the point's other engines" if takes > 1 else ""
    return f"serve: after the rounds, {counts} concurrent streams, {settings.serve_s:g} s each{split}, in this process{processes}"


def _name(stage) -> str:
    return f"{stage.engine.variant}/{stage.toolchain}"


def _takes(runtime, settings) -> int:
    return settings.serve_rounds if runtime.serves_in_rounds else 1


@contextmanager
def _pinned(stage):
    """A fault of the GPU raised inside is pinned to ``stage``'s engine, whose streams saw it."""
    try:
        yield
    except DeviceFault as exc:
        exc.pinned_to(_name(stage))
        raise


def _served_in_rounds(engines: dict[Any, Any], settings, reporter, seed: int) -> dict[Any, list[ServedRun]]:
    """Every engine at every count in this process, ``serve_rounds`` takes each, a round serving
    each (engine, count) once in an order drawn from ``seed``; a count that fails takes no more."""
    takes = {stage: _takes(stage.runtime, settings) for stage in engines}
    parts: dict[tuple[Any, int], list[ServedRun]] = {(stage, count): [] for stage in engines for count in settings.streams}
    rng = random.Random(seed)
    rounds = max(takes.values(), default=0)
    for number in range(rounds):
        jobs = [key for key in parts if number < takes[key[0]] and all(part.why_not is None for part in parts[key])]
        rng.shuffle(jobs)
        for stage, count in jobs:
            seconds = settings.serve_s / takes[stage]
            round_words = f", round {number + 1} of {rounds}" if rounds > 1 else ""
            reporter.step(f"{_name(stage)} serving {count} stream{'s' if count > 1 else ''} for {seconds:g} s{round_words}")
            with _pinned(stage):
                part = _served(stage.runtime, engines[stage], count, seconds)
            parts[stage, count].append(part)
    return {stage: [pooled(parts[stage, count]) for count in settings.streams] for stage in engines}


def _served(runtime, engine, count: int, seconds: float) -> ServedRun:
    """``engine`` served by ``runtime`` at ``count`` streams for ``seconds``, or, where that failed,
    a run that says why (a fault of the GPU is raised: the process can serve nothing more)."""
    try:
        return runtime.serve(engine, count, seconds)
    except (DeviceFault, EnvironmentMissing):
        raise
    except PipelineError as exc:
        return ServedRun.cannot(count, "threads", f"failed: {exc.message}")
    except Exception as exc:  # a runtime's own failure at this count: recorded there, the rest goes on
        return ServedRun.cannot(count, "threads", f"the {runtime.kind} runtime failed serving {count} streams: {type(exc).__name__}: {exc}")


def serve_in_processes(
    catalog, toolchain: str, engine_path: Path, workload, settings, seed: int = 0, rounds: int | None = None
) -> list[ServedRun]:
    """Each count of ``settings.streams`` served by that many processes: as many as the largest
    count are started and prepared once, each a new interpreter that loads and prepares the engine
    with its own inputs (a compiled engine compiled once in each, not once a count); then, in
    ``rounds`` rounds (``serve_rounds`` where not given) of the counts in an order drawn from ``seed``, the first that many
    processes serve one stream each from an instant given to all of them, for a take of the
    count's ``serve_s`` — the streams' requests and span together — while the others wait idle.
    A count that fails says why and takes no more; the others still run on the processes left."""
    counts = settings.streams
    children = [
        Child(_serving_process, catalog, toolchain, engine_path, workload, name=f"pipeline-stream-{index}", requests=True)
        for index in range(max(counts))
    ]
    try:
        try:
            for child in children:
                child.start()
            for child in children:  # each prepares its engine, all at once; each says when it is ready
                child.send("prepare")
            for child in children:
                _said(child.receive())
        except PipelineError as exc:
            return [ServedRun.cannot(count, PROCESSES, f"failed: {exc.message}") for count in counts]
        rounds = settings.serve_rounds if rounds is None else rounds
        parts: dict[int, list[ServedRun]] = {count: [] for count in counts}
        rng = random.Random(seed)
        for _ in range(rounds):
            order = [count for count in counts if all(part.why_not is None for part in parts[count])]
            rng.shuffle(order)
            for count in order:
                parts[count].append(_served_by(children[:count], settings.serve_s / rounds))
        return [pooled(parts[count], between="the engine's other counts") for count in counts]
    finally:
        for child in children:
            child.stop_serving()
        for child in children:
            child.join(STOP_GRACE_S)
            child.stop()


def _served_by(children: list[Child], seconds: float) -> ServedRun:
    """One stream from each of ``children`` (started and prepared), released together: each warms
    its stream (its first request, untimed, in the thread that serves it) and says so; once all
    have, each is given the instant they start at. An instant set before the warming would leave a
    process whose first request outlasts it starting late, its stream beside fewer others."""
    count = len(children)
    for child in children:
        child.send(("serve", seconds))
    # Every reply read before any is judged: one left unread would be taken for the next count's.
    # A process that cannot serve answers at once, with no word of warming, and is not told when.
    first = [_reply_of(child) for child in children]
    start_at = time.time() + START_MARGIN_S
    warmed = [reply.kind == OK and reply.value == WARMED for reply in first]
    for child, told in zip(children, warmed):
        if told:
            child.send(start_at)
    replies = [_reply_of(child) if told else reply for child, reply, told in zip(children, first, warmed)]
    try:
        runs: list[ServedRun] = [_said(reply) for reply in replies]
    except PipelineError as exc:
        return ServedRun.cannot(count, PROCESSES, f"failed: {exc.message}")
    for run in runs:
        if run.why_not is not None:
            return ServedRun.cannot(count, PROCESSES, run.why_not)
    latencies = [value for run in runs for value in run.latencies_ms]
    how = f"{count} process{'es' if count > 1 else ''}, each its own interpreter, engine and inputs, released together"
    # Each process's span runs from the common start to its last request's end: the streams' span is the longest.
    return ServedRun(count, PROCESSES, max(run.span_s for run in runs), len(latencies), latencies, how=how)


def _said(reply: Reply) -> Any:
    return reply.result()


def _reply_of(child: Child) -> Reply:
    """The child's reply, or its end as an error reply."""
    try:
        return child.receive()
    except PipelineError as exc:
        return Reply(ERROR, exc)


def _serving_process(channel, catalog, toolchain: str, engine_path: Path, workload) -> None:
    """In the serving process: prepare the engine when asked, then, as often as asked until told
    to stop, warm one stream, say so, and serve it from the instant the parent then gives."""
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime

    runtime = create_runtime(toolchain, catalog.toolchain(toolchain), Reporter(verbose=False), catalog.root)
    prepared: list[Any] = []

    def answer(request) -> Reply:
        try:
            if request == "prepare":
                prepared.append(runtime.prepare(engine_path, workload))
                return Reply("ok", None)
            _, seconds = request

            def when_all_are_warmed() -> float:
                channel.send(Reply(OK, WARMED))
                instant = channel.recv()  # the instant every process starts at
                if not isinstance(instant, float):  # told to stop instead
                    raise PipelineError("the run stopped serving before the streams started")
                return instant

            return Reply("ok", runtime.serve(prepared[-1], 1, seconds, when_all_are_warmed))
        except PipelineError as exc:
            return Reply("error", exc.plain())
        except Exception as exc:  # the runtime's own failure: said to the parent, as _served says it there
            return Reply("error", PipelineError(f"the {runtime.kind} runtime failed: {type(exc).__name__}: {exc}"))

    serve_requests(channel, answer)
