"""One take: an engine's runs timed back to back, by the host's clock (a CPU engine, a runtime that
cannot time on the GPU) or on the GPU by CUDA events as trtexec times its iterations, with the
host's time to issue each run beside it. The rounds (rounds.py) take turns of these."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipeline.measuring.pace import NEAR_LAUNCH_BOUND_SHARE

# How many runs may be enqueued ahead of the oldest one not yet finished, in a CUDA take: enough
# that the GPU always has the next run queued while the host enqueues the one after, few enough
# that a stopped take drains at once.
QUEUE_DEPTH = 4
# How much more the host can spend issuing the first run after another engine's take than the runs
# of a take: 74-82 % of the run against 45 % for `torch-reduce-overhead` at 2x512 on the lent H100
# (docs/results/sweeps.md, 'The seed matrix in rounds'): 1.8x. Here it is the margin a first issue
# kept as the take's is held under (could_be_near_launch_bound).
FIRST_ISSUE_INFLATION = 2.0


def host_take(run: Callable[[], Any], runs: int, min_ms: float) -> list[float]:
    """``run`` timed by the host's clock, each call on its own."""
    run()  # untimed: another engine ran since this one's last take
    times_ms: list[float] = []
    started = time.perf_counter()
    while len(times_ms) < runs or (time.perf_counter() - started) * 1000.0 < min_ms:
        t0 = time.perf_counter_ns()
        run()
        times_ms.append((time.perf_counter_ns() - t0) / 1e6)
    return times_ms


def cuda_take(
    torch,
    run: Callable[[], Any],
    runs: int,
    min_ms: float,
    issue_ms: list[float] | None = None,
    waited_ms: list[float] | None = None,
    untimed: list[int] | None = None,
    steady_ms: float | None = None,
) -> list[float]:
    """``run`` enqueued back to back on the current CUDA stream, each timed on the GPU by a pair of
    CUDA events, as trtexec times its iterations: a run's time is what the GPU spent from its first
    kernel's launch to its last kernel's end. A host that waited for every run would leave the GPU
    idle between launches inside the timed window and time PyTorch slower than an engine timed by
    trtexec. A ring of QUEUE_DEPTH event pairs: a slot is read (its run waited for) only when the
    ring comes round to it, so the host blocks only while that many runs are queued.

    The untimed run is issued with the GPU idle; the host's time to issue it (``run()`` returning,
    its kernels launched) is appended to ``issue_ms``. Near a run's GPU time, the GPU waits for
    the host between kernels: the run is launch-bound, its time the host's speed. The first run
    after another engine's take can cost the host more than the runs of a take (measured:
    docs/results/sweeps.md, 'The seed matrix in rounds'), so a short run is issued twice, untimed,
    and the second one's issue kept — unless the engine's last take (``steady_ms``, the median
    of its timed runs) says the first issue is far from launch-bound
    (``could_be_near_launch_bound``). A long run is issued once: a second would cost the take's
    budget, and a run that long issues thousands of kernels before it could be launch-bound. In the
    lent H100's warm seed matrix, the untimed runs of 4x4096's takes, two for every engine but
    eager attention, had lasted 8.6 s of its 21.8 s of rounds, the timed ones 12.4 s
    (docs/results/sweeps.md).

    That run is also one the host waits for, from an idle GPU: its wall time, launch to the end of
    its synchronisation, is what a caller that needs each result before sending the next sees (the
    profile's second figure, the host-synchronised latency). It is appended to ``waited_ms``, so
    that figure comes from the takes, one a take, with no runs of its own after the rounds: the
    second untimed run where there is one, else the first: a long run's, or one whose issue was
    under a quarter of the engine's run, which an issue 1.8x its steady one lengthens by at most a
    ninth of the run.

    ``untimed`` gets the number of untimed runs (1 or 2): an energy counter read around the take
    counts them too (pipeline/measuring/energy.py)."""
    issued, whole = _issued(torch, run)
    before = 1
    if issue_ms is not None:
        if whole * max(runs, 1) < min_ms and could_be_near_launch_bound(issued, steady_ms):
            issued, whole = _issued(torch, run)
            before = 2
        issue_ms.append(issued)
    if untimed is not None:
        untimed.append(before)
    if waited_ms is not None:
        waited_ms.append(whole)
    slots = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(QUEUE_DEPTH)]
    times_ms: list[float] = []
    enqueued = 0
    # The host's clock reaches min_ms with up to QUEUE_DEPTH - 1 runs still queued behind it: runs
    # longer than a take's share would make it that many runs longer (eager attention at 4x4096,
    # 212 ms a run: 2-4 runs for a 100 ms take). So the take also ends once the runs queued reach
    # min_ms by their GPU time: those done as timed, the others as the shortest done, or the
    # untimed run's whole time before any is done. Both kept as the runs finish, not summed
    # again at every launch: the loop is the host's time between runs of a launch-bound engine.
    done_ms, shortest = 0.0, whole
    started = time.perf_counter()
    while enqueued < runs or (
        (time.perf_counter() - started) * 1000.0 < min_ms and done_ms + (enqueued - len(times_ms)) * shortest < min_ms
    ):
        start, end = slots[enqueued % QUEUE_DEPTH]
        if enqueued >= QUEUE_DEPTH:  # the slot's previous run: wait for it and keep its time
            end.synchronize()
            elapsed = start.elapsed_time(end)
            shortest = min(shortest, elapsed) if times_ms else elapsed
            times_ms.append(elapsed)
            done_ms += elapsed
        start.record()
        run()
        end.record()
        enqueued += 1
    for index in range(max(0, enqueued - QUEUE_DEPTH), enqueued):  # drain, oldest first
        start, end = slots[index % QUEUE_DEPTH]
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    return times_ms


def could_be_near_launch_bound(issued_ms: float, steady_ms: float | None) -> bool:
    """Whether a first run after another engine's take, issued in ``issued_ms``, could belong to a
    near launch-bound engine (pace.py), against ``steady_ms``, the median of the engine's timed runs
    in its last take (None before its first take: it could). Kept as the take's issue, that first
    issue must read as the engine's steady one would, which is at most as long: under
    NEAR_LAUNCH_BOUND_SHARE of the run, where the rounds and the report do not flag it, with room
    for the run to read shorter in this take than in its last (FIRST_ISSUE_INFLATION as a margin).
    So the first issue is kept only under a quarter of the engine's run; it is not the run's own
    wall time that is measured against, which holds the first run's own slowness after another
    engine's take."""
    if steady_ms is None:
        return True
    return issued_ms * FIRST_ISSUE_INFLATION >= NEAR_LAUNCH_BOUND_SHARE * steady_ms


def _issued(torch, run: Callable[[], Any]) -> tuple[float, float]:
    """One run, waited for: (ms until ``run()`` returned, ms until the GPU finished it). The GPU is
    idle before it: every take ends with its runs waited for, as does the run before this one."""
    started = time.perf_counter_ns()
    run()
    issued = time.perf_counter_ns()
    torch.cuda.synchronize()
    return (issued - started) / 1e6, (time.perf_counter_ns() - started) / 1e6
