"""Serving N streams (pipeline/measuring/serving.py): the threads released together and timed over
one span, every request's latency kept, and the figures read from them with their bounds."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.measuring.serving import THREADS, ServedRun, pooled, serve_threads, served_figures


def test_streams_run_side_by_side_over_one_span():
    # A sleep releases the GIL as ONNX Runtime's run does: two streams of 10 ms requests complete
    # about twice as many as one over the same span.
    calls = [lambda: time.sleep(0.01)] * 2
    span, latencies = serve_threads(calls, 0.3)
    assert 0.3 <= span < 0.36
    assert 50 <= len(latencies) <= 62
    assert all(9.5 <= value < 30 for value in latencies)
    one_span, alone = serve_threads(calls[:1], 0.3)
    assert len(latencies) >= 1.8 * len(alone)


def test_streams_start_at_the_instant_given():
    start_at = time.time() + 0.2
    span, latencies = serve_threads([lambda: time.sleep(0.01)], 0.1, start_at=start_at)
    assert time.time() >= start_at + 0.1
    assert 0.1 <= span < 0.15 and latencies


def test_the_instant_can_be_asked_for_once_every_stream_is_warmed():
    """A process's streams warm (each thread's first request, 150 ms here), then ask when to start:
    the call comes after every first request, and the span runs from the instant it returns."""
    seen: set[int] = set()
    firsts: list[float] = []  # when each thread's first request ended
    asked: list[float] = []

    def request():
        if threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            time.sleep(0.15)
            firsts.append(time.time())
        time.sleep(0.005)

    def when_all_are_warmed() -> float:
        asked.append(time.time())
        return asked[0] + 0.1

    span, latencies = serve_threads([request, request], 0.1, start_at=when_all_are_warmed)
    assert len(firsts) == 2 and len(asked) == 1 and asked[0] >= max(firsts)
    assert time.time() >= asked[0] + 0.2
    assert 0.1 <= span < 0.14 and latencies


def test_an_instant_already_past_counts_in_the_span():
    """Streams warmed after the instant given start at once and serve to that instant plus the take:
    the span, from the instant, holds the time they were late, and the throughput over it is not
    that of streams that started on time."""
    start_at = time.time() + 0.05

    seen: set[int] = set()

    def request():
        if threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            time.sleep(0.15)  # warming outlasts the margin: 0.1 s late
        time.sleep(0.01)

    span, latencies = serve_threads([request], 0.3, start_at=start_at)
    assert 0.3 <= span < 0.36
    assert len(latencies) <= 21  # about 0.2 s of 10 ms requests, not 0.3 s


def test_a_stream_that_is_never_told_when_to_start_stops_and_the_error_is_raised():
    def never() -> float:
        raise EOFError("the parent ended")

    with pytest.raises(EOFError):
        serve_threads([lambda: time.sleep(0.001)] * 2, 5.0, start_at=never)


def test_each_threads_first_request_is_untimed_and_made_in_that_thread():
    """What a thread sets up on its first call (a per-thread handle) is not a request: each stream's
    first call runs in the thread that serves it, before the release, and is not in the span."""
    seen: set[int] = set()
    callers: list[int] = []

    def request():
        me = threading.get_ident()
        callers.append(me)
        if me not in seen:  # this thread's set-up: 150 ms, once
            seen.add(me)
            time.sleep(0.15)
        time.sleep(0.005)

    span, latencies = serve_threads([request, request], 0.1)
    assert len(seen) == 2 and threading.get_ident() not in seen
    assert max(latencies) < 50 and len(latencies) == len(callers) - 2
    assert 0.1 <= span < 0.14


def test_a_stream_whose_first_request_fails_stops_the_others():
    def failing():
        raise RuntimeError("no kernel image for this GPU")

    with pytest.raises(RuntimeError, match="no kernel image"):
        serve_threads([lambda: time.sleep(0.001), failing], 5.0)


def test_a_stream_that_fails_stops_the_others_and_its_error_is_raised():
    def failing():
        raise RuntimeError("out of memory in stream 1")

    with pytest.raises(RuntimeError, match="stream 1"):
        serve_threads([lambda: time.sleep(0.001), failing], 5.0)


def test_figures_bound_each_percentile_by_the_requests_or_say_how_many_it_needs():
    many = ServedRun(streams=2, mode=THREADS, span_s=2.0, completed=400, latencies_ms=[1.0 + i / 400 for i in range(400)])
    record = served_figures(many, batch=4, tokens_per_run=2048)
    assert (record.inferences_per_s, record.samples_per_s, record.tokens_per_s) == (200.0, 800.0, 409_600.0)
    assert record.latency_ms["50"] == pytest.approx(1.49875)
    low, high = record.interval_ms["99"]
    assert low <= record.latency_ms["99"] <= high and record.requests_needed["99"] is None
    few = served_figures(ServedRun(2, THREADS, 1.0, 300, [1.0] * 300), batch=1, tokens_per_run=None)
    assert few.interval_ms["99"] is None and few.requests_needed["99"] == 368
    assert few.interval_ms["90"] is not None and few.tokens_per_s is None
    cannot = served_figures(ServedRun.cannot(4, THREADS, "no"), batch=1, tokens_per_run=None)
    assert cannot.why_not == "no" and cannot.inferences_per_s is None and cannot.latency_ms == {}


def test_a_counts_takes_pool_their_requests_over_the_time_they_served():
    """Four takes of one count, in rounds: inferences/s over the time it served (not the mean of
    the takes' rates), every latency kept, each take's rate kept beside it."""
    takes = [
        ServedRun(2, THREADS, 0.5, 30, [10.0] * 30, how="2 threads"),
        ServedRun(2, THREADS, 0.5, 10, [50.0] * 10, how="2 threads"),  # a slow spell of the host's
        ServedRun(2, THREADS, 1.0, 60, [16.0] * 60, how="2 threads"),
    ]
    run = pooled(takes)
    assert (run.streams, run.mode, run.completed, run.span_s) == (2, THREADS, 100, 2.0)
    assert sorted(run.latencies_ms) == sorted([10.0] * 30 + [50.0] * 10 + [16.0] * 60)
    assert run.takes_per_s == [60.0, 20.0, 60.0]
    assert run.how == "2 threads; 3 takes, in rounds with the point's other engines and counts"
    record = served_figures(run, batch=4, tokens_per_run=None)
    assert record.inferences_per_s == 50.0 and record.samples_per_s == 200.0
    assert record.takes_per_s == [60.0, 20.0, 60.0]


def test_a_take_that_could_not_be_measured_speaks_for_its_count_and_one_take_is_itself():
    good = ServedRun(4, THREADS, 0.5, 30, [10.0] * 30, how="4 threads")
    bad = ServedRun.cannot(4, THREADS, "failed: out of memory at 4 streams")
    assert pooled([good, bad]) is bad
    assert pooled([good]) is good and good.takes_per_s == []
    assert served_figures(good, batch=1, tokens_per_run=None).takes_per_s == []
