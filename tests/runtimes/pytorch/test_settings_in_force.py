"""Each engine of a point runs under its own toolchain's TF32 setting (Prepared.in_force): the
flags are the process's, and each engine prepared sets its own, so the rounds timed every engine
of a point under the last one prepared's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.runtimes.pytorch import prepared as prepared_module  # noqa: E402
from pipeline.runtimes.pytorch.prepared import Prepared  # noqa: E402


@pytest.fixture
def flags_restored():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_each_engines_takes_run_under_its_own_tf32_setting(monkeypatch, flags_restored):
    seen = []

    def cuda_take(torch, run, runs, min_ms, issued, waited, untimed, steady_ms):  # a GPU's take, on the CPU
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        issued.append(0.1), untimed.append(1)
        return [1.0]

    monkeypatch.setattr(prepared_module, "cuda_take", cuda_take)
    examples = (torch.zeros(2, 8),)
    with_tf32 = Prepared((1, 0, 0), lambda: None, examples, "cuda", "2x8", tf32=True)
    without = Prepared((2, 0, 0), lambda: None, examples, "cuda", "2x8", tf32=False)
    for engine in (with_tf32, without, with_tf32, without):
        engine.take(1, 1.0)
    assert seen == [(True, True), (False, False), (True, True), (False, False)]


def test_an_engine_on_the_cpu_or_without_a_setting_leaves_the_flags(flags_restored):
    torch.backends.cuda.matmul.allow_tf32 = True
    Prepared((1, 0, 0), lambda: None, (torch.zeros(1),), "cpu", None, tf32=False).in_force()
    Prepared((1, 0, 0), lambda: None, (torch.zeros(1),), "cuda", None).in_force()
    assert torch.backends.cuda.matmul.allow_tf32 is True


def test_each_take_is_told_the_median_of_the_engines_last_take(monkeypatch):
    """A take judges its first issue against the engine's own runs in its last take
    (takes.could_be_near_launch_bound): an engine's first take has none, each later one the median
    of the one before, the engine's own, whatever ran between."""
    told = []

    def cuda_take(torch, run, runs, min_ms, issued, waited, untimed, steady_ms):
        told.append(steady_ms)
        issued.append(0.1), untimed.append(1)
        return {1: [3.0, 1.0, 2.0], 2: [9.0], 3: [5.0, 4.0, 6.0]}[len(told)] if len(told) <= 3 else [7.0]

    monkeypatch.setattr(prepared_module, "cuda_take", cuda_take)
    examples = (torch.zeros(2, 8),)
    first = Prepared((1, 0, 0), lambda: None, examples, "cuda", "2x8")
    other = Prepared((2, 0, 0), lambda: None, examples, "cuda", "2x8")
    for engine in (first, other, first, first):
        engine.take(1, 1.0)
    assert told == [None, None, 2.0, 5.0]
