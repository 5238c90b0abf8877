"""Serving at N concurrent streams: how many inferences an engine completes per second when N
callers each send it one request after another, and what each of them waits.

The rounds (rounds.py) time one inference at a time, engine beside engine; that is the latency a
lone caller sees. A server has many: N streams, each its own inputs (and on a GPU its own CUDA
stream), started together and timed over the same span. What is read at each N:

- **inferences/s**: the requests completed by every stream together, over the common span — from
  the moment all streams were released together to the end of the last request (no stream starts
  one after the span's deadline, so the span overruns it by at most one request);
- **latency**: each request's time from its call to its result, as its caller (the host) sees it:
  its median, p90 and p99, each with the distribution-free 95 % interval of quantiles.py, or the
  number of requests it would need (a p99: 368). Requests of one span share its host and its
  neighbours' load, so the interval is read as if they were independent: docs/streams.md says
  when that is too kind.

A serving measurement is separate from the rounds and after them (pipeline/stages/point.py): it
never perturbs them. Here: the record of one (``ServedRun``), the figures read from it
(``served_figures``), and the thread driver every in-process runtime serves by (``serve_threads``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.measuring.quantiles import quantile_interval, runs_needed

# How a run served its streams: threads of this process on one engine; processes, each its own
# interpreter and its own copy of the engine; or a tool's own streams (trtexec --infStreams).
THREADS, PROCESSES, TOOL_STREAMS = "threads", "processes", "tool streams"

# The percentiles a served run reports, each with its interval (or the requests it needs).
SERVED_PERCENTS = (50, 90, 99)


# When streams start: now (None), at an instant of time.time(), or at the instant a call returns
# once every stream is warmed (serve_threads).
StartAt = float | Callable[[], float] | None


@dataclass
class ServedRun:
    """What serving ``streams`` concurrent streams gave, or why it could not be measured."""

    streams: int
    mode: str
    # Seconds from the streams' common start to the end of the last request, and the requests
    # every stream completed in it.
    span_s: float = 0.0
    completed: int = 0
    # Each request's latency, call to result, as its caller saw it; empty where a tool reports
    # only its own summary (``tool_latency_ms``).
    latencies_ms: list[float] = field(default_factory=list)
    # A tool's own latency percentiles ({"50": …, "90": …, "99": …}) where it keeps the requests to itself.
    tool_latency_ms: dict[str, float] = field(default_factory=dict)
    # How it was served, in words ("2 threads on one InferenceSession, each with its own inputs").
    how: str = ""
    # Why nothing was measured at this concurrency (None where it was).
    why_not: str | None = None
    # Each take's inferences/s, in the order served, where the run pools several (``pooled``).
    takes_per_s: list[float] = field(default_factory=list)

    @classmethod
    def cannot(cls, streams: int, mode: str, why: str) -> ServedRun:
        return cls(streams=streams, mode=mode, why_not=why)


def pooled(takes: Sequence[ServedRun], between: str = "the point's other engines and counts") -> ServedRun:
    """One count's takes, served in rounds with ``between`` (in words) served between them, as one
    run: their requests and spans added up (inferences/s over the time it served), their latencies
    together; the first take that could not be measured where one could not (the count's takes
    stop there). A single take is itself."""
    if len(takes) == 1:
        return takes[0]
    failed = next((take for take in takes if take.why_not is not None), None)
    if failed is not None:
        return failed
    first = takes[0]
    return ServedRun(
        first.streams,
        first.mode,
        span_s=sum(take.span_s for take in takes),
        completed=sum(take.completed for take in takes),
        latencies_ms=[value for take in takes for value in take.latencies_ms],
        how=f"{first.how}; {len(takes)} takes, in rounds with {between}",
        takes_per_s=[take.completed / take.span_s if take.span_s > 0 else 0.0 for take in takes],
    )


class ServedRecord(BaseModel):
    """One concurrency of a profile, as the manifest keeps it (ProfileDetails.streams)."""

    model_config = ConfigDict(extra="allow")

    streams: int
    mode: str
    how: str = ""
    why_not: str | None = None
    span_s: float | None = None
    completed: int | None = None
    # Inferences (engine runs) per second over the span, and samples and tokens per second.
    inferences_per_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    # The requests' latency: {"50": ms, "90": ms, "99": ms}; each percentile's 95 % interval
    # ([low, high], None where the requests cannot bound it) and the requests it would need.
    latency_ms: dict[str, float] = {}
    interval_ms: dict[str, list[float] | None] = {}
    requests_needed: dict[str, int | None] = {}
    # Where the latencies are a tool's own summary: nothing here bounds them.
    bounded_by: str = "requests"
    # Every request's latency (ms), for plots and for reading the figures again.
    latencies_ms: list[float] = []
    # Each take's inferences/s where the count was served in several (serve_rounds): how far the
    # host's spells moved it. Empty for one take.
    takes_per_s: list[float] = []


def served_figures(run: ServedRun, batch: int, tokens_per_run: int | None) -> ServedRecord:
    """The manifest's record of ``run``: throughput in inferences, samples (``batch`` a run) and
    tokens (``tokens_per_run`` a run, where the model has them), the latency's percentiles with
    their intervals, or why it was not measured."""
    if run.why_not is not None:
        return ServedRecord(streams=run.streams, mode=run.mode, how=run.how, why_not=run.why_not)
    per_s = run.completed / run.span_s if run.span_s > 0 else 0.0
    record = ServedRecord(
        streams=run.streams,
        mode=run.mode,
        how=run.how,
        span_s=round(run.span_s, 6),
        completed=run.completed,
        inferences_per_s=per_s,
        samples_per_s=per_s * batch,
        tokens_per_s=per_s * tokens_per_run if tokens_per_run else None,
        latencies_ms=[round(value, 6) for value in run.latencies_ms],
        takes_per_s=[round(value, 6) for value in run.takes_per_s],
    )
    if run.latencies_ms:
        ordered = sorted(run.latencies_ms)
        for percent in SERVED_PERCENTS:
            q = percent / 100
            interval = quantile_interval(ordered, q)
            record.latency_ms[str(percent)] = _percentile(ordered, q)
            record.interval_ms[str(percent)] = list(interval) if interval is not None else None
            record.requests_needed[str(percent)] = runs_needed(q) if interval is None else None
    else:  # a tool's own summary: its percentiles as it read them, nothing to bound them by
        record.latency_ms = dict(run.tool_latency_ms)
        record.interval_ms = dict.fromkeys(run.tool_latency_ms)
        record.requests_needed = dict.fromkeys(run.tool_latency_ms)
        record.bounded_by = "the tool's summary: not bounded"
    return record


def _percentile(ordered: Sequence[float], q: float) -> float:
    """numpy.percentile's default (linear) reading of sorted values."""
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def serve_threads(requests: Sequence[Callable[[], Any]], seconds: float, start_at: StartAt = None) -> tuple[float, list[float]]:
    """Each of ``requests`` (one a stream: a call that runs one inference on that stream's own
    inputs and returns when its result is there) called over and over by a thread of its own, the
    threads released together and stopping for the first time at ``seconds`` after it: (the span
    from the release to the end of the last request, every request's latency in ms).

    Each thread's first request is untimed, before the release: what a thread sets up on its first
    call is paid once by a server's long-lived thread, not by every take. On the lent H100 a new
    thread's first request of ModernBERT took 46-81 ms, eager (12 ms) or compiled (3.9 ms), again
    in every new thread, while a new stream in a warmed thread cost 1-2 ms: timed, it took a tenth
    of a 0.5 s take's throughput (docs/streams.md, 'A thread's first request').

    ``start_at``: the release at that instant of time.time() instead of as soon as every thread is
    ready — how streams in separate processes start together (the same span) — or a call, made
    once every thread here is warmed, that returns the instant: a process says it is ready and is
    told when all are (pipeline/stages/serving.py), so that no process's first request, however
    slow, makes it start late. Where the instant has passed when the threads are warmed, they start
    at once and the span still counts from that instant: a stream that starts late serves less of
    it, and the throughput over the span is not overstated."""
    count = len(requests)
    warmed, release = threading.Barrier(count + 1), threading.Barrier(count + 1)
    latencies: list[list[float]] = [[] for _ in requests]
    ends = [0.0] * count
    errors: list[BaseException] = []
    deadline = [0.0]

    def stream(index: int) -> None:
        call, mine = requests[index], latencies[index]
        try:
            call()  # untimed: this thread's first request
            warmed.wait()
            release.wait()
            while time.perf_counter() < deadline[0]:
                t0 = time.perf_counter_ns()
                call()
                mine.append((time.perf_counter_ns() - t0) / 1e6)
            ends[index] = time.perf_counter()
        except BaseException as exc:  # re-raised in the caller's thread, with the others stopped
            errors.append(exc)
            deadline[0] = 0.0
            warmed.abort()
            release.abort()

    threads = [threading.Thread(target=stream, args=(index,), daemon=True, name=f"stream-{index}") for index in range(count)]
    for thread in threads:
        thread.start()
    started = 0.0
    try:
        warmed.wait()
        started = time.perf_counter()
        if start_at is not None:
            instant = start_at() if callable(start_at) else start_at
            started += instant - time.time()  # that instant on this clock
            time.sleep(max(0.0, started - time.perf_counter()))
        deadline[0] = started + seconds
        release.wait()
    except threading.BrokenBarrierError:
        pass
    except BaseException:  # the instant never came (the parent ended): the threads stop unserved
        deadline[0] = 0.0
        release.abort()
        for thread in threads:
            thread.join()
        raise
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return max(ends) - started, [value for mine in latencies for value in mine]
