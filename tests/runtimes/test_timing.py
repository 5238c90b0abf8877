"""The GPU timing method every runtime shares with trtexec: runs enqueued back to back, a bounded
queue, each run timed by its own pair of events, no host synchronisation between runs.

A simulated GPU stands in for CUDA (no GPU here): it executes enqueued work in order on its own
clock, so the tests can see what the host waited for and whether the GPU ever sat idle."""

from __future__ import annotations

import types

import pytest

from pipeline.catalog import ProfileSettings
from pipeline.measuring import takes
from pipeline.runtimes.tensorrt_rtx import cuda


class SimulatedGpu:
    """One stream. A launch costs the host `enqueue_ms`, then the GPU `kernel_ms`; the GPU starts a
    piece of work once the host has enqueued it and the previous piece has ended. An event is
    stamped when the GPU reaches it, so a run's time runs from when the GPU reached its start event
    (right after the previous run, or when the host recorded it) to the end of its kernel."""

    def __init__(self, kernel_ms: float, enqueue_ms: float):
        self.kernel_ms, self.enqueue_ms = kernel_ms, enqueue_ms
        self.host_ms = 0.0
        self.gpu_free_at = 0.0
        self.launched = 0  # runs launched so far
        self.stream_syncs = 0
        self.waits: list[int] = []  # per event wait: runs launched after the one waited for
        self.idle_ms = 0.0  # GPU idle time between timed runs

    def launch(self):
        self.host_ms += self.enqueue_ms
        begins = max(self.gpu_free_at, self.host_ms)
        if self.measuring:
            if self.first_timed is None:
                self.first_timed = self.launched
            elif self.launched > self.first_timed:
                self.idle_ms += begins - self.gpu_free_at
        self.gpu_free_at = begins + self.kernel_ms
        self.launched += 1

    measuring = False
    first_timed: int | None = None

    def record(self, event):
        event.at = max(self.gpu_free_at, self.host_ms)
        event.run = self.launched

    def wait(self, event):
        self.waits.append(self.launched - event.run)
        self.host_ms = max(self.host_ms, event.at)

    def synchronize(self):
        self.stream_syncs += 1
        self.host_ms = max(self.host_ms, self.gpu_free_at)


def fake_torch(gpu: SimulatedGpu):
    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            gpu.record(self)

        def synchronize(self):
            gpu.wait(self)

        def elapsed_time(self, end):
            return end.at - self.at

    return types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=gpu.synchronize))


class FakeDriverCuda:
    def __init__(self, gpu: SimulatedGpu):
        self.gpu = gpu

    def event(self):
        return types.SimpleNamespace()

    def record(self, event, stream):
        self.gpu.record(event)

    def elapsed_ms(self, start, end):
        self.gpu.wait(end)
        return end.at - start.at

    def synchronize(self, stream):
        self.gpu.synchronize()


def run_torch_timer(gpu, settings):
    """A take of the measurement protocol (pipeline/measuring/takes.py), as PyTorch's runs are timed."""
    torch = fake_torch(gpu)

    def run():
        gpu.measuring = gpu.stream_syncs > 0  # the untimed run before a take ends with a synchronisation
        gpu.launch()

    return takes.cuda_take(torch, run, settings.iterations, settings.duration_s * 1000), None


def run_driver_timer(gpu, settings):
    def launch(stream):
        gpu.measuring = gpu.stream_syncs > 0
        gpu.launch()

    return cuda.timed_runs(FakeDriverCuda(gpu), None, launch, settings.warmup_ms, settings.iterations, settings.duration_s)


TIMERS = [pytest.param(run_torch_timer, id="torch"), pytest.param(run_driver_timer, id="tensorrt-rtx")]


@pytest.mark.parametrize("timer", TIMERS)
def test_a_gpu_bound_model_is_timed_back_to_back_with_a_bounded_queue(timer):
    gpu = SimulatedGpu(kernel_ms=5.0, enqueue_ms=1.0)
    times, _ = timer(gpu, ProfileSettings(warmup_ms=0, iterations=40, duration_s=0))
    # Every run is timed, in order; the first also holds its own launch (the GPU was idle).
    assert len(times) == 40 and times == pytest.approx([6.0] + [5.0] * 39)
    # The host synchronised the stream only to end the warm-up, never between timed runs...
    assert gpu.stream_syncs == 1
    # ...waited only for a run with QUEUE_DEPTH - 1 more queued behind it (while measuring),
    assert min(gpu.waits[: 40 - takes.QUEUE_DEPTH]) == takes.QUEUE_DEPTH - 1
    assert max(gpu.waits) <= takes.QUEUE_DEPTH
    # ...so the GPU never idled between runs: the runs' times add up to the time it was busy.
    assert gpu.idle_ms == 0.0 and sum(times) == pytest.approx(6.0 + 39 * 5.0)


@pytest.mark.parametrize("timer", TIMERS)
def test_a_launch_bound_model_is_timed_from_its_first_launch_to_its_end(timer):
    # The host takes longer to enqueue a run than the GPU to execute it (eager PyTorch on a small
    # batch): the GPU waits for the host inside each run, and that wait is the model's real cost.
    # Each run then takes what the host takes to enqueue one, as N runs between two events would say.
    gpu = SimulatedGpu(kernel_ms=1.0, enqueue_ms=3.0)
    times, _ = timer(gpu, ProfileSettings(warmup_ms=0, iterations=12, duration_s=0))
    assert len(times) == 12 and times == pytest.approx([4.0] + [3.0] * 11)
    assert gpu.stream_syncs == 1


@pytest.mark.parametrize("timer", TIMERS)
def test_fewer_runs_than_the_queue_holds_are_all_timed(timer):
    gpu = SimulatedGpu(kernel_ms=2.0, enqueue_ms=0.5)
    times, _ = timer(gpu, ProfileSettings(warmup_ms=0, iterations=2, duration_s=0))
    assert times == pytest.approx([2.5, 2.0])


def test_both_timers_keep_the_same_queue_depth():
    # The driver runs in the compiler's own environment and cannot import the product: the same
    # rule is written twice, and this keeps the two in step.
    assert cuda.QUEUE_DEPTH == takes.QUEUE_DEPTH


def test_a_take_keeps_the_run_the_host_waited_for_as_the_host_synchronised_latency(monkeypatch):
    """The untimed run before a take is issued with the GPU idle and waited for: its wall time
    (launch, GPU work, synchronisation) is the host-synchronised latency, kept one a take; a
    short run that could be near launch-bound issues twice and keeps the second, as the issue
    time does."""
    gpu = SimulatedGpu(kernel_ms=2.0, enqueue_ms=1.0)
    monkeypatch.setattr(takes.time, "perf_counter_ns", lambda: int(gpu.host_ms * 1e6))
    issued, waited = [], []
    takes.cuda_take(fake_torch(gpu), gpu.launch, 3, 0.0, issued, waited)
    assert issued == pytest.approx([1.0]) and waited == pytest.approx([3.0])  # 1 ms to launch, then 2 on the GPU
    assert gpu.stream_syncs == 1  # one untimed run: three runs of 2 ms fill no take of 0 ms
    takes.cuda_take(fake_torch(gpu), gpu.launch, 1, 100.0, issued, waited)
    assert gpu.stream_syncs == 3 and waited == pytest.approx([3.0, 3.0])  # a short run: issued twice, the second kept


class FirstRunSlower:
    """A run whose first issue after another engine's take costs the host ``first_ms``, and each
    one after it ``enqueue_ms`` (docs/results/sweeps.md: 74-82 % of the run against 45 %), and
    whose first run also takes the GPU ``first_kernel_ms`` (its caches cold after the other)."""

    def __init__(self, gpu: SimulatedGpu, first_ms: float, first_kernel_ms: float | None = None):
        self.gpu, self.first_ms, self.first_kernel_ms = gpu, first_ms, first_kernel_ms or gpu.kernel_ms

    def run(self):
        enqueue, kernel = self.gpu.enqueue_ms, self.gpu.kernel_ms
        self.gpu.enqueue_ms, self.gpu.kernel_ms = self.first_ms, self.first_kernel_ms
        try:
            self.gpu.launch()
        finally:
            self.gpu.enqueue_ms, self.gpu.kernel_ms = enqueue, kernel
        self.run = self.gpu.launch


@pytest.mark.parametrize(
    ("kernel_ms", "enqueue_ms", "first_ms", "first_kernel_ms", "steady_ms", "untimed_runs", "issue_kept"),
    [
        # an engine's first take: nothing says yet how long its runs are, so it is issued twice
        pytest.param(10.0, 0.2, 1.0, None, None, 2, 0.2, id="first-take"),
        # eager PyTorch at a small point: launch-bound, issued twice, the second issue kept
        pytest.param(1.0, 1.2, 2.0, None, 1.2, 2, 1.2, id="launch-bound"),
        # a first issue at 40 % of its run, 45 % beyond it: its 20 % after would not be flagged,
        # but the first cannot tell, so it is issued again
        pytest.param(5.0, 1.0, 2.0, None, 5.0, 2, 1.0, id="inflated-first-issue"),
        # issued at 32 % of its run once steady, 58 % on its first issue, whose run the GPU also
        # took 2.2x as long over: against that run's own wall time the first issue reads 19 %, but
        # kept, against the take's runs, it would flag the engine near launch-bound
        pytest.param(1.0, 0.32, 0.576, 2.2, 1.0, 2, 0.32, id="slow-first-run"),
        # a CUDA graph's replay: its first issue is a tenth of the run, issued once and kept
        pytest.param(10.0, 0.2, 1.0, None, 10.0, 1, 1.0, id="gpu-bound"),
        # the same, its runs half as long in this take as in the last: still issued once, and the
        # first issue kept is under half of this take's runs
        pytest.param(5.0, 0.2, 2.0, None, 10.0, 1, 2.0, id="gpu-bound-runs-shorter"),
    ],
)
def test_a_short_run_is_issued_twice_unless_its_first_issue_is_far_from_launch_bound(
    monkeypatch, kernel_ms, enqueue_ms, first_ms, first_kernel_ms, steady_ms, untimed_runs, issue_kept
):
    from pipeline.measuring.pace import NEAR_LAUNCH_BOUND_SHARE

    gpu = SimulatedGpu(kernel_ms=kernel_ms, enqueue_ms=enqueue_ms)
    monkeypatch.setattr(takes.time, "perf_counter_ns", lambda: int(gpu.host_ms * 1e6))
    issued, waited, untimed = [], [], []
    engine = FirstRunSlower(gpu, first_ms, first_kernel_ms)
    times = takes.cuda_take(fake_torch(gpu), lambda: engine.run(), 1, 100.0, issued, waited, untimed, steady_ms)
    assert untimed == [untimed_runs] and gpu.stream_syncs == untimed_runs
    assert issued == pytest.approx([issue_kept])
    # Whatever ran untimed, the timed runs are the engine's own, back to back...
    run_ms = max(kernel_ms, enqueue_ms)
    assert min(times) == pytest.approx(run_ms)
    # ...and the issue kept flags the engine near launch-bound only where its steady issue would.
    assert (issued[0] / run_ms >= NEAR_LAUNCH_BOUND_SHARE) == (enqueue_ms / run_ms >= NEAR_LAUNCH_BOUND_SHARE)


def test_a_take_says_how_many_untimed_runs_its_energy_reading_holds(monkeypatch):
    """An energy counter read around a take sees its untimed runs too (pipeline/measuring/energy.py):
    one, or two where a short run is issued twice."""
    gpu = SimulatedGpu(kernel_ms=2.0, enqueue_ms=1.0)
    monkeypatch.setattr(takes.time, "perf_counter_ns", lambda: int(gpu.host_ms * 1e6))
    untimed: list[int] = []
    takes.cuda_take(fake_torch(gpu), gpu.launch, 3, 0.0, [], [], untimed)
    takes.cuda_take(fake_torch(gpu), gpu.launch, 1, 100.0, [], [], untimed)
    assert untimed == [1, 2]


def test_the_host_synchronised_latency_is_read_from_the_takes_where_they_waited_for_enough_runs():
    from pipeline.runtimes.pytorch.prepared import host_latency

    def never():
        raise AssertionError("no run of its own: the takes waited for enough")

    said = host_latency(None, never, [6.0, 7.0, 6.5, 6.2])
    assert said["runs"] == 4 and said["median_ms"] == pytest.approx(6.35) and said["mean_ms"] == pytest.approx(6.425)
